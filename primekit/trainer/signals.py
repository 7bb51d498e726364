"""Graceful stop: SIGINT (Ctrl-C) and SIGTERM end a command cleanly, in one line.

Two modes, by what the command leaves behind:

- `graceful_stop()`, for RL training (resumable): the first SIGINT or SIGTERM only sets a flag:
  the trainer finishes the step it is in, writes a checkpoint (`RLTrainer.train` checks
  `requested()` between steps) and raises `Stopped`, which the CLI turns into one line saying
  where the checkpoint is and how to resume, and exit status 128 + signal number (130 for SIGINT,
  143 for SIGTERM). A second signal abandons the step at once (`Abandoned`): nothing of it is
  saved, and the latest checkpoint stays as it was, because checkpoint writes are atomic
  (primekit.trainer.checkpoint). Arriving while the first signal's checkpoint is written, it
  abandons that write: whatever error the writer makes of it (DCP's CheckpointException, a zip
  writer's "unexpected pos") is reported as this stop, with the `--resume` command.
- `stop_at_once()`, for commands with nothing to resume (`primekit sft`, `train-orm`,
  `train-prm`, the demo outside its RL phase): their one output is written at the end, so there
  is no step worth finishing. The first signal raises `Interrupted` where the program is, except
  while that output is being written (`primekit.runtime.signals_held`, which
  `models.hf.save_model` holds): the output is then either as it was or complete, never half
  written. The CLI prints one line and exits with 128 + signal number.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from primekit import distributed as dist
from primekit.trainer import checkpoint as ckpt

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_requested: int | None = None
_abandoned: int | None = None  # the second signal, once `Abandoned` was raised for it


class Stopped(Exception):  # noqa: N818 (a control-flow outcome, not an error)
    """Training stopped on a signal after `step`, with its checkpoint at `checkpoint`."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        # The command line that continues (or restarts) the run, where the CLI's own
        # `primekit train ... --resume` is not it (the demo's RL phase sets it).
        self.command: str | None = None


class Abandoned(Exception):  # noqa: N818
    """A second signal: the current step was abandoned without saving."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by a second {signal.Signals(signum).name}")
        self.signum = signum
        self.command: str | None = None  # as Stopped.command
        # What was left, where "the step was abandoned, the latest checkpoint unchanged" is
        # not true (after the last step: its checkpoint is written, final/ is not).
        self.note: str | None = None


class Interrupted(BaseException):  # noqa: N818
    """A command with nothing to resume stopped on a signal (`stop_at_once`). A BaseException,
    like KeyboardInterrupt, so that no `except Exception` on its way swallows it. `note` says
    what was left behind; the code that knows sets it on the way out."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.note: str | None = None


def requested() -> int | None:
    """The signal number received inside `graceful_stop()`, or None."""
    return _requested


def wrapped_stop(error: BaseException, note: str) -> Abandoned | None:
    """The `Abandoned` stop that `error` stands for, with `note`, when the second signal was
    raised inside a writer that wrapped or replaced it with its own error (DCP's
    CheckpointException, a zip writer's "unexpected pos"); None for any other error."""
    if _abandoned is None or isinstance(error, Abandoned):
        return None
    stop = Abandoned(_abandoned)
    stop.note = note
    return stop


def _handler(signum: int, frame) -> None:
    global _requested, _abandoned
    if _requested is not None:
        _abandoned = signum
        raise Abandoned(signum)
    _requested = signum
    print(f"primekit: {signal.Signals(signum).name} received: finishing the current step, then "
          f"saving a checkpoint (send it again to stop at once without saving)",
          file=sys.stderr, flush=True)


def _stop_now(signum: int, frame) -> None:
    raise Interrupted(signum)


@contextmanager
def _handling(handler) -> Iterator[None]:
    """`handler` for SIGINT and SIGTERM during the block; the previous handlers after it."""
    global _requested, _abandoned
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested = _abandoned = None
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    except BaseException as e:
        stop = wrapped_stop(e, "the checkpoint being written was abandoned; those written "
                               "before it are intact")
        if stop is not None:
            raise stop from None
        raise
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _requested = _abandoned = None


def graceful_stop():
    """Route SIGINT and SIGTERM to the flag for the duration (main thread only; elsewhere, and
    for code outside the block, the handlers in force before it stay)."""
    return _handling(_handler)


def stop_at_once():
    """SIGINT and SIGTERM raise `Interrupted` during the block (main thread only); a
    `graceful_stop()` nested inside takes over for its own duration."""
    return _handling(_stop_now)


def stop_if_requested(step: int, run_dir: Path, save: Callable[[], Path]) -> None:
    """Between steps: after SIGINT/SIGTERM, save step `step` (unless it is saved) and raise
    `Stopped`. Under torchrun every rank stops after the same step (the signal is max-reduced)."""
    signum = requested() or 0
    if dist.world_size() > 1:
        signum = int(dist.reduce_metrics({"signal": signum}, op="max")["signal"])
    if not signum:
        return
    path = ckpt.latest_checkpoint(run_dir)
    if step > 0 and path != ckpt.checkpoint_dir(run_dir, step):
        path = save()
    raise Stopped(signum, step, path)
