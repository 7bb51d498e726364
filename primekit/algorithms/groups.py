"""Per-prompt group statistics over `group_ids` (vectorised, groups need not be contiguous).

Notation: N sequences; `group_ids` [N] long, equal ids = samples of the same prompt. Groups may be
interleaved and of different sizes. Every function here broadcasts its per-group statistic back
to the N samples, so callers never handle the group axis.
"""

from __future__ import annotations

import torch

__all__ = [
    "group_counts",
    "group_layout",
    "group_mean",
    "group_std",
    "group_sum",
    "leave_one_out_mean",
]


def _index(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Map group ids to 0..G-1; return (inverse [N], counts [G])."""
    if group_ids.dim() != 1 or values.dim() != 1 or group_ids.shape[0] != values.shape[0]:
        raise ValueError(
            f"group_ids {tuple(group_ids.shape)} and values {tuple(values.shape)} must both be [N]"
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return inverse, counts


def _require_size(counts: torch.Tensor, k: int, what: str) -> None:
    if counts.numel() and int(counts.min()) < k:
        raise ValueError(
            f"{what} needs every group to have >= {k} samples; smallest group has "
            f"{int(counts.min())} (group_ids must keep a prompt's samples together)"
        )


def group_counts(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Size of each sample's group, broadcast to [N] (same dtype as `values`)."""
    inverse, counts = _index(values, group_ids)
    return counts[inverse].to(values.dtype)


def group_sum(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """sum_{j in g(i)} values_j for each sample i. values, group_ids: [N] -> [N]."""
    inverse, counts = _index(values, group_ids)
    sums = torch.zeros(counts.shape[0], dtype=values.dtype, device=values.device)
    sums = sums.index_add(0, inverse, values)  # [G]
    return sums[inverse]


def group_mean(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Mean of each sample's group, broadcast to [N]."""
    return group_sum(values, group_ids) / group_counts(values, group_ids)


def group_std(values: torch.Tensor, group_ids: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Std of each sample's group, broadcast to [N]; unbiased (n-1) needs groups of >= 2."""
    inverse, counts = _index(values, group_ids)
    if unbiased:
        _require_size(counts, 2, "an unbiased group std")
    n = counts[inverse].to(values.dtype)
    dev = values - group_mean(values, group_ids)
    ss = group_sum(dev * dev, group_ids)
    return torch.sqrt(ss / (n - 1 if unbiased else n))


def leave_one_out_mean(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """mean_{j in g(i), j != i} values_j for each sample i (the RLOO baseline).

    Formula: (sum_{j in g(i)} values_j - values_i) / (|g(i)| - 1). Needs groups of >= 2.
    """
    inverse, counts = _index(values, group_ids)
    _require_size(counts, 2, "a leave-one-out baseline")
    n = counts[inverse].to(values.dtype)
    return (group_sum(values, group_ids) - values) / (n - 1)


def group_layout(
    values: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Slots for a padded per-group layout [G, Kmax] (Kmax = largest group).

    Returns (inverse [N] group index, slot [N] position inside the group, G, Kmax), so that
    `padded[inverse, slot] = values` builds [G, Kmax] and pairwise work costs N * Kmax, not N^2.
    """
    inverse, counts = _index(values, group_ids)
    n = inverse.shape[0]
    order = torch.sort(inverse, stable=True).indices  # [N], samples grouped together
    starts = torch.cumsum(counts, 0) - counts  # [G], first sorted position of each group
    slot = torch.empty(n, dtype=torch.long, device=inverse.device)
    slot[order] = torch.arange(n, device=inverse.device) - starts[inverse[order]]
    kmax = int(counts.max()) if n else 0
    return inverse, slot, int(counts.shape[0]), kmax
