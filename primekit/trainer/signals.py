"""Graceful stop: SIGINT (Ctrl-C) and SIGTERM finish the current step, save, and exit cleanly.

Inside `graceful_stop()` the first SIGINT or SIGTERM only sets a flag: the trainer finishes the
step it is in, writes a checkpoint (`RLTrainer.train` checks `requested()` between steps) and
raises `Stopped`, which the CLI turns into one line saying where the checkpoint is and how to
resume, and exit status 128 + signal number (130 for SIGINT, 143 for SIGTERM). A second signal
abandons the step at once (`Abandoned`): nothing of it is saved, and the latest checkpoint stays
as it was, because checkpoint writes are atomic (primekit.trainer.checkpoint).
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


class Stopped(Exception):  # noqa: N818 (a control-flow outcome, not an error)
    """Training stopped on a signal after `step`, with its checkpoint at `checkpoint`."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class Abandoned(Exception):  # noqa: N818
    """A second signal: the current step was abandoned without saving."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by a second {signal.Signals(signum).name}")
        self.signum = signum


def requested() -> int | None:
    """The signal number received inside `graceful_stop()`, or None."""
    return _requested


def _handler(signum: int, frame) -> None:
    global _requested
    if _requested is not None:
        raise Abandoned(signum)
    _requested = signum
    print(f"primekit: {signal.Signals(signum).name} received: finishing the current step, then "
          f"saving a checkpoint (send it again to stop at once without saving)",
          file=sys.stderr, flush=True)


@contextmanager
def graceful_stop() -> Iterator[None]:
    """Route SIGINT and SIGTERM to the flag for the duration (main thread only; elsewhere, and
    for code outside the block, the default handlers stay)."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested = None
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _requested = None


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
