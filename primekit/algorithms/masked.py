"""Masked reductions, whitening and loss aggregation over padded token tensors.

Notation: N sequences (B prompts x K samples), T response tokens. Responses are right-padded and
`mask` is 1 (or True) on real response tokens. Values at masked positions are never read: they are
replaced by 0 with `torch.where`, so NaN/inf padding cannot leak into a result.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "LOSS_AGG_MODES",
    "aggregate_loss",
    "loss_agg_count",
    "masked_mean",
    "masked_mean_std",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]


def _bool_mask(mask: torch.Tensor, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    if mask.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(like.shape)}")
    return mask.bool()


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` over entries where `mask` is set.

    Formula: sum_i x_i * [mask_i]. Masked entries contribute exactly 0 (even if NaN).

    Args:
        x: any shape, e.g. [N, T].
        mask: same shape as `x`, bool or {0, 1}.
        dim: reduce over this dim; None reduces over all entries (a scalar).
    Returns:
        The masked sum, shape of `x` without `dim` (scalar when dim is None).
    """
    m = _bool_mask(mask, x)
    xm = torch.where(m, x, torch.zeros_like(x))
    return xm.sum() if dim is None else xm.sum(dim=dim)


def masked_mean(
    x: torch.Tensor,
    mask: torch.Tensor,
    dim: int | None = None,
    eps: float = 1e-8,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Mean of `x` over entries where `mask` is set.

    Formula: sum_i x_i [mask_i] / max(sum_i [mask_i], eps). The max() keeps the result exact
    whenever at least one entry is valid and returns 0 for an all-masked slice (sum is 0).

    Args:
        x: any shape, e.g. [N, T].
        mask: same shape as `x`.
        dim: reduce over this dim; None reduces over all entries.
        eps: floor for the count of valid entries.
        all_reduce: sums a tensor over data-parallel ranks (e.g.
            `primekit.distributed.all_reduce_sum`), so that the mean is over every rank's valid
            entries; only with dim=None. None: this tensor alone.
    Returns:
        The masked mean, shape of `x` without `dim` (scalar when dim is None).
    """
    m = _bool_mask(mask, x)
    count = m.sum() if dim is None else m.sum(dim=dim)
    total = masked_sum(x, m, dim)
    if all_reduce is not None:
        if dim is not None:
            raise ValueError("masked_mean: all_reduce needs dim=None (one scalar per rank)")
        total, count = all_reduce(torch.stack([total, count.to(total.dtype)]))
    return total / count.to(x.dtype).clamp_min(eps)


def masked_mean_std(
    x: torch.Tensor,
    mask: torch.Tensor,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased standard deviation of the valid entries of `x` (two scalars).

    Formula: mean = sum_i x_i [mask_i] / n; std = sqrt(sum_i (x_i - mean)^2 [mask_i] / (n - 1)),
    n the number of valid entries; std is 0 with fewer than two (mean 0 with none). Two passes
    (the mean first), as in one process, so W ranks agree with one process to rounding.

    Args:
        x: any shape, e.g. [N, T] or [N].
        mask: same shape as `x`.
        all_reduce: sums a tensor over data-parallel ranks: the statistics of every rank's
            entries (two all-reduces); None: of `x` alone.
    Returns:
        (mean, std), 0-dim tensors in x's dtype.
    """
    m = _bool_mask(mask, x)
    n, total = m.sum().to(x.dtype), masked_sum(x, m)
    if all_reduce is not None:
        n, total = all_reduce(torch.stack([n, total]))
    mean = total / n.clamp_min(1)
    sq = masked_sum((x - mean) ** 2, m)
    if all_reduce is not None:
        sq = all_reduce(sq)
    return mean, (sq / (n - 1).clamp_min(1)).sqrt()


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `x` over all valid entries (a scalar).

    Formula: sum_i (x_i - mean)^2 [mask_i] / (n - 1) if unbiased else / n, n = number of valid
    entries.

    Args:
        x: any shape.
        mask: same shape as `x`.
        unbiased: Bessel's correction (n - 1).
    Returns:
        Scalar variance.
    Raises:
        ValueError: no valid entry, or exactly one with unbiased=True.
    """
    m = _bool_mask(mask, x)
    n = int(m.sum())
    if n == 0 or (unbiased and n == 1):
        raise ValueError(f"masked_var needs at least {2 if unbiased else 1} valid entries, got {n}")
    mean = masked_mean(x, m)
    sq = masked_sum((x - mean) ** 2, m)
    return sq / (n - 1 if unbiased else n)


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Standardise the valid entries of `x` to zero mean and unit (unbiased) std.

    Formula: (x - mean) / sqrt(var + eps), mean and unbiased var over all valid entries; with
    shift_mean=False the mean is added back (only the scale changes). Invalid entries are 0.
    With fewer than 2 valid entries the variance is taken as 0 (each valid entry then equals the
    mean and maps to 0), so the function never raises.

    Under data parallelism `x` is one rank's share of the batch; `all_reduce` (a sum over ranks,
    e.g. `primekit.distributed.all_reduce_sum`) makes the count, mean and variance those of the
    whole batch, so W ranks x 1/W of the batch whiten as one process with all of it.

    Args:
        x: any shape, e.g. advantages [N, T].
        mask: same shape as `x`.
        shift_mean: subtract the mean (True) or only rescale (False).
        eps: added to the variance.
        all_reduce: sums a tensor over ranks; None: the statistics of `x` alone.
    Returns:
        Tensor shaped like `x`.
    """
    m = _bool_mask(mask, x)
    # No branch on the count (a host sync on a GPU): with no valid entry the mean and sum are 0
    # and the final torch.where returns zeros.
    n, total = m.sum().to(x.dtype), masked_sum(x, m)
    if all_reduce is not None:
        n, total = all_reduce(torch.stack([n, total]))
    mean = total / n.clamp_min(1e-8)
    sq = masked_sum((x - mean) ** 2, m)
    if all_reduce is not None:
        sq = all_reduce(sq)
    var = sq / (n - 1).clamp_min(1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))


