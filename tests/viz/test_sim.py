"""The toy reward-hacking model (primekit/viz/sim.py), its lights and its danger-zone map.

The three scenes of the explainer, with stated thresholds: the gap light is the mean of
(reported reward - true accuracy) over the last VizConfig.window = 10 steps, red from 0.3.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from primekit.config import SimConfig, VizConfig
from primekit.viz import danger
from primekit.viz.lights import gap_light, prm_light
from primekit.viz.sim import (
    FEATURES,
    KNOB_BOUNDS,
    REF_LOGITS,
    SHORTCUT,
    SOUND,
    WRONG,
    KnobError,
    Sim,
    path_rewards,
    rloo,
)

VIZ = VizConfig()
SEEDS = range(4)
WARMUP, HACK_STEPS = 30, 40  # steps before the injection; frozen steps after it
CLOSE_WITHIN = 10  # the windowed gap light is green again within this many online steps


def windowed(history: list[dict], key: str, window: int = VIZ.window) -> np.ndarray:
    x = np.array([h[key] for h in history])
    return np.array([x[max(0, i - window + 1): i + 1].mean() for i in range(len(x))])


def scene(mode: str, seed: int, after: int) -> Sim:
    sim = Sim.preset(mode, SimConfig(seed=seed))
    for _ in range(WARMUP):
        sim.step()
    sim.inject_shortcut()
    for _ in range(after):
        sim.step()
    return sim


def test_path_rewards_by_hand():
    # w = 0: pi_phi = pi_ref, every log-ratio 0.
    assert np.allclose(path_rewards(np.zeros(3), 0.5, 10), 0)
    # w = (1, 0, 0): Z = pi_ref(sound) e + pi_ref(shortcut) e + pi_ref(wrong); r = b L (w.f - log Z).
    ref = np.exp(REF_LOGITS) / np.exp(REF_LOGITS).sum()
    log_z = math.log(ref[0] * math.e + ref[1] * math.e + ref[2])
    r = path_rewards(np.array([1.0, 0.0, 0.0]), 0.5, 10)
    assert r == pytest.approx([5 * (1 - log_z), 5 * (1 - log_z), -5 * log_z])
    # The implicit reward is a log-ratio of normalised distributions: E_ref[exp(r / (b L))] = 1.
    assert float(ref @ np.exp(r / 5)) == pytest.approx(1.0)
    assert FEATURES.shape == (3, 3)


def test_rloo_by_hand():
    x = np.array([[1.0, 0.0, 0.0, 1.0]])
    # 1 - mean(0, 0, 1) = 2/3; 0 - mean(1, 0, 1) = -2/3
    assert rloo(x) == pytest.approx(np.array([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))


def test_policy_cannot_write_the_shortcut_until_injected():
    sim = Sim(SimConfig())
    for _ in range(5):
        sim.step()
    assert sim.policy()[SHORTCUT] == 0
    sim.inject_shortcut()
    assert sim.policy()[SHORTCUT] == pytest.approx(SimConfig().inject_mass)


@pytest.mark.parametrize("seed", SEEDS)
def test_online_gap_stays_closed(seed):
    sim = scene("online", seed, after=150)
    gap = windowed(sim.history, "gap")
    assert gap.max() < VIZ.gap_warn  # the gap light never leaves green
    assert windowed(sim.history, "prm_accuracy").min() >= VIZ.prm_ok
    assert sim.history[-1]["accuracy"] > 0.95  # and the policy learns the sound path


@pytest.mark.parametrize("seed", SEEDS)
def test_frozen_prm_is_hacked_then_online_closes_the_gap(seed):
    sim = scene("frozen", seed, after=HACK_STEPS)
    last = sim.history[-1]
    assert last["reported"] > 0.95  # reward -> ~1 ...
    assert last["accuracy"] < 0.1  # ... while true accuracy collapses
    assert last["accuracy"] < sim.history[WARMUP]["accuracy"] - 0.5
    assert gap_light([h["gap"] for h in sim.history], VIZ)["label"] == "Reward hacking"
    assert prm_light([h["prm_accuracy"] for h in sim.history], VIZ)["color"] == "red"
    flip = len(sim.history)
    sim.set_mode("online")
    for _ in range(CLOSE_WITHIN):
        sim.step()
    after = [h["gap"] for h in sim.history[flip:]]
    assert gap_light(after, VIZ)["label"] == "Reward tracks truth"
    assert max(after[2:]) < VIZ.gap_warn  # from the third online step on, every step


def test_frozen_preset_differs_from_online_only_in_the_toggle():
    a, b = Sim.preset("online", SimConfig()).cfg, Sim.preset("frozen", SimConfig()).cfg
    assert replace(a, prm_mode="frozen") == b


def test_knobs_are_validated_and_take_effect():
    sim = Sim(SimConfig())
    sim.set_knobs(beta=1.0, prm_lr=0.0)
    assert (sim.cfg.beta, sim.cfg.prm_lr) == (1.0, 0.0)
    w = sim.w.copy()
    sim.step()
    assert np.array_equal(sim.w, w)  # a PRM update rate of 0 leaves the PRM as it is
    with pytest.raises(KnobError, match=r"beta \(reward weight beta\) must be a number in "
                       r"\[0.01, 2\], got 0") as err:
        sim.set_knobs(beta=0)
    assert err.value.field == "beta" and sim.cfg.beta == 1.0  # nothing set
    for bad in (None, "", "abc", float("nan"), float("inf"), True, 2.5, -0.1):
        with pytest.raises(KnobError):
            sim.set_knobs(prm_lr=bad)
    sim.set_knobs(beta="0.25", prm_lr=1)  # strings from the page's fields, ints, the bounds
    assert (sim.cfg.beta, sim.cfg.prm_lr) == (0.25, 1.0)
    with pytest.raises(ValueError, match="unknown knob"):
        sim.set_knobs(lr=1)
    with pytest.raises(ValueError, match="unknown preset"):
        Sim.preset("nope", SimConfig())


def test_lights_thresholds():
    cfg = VizConfig(window=2)
    assert gap_light([0.9, 0.0, 0.1], cfg)["color"] == "green"  # only the window counts: 0.05
    assert gap_light([0.2, 0.2], cfg)["label"] == "Gap opening"
    assert gap_light([0.3, 0.3], cfg)["label"] == "Reward hacking"
    # Under-reporting is not hacking, but from gap_warn below the truth the light says so.
    assert gap_light([-0.9, -0.9], cfg)["label"] == "Reward under-reports truth"
    assert gap_light([-0.9, -0.9], cfg)["color"] == "amber"
    assert gap_light([-0.15, -0.15], cfg)["color"] == "amber"  # the bound is inclusive
    assert gap_light([-0.14, -0.14], cfg)["label"] == "Reward tracks truth"
    assert prm_light([0.8, 0.8], cfg)["color"] == "green"
    assert prm_light([0.7, 0.7], cfg)["color"] == "amber"
    assert prm_light([0.5, 0.6], cfg)["color"] == "red"
    assert prm_light([], cfg)["color"] == "grey"


def test_danger_map_marks_frozen_high_beta_only(tmp_path):
    cfg = SimConfig(map_betas=[0.05, 1.0], map_prm_lrs=[0.0, 0.03], map_seeds=2, map_steps=60)
    result = danger.sweep(cfg, VIZ, progress=False)
    # beta 0.05: the outcome term outweighs any frozen preference; beta 1: a frozen PRM is hacked,
    # a PRM updated at 0.03 is not.
    assert result["danger"] == [[False, False], [True, False]]
    assert result["accuracy"][1][0] < 0.1 and result["accuracy"][1][1] > 0.9
    png = danger.plot(result, tmp_path / "map.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_paths_have_the_stated_outcomes():
    sim = Sim(SimConfig())
    sim.inject_shortcut()
    r = sim.rewards()
    # The starting PRM pays the shortcut more than the sound path, and the wrong path least.
    assert r[SHORTCUT] > r[SOUND] > 0 > r[WRONG]


def _all_finite(sim: Sim) -> bool:
    return all(math.isfinite(v) for h in sim.history for v in
               [h["accuracy"], h["reported"], h["prm_accuracy"], h["gap"], *h["policy"],
                *h["rewards"]]) and np.isfinite(sim.theta).all() and np.isfinite(sim.w).all()


@pytest.mark.parametrize("beta", KNOB_BOUNDS["beta"])
@pytest.mark.parametrize("prm_lr", KNOB_BOUNDS["prm_lr"])
def test_extreme_knobs_stay_finite(beta, prm_lr):
    # Every corner of the bounds, the shortcut injected after 5 steps, 600 steps online (the
    # issue's beta 10, rate 50 gave -inf rewards after 2 steps): every readout stays finite.
    sim = Sim.preset("online", SimConfig(beta=beta, prm_lr=prm_lr))
    for t in range(600):
        if t == 5:
            sim.inject_shortcut()
        sim.step()
    assert _all_finite(sim) and sim.t == 600


def test_path_rewards_do_not_overflow():
    # w . f = 1000 overflowed exp() in log Z before; log Z = logsumexp(log pi_ref + w . f).
    r = path_rewards(np.array([1000.0, 0.0, 0.0]), 2.0, 10)
    ref = np.exp(REF_LOGITS) / np.exp(REF_LOGITS).sum()
    # log Z = 1000 + log(pi_ref(sound) + pi_ref(shortcut)) up to exp(-1000); wrong path: -20 log Z
    log_z = 1000 + math.log(ref[0] + ref[1])
    assert r == pytest.approx([20 * (1000 - log_z), 20 * (1000 - log_z), -20 * log_z])


def test_a_non_finite_step_is_refused_and_not_stored():
    sim = Sim(SimConfig())
    sim.step()
    before = (sim.t, sim.theta.copy(), sim.w.copy(), len(sim.history))
    sim.w[0] = float("inf")  # as if an update had overflowed
    w = sim.w.copy()
    with pytest.raises(FloatingPointError, match="step 2 would make the toy's state non-finite"):
        sim.step()
    assert (sim.t, len(sim.history)) == (before[0], before[3])
    assert np.array_equal(sim.theta, before[1]) and np.array_equal(sim.w, w)


def test_preset_restores_its_own_knobs():
    cfg = SimConfig(beta=0.5, prm_lr=0.2)
    sim = Sim.preset("online", cfg)
    sim.set_knobs(beta=0.1, prm_lr=0.0)
    again = Sim.preset("frozen", cfg)  # what the page's preset button does
    assert (again.cfg.beta, again.cfg.prm_lr, again.cfg.prm_mode) == (0.5, 0.2, "frozen")


# The recovery figures quoted on the page and in docs/viz.md (section 1): frozen from the
# injection (after 30 warm-up steps), then online. Recovery = first step with accuracy > 0.9.
def recovery(seed: int, frozen: int, online: int) -> tuple[int | None, float]:
    sim = scene("frozen", seed, after=frozen)
    sim.set_mode("online")
    first = None
    for i in range(1, online + 1):
        sim.step()
        if first is None and sim.history[-1]["accuracy"] > 0.9:
            first = i
    return first, sim.history[-1]["accuracy"]


def test_recovery_after_a_short_and_a_long_freeze():
    # 40 frozen steps: back above 0.9 within 24-33 online steps (seeds 0-3).
    assert [recovery(s, 40, 60)[0] for s in SEEDS] == [28, 24, 33, 26]
    first, acc = recovery(1, 800, 300)  # 800 frozen steps, seed 1: 278 online steps
    assert first == 278 and acc > 0.98


@pytest.mark.slow
def test_recovery_figures():
    # 800 frozen steps: back above 0.9 after 278-471 online steps (seeds 0-3).
    assert [recovery(s, 800, 500)[0] for s in SEEDS] == [471, 278, 449, 371]
    # ~3,000 frozen steps: 1,000 online steps do not bring it back (accuracy <= 0.002).
    for s in SEEDS:
        first, acc = recovery(s, 3000, 1000)
        assert first is None and acc < 0.0025, (s, acc)
