"""The run's own failures (issue 13): numeric guards, graceful stop, the owned run directory,
resume's config check and write errors. In-process and fast; the kill -9 / subprocess / tmpfs
versions are in test_reliability_faults.py (slow)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from primekit import cli
from primekit.factory import build_rl_trainer
from primekit.trainer import checkpoint as ckpt
from primekit.trainer import rundir
from primekit.trainer.guards import NonFiniteError
from primekit.verifiers.base import Verdict

CONFIG = Path(__file__).resolve().parents[2] / "primekit" / "configs" / "tiny.yaml"


def _nan_verdict() -> Verdict:
    verdict = Verdict.correct()  # Verdict itself refuses NaN; a broken reward source may not
    object.__setattr__(verdict, "score", float("nan"))
    return verdict


class NaNVerifier:
    """Scores NaN for the first `bad_calls` batches, then by parity (a broken reward source)."""

    def __init__(self, bad_calls: int = 10**9):
        self.calls, self.bad_calls = 0, bad_calls

    def verify_batch(self, responses, problems):
        self.calls += 1
        if self.calls <= self.bad_calls:
            return [_nan_verdict() for _ in responses]
        return [Verdict.correct() if len(r) % 2 == 0 else Verdict.incorrect() for r in responses]


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _same(before, model):
    return all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))


def test_nonfinite_reward_aborts_naming_quantity_and_step_without_saving(rl_config):
    trainer = build_rl_trainer(rl_config("train.save_every=1"), verifier=NaNVerifier())
    with pytest.raises(NonFiniteError, match=r"step 1: reward/outcome is not finite \(16 of 16"):
        trainer.train()
    assert ckpt.latest_checkpoint(Path(trainer.cfg.train.run_dir)) is None


def test_nonfinite_reward_skip_mode_drops_the_step_and_counts_it(rl_config):
    trainer = build_rl_trainer(rl_config("train.on_nonfinite=skip"), verifier=NaNVerifier(1))
    before = _params(trainer.policy)
    first = trainer.train_step()
    assert first["train/nonfinite_skipped"] == 1.0 and first["train/skipped"] == 1.0
    assert _same(before, trainer.policy)
    trainer.step += 1
    second = trainer.train_step()
    assert second["train/nonfinite_skipped"] == 0.0 and not _same(before, trainer.policy)


def test_nonfinite_gradient_skips_optimizer_steps_or_aborts(rl_config):
    # A backward hook turns one parameter's gradient into NaN: the clipped norm is NaN.
    trainer = build_rl_trainer(rl_config("train.on_nonfinite=skip", "algorithm.reward_mode=outcome"),
                               verifier=NaNVerifier(0))
    next(trainer.policy.parameters()).register_hook(lambda g: g * float("nan"))
    before = _params(trainer.policy)
    metrics = trainer.train_step()
    # 4 prompts x 4 samples = 16 rows in mini-batches of 8, 2 PPO epochs (tiny.yaml): 4 skipped.
    assert metrics["train/nonfinite_skipped"] == 4.0
    assert _same(before, trainer.policy)
    trainer.cfg.train.on_nonfinite = "abort"
    with pytest.raises(NonFiniteError, match="step 1: policy/grad_norm is not finite"):
        trainer.train_step()


def _argv(cfg_overrides: list[str], *flags: str) -> list[str]:
    return ["train", "--config", str(CONFIG), *flags, *cfg_overrides]


def test_cli_nonfinite_abort_is_one_line_exit_1(rl_overrides, tmp_path, capsys, monkeypatch):
    import primekit.factory as factory

    monkeypatch.setattr(factory, "build_verifier", lambda *a, **k: NaNVerifier())
    rc = cli.main(_argv(rl_overrides(tmp_path / "run")))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("primekit: error: step 1: reward/outcome is not finite")


class SignalOnFirstBatch:
    """Sends this process `signum` (`times` times) while step 1 is being verified, like a Ctrl-C
    mid-step."""

    def __init__(self, signum: int, times: int = 1):
        self.signum, self.times, self.calls = signum, times, 0

    def verify_batch(self, responses, problems):
        self.calls += 1
        for _ in range(self.times if self.calls == 1 else 0):
            os.kill(os.getpid(), self.signum)
        return [Verdict.correct() if len(r) % 2 == 0 else Verdict.incorrect() for r in responses]


# SIGTERM repeats the same path (about 25 s); the default tier runs SIGINT, the slow tier both.
@pytest.mark.parametrize("signum,status", [
    (signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)])
def test_signal_mid_step_finishes_saves_and_says_how_to_resume(
        signum, status, rl_overrides, tmp_path, capsys, monkeypatch):
    import primekit.factory as factory

    monkeypatch.setattr(factory, "build_verifier", lambda *a, **k: SignalOnFirstBatch(signum))
    run = tmp_path / "run"
    overrides = rl_overrides(run, "train.steps=5", "eval.k=1", "eval.num_problems=2")
    rc = cli.main(_argv(overrides))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == status, err
    name = signal.Signals(signum).name
    assert err[0].startswith(f"primekit: {name} received: finishing the current step")
    assert len(err) == 2 and "Traceback" not in "\n".join(err)
    assert err[1].startswith(f"primekit: stopped by {name} after step 1; checkpoint "
                             f"{run}/checkpoints/step_000001; continue with: primekit train")
    assert err[1].endswith("--resume")
    assert ckpt.latest_checkpoint(run) == run / "checkpoints" / "step_000001"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    # The printed command continues the run (to step 2 here, to stay short).
    monkeypatch.setattr(factory, "build_verifier", lambda *a, **k: SignalOnFirstBatch(0, 0))
    assert cli.main(_argv(rl_overrides(run, "train.steps=2", "eval.k=1", "eval.num_problems=2"),
                          "--resume")) == 0
    assert ckpt.latest_checkpoint(run) == run / "checkpoints" / "step_000002"


def test_second_signal_abandons_the_step_without_saving(rl_overrides, tmp_path, capsys,
                                                        monkeypatch):
    import primekit.factory as factory

    monkeypatch.setattr(factory, "build_verifier",
                        lambda *a, **k: SignalOnFirstBatch(signal.SIGINT, times=2))
    run = tmp_path / "run"
    rc = cli.main(_argv(rl_overrides(run) + ["train.steps=5"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 130 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("primekit: stopped by a second SIGINT: the current step was "
                              "abandoned and not saved")
    assert ckpt.latest_checkpoint(run) is None


@pytest.mark.parametrize("wrapped", ["unexpected pos", "checkpoint exception"])
def test_second_signal_inside_the_checkpoint_write_is_a_stop(rl_overrides, tmp_path, capsys,
                                                             monkeypatch, wrapped):
    # The helper's walkthrough (2026-12-08): a second Ctrl-C while the first one's checkpoint was
    # being written surfaced as the writer's own error, a traceback (DCP's CheckpointException)
    # or "cannot write a checkpoint ... bytes free on its disk", without the --resume command.
    import primekit.factory as factory
    from primekit.trainer import signals

    class CheckpointException(BaseException):  # DCP's wraps what a writer raised; no Exception
        pass

    monkeypatch.setattr(factory, "build_verifier",
                        lambda *a, **k: SignalOnFirstBatch(signal.SIGINT, times=1))
    real = ckpt.save_checkpoint

    def writer(*args, **kwargs):  # the Ctrl-C checkpoint's write, interrupted in the middle
        try:
            signal.raise_signal(signal.SIGINT)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        except signals.Abandoned as e:
            if wrapped == "unexpected pos":  # torch.save's zip writer, cut off mid-file
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "
                                   "64 vs 0") from e
            raise CheckpointException("rank 0: Abandoned: stopped by a second SIGINT") from e
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt, "save_checkpoint", writer)
    run = tmp_path / "run"
    rc = cli.main(_argv(rl_overrides(run) + ["train.steps=5"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 130 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("primekit: stopped by a second SIGINT: the checkpoint being "
                              "written was abandoned; those written before it are intact; "
                              "continue with: primekit train "), err[-1]
    assert ckpt.latest_checkpoint(run) is None


def test_second_writer_is_refused_naming_the_holder(rl_overrides, tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        ["python", "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | "
         "os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'PID %d on host h' % "
         "os.getpid()); print('locked', flush=True); time.sleep(60)", str(run / ".lock")],
        stdout=subprocess.PIPE, text=True) if run.mkdir() is None else None
    try:
        assert holder.stdout.readline().strip() == "locked"
        rc = cli.main(_argv(rl_overrides(run)))
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"train.run_dir: '{run}' is in use by PID {holder.pid} on host h" in err[0]


def test_a_refused_command_leaves_no_directory_it_made(rl_overrides, tmp_path, capsys):
    # A walkthrough found `train.run_dir` left behind holding only `.lock` after a refusal (here:
    # --resume with no checkpoint; before it, a missing model or a bad data file did the same).
    run = tmp_path / "new" / "run"
    assert cli.main(_argv(rl_overrides(run), "--resume")) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
    assert not run.exists()
    assert (tmp_path / "new").exists()  # parents are made by mkdir(parents=True), and kept
    # A directory that was there stays, lock file and all.
    run.mkdir()
    assert cli.main(_argv(rl_overrides(run), "--resume")) == 2
    assert sorted(p.name for p in run.iterdir()) == [".lock"]


def test_fresh_run_in_a_used_directory_is_refused_unless_overwrite(rl_overrides, tmp_path,
                                                                    capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000003").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    rc = cli.main(_argv(rl_overrides(run)))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "already holds a run (checkpoints/, metrics.jsonl); continue it with --resume" in err[0]
    assert cli.main(_argv(rl_overrides(run), "--resume", "--overwrite")) == 2
    cfg_args = rl_overrides(run)
    from primekit.config import load_config

    cfg = load_config(CONFIG, cfg_args)
    rundir.check_fresh(cfg, overwrite=True)  # checks only (tests/reliability/test_rel_overwrite.py)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "checkpoints", "metrics.jsonl"]
    rundir.empty_for_overwrite(cfg)  # the CLI's, once the trainer is built
    assert [p.name for p in run.iterdir()] == [".lock"]  # kept: see rundir.lock


def _fake_checkpoint(run: Path, config: dict) -> None:
    path = run / "checkpoints" / "step_000001"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"step": 1, "config": config}))


def test_resume_refuses_a_changed_experiment_and_lists_the_changes(rl_overrides, tmp_path,
                                                                    capsys):
    from primekit.config import load_config

    run = tmp_path / "run"
    base = rl_overrides(run)
    _fake_checkpoint(run, load_config(CONFIG, base).to_dict())
    changed = base + ["algorithm.reward_mode=outcome", "prm.beta=0.1", "rollout.n_samples=2",
                      "train.steps=7"]
    rc = cli.main(_argv(changed, "--resume"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert ("was trained with a different experiment: algorithm.reward_mode 'prime' -> "
            "'outcome'; prm.beta 0.05 -> 0.1; rollout.n_samples 4 -> 2. Resume") in err[0]
    # Steps, eval cadence and logging may change; each change is printed.
    cfg = load_config(CONFIG, base + ["train.steps=7", "eval.k=1", "train.save_every=3"])
    assert rundir.check_resume(cfg) == run / "checkpoints" / "step_000001"
    out = capsys.readouterr().out
    assert "resume: train.steps 2 -> 7" in out and "resume: eval.k 2 -> 1" in out


def test_a_real_checkpoint_stores_the_config_that_resume_compares(rl_config):
    # The refusal above reads a hand-written trainer_state.json; this is the trainer's own.
    from primekit.config import ConfigError

    trainer = build_rl_trainer(rl_config())
    trainer.step = 1
    path = trainer.save()
    saved = json.loads((path / "trainer_state.json").read_text())["config"]
    assert saved == json.loads(json.dumps(trainer.cfg.to_dict()))
    with pytest.raises(ConfigError, match=r"different experiment: prm.beta 0.05 -> 0.1\. "):
        rundir.check_resume(rl_config("prm.beta=0.1"))
    assert rundir.check_resume(rl_config("train.steps=9")) == path


def test_full_disk_during_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path,
                                                                             monkeypatch):
    model = torch.nn.Linear(3, 2)
    ckpt.save_checkpoint(tmp_path, 1, models={"policy": (model, None)})

    def full(*a, **k):  # what torch.save raises when the disk fills mid-write
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(rundir.RunDirError, match=r"cannot write a checkpoint under .*: the write "
                       r"failed with \d+ bytes free on its disk .*unexpected pos.*previous "
                       r"checkpoint is intact"), rundir.write_errors(tmp_path):
        ckpt.save_checkpoint(tmp_path, 2, models={"policy": (model, None)})
    assert ckpt.latest_checkpoint(tmp_path) == ckpt.checkpoint_dir(tmp_path, 1)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["latest", "step_000001"] \
        or sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest",
                                                                            "step_000001"]
    with pytest.raises(rundir.RunDirError, match="cannot write /x/y: No space left on device"), \
            rundir.write_errors(tmp_path):
        raise OSError(28, "No space left on device", "/x/y")


@contextlib.contextmanager
def read_only_dir(tmp_path: Path):
    """A directory nobody may write to (a read-only tmpfs as root, mode 555 otherwise), undone after."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() == 0:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"running as root and cannot mount a read-only tmpfs: {proc.stderr.strip()}")
    else:
        path.chmod(0o555)
    try:
        yield path
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(path)], check=False)
        else:
            path.chmod(0o755)


