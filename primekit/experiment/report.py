"""The experiment's report: reads only the runs' metrics.jsonl (docs/metrics.md) and writes
`report.md` and `plots/*.png` in the experiment directory.

Per task family and arm, over the seeds that finished: the final value of each metric (eval/
keys: the final evaluation; per-step keys: the mean over the last `window` steps of the first verdict) as a
mean with its 95% t-interval; steps-to-threshold of the verdict's metric; then one verdict per
(task family, treatment, baseline) by the spec's rule (primekit.experiment.spec.Verdict), and
one for the claim:
reproduced when every row is reproduced, not reproduced when none is and one is not, mixed when
rows disagree, inconclusive otherwise.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from primekit.experiment import stats
from primekit.experiment.grid import grid_values
from primekit.experiment.runlog import TRAIN_SECONDS, RunLog, match_keys, read_run
from primekit.experiment.spec import MIN_SEEDS, Run, Spec, Verdict

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, MIXED = (
    "reproduced", "not reproduced", "inconclusive at this budget", "mixed")

# Final-metrics table: the keys shown when any run logs them (eval/avg@k matched by prefix).
TABLE_METRICS = ("eval/pass@1_greedy", "eval/avg@", "eval/pass@", "reward/outcome_mean_sampled",
                 "prm/acc_pairwise", "prm/acc_abs", "prm/loss", "response/len_mean",
                 "hack/repeated_step_share", "hack/steps_per_response", "hack/step_len_chars",
                 "hack/nonpositive_step_share", "hack/dense_success_corr")
@dataclass
class Row:
    """One verdict row: a (treatment, baseline) pair on one task family."""

    task: str
    treatment: str
    baseline: str
    estimate: stats.Interval | None
    verdict: str
    reason: str
    detail: str = ""
    rule: str = ""


def decide(v: Verdict, interval: stats.Interval | None, n_min: int,
           censored: tuple[int, int] = (0, 0)) -> tuple[str, str]:
    """The verdict and its reason for one row (see Verdict). `censored`: runs of (treatment,
    baseline) that never reached the threshold (steps-ratio only)."""
    if interval is None:
        return INCONCLUSIVE, "no finished runs to compare"
    if n_min < MIN_SEEDS:
        return INCONCLUSIVE, f"only {n_min} finished seed(s) in an arm (need {MIN_SEEDS})"
    if v.rule == "equivalence":
        ci = f"95% interval [{interval.lo:.3g}, {interval.hi:.3g}]"
        m = v.boundary
        if -m <= interval.lo and interval.hi <= m:
            return REPRODUCED, f"{ci} lies within the margin +-{m:g}"
        if interval.lo > m or interval.hi < -m:
            return NOT_REPRODUCED, f"{ci} lies wholly outside the margin +-{m:g}"
        return INCONCLUSIVE, f"{ci} is not within the margin +-{m:g} nor wholly outside it"
    sign = 1.0 if v.direction == "greater" else -1.0
    lo, hi = sorted((sign * interval.lo, sign * interval.hi))
    b = sign * v.boundary
    ci = f"95% interval [{interval.lo:.3g}, {interval.hi:.3g}]"
    side = ">" if sign > 0 else "<"
    if v.min_effect is not None and hi < sign * v.min_effect:
        verdict, reason = NOT_REPRODUCED, f"{ci} excludes the claimed effect {v.min_effect:g}"
    elif lo > b:
        verdict, reason = REPRODUCED, f"{ci} lies wholly {side} {v.boundary:g}"
    elif hi < b:
        verdict, reason = NOT_REPRODUCED, f"{ci} lies wholly on the other side of {v.boundary:g}"
    else:
        verdict, reason = INCONCLUSIVE, f"{ci} straddles {v.boundary:g}"
    t_cens, b_cens = censored
    # A censored treatment run counts too few steps (the ratio is overstated); a censored
    # baseline run too few for the baseline (the ratio is understated).
    if verdict == REPRODUCED and t_cens:
        return INCONCLUSIVE, (f"{reason}, but {t_cens} treatment run(s) never reached the "
                              f"threshold, so the ratio is only an upper bound")
    if verdict == NOT_REPRODUCED and b_cens and v.rule == "steps-ratio":
        return INCONCLUSIVE, (f"{reason}, but {b_cens} baseline run(s) never reached the "
                              f"threshold, so the ratio is only a lower bound")
    return verdict, reason


def overall(rows: list[Row]) -> str:
    kinds = {r.verdict for r in rows}
    if not rows:
        return INCONCLUSIVE
    if kinds == {REPRODUCED}:
        return REPRODUCED
    if REPRODUCED in kinds and NOT_REPRODUCED in kinds:
        return MIXED
    if NOT_REPRODUCED in kinds and REPRODUCED not in kinds:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def verdict_rows(spec: Spec, logs: dict[tuple[str, str], list[RunLog]]) -> list[Row]:
    return [row for v in spec.verdicts for row in _rows(spec, v, logs)]


def _rows(spec: Spec, v: Verdict, logs: dict[tuple[str, str], list[RunLog]]) -> list[Row]:
    rows = []
    for task in spec.tasks:
        for treatment, baseline in v.compare:
            t_logs = [g for g in logs.get((task, treatment), []) if v.metric in g.series]
            b_logs = [g for g in logs.get((task, baseline), []) if v.metric in g.series]
            n_min = min(len(t_logs), len(b_logs))
            if n_min == 0:
                rows.append(Row(task, treatment, baseline, None, INCONCLUSIVE,
                                f"no finished run logs {v.metric} in both arms",
                                rule=f"{v.rule} of `{v.metric}`"))
                continue
            if v.rule in ("difference", "equivalence"):
                value = (lambda g: g.noise(v.metric)) if v.statistic == "noise" else (
                    lambda g: g.final(v.metric, v.window))
                t_final = [x for g in t_logs if (x := value(g)) is not None]
                b_final = [x for g in b_logs if (x := value(g)) is not None]
                if not t_final or not b_final:
                    rows.append(Row(task, treatment, baseline, None, INCONCLUSIVE,
                                    f"too few steps for the {v.statistic} of {v.metric}",
                                    rule=f"{v.rule} of `{v.metric}`"))
                    continue
                est = stats.welch_interval(t_final, b_final)
                verdict, reason = decide(v, est, min(len(t_final), len(b_final)))
                what = ("std of step-to-step changes of" if v.statistic == "noise"
                        else "final")
                detail = (f"{what} {v.metric}: {treatment} {np.mean(t_final):.3f}, "
                          f"{baseline} {np.mean(b_final):.3f} (difference, Welch 95% interval)")
            else:
                thr = (float(np.mean([g.final(v.metric, v.window) for g in b_logs]))
                       if v.threshold == "baseline-final" else float(v.threshold))
                t_x = [stats.steps_to_threshold(*g.series[v.metric], thr, v.window)
                       for g in t_logs]
                b_x = [stats.steps_to_threshold(*g.series[v.metric], thr, v.window)
                       for g in b_logs]
                est = stats.bootstrap_ratio([c.step for c in b_x], [c.step for c in t_x],
                                            n_boot=v.bootstrap, seed=v.seed)
                cens = (sum(c.censored for c in t_x), sum(c.censored for c in b_x))
                verdict, reason = decide(v, est, n_min, cens)
                if n_min >= MIN_SEEDS and all(c.at_start for c in t_x + b_x):
                    # Every run began at or above the threshold (with "baseline-final": the
                    # baseline ended no higher than it started), so no step count measures speed.
                    verdict, reason = INCONCLUSIVE, (
                        f"every run reached the threshold {thr:.3g} at its first step: the runs "
                        f"started there, so the ratio measures nothing")
                detail = (f"threshold {thr:.3f} ({v.threshold}) on the {v.window}-step trailing "
                          f"mean of {v.metric}; steps: {treatment} "
                          f"{[c.step for c in t_x]} ({cens[0]} censored), {baseline} "
                          f"{[c.step for c in b_x]} ({cens[1]} censored); ratio = mean "
                          f"{baseline} steps / mean {treatment} steps, bootstrap 95% interval "
                          f"({v.bootstrap} resamples, seed {v.seed})")
            rows.append(Row(task, treatment, baseline, est, verdict, reason, detail,
                            f"{v.rule} of `{v.metric}`" + (" (noise)" if v.statistic == "noise"
                                                            else "")))
    return rows


def grid_lines(spec: Spec, logs: dict[tuple[str, str], list[RunLog]]) -> list[str]:
    """The report's map section: one table per (metric, task family), rows y, columns x."""
    grid = spec.grid
    if grid is None:
        return []
    what = (f"its difference from `{grid.baseline}` (Welch 95% interval; **bold**: the "
            f"interval excludes 0), or, for a metric `{grid.baseline}` does not log, the value "
            f"itself (mean [95% t-interval] over seeds)" if grid.baseline is not None
            else "mean [95% t-interval] over seeds")
    lines = [f"## Map: `{grid.y}` x `{grid.x}`", "",
             f"Each cell is the arm with those two values: its final value, {what}. Per-step "
             f"metrics: mean over the last {spec.window} steps.", ""]
    for metric in grid.metrics:
        for task in spec.tasks:
            xs, ys, cells, relative = grid_values(spec, logs, task, metric)
            vs = f" - `{grid.baseline}`" if relative else ""
            lines += [f"### `{metric}`{vs}, {task}", "",
                      f"| {grid.y} \\ {grid.x} | " + " | ".join(map(str, xs)) + " |",
                      "|---|" + "---|" * len(xs)]
            for i, y in enumerate(ys):
                row = []
                for j in range(len(xs)):
                    c = cells.get((i, j))
                    text = "-" if c is None else c.fmt()
                    if c is not None and relative and c.excludes(0.0):
                        text = f"**{text}**"
                    row.append(text)
                lines.append(f"| {y} | " + " | ".join(row) + " |")
            lines.append("")
    return lines


