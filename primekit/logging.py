"""Metric sinks (JSONL always, TensorBoard and wandb optional), a progress bar and summary tables.

Only the main rank writes or prints (see `primekit.distributed`); other ranks get silent objects
with the same methods, so callers never branch on the rank.

`metrics.jsonl` format: one JSON object per line, `{"step": int, "time": unix seconds, <metric>:
value, ...}`. Non-finite floats, which strict JSON cannot hold, are written as the strings
"nan", "inf" and "-inf" (so `float(value)` reads them back and any JSON parser accepts the line).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as _RichProgress
from rich.table import Table

from primekit.config import ConfigError
from primekit.distributed import is_main

console = Console()


def _console() -> Console:
    return console  # looked up at call time, so replacing `primekit.logging.console` works


def _json_value(key: str, value: Any) -> float | int | bool | str:
    if isinstance(value, bool):
        return value
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalars
        if getattr(value, "numel", lambda: 1)() != 1:
            raise ValueError(f"metric {key!r} must be a scalar, got shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # "nan", "inf", "-inf"
    raise ValueError(f"metric {key!r} must be a number, got {value!r}")


def _trim_partial_line(path: Path) -> None:
    # A crash mid-write can leave a last line without its newline; appending after it would
    # glue two records together. Drop the fragment so every line stays one valid JSON object.
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        f.truncate(data.rfind(b"\n") + 1)


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise ConfigError("train.report_to: 'wandb' is listed but the wandb package is not "
                          "installed: pip install 'primekit[wandb]'") from None
    return wandb


def _drop_steps_after(path: Path, step: int) -> None:
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines(keepends=True)
        if json.loads(line).get("step", -1) <= step
    ]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


SINKS = ("tensorboard", "wandb")


SAMPLES = "samples.jsonl"


def append_samples(run_dir: Path, step: int, rows: list[dict[str, Any]]) -> None:
    """Append a step's sampled responses to `run_dir/samples.jsonl` (main rank only).

    One JSON object per response: {"step", "prompt", "response", "score", "status", "tokens"
    (each response token decoded alone), "token_rewards" (the dense reward of each token, or
    null without one)}; `primekit dashboard` shows the latest step's (docs/viz.md).
    """
    if not rows or not is_main():
        return
    with open(Path(run_dir) / SAMPLES, "a") as f:
        for row in rows:
            f.write(json.dumps({"step": step, **row}) + "\n")

class MetricLogger:
    """Write scalar metrics to `run_dir/metrics.jsonl`, and to TensorBoard and wandb if asked.

    Args:
        run_dir: the run's directory (created if missing).
        report_to: the sinks besides metrics.jsonl (always written), from SINKS; the config's
            train.report_to.
            - "tensorboard": events in `run_dir/tensorboard`. Without `torch.utils.tensorboard`
              one line is printed and the sink is skipped (a plain install must still run).
            - "wandb": a wandb run named after run_dir, its files in run_dir. Without the wandb
              package this is a ConfigError. WANDB_MODE and WANDB_PROJECT are respected; without
              WANDB_MODE it runs offline unless WANDB_API_KEY is set, so it never waits for a
              login (sync an offline run later with `wandb sync`).
        resume_step: when resuming from a checkpoint at this step, drop lines of
            `metrics.jsonl` with a larger step (written after that checkpoint by the run that
            crashed), so the file has one line per step.
        enabled: write anything at all; defaults to `is_main()`.
        run_config: the run's settings, recorded by wandb (e.g. `Config.to_dict()`).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        report_to: list[str],
        resume_step: int | None = None,
        enabled: bool | None = None,
        run_config: dict[str, Any] | None = None,
    ) -> None:
        unknown = [s for s in report_to if s not in SINKS]
        if unknown:
            raise ValueError(f"report_to: unknown sinks {unknown}; valid: {list(SINKS)}")
        self.enabled = is_main() if enabled is None else enabled
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self._file: TextIO | None = None
        self._tb: Any = None
        self._wandb_run: Any = None
        if not self.enabled:
            return
        # Before any file is touched: a missing package should not leave a half-started run.
        wandb_lib = _import_wandb() if "wandb" in report_to else None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _trim_partial_line(self.path)
        if resume_step is not None:
            _drop_steps_after(self.path, resume_step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                console.print("tensorboard is not installed (pip install 'primekit[tensorboard]'); "
                              "TensorBoard logging is off", style="dim", markup=False,
                              highlight=False, soft_wrap=True)
            else:
                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if wandb_lib is not None:
            mode = os.environ.get("WANDB_MODE") or (
                "online" if os.environ.get("WANDB_API_KEY") else "offline"
            )
            self._wandb_run = wandb_lib.init(
                dir=str(self.run_dir),
                name=self.run_dir.name,
                project=os.environ.get("WANDB_PROJECT", "primekit"),
                mode=mode,
                config=run_config,
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record `metrics` (floats, ints or scalar tensors) for `step`; flushed immediately."""
        if not self.enabled:
            return
        if self._file is None:
            raise ValueError("MetricLogger.log called after close()")
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"step must be an int, got {step!r}")
        values = {k: _json_value(k, v) for k, v in metrics.items()}
        for reserved in ("step", "time"):
            if reserved in values:
                raise ValueError(f"metric name {reserved!r} is reserved for the record itself")
        record = {"step": step, "time": round(time.time(), 3), **values}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        numbers = {k: float(v) for k, v in values.items()}  # "nan" -> nan for the other sinks
        if self._tb is not None:
            for k, v in numbers.items():
                self._tb.add_scalar(k, v, global_step=step)
            self._tb.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(numbers, step=step)

    def close(self) -> None:
        """Flush and close every sink; safe to call twice."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _fmt(value: Any) -> str:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Progress:
    """A progress bar with ETA and a few live metrics; plain lines when not on a terminal.

    On a terminal (main rank) it is a rich bar. Otherwise (CI logs, files, pipes) it prints one
    compact line every `every` updates and at the end, e.g.
    `train 40/200 (20%) 1.5s/it eta 4m00s reward/mean=0.42 prm/acc=0.61`. Other ranks print
    nothing.

    Args:
        total: number of steps.
        description: label shown before the bar.
        start: steps already done (a resumed run): counts go on from there, and the rate and
            ETA come from the steps of this process.
        enabled: show anything at all; defaults to `is_main()`.
        every: updates between plain lines; default about 20 lines per run.
        console: where to draw (default: the module's `console`).
    """

    def __init__(
        self,
        total: int,
        description: str,
        enabled: bool | None = None,
        *,
        every: int | None = None,
        console: Console | None = None,
        start: int = 0,
    ) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        if not 0 <= start <= total:
            raise ValueError(f"start must lie in [0, total={total}], got {start}")
        if every is not None and every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.total = total
        self.description = description
        self.enabled = is_main() if enabled is None else enabled
        self.every = every if every is not None else max(1, (total - start) // 20)
        self.console = console if console is not None else _console()
        self.start = self.completed = start
        self._shown: dict[str, Any] = {}
        self._start = time.monotonic()
        self._last_printed = start
        self._bar: _RichProgress | None = None
        if self.enabled and self.console.is_terminal:
            self._bar = _RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[shown]}"),
                console=self.console,
            )
            self._task = self._bar.add_task(description, total=total, completed=start, shown="")
            self._bar.start()

    def update(self, advance: int = 1, **shown_metrics: Any) -> None:
        """Advance by `advance` steps and replace the displayed metrics with `shown_metrics`.

        Names with a slash work through a dict: `update(1, **{"reward/mean": 0.4})`.
        """
        self.completed += advance
        if shown_metrics:
            self._shown = shown_metrics
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in self._shown.items())
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, shown=shown)
        elif self.enabled and (
            self.completed - self._last_printed >= self.every or self.completed >= self.total
        ):
            self._last_printed = self.completed
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)

    def line(self) -> str:
        """The compact one-line status printed when not on a terminal."""
        elapsed = time.monotonic() - self._start
        done = self.completed - self.start  # steps of this process
        rate = elapsed / done if done else math.nan
        eta = rate * (self.total - self.completed)
        pct = 100.0 * self.completed / self.total if self.total else 100.0
        parts = [
            f"{self.description} {self.completed}/{self.total} ({pct:.0f}%)",
            f"{rate:.3g}s/it" if done else "?s/it",
            f"eta {_fmt_duration(eta)}",
        ]
        parts += [f"{k}={_fmt(v)}" for k, v in self._shown.items()]
        return " ".join(parts)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def print_table(
    title: str,
    rows: list[dict],
    *,
    console: Console | None = None,
    enabled: bool | None = None,
) -> None:
    """Print `rows` as a table whose columns are the union of the rows' keys (first-seen order).

    Floats are shown with 4 significant digits; a key missing from a row is an empty cell.
    Prints on the main rank only unless `enabled` says otherwise.
    """
    if not (is_main() if enabled is None else enabled):
        return
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    table = Table(title=title)
    for c in columns:
        table.add_column(str(c))
    for row in rows:
        table.add_row(*(_fmt(row[c]) if c in row else "" for c in columns))
    (console if console is not None else _console()).print(table)


@contextmanager
def timed(timing: dict[str, float], key: str) -> Iterator[None]:
    """Add the block's wall time to timing[key] (seconds)."""
    t0 = time.perf_counter()
    yield
    timing[key] = timing.get(key, 0.0) + time.perf_counter() - t0


class MetricSums:
    """Row-weighted sums of metrics kept as float64 tensors: one host sync per metric per step."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, metrics: dict, weight: float = 1.0) -> None:
        for k, v in metrics.items():
            v = torch.as_tensor(v).detach().double() * weight  # stays on its device: no sync
            self.sums[k] = self.sums[k] + v if k in self.sums else v

    def means(self, count: float) -> dict[str, torch.Tensor]:
        return {k: v / count for k, v in self.sums.items()}
