"""Issue 22 points 3-6: a stop honoured after the last step, an atomic final export with true
messages, checksummed checkpoints (a damaged one falls back or is refused in one line), resume
refusing changed input files, a smaller train.steps and a second final evaluation, samples.jsonl
truncated on resume, and `primekit export` / `primekit eval` failures in one line.

One real 2-step run (`finished`, module scope) is copied by each test that needs a run."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from primekit import cli
from primekit.config import ConfigError, load_config
from primekit.trainer import checkpoint as ckpt
from primekit.trainer import rundir
from tests.trainer.conftest import small_overrides
from tests.trainer.test_reliability_run import SignalOnFirstBatch, read_only_dir

CONFIG = Path(__file__).resolve().parents[2] / "primekit" / "configs" / "tiny.yaml"
FAST = ("train.save_every=1", "eval.k=1", "eval.num_problems=2")


def _argv(overrides: list[str], *flags: str) -> list[str]:
    return ["train", "--config", str(CONFIG), *flags, *overrides]


def _parity(monkeypatch, signum: int = 0, times: int = 0) -> None:
    import primekit.factory as factory

    monkeypatch.setattr(factory, "build_verifier",
                        lambda *a, **k: SignalOnFirstBatch(signum, times))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def finished(sft_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(run dir, policy dir) of a complete 2-step run, checkpoints of steps 1 and 2, final/;
    the policy is a copy of the SFT model that tests may change."""
    root = tmp_path_factory.mktemp("finished")
    policy = root / "policy"
    shutil.copytree(sft_model_dir, policy)
    run = root / "run"
    mp = pytest.MonkeyPatch()
    try:
        _parity(mp)
        assert cli.main(_argv(small_overrides(policy, run) + list(FAST))) == 0
    finally:
        mp.undo()
    return run, policy


def _copy(finished, tmp_path) -> tuple[Path, list[str]]:
    """A copy of the finished run, and the overrides that continue it (same policy)."""
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    return run, small_overrides(finished[1], run) + list(FAST)


# --- 3: a stop after the last step; the final export --------------------------------------------


def test_a_signal_during_the_last_step_saves_it_and_stops_before_the_final_evaluation(
        rl_overrides, tmp_path, capsys, monkeypatch):
    _parity(monkeypatch, signal.SIGTERM, 1)  # SIGTERM while step 1 (the last) is verified
    run = tmp_path / "run"
    rc = cli.main(_argv(rl_overrides(run, "train.steps=1", "eval.k=1", "eval.num_problems=2")))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 143, err  # was 0: the final evaluation and export ran, nothing said
    assert err[-1].startswith(f"primekit: stopped by SIGTERM after step 1; checkpoint "
                              f"{run}/checkpoints/step_000001; continue with:")
    assert ckpt.latest_checkpoint(run) == run / "checkpoints" / "step_000001"
    assert not (run / "final").exists()
    assert not any(k.startswith("eval/") for row in _rows(run / "metrics.jsonl") for k in row)


def test_a_full_disk_during_the_final_export_leaves_no_final_and_says_so(finished, tmp_path,
                                                                        capsys, monkeypatch):
    from transformers import PreTrainedModel

    run, overrides = _copy(finished, tmp_path)
    shutil.rmtree(run / "final")
    real, calls = PreTrainedModel.save_pretrained, []

    def full_on_second(self, out, *a, **k):  # policy written, then the disk is full at the PRM
        calls.append(out)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(out))
        return real(self, out, *a, **k)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_on_second)
    _parity(monkeypatch)
    rc = cli.main(_argv(overrides, "--resume"))  # at train.steps: straight to the export
    err = capsys.readouterr().err.strip().splitlines()
    step2 = run / "checkpoints" / "step_000002"
    assert rc == 1 and err[-1].startswith("primekit: error: cannot write "), err
    assert err[-1].endswith(f"No space left on device; {step2} is complete and {run / 'final'} "
                            f"was not written; `primekit export {run} --step 2 --out "
                            f"{run / 'final'}` writes it")
    assert not (run / "final").exists() and not list(run.glob(".final*"))  # none, not half


