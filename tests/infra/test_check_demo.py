"""`.ci/check_demo.py`: which demo runs it passes and which it fails, on hand-made metrics."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check_demo():
    spec = importlib.util.spec_from_file_location("check_demo", ROOT / ".ci" / "check_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demo(tmp_path: Path, losses: list[float], pairwise: list[float], *, sft=(0.80, 0.69),
         rl=(0.85, 0.80)) -> Path:
    """A `primekit demo --run-dir` with these per-step PRM losses and pairwise accuracies."""
    run = tmp_path / "demo"
    (run / "prime").mkdir(parents=True)
    summary = {"sft": {"eval/pass@1_greedy": sft[0], "eval/avg@4": sft[1]},
               "prime": {"eval/pass@1_greedy": rl[0], "eval/avg@4": rl[1]}, "wall_s": 380.0}
    (run / "summary.json").write_text(json.dumps(summary))
    rows = [{"step": i + 1, "prm/loss": lo, "prm/acc_pairwise": pw}
            for i, (lo, pw) in enumerate(zip(losses, pairwise))]
    (run / "prime" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_healthy_runs_pass(check_demo, tmp_path):
    # The highest healthy second-half loss measured (0.6951, a packed demo, pairwise 0.573): the
    # first half is ignored, the second half's mean is 0.6951 < 0.700.
    run = demo(tmp_path, [0.80] * 80 + [0.6941, 0.6961] * 40, [0.40] * 80 + [0.573] * 80)
    assert check_demo.check(run) == []


def test_a_prm_never_updated_fails(check_demo, tmp_path):
    # Rewards all 0: loss exactly ln 2 (below the loss bound) but every pair a tie, pairwise 0.5.
    run = demo(tmp_path, [math.log(2)] * 160, [0.5] * 160)
    (failure,) = check_demo.check(run)
    assert "PRM pairwise accuracy 0.500 < 0.52 (the PRM is not learning)" in failure


def test_a_diverging_prm_fails(check_demo, tmp_path):
    # danger-zone's lr 1e-3 arithmetic runs: second-half loss 0.708-0.723, pairwise 0.40-0.45.
    run = demo(tmp_path, [0.70] * 80 + [0.7082] * 80, [0.5] * 80 + [0.454] * 80)
    failures = check_demo.check(run)
    assert len(failures) == 2
    assert "PRM loss 0.7082 > 0.7 (the PRM is diverging)" in failures[0]
    assert "pairwise accuracy 0.454" in failures[1]


def test_a_policy_that_does_not_learn_fails(check_demo, tmp_path):
    # avg@4 0.69 -> 0.72 is +3 points (< +5); greedy 0.80 -> 0.76 falls 4 points (< -3).
    run = demo(tmp_path, [0.688] * 160, [0.59] * 160, rl=(0.76, 0.72))
    failures = check_demo.check(run)
    assert [f.split(": ", 1)[1] for f in failures] == ["avg@4 gain +3.0 < +5 points",
                                                        "greedy gain -4.0 < -3"]


def test_greedy_may_dip_by_less_than_three_points(check_demo, tmp_path):
    # greedy 0.80 -> 0.78 (-2 points) with avg@4 0.69 -> 0.80 (+11): a healthy run's rounding.
    assert check_demo.check(demo(tmp_path, [0.688] * 160, [0.59] * 160, rl=(0.78, 0.80))) == []
