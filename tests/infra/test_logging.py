"""MetricLogger sinks, the progress display and summary tables."""

from __future__ import annotations

import io
import json
import math
import sys

import numpy as np
import pytest
import torch
from rich.console import Console

from primekit.config import ConfigError
from primekit.logging import MetricLogger, Progress, print_table


def strict_lines(path) -> list[dict]:
    """Parse every line as strict JSON: a bare NaN/Infinity token would raise."""

    def reject(token: str):
        raise ValueError(f"non-standard JSON token {token}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def test_jsonl_is_strict_json_per_line_and_flushed_before_close(tmp_path):
    logger = MetricLogger(tmp_path, report_to=[])
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
    with MetricLogger(tmp_path, report_to=[]) as logger:
        for step in range(1, 6):
            logger.log({"a": float(step)}, step=step)
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 6, "a": 6.')  # a crash mid-write
    # Resuming from the checkpoint of step 3: steps 4..6 of the crashed run go away.
    with MetricLogger(tmp_path, report_to=[], resume_step=3) as logger:
        logger.log({"a": 40.0}, step=4)
    assert [(r["step"], r["a"]) for r in strict_lines(path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]


def test_disabled_logger_writes_nothing(tmp_path):
    logger = MetricLogger(tmp_path / "run", report_to=["tensorboard"], enabled=False)
    logger.log({"a": 1.0}, step=0)
    logger.close()
    assert not (tmp_path / "run").exists()


def test_bad_metrics_are_rejected(tmp_path):
    with MetricLogger(tmp_path, report_to=[]) as logger:
        with pytest.raises(ValueError, match="'a' must be a number"):
            logger.log({"a": "high"}, step=0)
        with pytest.raises(ValueError, match="'v' must be a scalar"):
            logger.log({"v": torch.ones(2)}, step=0)
        with pytest.raises(ValueError, match="'step' is reserved"):
            logger.log({"step": 1.0}, step=0)
        with pytest.raises(ValueError, match="step must be an int"):
            logger.log({"a": 1.0}, step=1.5)
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_tensorboard_only_when_listed(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricLogger(tmp_path / "off", report_to=[]) as logger:
        logger.log({"reward/mean": 0.25}, step=1)
    assert not (tmp_path / "off" / "tensorboard").exists()
    assert len(strict_lines(tmp_path / "off" / "metrics.jsonl")) == 1

    with MetricLogger(tmp_path / "on", report_to=["tensorboard"]) as logger:
        logger.log({"reward/mean": 0.25}, step=1)
        logger.log({"reward/mean": 0.75}, step=2)
    events_files = list((tmp_path / "on" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events_files) == 1
    acc = EventAccumulator(str(tmp_path / "on" / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("reward/mean")
    assert [(e.step, e.value) for e in events] == [(1, 0.25), (2, 0.75)]


def test_missing_tensorboard_is_skipped_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    with MetricLogger(tmp_path, report_to=["tensorboard"]) as logger:
        logger.log({"a": 1.0}, step=0)
    assert capsys.readouterr().out == (
        "tensorboard is not installed (pip install 'primekit[tensorboard]'); "
        "TensorBoard logging is off\n"
    )
    assert not (tmp_path / "tensorboard").exists()
    assert len(strict_lines(tmp_path / "metrics.jsonl")) == 1


def test_unknown_sink_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"report_to: unknown sinks \['mlflow'\]"):
        MetricLogger(tmp_path, report_to=["mlflow"])


class FakeWandb:
    """Records wandb.init's arguments and what the run receives."""

    def __init__(self) -> None:
        self.calls: list = []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        calls = self.calls

        class Run:
            def log(self, data, step):
                calls.append(("log", data, step))

            def finish(self):
                calls.append(("finish",))

        return Run()


def test_wandb_run_is_named_after_the_run_dir_and_offline_without_a_key(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run_dir = tmp_path / "prime-seed1"
    with MetricLogger(run_dir, report_to=["wandb"], run_config={"prm": {"beta": 0.05}}) as logger:
        logger.log({"a": float("nan"), "b": 2}, step=7)
    assert fake.calls[0] == ("init", {"dir": str(run_dir), "name": "prime-seed1",
                                      "project": "primekit", "mode": "offline",
                                      "config": {"prm": {"beta": 0.05}}})
    assert fake.calls[1][0] == "log" and fake.calls[1][2] == 7
    assert math.isnan(fake.calls[1][1]["a"]) and fake.calls[1][1]["b"] == 2.0
    assert fake.calls[2] == ("finish",)
    assert not (run_dir / "tensorboard").exists()

    # WANDB_MODE and WANDB_PROJECT win; an API key alone means online.
    monkeypatch.setenv("WANDB_API_KEY", "k")
    fake.calls.clear()
    MetricLogger(tmp_path / "b", report_to=["wandb"]).close()
    assert fake.calls[0][1]["mode"] == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    fake.calls.clear()
    MetricLogger(tmp_path / "c", report_to=["wandb"]).close()
    assert (fake.calls[0][1]["mode"], fake.calls[0][1]["project"]) == ("disabled", "mine")


def test_wandb_listed_but_missing_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import now fails
    with pytest.raises(ConfigError) as err:
        MetricLogger(tmp_path / "run", report_to=["tensorboard", "wandb"])
    assert str(err.value) == ("train.report_to: 'wandb' is listed but the wandb package is not "
                              "installed: pip install 'primekit[wandb]'")
    assert not (tmp_path / "run").exists()  # failed before writing anything
    # Not listed: never imported.
    MetricLogger(tmp_path / "ok", report_to=[]).close()


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


def test_progress_of_a_resumed_run_counts_on_from_its_start():
    # A run resumed at step 6 of 10: lines say 8/10 and 10/10, not 2/4 and 4/4; the rate is
    # over this process's steps (a number, not nan, after 2 of them).
    con = plain_console()
    with Progress(10, "RL", enabled=True, every=2, console=con, start=6) as bar:
        for _ in range(4):
            bar.update(1)
    lines = con.file.getvalue().splitlines()
    assert [line.split()[:3] for line in lines] == [["RL", "8/10", "(80%)"],
                                                    ["RL", "10/10", "(100%)"]]
    assert "nan" not in lines[0] and "?s/it" not in lines[0]
    with pytest.raises(ValueError, match="start must lie in"):
        Progress(10, "RL", enabled=False, start=11)
    tty = Console(file=io.StringIO(), force_terminal=True, width=120)
    with Progress(10, "RL", enabled=True, console=tty, start=6) as bar:
        bar.update(1)
    assert "7/10" in tty.file.getvalue()


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
