"""RolloutBatch, concat_batches and SamplingParams with hand-built tensors."""

from __future__ import annotations

import pytest
import torch

from primekit.rollout.base import RolloutBatch, SamplingParams, concat_batches

PAD = 0


def _batch(prompts: list[list[int]], responses: list[list[int]], offset: float) -> RolloutBatch:
    P, T = max(map(len, prompts)), max(map(len, responses))
    n = len(prompts)
    prompt_ids = torch.full((n, P), PAD)
    prompt_mask = torch.zeros((n, P), dtype=torch.long)
    response_ids = torch.full((n, T), PAD)
    response_mask = torch.zeros((n, T), dtype=torch.long)
    logprobs = torch.zeros((n, T))
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt_ids[i, P - len(p) :], prompt_mask[i, P - len(p) :] = torch.tensor(p), 1
        response_ids[i, : len(r)], response_mask[i, : len(r)] = torch.tensor(r), 1
        logprobs[i, : len(r)] = -offset - torch.arange(len(r))
    return RolloutBatch(
        prompt_ids,
        prompt_mask,
        response_ids,
        response_mask,
        logprobs,
        torch.tensor([r[-1] == 1 for r in responses]),
        [str(r) for r in responses],
    )


def test_properties_and_layout():
    b = _batch([[5, 6], [7]], [[8, 1], [9, 9, 9]], offset=1.0)
    assert b.response_len == 3 and len(b) == 2
    assert b.input_ids.tolist() == [[5, 6, 8, 1, PAD], [PAD, 7, 9, 9, 9]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert b.finished.tolist() == [True, False]


def test_select_rows_by_index_and_mask():
    b = _batch([[5, 6], [7], [4, 4]], [[8, 1], [9, 9, 9], [3]], offset=1.0)
    s = b.select(torch.tensor([2, 0]))
    assert s.input_ids.tolist() == [[4, 4, 3, PAD, PAD], [5, 6, 8, 1, PAD]]
    assert s.responses == ["[3]", "[8, 1]"]
    m = b.select(torch.tensor([False, True, True]))
    assert m.responses == ["[9, 9, 9]", "[3]"] and m.finished.tolist() == [False, False]


def test_concat_repads_left_and_right():
    a = _batch([[5, 6, 7]], [[8]], offset=1.0)  # P=3, T=1
    b = _batch([[2]], [[9, 9, 1]], offset=2.0)  # P=1, T=3
    c = concat_batches([a, b], pad_id=PAD)
    # Prompts stay right-aligned (left padding), responses left-aligned (right padding).
    assert c.prompt_ids.tolist() == [[5, 6, 7], [PAD, PAD, 2]]
    assert c.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert c.response_ids.tolist() == [[8, PAD, PAD], [9, 9, 1]]
    assert c.response_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    # Log-probs: -1 for a's only token; -2, -3, -4 for b's three; 0 on padding.
    assert c.sampling_logprobs.tolist() == [[-1.0, 0.0, 0.0], [-2.0, -3.0, -4.0]]
    assert c.finished.tolist() == [False, True]
    assert c.responses == ["[8]", "[9, 9, 1]"]
    with pytest.raises(ValueError, match="at least one"):
        concat_batches([], pad_id=PAD)


def test_shape_validation():
    b = _batch([[5]], [[8]], offset=1.0)
    with pytest.raises(ValueError, match="sampling_logprobs"):
        RolloutBatch(
            b.prompt_ids,
            b.prompt_mask,
            b.response_ids,
            b.response_mask,
            torch.zeros(1, 2),
            b.finished,
            ["x"],
        )
    with pytest.raises(ValueError, match="responses"):
        RolloutBatch(
            b.prompt_ids,
            b.prompt_mask,
            b.response_ids,
            b.response_mask,
            b.sampling_logprobs,
            b.finished,
            [],
        )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_sampling_params_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)
