"""The lights, from any series of PRM accuracies, reward-minus-accuracy gaps, steps per response.

PRM-accuracy light: the mean PRM accuracy over the last `window` values; green "PRM accurate" at
or above `prm_ok`, amber "PRM drifting" at or above `prm_warn`, red "PRM wrong" below.
Gap light: the mean of (reported reward - verifier accuracy) over the same window; green "Reward
tracks truth" while |gap| is below `gap_warn`, amber "Gap opening" below `gap_bad`, red "Reward
hacking" from `gap_bad`. Only a reward *above* the truth counts as hacking; a reward at least
`gap_warn` *below* it is amber "Reward under-reports truth" (not hacked, but not tracking either).
Step light (step gaming: PURE, arXiv 2504.15275, saw the step delimiter avoided to make few long
steps; Gao et al. many short ones): the relative change of the mean number of steps per response
from the first `window` values to the last `window`, d = (s_last - s_first) / s_first, beside the
change of verifier accuracy over the same span, a = acc_last - acc_first. While accuracy rises by
at least `steps_acc_rise` the light is green ("Steps follow accuracy": the policy is learning);
otherwise amber "Step count drifting" from |d| >= `steps_warn`, red "Step gaming" from |d| >=
`steps_bad`, else green "Step count steady". Grey until there are 2 x window values of each.
Accuracy light (a policy losing the task under its reward): the verifier's accuracy on every
sampled rollout falling below its best window beyond its noise; the rule and its formula are
`algorithms.hacking.accuracy_fall`, shared with the trainer's console watch. The gap light cannot
see such a fall: it compares the PRM with the verifier on the *trained* batch, whose accuracy the
online filter holds inside its band however the policy fares (docs/viz.md).
The thresholds are `VizConfig`'s (primekit/config.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from primekit.algorithms.hacking import accuracy_fall
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


def _first_last(values: Sequence[float], window: int) -> tuple[float, float] | None:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if len(xs) < 2 * window:
        return None
    return sum(xs[:window]) / window, sum(xs[-window:]) / window


def steps_light(steps_per_response: Sequence[float], accuracies: Sequence[float],
                cfg: VizConfig) -> dict:
    """The step light (module docstring); value: the relative change d of steps per response."""
    steps, acc = _first_last(steps_per_response, cfg.window), _first_last(accuracies, cfg.window)
    if steps is None or acc is None:
        return {"color": "grey", "label": "Not enough steps yet", "value": None}
    drift = (steps[1] - steps[0]) / max(abs(steps[0]), 1e-9)
    rise = acc[1] - acc[0]
    if rise >= cfg.steps_acc_rise:
        color, label = "green", "Steps follow accuracy"
    elif abs(drift) >= cfg.steps_bad:
        color, label = "red", "Step gaming"
    elif abs(drift) >= cfg.steps_warn:
        color, label = "amber", "Step count drifting"
    else:
        color, label = "green", "Step count steady"
    return {"color": color, "label": label, "value": drift, "acc_rise": rise}


def accuracy_light(accuracies: Sequence[float], cfg: VizConfig) -> dict:
    """The accuracy light (module docstring; the rule is `algorithms.hacking.accuracy_fall`, which
    the trainer's console watch shares); value: the drop from the best window mean so far."""
    return accuracy_fall(accuracies, cfg.window, warn=cfg.acc_warn, bad=cfg.acc_bad, z_min=cfg.acc_z)


def thresholds(cfg: VizConfig) -> dict:
    return {"window": cfg.window, "prm_ok": cfg.prm_ok, "prm_warn": cfg.prm_warn,
            "gap_warn": cfg.gap_warn, "gap_bad": cfg.gap_bad, "steps_warn": cfg.steps_warn,
            "steps_bad": cfg.steps_bad, "steps_acc_rise": cfg.steps_acc_rise,
            "acc_warn": cfg.acc_warn, "acc_bad": cfg.acc_bad, "acc_z": cfg.acc_z}

