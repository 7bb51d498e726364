"""The guarded optimiser step, as primekit takes it against the way it was taken before, side by side
in one process.

Every trained model steps through `primekit.models.optim.guarded_step`: clip the gradient, read
the weights' norm, step AdamW, read the norm again. Two sides, each on its own copy of the model
with the same gradients (random, fixed), alternating step by step:

  shipped   `optim.adamw` (torch's fused AdamW where the parameters allow it) and `weight_norm`
            (one foreach norm per device and dtype, one read back to the host)
  before    torch's default AdamW (a loop over the parameters on a CPU; foreach kernels on a GPU)
            and the norm read tensor by tensor in float64 (a host read, and on a GPU a
            synchronisation, per parameter tensor), as primekit did until 2026-12-06

Printed: median, min, max and n of the whole guarded step per side, of the two weight-norm reads
alone and of the AdamW step alone; the ratio of the medians; and the largest difference between
the two sides' weights after the steps (the same update rule: float rounding only).

Usage:
    python benchmarks/optimizer_step.py --policy runs/demo/sft [--steps 50] [--threads 2]
    python benchmarks/optimizer_step.py --random-0.5b --device auto [--steps 10]
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time

import torch
from common import add_policy_argument, half_billion_config, missing_policy, synchronize

from primekit.models import optim


def weight_norm_before(params) -> float:
    """The weight-norm read as it was: each tensor's norm in float64, read back one by one."""
    local = torch.zeros((), dtype=torch.float64)
    for p in params:
        local = local + torch.linalg.vector_norm(p.detach(), dtype=torch.float64).cpu() ** 2
    return math.sqrt(float(local))


def guarded(model, optimizer, norm, sync, grad_clip: float = 1.0) -> tuple[float, float, float]:
    """One guarded step (clip, norm, AdamW, norm): seconds of (all, the two norms, AdamW)."""
    params = [p for p in model.parameters() if p.requires_grad]
    sync()
    start = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    t0 = time.perf_counter()
    before = norm(params)
    t1 = time.perf_counter()
    optimizer.step()
    sync()
    t2 = time.perf_counter()
    after = norm(params)
    end = time.perf_counter()
    assert math.isfinite(before) and math.isfinite(after)
    return end - start, (t1 - t0) + (end - t2), t2 - t1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_policy_argument(parser, use="load (its shape and weights)")
    parser.add_argument("--random-0.5b", dest="random_half", action="store_true",
                        help="a random-weight model of Qwen2-0.5B's shape instead (no download)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    if args.random_half:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(half_billion_config()).to(device)
        what = "a random-weight model of Qwen2-0.5B's shape"
    else:
        if missing_policy(args.policy):
            return 2
        from primekit.models.hf import load_model

        model = load_model(args.policy, dtype=torch.float32, device=str(device))
        what = args.policy
    gen = torch.Generator(device="cpu").manual_seed(0)
    for p in model.parameters():
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-3).to(device)
    other = copy.deepcopy(model)
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        q.grad = p.grad.clone()
    shipped_opt = optim.adamw(model.parameters(), lr=1e-4)
    sides = {"shipped": (model, shipped_opt, optim.weight_norm),
             "before": (other, torch.optim.AdamW(other.parameters(), lr=1e-4),
                        weight_norm_before)}
    sync = synchronize(device)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    for step in range(args.warmup + args.steps):
        order = list(sides) if step % 2 == 0 else list(sides)[::-1]
        for name in order:
            t = guarded(*sides[name], sync)
            if step >= args.warmup:
                times[name].append(t)
    n_params = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    fused = bool(shipped_opt.defaults.get("fused"))
    print(f"guarded optimiser step of {what} ({n_params / 1e6:.2f}M parameters in {n_tensors} "
          f"tensors, float32, {device}, {args.threads} thread(s)); shipped AdamW fused: {fused}")
    print(f"{'side':8} {'n':>3} {'step median ms':>15} {'min':>8} {'max':>8} "
          f"{'norms ms':>9} {'AdamW ms':>9}")
    med = {}
    for name, ts in times.items():
        whole = [1e3 * t[0] for t in ts]
        med[name] = statistics.median(whole)
        print(f"{name:8} {len(ts):3d} {med[name]:15.3f} {min(whole):8.3f} {max(whole):8.3f} "
              f"{statistics.median(1e3 * t[1] for t in ts):9.3f} "
              f"{statistics.median(1e3 * t[2] for t in ts):9.3f}")
    print(f"shipped / before: {med['shipped'] / med['before']:.3f}x (medians)")
    diff = max(float((p.detach() - q.detach()).abs().max()) for p, q in
               zip(model.parameters(), other.parameters(), strict=True))
    print(f"largest weight difference between the sides after {args.warmup + args.steps} steps: "
          f"{diff:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
