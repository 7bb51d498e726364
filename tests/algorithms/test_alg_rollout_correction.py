"""Truncated importance weights and the rollout/trainer log-prob mismatch, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from primekit.algorithms.rollout_correction import logprob_mismatch, truncated_importance_weights

# One row: the trainer gives the first token 0.5 where the sampler gave 0.25 (ratio 2), the
# second 0.25 where the sampler gave 0.5 (ratio 0.5); the third column is padding.
OLD = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])
SAMPLED = torch.tensor([[math.log(0.25), math.log(0.5), -3.0]])
MASK = torch.tensor([[1, 1, 0]])


def test_weights_are_ratios_truncated_at_the_cap_and_zero_on_padding():
    # min(2, 1.5) = 1.5; min(0.5, 1.5) = 0.5; padding 0.
    w = truncated_importance_weights(OLD, SAMPLED, MASK, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 0.0]]))
    # A cap above every ratio leaves them untouched: [2, 0.5, 0].
    w = truncated_importance_weights(OLD, SAMPLED, MASK, cap=10.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 0.0]]))


def test_weights_carry_no_gradient_and_reject_a_bad_cap_or_shape():
    old = OLD.clone().requires_grad_(True)
    assert not truncated_importance_weights(old, SAMPLED, MASK, cap=2.0).requires_grad
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_importance_weights(OLD, SAMPLED, MASK, cap=0.0)
    with pytest.raises(ValueError, match="one \\[N, T\\] shape"):
        truncated_importance_weights(OLD, SAMPLED[:, :2], MASK, cap=2.0)


def test_mismatch_kl_and_max_abs_diff():
    # d = old - sampled = [log 2, -log 2] on valid tokens; k3 = exp(d) - 1 - d:
    # (2 - 1 - log 2) + (0.5 - 1 + log 2) = 0.5, mean over 2 tokens = 0.25. max |d| = log 2.
    # The padding column (d = 3) is ignored by both.
    m = logprob_mismatch(OLD, SAMPLED, MASK)
    assert m["rollout/logprob_kl"].item() == pytest.approx(0.25)
    assert m["rollout/logprob_max_abs_diff"].item() == pytest.approx(math.log(2))


def test_mismatch_is_zero_for_identical_logprobs_and_for_an_empty_mask():
    m = logprob_mismatch(OLD, OLD, MASK)
    assert m["rollout/logprob_kl"].item() == 0.0
    assert m["rollout/logprob_max_abs_diff"].item() == 0.0
    m = logprob_mismatch(OLD, SAMPLED, torch.zeros_like(MASK))
    assert m["rollout/logprob_kl"].item() == 0.0
    assert m["rollout/logprob_max_abs_diff"].item() == 0.0
