"""Process-group helpers that degrade to a single process when torch.distributed is not in use.

Everything here reads the *initialised* default process group. Without one (plain `python`,
tests, the CPU demo) the world has size 1, this process is rank 0 and every collective is the
identity. Under `torchrun`, call `torch.distributed.init_process_group` before anything that
asks for the rank (loggers, checkpoints); the `RANK` environment variable alone is not trusted,
because a rank count without a process group could not run the collectives that go with it.

Sharding is contiguous: rank r gets one unbroken slice, so the K samples of a prompt (which sit
next to each other, as the trainer lays them out) never straddle two ranks when sharded by group.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_REDUCE_OPS = ("mean", "sum", "max", "min")


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    """Rank of this process in the default group; 0 when torch.distributed is not initialised."""
    return torch.distributed.get_rank() if _initialized() else 0


def world_size() -> int:
    """Number of processes in the default group; 1 when torch.distributed is not initialised."""
    return torch.distributed.get_world_size() if _initialized() else 1


def is_main() -> bool:
    """True on rank 0, the only rank that writes files and logs."""
    return rank() == 0


def per_rank(size: int, name: str) -> int:
    """This rank's share of a global batch size (sequences over all ranks). It must divide
    evenly, so that W ranks take as many optimiser steps as one process with the whole batch."""
    if size % world_size():
        from primekit.config import ConfigError

        raise ConfigError(f"{name}: {size} sequences cannot be split evenly over "
                          f"{world_size()} ranks")
    return size // world_size()


def barrier() -> None:
    """Wait until every rank reaches this point; a no-op for a single process."""
    if world_size() > 1:
        torch.distributed.barrier()


def _split(n: int, rank_: int | None, world_size_: int | None, name: str) -> range:
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    w = world_size() if world_size_ is None else world_size_
    r = rank() if rank_ is None else rank_
    if w < 1:
        raise ValueError(f"world_size must be >= 1, got {w}")
    if not 0 <= r < w:
        raise ValueError(f"rank must be in [0, {w}), got {r}")
    # Like numpy.array_split: the first n % w ranks take one extra item.
    base, extra = divmod(n, w)
    start = r * base + min(r, extra)
    return range(start, start + base + (1 if r < extra else 0))


def shard_indices(n: int, *, rank: int | None = None, world_size: int | None = None) -> list[int]:
    """Indices of this rank's contiguous shard of `n` items.

    Shards differ in size by at most one (the first `n % world_size` ranks get the extra item),
    they are disjoint and, concatenated in rank order, give `range(n)`. Uneven shards mean uneven
    work: if the caller runs a collective per item (e.g. a DDP backward per micro-batch), pick `n`
    divisible by the world size.

    Args:
        n: number of items.
        rank, world_size: override the process group's values (for planning or tests).
    Returns:
        list of indices into the `n` items, ascending.
    """
    return list(_split(n, rank, world_size, "n"))


def shard(items: list[T], *, rank: int | None = None, world_size: int | None = None) -> list[T]:
    """This rank's contiguous shard of `items` (see `shard_indices`)."""
    idx = _split(len(items), rank, world_size, "len(items)")
    return items[idx.start : idx.stop]