def per_seed_lines(spec: Spec, logs: dict[tuple[str, str], list[RunLog]]) -> list[str]:
    """Each verdict metric's final value in every run, seed by seed: what the intervals summarise
    (one seed far from the others shows here)."""
    lines = []
    for key in dict.fromkeys(v.metric for v in spec.verdicts):
        if not any(key in g.series for gs in logs.values() for g in gs):
            continue
        what = "final evaluation" if key.startswith("eval/") else f"mean of the last {spec.window} steps"
        lines += [f"### Per seed: `{key}` ({what})", "",
                  "| arm | " + " | ".join(spec.tasks) + " |", "|---|" + "---|" * len(spec.tasks)]
        for arm in spec.arms:
            cells = []
            for task in spec.tasks:
                vals = [(g.seed, g.final(key, spec.window)) for g in logs.get((task, arm), [])]
                cells.append(" · ".join(f"s{sd} {x:.3f}" for sd, x in vals if x is not None)
                             or "-")
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def drift_lines(spec: Spec, logs: dict[tuple[str, str], list[RunLog]]) -> list[str]:
    """Each per-step verdict metric at the start and the end of the runs: the mean of the first
    `window` steps, of the last `window` steps, and the change within each run (last - first),
    each as mean [95% t-interval] over seeds. What a final value alone hides: whether an arm
    rose or fell to it (a frozen PRM losing accuracy while the policy moves, PRIME Fig. 5)."""
    w = spec.window
    lines = []
    for key in dict.fromkeys(v.metric for v in spec.verdicts):
        if key.startswith("eval/") or not any(
                key in g.series for gs in logs.values() for g in gs):
            continue
        lines += [f"### Start and end: `{key}` (first {w} steps -> last {w} steps; change "
                  "within each run)", "",
                  "| arm | " + " | ".join(spec.tasks) + " |", "|---|" + "---|" * len(spec.tasks)]
        for arm in spec.arms:
            cells = []
            for task in spec.tasks:
                pairs = [(float(np.mean(v[:w])), float(np.mean(v[-w:])))
                         for g in logs.get((task, arm), []) if key in g.series
                         and len(v := g.series[key][1]) >= 2 * w]
                if not pairs:
                    cells.append("-")
                    continue
                first, last = zip(*pairs)
                change = stats.t_interval([b - a for a, b in pairs])
                cells.append(f"{stats.mean_interval(first, key).fmt()} -> "
                             f"{stats.mean_interval(last, key).fmt()}"
                             f"; change {change.value:+.3f} [{change.lo:+.3f}, {change.hi:+.3f}]"
                             if len(pairs) > 1 else
                             f"{first[0]:.3f} -> {last[0]:.3f} (n=1)")
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


