"""The trainer's samples.jsonl (primekit.logging.append_samples), read back by the dashboard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primekit.config import VizConfig
from primekit.factory import build_rl_trainer
from primekit.viz.dashboard import RunFollower


def test_rl_run_writes_samples_the_dashboard_reads(rl_config):
    cfg = rl_config("train.steps=1", "viz.samples_per_step=3")
    trainer = build_rl_trainer(cfg)
    trainer.train()
    run = Path(cfg.train.run_dir)
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 1, 1]
    assert trainer.last_experience is None  # cleared once written
    for r in rows:
        assert len(r["tokens"]) == len(r["token_rewards"]) > 0
        assert r["status"] in ("correct", "incorrect", "error", "timeout")
        assert 0.0 <= r["score"] <= 1.0
        # The decoded tokens spell the response (the tiny model's tokens are characters; EOS
        # is decoded by name and dropped from the response text).
        assert "".join(r["tokens"]).startswith(r["response"])
    # PRIME's PRM starts as the policy's copy: step 1's rewards are exactly zero (DESIGN.md 2).
    assert all(x == 0.0 for r in rows for x in r["token_rewards"])
    follower = RunFollower(run)
    follower.poll()
    assert [s["step"] for s in follower.samples] == [1, 1, 1]
    assert len(follower.rows) == 2  # the step and the final evaluation's line
    # The gap light from the real metrics: sigmoid(0) = 0.5 predicted, minus the batch accuracy.
    step = follower.rows[0]
    assert step["reward/implicit_seq_mean"] == 0.0
    gap = follower.lights(VizConfig())["gap"]
    assert gap["value"] == pytest.approx(0.5 - step["reward/outcome_mean"])

