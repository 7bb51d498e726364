"""heatmap / rerank score against the reference the PRM was trained against: a run's checkpoint
records it (the demo's PRM starts from a second SFT model since 2026-12-05, so --model, the
former default, is the wrong reference for it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primekit.config import ConfigError
from primekit.viz.scoring import trained_reference


def _run(tmp: Path, *, ref, policy="runs/x/sft", reference="sft", step=160) -> Path:
    run = tmp / "prime"
    ckpt = run / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    config = {"model": {"policy": policy, "ref": ref, "prm": None}, "prm": {"reference": reference}}
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "config": config}))
    (run / "checkpoints" / "latest").write_text(ckpt.name)
    (run / "final" / "prm").mkdir(parents=True)
    (run / "export" / ckpt.name / "prm").mkdir(parents=True)
    return run


def test_the_runs_model_ref_then_its_policy(tmp_path):
    sft_prm = tmp_path / "sft-prm"
    sft_prm.mkdir()
    run = _run(tmp_path, ref=str(sft_prm))
    assert trained_reference(str(run / "final" / "prm")) == str(sft_prm)
    assert trained_reference(str(run / "export" / "step_000160" / "prm")) == str(sft_prm)
    # model.ref unset: PRIME's default, the policy's initial model (a hub id is kept as given).
    run = _run(tmp_path / "b", ref=None, policy="Qwen/Qwen2.5-Math-7B")
    assert trained_reference(str(run / "final" / "prm")) == "Qwen/Qwen2.5-Math-7B"


def test_no_recorded_reference_leaves_the_default(tmp_path):
    run = _run(tmp_path, ref=str(tmp_path), reference="rollout")  # no fixed reference
    assert trained_reference(str(run / "final" / "prm")) is None
    assert trained_reference(str(tmp_path / "some" / "prm")) is None  # not a run's
    assert trained_reference(str(run / "final" / "policy")) is None  # not a PRM
    other = _run(tmp_path / "c", ref=str(tmp_path))
    (other / "checkpoints" / "step_000160" / "trainer_state.json").unlink()  # checkpoint gone
    (other / "checkpoints" / "latest").unlink()
    assert trained_reference(str(other / "final" / "prm")) is None


def test_a_recorded_reference_that_is_gone_is_an_error(tmp_path):
    run = _run(tmp_path, ref=str(tmp_path / "deleted-sft"))
    with pytest.raises(ConfigError, match=r"--ref: the run that trained --prm .* scored against "
                       r".*deleted-sft .*which is not here; give --ref"):
        trained_reference(str(run / "final" / "prm"))
    # a run copied elsewhere: its relative `runs/demo/sft-prm` said "model directory ... does
    # not exist", as if --ref had been given
    run = _run(tmp_path / "copied", ref="runs/demo-elsewhere/sft-prm")
    with pytest.raises(ConfigError, match=r"scored against runs/demo-elsewhere/sft-prm \(its "
                       r"model.ref or model.policy, relative to where that run started\), which "
                       r"is not here; give --ref"):
        trained_reference(str(run / "final" / "prm"))
