"""The accuracy light on the trainer's console: one line when it changes colour.

The dashboard's accuracy light (docs/viz.md; the rule is `algorithms.hacking.accuracy_fall`, with
the `viz.acc_*` thresholds) followed step by step over `reward/outcome_mean_sampled`, so a user
who follows a run only in its terminal still learns that the policy is losing the task under its
reward (a collapse the gap light cannot see under the online filter).
"""

from __future__ import annotations

import math

from primekit.algorithms.hacking import accuracy_fall
from primekit.config import VizConfig


class AccuracyWatch:
    """`update` takes each step's `reward/outcome_mean_sampled` and returns one line when the light
    changes between green, amber and red (never while grey), else None."""

    def __init__(self, cfg: VizConfig) -> None:
        self.cfg = cfg
        self.values: list[float] = []
        self.color = "green"

    def update(self, value: float | None, step: int) -> str | None:
        if value is not None and math.isfinite(value):
            self.values.append(float(value))
        c = self.cfg
        light = accuracy_fall(self.values, c.window, warn=c.acc_warn, bad=c.acc_bad, z_min=c.acc_z)
        if light["color"] == "grey" or light["color"] == self.color:
            return None
        before, self.color = self.color, light["color"]
        where = (f"accuracy on all samples {light['last']:.3f} over the last {c.window} steps, "
                 f"{light['value']:.3f} below its best {light['best']:.3f}")
        if self.color == "green":
            return f"step {step}: accuracy holding again ({where}; the accuracy light was {before})"
        style = "red" if self.color == "red" else "yellow"
        return (f"[{style}]step {step}: {light['label'].lower()}[/]: {where} ({light['z']:.1f} "
                f"times a window mean's noise): the policy is losing the task under its reward "
                f"(the dashboard's accuracy light, docs/viz.md)")
