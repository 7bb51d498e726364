"""Fault injection through the real `primekit train` (slow tier): kill -9 at each phase of a
save then `--resume`, SIGINT and SIGTERM mid-run, two writers on one run directory, a full disk.

The save phases are reached with the checkpoint module's test hook PRIMEKIT_FAULT="<phase>@<step>"
(primekit/trainer/checkpoint.py), which SIGKILLs the process there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from primekit.trainer import checkpoint as ckpt

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "primekit" / "configs" / "tiny.yaml"


def _cmd(overrides: list[str], *flags: str) -> list[str]:
    return [sys.executable, "-m", "primekit.cli", "train", "--config", str(CONFIG), *flags,
            *overrides]


def _env(**extra: str) -> dict[str, str]:
    # Wide enough that rich does not wrap the "resumed from <path>" line.
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "COLUMNS": "500",
            **extra}


def _train(overrides: list[str], *flags: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(overrides, *flags), capture_output=True, text=True,
                          env=_env(**env), timeout=900)


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    exported = ckpt.export_checkpoint(ckpt.checkpoint_dir(run, step), run / f"export-{step}",
                                      ("policy", "prm"))
    for name, where in exported.items():
        for key, value in load_file(where / "model.safetensors").items():
            out[f"{name}/{key}"] = value
    return out


_REFERENCE: dict[tuple, Path] = {}


def _reference(rl_overrides, tmp_path_factory, extra: tuple[str, ...]) -> Path:
    """An uninterrupted 3-step run with the same settings (once per settings)."""
    if extra not in _REFERENCE:
        run = tmp_path_factory.mktemp("reference") / "run"
        proc = _train(rl_overrides(run, *FAULT_ARGS, *extra))
        assert proc.returncode == 0, proc.stderr
        _REFERENCE[extra] = run
    return _REFERENCE[extra]


FAULT_ARGS = ("train.steps=3", "train.save_every=1", "eval.k=1", "eval.num_problems=4")


@pytest.mark.parametrize("phase,extra", [
    ("weights", ()), ("prm", ()), ("state", ()), ("renamed", ()), ("latest", ()),
    # Old log-probs recomputed (what auto picks with vLLM; tiny.yaml reuses the sampler's): exact too.
    ("state", ("policy.old_logprobs=recompute",)),
], ids=["weights", "prm", "state", "renamed", "latest", "state-recompute"])
def test_kill_9_at_each_save_phase_then_resume_reaches_identical_weights(
        phase, extra, rl_overrides, tmp_path, tmp_path_factory):
    reference = _reference(rl_overrides, tmp_path_factory, extra)
    run = tmp_path / "run"
    overrides = rl_overrides(run, *FAULT_ARGS, *extra)
    killed = _train(overrides, PRIMEKIT_FAULT=f"{phase}@2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # Until `latest` names step 2 the run resumes from step 1 (and saves step 2 again).
    survivor = 2 if phase == "latest" else 1
    assert ckpt.latest_checkpoint(run) == ckpt.checkpoint_dir(run, survivor)
    resumed = _train(overrides, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {ckpt.checkpoint_dir(run, survivor)} at step {survivor}" in resumed.stdout
    want, got = _weights(reference, 3), _weights(run, 3)
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"training ended (rc {proc.returncode}) before {what}: "
                                 f"{proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_run_saves_and_resumes_and_a_second_writer_is_refused(
        signum, status, rl_overrides, tmp_path):
    run = tmp_path / "run"
    overrides = rl_overrides(run, "train.steps=200", "eval.k=1")
    proc = subprocess.Popen(_cmd(overrides), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    try:
        _wait_for(lambda: _lines(run / "metrics.jsonl") >= 1, proc, "the first step")
        second = _train(rl_overrides(run, "train.steps=2"))
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert f"is in use by PID {proc.pid} on host" in second.stderr.strip()
    assert proc.returncode == status, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    name = signal.Signals(signum).name
    assert last.startswith(f"primekit: stopped by {name} after step ")
    step = int(last.split("after step ")[1].split(";")[0])
    assert f"checkpoint {ckpt.checkpoint_dir(run, step)}" in last
    assert ckpt.latest_checkpoint(run) == ckpt.checkpoint_dir(run, step)
    resumed = _train(rl_overrides(run, f"train.steps={step + 1}", "eval.k=1"), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert ckpt.latest_checkpoint(run) == ckpt.checkpoint_dir(run, step + 1)


def test_full_disk_is_one_line_and_keeps_the_previous_checkpoint(rl_overrides, tmp_path,
                                                                 sft_model_dir):
    # A checkpoint holds two models (policy, PRM) and AdamW's two moments of each: about 6x the
    # model file. A tmpfs of 9x holds the first checkpoint, not the second beside it.
    size = (sft_model_dir / "model.safetensors").stat().st_size * 9
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        run = disk / "run"
        proc = _train(rl_overrides(run, "train.steps=3", "train.save_every=1", "eval.k=1"))
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        last = proc.stderr.strip().splitlines()
        assert len(last) == 1, proc.stderr
        assert last[0].startswith("primekit: error: cannot write")
        assert "previous checkpoint is intact" in last[0]
        assert ckpt.latest_checkpoint(run) == ckpt.checkpoint_dir(run, 1)
        assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
        _weights(run, 1)  # loads
    finally:
        subprocess.run(["umount", str(disk)], check=False)
