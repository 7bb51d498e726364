"""Check a `primekit demo` run against the band measured over seeds and CPUs (docs/demo.md).

Usage: python .ci/check_demo.py RUN_DIR [RUN_DIR ...] [--rl RL_DIR SFT_RUN_DIR ...]

A RUN_DIR is a `primekit demo --run-dir` (its summary.json holds both evaluations). `--rl` checks a
`primekit train` run (RL only, its final evaluation the last row of metrics.jsonl that has one)
against the SFT evaluation of the demo in SFT_RUN_DIR it started from.

Each check sits well below the measured band, so float rounding on another CPU does not fail it,
and well above what a real regression gives:
- an SFT phase that does not learn the task stays near 0 accuracy (floors 0.30 greedy, 0.20
  avg@4; the tiny config's SFT settings of 2026-12-05 measured 0.60-0.82 greedy over tuning
  seeds 100-107 and 0.69-0.81 over seeds 0-3, docs/demo.md);
- a sign error in the policy update, or no update, leaves sampled accuracy (avg@4) flat or lower;
- a PRM that is never updated keeps its rewards at 0, so every pair is a tie (pairwise accuracy
  exactly 0.5) and its loss exactly ln 2 = 0.6931; one updated the wrong way orders pairs worse
  than chance; one that diverges (too fast a learning rate) has a loss far above ln 2.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

MIN_AVG_GAIN = 0.05  # avg@4 (sampled accuracy) gain, SFT -> PRIME
# Greedy pass@1 may not fall by more than 3 points. Over seeds 0-3 of the 2026-12-05 settings the
# greedy gain was +0.0 to +6.4 points (mean +4.1, sd 2.9; the avg@4 gain +11.8 to +18.6), so a
# floor of 0 would fail a healthy run on another CPU's rounding about one time in thirteen (a
# normal fit); a policy update with a flipped sign loses far more, and avg@4 catches it first.
MIN_GREEDY_GAIN = -0.03
# Mean PRM loss over the second half of the run. It does not tell a learning PRM from a stuck one:
# a PRM whose rewards carry noise as well as signal can sit above ln 2 = 0.693147 while it orders
# pairs better than chance. Healthy 160-step runs of the demo's config on arithmetic measured
# 0.6880-0.6951 in 16 runs, padded and packed alike (docs/experiments/packed-layout.md; 0.6951 the
# packed demo of one `.ci/run`, greedy +6.4 points, pairwise 0.573); a diverging PRM goes well
# above (danger-zone's cells with PRM lr 1e-3 or beta 0.5: 0.708-0.986 over steps 31-60). The
# bound sits between them. A PRM
# never updated (all rewards 0: every pair a tie, pairwise exactly 0.5) or updated the wrong way
# (pairwise below 0.5) is caught by MIN_PRM_PAIRWISE.
MAX_PRM_LOSS = 0.700
# Mean PRM pairwise accuracy over the second half (no update: exactly 0.5). Seeds 0-3 of the
# demo measured 0.727-0.839 with its PRM from a second SFT model (--prm-init separate, the
# default since 2026-12-05) and 0.645-0.724 from the policy's SFT model (--prm-init policy); the
# floor is low enough for both, and for the 0.573 of a healthy former-settings run.
MIN_PRM_PAIRWISE = 0.52
# The SFT phase learns the task: the floors of tests/data/test_arithmetic_learnable.py, which
# .ci/run leaves to this check (see the docstring for what the demo's seeds measured).
MIN_SFT_GREEDY, MIN_SFT_AVG = 0.30, 0.20


def check(run_dir: Path, sft_run_dir: Path | None = None) -> list[str]:
    """Failures of one demo (sft_run_dir None) or of one RL run from sft_run_dir's SFT model."""
    if sft_run_dir is None:
        summary = json.loads((run_dir / "summary.json").read_text())
        sft, rl, rl_dir = summary["sft"], summary["prime"], run_dir / "prime"
    else:
        summary = json.loads((sft_run_dir / "summary.json").read_text())
        sft, rl_dir = summary["sft"], run_dir
        rows = [json.loads(line) for line in (rl_dir / "metrics.jsonl").open()]
        rl = [m for m in rows if "eval/pass@1_greedy" in m][-1]
        summary = {"wall_s": rl["time"] - rows[0]["time"]}  # RL only: from its first step's row
    steps = [json.loads(line) for line in (rl_dir / "metrics.jsonl").open()]
    steps = [m for m in steps if "prm/loss" in m]
    late = steps[len(steps) // 2 :]
    prm_loss = statistics.fmean(m["prm/loss"] for m in late)
    pairwise = statistics.fmean(m["prm/acc_pairwise"] for m in late if "prm/acc_pairwise" in m)
    avg_gain = rl["eval/avg@4"] - sft["eval/avg@4"]
    greedy_gain = rl["eval/pass@1_greedy"] - sft["eval/pass@1_greedy"]
    print(f"{run_dir}: greedy {sft['eval/pass@1_greedy']:.3f} -> {rl['eval/pass@1_greedy']:.3f} "
          f"({100 * greedy_gain:+.1f}), avg@4 {sft['eval/avg@4']:.3f} -> {rl['eval/avg@4']:.3f} "
          f"({100 * avg_gain:+.1f}), PRM loss {prm_loss:.4f} (ln 2 = {math.log(2):.4f}), "
          f"PRM pairwise {pairwise:.3f} over steps {len(steps) - len(late) + 1}-{len(steps)}, "
          f"wall {summary['wall_s']:.0f} s")
    failures = []
    if sft_run_dir is None and sft["eval/pass@1_greedy"] < MIN_SFT_GREEDY:
        failures.append(f"SFT greedy {sft['eval/pass@1_greedy']:.3f} < {MIN_SFT_GREEDY}")
    if sft_run_dir is None and sft["eval/avg@4"] < MIN_SFT_AVG:
        failures.append(f"SFT avg@4 {sft['eval/avg@4']:.3f} < {MIN_SFT_AVG}")
    if avg_gain < MIN_AVG_GAIN:
        failures.append(f"avg@4 gain {100 * avg_gain:+.1f} < {100 * MIN_AVG_GAIN:+.0f} points")
    if greedy_gain < MIN_GREEDY_GAIN:
        failures.append(f"greedy gain {100 * greedy_gain:+.1f} < {100 * MIN_GREEDY_GAIN:+.0f}")
    if prm_loss > MAX_PRM_LOSS:
        failures.append(f"PRM loss {prm_loss:.4f} > {MAX_PRM_LOSS} (the PRM is diverging)")
    if pairwise < MIN_PRM_PAIRWISE:
        failures.append(f"PRM pairwise accuracy {pairwise:.3f} < {MIN_PRM_PAIRWISE} (the PRM "
                        f"is not learning)")
    if summary["wall_s"] > 600:
        print(f"warning: the demo took {summary['wall_s']:.0f} s, over its 10-minute target")
    return [f"{run_dir}: {f}" for f in failures]


def parse(argv: list[str]) -> list[tuple[Path, Path | None]]:
    """[(run dir, SFT demo dir or None)] from RUN_DIR ... [--rl RL_DIR SFT_RUN_DIR ...]."""
    if "--rl" not in argv:
        return [(Path(a), None) for a in argv]
    i = argv.index("--rl")
    rl = argv[i + 1 :]
    if not rl or len(rl) % 2:
        sys.exit("--rl takes pairs: RL_DIR SFT_RUN_DIR")
    return [(Path(a), None) for a in argv[:i]] + [
        (Path(rl[j]), Path(rl[j + 1])) for j in range(0, len(rl), 2)]


if __name__ == "__main__":
    failures = [f for run, sft in parse(sys.argv[1:]) for f in check(run, sft)]
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)
