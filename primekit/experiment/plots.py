"""The report's figures (matplotlib, Agg): per metric one PNG with a panel per task family, each
arm's mean over seeds as a line and its 95% t-interval as a band."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from primekit.experiment import stats
from primekit.experiment.grid import grid_values
from primekit.experiment.runlog import TRAIN_SECONDS, RunLog, match_keys
from primekit.experiment.spec import Spec

# (file stem, metric key or prefix, y label); what the runs do not log is left out.
CURVES = (
    ("train_reward", "reward/outcome_mean_sampled", "training reward (all samples)"),
    ("eval_greedy", "eval/pass@1_greedy", "held-out greedy accuracy"),
    ("eval_sampled", "eval/avg@", "held-out sampled accuracy (avg@k)"),
    ("prm_pairwise", "prm/acc_pairwise", "PRM pairwise accuracy"),
    ("prm_abs", "prm/acc_abs", "PRM absolute accuracy"),
    ("prm_loss", "prm/loss", "PRM loss (nats)"),
    ("response_len", "response/len_mean", "response length (tokens)"),
    ("trace_error", "verify/trace_error", "trace error (right answers, a wrong step)"),
    ("eval_trace_error", "eval/trace_error_greedy", "held-out greedy trace error"),
    ("hack_repeated_steps", "hack/repeated_step_share", "repeated-step share"),
    ("hack_steps", "hack/steps_per_response", "steps per response"),
    ("hack_step_len", "hack/step_len_chars", "step length (characters)"),
    ("hack_nonpositive_steps", "hack/nonpositive_step_share", "share of steps with reward <= 0"),
    ("hack_dense_corr", "hack/dense_success_corr", "corr(dense return, success)"),
    ("hack_dense_return", "hack/dense_return_mean", "dense return per response"),
)


def _key(logs: list[RunLog], prefix: str) -> str | None:
    keys = match_keys(logs, prefix)
    return keys[0] if keys else None


def band(series: list[tuple[np.ndarray, np.ndarray]], metric: str = "") -> tuple[np.ndarray, ...]:
    """Over runs: the steps all runs share, the mean and the 95% t-interval at each of them (cut
    to [0, 1] for a share, `stats.mean_interval`).
    Shapes: each run's (steps [T_i], values [T_i]) -> steps [T], mean [T], lo [T], hi [T]."""
    common = sorted(set.intersection(*(set(s.tolist()) for s, _ in series)))
    rows = np.array([[dict(zip(s.tolist(), v.tolist()))[c] for c in common]
                     for s, v in series])  # [runs, T]
    ivs = [stats.mean_interval(rows[:, j], metric) for j in range(len(common))]
    return (np.array(common), np.array([i.value for i in ivs]), np.array([i.lo for i in ivs]),
            np.array([i.hi for i in ivs]))


