"""Every bad input the careful-user trial of issue 13 found, through the `primekit train` CLI.

Each case must end with exit status 2 and one line on stderr naming the file, line, field or key,
and (where the input can be judged without one) before a model is loaded. The default tier calls
`primekit.cli.main` in this process (a leaked exception fails the test as a traceback would); the
slow tier runs every case as a real `primekit train` subprocess and also asserts that no traceback
is printed. Two cases run as a subprocess in the default tier too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from primekit import cli

ROOT = Path(__file__).resolve().parents[2]


def _rows(n: int, start: int = 0) -> list[dict]:
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(start, start + n)]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _base(model: Path, tmp: Path) -> list[str]:
    return [f"model.policy={model}", f"train.run_dir={tmp / 'run'}", "train.report_to=[]",
            "train.steps=1", "train.prompts_per_step=2", "train.save_every=0",
            "rollout.max_new_tokens=8", "filter.enabled=false", "eval.num_problems=2", "eval.k=1",
            "policy.mini_batch_size=8", "policy.micro_batch_size=8", "prm.mini_batch_size=8",
            "prm.micro_batch_size=8", "data.num_train=50", "data.num_eval=4", "train.threads=1",
            "train.device=cpu"]


def _file_data(tmp: Path, train: list | None = None, eval_rows: list | None = None) -> list[str]:
    out = ["data.source=file", "data.task=math",
           f"data.train_path={_write_jsonl(tmp / 'train.jsonl', train or _rows(40))}"]
    if eval_rows is not None:
        out.append(f"data.eval_path={_write_jsonl(tmp / 'eval.jsonl', eval_rows)}")
    return out


# Each case: (model dir, tmp dir) -> (extra argv, expected fragment of the one-line message).
def _few_rows(m, t):
    return _file_data(t, _rows(5)), "leave no held-out problems"


def _empty_eval(m, t):
    return _file_data(t, _rows(20), []), "eval.jsonl has no rows"


def _nan_answer(m, t):
    path = t / "train.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": 2}\n{"prompt": "2+2=", "answer": NaN}\n')
    return ["data.source=file", f"data.train_path={path}"], "train.jsonl line 2: field 'answer'"


def _inf_answer(m, t):
    path = t / "train.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": Infinity}\n')
    return ["data.source=file", f"data.train_path={path}"], "train.jsonl line 1: field 'answer'"


def _task_without_verifier(m, t):
    # A walkthrough's file (2026-12-07): rows of a task no verifier grades trained on nothing,
    # every response scored an error, and the run exited 0.
    rows = _rows(30) + [{"prompt": "g=", "answer": "9.8", "task": "physics"}]
    return (_file_data(t, rows), f"data.train_path '{t / 'train.jsonl'}': train.jsonl line 31: "
            "the row's task 'physics' has no verifier")


def _code_row_without_tests(m, t):
    rows = _rows(30) + [{"prompt": "def f(): ...", "answer": "1", "task": "code"}]
    return (_file_data(t, rows), "train.jsonl line 31: the row's task 'code' is graded by "
            "running field 'tests', which the row does not have")


def _kl_nan(m, t):
    return ["algorithm.kl_coef=.nan"], "algorithm.kl_coef: Input should be a finite number"


def _lr_inf(m, t):
    return ["policy.lr=.inf"], "policy.lr: Input should be a finite number"


def _fp16_cpu(m, t):
    return ["model.dtype=float16"], "model.dtype: float16"


def _keep_zero(m, t):
    return ["train.keep_checkpoints=0"], "train.keep_checkpoints"


def _num_eval_huge(m, t):
    return ["data.num_eval=100000"], "data.num_eval"


def _eval_zero(m, t):
    return ["eval.num_problems=0"], "eval.num_problems"


def _eval_over_heldout_file(m, t):
    return (_file_data(t, _rows(40), _rows(3, start=100)) + ["eval.num_problems=5"],
            "eval.num_problems: 5 held-out problems asked for, but data.eval_path "
            f"'{t / 'eval.jsonl'}' holds 3;")


def _eval_over_num_eval(m, t):
    return (["eval.num_problems=9"],
            "eval.num_problems: 9 held-out problems asked for, but data.num_eval=4 draws 4;")


def _rows_under_prompts_per_step(m, t):
    return (_file_data(t, _rows(6), _rows(2, start=100)) + ["train.prompts_per_step=8"],
            "train.prompts_per_step: 8 prompts per step (over all ranks) need at least 8 "
            f"training problems, but data.train_path '{t / 'train.jsonl'}' holds 6;")


def _long_prompt(m, t):
    rows = _rows(30) + [{"prompt": "1" * 2_000, "answer": "1"}]
    return _file_data(t, rows), "train.jsonl line 31: the prompt is 2000 tokens"


def _huge_prompt(m, t):
    # Past 64 x the context (512) in characters, the prompt's beginning alone refuses it: all of
    # a 50 MB prompt took the tokenizer two minutes and 19 GB.
    rows = _rows(30) + [{"prompt": "1" * 200_000, "answer": "1"}]
    return _file_data(t, rows), ("train.jsonl line 31: the prompt is 200000 characters, and its "
                                 "first 32768 alone are 32768 tokens")


def _empty_file(m, t):
    path = t / "train.jsonl"
    path.write_text("")
    return ["data.source=file", f"data.train_path={path}"], "train.jsonl has no rows"


def _blank_file(m, t):
    path = t / "train.jsonl"
    path.write_text("\n   \n\n")
    return ["data.source=file", f"data.train_path={path}"], "train.jsonl has no rows"


def _bad_utf8(m, t):
    path = t / "train.jsonl"
    path.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "\xff\xfe", "answer": "1"}\n')
    return ["data.source=file", f"data.train_path={path}"], "train.jsonl line 2: not valid UTF-8"


def _parquet(m, t):
    path = t / "train.parquet"
    path.write_bytes(b"PAR1")
    for name in ("pyarrow", "pandas"):
        try:
            __import__(name)
            pytest.skip(f"{name} is installed; the case is about a missing parquet reader")
        except ImportError:
            pass
    return (["data.source=file", f"data.train_path={path}"],
            "train.parquet: reading parquet needs pyarrow")


def _broken_yaml(m, t):
    path = t / "bad.yaml"
    path.write_text("train:\n  steps: [1, 2\n  run_dir: x\n")
    return ["--config", str(path)], "bad.yaml: not valid YAML"


def _yaml_tab(m, t):
    path = t / "bad.yaml"
    path.write_text("train:\n\tsteps: 3\n")
    return ["--config", str(path)], "bad.yaml: not valid YAML"


def _corrupt_weights(m, t):
    bad = t / "model"
    shutil.copytree(m, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return [f"model.policy={bad}"], "model.policy: "


def _garbage_weights(m, t):
    bad = t / "model"
    shutil.copytree(m, bad)
    (bad / "model.safetensors").write_bytes(b"\x00" * 64)
    return [f"model.policy={bad}"], "model.safetensors"


def _empty_model_dir(m, t):
    (t / "empty").mkdir()
    return [f"model.policy={t / 'empty'}"], "has no config.json"


def _no_tokenizer(m, t):
    bad = t / "model"
    shutil.copytree(m, bad)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bad / name).unlink()
    return [f"model.policy={bad}"], "no tokenizer"


def _missing_prm_dir(m, t):
    return [f"model.prm={t / 'nope'}"], "model.prm:"


CASES = {
    "few-train-rows": _few_rows, "empty-eval-file": _empty_eval, "nan-answer": _nan_answer,
    "inf-answer": _inf_answer, "task-without-verifier": _task_without_verifier,
    "code-row-without-tests": _code_row_without_tests, "kl-coef-nan": _kl_nan, "lr-inf": _lr_inf,
    "float16-on-cpu": _fp16_cpu, "keep-checkpoints-0": _keep_zero,
    "num-eval-huge": _num_eval_huge, "eval-num-problems-0": _eval_zero,
    "eval-num-problems-over-eval-file": _eval_over_heldout_file,
    "eval-num-problems-over-num-eval": _eval_over_num_eval,
    "train-rows-under-prompts-per-step": _rows_under_prompts_per_step,
    "long-prompt": _long_prompt, "huge-prompt": _huge_prompt, "empty-file": _empty_file, "blank-file": _blank_file,
    "invalid-utf8": _bad_utf8, "parquet-without-pyarrow": _parquet, "broken-yaml": _broken_yaml,
    "yaml-tab": _yaml_tab, "truncated-safetensors": _corrupt_weights,
    "garbage-safetensors": _garbage_weights, "empty-model-dir": _empty_model_dir,
    "no-tokenizer": _no_tokenizer, "missing-prm-dir": _missing_prm_dir,
}


def _argv(case, model: Path, tmp: Path) -> tuple[list[str], str]:
    extra, fragment = CASES[case](model, tmp)
    config = ["--config", "tiny"]
    if extra[:1] == ["--config"]:
        config, extra = extra[:2], extra[2:]
    return ["train", *config, *_base(model, tmp), *extra], fragment


def _one_line(stderr: str, fragment: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(case, tiny_model_dir, tmp_path, capsys, monkeypatch):
    argv, fragment = _argv(case, tiny_model_dir, tmp_path)
    loads = []
    import primekit.models.hf as hf

    real = hf.load_model
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    import primekit.factory as factory

    monkeypatch.setattr(factory, "load_model", hf.load_model)
    rc = cli.main(argv)
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    line = _one_line(captured.err, fragment)
    assert line.startswith("primekit: "), line
    assert not loads, f"a model was loaded before the bad input was found: {line}"


def _run_cli(argv: list[str], **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "primekit.cli", *argv], capture_output=True,
                          text=True, env=env, timeout=300, **kw)


def _assert_cli_rejects(case, model, tmp) -> None:
    argv, fragment = _argv(case, model, tmp)
    proc = _run_cli(argv)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    _one_line(proc.stderr, fragment)


@pytest.mark.parametrize("case", ["broken-yaml", "truncated-safetensors"])
def test_cli_subprocess_has_no_traceback(case, tiny_model_dir, tmp_path):
    _assert_cli_rejects(case, tiny_model_dir, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_bad_input_through_the_real_cli(case, tiny_model_dir, tmp_path):
    _assert_cli_rejects(case, tiny_model_dir, tmp_path)


def test_eval_command_refuses_more_problems_than_held_out(tiny_model_dir, capsys, monkeypatch):
    import primekit.models.hf as hf

    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    rc = cli.main(["eval", "--config", "tiny", f"model.policy={tiny_model_dir}",
                   "data.num_eval=4", "eval.num_problems=9", "eval.k=1",
                   "rollout.max_new_tokens=4", "train.device=cpu"])
    err = capsys.readouterr().err
    assert rc == 2, err
    _one_line(err, "eval.num_problems: 9 held-out problems asked for, but data.num_eval=4 "
                   "draws 4; lower eval.num_problems to at most 4")


def test_sft_refuses_a_batch_larger_than_its_demonstrations(tiny_model_dir, tmp_path, capsys,
                                                            monkeypatch):
    import primekit.trainer.sft as sft

    monkeypatch.setattr(sft, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    rc = cli.main(["sft", "--config", "tiny", f"sft.init={tiny_model_dir}",
                   f"sft.out_dir={tmp_path / 'sft'}", "data.num_train=3", "sft.batch_size=8",
                   "sft.threads=1", "train.device=cpu"])
    err = capsys.readouterr().err
    assert rc == 2, err
    _one_line(err, "sft.batch_size: 8 demonstrations per batch, but only 3 training problems "
                   "carry one; lower sft.batch_size or add demonstrations")