def test_read_only_run_dir_is_one_line_before_any_model_loads(rl_overrides, tmp_path, capsys):
    with read_only_dir(tmp_path) as ro:
        rc = cli.main(_argv(rl_overrides(ro / "run")))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"train.run_dir: cannot write to '{ro / 'run'}': " in err[0]
    assert "Read-only file system" in err[0] or "Permission denied" in err[0]


def test_ctrl_c_while_the_command_starts_is_one_line():
    # A Ctrl-C in a command's first second, while torch loads, left a KeyboardInterrupt
    # traceback (in an experiment's run logs, for one) and exit -2; now one line and exit 130.
    # Deterministic: the CLI module itself loads nothing heavy, and a SIGINT raised where the
    # heavy imports begin (argument parsing) ends in the one line.
    import sys

    light = subprocess.run([sys.executable, "-c", "import sys, primekit.cli; "
                            "print('torch' in sys.modules)"], capture_output=True, text=True)
    assert light.stdout.strip() == "False", light.stderr
    code = ("import signal, sys\nimport primekit.cli as cli\nreal = cli.parse_args\n"
            "def parse(argv=None):\n    signal.raise_signal(signal.SIGINT)\n"
            "    return real(argv)\n"
            "cli.parse_args = parse\nsys.exit(cli.main(['train', '--config', 'tiny']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "primekit: interrupted"