ACC_KEY = "reward/outcome_mean_sampled"


def collapse_lines(spec: Spec, logs: dict[tuple[str, str], list[RunLog]]) -> list[str]:
    """Did training collapse? The dashboard's accuracy light (primekit/viz/lights.py, default
    `viz` thresholds) replayed step by step over each run's accuracy on all samples: per arm and
    task, the runs that turned red at some step (and at which step first), and the colours at
    the end."""
    from primekit.config import VizConfig
    from primekit.viz.lights import accuracy_light

    viz = VizConfig()
    if not any(ACC_KEY in g.series for gs in logs.values() for g in gs):
        return []
    lines = [f"### Collapse: the accuracy light over `{ACC_KEY}`", "",
             f"Red: the last {viz.window} steps' mean at least {viz.acc_bad} below the best "
             f"{viz.window}-step mean so far and at least {2 * viz.acc_z:g} times a window mean's "
             f"noise (amber: {viz.acc_warn} and {viz.acc_z:g} times; docs/viz.md).", "",
             "| arm | " + " | ".join(spec.tasks) + " |", "|---|" + "---|" * len(spec.tasks)]
    for arm in spec.arms:
        cells = []
        for task in spec.tasks:
            runs = [g for g in logs.get((task, arm), []) if ACC_KEY in g.series]
            if not runs:
                cells.append("-")
                continue
            first_red, ends = [], []
            for g in runs:
                steps, values = g.series[ACC_KEY]
                colours = [accuracy_light(values[:n], viz)["color"] for n in range(1, len(values) + 1)]
                red = [int(steps[i]) for i, c in enumerate(colours) if c == "red"]
                if red:
                    first_red.append(red[0])
                ends.append(colours[-1])
            cell = f"red at some step in {len(first_red)} of {len(runs)}"
            if first_red:
                cell += f" (first at step {', '.join(map(str, sorted(first_red)))})"
            cell += "; at the end " + ", ".join(
                f"{ends.count(c)} {c}" for c in ("red", "amber", "green", "grey") if c in ends)
            cells.append(cell)
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def collect(spec: Spec, out_dir: Path) -> tuple[dict[tuple[str, str], list[RunLog]],
                                                list[Run], list[Run]]:
    """(task, arm) -> the finished runs' logs; the finished runs; the unfinished ones."""
    from primekit.experiment.runner import FINISHED, run_state

    logs: dict[tuple[str, str], list[RunLog]] = {}
    done, left = [], []
    for run in spec.runs(out_dir):
        if run_state(run.run_dir, run.config(spec)) != FINISHED:
            left.append(run)
            continue
        log = read_run(run.run_dir)
        if log is None:
            left.append(run)
            continue
        done.append(run)
        log.seed = run.seed
        logs.setdefault((run.task, run.arm), []).append(log)
    return logs, done, left


