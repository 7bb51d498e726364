"""Run a function in several spawned processes and wait for them, killing them if they hang."""

from __future__ import annotations

import os
import sys
import time

import torch.multiprocessing as mp


def run_processes(fn, args: tuple, *, nprocs: int, timeout_s: float, what: str) -> None:
    """`fn(rank, *args)` in `nprocs` fresh processes; re-raises a child's failure, and raises
    TimeoutError naming `what` if they have not all finished after `timeout_s` seconds."""
    ctx = mp.spawn(_run_then_exit, args=(fn, *args), nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} hung")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


def _run_then_exit(rank: int, fn, *args) -> None:
    """`fn(rank, *args)`, then leave at once (a failure in `fn` is reported as spawn does).

    Leaving skips the interpreter's shutdown and C++ static destructors: a rank that had
    checked everything and destroyed its gloo group still died of SIGABRT at exit now and then
    ("terminate called without an active exception"; 2 of 311 runs of
    tests/infra/test_distributed.py under load, 2026-12-06, and once in a fresh-clone suite,
    2026-12-07, both ranks' torn-down markers written), which failed a test whose checks had
    all passed."""
    fn(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
