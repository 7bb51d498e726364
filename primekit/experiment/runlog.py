"""One run's metrics.jsonl as series per key: everything the report and the plots read."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TRAIN_SECONDS = "train seconds"  # the sum of timing/step: wall-clock of the training steps


@dataclass
class RunLog:
    """One run's metrics.jsonl: key -> (steps, values), each key's lines in step order (the last
    line of a step wins)."""

    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    wall_s: float = 0.0  # first line's time to last line's, plus the first step's own seconds
    seed: int | None = None  # train.seed, where the caller knows it (an experiment's run)

    def final(self, key: str, window: int) -> float | None:
        if key not in self.series:
            return None
        _, v = self.series[key]
        return float(v[-1]) if key.startswith("eval/") else float(np.mean(v[-window:]))

    def noise(self, key: str) -> float | None:
        """The standard deviation (ddof 1) of the step-to-step changes of a per-step metric: how
        much it jumps between steps, whatever its trend. [1, 3, 2, 4]: changes [2, -1, 2], mean
        1, std sqrt((1 + 4 + 1) / 2) = 1.732."""
        if key not in self.series or len(self.series[key][1]) < 3:
            return None
        return float(np.std(np.diff(self.series[key][1]), ddof=1))


def read_run(run_dir: Path) -> RunLog | None:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    by_key: dict[str, dict[int, float]] = {}
    times = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        step = int(row.pop("step"))
        times.append(float(row.pop("time", 0.0)))
        for k, v in row.items():
            try:
                x = float(v)  # "nan"/"inf" as written by the logger
            except (TypeError, ValueError):
                continue
            if math.isnan(x):
                # Undefined at this step (e.g. reward/outcome_mean_sampled on a step trained only
                # on carried groups, which sampled nothing): absent, not a value that would turn
                # every window mean over it into nan.
                continue
            by_key.setdefault(k, {})[step] = x
    log = RunLog()
    for k, d in by_key.items():
        steps = np.array(sorted(d))
        log.series[k] = (steps, np.array([d[s] for s in steps]))
    if "timing/step" in log.series:
        s, v = log.series["timing/step"]
        log.series[TRAIN_SECONDS] = (s, np.cumsum(v))
        log.wall_s = max(times) - min(times) + float(v[0])
    return log


def match_keys(logs: list[RunLog], prefix: str) -> list[str]:
    keys = sorted({k for log in logs for k in log.series if k == prefix or (
        prefix.endswith("@") and k.startswith(prefix))})
    return keys
