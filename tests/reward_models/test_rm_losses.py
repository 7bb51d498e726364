"""ORM / step-PRM losses (hand-computed), gathering, classification metrics, and short fits."""

from __future__ import annotations

import math

import pytest
import torch

from primekit.data.arithmetic import ArithmeticTask
from primekit.reward_models.hack_check import batch_from_texts
from primekit.reward_models.heads import (
    batch_response_logits,
    fit_reward_model,
    init_reward_model,
    load_reward_model,
)
from primekit.reward_models.orm import (
    binary_metrics,
    last_token_index,
    mixed_groups,
    orm_loss,
    orm_scores,
)
from primekit.reward_models.prm import gather_steps, prm_step_loss, prm_step_scores

LN3 = math.log(3.0)


def test_orm_loss_full_and_last_hand_computed():
    logits = torch.tensor([[0.0, LN3], [LN3, 5.0]])
    y = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    # BCE(logit, 1) = -log sigmoid(logit): logit 0 -> ln 2; logit ln 3 -> -log(3/4) = ln(4/3).
    # BCE(ln 3, 0) = -log(1 - 3/4) = ln 4. The masked 5.0 never counts.
    full, m_full = orm_loss(logits, y, mask, target="full")
    assert float(full) == pytest.approx((math.log(2) + math.log(4 / 3) + math.log(4)) / 3)
    last, m_last = orm_loss(logits, y, mask, target="last")
    # last tokens: row 0 -> index 1 (ln 3, y=1), row 1 -> index 0 (ln 3, y=0)
    assert float(last) == pytest.approx((math.log(4 / 3) + math.log(4)) / 2)
    # acc at the last token: row 0 predicts 1 (right), row 1 predicts 1 (wrong) -> 0.5
    assert m_full["orm/acc_last"] == m_last["orm/acc_last"] == 0.5
    with pytest.raises(ValueError, match="target"):
        orm_loss(logits, y, mask, target="middle")


def test_last_token_index_and_mixed_groups():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    assert last_token_index(mask).tolist() == [1, -1, 2]
    # two problems x 3 samples: [1, 0, 0] is mixed, [1, 1, 1] is not.
    keep = mixed_groups(torch.tensor([1.0, 0, 0, 1, 1, 1]), 3)
    assert keep.tolist() == [True] * 3 + [False] * 3


def test_gather_steps_matches_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 9, generator=g)
    pos = torch.tensor([[0, 4, 8], [2, -1, -1], [-1, -1, -1], [1, 2, 3], [8, -1, -1]])
    out = gather_steps(x, pos)
    for i in range(5):
        for k in range(3):
            expect = x[i, pos[i, k]] if pos[i, k] >= 0 else 0.0
            assert float(out[i, k]) == pytest.approx(float(expect))
    with pytest.raises(ValueError, match="beyond"):
        gather_steps(x[:, :5], pos)


def test_prm_step_loss_hand_computed():
    logits = torch.tensor([[0.0, 9.0, LN3, 9.0], [-LN3, 9.0, 9.0, 9.0]])
    pos = torch.tensor([[0, 2], [0, -1]])
    step_mask = pos >= 0
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    loss, m = prm_step_loss(logits, pos, step_mask, labels)
    # steps: (0, y=1) -> ln 2; (ln 3, y=0) -> ln 4; (-ln 3, y=0) -> -log(1 - 1/4) = ln(4/3).
    # The padded step's label 1 never counts.
    assert float(loss) == pytest.approx((math.log(2) + math.log(4) + math.log(4 / 3)) / 3)
    # predictions: 0 -> 0.5 is not > 0.5 -> 0 vs 1 wrong; ln 3 -> 1 vs 0 wrong; -ln 3 -> 0 right
    assert m["step_prm/acc"] == pytest.approx(1 / 3)


def test_binary_metrics_hand_computed():
    probs = torch.tensor([0.9, 0.6, 0.4, 0.2])
    labels = torch.tensor([1, 0, 1, 0])
    m = binary_metrics(probs, labels, "x")
    # threshold 0.5: predictions 1, 1, 0, 0 -> right, wrong, wrong, right
    assert m["x/acc"] == 0.5 and m["x/majority_acc"] == 0.5 and m["x/positive_rate"] == 0.5
    # positive/negative pairs: (0.9 > 0.6), (0.9 > 0.2), (0.4 < 0.6), (0.4 > 0.2) -> 3/4
    assert m["x/auroc"] == 0.75
    assert math.isnan(binary_metrics(probs, torch.ones(4), "x")["x/auroc"])


