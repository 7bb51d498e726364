"""The danger-zone map: beta x PRM update rate on the toy model (`primekit sim --map`).

Every cell runs `map_seeds` toy PRIME runs of `map_steps` steps with the shortcut injected at step
0 (SimConfig's other settings unchanged) and records, averaged over seeds, the final true accuracy
and the final hacking gap (each the mean of the last `VizConfig.window` steps). A cell is in the
danger zone when its gap is at or above `VizConfig.gap_bad` (the gap light's red). What the map
shows, and how far a toy can be trusted: docs/viz.md.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from primekit.config import SimConfig, VizConfig
from primekit.logging import Progress
from primekit.viz.sim import run


def sweep(cfg: SimConfig, viz: VizConfig, progress: bool = True) -> dict:
    """Final accuracy and gap per (beta, prm_lr) cell; lists [len(betas)][len(prm_lrs)]."""
    betas, rates = list(cfg.map_betas), list(cfg.map_prm_lrs)
    acc = np.zeros((len(betas), len(rates)))
    gap = np.zeros_like(acc)
    total = len(betas) * len(rates) * cfg.map_seeds
    with Progress(total=total, description="danger-zone map", enabled=None if progress else False) as bar:
        for i, beta in enumerate(betas):
            for j, rate in enumerate(rates):
                for seed in range(cfg.map_seeds):
                    sim = run(replace(cfg, beta=beta, prm_lr=rate, prm_mode="online",
                                      seed=cfg.seed + seed), cfg.map_steps)
                    tail = sim.history[-viz.window:]
                    acc[i, j] += np.mean([h["accuracy"] for h in tail]) / cfg.map_seeds
                    gap[i, j] += np.mean([h["gap"] for h in tail]) / cfg.map_seeds
                    bar.update(advance=1)
    return {"betas": betas, "prm_lrs": rates, "accuracy": acc.round(4).tolist(),
            "gap": gap.round(4).tolist(), "danger": (gap >= viz.gap_bad).tolist(),
            "gap_bad": viz.gap_bad, "seeds": cfg.map_seeds, "steps": cfg.map_steps}


def plot(result: dict, out: Path) -> Path:
    """Two heatmaps (final accuracy, hacking gap), danger-zone cells outlined; saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    betas, rates = result["betas"], result["prm_lrs"]
    danger = np.array(result["danger"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), constrained_layout=True)
    panels = [("accuracy", "final true accuracy", "viridis", 0, 1),
              ("gap", "hacking gap (reported - true)", "RdBu_r", -1, 1)]
    for ax, (key, title, cmap, lo, hi) in zip(axes, panels):
        data = np.array(result[key])
        im = ax.imshow(data, origin="lower", cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if key == "accuracy" and data[i, j] < 0.5 else "black")
                if danger[i, j]:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False,
                                               edgecolor="black", linewidth=1.8))
        if danger.any() and not danger.all():  # the boundary between the zones
            ax.contour(danger.astype(float), levels=[0.5], colors="red", linewidths=2.5)
        ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates], rotation=45)
        ax.set_yticks(range(len(betas)), [f"{b:g}" for b in betas])
        ax.set_xlabel("PRM update rate (0 = frozen)")
        ax.set_ylabel("reward weight beta")
        ax.set_title(title)
        fig.colorbar(im, ax=ax)
    fig.suptitle(f"Toy PRIME, shortcut injected at step 0: {result['seeds']} seeds x "
                 f"{result['steps']} steps per cell; outlined = gap >= {result['gap_bad']:g} "
                 "(danger zone), red line = its boundary", fontsize=9)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
