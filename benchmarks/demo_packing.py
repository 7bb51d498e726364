"""The demo, packed against padded: `primekit demo` as shipped and with padded rows everywhere,
seed by seed, and whether its wall time falls by at least the padding share packing removed.

For each seed S, one run at a time, the two sides in an order that alternates between seeds
(even seeds packed first, odd seeds padded first, so that a drifting machine favours neither):

  packed  primekit demo --run-dir OUT/seedS-packed sft.seed=S train.seed=S
  padded  the same with policy.max_tokens_per_micro_batch=0 prm.max_tokens_per_micro_batch=0
          sft.max_tokens_per_micro_batch=0 (row-count micro-batches padded to their longest row)

A demo whose summary.json exists is not run again, so a killed benchmark continues where it
stopped and `--report` alone reprints the tables. The sides differ in the layout only, yet they
are different draws: SFT rounds differently, so the SFT models, their responses and the rollouts
differ, and a phase's time is not the same work on both sides.

Per seed it prints each side's wall time, its SFT phases (policy and PRM) and their padding, the RL
phase's model passes (old log-probs, reference, PRM update, policy update: the `timing/*` metrics
summed over steps) and the policy update's mean padding, and the rollout with its sampled tokens.
The padding packing removed is priced at the padded run's phase times: a phase whose columns were
a share p_padded padding, and p_packed once packed, lost 1 - (1 - p_padded) / (1 - p_packed) of
its columns; that share of its padded time, summed over the SFTs and the RL passes and divided by
the padded demo's wall time, is the time the padding cost. The criterion (issue 20): the demo's
wall time falls by at least that share. Over seeds: mean and 95% t-interval of the time saved, of
the padding's priced share, and of their per-seed difference; the same for the time the SFTs and
the RL passes alone saved (as a share of the padded demo's wall time): the phases packing changes,
without the rollout's and the evaluation's times, which differ between the sides only by the draws
and the machine's drift and so widen the interval without bearing on the padding; and, phase by phase, how far the
SFTs' and the RL passes' time fell against the columns packing removed from them, and how the
rollout's time per sampled token moved (no padding there: the machine's drift between the sides
and the draws' differences).

Usage:
    python benchmarks/demo_packing.py --seeds 0 1 2 3 4 [--out runs/bench-demo-packing]
    python benchmarks/demo_packing.py --seeds 0 1 2 3 4 --report   # tables only, nothing run
    python benchmarks/demo_packing.py --seeds 0 1 --out /tmp/d train.steps=10   # a smaller demo
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from primekit.experiment.stats import t_interval

PADDED = ["policy.max_tokens_per_micro_batch=0", "prm.max_tokens_per_micro_batch=0",
          "sft.max_tokens_per_micro_batch=0"]
SIDES = ("packed", "padded")
RL_PASSES = ("timing/old_logprobs", "timing/ref_logprobs", "timing/prm_update",
             "timing/policy_update")


def run_side(out: Path, seed: int, side: str, overrides: list[str]) -> None:
    """`primekit demo` for one seed and side, in a child process (its own peak RSS), unless its
    summary.json is already there; `overrides` go to both sides."""
    run_dir = out / f"seed{seed}-{side}"
    if (run_dir / "summary.json").is_file():
        print(f"seed {seed} {side}: done already ({run_dir})", flush=True)
        return
    argv = ["demo", "--run-dir", str(run_dir), f"sft.seed={seed}", f"train.seed={seed}",
            *overrides, *(PADDED if side == "padded" else [])]
    print(f"seed {seed} {side}: primekit {' '.join(argv)}", flush=True)
    code = "import sys; from primekit.cli import main; sys.exit(main(sys.argv[1:]))"
    with (out / f"seed{seed}-{side}.log").open("w") as log:
        rc = subprocess.call([sys.executable, "-c", code, *argv], stdout=log,
                             stderr=subprocess.STDOUT)
    if rc != 0:
        raise SystemExit(f"seed {seed} {side}: the demo exited {rc}; see "
                         f"{out / f'seed{seed}-{side}.log'}")


def phases(run_dir: Path) -> dict:
    """One demo's times and padding, from its summary.json and its RL run's metrics.jsonl."""
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "prime" / "metrics.jsonl").open()
             if line.strip()]
    steps = [m for m in steps if "timing/step" in m]  # the final evaluation has none
    sft_s = [summary["sft_wall_s"], summary.get("prm_sft_wall_s", 0.0)]
    sft_pad = [summary["sft_padding"], summary.get("prm_sft_padding", summary["sft_padding"])]
    return {"wall": summary["wall_s"], "sft_s": sft_s, "sft_pad": sft_pad,
            "rl": summary["rl_wall_s"],
            "passes": sum(m.get(k, 0.0) for m in steps for k in RL_PASSES),
            "update_pad": summary["update_padding"],
            "rollout": sum(m.get("timing/rollout", 0.0) for m in steps),
            "sampled": sum(m.get("filter/sampled_tokens", 0.0) for m in steps),
            "greedy": (summary["sft"]["eval/pass@1_greedy"],
                       summary["prime"]["eval/pass@1_greedy"]),
            "rss": summary["peak_rss_gib"]}


def removed(p_padded: float, p_packed: float) -> float:
    """The share of a phase's padded columns that packing removed: columns = valid / (1 - p),
    so packed / padded = (1 - p_padded) / (1 - p_packed) for the same valid tokens."""
    return 1.0 - (1.0 - p_padded) / (1.0 - p_packed)


def priced(packed: dict, padded: dict) -> float:
    """Seconds of the padded demo that the removed padding cost (module docstring)."""
    sft = sum(t * removed(pp, pk) for t, pp, pk in
              zip(padded["sft_s"], padded["sft_pad"], packed["sft_pad"], strict=True))
    return sft + padded["passes"] * removed(padded["update_pad"], packed["update_pad"])


def touched(packed: dict, padded: dict) -> float:
    """Seconds the SFTs and the RL passes (the phases packing changes) fell, packed against
    padded: the demo's saving without the rollout, evaluation and start-up, whose times only
    differ by the draws and the machine's drift."""
    return (sum(padded["sft_s"]) + padded["passes"]) - (sum(packed["sft_s"]) + packed["passes"])