def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(loss_mat, mask)


def _seq_rows(mask: torch.Tensor) -> torch.Tensor:
    return mask.bool().any(dim=-1)  # [N]; rows with no valid token are left out of seq means


def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_seq = masked_sum(loss_mat, mask, dim=-1)  # [N]
    return masked_mean(per_seq, _seq_rows(mask))


def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_seq = masked_mean(loss_mat, mask, dim=-1)  # [N]
    return masked_mean(per_seq, _seq_rows(mask))


# name -> f(loss_mat [N, T], mask [N, T]) -> scalar.
# token-mean:          sum over all valid tokens / number of valid tokens (long answers weigh more)
# seq-mean-token-sum:  mean over sequences of the per-sequence token sum
# seq-mean-token-mean: mean over sequences of the per-sequence token mean (each answer weighs 1)
# The seq-* modes average over sequences that have at least one valid token.
LOSS_AGG_MODES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
}


def loss_agg_count(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The denominator `aggregate_loss` divides by: valid tokens (token-mean), or sequences
    with at least one valid token (seq-* modes). mask: [N, T]. Returns a 0-dim float tensor.

    A loss over micro-batches (or ranks) equals the loss of the whole mini-batch when each
    part's `aggregate_loss` is weighted by count(part) / count(mini-batch)."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid: {sorted(LOSS_AGG_MODES)}")
    m = mask.bool()
    return (m.sum() if mode == "token-mean" else _seq_rows(m).sum()).float()


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar with one of `LOSS_AGG_MODES`.

    Args:
        loss_mat: [N, T] per-token loss.
        mask: [N, T] valid response tokens.
        mode: a key of `LOSS_AGG_MODES`.
    Returns:
        Scalar loss (differentiable).
    Raises:
        ValueError: unknown mode (the message lists the valid ones) or bad shapes.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid: {sorted(LOSS_AGG_MODES)}")
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [N, T], got shape {tuple(loss_mat.shape)}")
    _bool_mask(mask, loss_mat)
    return LOSS_AGG_MODES[mode](loss_mat, mask)