def test_a_second_signal_during_the_final_export_leaves_no_final_and_says_so(
        finished, tmp_path, capsys, monkeypatch):
    from transformers import PreTrainedModel

    run, overrides = _copy(finished, tmp_path)
    shutil.rmtree(run / "final")
    real, calls = PreTrainedModel.save_pretrained, []

    def two_signals_on_second(self, out, *a, **k):
        calls.append(out)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # sets the flag
            os.kill(os.getpid(), signal.SIGINT)  # abandons
        return real(self, out, *a, **k)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", two_signals_on_second)
    _parity(monkeypatch)
    rc = cli.main(_argv(overrides, "--resume"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 130, err
    assert (f"primekit: stopped by a second SIGINT: checkpoint {run}/checkpoints/step_000002 of "
            f"the last step is complete; the export to final/ was abandoned (final/ not "
            f"written); continue with:") in err[-1]
    assert not (run / "final").exists() and not list(run.glob(".final*"))


# --- 6: resume at or below train.steps ----------------------------------------------------------


def test_resume_at_train_steps_does_not_rerun_the_final_evaluation(finished, tmp_path, capsys,
                                                                   monkeypatch):
    run, overrides = _copy(finished, tmp_path)
    before = _rows(run / "metrics.jsonl")
    _parity(monkeypatch)
    assert cli.main(_argv(overrides, "--resume")) == 0
    assert "is recorded in" in capsys.readouterr().out
    assert _rows(run / "metrics.jsonl") == before  # no second final row
    assert (run / "final" / "policy" / "model.safetensors").is_file()


def test_resume_with_fewer_steps_than_done_is_one_line(finished, tmp_path, capsys):
    run, overrides = _copy(finished, tmp_path)
    assert cli.main(_argv(overrides + ["train.steps=1"], "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"primekit: configuration error: train.steps: 1, but the checkpoint "
        f"{run}/checkpoints/step_000002 is already at step 2"), err


def test_resume_truncates_samples_and_metrics_to_the_checkpoint(finished, tmp_path,
                                                                monkeypatch):
    run, overrides = _copy(finished, tmp_path)
    # As if killed after step 2's rows were written but before its checkpoint.
    shutil.rmtree(run / "checkpoints" / "step_000002")
    (run / "checkpoints" / "latest").write_text("step_000001\n")
    shutil.rmtree(run / "final")
    assert {r["step"] for r in _rows(run / "samples.jsonl")} == {1, 2}
    _parity(monkeypatch)
    assert cli.main(_argv(overrides + ["train.steps=1"], "--resume")) == 0
    assert {r["step"] for r in _rows(run / "samples.jsonl")} == {1}  # was {1, 2}
    assert {r["step"] for r in _rows(run / "metrics.jsonl")} == {1}


# --- 4: the files the run started from ----------------------------------------------------------


def test_resume_refuses_changed_model_or_data_files_by_name(finished, tmp_path):
    run, overrides = _copy(finished, tmp_path)
    policy = tmp_path / "policy"  # a copy of the run's policy, then changed
    shutil.copytree(finished[1], policy)
    overrides = [o for o in overrides if not o.startswith("model.policy=")]
    cfg = load_config(CONFIG, overrides + [f"model.policy={finished[1]}"])
    assert rundir.check_resume(cfg) == run / "checkpoints" / "step_000002"  # unchanged: fine
    config = json.loads((policy / "config.json").read_text())
    (policy / "config.json").write_text(json.dumps(config, indent=4))  # same values, new bytes
    state = json.loads((run / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    state["config"]["model"]["policy"] = str(policy)  # the run as if started from the copy
    state["inputs"]["model.policy"] = rundir.input_fingerprint(
        load_config(CONFIG, [f"model.policy={finished[1]}"]))["model.policy"]
    (run / "checkpoints" / "step_000002" / "trainer_state.json").write_text(json.dumps(state))
    cfg = load_config(CONFIG, overrides + [f"model.policy={policy}"])
    with pytest.raises(ConfigError, match=rf"--resume: the files .*step_000002 was trained from "
                                          rf"changed since: model.policy '{policy}': config.json "
                                          rf"\d+ -> \d+ bytes"):
        rundir.check_resume(cfg)
    assert rundir.check_resume(cfg, anyway=True) == run / "checkpoints" / "step_000002"


def test_the_checkpoint_fingerprints_the_data_files(tmp_path):
    train = tmp_path / "train.jsonl"
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(30)]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(CONFIG, ["data.source=file", f"data.train_path={train}",
                               f"model.policy={tmp_path}/none"])
    saved = rundir.input_fingerprint(cfg)
    assert list(saved) == ["data.train_path"]  # the policy directory does not exist here
    train.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))  # reordered
    assert rundir.input_changes(saved, rundir.input_fingerprint(cfg), cfg) == [
        f"data.train_path '{train}': train.jsonl content changed (sha256 "
        f"{saved['data.train_path']['train.jsonl']['sha256'][:10]} -> "
        f"{rundir.input_fingerprint(cfg)['data.train_path']['train.jsonl']['sha256'][:10]})"]


def test_resume_ignores_sections_that_are_not_the_experiment():
    refused, allowed = rundir.config_changes(
        {"sim": {"port": 1}, "viz": {"out_dir": "a"}, "prm": {"beta": 0.05}},
        {"sim": {"port": 2}, "viz": {"out_dir": "b"}, "prm": {"beta": 0.1}})
    assert refused == ["prm.beta 0.05 -> 0.1"]
    assert allowed == ["sim.port 1 -> 2", "viz.out_dir 'a' -> 'b'"]


# --- 5: damaged checkpoints ---------------------------------------------------------------------


def _shard(path: Path) -> Path:
    return max((path / ckpt.WEIGHTS).glob("*.distcp"), key=lambda p: p.stat().st_size)


def test_a_damaged_latest_checkpoint_falls_back_with_a_warning_or_is_refused(finished, tmp_path,
                                                                            capsys):
    run, overrides = _copy(finished, tmp_path)
    step1, step2 = run / "checkpoints" / "step_000001", run / "checkpoints" / "step_000002"
    assert ckpt.damage(step2) is None and ckpt.intact_checkpoint(run) == step2
    shard = _shard(step2)
    with open(shard, "r+b") as f:  # 1024 finite wrong floats in place: same size
        f.seek(4096)
        f.write(b"\x00\x00\x80\x3f" * 256)
    assert ckpt.damage(step2) == (f"weights/{shard.name}: content differs from its recorded "
                                  f"SHA-256")
    with pytest.warns(UserWarning, match="checkpoint step_000002 is damaged .*; using "
                                         "step_000001"):
        assert ckpt.intact_checkpoint(run) == step1
    with pytest.raises(ckpt.CheckpointDamaged, match="is damaged"):
        ckpt.load_checkpoint(step2)
    # rng.pt truncated in the other one: none is intact, refused in one line.
    rng = step1 / "rng.pt"
    size = rng.stat().st_size
    rng.write_bytes(rng.read_bytes()[: size // 2])
    assert cli.main(_argv(overrides, "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == (
        f"primekit: configuration error: --resume: no intact checkpoint under "
        f"{run / 'checkpoints'}: step_000002: weights/{shard.name}: content differs from its "
        f"recorded SHA-256; step_000001: rng.pt: {size // 2} bytes, {size} recorded")
    # export of the damaged checkpoint: one line, exit 2, nothing written.
    assert cli.main(["export", str(run), "--step", "2", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is damaged" in err[0] and not (tmp_path / "x").exists()


def test_export_of_random_bytes_without_checksums_is_one_line(finished, tmp_path, capsys):
    run, _ = _copy(finished, tmp_path)
    step2 = run / "checkpoints" / "step_000002"
    (step2 / ckpt.CHECKSUMS).unlink()  # as written before checksums existed: not verified
    shard = _shard(step2)
    shard.write_bytes(os.urandom(shard.stat().st_size))
    rc = cli.main(["export", str(run), "--step", "2", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    # Unreadable (exit 2) or read as NaN weights (exit 1): one line either way, was a traceback.
    assert rc in (1, 2) and len(err) == 1 and err[0].startswith(
        f"primekit: error: checkpoint {step2}: "), err
    assert "the weights of 'policy' cannot be read" in err[0] or "is not finite" in err[0]
    assert not (tmp_path / "x").exists()


# --- 6: export --out and eval --model -----------------------------------------------------------


def test_export_through_the_module_entry_point(finished, tmp_path):
    # `python -m primekit.cli export` (as under torchrun) reaches _export: the module's main block
    # once stood above _export's definition, so this path raised NameError where `primekit
    # export` worked.
    out = tmp_path / "x"
    done = subprocess.run([sys.executable, "-m", "primekit.cli", "export", str(finished[0]),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (out / "policy" / "config.json").is_file(), sorted(p.name for p in out.iterdir())


def test_export_to_a_read_only_location_is_one_line(finished, tmp_path, capsys):
    with read_only_dir(tmp_path) as ro:
        rc = cli.main(["export", str(finished[0]), "--out", str(ro / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err  # was a traceback
    # (the path named is the temp directory beside --out that the export writes first)
    assert err[0].startswith(f"primekit: error: cannot write {ro}/")
    assert err[0].endswith(f"; {ro / 'out'} is as it was")


@pytest.mark.parametrize("case", ["empty-dir", "run-dir", "checkpoint-dir", "deep-typo"])
def test_eval_model_that_is_not_a_model_is_one_line(case, finished, tmp_path, capsys):
    where = {"empty-dir": tmp_path / "empty", "run-dir": finished[0],
             "checkpoint-dir": finished[0] / "checkpoints" / "step_000001",
             "deep-typo": Path("runs") / "demo" / "sfft"}[case]
    if case == "empty-dir":
        where.mkdir()
    rc = cli.main(["eval", "--config", str(CONFIG), "--model", str(where), "data.num_eval=4",
                   "eval.num_problems=4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    expected = {"empty-dir": "has no config.json", "run-dir": "is a training run or checkpoint",
                "checkpoint-dir": "is a training run or checkpoint",
                "deep-typo": "does not exist"}[case]
    assert expected in err[0]


def test_eval_model_hub_id_is_checked_in_one_request(monkeypatch):
    import huggingface_hub
    from huggingface_hub.utils import RepositoryNotFoundError

    from primekit.validate import check_eval_model

    class NotFound(RepositoryNotFoundError):
        def __init__(self):
            Exception.__init__(self, "404")

    asked = []

    def model_info(name, timeout=None):
        asked.append((name, timeout))
        raise NotFound()

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    with pytest.raises(ConfigError, match="'sfft' is no local directory, and the Hugging Face "
                                          "hub has no model of that id"):
        check_eval_model("sfft")
    assert asked == [("sfft", 10)]  # one request with a timeout, no retries


def test_a_training_model_that_is_no_directory_is_checked_in_one_request(monkeypatch):
    # `model.prm=my_runs/prm` (a typo'd local path, shaped like a hub id) used to cost 30 s of
    # transformers' retries and end in a traceback; `a/b/c` (no hub id) a line without the field.
    import huggingface_hub

    from primekit.validate import check_model_dir

    asked = []

    def model_info(name, timeout=None):
        asked.append(name)
        raise ConnectionError("offline")

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    with pytest.raises(ConfigError, match="^model.prm: 'my_runs/prm' is no local directory and no "
                                          "cached hub model"):
        check_model_dir("my_runs/prm", "model.prm")
    with pytest.raises(ConfigError, match="^model.ref: model directory 'my_runs/sft/nope' does "
                                          "not exist$"):
        check_model_dir("my_runs/sft/nope", "model.ref")
    assert asked == ["my_runs/prm"]
