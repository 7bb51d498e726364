"""Two simulated data-parallel ranks in threads, for pure functions that take an `all_reduce`.

`on_two_ranks(fn, a, b)` calls fn(a, sum_, max_) and fn(b, sum_, max_) in two threads, where
sum_ and max_ are collectives between the two calls (elementwise sum / max of both ranks'
tensors, in call order, as torch.distributed's all_reduce does): a way to check in the default
suite, without process groups, that a function given 1/2 of a batch on each rank returns the
whole batch's statistics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


def on_two_ranks(fn: Callable[..., Any], a: Any, b: Any) -> tuple[Any, Any]:
    barrier = threading.Barrier(2, timeout=30)
    slots: list[torch.Tensor | None] = [None, None]
    out: list[Any] = [None, None]
    errors: list[BaseException] = []

    def collective(rank: int, reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        def run(t: torch.Tensor) -> torch.Tensor:
            slots[rank] = t.detach().clone()
            barrier.wait()
            result = reduce(slots[0], slots[1])
            barrier.wait()  # both have read the slots before the next call overwrites them
            return result.to(t.dtype)
        return run

    def worker(rank: int, data: Any) -> None:
        try:
            out[rank] = fn(data, collective(rank, torch.add), collective(rank, torch.maximum))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(r, d)) for r, d in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out[0], out[1]