def shard_groups(
    n_groups: int,
    *,
    group_size: int = 1,
    rank: int | None = None,
    world_size: int | None = None,
) -> list[int]:
    """Indices for this rank's contiguous shard of whole groups.

    The groups (prompts) are split as in `shard_indices(n_groups)`; a group is never cut. With
    `group_size=1` (default) the result is the group indices; with `group_size=K` it is the
    sample indices of those groups in a flat [B*K] layout where group g holds samples
    g*K .. g*K+K-1.

    Args:
        n_groups: number of groups B.
        group_size: samples per group K.
        rank, world_size: override the process group's values.
    Returns:
        ascending list of group indices (K = 1) or sample indices (K > 1).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    groups = _split(n_groups, rank, world_size, "n_groups")
    return list(range(groups.start * group_size, groups.stop * group_size))


def _to_float(key: str, value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"metric {key!r} must be a scalar, got a tensor of shape {tuple(value.shape)}"
            )
        return float(value.detach().item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"metric {key!r} must be a number, got {value!r}") from None


def _device() -> torch.device:
    # NCCL only moves CUDA tensors; gloo (and others) take CPU tensors.
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_object(obj: T) -> list[T]:
    """Every rank's `obj`, in rank order (pickled; for small objects only)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def reduce_metrics(
    metrics: dict[str, float],
    op: str = "mean",
    *,
    sum_keys: Iterable[str] = (),
) -> dict[str, float]:
    """All-reduce a dict of scalar metrics across ranks, skipping NaN.

    For each key, only the ranks where the value is a number (not NaN, and the key present)
    take part: "mean" is sum(values)/count(values) over those ranks, "sum" the sum, "max"/"min"
    the extreme. A key that is NaN or absent on every rank comes back NaN. This is what a metric
    like `prm/accuracy` needs: it is undefined (NaN) on a rank whose groups all share one outcome,
    and the global value should average the ranks where it is defined. +-inf is a number and
    propagates. Keys may differ between ranks; the result has the union of keys, sorted.

    Counters (tokens processed, samples kept by the filter) should be summed while everything
    else is averaged: pass their names in `sum_keys`, which are reduced with "sum" whatever
    `op` is. The mean is an unweighted mean over ranks; for a mean weighted by per-rank counts,
    reduce the weighted sum and the count as sums and divide.

    All ranks must call this (it is a collective). At world size 1 it returns the values as
    floats, unchanged (NaN stays NaN, absent keys stay absent).

    Args:
        metrics: {name: float or 0-dim tensor}.
        op: "mean" | "sum" | "max" | "min".
        sum_keys: names always reduced with "sum".
    Returns:
        {name: float}, the same on every rank.
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"op must be one of {_REDUCE_OPS}, got {op!r}")
    local = {k: _to_float(k, v) for k, v in metrics.items()}
    if world_size() == 1:
        return local
    sums = set(sum_keys)
    keys = sorted(set().union(*all_gather_object(sorted(local))))
    nan = float("nan")
    values = torch.tensor([local.get(k, nan) for k in keys], dtype=torch.float64)  # [M]
    present = ~torch.isnan(values)  # [M]
    dev = _device()

    # One SUM all-reduce carries the NaN-free sums and the counts for "mean" and "sum".
    packed = torch.stack([torch.where(present, values, 0.0), present.double()]).to(dev)  # [2, M]
    torch.distributed.all_reduce(packed, op=torch.distributed.ReduceOp.SUM)
    total, count = packed.cpu()
    if op in ("mean", "sum"):
        reduced = total / count if op == "mean" else total.clone()
    else:
        fill = -math.inf if op == "max" else math.inf
        ext = torch.where(present, values, fill).to(dev)  # [M]
        rop = torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.MIN
        torch.distributed.all_reduce(ext, op=rop)
        reduced = ext.cpu()
    for i, k in enumerate(keys):
        if k in sums:
            reduced[i] = total[i]
    reduced = torch.where(count > 0, reduced, nan)  # [M]
    return {k: float(v) for k, v in zip(keys, reduced.tolist())}


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of `model` as full (unsharded) tensors, on every rank.

    For an FSDP2-sharded model this all-gathers each tensor (a collective: every rank calls
    it); for a plain model it is `state_dict()`. Keys are the unwrapped model's.
    """
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def _all_reduce(t: torch.Tensor, op) -> torch.Tensor:
    if world_size() == 1:
        return t
    out = t.detach().to(_device(), copy=True)
    torch.distributed.all_reduce(out, op=op)
    return out.to(t.device)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum of `t` over ranks (a new, detached tensor); `t` itself at world size 1."""
    return _all_reduce(t, torch.distributed.ReduceOp.SUM)


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """The elementwise max of `t` over ranks (a new, detached tensor); `t` at world size 1."""
    return _all_reduce(t, torch.distributed.ReduceOp.MAX)


def broadcast_object(obj: T, src: int = 0) -> T:
    """Return rank `src`'s `obj` on every rank (pickled; for small objects like configs, paths)."""
    if world_size() == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]


@contextlib.contextmanager
def process_group_from_env() -> Iterator[None]:
    """Under `torchrun` (WORLD_SIZE > 1 in the environment), join the default process group for
    the duration of the block: NCCL with one GPU per process (cuda:LOCAL_RANK) when CUDA is
    available, gloo on CPUs; at its normal end every rank waits for the others before the group
    is torn down. A plain `python` run, or a group already initialised by the caller, passes
    through untouched.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or _initialized():
        yield
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    else:
        backend = "gloo"
    torch.distributed.init_process_group(backend)
    try:
        yield
        # Every rank done before any tears the group down: a rank destroying it while another
        # still runs a collective could abort that one at exit (SIGABRT after a finished run).
        # Not on an exception: the other ranks may never reach a barrier.
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
