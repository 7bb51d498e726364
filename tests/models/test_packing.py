"""Packed and token-budget micro-batches (rollout/batching.py) against the padded layout.

The padded, row-count layout is the reference: the packed layout and the length-sorted token
budget must give the same log-probs, values, losses and gradients (fp32, within 1e-6).
"""

from __future__ import annotations

import pytest
import torch

from primekit.models.logprobs import (
    batch_logprobs,
    batch_values,
    micro_batch_logprobs,
    micro_batch_values,
    sequence_logprobs,
)
from primekit.rollout.base import RolloutBatch
from primekit.rollout.batching import (
    Layout,
    first_fit_decreasing,
    iter_layout,
    packed_micro_batch,
    packed_row_width,
)

PAD = 0


def _batch(prompts: list[list[int]], responses: list[list[int]]) -> RolloutBatch:
    """Rows [left pad | prompt | response | right pad] from ragged token lists."""
    P, T, n = max(map(len, prompts)), max(map(len, responses)), len(prompts)
    prompt_ids, prompt_mask = torch.full((n, P), PAD), torch.zeros((n, P), dtype=torch.long)
    response_ids, response_mask = torch.full((n, T), PAD), torch.zeros((n, T), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt_ids[i, P - len(p) :], prompt_mask[i, P - len(p) :] = torch.tensor(p), 1
        response_ids[i, : len(r)], response_mask[i, : len(r)] = torch.tensor(r), 1
    return RolloutBatch(prompt_ids, prompt_mask, response_ids, response_mask, torch.zeros(n, T),
                        torch.ones(n, dtype=torch.bool), [str(r) for r in responses])


def _random_batch(n: int, seed: int = 0) -> RolloutBatch:
    """n rows with prompts of 3-12 and responses of 1-20 tokens (ids 3..98 of the tiny vocab)."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(3, 13, (n,), generator=g).tolist()
    r_len = torch.randint(1, 21, (n,), generator=g).tolist()
    return _batch([torch.randint(3, 99, (p,), generator=g).tolist() for p in p_len],
                  [torch.randint(3, 99, (r,), generator=g).tolist() for r in r_len])


def test_packed_micro_batch_by_hand():
    # Lengths 4, 3, 2 (total 9); candidate widths int(f * 4) for f in 1..2: 4, 5, 6, 7, 8.
    # First-fit decreasing computes rows x width: 4 -> (4)(3)(2) 3 x 4 = 12; 5 -> (4)(3 2)
    # 2 x 5 = 10; 6 -> (4 2)(3) 2 x 6 = 12; 7 -> (4 3)(2) 14; 8 -> (4 3)(2) 16. So width 5.
    b = _batch([[5, 6], [7], [4]], [[8, 1], [9, 9], [3]])
    mb = packed_micro_batch(b, torch.arange(3))
    assert mb.packed and mb.attention_mask is None and mb.response_len == 2
    assert mb.input_ids.tolist() == [[5, 6, 8, 1, PAD], [7, 9, 9, 4, 3]]
    # Positions restart at 0 for each sequence; row 0's padding column is a segment too.
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0], [0, 1, 2, 0, 1]]
    # Response token j of a sequence starting at flat column s with p prompt tokens is predicted
    # by column s + p - 1 + j: sequence 0 at 0 (p=2) -> 1, 2; sequence 1 at 5 (row 1, p=1) ->
    # 5, 6; sequence 2 at 8 (p=1) -> 8.
    assert mb.predict_index.tolist() == [[1, 2], [5, 6], [8, -1]]
    assert mb.response_mask.tolist() == [[True, True], [True, True], [True, False]]
    assert mb.tokens_computed == 10  # 9 tokens + 1 padding


def _packed_micro_batch_loop(b: RolloutBatch, rows: torch.Tensor):
    """packed_micro_batch written one sequence at a time (its first version): the reference."""
    P = b.prompt_ids.size(1)
    p_len = b.prompt_mask[rows].sum(1).tolist()
    t_len = b.response_mask[rows].sum(1).tolist()
    lengths = [p + t for p, t in zip(p_len, t_len)]
    C = packed_row_width(lengths)
    free, place = first_fit_decreasing(lengths, C)
    input_ids = torch.zeros((len(free), C), dtype=b.prompt_ids.dtype)
    position_ids = torch.arange(C).repeat(len(free), 1)
    t = max(max(t_len), 1)
    predict_index = torch.full((len(lengths), t), -1)
    for i, row in enumerate(rows.tolist()):
        (r, c), p, n = place[i], p_len[i], t_len[i]
        input_ids[r, c : c + p + n] = torch.cat([b.prompt_ids[row, P - p :], b.response_ids[row, :n]])
        position_ids[r, c : c + p + n] = torch.arange(p + n)
        predict_index[i, :n] = r * C + c + p - 1 + torch.arange(n)
    for r, f in enumerate(free):
        if f:
            position_ids[r, C - f :] = torch.arange(f)
    return input_ids, position_ids, predict_index, b.response_mask[rows, :t].bool()


@pytest.mark.parametrize("seed", range(4))
def test_packed_micro_batch_equals_the_loop_reference(seed):
    b = _random_batch(24, seed)
    b.response_mask[5, :] = 0  # a row with an empty response: prompt only, no prediction
    g = torch.Generator().manual_seed(seed)
    for rows in (torch.arange(24), torch.randperm(24, generator=g)[:13]):  # a mini-batch's rows
        mb = packed_micro_batch(b, rows)
        ids, pos, pred, mask = _packed_micro_batch_loop(b, rows)
        assert torch.equal(mb.input_ids, ids) and torch.equal(mb.position_ids, pos)
        assert torch.equal(mb.predict_index, pred) and torch.equal(mb.response_mask, mask)
        assert mb.response_len == pred.shape[1] and torch.equal(mb.rows, rows)


@pytest.mark.parametrize(("lengths", "width", "rows"), [
    # Widths int(f * 10) for f in 1, 1.25, 1.5, 1.75, 2: 10, 12, 15, 17, 20 (total 30).
    # FFD: 10 -> (10)(9)(6)(5) 40; 12 -> (10)(9)(6 5) 36; 15 -> (10 5)(9 6) 30;
    # 17 -> (10 6)(9 5) 34; 20 -> (10 9)(6 5) 40. So 15: two rows, no padding.
    ([10, 5, 9, 6], 15, 2),
    # Alike lengths: 10 rows x 10 = 100 at 1x and 5 rows x 20 = 100 at 2x (pairs); 12 and 15
    # take one per row (120, 150), 17 pairs 9+8 only (7 rows, 119). The tie goes to 10.
    ([10, 10, 9, 9, 9, 8, 8, 8, 9, 10], 10, 10),
    # Mixed lengths fill a 1x row: (10)(6 4)(5 5) -> 3 rows x 10 = 30 = the total.
    ([10, 6, 4, 5, 5], 10, 3),
    # One sequence: its own length.
    ([7], 7, 1),
])
def test_packed_row_width_computes_the_fewest_columns(lengths, width, rows):
    assert packed_row_width(lengths) == width
    free, place = first_fit_decreasing(lengths, width)
    assert len(free) == rows and sum(free) == rows * width - sum(lengths)
    # Every sequence lies inside its row, and no two overlap.
    cells = [(r, c + j) for (r, c), n in zip(place, lengths) for j in range(n)]
    assert len(set(cells)) == sum(lengths) and all(c < width for _, c in cells)


def test_token_budget_keeps_whole_groups_longest_first():
    # Groups of K=2: group 0 = rows 0, 1 with (prompt, response) lengths (2, 2), (1, 3);
    # group 1 = rows 2, 3 with (1, 1), (1, 1).
    b = _batch([[5, 6], [7], [4], [4]], [[8, 1], [9, 9, 9], [3], [3]])
    rows = lambda layout: [mb.rows.tolist() for mb in iter_layout(b, layout)]  # noqa: E731
    # Packed cost = tokens: group 0 = 4 + 4 = 8, group 1 = 2 + 2 = 4; 8 + 4 = 12.
    assert rows(Layout(99, 2, 11, packed=True)) == [[0, 1], [2, 3]]
    assert rows(Layout(99, 2, 12, packed=True)) == [[0, 1, 2, 3]]
    # Padded cost = rows x (longest prompt + longest response): group 0 alone 2 x (2 + 3) = 10,
    # both 4 x (2 + 3) = 20.
    assert rows(Layout(99, 2, 19)) == [[0, 1], [2, 3]]
    assert rows(Layout(99, 2, 20)) == [[0, 1, 2, 3]]
    # The row count still caps a micro-batch: 2 rows (one group) each, whatever the budget.
    assert rows(Layout(2, 2, 10_000, packed=True)) == [[0, 1], [2, 3]]
    assert rows(Layout(3, 2, 10_000)) == [[0, 1], [2, 3]]  # 3 rows -> one whole group
    # A budget below one group still gives each group a micro-batch; longest group first.
    assert rows(Layout(99, 2, 1)) == [[0, 1], [2, 3]]
    # Rows alone (max_tokens 0): consecutive chunks of whole groups, as before.
    assert rows(Layout(3, 2)) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="token budget"):
        next(iter_layout(b, Layout(4, 2, 0, packed=True)))
    with pytest.raises(ValueError, match="whole groups"):
        next(iter_layout(b, Layout(4, 3, 10)))


def test_packed_budget_bounds_the_columns_computed_padding_included():
    # Sequences (prompt + response) of 5, 3 and 3 tokens, groups of one: 11 tokens, within a
    # budget of 11. Packed, the fewest columns are rows of 6: [5 | 1 pad], [3, 3], 12 columns,
    # over the budget; so the last (shortest) sequence moves to the next micro-batch, and the
    # first two fit one row of 8 columns (5 + 3): 8 <= 11.
    b = _batch([[5, 6], [7], [4]], [[8, 1, 2], [9, 9], [3, 3]])
    assert packed_row_width([5, 3, 3]) == 6
    mbs = list(iter_layout(b, Layout(99, 1, 11, packed=True)))
    assert [mb.rows.tolist() for mb in mbs] == [[0, 1], [2]]
    assert [mb.tokens_computed for mb in mbs] == [8, 3]
    assert [mb.rows.tolist() for mb in iter_layout(b, Layout(99, 1, 12, packed=True))] == [[0, 1, 2]]


@pytest.mark.parametrize("seed", range(4))
def test_packed_micro_batches_stay_within_the_budget(seed):
    # Random groups of 4: every packed micro-batch of more than one group computes at most the
    # budget's columns, and every row is in exactly one micro-batch.
    b = _random_batch(64, seed)
    for budget in (40, 64, 100, 150, 400):
        mbs = list(iter_layout(b, Layout(32, 4, budget, packed=True)))
        assert sorted(r for mb in mbs for r in mb.rows.tolist()) == list(range(64))
        for mb in mbs:
            assert mb.tokens_computed <= budget or len(mb.rows) == 4, (budget, mb.rows)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).float().eval()


LAYOUTS = {"padded-rows": Layout(8, 2), "sorted-tokens": Layout(8, 2, 200),
           "packed-tokens": Layout(8, 2, 200, packed=True),
           "packed-one": Layout(24, 2, 10_000, packed=True)}


def test_batch_logprobs_agree_over_layouts(model):
    # The old-log-prob and reference passes (batch_logprobs), 24 ragged rows.
    b = _random_batch(24)
    base = batch_logprobs(model, b, *LAYOUTS["padded-rows"])
    assert base.abs().sum() > 0
    for name, layout in LAYOUTS.items():
        if layout.max_tokens:
            assert len(list(iter_layout(b, layout))) >= (1 if layout.max_tokens > 1000 else 3)
        torch.testing.assert_close(batch_logprobs(model, b, *layout), base, rtol=0, atol=1e-6,
                                   msg=name)


def test_packed_reference_and_prm_copies_score_exactly_zero(model, tiny_model_dir):
    # Two copies of one model in the same packed layout give bitwise-equal log-probs, so an
    # untouched implicit PRM's rewards beta * (lp_prm - lp_ref) are exactly zero.
    from transformers import AutoModelForCausalLM

    copy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).float().eval()
    b = _random_batch(16, seed=3)
    layout = LAYOUTS["packed-tokens"]
    assert torch.equal(batch_logprobs(model, b, *layout), batch_logprobs(copy, b, *layout))


def _weighted_loss_and_grads(model, b: RolloutBatch, layout: Layout, weights: torch.Tensor):
    """sum over micro-batches of sum(w * logprobs + 0.1 * entropy on valid tokens), with its
    gradient: a stand-in loss whose value depends on every token's log-prob and entropy."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for mb in iter_layout(b, layout):
        lp, ent = micro_batch_logprobs(model, mb, compute_entropy=True)  # [n, t]
        w = weights[mb.rows, : mb.response_len]
        loss = (w * lp + 0.1 * ent * mb.response_mask).sum() / b.response_mask.sum()
        loss.backward()
        total += float(loss.detach())
    return total, {k: p.grad.clone() for k, p in model.named_parameters()}


def test_policy_style_loss_and_gradients_agree_over_layouts(model):
    b = _random_batch(24, seed=1)
    weights = torch.randn(b.response_ids.shape, generator=torch.Generator().manual_seed(2))
    model.train()
    try:
        base_loss, base_grads = _weighted_loss_and_grads(model, b, LAYOUTS["padded-rows"], weights)
        for name, layout in LAYOUTS.items():
            loss, grads = _weighted_loss_and_grads(model, b, layout, weights)
            assert abs(loss - base_loss) <= 1e-6, name
            for k, g in grads.items():
                torch.testing.assert_close(g, base_grads[k], rtol=0, atol=1e-6, msg=f"{name} {k}")
    finally:
        model.eval()


def test_flattened_packed_rows_give_the_same_logprobs(model):
    # Flash attention's packed path takes one row: the rows of a packed micro-batch laid end to
    # end ([1, R*C]) keep every flat column index, so predict_index still holds.
    b = _random_batch(12, seed=4)
    mb = packed_micro_batch(b, torch.arange(12))
    assert mb.input_ids.shape[0] > 1
    with torch.no_grad():
        rows, _ = sequence_logprobs(model, mb.input_ids, None, mb.response_len,
                                    position_ids=mb.position_ids, predict_index=mb.predict_index)
        flat, _ = sequence_logprobs(model, mb.input_ids.reshape(1, -1), None, mb.response_len,
                                    position_ids=mb.position_ids.reshape(1, -1),
                                    predict_index=mb.predict_index)
    torch.testing.assert_close(flat, rows, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="packed layout"):
        sequence_logprobs(model, mb.input_ids, torch.ones_like(mb.input_ids), mb.response_len,
                          position_ids=mb.position_ids, predict_index=mb.predict_index)


def test_critic_values_and_gradients_agree_over_layouts(tiny_model_dir):
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)  # the value head is freshly initialised
    critic = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1).float()
    b = _random_batch(24, seed=5)
    base = batch_values(critic.eval(), b, *LAYOUTS["padded-rows"])
    targets = torch.randn(b.response_ids.shape, generator=torch.Generator().manual_seed(6))

    def grads(layout):
        critic.zero_grad(set_to_none=True)
        for mb in iter_layout(b, layout):
            v = micro_batch_values(critic, mb)  # [n, t]
            err = (v - targets[mb.rows, : mb.response_len]) * mb.response_mask
            (err.square().sum() / b.response_mask.sum()).backward()
        return {k: p.grad.clone() for k, p in critic.named_parameters()}

    base_grads = grads(LAYOUTS["padded-rows"])
    for name, layout in LAYOUTS.items():
        torch.testing.assert_close(batch_values(critic, b, *layout), base, rtol=0, atol=1e-6,
                                   msg=name)
        for k, g in grads(layout).items():
            torch.testing.assert_close(g, base_grads[k], rtol=0, atol=1e-6, msg=f"{name} {k}")


