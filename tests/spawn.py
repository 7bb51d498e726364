"""Run a function in several spawned processes and wait for them, killing them if they hang."""

from __future__ import annotations

import time

import torch.multiprocessing as mp


def run_processes(fn, args: tuple, *, nprocs: int, timeout_s: float, what: str) -> None:
    """`fn(rank, *args)` in `nprocs` fresh processes; re-raises a child's failure, and raises
    TimeoutError naming `what` if they have not all finished after `timeout_s` seconds."""
    ctx = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} hung")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
