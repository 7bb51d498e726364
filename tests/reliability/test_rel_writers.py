"""Every command that writes a run or output directory owns it and stops cleanly on a signal
(issue 13, items 3 and 5, beyond `primekit train`, which tests/trainer/test_reliability_run.py
covers): `primekit sft`, `train-orm`, `train-prm` and `demo`.

Through the real entry point (`python -m primekit.cli`) where the brief asks for it: a second
writer is refused with one line and exit status 2; SIGINT/SIGTERM mid-SFT is one line, exit
130/143, no traceback, and an earlier SFT model in sft.out_dir is left as it was. In process:
the held write (`save_model` under a signal), the demo's claim on its run directory, and the
one-line outcomes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

from primekit import cli
from primekit.trainer import rundir, signals
from primekit.trainer.outcomes import one_line_failure
from tests.trainer.test_reliability_run import SignalOnFirstBatch

ROOT = Path(__file__).resolve().parents[2]
EXPLICIT = ROOT / "primekit" / "configs" / "tiny-explicit.yaml"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "COLUMNS": "500"}


def _cli(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "primekit.cli", *argv], capture_output=True,
                          text=True, env=_env(), timeout=timeout)


def _small_sft(out: Path, *extra: str) -> list[str]:
    return ["sft", "--config", "tiny", f"sft.out_dir={out}", "sft.threads=1", "sft.batch_size=4",
            "sft.warmup_steps=1", "data.num_train=64", "data.num_eval=4", "train.report_to=[]",
            *extra]


def _rm(command: str, policy: Path, out_field: str, out: Path) -> list[str]:
    return [command, "--config", str(EXPLICIT), f"model.policy={policy}", f"{out_field}={out}",
            "rollout.max_new_tokens=8", "data.num_train=20", "data.num_eval=4",
            "train.report_to=[]", "train.threads=1", "orm.num_problems=2",
            "orm.num_eval_problems=2", "step_prm.num_problems=2", "step_prm.num_eval_problems=2"]


def _demo(run: Path) -> list[str]:
    return ["demo", "--run-dir", str(run), "sft.steps=2", "sft.threads=1", "train.steps=1",
            "train.threads=1", "data.num_train=64", "data.num_eval=4", "eval.num_problems=4",
            "eval.k=1", "train.prompts_per_step=2", "rollout.max_new_tokens=8",
            "filter.enabled=false", "train.report_to=[]"]


# Each command: (argv, the lock file it takes, the directory the refusal names).
def _writers(policy: Path, tmp: Path) -> dict[str, tuple[list[str], Path, str]]:
    sft, orm, prm, demo = tmp / "sft", tmp / "orm", tmp / "prm", tmp / "demo"
    return {
        "sft": (_small_sft(sft, "sft.steps=2"), tmp / ".sft.lock", f"sft.out_dir: '{sft}'"),
        "train-orm": (_rm("train-orm", policy, "orm.out_dir", orm), tmp / ".orm.lock",
                      f"orm.out_dir: '{orm}'"),
        "train-prm": (_rm("train-prm", policy, "step_prm.out_dir", prm), tmp / ".prm.lock",
                      f"step_prm.out_dir: '{prm}'"),
        "demo": (_demo(demo), demo / ".lock", f"demo --run-dir: '{demo}'"),
    }


def _hold(lock_file: Path) -> subprocess.Popen:
    """Another process holding `lock_file` as primekit does (flock, its PID and host inside)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR "
         "| os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'PID %d on host h' % "
         "os.getpid()); print('locked', flush=True); time.sleep(120)", str(lock_file)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


# train-orm and train-prm take the same path as sft (cli._run_to_output): the slow tier runs them.
@pytest.mark.parametrize("command", [
    "sft", "demo", pytest.param("train-orm", marks=pytest.mark.slow),
    pytest.param("train-prm", marks=pytest.mark.slow)])
