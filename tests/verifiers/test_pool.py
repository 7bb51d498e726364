"""DeadlinePool on its own: every way an item can end, with stdlib functions as the targets.

The math tests (test_verify_math.py) cover stuck items, restarts and retries through
MathVerifier; these pin the outcomes that only the pool itself produces (unsendable items and
results, workers that never become ready, the caller's own exception) and the exact outcome
tuples, so that a change to the scheduling loop cannot change them unnoticed.
"""

from __future__ import annotations

import time

import pytest

from primekit.verifiers import pool as pool_module
from primekit.verifiers.pool import DeadlinePool


@pytest.fixture
def make_pool():
    pools: list[DeadlinePool] = []

    def make(*args, **kwargs) -> DeadlinePool:
        pools.append(DeadlinePool(*args, **kwargs))
        return pools[-1]

    yield make
    for p in pools:
        p.close()


def test_outcomes_come_back_in_order_with_their_errors(make_pool):
    pool = make_pool("operator:neg", workers=2)
    # Five items on two workers; "x" raises in the worker (which lives on), a memoryview cannot
    # be pickled, so it never leaves the caller.
    out = pool.map([1, 2.5, "x", memoryview(b"ab"), 4], timeout_s=30.0)
    assert out == [
        ("ok", -1, 0),
        ("ok", -2.5, 0),
        ("error", "TypeError: bad operand type for unary -: 'str'", 0),
        ("error", "could not send item: TypeError", 0),
        ("ok", -4, 0),
    ]
    assert pool.map([], timeout_s=1.0) == []
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        pool.map([1], timeout_s=0)


def test_a_result_that_cannot_be_pickled_is_an_error(make_pool):
    pool = make_pool("builtins:memoryview", workers=1)
    out = pool.map([b"ab", "not bytes"], timeout_s=30.0)
    assert out == [
        ("error", "unpicklable result: TypeError", 0),
        ("error", "TypeError: memoryview: a bytes-like object is required, not 'str'", 0),
    ]


def test_an_item_over_its_deadline_times_out_alone(make_pool):
    pool = make_pool("time:sleep", workers=2)
    pool.warm_up()  # start-up is charged to an item only while no worker is ready
    t0 = time.monotonic()
    out = pool.map([60, 0], timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert out == [("timeout", None, 0), ("ok", None, 0)]
    assert 1.0 <= elapsed < 1.0 + 1.0, f"took {elapsed:.2f}s"


def test_items_waiting_for_a_worker_that_never_gets_ready_time_out_one_by_one(make_pool):
    # init=signal:pause blocks the worker before it reports ready; its start-up limit is far
    # away, so each queued item spends its own limit waiting: the head at 0.5 s, the next at
    # 1.0 s (its clock starts when the first one gives up).
    pool = make_pool("operator:neg", workers=1, init="signal:pause", start_timeout_s=60.0)
    t0 = time.monotonic()
    out = pool.map([1, 2], timeout_s=0.5)
    elapsed = time.monotonic() - t0
    starved = ("timeout", "no grading worker became ready within the time limit", 0)
    assert out == [starved, starved]
    assert 1.0 <= elapsed < 1.0 + 1.0, f"took {elapsed:.2f}s"


@pytest.mark.parametrize(
    ("init", "start_timeout_s"),
    [("signal:pause", 1.0), ("sys:exit", 60.0)],
    ids=["never-ready", "exits-before-ready"],
)
def test_a_worker_that_cannot_start_fails_every_item(make_pool, init, start_timeout_s):
    # Not retried: a worker that cannot start will not start on a retry either.
    pool = make_pool("operator:neg", workers=1, init=init, start_timeout_s=start_timeout_s)
    t0 = time.monotonic()
    out = pool.map([1, 2, 3], timeout_s=60.0)
    elapsed = time.monotonic() - t0
    assert out == [("error", "verifier worker failed to start", 0)] * 3
    assert elapsed < start_timeout_s + 5.0, f"took {elapsed:.2f}s"


def test_an_exception_in_the_caller_kills_its_workers(make_pool, monkeypatch):
    pool = make_pool("operator:neg", workers=1)
    pool.warm_up()
    (worker,) = pool._idle

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pool_module, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.map([1], timeout_s=30.0)
    # The worker held the item when the call was interrupted: killed, not put back.
    assert worker.proc.poll() is not None
    assert pool._idle == []
    monkeypatch.undo()
    assert pool.map([4], timeout_s=30.0) == [("ok", -4, 0)]
