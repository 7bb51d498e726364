"""One guarded optimiser step for every trained model: clip, check, step, check the weights.

Every model primekit trains (the policy, the implicit PRM, the critic, the ORM / step-PRM fits,
the SFT warm-up, the live page's injections) takes its optimiser steps through `guarded_step`:

  1. clip the gradient to `grad_clip` (its norm before clipping is returned);
  2. a non-finite gradient norm: under `mode` "skip" the step is dropped (the gradients are
     cleared, the weights untouched); under "abort" `NonFiniteError`;
  3. `optimizer.step()`;
  4. the updated weights: non-finite, or an L2 norm over all of the model's parameters more than
     `WEIGHT_GROWTH_LIMIT` times the norm before the step, is a diverged update. An applied step
     cannot be skipped (its weights are gone), so this always raises `NonFiniteError`, in both
     modes: nothing of the step is saved and the latest checkpoint stays the last good one.

`WEIGHT_GROWTH_LIMIT` is 2: one optimiser step of a healthy run moves the weights by a small
fraction of their norm (AdamW moves each weight by at most about `lr` per step, and the learning
rates that train are 1e-7..1e-3 against weights of norm ~1e1..1e3); a step that doubles the
norm is an exploding update (e.g. `prm.lr=1e20` puts every weight near 1e20: finite garbage that
`isfinite` alone would pass).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from primekit import distributed as dist

WEIGHT_GROWTH_LIMIT = 2.0

# The 1-based training step being computed, for messages; the RL loop sets it (`at_step`).
_step: int | None = None


class NonFiniteError(RuntimeError):
    """A non-finite training quantity under train.on_nonfinite=abort, or a diverged update; the
    message names it."""


def at_step(step: int | None) -> None:
    """The step that messages of later guarded steps name (None: none)."""
    global _step
    _step = step


def _where(name: str, step: int | None) -> str:
    step = _step if step is None else step
    return f"step {step}: {name}" if step is not None else name


def weight_norm(params: Iterable[torch.Tensor]) -> float:
    """The L2 norm over all of `params` (over every rank's shards for sharded ones).

    One norm per device and dtype through torch's foreach kernels and one read back to the host,
    not a norm and a host read per tensor (a synchronisation each on a GPU, twice per optimiser
    step); each tensor's norm in its own dtype, combined in float64. Where that overflows, the
    norm is taken again in float64 tensor by tensor, so finite garbage of any size reads finite.
    """
    local, sharded = [], False
    for p in params:
        t = p.detach()
        if hasattr(t, "to_local"):  # an FSDP2 DTensor: this rank's shard
            t, sharded = t.to_local(), True
        if t.numel():
            local.append(t)
    total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    square = torch.zeros((), dtype=torch.float64)
    if local and total_norm is not None:
        square = total_norm(local, 2.0).detach().to("cpu", torch.float64) ** 2
    if local and (total_norm is None or not torch.isfinite(square)):
        # In the tensors' dtype a norm past ~1.8e19 (float32) overflows; diverged weights get
        # there while still finite, so they are measured again in float64, tensor by tensor.
        square = sum(torch.linalg.vector_norm(t, dtype=torch.float64).cpu() ** 2 for t in local)
    if sharded:
        square = dist.all_reduce_sum(square)
    return math.sqrt(float(square)) if math.isfinite(float(square)) else float(square)


def adamw(params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0.01,
          ) -> torch.optim.AdamW:
    """AdamW for a trained model: torch's fused implementation where the parameters allow it
    (floating point, on a CPU, a GPU or MPS: every parameter in one kernel per step), else its
    default. The same update rule; on the demo's 1.08M-parameter model an AdamW step takes
    0.78 ms fused against 2.71 ms on 2 CPU threads (benchmarks/optimizer_step.py,
    docs/performance.md, "The guarded optimiser step")."""
    params = list(params)
    if fused_adamw_supported(params):
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
        except RuntimeError:  # an older torch that refuses these parameters when constructed
            pass
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def fused_adamw_supported(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW takes every one of `params`: real floating point, on a device
    its fused kernels support (torch checks this only at the first step, too late to choose)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # a torch that keeps it elsewhere: the default implementation
        return False
    devices = set(_get_fused_kernels_supported_devices())
    return bool(params) and all(torch.is_floating_point(p) and p.device.type in devices
                                for p in params)


def nonfinite_weights(model: torch.nn.Module, *, collective: bool = True) -> str | None:
    """The name of the first parameter of `model` with a non-finite value (over all ranks when
    `collective`, a collective under torchrun; else this process's own copy), or None."""
    bad = None
    for key, p in model.named_parameters():
        t = p.detach()
        t = t.to_local() if hasattr(t, "to_local") else t
        if not bool(torch.isfinite(t).all()):
            bad = key
            break
    if collective and dist.world_size() > 1:  # every rank agrees (and raises together)
        flag = dist.reduce_metrics({"bad": 0.0 if bad is None else 1.0}, op="max")["bad"]
        if flag and bad is None:
            bad = "a parameter on another rank"
    return bad


def guarded_step(name: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 grad_clip: float, mode: str = "abort", step: int | None = None,
                 lr_field: str | None = None) -> tuple[torch.Tensor, bool]:
    """Clip, check and apply one optimiser step of `model` (see the module docstring).

    Args:
        name: the model's metric prefix ("policy", "prm", "critic", "sft", "orm"), for messages.
        model: the trained module (plain or FSDP2-sharded); its gradients are in place.
        optimizer: its optimiser.
        grad_clip: max gradient norm.
        mode: `train.on_nonfinite`, "abort" or "skip" (for the gradient norm).
        step: the 1-based step for messages (default: the one set by `at_step`).
        lr_field: the config field of this learning rate, named in a divergence message.
    Returns:
        (gradient norm before clipping as a plain 0-d tensor, whether the step was applied).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    if not bool(torch.isfinite(norm)):
        optimizer.zero_grad(set_to_none=True)
        if mode == "skip":
            return norm, False
        raise NonFiniteError(
            f"{_where(f'{name}/grad_norm', step)} is not finite ({float(norm)}); stopped without "
            f"saving this step (train.on_nonfinite=abort)")
    before = weight_norm(params)
    optimizer.step()
    after = weight_norm(params)
    if not math.isfinite(after) or (before > 0 and after > WEIGHT_GROWTH_LIMIT * before):
        what = ("is not finite" if not math.isfinite(after) else
                f"grew from {before:.4g} to {after:.4g}, more than {WEIGHT_GROWTH_LIMIT:g}x in "
                f"one optimiser step")
        hint = f"; lower {lr_field}" if lr_field else ""
        raise NonFiniteError(
            f"{_where(name, step)} update diverged: the weights' norm {what}; stopped without "
            f"saving this step (a diverged update cannot be skipped){hint}")
    return norm, True
