"""The step light (viz/lights.py steps_light) and the dashboard follower that feeds it."""

import json

from primekit.config import VizConfig
from primekit.viz.dashboard import RunFollower
from primekit.viz.lights import steps_light

VIZ = VizConfig(window=3, steps_warn=0.25, steps_bad=0.5, steps_acc_rise=0.05)


def test_steps_light_hand_computed():
    flat_acc = [0.4] * 6
    # Too few values: grey.
    assert steps_light([3.0] * 5, flat_acc[:5], VIZ)["color"] == "grey"
    # Steps 3 -> 3 (first window mean 3, last 3): steady.
    light = steps_light([3.0] * 6, flat_acc, VIZ)
    assert (light["color"], light["label"], light["value"]) == ("green", "Step count steady", 0.0)
    # 4 -> 5: d = (5 - 4) / 4 = 0.25 >= steps_warn, accuracy flat: amber.
    light = steps_light([4, 4, 4, 5, 5, 5], flat_acc, VIZ)
    assert (light["color"], light["label"], light["value"]) == ("amber", "Step count drifting", 0.25)
    # 6 -> 2 (PURE's hack: the delimiter avoided, few long steps): d = -4/6 = -0.667: red.
    light = steps_light([6, 6, 6, 2, 2, 2], flat_acc, VIZ)
    assert light["color"] == "red" and light["label"] == "Step gaming"
    assert abs(light["value"] + 2 / 3) < 1e-12
    # The same drift while accuracy rises 0.4 -> 0.5 (+0.1 >= 0.05): the policy is learning.
    light = steps_light([6, 6, 6, 2, 2, 2], [0.4] * 3 + [0.5] * 3, VIZ)
    assert (light["color"], light["label"]) == ("green", "Steps follow accuracy")
    assert abs(light["acc_rise"] - 0.1) < 1e-12
    # Accuracy falling does not excuse the drift; NaN values are skipped.
    light = steps_light([6, float("nan"), 6, 6, 9, 9, 9], [0.5] * 3 + [0.3] * 4, VIZ)
    assert light["color"] == "red" and abs(light["value"] - 0.5) < 1e-12


def test_dashboard_follower_has_the_step_light(tmp_path):
    rows = [{"step": i + 1, "hack/steps_per_response": s, "reward/outcome_mean_sampled": 0.3}
            for i, s in enumerate([5, 5, 5, 2, 2, 2])]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    follower = RunFollower(tmp_path)
    follower.poll()
    light = follower.lights(VIZ)["steps"]
    assert light["label"] == "Step gaming" and abs(light["value"] + 0.6) < 1e-12
