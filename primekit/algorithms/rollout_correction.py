"""Rollout/trainer mismatch: how far the sampler's log-probs are from the trainer's, and the
truncated importance-sampling (TIS) weights that correct the policy gradient for it.

A rollout engine with its own kernels (vLLM) samples from pi_rollout, which differs slightly
from the trainer's pi_old although both hold the same weights. The PPO ratio is taken against
pi_old (recomputed by the trainer), so the samples are slightly off-policy for it. TIS (Yao et al.
2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"; the same
correction as verl's `tis_imp_ratio_cap`) weights each token's policy loss by the importance
ratio pi_old / pi_rollout, truncated from above at C so one rare token cannot dominate.

Notation: N sequences, T response tokens; log-probs are of the sampled tokens, [N, T].
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from primekit.algorithms.masked import masked_mean

__all__ = ["logprob_mismatch", "truncated_importance_weights"]


def _check(old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor,
           response_mask: torch.Tensor) -> None:
    shapes = {tuple(t.shape) for t in (old_logprobs, sampling_logprobs, response_mask)}
    if len(shapes) != 1:
        raise ValueError(
            f"old_logprobs {tuple(old_logprobs.shape)}, sampling_logprobs "
            f"{tuple(sampling_logprobs.shape)} and response_mask {tuple(response_mask.shape)} "
            f"must share one [N, T] shape")


def truncated_importance_weights(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
) -> torch.Tensor:
    """Per-token truncated importance weights w_t = min(pi_old(y_t) / pi_rollout(y_t), C).

    Formula: w_t = min(exp(old_logprobs_t - sampling_logprobs_t), cap), 0 on padding; detached
    (a weight on the loss, not a path for gradients). Multiplying each token's policy loss by w_t
    (Yao et al. 2025, Eq. for truncated IS) corrects the gradient of samples drawn from
    pi_rollout towards the on-policy gradient under pi_old, with bias from the truncation only.

    Args:
        old_logprobs: [N, T] the trainer's log-probs of the sampled tokens (pi_old).
        sampling_logprobs: [N, T] the rollout engine's log-probs of the same tokens (pi_rollout).
        response_mask: [N, T] 1 on valid tokens.
        cap: C > 0, the largest weight.
    Returns:
        [N, T] float weights in [0, cap].
    """
    _check(old_logprobs, sampling_logprobs, response_mask)
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap!r}")
    log_ratio = (old_logprobs.detach().float() - sampling_logprobs.detach().float())  # [N, T]
    weights = torch.exp(log_ratio).clamp(max=cap)
    return weights * response_mask.to(weights.dtype)


def logprob_mismatch(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    all_reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """How far the rollout engine's log-probs are from the trainer's on the same sampled tokens.

    Formula, with d_t = old_logprobs_t - sampling_logprobs_t over valid tokens:
      rollout/logprob_kl = mean_t (exp(d_t) - 1 - d_t), the k3 estimate of
        KL(pi_rollout || pi_old) from tokens sampled by pi_rollout (>= 0 per token, 0 iff equal);
      rollout/logprob_max_abs_diff = max_t |d_t|.
    Both are 0 with no valid token.

    Args:
        old_logprobs: [N, T] the trainer's log-probs (pi_old).
        sampling_logprobs: [N, T] the rollout engine's log-probs (pi_rollout).
        response_mask: [N, T].
        all_reduce, all_reduce_max: the sum and the max over data-parallel ranks, so that the
            mean and the max are over every rank's tokens; None: this batch alone.
    Returns:
        {"rollout/logprob_kl": 0-dim, "rollout/logprob_max_abs_diff": 0-dim}, detached, nats.
    """
    _check(old_logprobs, sampling_logprobs, response_mask)
    d = old_logprobs.detach().float() - sampling_logprobs.detach().float()  # [N, T]
    m = response_mask.bool()
    abs_diff = d.abs().masked_fill(~m, 0.0)
    max_abs = abs_diff.max() if d.numel() else d.new_zeros(())
    if all_reduce_max is not None:
        max_abs = all_reduce_max(max_abs)
    return {
        "rollout/logprob_kl": masked_mean(torch.expm1(d) - d, m, all_reduce=all_reduce),
        "rollout/logprob_max_abs_diff": max_abs,
    }