def _arith_batch(tok, n: int = 16):
    """Half right, half wrong answers on the same kind of problems; one step before the answer."""
    task = ArithmeticTask(min_operands=2, max_operands=2)
    problems = task.problems(n, seed=3)
    responses, y = [], []
    for i, p in enumerate(problems):
        right = i % 2 == 0
        answer = int(p.answer) + (0 if right else 1)
        responses.append(p.solution.rsplit("\n", 1)[0] + f"\nA:{answer}")
        y.append(float(right))
    prompts = [tok(p.prompt)["input_ids"] for p in problems]
    return batch_from_texts(tok, prompts, responses), torch.tensor(y)


def test_reward_model_round_trip_and_scores(tiny_model_dir, tmp_path):
    from primekit.models.hf import load_tokenizer, save_model

    tok = load_tokenizer(tiny_model_dir)
    model = init_reward_model(tiny_model_dir, seed=0)
    # Seeded head: the same seed gives the same scalar head.
    again = init_reward_model(tiny_model_dir, seed=0)
    assert torch.equal(model.score.weight, again.score.weight)
    batch, _ = _arith_batch(tok, 4)
    save_model(model, tok, tmp_path / "rm")
    loaded = load_reward_model(tmp_path / "rm")
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    a = batch_response_logits(model.eval(), batch, micro_batch_size=4)
    b = batch_response_logits(loaded, batch, micro_batch_size=3)  # chunking changes nothing
    assert torch.allclose(a, b, atol=1e-6)
    assert torch.all(a[batch.response_mask == 0] == 0)
    # ORM score = sigmoid of the logit at the last valid token (EOS).
    last = last_token_index(batch.response_mask)
    expect = torch.sigmoid(a[torch.arange(4), last])
    assert torch.allclose(orm_scores(loaded, batch, micro_batch_size=2), expect, atol=1e-6)
    with pytest.raises(FileNotFoundError):
        load_reward_model(tmp_path / "missing")


def test_orm_fit_reduces_loss(tiny_model_dir):
    from primekit.models.hf import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    batch, y = _arith_batch(tok, 16)
    model = init_reward_model(tiny_model_dir, seed=0)
    mask = batch.response_mask.float()

    def loss_fn(logits, rows, t):
        return orm_loss(logits, y[rows], mask[rows, :t], target="last")

    history = fit_reward_model(
        model, batch, loss_fn, epochs=8, lr=3e-3, batch_size=8, weight_decay=0.0, grad_clip=1.0,
        seed=0, prefix="orm",
    )
    assert history[-1]["orm/loss"] < history[0]["orm/loss"]
    assert not model.training and "orm/grad_norm" in history[0]


def test_prm_fit_reduces_loss_on_step_labels(tiny_model_dir):
    from primekit.algorithms.segmentation import segment_batch
    from primekit.models.hf import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    batch, y = _arith_batch(tok, 16)
    pos, step_mask = segment_batch(tok, batch.response_ids, batch.response_mask, "\n")
    # The computation step is always right; the answer step is right on even rows.
    labels = torch.stack([torch.ones(16), y], dim=1)
    model = init_reward_model(tiny_model_dir, seed=0)

    def loss_fn(logits, rows, t):
        return prm_step_loss(logits, pos[rows], step_mask[rows], labels[rows])

    history = fit_reward_model(
        model, batch, loss_fn, epochs=8, lr=3e-3, batch_size=8, weight_decay=0.0, grad_clip=1.0,
        seed=0, prefix="step_prm",
    )
    assert history[-1]["step_prm/loss"] < history[0]["step_prm/loss"]
    probs, positions, mask = prm_step_scores(model, tok, batch, delimiter="\n", micro_batch_size=8)
    assert torch.equal(positions, pos) and torch.equal(mask, step_mask)
    assert torch.all((probs >= 0) & (probs <= 1)) and torch.all(probs[~mask] == 0)
