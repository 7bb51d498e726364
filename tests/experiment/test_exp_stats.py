"""The interval arithmetic on hand-computed inputs (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from primekit.experiment import stats
from primekit.experiment.report import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, decide
from primekit.experiment.spec import Verdict


def test_t_quantiles_match_the_table():
    # Student's t table, two-sided 95%: df 1 -> 12.706, 2 -> 4.303, 4 -> 2.776, 30 -> 2.042.
    for df, t in [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451), (30, 2.0422725)]:
        assert stats.t_quantile(0.975, df) == pytest.approx(t, abs=1e-6)
    # df 1 is the Cauchy distribution: quantile tan(pi (p - 1/2)); p = 0.75 -> tan(pi/4) = 1.
    assert stats.t_quantile(0.75, 1) == pytest.approx(1.0, abs=1e-9)
    assert stats.t_quantile(0.025, 2) == pytest.approx(-4.3026527, abs=1e-6)
    assert stats.t_cdf(0.0, 5) == pytest.approx(0.5)


def test_t_interval_by_hand():
    # [1, 2, 3]: mean 2, s = sqrt(((1-2)^2 + 0 + (3-2)^2) / 2) = 1, se = 1/sqrt(3) = 0.57735,
    # half-width = 4.30265 * 0.57735 = 2.48414 -> [-0.48414, 4.48414].
    iv = stats.t_interval([1.0, 2.0, 3.0])
    assert (iv.value, iv.n) == (2.0, 3)
    assert iv.lo == pytest.approx(-0.48414, abs=1e-5)
    assert iv.hi == pytest.approx(4.48414, abs=1e-5)
    # [0.5, 0.7]: mean 0.6, s = sqrt(2 * 0.1^2 / 1) = 0.141421, se = 0.1,
    # half = 12.7062 * 0.1 = 1.27062.
    iv = stats.t_interval([0.5, 0.7])
    assert (iv.lo, iv.hi) == (pytest.approx(0.6 - 1.270620, abs=1e-5),
                              pytest.approx(0.6 + 1.270620, abs=1e-5))
    # One seed: no spread, no interval.
    iv = stats.t_interval([0.4])
    assert iv.value == 0.4 and iv.lo == -math.inf and iv.hi == math.inf


def test_welch_interval_by_hand():
    # a = [1, 2, 3]: mean 2, s^2 = 1, s^2/n = 1/3. b = [0, 0, 3]: mean 1, s^2 = ((1 + 1 + 4)/2)
    # = 3, s^2/n = 1. se = sqrt(4/3) = 1.154701; df = (4/3)^2 / ((1/3)^2/2 + 1^2/2)
    # = 1.777778 / 0.555556 = 3.2; t_{0.975, 3.2} = 3.072829 (scipy.stats.t.ppf);
    # half = 3.072829 * 1.154701 = 3.548197 -> 1 +- 3.548197.
    iv = stats.welch_interval([1, 2, 3], [0, 0, 3])
    assert iv.value == pytest.approx(1.0)
    assert stats.t_quantile(0.975, 3.2) == pytest.approx(3.072829, abs=1e-5)
    assert iv.lo == pytest.approx(1 - 3.548197, abs=1e-5)
    assert iv.hi == pytest.approx(1 + 3.548197, abs=1e-5)
    # No spread in either arm: the difference is exact.
    iv = stats.welch_interval([2, 2, 2], [1, 1, 1])
    assert (iv.value, iv.lo, iv.hi) == (1.0, 1.0, 1.0)


def test_bootstrap_ratio_by_hand_and_reproducible():
    # num [2, 4] resampled: means 2 (p 1/4), 3 (p 1/2), 4 (p 1/4); den [1, 1] always 1. The
    # ratio's percentiles 2.5% and 97.5% are therefore 2 and 4; the point estimate 3 / 1 = 3.
    iv = stats.bootstrap_ratio([2, 4], [1, 1], n_boot=2000, seed=0)
    assert (iv.value, iv.lo, iv.hi) == (3.0, 2.0, 4.0)
    # Constant arms: every resample gives 6 / 3 = 2.
    iv = stats.bootstrap_ratio([6, 6, 6], [3, 3, 3])
    assert (iv.value, iv.lo, iv.hi) == (2.0, 2.0, 2.0)
    # Seeded: the same inputs and seed give the same interval, another seed another one.
    a, b = [40, 55, 70, 52], [100, 90, 130]
    assert stats.bootstrap_ratio(b, a, seed=3) == stats.bootstrap_ratio(b, a, seed=3)
    assert stats.bootstrap_ratio(b, a, seed=3) != stats.bootstrap_ratio(b, a, seed=4)
    # Point estimate: mean(b) / mean(a) = (320 / 3) / (217 / 4) = 106.667 / 54.25 = 1.96621.
    assert stats.bootstrap_ratio(b, a).value == pytest.approx(1.966206, abs=1e-6)


def test_smooth_and_steps_to_threshold_by_hand():
    # Trailing mean, window 2: [1, (1+2)/2, (2+3)/2, (3+4)/2] = [1, 1.5, 2.5, 3.5].
    assert stats.smooth([1, 2, 3, 4], 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    # Window 3 over [0, 0.6, 0.6, 0.9, 0.3]: [0, 0.3, 0.4, 0.7, 0.6].
    assert np.allclose(stats.smooth([0, 0.6, 0.6, 0.9, 0.3], 3), [0, 0.3, 0.4, 0.7, 0.6])
    steps = [10, 20, 30, 40, 50]
    # Threshold 0.5: the smoothed series first reaches it at index 3, step 40 (the raw series
    # already did at step 20: smoothing is what makes one lucky step not count).
    assert stats.steps_to_threshold(steps, [0, 0.6, 0.6, 0.9, 0.3], 0.5, 3) == stats.Crossing(
        40, False)
    # Never reached: censored at the last step, 50.
    assert stats.steps_to_threshold(steps, [0, 0.6, 0.6, 0.9, 0.3], 0.8, 3) == stats.Crossing(
        50, True)
    # Window 1 is the raw series: 0.6 at step 20.
    assert stats.steps_to_threshold(steps, [0, 0.6, 0.6, 0.9, 0.3], 0.5, 1).step == 20
    # Threshold 0 is met by the first value itself: step 10, flagged as where the run started.
    assert stats.steps_to_threshold(steps, [0, 0.6, 0.6, 0.9, 0.3], 0.0, 3) == stats.Crossing(
        10, False, at_start=True)


def test_verdict_rule():
    v = Verdict(metric="eval/pass@1_greedy", compare=[["a", "b"]])  # difference, boundary 0
    iv = stats.Interval
    assert decide(v, iv(0.05, 0.01, 0.09, 3), 3)[0] == REPRODUCED
    assert decide(v, iv(-0.05, -0.09, -0.01, 3), 3)[0] == NOT_REPRODUCED
    verdict, reason = decide(v, iv(0.02, -0.01, 0.05, 3), 3)
    assert verdict == INCONCLUSIVE and "straddles 0" in reason
    # Two seeds: inconclusive whatever the interval.
    verdict, reason = decide(v, iv(0.05, 0.01, 0.09, 2), 2)
    assert verdict == INCONCLUSIVE and "need 3" in reason
    # A claimed effect of +0.069 (the paper's +6.9%): an interval wholly below it is "not
    # reproduced" even when it straddles 0.
    v = Verdict(metric="m/x", compare=[["a", "b"]], min_effect=0.069)
    assert decide(v, iv(0.01, -0.02, 0.04, 3), 3)[0] == NOT_REPRODUCED
    # direction less: the treatment should lower the metric.
    v = Verdict(metric="m/x", compare=[["a", "b"]], direction="less")
    assert decide(v, iv(-0.05, -0.09, -0.01, 3), 3)[0] == REPRODUCED
    # steps-ratio (boundary 1): a censored treatment run makes "reproduced" inconclusive, a
    # censored baseline run makes "not reproduced" inconclusive.
    v = Verdict(metric="m/x", compare=[["a", "b"]], rule="steps-ratio")
    assert v.boundary == 1.0
    assert decide(v, iv(2.0, 1.5, 2.5, 3), 3)[0] == REPRODUCED
    assert decide(v, iv(2.0, 1.5, 2.5, 3), 3, censored=(1, 0))[0] == INCONCLUSIVE
    assert decide(v, iv(0.6, 0.4, 0.8, 3), 3)[0] == NOT_REPRODUCED
    assert decide(v, iv(0.6, 0.4, 0.8, 3), 3, censored=(0, 2))[0] == INCONCLUSIVE


def test_equivalence_rule_and_noise_statistic():
    iv = stats.Interval
    v = Verdict(metric="m/x", compare=[["a", "b"]], rule="equivalence", boundary=0.03)
    assert decide(v, iv(0.0, -0.02, 0.025, 3), 3)[0] == REPRODUCED  # within +-0.03
    assert decide(v, iv(0.08, 0.04, 0.12, 3), 3)[0] == NOT_REPRODUCED  # wholly above 0.03
    assert decide(v, iv(0.02, -0.01, 0.05, 3), 3)[0] == INCONCLUSIVE  # crosses 0.03
    from primekit.experiment.runlog import RunLog

    log = RunLog(series={"m/x": (np.array([1, 2, 3, 4]), np.array([1.0, 3.0, 2.0, 4.0]))})
    # Changes [2, -1, 2]: mean 1, std sqrt(((2-1)^2 + (-1-1)^2 + (2-1)^2) / 2) = sqrt(3).
    assert log.noise("m/x") == pytest.approx(math.sqrt(3))
    # Final per-step value: the mean of the last 2 steps, (2 + 4) / 2 = 3.
    assert log.final("m/x", 2) == 3.0


def test_steps_ratio_rows_from_series(tmp_path):
    import yaml

    from primekit.experiment.report import overall, verdict_rows
    from primekit.experiment.runlog import RunLog
    from primekit.experiment.spec import load_spec

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "claim": "c", "base": "tiny", "seeds": 3,
        "arms": {"prime": {}, "rloo": {"algorithm.reward_mode": "outcome"}},
        "verdict": [{"rule": "steps-ratio", "metric": "m/r", "compare": [["prime", "rloo"]],
                     "window": 1, "threshold": 0.5},
                    {"rule": "difference", "metric": "m/r", "compare": [["prime", "rloo"]],
                     "window": 2}]}))
    spec = load_spec(path)
    steps = np.arange(1, 7)

    def log(values):
        return RunLog(series={"m/r": (steps, np.array(values, dtype=float))})

    # prime crosses 0.5 at step 2 in every seed, rloo at step 4: ratio 4 / 2 = 2, and with no
    # spread every bootstrap resample gives 2 too.
    prime = [log([0.1, 0.6, 0.6, 0.7, 0.7, 0.8])] * 3
    rloo = [log([0.1, 0.2, 0.3, 0.5, 0.6, 0.6])] * 3
    rows = verdict_rows(spec, {("default", "prime"): prime, ("default", "rloo"): rloo})
    ratio, diff = rows
    assert (ratio.estimate.value, ratio.estimate.lo, ratio.estimate.hi) == (2.0, 2.0, 2.0)
    assert ratio.verdict == REPRODUCED and "0 censored" in ratio.detail
    # Final value over the last 2 steps: prime (0.7 + 0.8) / 2 = 0.75, rloo 0.6; difference
    # 0.15 with no spread.
    assert diff.estimate.value == pytest.approx(0.15)
    assert diff.verdict == REPRODUCED and overall(rows) == REPRODUCED
    # Censoring, over 10 steps: rloo crosses at step 9 in all 4 seeds; prime at step 2 in three
    # and never in one (censored at step 10). Ratio 9 / ((2 + 2 + 2 + 10) / 4) = 9 / 4 = 2.25;
    # even a resample with three censored runs, mean (2 + 30) / 4 = 8, gives 9 / 8 > 1 (all four
    # censored has probability 1/256, below 2.5%), so the interval lies above 1 - yet the
    # censored run's true steps are more than 10: the ratio is an upper bound, inconclusive.
    steps = np.arange(1, 11)
    prime = [log([0.1, 0.6] + [0.7] * 8)] * 3 + [log([0.1] * 10)]
    rloo = [log([0.1] * 8 + [0.6, 0.6])] * 4
    row = verdict_rows(spec, {("default", "prime"): prime, ("default", "rloo"): rloo})[0]
    assert row.estimate.value == pytest.approx(2.25) and row.estimate.lo > 1
    assert row.verdict == INCONCLUSIVE and "1 treatment run(s) never reached" in row.reason
    assert "(1 censored)" in row.detail
    # Both arms start above the threshold (0.5) and fall: every run "reaches" it at step 1, ratio
    # 1 / 1 = 1 with no spread, an interval [1, 1] that says nothing of speed: inconclusive with
    # that reason, not "straddles 1".
    prime = [log([0.7, 0.4, 0.4, 0.45, 0.45, 0.45, 0.5, 0.5, 0.5, 0.5])] * 3
    rloo = [log([0.6] + [0.3] * 9)] * 3
    row = verdict_rows(spec, {("default", "prime"): prime, ("default", "rloo"): rloo})[0]
    assert (row.estimate.value, row.estimate.lo, row.estimate.hi) == (1.0, 1.0, 1.0)
    assert row.verdict == INCONCLUSIVE and "at its first step" in row.reason
    # One run that starts below the threshold is enough for the count to mean something.
    rloo = [log([0.6] + [0.3] * 9)] * 2 + [log([0.3] * 10)]
    row = verdict_rows(spec, {("default", "prime"): prime, ("default", "rloo"): rloo})[0]
    assert "at its first step" not in row.reason


def test_read_run_drops_nan_steps_so_window_means_stay_finite(tmp_path):
    import json

    from primekit.experiment.runlog import read_run

    # Step 3 trained only on carried groups: its sampled reward is "nan" (nothing sampled).
    rows = [{"step": 1, "time": 10.0, "r": 0.5, "timing/step": 1.0},
            {"step": 2, "time": 11.0, "r": 0.7, "timing/step": 1.0},
            {"step": 3, "time": 12.0, "r": "nan", "timing/step": 1.0},
            {"step": 4, "time": 13.0, "r": 0.9, "timing/step": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = read_run(tmp_path)
    steps, values = log.series["r"]
    assert steps.tolist() == [1, 2, 4] and values.tolist() == [0.5, 0.7, 0.9]
    # The last 2 values: (0.7 + 0.9) / 2 = 0.8, not nan.
    assert log.final("r", 2) == pytest.approx(0.8)


def test_map_of_two_override_fields_by_hand(tmp_path):
    # Three arms on a (prm.beta, prm.lr) grid and an outcome-only baseline; cells are differences
    # from the baseline with Welch 95% intervals (docs/experiments/README.md, map).
    import yaml

    from primekit.experiment.grid import grid_values
    from primekit.experiment.plots import plot_grid
    from primekit.experiment.report import grid_lines
    from primekit.experiment.runlog import RunLog
    from primekit.experiment.spec import load_spec

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "claim": "c", "base": "tiny", "seeds": 3,
        "tasks": {"arith": {}, "chains": {}},  # chains: no finished runs yet
        "arms": {"rloo": {"algorithm.reward_mode": "outcome"},
                 "a": {"prm.beta": 0.1, "prm.lr": 1.0e-3},
                 "b": {"prm.beta": 0.1, "prm.lr": 1.0e-4},
                 "c": {"prm.beta": 0.5, "prm.lr": 1.0e-4}},
        "verdict": {"metric": "eval/pass@1_greedy", "compare": [["a", "rloo"]]},
        "map": {"x": "prm.lr", "y": "prm.beta", "metrics": ["eval/pass@1_greedy"],
                "baseline": "rloo"}}))
    spec = load_spec(path)

    def logs(values):
        return [RunLog(series={"eval/pass@1_greedy": (np.array([10]), np.array([v]))})
                for v in values]

    runs = {("arith", "rloo"): logs([0.5, 0.5, 0.5]), ("arith", "a"): logs([0.6, 0.7, 0.8]),
            ("arith", "b"): logs([0.5, 0.6, 0.4]), ("arith", "c"): logs([0.3, 0.31, 0.29])}
    xs, ys, cells, relative = grid_values(spec, runs, "arith", "eval/pass@1_greedy")
    assert relative
    assert xs == [1.0e-4, 1.0e-3] and ys == [0.1, 0.5]  # numbers, sorted (1e-05 is no string)
    assert set(cells) == {(0, 0), (0, 1), (1, 0)}  # beta 0.5 x lr 1e-3 has no arm
    a, b, c = cells[(0, 1)], cells[(0, 0)], cells[(1, 0)]
    # a: mean 0.7 - 0.5 = 0.2; s_a = 0.1, baseline without spread, so se = 0.1 / sqrt(3) =
    # 0.05774 with n_a - 1 = 2 degrees of freedom, t = 4.303: 0.2 +- 0.2484.
    assert a.value == pytest.approx(0.2)
    assert (a.lo, a.hi) == (pytest.approx(0.2 - 0.2484, abs=1e-3), pytest.approx(0.4484, abs=1e-3))
    assert b.value == pytest.approx(0.0) and not b.excludes(0.0)
    # c: -0.2, s = 0.01, se = 0.005774, +- 0.02484: excludes 0.
    assert c.value == pytest.approx(-0.2) and c.hi == pytest.approx(-0.2 + 0.02484, abs=1e-4)
    text = "\n".join(grid_lines(spec, runs))
    assert "## Map: `prm.beta` x `prm.lr`" in text
    assert "| prm.beta \\ prm.lr | 0.0001 | 0.001 |" in text
    assert "| 0.5 | **-0.200 [-0.225, -0.175]** | - |" in text
    assert "| 0.1 | 0.000 [" in text and "0.200 [-0.048, 0.448] |" in text
    # A metric the baseline does not log (as RLOO has no dense return) is mapped as is.
    for arm, v in (("a", 0.4), ("b", 0.1), ("c", -0.2)):
        for g in runs[("arith", arm)]:
            g.series["hack/dense_success_corr"] = (np.array([10]), np.array([v]))
    _, _, cells, relative = grid_values(spec, runs, "arith", "hack/dense_success_corr")
    assert not relative and cells[(1, 0)].value == pytest.approx(-0.2)
    _, _, empty, _ = grid_values(spec, runs, "chains", "eval/pass@1_greedy")
    assert empty == {}  # its panel says "no finished runs" instead of an empty colour scale
    (png,) = plot_grid(spec, runs, tmp_path / "plots")
    assert png.name == "map_eval_pass@1_greedy.png".replace("@", "at")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_map_cell_text_is_readable_on_dark_cells():
    # Luminance 0.2126 r + 0.7152 g + 0.0722 b against 0.45: white (1.0) and the pale centre of
    # RdBu (~0.97) take black text; RdBu's dark red end (~0.40, 0.00, 0.12: ~0.09) and
    # viridis' dark purple start (~0.27, 0.00, 0.33: ~0.08) take white.
    import matplotlib

    from primekit.experiment.plots import _text_colour

    assert _text_colour((1.0, 1.0, 1.0, 1.0)) == "black"
    assert _text_colour(matplotlib.colormaps["RdBu"](0.5)) == "black"
    assert _text_colour(matplotlib.colormaps["RdBu"](0.0)) == "white"
    assert _text_colour(matplotlib.colormaps["viridis"](0.0)) == "white"
    assert _text_colour(matplotlib.colormaps["viridis"](1.0)) == "black"  # yellow


def test_start_and_end_of_a_per_step_verdict_metric_by_hand(tmp_path):
    import yaml

    from primekit.experiment.report import drift_lines
    from primekit.experiment.runlog import RunLog
    from primekit.experiment.spec import load_spec

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "claim": "c", "base": "tiny", "seeds": 3,
        "arms": {"online": {}, "frozen": {"prm.beta": 0.1}},
        "verdict": [{"rule": "difference", "metric": "prm/acc_pairwise", "window": 2,
                     "compare": [["online", "frozen"]]},
                    {"rule": "difference", "metric": "eval/pass@1_greedy",
                     "compare": [["online", "frozen"]]}]}))
    spec = load_spec(path)
    steps = np.arange(1, 6)

    def log(values):
        return RunLog(series={"prm/acc_pairwise": (steps, np.array(values, dtype=float)),
                              "eval/pass@1_greedy": (np.array([5]), np.array([0.5]))})

    # online: first 2 steps mean (0.6 + 0.6) / 2 = 0.6, last 2 (0.7 + 0.9) / 2 = 0.8, change
    # +0.2 in each of 3 seeds (no spread). frozen, seeds: first means 0.7, 0.8, 0.9, last means
    # 0.6, 0.6, 0.6: changes -0.1, -0.2, -0.3, mean -0.2, s = 0.1, half-width
    # t(0.975, 2) * 0.1 / sqrt(3) = 4.303 * 0.05774 = 0.248.
    logs = {("default", "online"): [log([0.6, 0.6, 0.5, 0.7, 0.9])] * 3,
            ("default", "frozen"): [log([x, x, 0.65, 0.6, 0.6]) for x in (0.7, 0.8, 0.9)]}
    text = "\n".join(drift_lines(spec, logs))
    assert "### Start and end: `prm/acc_pairwise` (first 2 steps -> last 2 steps" in text
    assert "eval/pass@1_greedy" not in text  # a final evaluation has no start
    assert ("| online | 0.600 [0.600, 0.600] -> 0.800 [0.800, 0.800]; change +0.200 "
            "[+0.200, +0.200] |") in text
    # (the first window's interval, 0.8 +- 0.248 = [0.552, 1.048], is an accuracy's: cut at 1)
    assert "| frozen | 0.800 [0.552, 1.000] -> 0.600 [0.600, 0.600]; change -0.200 " \
        "[-0.448, +0.048] |" in text
    # Runs shorter than two windows say nothing of a start and an end.
    short = {("default", "online"): [RunLog(series={"prm/acc_pairwise": (
        np.arange(1, 4), np.array([0.5, 0.6, 0.7]))})] * 3}
    assert "| online | - |" in "\n".join(drift_lines(spec, short))


def test_collapse_table_replays_the_accuracy_light(tmp_path):
    import yaml

    from primekit.experiment.report import collapse_lines
    from primekit.experiment.runlog import RunLog
    from primekit.experiment.spec import load_spec

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "claim": "c", "base": "tiny", "seeds": 2,
        "arms": {"a": {}, "b": {"prm.beta": 0.1}},
        "verdict": [{"rule": "difference", "metric": "eval/pass@1_greedy",
                     "compare": [["a", "b"]]}]}))
    spec = load_spec(path)
    steps = np.arange(1, 31)
    key = "reward/outcome_mean_sampled"
    # Default light: windows of 10. Flat 0.6 with alternating +-0.01: never leaves green.
    flat = np.array([0.6 + (0.01 if i % 2 else -0.01) for i in range(30)])
    # 0.6 for 15 steps, then 0.3: at step 20 the last 10 steps' mean is (5 x 0.6 + 5 x 0.3) / 10
    # = 0.45, drop 0.15 >= 0.1; noise: 19 differences, one of -0.3: sqrt(0.09 / 19 / 2 / 10) =
    # 0.0154, z = 9.7 >= 8: red from step 20 (step 19: mean 0.48, drop 0.12, noise over 18
    # differences 0.0158, z 7.6 < 8: amber). At the end (mean 0.3, drop 0.3): red.
    fall = np.array([0.6] * 15 + [0.3] * 15)
    logs = {("default", "a"): [RunLog(series={key: (steps, flat)})] * 2,
            ("default", "b"): [RunLog(series={key: (steps, fall)}),
                               RunLog(series={key: (steps, flat)})]}
    text = "\n".join(collapse_lines(spec, logs))
    assert "### Collapse: the accuracy light over `reward/outcome_mean_sampled`" in text
    assert "| a | red at some step in 0 of 2; at the end 2 green |" in text
    assert "| b | red at some step in 1 of 2 (first at step 20); at the end 1 red, 1 green |" in text
    # No run logs the key: no section.
    assert collapse_lines(spec, {("default", "a"): [RunLog(series={})]}) == []


def test_a_share_interval_is_cut_to_its_range():
    # two seeds 0.9 and 1.0: mean 0.95, s = 0.1 / sqrt(2) = 0.07071, t_{0.975, 1} = 12.706,
    # half-width 12.706 * 0.07071 / sqrt(2) = 0.6353 -> [0.3147, 1.5853], which for an accuracy
    # is cut to [0.3147, 1]; a length keeps its interval as computed
    iv = stats.mean_interval([0.9, 1.0], "eval/pass@1_greedy")
    assert (iv.value, iv.hi, iv.n) == (pytest.approx(0.95), 1.0, 2)
    assert iv.lo == pytest.approx(0.95 - 0.6353, abs=1e-4)
    raw = stats.mean_interval([0.9, 1.0], "eval/response_len")
    assert raw.hi == pytest.approx(0.95 + 0.6353, abs=1e-4)
    assert stats.mean_interval([-0.1, 0.1], "prm/acc_pairwise").lo == 0.0
    assert stats.mean_interval([0.5], "prm/acc_abs").fmt() == "0.500 (n=1)"  # no spread: as is
