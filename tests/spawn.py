"""Run a function in several spawned processes and wait for them, killing them if they hang."""

from __future__ import annotations

import time
from pathlib import Path

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


def leave_together(folder: str | Path, rank: int, world: int, timeout_s: float = 60) -> None:
    """Call after `destroy_process_group`: mark this rank as torn down and wait until every rank
    is, so that no process exits (closing its gloo sockets) while a peer's group is still up; a
    peer's gloo thread that sees its socket closed can abort the process ("terminate called
    without an active exception", SIGABRT): the likely cause of the 2-process gloo test's
    occasional failure in full runs (seen twice, never alone)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"left-{rank}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(folder.glob("left-*"))) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: not every rank tore its process group down")
        time.sleep(0.01)