def _leaky(model):
    """`model` with its decoder made to ignore position ids, as a model whose attention does not
    follow transformers' packed sequences would: every packed row becomes one causal sequence."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    forward = decoder.forward

    def ignoring_positions(*args, **kwargs):
        kwargs["position_ids"] = None
        return forward(*args, **kwargs)

    decoder.forward = ignoring_positions
    return model


def test_packed_attention_probe_passes_confined_models_and_names_leaking_ones(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from primekit.config import ConfigError
    from primekit.models.logprobs import (
        PACKED_LEAK_TOLERANCE,
        check_packed_attention,
        packed_attention_leak,
    )

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).float().train()
    assert packed_attention_leak(model) <= PACKED_LEAK_TOLERANCE
    assert packed_attention_leak(model.to(torch.bfloat16)) <= PACKED_LEAK_TOLERANCE
    assert model.training  # the probe runs in eval mode and restores the mode
    check_packed_attention(model, "policy")  # nothing raised
    critic = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1)
    assert packed_attention_leak(critic, head="value") <= PACKED_LEAK_TOLERANCE
    # A model whose attention crosses packed sequences: B's scores follow A's tokens.
    leaky = _leaky(AutoModelForCausalLM.from_pretrained(tiny_model_dir).float())
    assert packed_attention_leak(leaky) > 100 * PACKED_LEAK_TOLERANCE
    with pytest.raises(ConfigError, match=r"prm\.packing=packed: Qwen2ForCausalLM lets attention "
                                          r"cross packed sequences.*prm\.max_tokens_per_micro"):
        check_packed_attention(leaky, "prm")
    leaky_critic = _leaky(AutoModelForTokenClassification.from_pretrained(tiny_model_dir,
                                                                          num_labels=1))
    with pytest.raises(ConfigError, match="policy.packing=packed"):
        check_packed_attention(leaky_critic, "policy", head="value")


def test_the_trainer_probes_only_packed_sections(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from primekit.config import ConfigError, load_config, resolve_config
    from primekit.factory import check_packing

    leaky = _leaky(AutoModelForCausalLM.from_pretrained(tiny_model_dir).float())
    cfg = load_config(resolve_config("tiny"), [f"model.policy={tiny_model_dir}"])
    with pytest.raises(ConfigError, match="policy.packing=packed"):
        check_packing(cfg, leaky, "policy")
    for padded in (["policy.max_tokens_per_micro_batch=0"], ["policy.packing=sorted"]):
        check_packing(load_config(resolve_config("tiny"), padded), leaky, "policy")  # no probe