def plot_all(spec: Spec, logs: dict[tuple[str, str], list[RunLog]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    everything = [g for gs in logs.values() for g in gs]
    window = spec.window
    written = []
    jobs = [(stem, key, label, False) for stem, key, label in CURVES]
    jobs.insert(1, ("train_reward_wall", "reward/outcome_mean_sampled",
                    "training reward (all samples)", True))
    for stem, prefix, label, by_time in jobs:
        key = _key(everything, prefix)
        if key is None:
            continue
        tasks = list(spec.tasks)
        fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
        drew = False
        for ax, task in zip(axes[0], tasks):
            xlabel = "train seconds (sum of timing/step)" if by_time else "step"
            for i, arm in enumerate(spec.arms):
                gs = [g for g in logs.get((task, arm), []) if key in g.series]
                if not gs:
                    continue
                per_step = not key.startswith("eval/")
                series = [(g.series[key][0], stats.smooth(g.series[key][1], window)
                           if per_step else g.series[key][1]) for g in gs]
                x, mean, lo, hi = band(series, key)
                if by_time:
                    if not all(TRAIN_SECONDS in g.series for g in gs):
                        continue
                    t = band([g.series[TRAIN_SECONDS] for g in gs])
                    at = dict(zip(t[0].tolist(), t[1].tolist()))
                    keep = [j for j, s in enumerate(x) if s in at]
                    x, mean, lo, hi = (np.array([at[x[j]] for j in keep]), mean[keep], lo[keep],
                                       hi[keep])
                color = f"C{i}"
                n = len(gs)
                if len(x) == 1:  # only the final evaluation: a point with its interval
                    lo, hi = np.where(np.isfinite(lo), lo, mean), np.where(np.isfinite(hi), hi, mean)
                    ax.errorbar([i], mean, yerr=[mean - lo, hi - mean], fmt="o", color=color,
                                capsize=4, label=f"{arm} (n={n})")
                    ax.set_xticks(range(len(spec.arms)), list(spec.arms))
                    xlabel = "arm (final evaluation)"
                else:
                    ax.plot(x, mean, color=color, label=f"{arm} (n={n})")
                    if n > 1:
                        ax.fill_between(x, lo, hi, color=color, alpha=0.2)
                drew = True
            ax.set_title(task)
            ax.set_ylabel(label)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
            if ax.has_data():
                ax.legend(fontsize=8)
        if drew:
            fig.suptitle(f"{spec.name}: {key}" + (" vs wall-clock" if by_time else ""))
            fig.tight_layout()
            path = out / f"{stem}.png"
            fig.savefig(path, dpi=90)
            written.append(path)
        plt.close(fig)
    if spec.grid is not None:
        written += plot_grid(spec, logs, out)
    return written


def plot_grid(spec: Spec, logs: dict[tuple[str, str], list[RunLog]], out: Path) -> list[Path]:
    """One heatmap PNG per map metric (`map_<metric>.png`), a panel per task family: each cell's
    mean (or difference from the map's baseline, on a colour scale centred at 0), its value
    written in the cell, with * where the difference's 95% interval excludes 0."""
    import matplotlib.pyplot as plt

    grid = spec.grid
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in grid.metrics:
        tasks = list(spec.tasks)
        fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 3.8), squeeze=False)
        drew, any_relative = False, False
        for ax, task in zip(axes[0], tasks):
            xs, ys, cells, relative = grid_values(spec, logs, task, metric)
            any_relative = any_relative or relative
            if not cells:  # a family not trained yet: say so rather than draw an empty scale
                ax.text(0.5, 0.5, f"{task}: no finished runs", ha="center", va="center",
                        transform=ax.transAxes)
                ax.set_axis_off()
                continue
            z = np.full((len(ys), len(xs)), np.nan)
            for (i, j), c in cells.items():
                z[i, j] = c.value
            if relative:
                m = float(np.nanmax(np.abs(z))) or 1.0
                im = ax.imshow(z, cmap="RdBu", vmin=-m, vmax=m, origin="lower")
            else:
                im = ax.imshow(z, cmap="viridis", origin="lower")
            for (i, j), c in cells.items():
                text = (f"{c.value:+.3f}" + ("*" if c.excludes(0.0) else "")) if relative else (
                    f"{c.value:.3f}")
                ax.text(j, i, text, ha="center", va="center", fontsize=8,
                        color=_text_colour(im.cmap(im.norm(c.value))))
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
            ax.set_yticks(range(len(ys)), [str(y) for y in ys])
            ax.set_xlabel(grid.x)
            ax.set_ylabel(grid.y)
            ax.set_title(task + (f" (minus {grid.baseline})" if relative else ""))
            fig.colorbar(im, ax=ax, shrink=0.8)
            drew = drew or bool(cells)
        if drew:
            fig.suptitle(f"{spec.name}: {metric}" + (" (* 95% interval excludes 0)"
                                                      if any_relative else ""))
            fig.tight_layout()
            path = out / f"map_{metric.replace('/', '_').replace('@', 'at')}.png"
            fig.savefig(path, dpi=90)
            written.append(path)
        plt.close(fig)
    return written


def _text_colour(rgba) -> str:
    """Black on light cells, white on dark ones (relative luminance, ITU-R BT.709 weights), so a
    map's strongest cells stay readable."""
    r, g, b = rgba[:3]
    return "white" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45 else "black"
