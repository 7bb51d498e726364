"""PRIME vs outcome-only RLOO step time, side by side in one process.

Both trainers start from the same SFT checkpoint and config (the demo's `configs/tiny.yaml` unless
--config says otherwise); they differ only in `algorithm.reward_mode`. Steps alternate between the two
(PRIME, RLOO, PRIME, ...) so that machine noise hits both alike; the first `--warmup` steps of each
are not counted. Printed: the mean seconds per phase for each, the ratio of their mean step times, the
per-step ratios (n, median, min, max) and the share of the policy update's tokens computed that are
padding. Compare layouts with overrides: `policy.max_tokens_per_micro_batch=0
prm.max_tokens_per_micro_batch=0` (padded rows) against the config's token budgets.

`--against OVERRIDE ...` compares something else the same way: the config as given (PRIME
unless an override says otherwise) against the config with those overrides too, e.g.
`--against rollout.hf_decode=model` (the HF engine's written-out decode step against the model's
own forward, docs/performance.md).

Usage:
    python benchmarks/step_time.py --policy runs/demo/sft [--steps 10] [overrides ...]
        [--against OVERRIDE ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import add_policy_argument, missing_policy
from rich.console import Console
from rich.table import Table

from primekit.config import load_config, resolve_config
from primekit.factory import build_rl_trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny")
    add_policy_argument(parser)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per trainer")
    parser.add_argument("--run-dir", default="runs/bench-step-time")
    parser.add_argument("--against", nargs="+", metavar="OVERRIDE",
                        help="compare the config with these overrides too, not PRIME with RLOO")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if missing_policy(args.policy):
        return 2

    # The two sides: {column name: overrides of its own}.
    if args.against:
        sides = {"as given": [], "with " + " ".join(args.against): list(args.against)}
    else:
        sides = {"PRIME": ["algorithm.reward_mode=prime"],
                 "RLOO (outcome only)": ["algorithm.reward_mode=outcome"]}
    trainers = {}
    for i, (name, own) in enumerate(sides.items()):
        cfg = load_config(resolve_config(args.config), [
            f"model.policy={args.policy}", f"train.run_dir={args.run_dir}/{i}",
            "train.report_to=[]", *args.overrides, *own])
        trainers[name] = build_rl_trainer(cfg)
    first, second = sides

    timings: dict[str, list[dict[str, float]]] = {mode: [] for mode in trainers}
    for step in range(args.warmup + args.steps):
        for mode, trainer in trainers.items():
            metrics = trainer.train_step()
            if step >= args.warmup:
                timings[mode].append({k.removeprefix("timing/"): v for k, v in metrics.items()
                                      if k.startswith("timing/")})
                timings[mode][-1]["rows"] = metrics.get("filter/groups_kept", 0.0)
                timings[mode][-1]["rounds"] = metrics.get("filter/rounds", 0.0)
                timings[mode][-1]["tok_s"] = metrics.get("throughput/rollout_tokens_per_s", 0.0)
                if "throughput/update_padding" in metrics:  # the policy update's columns
                    timings[mode][-1]["padding"] = metrics["throughput/update_padding"]
        print(f"step {step + 1}/{args.warmup + args.steps}", file=sys.stderr)

    not_phases = {"step", "rows", "rounds", "tok_s", "padding"}
    phases = sorted({k for runs in timings.values() for t in runs for k in t} - not_phases)
    table = Table(title=f"seconds per step (mean of {args.steps}, after {args.warmup} warm-up)")
    table.add_column("phase")
    for mode in trainers:
        table.add_column(mode, justify="right")

    def mean(mode: str, key: str) -> float:
        return statistics.fmean(t.get(key, 0.0) for t in timings[mode])

    for phase in phases:
        table.add_row(phase, *(f"{mean(mode, phase):.3f}" for mode in trainers))
    table.add_row("[bold]step", *(f"[bold]{mean(mode, 'step'):.3f}" for mode in trainers))
    table.add_row("[bold]step median (min-max)", *(
        f"{statistics.median(t['step'] for t in timings[mode]):.3f} "
        f"({min(t['step'] for t in timings[mode]):.3f}-{max(t['step'] for t in timings[mode]):.3f})"
        for mode in trainers))
    table.add_row("padding share of tokens computed", *(
        f"{100 * mean(mode, 'padding'):.1f}%" for mode in trainers))
    table.add_row("groups per step", *(f"{mean(mode, 'rows'):.1f}" for mode in trainers))
    table.add_row("rollout rounds", *(f"{mean(mode, 'rounds'):.2f}" for mode in trainers))
    table.add_row("rollout tokens/s", *(f"{mean(mode, 'tok_s'):.0f}" for mode in trainers))
    console = Console()
    console.print(table)
    ratio = mean(first, "step") / mean(second, "step")
    label = "PRIME / RLOO" if not args.against else f"{first} / {second}"
    paper = "  (paper, Table 2: 680.3 / 530.7 = 1.28x)" if not args.against else ""
    console.print(f"{label} step time: {ratio:.3f}x{paper}")
    ratios = [a["step"] / b["step"] for a, b in zip(timings[first], timings[second])]
    console.print(f"per-step {label} ratio: n={len(ratios)}, median "
                  f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    trainer = trainers[first]
    cfg = trainer.cfg
    prm = tuple(trainer.rewarder.layout) if hasattr(trainer.rewarder, "layout") else "-"
    console.print(f"config: {args.config}, algorithm.reward_mode={cfg.algorithm.reward_mode}, "
                  f"prm.reference={cfg.prm.reference}, policy.old_logprobs={cfg.policy.old_logprobs}, "
                  f"train.threads={cfg.train.threads}, micro-batches: policy {tuple(trainer.layout)}"
                  f", PRM {prm} (rows, multiple, max_tokens, packed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
