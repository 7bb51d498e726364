"""Step-gaming diagnostics (algorithms/hacking.py): step length, delimiter rate, the share of
steps the dense reward does not pay for, and the step reward sums they rest on."""

import math

import pytest
import torch

from primekit.algorithms import reward_hacking_metrics, step_reward_sums


def _loop_step_sums(token_rewards, positions, mask):
    out = torch.zeros(positions.shape, dtype=token_rewards.dtype)
    for i in range(positions.shape[0]):
        ends = [int(p) for p in positions[i] if p >= 0]
        if not ends:
            continue
        for t in range(token_rewards.shape[1]):
            if not mask[i, t]:
                continue
            k = next((j for j, e in enumerate(ends) if t <= e), len(ends) - 1)
            out[i, k] += token_rewards[i, t]
    return out


def test_step_reward_sums_hand_computed():
    # Row 0: 5 valid tokens, steps end at tokens 1 and 3; token 4 (EOS) joins the last step:
    #   step 0 = 0.1 + 0.2 = 0.3, step 1 = -0.5 + 0.4 + 0.05 = -0.05.
    # Row 1: one step ending at token 2, token 3 is padding (not counted): 1 + 0 + -2 = -1.
    r = torch.tensor([[0.1, 0.2, -0.5, 0.4, 0.05], [1.0, 0.0, -2.0, 7.0, 0.0]],
                     dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    pos = torch.tensor([[1, 3], [2, -1]])
    sums, step_mask = step_reward_sums(r, pos, mask)
    assert torch.allclose(sums, torch.tensor([[0.3, -0.05], [-1.0, 0.0]], dtype=torch.float64))
    assert step_mask.tolist() == [[True, True], [True, False]]


def test_step_reward_sums_loop_reference():
    g = torch.Generator().manual_seed(0)
    n, t = 6, 12
    r = torch.randn(n, t, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    rows = []
    for i in range(n):
        k = int(torch.randint(0, 4, (1,), generator=g))
        ends = sorted(set(torch.randint(0, int(lengths[i]), (k,), generator=g).tolist()))
        rows.append(ends)
    s = max(max(len(e) for e in rows), 1)
    pos = torch.full((n, s), -1)
    for i, e in enumerate(rows):
        pos[i, : len(e)] = torch.tensor(e, dtype=torch.long)
    sums, _ = step_reward_sums(r, pos, mask)
    assert torch.allclose(sums, _loop_step_sums(r, pos, mask))


def test_step_gaming_metrics_hand_computed():
    # Delimiter "\n". Response 0 "1+2=3\nA:3": 2 steps, 9 characters, 1 delimiter.
    # Response 1 "1+2=3A:3" (the delimiter avoided): 1 step, 8 characters, 0 delimiters.
    # steps/response = 3/2; step length = 17 chars / 3 steps; delimiters per token = 1 / 17 tokens
    # (a character tokenizer: 9 + 8 valid tokens).
    responses = ["1+2=3\nA:3", "1+2=3A:3"]
    mask = torch.zeros(2, 9)
    mask[0, :9] = 1
    mask[1, :8] = 1
    r = torch.zeros(2, 9)
    r[0, 5], r[0, 8], r[1, 7] = 0.4, -0.1, 0.0  # step rewards 0.4 and -0.1; 0.0
    pos = torch.tensor([[5, 8], [7, -1]])
    m = reward_hacking_metrics(responses, step_delimiter="\n", outcome_rewards=torch.tensor(
        [1.0, 0.0]), token_rewards=r, response_mask=mask, step_end_positions=pos)
    assert float(m["hack/steps_per_response"]) == 1.5
    assert float(m["hack/step_len_chars"]) == pytest.approx(17 / 3)
    assert float(m["hack/delimiter_rate"]) == pytest.approx(1 / 17)
    # steps with reward <= 0: -0.1 and 0.0, of 3
    assert float(m["hack/nonpositive_step_share"]) == pytest.approx(2 / 3)
    # without step positions (or without a dense reward) the share is undefined
    m = reward_hacking_metrics(responses, step_delimiter="\n", outcome_rewards=torch.tensor(
        [1.0, 0.0]), token_rewards=None, response_mask=mask, step_end_positions=pos)
    assert math.isnan(float(m["hack/nonpositive_step_share"]))
    assert float(m["hack/delimiter_rate"]) == pytest.approx(1 / 17)


def test_step_gaming_metrics_pool_over_ranks_like_one_process():
    # Two "ranks" summed by a fake all-reduce give the one-process values of the whole batch.
    responses = ["1\n2\n3", "45", "6\n\n7", "8\n"]
    mask = torch.ones(4, 5)
    r = torch.randn(4, 5, generator=torch.Generator().manual_seed(2))
    pos = torch.tensor([[1, 3, 4], [1, -1, -1], [1, 2, 3], [1, -1, -1]])
    outcome = torch.tensor([1.0, 0.0, 1.0, 0.0])
    kw = {"step_delimiter": "\n"}
    whole = reward_hacking_metrics(responses, outcome_rewards=outcome, token_rewards=r,
                                   response_mask=mask, step_end_positions=pos, **kw)
    halves = [slice(0, 2), slice(2, 4)]
    # Record each half's all-reduce inputs, then replay half 0 with their totals, call by call.
    calls = [[], []]
    for j, h in enumerate(halves):
        reward_hacking_metrics(responses[h], outcome_rewards=outcome[h], token_rewards=r[h],
                               response_mask=mask[h], step_end_positions=pos[h],
                               all_reduce=lambda x, j=j: calls[j].append(x.clone()) or x, **kw)
    totals = iter([a + b for a, b in zip(*calls)])
    pooled = reward_hacking_metrics(responses[halves[0]], outcome_rewards=outcome[halves[0]],
                                    token_rewards=r[halves[0]], response_mask=mask[halves[0]],
                                    step_end_positions=pos[halves[0]],
                                    all_reduce=lambda x: next(totals), **kw)
    for key in ("hack/steps_per_response", "hack/step_len_chars", "hack/delimiter_rate",
                "hack/nonpositive_step_share"):
        assert float(pooled[key]) == pytest.approx(float(whole[key])), key