def report(out: Path, seeds: list[int]) -> None:
    rows, saved, share, passes_saved = [], [], [], []
    phase: dict[str, list[float]] = {k: [] for k in (
        "SFT time fell", "SFT columns removed", "RL passes' time fell",
        "RL passes' columns removed", "rollout time per sampled token changed")}
    for seed in seeds:
        dirs = {side: out / f"seed{seed}-{side}" for side in SIDES}
        if not all((d / "summary.json").is_file() for d in dirs.values()):
            print(f"seed {seed}: not both sides finished; left out")
            continue
        pk, pd = (phases(dirs[side]) for side in SIDES)
        saved.append(1 - pk["wall"] / pd["wall"])
        share.append(priced(pk, pd) / pd["wall"])
        passes_saved.append(touched(pk, pd) / pd["wall"])
        phase["SFT time fell"].append(1 - sum(pk["sft_s"]) / sum(pd["sft_s"]))
        phase["SFT columns removed"].append(removed(pd["sft_pad"][0], pk["sft_pad"][0]))
        phase["RL passes' time fell"].append(1 - pk["passes"] / pd["passes"])
        phase["RL passes' columns removed"].append(removed(pd["update_pad"], pk["update_pad"]))
        phase["rollout time per sampled token changed"].append(
            (pk["rollout"] / pk["sampled"]) / (pd["rollout"] / pd["sampled"]) - 1)
        for side, p in (("padded", pd), ("packed", pk)):
            rows.append(
                f"| {seed} {side} | {p['wall']:.1f} | {sum(p['sft_s']):.1f} | "
                f"{100 * p['sft_pad'][0]:.1f}% / {100 * p['sft_pad'][1]:.1f}% | {p['rl']:.1f} | "
                f"{p['passes']:.1f} | {100 * p['update_pad']:.1f}% | {p['rollout']:.1f} | "
                f"{p['sampled'] / 1e6:.2f} | {p['greedy'][0]:.3f} -> {p['greedy'][1]:.3f} | "
                f"{p['rss']:.2f} |")
        rows.append(f"| {seed}: saved | **{100 * saved[-1]:.1f}%** | padding priced at "
                    f"**{100 * share[-1]:.1f}%** of the padded demo | | | | | | | | |")
    print("| seed, side | wall s | SFTs s | SFT padding (policy / PRM) | RL s | RL passes s | "
          "update padding | rollout s | sampled M tokens | greedy SFT -> PRIME | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if len(saved) >= 2:
        for name, values in (("wall time saved", saved), ("padding's priced share", share),
                             ("saved - priced share",
                              [s - p for s, p in zip(saved, share, strict=True)]),
                             ("SFTs and RL passes: time saved", passes_saved),
                             ("SFTs and RL passes: saved - priced share",
                              [s - p for s, p in zip(passes_saved, share, strict=True)]),
                             *phase.items()):
            iv = t_interval(values)
            print(f"{name}: mean {100 * iv.value:+.1f}% (95% t-interval {100 * iv.lo:+.1f} to "
                  f"{100 * iv.hi:+.1f}, n {iv.n})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-demo-packing"))
    parser.add_argument("--report", action="store_true", help="print the tables; run nothing")
    parser.add_argument("overrides", nargs="*",
                        help="config overrides for both sides (the demo's own by default)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for seed in args.seeds:
            for side in (SIDES if seed % 2 == 0 else SIDES[::-1]):
                run_side(args.out, seed, side, args.overrides)
    report(args.out, args.seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
