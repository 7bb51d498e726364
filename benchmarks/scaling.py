"""One PRIME step on 1 process vs 2 FSDP2-sharded ranks (gloo, CPU), side by side in one run.

Prints, for each world size: response tokens per second of a step (all ranks together), the step
time, the weight-sync time, and the bytes of each model's parameters and optimiser state held by
one rank (measured from the local shards). On CPUs the point is that sharding works and memory per
rank halves, not speed: 2 ranks share the same 2 cores.

Usage:
    python benchmarks/scaling.py --policy runs/demo/sft [--steps 3] [overrides ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from common import add_policy_argument, missing_policy
from rich.console import Console
from rich.table import Table

from primekit.config import load_config, resolve_config


def _measure(cfg_args: tuple[str, str, list[str]], steps: int) -> dict:
    from primekit import distributed as dist
    from primekit.factory import build_rl_trainer
    from primekit.models.parallel import local_nbytes, optimizer_nbytes

    config, policy, overrides = cfg_args
    cfg = load_config(resolve_config(config), [f"model.policy={policy}", *overrides])
    trainer = build_rl_trainer(cfg)
    times, syncs, tokens = [], [], []
    for i in range(steps + 1):  # the first step warms up
        m = dist.reduce_metrics(trainer.train_step(), sum_keys=["tokens"])
        trainer.step += 1
        if i:
            times.append(m["timing/step"])
            syncs.append(m["timing/weight_sync"])
            tokens.append(m["response/len_mean"] * cfg.train.prompts_per_step * cfg.rollout.n_samples)
    out = {"step_s": statistics.mean(times), "sync_s": statistics.mean(syncs),
           "tokens_per_s": statistics.mean(tokens) / statistics.mean(times)}
    for name, (model, opt) in trainer.trainable().items():
        out[f"{name} params"] = local_nbytes(model.parameters())
        out[f"{name} AdamW state"] = optimizer_nbytes(opt)
    if trainer.ref is not None:
        out["ref params"] = local_nbytes(trainer.ref.parameters())
    return out


def _rank(rank: int, world: int, init_file: str, cfg_args, steps: int, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world)
    try:
        torch.set_num_threads(1)
        result = _measure(cfg_args, steps)
        if rank == 0:
            torch.save(result, out)
    finally:
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny")
    add_policy_argument(parser)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if missing_policy(args.policy):
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="primekit-scaling-"))
    base = [f"train.run_dir={tmp / 'run'}", "train.report_to=[]", "filter.enabled=false"]
    print("1 process (2 threads) ...", flush=True)
    results = {1: _measure((args.config, args.policy,
                            base + ["train.threads=2", *args.overrides]), args.steps)}
    print("2 ranks (1 thread each) ...", flush=True)
    two = (args.config, args.policy, base + ["train.threads=1", *args.overrides])
    torch.multiprocessing.spawn(_rank, args=(2, str(tmp / "store"), two, args.steps,
                                             str(tmp / "two.pt")), nprocs=2)
    results[2] = torch.load(tmp / "two.pt", weights_only=False)

    table = Table(title=f"one PRIME step, mean of {args.steps} after a warm-up ({args.config})")
    table.add_column("")
    table.add_column("1 process", justify="right")
    table.add_column("2 ranks (FSDP2)", justify="right")
    table.add_column("2 / 1", justify="right")
    for key in results[1]:
        a, b = results[1][key], results[2][key]
        fmt = (lambda v: f"{v / 2**20:.2f} MiB") if isinstance(a, int) else (lambda v: f"{v:.3f}")
        table.add_row(key, fmt(a), fmt(b), f"{b / a:.3f}" if a > 1e-3 else "-")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
