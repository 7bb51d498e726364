"""The two lights, from any series of PRM accuracies and reward-minus-accuracy gaps.

PRM-accuracy light: the mean PRM accuracy over the last `window` values; green "PRM accurate" at
or above `prm_ok`, amber "PRM drifting" at or above `prm_warn`, red "PRM wrong" below.
Gap light: the mean of (reported reward - verifier accuracy) over the same window; green "Reward
tracks truth" while |gap| is below `gap_warn`, amber "Gap opening" below `gap_bad`, red "Reward
hacking" from `gap_bad`. Only a reward *above* the truth counts as hacking; a reward at least
`gap_warn` *below* it is amber "Reward under-reports truth" (not hacked, but not tracking either).
The thresholds are `VizConfig`'s (primekit/config.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from primekit.config import VizConfig


def _window_mean(values: Sequence[float], window: int) -> float | None:
    tail = [v for v in list(values)[-window:] if v is not None and math.isfinite(v)]
    return sum(tail) / len(tail) if tail else None


def prm_light(prm_accuracies: Sequence[float], cfg: VizConfig) -> dict:
    value = _window_mean(prm_accuracies, cfg.window)
    if value is None:
        return {"color": "grey", "label": "No PRM accuracy yet", "value": None}
    if value >= cfg.prm_ok:
        color, label = "green", "PRM accurate"
    elif value >= cfg.prm_warn:
        color, label = "amber", "PRM drifting"
    else:
        color, label = "red", "PRM wrong"
    return {"color": color, "label": label, "value": value}


def gap_light(gaps: Sequence[float], cfg: VizConfig) -> dict:
    value = _window_mean(gaps, cfg.window)
    if value is None:
        return {"color": "grey", "label": "No reward yet", "value": None}
    if value <= -cfg.gap_warn:
        color, label = "amber", "Reward under-reports truth"
    elif value < cfg.gap_warn:
        color, label = "green", "Reward tracks truth"
    elif value < cfg.gap_bad:
        color, label = "amber", "Gap opening"
    else:
        color, label = "red", "Reward hacking"
    return {"color": color, "label": label, "value": value}


def thresholds(cfg: VizConfig) -> dict:
    return {"window": cfg.window, "prm_ok": cfg.prm_ok, "prm_warn": cfg.prm_warn,
            "gap_warn": cfg.gap_warn, "gap_bad": cfg.gap_bad}
