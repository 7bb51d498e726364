"""The accuracy light (viz/lights.py accuracy_light) and the dashboard follower that feeds it."""

import json

import pytest

from primekit.config import ConfigError, VizConfig, load_config
from primekit.viz.dashboard import RunFollower
from primekit.viz.lights import accuracy_light

# The noise guard low (amber from z >= 1, red from z >= 2) where a test is about the drop.
VIZ = VizConfig(window=3, acc_warn=0.06, acc_bad=0.12, acc_z=1.0)


FALL = [0.5, 0.6, 0.7, 0.7, 0.6, 0.5, 0.4]


def test_accuracy_light_hand_computed():
    # Fewer values than a window: grey.
    assert accuracy_light([0.5, 0.5], VIZ)["color"] == "grey"
    # Rising 0.3 -> 0.6: window means 0.4, 0.5; the latest is the best, drop 0: green.
    light = accuracy_light([0.3, 0.4, 0.5, 0.6], VIZ)
    assert (light["color"], light["label"]) == ("green", "Accuracy holding")
    assert light["value"] == pytest.approx(0.0)
    # Window means (0.5+0.5+0.5)/3 = 0.5 (three times), then (0.5+0.5+0.3)/3 = 0.4333:
    # drop 0.5 - 0.4333 = 0.0667, from 0.06 and below 0.12: amber. (Noise: successive differences
    # 0, 0, 0, 0, -0.2: sd_step^2 = 0.04 / 5 / 2 = 0.004, a window mean's noise sqrt(0.004 / 3) =
    # 0.0365, z = 1.83 >= 1.)
    light = accuracy_light([0.5, 0.5, 0.5, 0.5, 0.5, 0.3], VIZ)
    assert (light["color"], light["label"]) == ("amber", "Accuracy slipping")
    assert light["value"] == pytest.approx(0.2 / 3)
    # Rise then fall: means 0.6, 0.6667 (0.6+0.7+0.7), 0.6667, 0.6, 0.5 (0.6+0.5+0.4): the drop is
    # from the best window, not the first: 0.6667 - 0.5 = 0.1667 >= 0.12: red. Noise: differences
    # 0.1, 0.1, 0, -0.1, -0.1, -0.1, sd_step^2 = 0.05 / 6 / 2, a window mean's noise
    # sqrt(0.05 / 36) = sqrt(0.05) / 6, so z = (1/6) / (sqrt(0.05) / 6) = sqrt(20) = 4.47 >= 2.
    light = accuracy_light(FALL, VIZ)
    assert (light["color"], light["label"]) == ("red", "Accuracy falling")
    assert light["value"] == pytest.approx(0.5 / 3)
    assert (light["best"], light["last"]) == (pytest.approx(2 / 3), pytest.approx(0.5))
    assert light["z"] == pytest.approx(20 ** 0.5)
    # A recovered run is green again: means 0.8, 0.5667, 0.3, 0.3, 0.5333, then
    # (0.8+0.8+0.9)/3 = 0.8333, the best so far and the latest.
    assert accuracy_light([0.8, 0.8, 0.8, 0.1, 0.0, 0.8, 0.8, 0.9], VIZ)["color"] == "green"
    # NaN and None (steps that sampled nothing) are skipped, not read as 0.
    light = accuracy_light([0.5, float("nan"), 0.5, None, 0.5], VIZ)
    assert (light["color"], light["value"]) == ("green", 0.0)


def test_the_noise_guard_keeps_a_drop_within_noise_from_reading_as_a_collapse():
    # The same drop of 0.1667 at z = 4.47: with acc_z = 3 red needs z >= 6, amber z >= 3: amber;
    # with acc_z = 5 amber needs z >= 5: green.
    light = accuracy_light(FALL, VizConfig(window=3, acc_warn=0.06, acc_bad=0.12, acc_z=3.0))
    assert light["color"] == "amber"
    light = accuracy_light(FALL, VizConfig(window=3, acc_warn=0.06, acc_bad=0.12, acc_z=5.0))
    assert (light["color"], light["label"]) == ("green", "Accuracy holding")


