"""Interval arithmetic over seeds: t-intervals, Welch intervals, seeded bootstrap intervals and
steps-to-threshold. Plain numbers in, plain numbers out (numpy only, no scipy).

Every interval is two-sided at 95% unless `level` says otherwise. A mean over n seeds is
reported as mean +- t_{(1+level)/2, n-1} * s / sqrt(n) with s the sample standard deviation
(ddof 1), which assumes the per-seed values are independent and roughly normal; with 3 seeds the
t-quantile is 4.30, so intervals are wide by construction, as they should be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    value: float  # the point estimate
    lo: float
    hi: float
    n: int  # samples (seeds) it rests on; for a difference or ratio, the smaller arm's

    def excludes(self, boundary: float) -> bool:
        return not (self.lo <= boundary <= self.hi)

    def fmt(self, digits: int = 3) -> str:
        if not math.isfinite(self.lo):
            return f"{self.value:.{digits}f} (n={self.n})"
        return f"{self.value:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


# Metrics that are shares of responses, problems or pairs, so lie in [0, 1]. Over few seeds a
# t-interval of their mean can reach past that range (0.81 +- 0.79 with two seeds); the report and
# the plots cut such an interval to [0, 1] (`mean_interval`), and say so.
SHARE_METRICS = ("eval/pass@", "eval/avg@", "eval/maj", "eval/error_rate", "eval/trace_error",
                 "prm/acc", "reward/outcome_mean", "filter/keep")


def is_share(metric: str) -> bool:
    return metric.startswith(SHARE_METRICS)


def mean_interval(values: Sequence[float], metric: str, level: float = 0.95) -> Interval:
    """`t_interval` of a metric's per-seed values, cut to [0, 1] for a share (`SHARE_METRICS`).
    Shapes: values [n]."""
    iv = t_interval(values, level)
    if not is_share(metric) or not math.isfinite(iv.lo):
        return iv
    return Interval(iv.value, max(iv.lo, 0.0), min(iv.hi, 1.0), iv.n)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (Lentz's method; Numerical
    Recipes 3rd ed., Sec. 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom: 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2
    for t >= 0, by symmetry below."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on t_cdf to 1e-12); t_quantile(0.975, 2) = 4.3027."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile: need 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and its t-interval over seeds: mean +- t_{(1+level)/2, n-1} * s / sqrt(n).

    One value has no spread: the interval is (-inf, inf) around it. Shapes: values [n]."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("t_interval: no values")
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, -math.inf, math.inf, 1)
    half = t_quantile((1 + level) / 2, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
    """mean(a) - mean(b) with Welch's t-interval: se = sqrt(s_a^2/n_a + s_b^2/n_b), degrees of
    freedom by Welch-Satterthwaite, se^4 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1)).
    Shapes: a [n_a], b [n_b]; each needs two values for an interval."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(x.mean() - y.mean())
    n = min(len(x), len(y))
    if n < 2:
        return Interval(diff, -math.inf, math.inf, n)
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Interval(diff, diff, diff, n)
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    half = t_quantile((1 + level) / 2, df) * se
    return Interval(diff, diff - half, diff + half, n)


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], *, n_boot: int = 2000,
                    seed: int = 0, level: float = 0.95) -> Interval:
    """mean(num) / mean(den) with a percentile bootstrap interval: each arm's seeds resampled
    with replacement, independently, n_boot times from numpy's PCG64 seeded with `seed` (the same
    inputs and seed give the same interval). Shapes: num [n_a], den [n_b]."""
    x, y = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if len(x) == 0 or len(y) == 0:
        raise ValueError("bootstrap_ratio: an arm has no values")
    value = float(x.mean() / y.mean())
    rng = np.random.default_rng(seed)
    xm = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)  # [n_boot]
    ym = y[rng.integers(0, len(y), size=(n_boot, len(y)))].mean(axis=1)  # [n_boot]
    ratios = xm / ym
    alpha = (1 - level) / 2
    lo, hi = np.quantile(ratios, [alpha, 1 - alpha])
    return Interval(value, float(lo), float(hi), min(len(x), len(y)))


def smooth(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing mean: out[i] = mean(values[max(0, i - window + 1) : i + 1]). Shapes: [T] -> [T]."""
    x = np.asarray(values, dtype=float)
    c = np.concatenate([[0.0], np.cumsum(x)])
    i = np.arange(len(x))
    start = np.maximum(0, i - window + 1)
    return (c[i + 1] - c[start]) / (i + 1 - start)


@dataclass(frozen=True)
class Crossing:
    step: int  # first step reaching the threshold; the run's last step when censored
    censored: bool  # never reached within the run: `step` is a lower bound
    at_start: bool = False  # reached at the run's first logged step: it started there


def steps_to_threshold(steps: Sequence[int], values: Sequence[float], threshold: float,
                       window: int) -> Crossing:
    """The first step at which the trailing `window`-step mean of `values` is >= `threshold`.

    Never reached: censored at the run's last step (the true number is larger; a ratio built on
    it is a bound, and the report says so). Reached at the first step: `at_start` (the run began
    at or above the threshold, so its count says nothing of learning speed).
    Shapes: steps [T], values [T] (one run's series)."""
    if len(steps) == 0:
        raise ValueError("steps_to_threshold: empty series")
    s = smooth(values, window)
    hit = np.nonzero(s >= threshold)[0]
    if len(hit) == 0:
        return Crossing(int(steps[-1]), True)
    return Crossing(int(steps[hit[0]]), False, at_start=bool(hit[0] == 0))
