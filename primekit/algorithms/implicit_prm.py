"""Implicit process reward model (PRIME, arXiv 2502.01456): token rewards, PRM losses, accuracy.

Notation: N sequences (B prompts x K samples), T response tokens, `response_mask` [N, T].
The implicit PRM pi_phi is a causal LM; with a frozen reference pi_ref its token reward is
    r_phi(y_t) = beta * (log pi_phi(y_t | y_<t) - log pi_ref(y_t | y_<t))      (PRIME Eq. 3)
and the sequence reward is the sum over tokens, r_phi(y) = beta * log pi_phi(y) / pi_ref(y).
Loss metrics are detached 0-dim tensors (no host sync per micro-batch); the trainer reduces them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from primekit.algorithms.groups import _index, group_layout
from primekit.algorithms.masked import masked_sum

__all__ = [
    "implicit_sequence_rewards",
    "implicit_token_rewards",
    "prm_absolute_accuracy",
    "prm_ce_loss",
    "prm_dpo_loss",
    "prm_pairwise_accuracy",
    "prm_pairwise_counts",
]


def _check_beta(beta: float) -> None:
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")


def _check_outcomes(outcome_rewards: torch.Tensor, n: int) -> None:
    if outcome_rewards.shape != (n,):
        raise ValueError(f"outcome_rewards must be [{n}], got {tuple(outcome_rewards.shape)}")
    if outcome_rewards.numel() and (outcome_rewards.min() < 0 or outcome_rewards.max() > 1):
        raise ValueError(
            "outcome_rewards must lie in [0, 1] for the PRM loss, got range "
            f"[{float(outcome_rewards.min())}, {float(outcome_rewards.max())}]"
        )


def implicit_token_rewards(
    prm_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Per-token implicit process reward (PRIME Eq. 3).

    Formula: r_t = beta * (log pi_prm(y_t|y_<t) - log pi_ref(y_t|y_<t)), 0 off the mask.
    Gradients flow into both inputs; detach them for use as a policy reward.

    Args:
        prm_logprobs: [N, T] log-prob of each sampled token under the PRM.
        ref_logprobs: [N, T] the same under the reference model.
        response_mask: [N, T].
        beta: reward scale (paper: 0.05).
    Returns:
        token_rewards [N, T].
    """
    _check_beta(beta)
    if prm_logprobs.shape != ref_logprobs.shape or prm_logprobs.shape != response_mask.shape:
        raise ValueError(
            f"prm_logprobs {tuple(prm_logprobs.shape)}, ref_logprobs {tuple(ref_logprobs.shape)} "
            f"and response_mask {tuple(response_mask.shape)} must have the same [N, T] shape"
        )
    diff = beta * (prm_logprobs - ref_logprobs)  # [N, T]
    return torch.where(response_mask.bool(), diff, torch.zeros_like(diff))


