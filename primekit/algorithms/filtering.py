"""Online prompt filter (PRIME Sec. 3.3): keep prompts of medium difficulty.

Notation: N sequences, `group_ids` [N] (samples of one prompt share an id), outcome_rewards [N].
"""

from __future__ import annotations

import torch

from primekit.algorithms.groups import _index, group_mean

__all__ = ["filter_groups"]


def filter_groups(
    outcome_rewards: torch.Tensor,
    group_ids: torch.Tensor,
    lo: float = 0.2,
    hi: float = 0.8,
    *,
    tol: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Keep every sample of a group whose mean outcome lies in [lo, hi] (PRIME Sec. 3.3).

    Formula: keep_i = lo - tol <= mean_{j in g(i)} r_o(y^j) <= hi + tol. The tolerance makes the
    bounds inclusive despite float rounding (with K = 5, 1/5 = 0.2 is kept; with K = 4 the paper's
    [0.2, 0.8] keeps 1/4, 2/4, 3/4).

    Args:
        outcome_rewards: [N].
        group_ids: [N].
        lo, hi: accuracy bounds, lo <= hi.
        tol: float tolerance on both bounds.
    Returns:
        (keep [N] bool, metrics) with filter/keep_rate (kept groups / groups, 0 without groups),
        filter/groups, filter/kept_groups, as detached 0-dim float tensors.
    """
    if lo > hi:
        raise ValueError(f"lo must be <= hi, got lo={lo}, hi={hi}")
    mean = group_mean(outcome_rewards.to(torch.float64), group_ids)  # [N]
    keep = (mean >= lo - tol) & (mean <= hi + tol)
    inverse, counts = _index(outcome_rewards, group_ids)
    n_groups = counts.shape[0]
    kept = torch.zeros(n_groups, dtype=torch.bool, device=keep.device)
    kept[inverse] = keep  # all samples of a group share the decision
    n_kept = kept.sum().to(torch.float64)
    metrics = {
        "filter/keep_rate": n_kept / max(n_groups, 1),
        "filter/groups": torch.full((), float(n_groups), dtype=torch.float64, device=keep.device),
        "filter/kept_groups": n_kept,
    }
    return keep, metrics