def _fmt_wall(seconds: float) -> str:
    from primekit.logging import _fmt_duration

    return _fmt_duration(seconds)


def _arm_text(spec: Spec, arm: str) -> str:
    """An arm's overrides as one line; a value per task family as `field={task: value, ...}`."""
    per_field: dict[str, list[str]] = {}
    for task, ovr in spec.arm_tasks.get(arm, {}).items():
        for o in ovr:
            key, value = o.split("=", 1)
            per_field.setdefault(key, []).append(f"{task}: {value}")
    return " ".join([*spec.arms[arm], *(f"{k}={{{', '.join(v)}}}" for k, v in per_field.items())])


def _attempts_line(out_dir: Path) -> str:
    """Bookkeeping of the runner (attempts.jsonl), not a result: every attempt's seconds,
    Python start, model loading and export included."""
    path = out_dir / "attempts.jsonl"
    if not path.is_file():
        return ""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    shared = [r for r in rows if r.get("how") == "shared"]
    recorded = [r for r in rows if r.get("how") == "record"]
    rows = [r for r in rows if r.get("how") not in ("shared", "record")]
    total = sum(float(r.get("seconds", 0)) for r in rows)
    failed = sum(1 for r in rows if r.get("rc") != 0)
    text = (f"; all {len(rows)} attempts in attempts.jsonl (SFT, start-up, export, failed and "
            f"stopped attempts included, {failed} with a non-zero exit): {_fmt_wall(total)}")
    machines = sorted({r["machine"] for r in rows if r.get("machine")})
    if machines:
        text += f"; on {' and '.join(machines)}"
    if shared:
        origins = sorted({Path(r.get("from", "?")).parent.parent.name for r in shared})
        text += (f". {len(shared)} run(s) not trained here but linked to the same run (same "
                 f"config and seed) finished by another experiment: {', '.join(origins)}")
    if recorded:
        where = sorted({r["machine"] for r in recorded if r.get("machine")})
        text += (f". {len(recorded)} run(s) restored from run records (same config, seed and "
                 f"input files; trained earlier, not counted in the attempts above)"
                 + (f", trained on {' and '.join(where)}" if where else ""))
    return text