def test_a_second_writer_is_refused_in_one_line(command, tiny_model_dir, tmp_path):
    argv, lock_file, named = _writers(tiny_model_dir, tmp_path)[command]
    holder = _hold(lock_file)
    try:
        proc = _cli(argv, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = _one_line(proc.stderr)
    assert line.startswith(f"primekit: configuration error: {named} is in use by PID "
                           f"{holder.pid} on host h (lock file {lock_file}); wait for it"), line


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"ended (rc {proc.returncode}) before {what}: "
                                 f"{proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


# SIGTERM repeats the same path (about 10 s); the default tier runs SIGINT, the slow tier both.
@pytest.mark.parametrize("signum,status", [
    (signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)])
def test_a_signal_mid_sft_is_one_line_and_keeps_the_earlier_model(
        signum, status, tiny_model_dir, tmp_path):
    out = tmp_path / "sft"
    shutil.copytree(tiny_model_dir, out)  # an earlier SFT's model
    before = _files(out)
    inode = out.stat().st_ino
    logs = tmp_path / "sft-logs" / "metrics.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "primekit.cli", *_small_sft(out, "sft.steps=100000")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _wait_for(lambda: logs.exists() and logs.read_text().strip(), proc, "the first SFT step")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, err[-2000:]
    name = signal.Signals(signum).name
    assert _one_line(err) == (
        f"primekit: sft stopped by {name}; sft.out_dir '{out}' is as it was (not written; the "
        f"steps taken are logged in {out}-logs); sft has no resume: run it again")
    assert out.stat().st_ino == inode and _files(out) == before
    from primekit.models.hf import load_model

    load_model(str(out))  # still loads


def test_a_signal_during_save_model_waits_for_the_write(tiny_model_dir, tmp_path, monkeypatch):
    # Ctrl-C between the two renames that replace an earlier output: the write finishes first,
    # then the signal's handler runs (here the default: KeyboardInterrupt).
    import primekit.models.hf as hf

    model = hf.load_model(str(tiny_model_dir))
    out = tmp_path / "out"
    shutil.copytree(tiny_model_dir, out)
    real_replace, calls = os.replace, []

    def replace_then_ctrl_c(src, dst):
        real_replace(src, dst)
        calls.append(dst)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(hf.os, "replace", replace_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        hf.save_model(model, None, out)
    assert len(calls) == 2  # both renames ran
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_stop_at_once_raises_interrupted_and_restores_the_handlers():
    with pytest.raises(signals.Interrupted, match="stopped by SIGTERM"), signals.stop_at_once():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_demo_refuses_a_run_dir_with_other_files_and_replaces_an_earlier_demo(
        tmp_path, capsys, monkeypatch):
    import primekit.trainer.sft as sft

    monkeypatch.setattr(sft, "run_sft", lambda cfg: pytest.fail("the demo started"))
    run = tmp_path / "demo"
    (run / "prime" / "checkpoints").mkdir(parents=True)
    (run / "notes.txt").write_text("mine")
    assert cli.main(["demo", "--run-dir", str(run)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == (f"primekit: configuration error: demo --run-dir: '{run}' holds files a demo "
                    f"does not write (notes.txt); give a new or empty --run-dir")
    assert (run / "prime" / "checkpoints").is_dir()  # nothing removed
    (run / "notes.txt").unlink()
    for name in ("sft", "sft-logs", "sft-tiny-init", "tiny-init", ".sft.old-1-abc"):
        (run / name).mkdir()
    (run / "summary.json").write_text("{}")
    from primekit.demo import claim_run_dir

    claim_run_dir(run)
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # the refused demo's lock file
    assert f"demo: replacing the earlier demo in {run}" in capsys.readouterr().out


def test_stopped_before_a_checkpoint_says_how_to_start_again(capsys):
    args = Namespace(command="train", config="tiny", overrides=["train.steps=3"])
    assert one_line_failure(signals.Stopped(signal.SIGINT, 0, None), args) == 130
    assert capsys.readouterr().err.strip() == (
        "primekit: stopped by SIGINT after step 0; no checkpoint was written (no step had "
        "finished); start again with: primekit train --config tiny train.steps=3 --overwrite")
    stop = signals.Stopped(signal.SIGTERM, 2, Path("runs/x/checkpoints/step_000002"))
    stop.command = "primekit train --config tiny --resume"
    assert one_line_failure(stop, args) == 143
    assert capsys.readouterr().err.strip().endswith(
        "checkpoint runs/x/checkpoints/step_000002; continue with: primekit train --config tiny "
        "--resume")


def test_a_second_signal_before_any_checkpoint_says_how_to_start_again(tmp_path, capsys):
    args = Namespace(command="train", config="tiny", overrides=[f"train.run_dir={tmp_path}"])
    again = shlex.join(["primekit", "train", "--config", "tiny", f"train.run_dir={tmp_path}"])
    assert one_line_failure(signals.Abandoned(signal.SIGINT), args) == 130
    assert capsys.readouterr().err.strip().endswith(f"continue with: {again} --overwrite")
    # With a complete checkpoint (a step dir holding trainer_state.json) it can be resumed.
    step = tmp_path / "checkpoints" / "step_000001"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text("{}")
    assert one_line_failure(signals.Abandoned(signal.SIGTERM), args) == 143
    assert capsys.readouterr().err.strip().endswith(f"continue with: {again} --resume")


def test_output_lock_is_beside_the_directory_and_released(tmp_path):
    out = tmp_path / "sft"
    with rundir.owned_output(out, "sft.out_dir"):
        assert (tmp_path / ".sft.lock").read_text().startswith(f"PID {os.getpid()} on host ")
        # A second open file description: flock refuses it even in the same process.
        with pytest.raises(Exception, match="sft.out_dir: .* is in use by PID"), \
                rundir.lock(out, "sft.out_dir", tmp_path / ".sft.lock"):
            pass
    with rundir.owned_output(out, "sft.out_dir"):  # released
        pass


def test_the_demo_stops_gracefully_in_its_rl_phase_and_the_printed_command_resumes(
        tmp_path, capsys, monkeypatch):
    import primekit.factory as factory
    from primekit.trainer import checkpoint as ckpt

    monkeypatch.setattr(factory, "build_verifier",
                        lambda *a, **k: SignalOnFirstBatch(signal.SIGINT))
    run = tmp_path / "demo"
    argv = _demo(run)
    argv[argv.index("train.steps=1")] = "train.steps=5"
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 130, err
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith(f"primekit: stopped by SIGINT after step 1; checkpoint "
                              f"{run}/prime/checkpoints/step_000001; continue with: primekit "
                              f"train --config tiny sft.out_dir={run / 'sft'} ")
    assert err[-1].endswith(" --resume")
    assert ckpt.latest_checkpoint(run / "prime") == run / "prime" / "checkpoints" / "step_000001"
    monkeypatch.setattr(factory, "build_verifier", lambda *a, **k: SignalOnFirstBatch(0, 0))
    words = shlex.split(err[-1].split("continue with: ")[1])
    assert cli.main([*words[1:-1], "train.steps=2", "--resume"]) == 0
    assert ckpt.latest_checkpoint(run / "prime") == run / "prime" / "checkpoints" / "step_000002"


@pytest.mark.slow
def test_sigterm_mid_train_orm_is_one_line_and_writes_nothing(tiny_model_dir, tmp_path):
    out = tmp_path / "orm"
    argv = _rm("train-orm", tiny_model_dir, "orm.out_dir", out)
    argv += ["orm.num_problems=4000", "data.num_train=4000", "orm.n_samples=8"]
    proc = subprocess.Popen([sys.executable, "-m", "primekit.cli", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    lock = tmp_path / ".orm.lock"
    try:
        _wait_for(lambda: lock.exists() and lock.read_text().strip(), proc, "the lock")
        time.sleep(2)  # into the sampling of 32000 responses (minutes)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert _one_line(err) == (
        f"primekit: train-orm stopped by SIGTERM; orm.out_dir '{out}' is as it was (not "
        f"written); train-orm has no resume: run it again")
    assert not out.exists()


def test_a_full_disk_while_writing_an_output_is_one_line(tiny_model_dir, tmp_path, capsys,
                                                         monkeypatch):
    # safetensors' Rust writer on a full disk; the earlier model stays and the temp copy goes.
    import primekit.trainer.sft as sft
    from primekit.models.hf import load_model, save_model

    out = tmp_path / "sft"
    shutil.copytree(tiny_model_dir, out)
    before = _files(out)
    model = load_model(str(tiny_model_dir))

    def full(self, *a, **k):
        raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                           "message: \"No space left on device\" })")

    monkeypatch.setattr(type(model), "save_pretrained", full)
    monkeypatch.setattr(sft, "run_sft", lambda cfg: save_model(model, None, out))
    capsys.readouterr()  # the load's progress bar
    rc = cli.main(_small_sft(out, "sft.steps=1"))
    line = _one_line(capsys.readouterr().err)
    assert rc == 1, line
    assert line.startswith(f"primekit: error: cannot write sft.out_dir under {tmp_path}: the "
                           f"write failed with ")
    assert line.endswith(f"StorageFull, message: \"No space left on device\" }})); sft.out_dir "
                         f"'{out}' is as it was")
    assert _files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".sft.lock", "sft"]


def test_a_demo_runs_to_its_summary_and_a_second_demo_replaces_it(tmp_path, capsys):
    run = tmp_path / "demo"
    assert cli.main(_demo(run)) == 0
    first = (run / "summary.json").read_text()
    assert sorted(p.name for p in run.iterdir()) == [
        ".lock", ".sft-prm.lock", ".sft.lock", "prime", "sft", "sft-logs", "sft-prm",
        "sft-prm-logs", "sft-prm-tiny-init", "sft-tiny-init", "summary.json"]
    assert cli.main(_demo(run)) == 0  # the same directory again: replaced, not mixed
    assert f"demo: replacing the earlier demo in {run}" in capsys.readouterr().out
    metrics = (run / "prime" / "metrics.jsonl").read_text().splitlines()
    # One run's lines: step 1, then its final evaluation at step 1 (two runs would give four).
    assert [json.loads(line)["step"] for line in metrics] == [1, 1]
    assert json.loads((run / "summary.json").read_text()).keys() == json.loads(first).keys()


def test_a_second_sft_starts_its_own_log_and_keeps_the_earlier_one_beside_it(tmp_path):
    # SFT has no resume: each run's metrics.jsonl holds that run only (2 steps, then 3); the
    # earlier run's log moves to metrics.previous.jsonl instead of being appended to.
    from primekit.config import load_config, resolve_config
    from primekit.trainer.sft import run_sft

    out = tmp_path / "sft"
    logs = tmp_path / "sft-logs"

    def sft(steps: int) -> list[int]:
        run_sft(load_config(resolve_config("tiny"), _small_sft(out, f"sft.steps={steps}")[3:]))
        return [json.loads(line)["step"] for line in (logs / "metrics.jsonl").read_text().splitlines()]

    assert sft(2) == [0, 1]
    assert sft(3) == [0, 2]  # logged every 25 steps and at the last
    previous = (logs / "metrics.previous.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in previous] == [0, 1]
