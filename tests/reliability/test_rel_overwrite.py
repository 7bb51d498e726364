"""Issue 22 point 1: every command that writes a directory checks everything it can (config, data
files, models, output location) before it deletes or writes anything; `--overwrite` empties only
a directory holding a training run; a model output directory is never a training run.

In process through `cli.main`, each case failing before any model loads (seconds each)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from primekit import cli
from primekit.trainer import rundir

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "primekit" / "configs" / "tiny.yaml"
EXPLICIT = ROOT / "primekit" / "configs" / "tiny-explicit.yaml"


def _training_run(run: Path) -> dict[str, bytes]:
    """A directory holding what `primekit train` writes; returns its files and contents."""
    step = run / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text('{"step": 2}\n')
    (run / "checkpoints" / "latest").write_text("step_000002\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "samples.jsonl").write_text('{"step": 2}\n')
    return _snapshot(run)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _train(run: Path, policy: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(TINY), "--overwrite", f"train.run_dir={run}",
            f"model.policy={policy}", "train.report_to=[]", "data.num_train=64",
            "data.num_eval=8", "eval.num_problems=8", *extra]


# Any input `primekit train` reads, broken: the config, a data file, each model directory.
BAD_TRAIN_INPUTS = {
    "missing-data-file": (["data.source=file", "data.train_path={tmp}/TYPO.jsonl"],
                          "TYPO.jsonl"),
    "bad-data-row": (["data.source=file", "data.train_path={tmp}/rows.jsonl"], "rows.jsonl"),
    "missing-policy": (["model.policy={tmp}/nope"], "model.policy"),
    "missing-prm": (["model.prm={tmp}/nope"], "model.prm"),
    "empty-ref": (["model.ref={tmp}/empty"], "model.ref"),
    "lr-beyond-float32": (["policy.lr=1e39"], "policy.lr"),
    "unknown-field": (["train.stepz=3"], "train.stepz"),
}


@pytest.mark.parametrize("case", list(BAD_TRAIN_INPUTS))
def test_overwrite_checks_every_input_before_deleting(case, tiny_model_dir, tmp_path, capsys):
    overrides, named = BAD_TRAIN_INPUTS[case]
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1"}\n')  # no answer
    (tmp_path / "empty").mkdir()
    run = tmp_path / "run"
    before = _training_run(run)
    argv = _train(run, tiny_model_dir, *(o.format(tmp=tmp_path) for o in overrides))
    assert cli.main(argv) == 2
    assert named in _one_line(capsys)
    assert _snapshot(run) == before  # nothing deleted


def test_overwrite_refuses_a_directory_that_is_not_a_training_run(tiny_model_dir, tmp_path,
                                                                  capsys):
    run = tmp_path / "run"
    _training_run(run)
    (run / "notes.txt").write_text("my notes")
    before = _snapshot(run)
    assert cli.main(_train(run, tiny_model_dir)) == 2
    line = _one_line(capsys)
    assert (f"--overwrite: train.run_dir '{run}' holds files primekit train does not write "
            f"(notes.txt); it is not a training run, so nothing was deleted") in line
    assert _snapshot(run) == before
    # A model directory is not a training run either.
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    before = _snapshot(model)
    assert cli.main(_train(model, tiny_model_dir)) == 2
    assert "config.json" in _one_line(capsys) and _snapshot(model) == before


def test_overwrite_empties_a_training_run_only_once_the_trainer_is_built(monkeypatch, tmp_path,
                                                                         tiny_model_dir):
    import primekit.factory as factory

    run = tmp_path / "run"
    before = _training_run(run)
    seen = {}

    class Trainer:
        def train(self):
            seen["at_train"] = _snapshot(run)

    def build(cfg, resume=False):
        seen["at_build"] = _snapshot(run)  # validation and model loading happen in here
        return Trainer()

    monkeypatch.setattr(factory, "build_rl_trainer", build)
    assert cli.main(_train(run, tiny_model_dir)) == 0
    assert seen == {"at_build": before, "at_train": {}}


def _rm(command: str, policy: Path, field: str, out: Path, *extra: str) -> list[str]:
    return [command, "--config", str(EXPLICIT), f"model.policy={policy}", f"{field}={out}",
            "data.num_train=20", "data.num_eval=4", "train.report_to=[]", *extra]


def _writers(policy: Path, out: Path, *extra: str) -> dict[str, list[str]]:
    return {
        "sft": ["sft", "--config", str(TINY), f"sft.out_dir={out}", "train.report_to=[]",
                *extra],
        "train-orm": _rm("train-orm", policy, "orm.out_dir", out, *extra),
        "train-prm": _rm("train-prm", policy, "step_prm.out_dir", out, *extra),
    }


@pytest.mark.parametrize("command", ["sft", "train-orm", "train-prm"])
def test_a_model_output_that_holds_a_training_run_is_refused(command, tiny_model_dir, tmp_path,
                                                             capsys):
    run = tmp_path / "run"
    before = _training_run(run)
    argv = _writers(tiny_model_dir, run)[command]
    assert cli.main(argv) == 2
    field = {"sft": "sft.out_dir", "train-orm": "orm.out_dir",
             "train-prm": "step_prm.out_dir"}[command]
    assert _one_line(capsys).startswith(
        f"primekit: configuration error: {field}: '{run}' holds a training run (checkpoints/, "
        f"metrics.jsonl, samples.jsonl), which this command would replace with its model; "
        f"nothing was written")
    assert _snapshot(run) == before
    # An earlier model in it is what these commands replace: accepted by the check.
    rundir.check_model_output(tiny_model_dir, field)


@pytest.mark.parametrize("command", ["sft", "train-orm", "train-prm", "demo"])
def test_writers_check_their_data_and_models_before_touching_the_output(command, tiny_model_dir,
                                                                        tmp_path, capsys):
    out = tmp_path / "out" / "model"
    bad = ["data.source=file", f"data.train_path={tmp_path}/TYPO.jsonl"]
    if command == "demo":
        demo = tmp_path / "demo"  # an earlier demo, which a new demo would replace
        (demo / "sft").mkdir(parents=True)
        (demo / "summary.json").write_text("{}")
        argv = ["demo", "--run-dir", str(demo), *bad]
    else:
        argv = _writers(tiny_model_dir, out, *bad)[command]
    assert cli.main(argv) == 2
    assert "TYPO.jsonl" in _one_line(capsys)
    if command == "demo":
        assert sorted(p.name for p in demo.iterdir()) == ["sft", "summary.json"]
    else:
        assert not (tmp_path / "out").exists()  # not even the lock file beside the output
    # A missing starting model, likewise.
    init = {"sft": "sft.init", "train-orm": "orm.base", "train-prm": "step_prm.base",
            "demo": "sft.init"}[command]
    argv = [a for a in argv if not a.startswith("data.")] + [f"{init}=./no/such/model"]
    assert cli.main(argv) == 2
    assert init in _one_line(capsys)
    assert not (tmp_path / "out").exists()