def write_report(spec: Spec, out_dir: Path, *, plots: bool = True) -> Path:
    """report.md (and plots/*.png) for whatever runs of `spec` have finished in `out_dir`."""
    logs, done, left = collect(spec, out_dir)
    rows = verdict_rows(spec, logs)
    claim_verdict = overall(rows)
    all_logs = [g for gs in logs.values() for g in gs]
    figures = []
    if plots and all_logs:
        from primekit.experiment.plots import plot_all

        figures = plot_all(spec, logs, out_dir / "plots")
    wall = sum(g.wall_s for g in all_logs)
    lines = [
        f"# {spec.name}: {spec.claim}", "",
        (f"**Verdict: {claim_verdict}.**" if not left else
         f"**Verdict from {len(done)} of {len(done) + len(left)} runs (the rest not finished): "
         f"{claim_verdict}.**"), "",
        f"- Paper: {spec.paper or '(not given)'}",
        *[f"- Rule: {v.rule} of `{v.metric}`"
          + (" (noise: std of step-to-step changes)" if v.statistic == "noise" else "")
          + f", {' vs '.join(map(str, v.compare[0]))}"
          f"{' (and more pairs)' if len(v.compare) > 1 else ''}, "
          + (f"margin +-{v.boundary:g}" if v.rule == "equivalence"
             else f"direction {v.direction}, boundary {v.boundary:g}")
          + (f", claimed effect {v.min_effect:g}" if v.min_effect is not None else "")
          for v in spec.verdicts],
        f"- Fewer than {MIN_SEEDS} finished seeds in an arm: inconclusive.",
        f"- Spec: `{spec.path}`; base config `{spec.base}`; common overrides: "
        f"`{' '.join(spec.overrides) or '(none)'}`",
        f"- Budget: {spec.budget or '(not stated)'}",
        f"- Seeds: {spec.seeds}; task families: "
        + "; ".join(f"{t} (`{' '.join(o) or 'base'}`)" for t, o in spec.tasks.items()),
        "- Arms: " + "; ".join(f"{a} (`{_arm_text(spec, a) or 'base'}`)" for a in spec.arms),
        f"- Runs finished: {len(done)} of {len(done) + len(left)}"
        + (f" (not finished: {', '.join(r.run_id for r in left[:6])}"
           f"{' ...' if len(left) > 6 else ''})" if left else ""),
        f"- Wall-clock of the finished runs (from their metrics.jsonl, summed): {_fmt_wall(wall)}"
        + _attempts_line(out_dir),
        f"- Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from {out_dir}", "",
        "## Verdicts", "",
        "| task family | treatment vs baseline | rule | estimate [95% interval] | verdict | reason |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        est = r.estimate.fmt() if r.estimate is not None else "-"
        lines.append(f"| {r.task} | {r.treatment} vs {r.baseline} | {r.rule} | {est} | "
                     f"{r.verdict} | {r.reason} |")
    lines.append("")
    lines += [f"- {r.task}, {r.treatment} vs {r.baseline}: {r.detail}" for r in rows if r.detail]
    lines += ["", "## Final metrics (mean [95% t-interval] over seeds, n seeds)", "",
              f"Per-step metrics: mean over the last {spec.window} steps of each run; eval/ "
              "metrics: the final evaluation; train seconds: the sum of timing/step. Intervals "
              "of shares (accuracies, rates) are cut to [0, 1].", ""]
    keys = ([v.metric for v in spec.verdicts]  # the verdicts' metrics first, then the usual ones
            + [k for prefix in TABLE_METRICS for k in match_keys(all_logs, prefix)]
            + [TRAIN_SECONDS])
    keys = [k for k in dict.fromkeys(keys) if any(k in g.series for g in all_logs)]
    for task in spec.tasks:
        lines += [f"### {task}", "", "| arm | n | " + " | ".join(f"`{k}`" for k in keys) + " |",
                  "|---|---|" + "---|" * len(keys)]
        for arm in spec.arms:
            gs = logs.get((task, arm), [])
            cells = []
            for k in keys:
                vals = [x for g in gs if (x := g.final(k, spec.window)) is not None
                        and math.isfinite(x)]
                cells.append(stats.mean_interval(vals, k).fmt() if vals else "-")
            lines.append(f"| {arm} | {len(gs)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += per_seed_lines(spec, logs)
    lines += drift_lines(spec, logs)
    lines += collapse_lines(spec, logs)
    lines += grid_lines(spec, logs)
    if figures:
        lines += ["## Plots", "",
                  "Each arm's mean over seeds with its 95% t-interval band (per-step metrics "
                  f"smoothed by a trailing {spec.window}-step mean first).", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in figures]
        lines.append("")
    out = out_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out