def implicit_sequence_rewards(
    token_rewards: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Sequence-level implicit reward r_phi(y) = sum_t r_t over valid tokens. [N, T] -> [N]."""
    return masked_sum(token_rewards, response_mask, dim=-1)


def prm_ce_loss(
    prm_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    outcome_rewards: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy PRM loss (PRIME Sec. 3.2, Algorithm 1 line 8).

    Formula: L = mean_i BCE(sigmoid(R_i), r_o(y_i)),  R_i = beta * sum_t (logp_prm - logp_ref),
      BCE(sigmoid(R), y) = -(y * logsigmoid(R) + (1 - y) * logsigmoid(-R)).
    The logsigmoid form is exact and stable for large |R|. Soft labels y in [0, 1] are allowed
    (code tasks: fraction of tests passed). `ref_logprobs` is detached: only the PRM learns.
    dL/dR_i = (sigmoid(R_i) - y_i) / N.

    Args:
        prm_logprobs: [N, T] PRM token log-probs (with grad).
        ref_logprobs: [N, T] reference token log-probs.
        response_mask: [N, T].
        outcome_rewards: [N] labels in [0, 1].
        beta: reward scale.
    Returns:
        (loss, metrics) with metrics prm/loss, prm/acc_abs, prm/reward_mean.
    """
    token_rewards = implicit_token_rewards(prm_logprobs, ref_logprobs.detach(), response_mask, beta)
    seq = implicit_sequence_rewards(token_rewards, response_mask)  # [N]
    y = outcome_rewards.detach().to(seq.dtype)
    _check_outcomes(y, seq.shape[0])
    per_seq = -(y * F.logsigmoid(seq) + (1.0 - y) * F.logsigmoid(-seq))  # [N]
    loss = per_seq.mean()
    metrics = {
        "prm/loss": loss.detach(),
        "prm/acc_abs": prm_absolute_accuracy(seq.detach(), y),
        "prm/reward_mean": seq.detach().mean(),
    }
    return loss, metrics


def _pair_layout(
    sequence_rewards: torch.Tensor, outcome_rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group pair tensors [G, Kmax, Kmax]: margins R_i - R_j and the mask of ordered pairs
    (i, j) of one group with r_o(i) > r_o(j) (each pair with differing outcomes appears once).
    Padding slots hold -inf outcomes that never win, and are excluded from the mask.
    """
    _index(outcome_rewards, group_ids)  # shape / dtype validation
    inverse, slot, g, kmax = group_layout(outcome_rewards, group_ids)
    dtype = sequence_rewards.dtype
    r = torch.zeros(g, kmax, dtype=dtype, device=sequence_rewards.device)
    r = r.index_put((inverse, slot), sequence_rewards)  # [G, Kmax], differentiable in R
    o = torch.full((g, kmax), float("-inf"), dtype=torch.float64, device=outcome_rewards.device)
    o = o.index_put((inverse, slot), outcome_rewards.to(torch.float64))
    valid = torch.zeros(g, kmax, dtype=torch.bool, device=outcome_rewards.device)
    valid = valid.index_put((inverse, slot), torch.ones_like(inverse, dtype=torch.bool))
    pairs = (o[:, :, None] > o[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    return r[:, :, None] - r[:, None, :], pairs


def prm_dpo_loss(
    prm_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    outcome_rewards: torch.Tensor,
    group_ids: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Pairwise (DPO / Bradley-Terry) PRM loss within each prompt group (PRIME App. C.2 option).

    Formula: L = mean_{(i,j): g(i)=g(j), r_o(i) > r_o(j)} -logsigmoid(R_i - R_j),
      R = beta * sum_t (logp_prm - logp_ref). With no such pair, L = 0 * sum(R) (zero, but still
    attached to the graph so a backward pass works). The public reference code's "dpo" loss is a
    different, detached variant; this is the plain pairwise form.

    Args:
        prm_logprobs, ref_logprobs, response_mask: [N, T].
        outcome_rewards: [N] in [0, 1] (ties form no pair).
        group_ids: [N] prompt ids.
        beta: reward scale.
    Returns:
        (loss, metrics) with prm/loss, prm/dpo_pairs, prm/acc_abs.
    """
    token_rewards = implicit_token_rewards(prm_logprobs, ref_logprobs.detach(), response_mask, beta)
    seq = implicit_sequence_rewards(token_rewards, response_mask)  # [N]
    y = outcome_rewards.detach().to(seq.dtype)
    _check_outcomes(y, seq.shape[0])
    margin, pairs = _pair_layout(seq, y, group_ids)  # [G, Kmax, Kmax], R_i - R_j
    n_pairs = pairs.sum()
    # Masked sum instead of margin[pairs] and an `if` on the count: both would sync with the host.
    # With no pair the sum is an exact 0 that stays attached to the graph.
    per_pair = torch.where(pairs, -F.logsigmoid(margin), torch.zeros_like(margin))
    loss = per_pair.sum() / n_pairs.clamp_min(1).to(per_pair.dtype)
    metrics = {
        "prm/loss": loss.detach(),
        "prm/dpo_pairs": n_pairs.to(per_pair.dtype),
        "prm/acc_abs": prm_absolute_accuracy(seq.detach(), y),
        "prm/reward_mean": seq.detach().mean(),
    }
    return loss, metrics


def prm_pairwise_counts(
    sequence_rewards: torch.Tensor, outcome_rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerator and denominator of the PRM pairwise accuracy, summable across ranks.

    Over unordered pairs {i, j} in the same group with r_o(i) != r_o(j): a pair scores 1 if
    R orders them like the outcomes, 0 if the opposite way, and 0.5 if R_i == R_j (a tie is a coin
    flip; in particular an untrained PRM, R = 0 everywhere, scores exactly 0.5).

    Args:
        sequence_rewards: [N] summed implicit rewards R.
        outcome_rewards: [N].
        group_ids: [N].
    Returns:
        (n_correct, n_pairs) float scalars.
    """
    r = sequence_rewards.detach()
    margin, pairs = _pair_layout(r, outcome_rewards.detach(), group_ids)  # i better than j
    score = (margin > 0).to(r.dtype) + 0.5 * (margin == 0).to(r.dtype)
    n_correct = (score * pairs).sum()
    return n_correct, pairs.sum().to(r.dtype)


def prm_pairwise_accuracy(
    sequence_rewards: torch.Tensor, outcome_rewards: torch.Tensor, group_ids: torch.Tensor
) -> torch.Tensor:
    """PRM pairwise (ranking) accuracy: n_correct / n_pairs, NaN when there is no pair.

    See `prm_pairwise_counts`. Pooled over all pairs of the batch (not averaged per group), and
    each pair weighs 1 even with soft labels; the reference code instead averages per group and
    weighs pairs by |r_o(i) - r_o(j)|, which coincides for binary labels and equal group sizes.
    """
    n_correct, n_pairs = prm_pairwise_counts(sequence_rewards, outcome_rewards, group_ids)
    if n_pairs == 0:
        return torch.tensor(float("nan"), dtype=n_correct.dtype, device=n_correct.device)
    return n_correct / n_pairs


def prm_absolute_accuracy(
    sequence_rewards: torch.Tensor, outcome_rewards: torch.Tensor, threshold: float = 0.5
) -> torch.Tensor:
    """Fraction of samples where (R > 0) == (r_o > threshold), i.e. sigmoid(R) > 0.5 as a classifier.

    R == 0 counts as a "wrong" prediction, so an untrained PRM scores the fraction of failures.
    Args: sequence_rewards [N], outcome_rewards [N]. Returns a scalar (NaN for N = 0).
    """
    pred = sequence_rewards.detach() > 0
    label = outcome_rewards.detach() > threshold
    return (pred == label).float().mean()