def test_dashboard_sees_the_collapse_the_gap_light_cannot(tmp_path):
    # The online filter keeps only mixed groups, so the trained batch's accuracy stays 0.5 and the
    # PRM's prediction sigmoid(0) = 0.5 tracks it (gap 0: green), while the accuracy of every
    # sampled rollout falls 0.6 -> 0.3 (docs/viz.md, the live runs): the accuracy light is red,
    # drop = 0.6 - 0.3 = 0.3; differences 0, 0, -0.15, -0.15, 0, 0: noise sqrt(0.045/6/2/3) =
    # 0.0354, z = 8.49, red under the default acc_z = 4 (z >= 8) too.
    rows = [{"step": i + 1, "reward/outcome_mean": 0.5, "reward/implicit_seq_mean": 0.0,
             "prm/acc_pairwise": 0.9, "reward/outcome_mean_sampled": a}
            for i, a in enumerate([0.6, 0.6, 0.6, 0.45, 0.3, 0.3, 0.3])]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    follower = RunFollower(tmp_path)
    follower.poll()
    lights = follower.lights(VIZ)
    assert lights["gap"]["label"] == "Reward tracks truth" and lights["prm"]["color"] == "green"
    assert lights["accuracy"]["label"] == "Accuracy falling"
    assert lights["accuracy"]["value"] == pytest.approx(0.3)
    assert lights["accuracy"]["z"] == pytest.approx(0.3 / (0.045 / 36) ** 0.5)
    default = VizConfig(window=3)
    assert (default.acc_warn, default.acc_bad, default.acc_z) == (0.05, 0.1, 4.0)
    assert follower.lights(default)["accuracy"]["color"] == "red"


def test_dashboard_falls_back_to_the_trained_batch_accuracy(tmp_path):
    # A run that logs no sampled accuracy (metrics from before the key): the trained batch's.
    # Means 0.8, 0.7333 ((0.8+0.8+0.6)/3): drop 0.0667; noise sqrt(0.04/3/2/3) = 0.0471, z 1.41:
    # amber.
    rows = [{"step": i + 1, "reward/outcome_mean": a} for i, a in enumerate([0.8, 0.8, 0.8, 0.6])]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    follower = RunFollower(tmp_path)
    follower.poll()
    light = follower.lights(VIZ)["accuracy"]
    assert light["color"] == "amber" and light["value"] == pytest.approx(0.2 / 3)


def test_accuracy_thresholds_in_order():
    from pathlib import Path

    tiny = Path(__file__).resolve().parents[2] / "primekit" / "configs" / "tiny.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(tiny, ["viz.acc_warn=0.2", "viz.acc_bad=0.1"])
    assert str(err.value).startswith("viz.acc_warn/viz.acc_bad: need warn <= bad")


def test_the_trainer_console_gets_one_line_per_change_of_the_light():
    # FALL, step by step (window means and noise as above): green through step 5; step 6 drop
    # 0.0667 at z 1.83: amber; step 7 drop 0.1667 at z 4.47: red; step 8 (0.8 added) means end
    # (0.5+0.4+0.8)/3 = 0.5667, drop 0.1 < 0.12: amber again; step 9 (0.9) the latest window
    # (0.4+0.8+0.9)/3 = 0.7 is the best: green. A NaN step changes nothing.
    from primekit.trainer.watch import AccuracyWatch

    watch = AccuracyWatch(VIZ)
    notes = [watch.update(v, step) for step, v in
             enumerate([*FALL, float("nan"), 0.8, 0.9], start=1)]
    assert notes[:5] == [None] * 5 and notes[7] is None
    assert "step 6: accuracy slipping" in notes[5] and "0.067 below its best 0.667" in notes[5]
    assert "step 7: accuracy falling" in notes[6] and "4.5 times" in notes[6]
    assert "step 9: accuracy slipping" in notes[8]
    assert notes[9].startswith("step 10: accuracy holding again") and "was amber" in notes[9]
