"""MetricLogger sinks, the progress display and summary tables."""

from __future__ import annotations

import io
import json
import math
import sys
import types

import numpy as np
import pytest
import torch
from rich.console import Console

from primekit.logging import MetricLogger, Progress, print_table


def strict_lines(path) -> list[dict]:
    """Parse every line as strict JSON: a bare NaN/Infinity token would raise."""

    def reject(token: str):
        raise ValueError(f"non-standard JSON token {token}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def test_jsonl_is_strict_json_per_line_and_flushed_before_close(tmp_path):
    logger = MetricLogger(tmp_path, tensorboard=False)
    logger.log({"reward/mean": 0.5, "prm/acc": float("nan"), "n": 3}, step=1)
    logger.log(
        {
            "policy/loss": torch.tensor(-1.25),
            "x/inf": float("inf"),
            "x/neg": -math.inf,
            "x/np": np.float32(0.25),
        },
        step=2,
    )
    # Not closed yet: a crash now must not lose these lines.
    records = strict_lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["reward/mean"] == 0.5 and records[0]["n"] == 3
    assert records[0]["prm/acc"] == "nan" and math.isnan(float(records[0]["prm/acc"]))
    assert records[1]["policy/loss"] == -1.25 and records[1]["x/np"] == 0.25
    assert (records[1]["x/inf"], records[1]["x/neg"]) == ("inf", "-inf")
    assert float(records[1]["x/neg"]) == -math.inf
    assert all(isinstance(r["time"], float) for r in records)
    logger.close()
    logger.close()  # idempotent


def test_reopen_appends_trims_a_torn_line_and_drops_steps_after_resume(tmp_path):
    with MetricLogger(tmp_path, tensorboard=False) as logger:
        for step in range(1, 6):
            logger.log({"a": float(step)}, step=step)
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 6, "a": 6.')  # a crash mid-write
    # Resuming from the checkpoint of step 3: steps 4..6 of the crashed run go away.
    with MetricLogger(tmp_path, tensorboard=False, resume_step=3) as logger:
        logger.log({"a": 40.0}, step=4)
    assert [(r["step"], r["a"]) for r in strict_lines(path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]


def test_disabled_logger_writes_nothing(tmp_path):
    logger = MetricLogger(tmp_path / "run", enabled=False)
    logger.log({"a": 1.0}, step=0)
    logger.close()
    assert not (tmp_path / "run").exists()


def test_bad_metrics_are_rejected(tmp_path):
    with MetricLogger(tmp_path, tensorboard=False) as logger:
        with pytest.raises(ValueError, match="'a' must be a number"):
            logger.log({"a": "high"}, step=0)
        with pytest.raises(ValueError, match="'v' must be a scalar"):
            logger.log({"v": torch.ones(2)}, step=0)
        with pytest.raises(ValueError, match="'step' is reserved"):
            logger.log({"step": 1.0}, step=0)
        with pytest.raises(ValueError, match="step must be an int"):
            logger.log({"a": 1.0}, step=1.5)
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_tensorboard_receives_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricLogger(tmp_path) as logger:
        logger.log({"reward/mean": 0.25}, step=1)
        logger.log({"reward/mean": 0.75}, step=2)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("reward/mean")
    assert [(e.step, e.value) for e in events] == [(1, 0.25), (2, 0.75)]


def test_missing_tensorboard_is_skipped_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    with MetricLogger(tmp_path) as logger:
        logger.log({"a": 1.0}, step=0)
    assert "tensorboard is not installed" in capsys.readouterr().out
    assert not (tmp_path / "tensorboard").exists()
    assert len(strict_lines(tmp_path / "metrics.jsonl")) == 1


def test_wandb_gets_init_kwargs_numbers_and_finish(tmp_path, monkeypatch):
    calls: list = []

    class Run:
        def log(self, data, step):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    with MetricLogger(tmp_path, tensorboard=False, wandb={"project": "p"}) as logger:
        logger.log({"a": float("nan"), "b": 2}, step=7)
    assert calls[0] == ("init", {"dir": str(tmp_path), "project": "p"})
    assert calls[1][0] == "log" and calls[1][2] == 7
    assert math.isnan(calls[1][1]["a"]) and calls[1][1]["b"] == 2.0
    assert calls[2] == ("finish",)

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match="wandb"):
        MetricLogger(tmp_path, tensorboard=False, wandb={})


def plain_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=False, width=200)


def test_progress_prints_compact_lines_when_not_a_terminal():
    con = plain_console()
    with Progress(10, "train", enabled=True, every=4, console=con) as bar:
        for step in range(10):
            bar.update(1, **{"reward/mean": step / 10, "n": step})
    lines = con.file.getvalue().splitlines()
    # Printed after updates 4, 8 and at the end (10).
    assert [line.split()[1] for line in lines] == ["4/10", "8/10", "10/10"]
    assert lines[0].startswith("train 4/10 (40%) ")
    assert "reward/mean=0.3 n=3" in lines[0]
    assert "eta 0s" in lines[-1] and "reward/mean=0.9" in lines[-1]


def test_progress_on_a_terminal_draws_a_bar_and_other_ranks_stay_quiet():
    tty = Console(file=io.StringIO(), force_terminal=True, width=120)
    with Progress(3, "rollout", enabled=True, console=tty) as bar:
        for _ in range(3):
            bar.update(1, acc=0.5)
    out = tty.file.getvalue()
    assert "rollout" in out and "3/3" in out and "acc=0.5" in out

    quiet = plain_console()
    with Progress(3, "rollout", enabled=False, every=1, console=quiet) as bar:
        for _ in range(3):
            bar.update()
    assert quiet.file.getvalue() == ""


def test_print_table_uses_union_of_keys():
    con = plain_console()
    print_table(
        "eval",
        [{"task": "gsm8k", "pass@1": 0.123456}, {"task": "math", "avg@4": 2 / 3}],
        console=con,
    )
    out = con.file.getvalue()
    assert "eval" in out
    header = next(line for line in out.splitlines() if "task" in line)
    assert header.index("task") < header.index("pass@1") < header.index("avg@4")
    assert "0.1235" in out and "0.6667" in out and "gsm8k" in out
