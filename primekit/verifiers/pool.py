"""Worker processes with a hard per-item deadline: a stuck item costs one worker, never the caller.

Why not `concurrent.futures.ProcessPoolExecutor`: it cannot kill one stuck task (a sympy
simplification or a C-level big-integer power never returns and ignores signals), and
math-verify's own `signal.alarm` timeouts only work on the main thread of the main interpreter.
Here each worker is a plain `python` subprocess speaking pickled messages over two pipes; the
caller waits with a deadline per item and SIGKILLs and replaces a worker that overruns it.
This works the same from the main thread, a worker thread, or inside a (daemonic) process-pool
worker, because it uses neither signals nor `multiprocessing.Process`.

Workers are spawned from one long-lived thread of the pool so that `PR_SET_PDEATHSIG` (set by
the worker) fires only when the pool's owner process dies, not when some short-lived caller
thread exits. A worker also exits when its inbox pipe reaches EOF.

A worker that died without being killed by the pool (while idle between calls, or while grading:
OOM killer, a crash in C code, an operator's kill) costs no item its verdict: an item that could
not be sent to it, or whose worker died before answering, is retried once on a fresh worker, and
each item's outcome says how many retries it took.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from typing import Any

# (status, value, retries): ("ok", value, r) | ("timeout", None, r) | ("error", "short reason", r);
# r is how many times the item was sent again because its worker died (0 or 1).
Outcome = tuple[str, Any, int]
MAX_RETRIES = 1

_WORKER_BOOT = "from primekit.verifiers.pool import _worker_main; _worker_main()"


class _Worker:
    """One worker subprocess and the two pipe ends the parent keeps."""

    def __init__(self, proc: subprocess.Popen, inbox: Connection, outbox: Connection) -> None:
        self.proc = proc
        self.inbox = inbox  # parent writes tasks here
        self.outbox = outbox  # parent reads results here
        self.ready = False
        self.started = time.monotonic()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        for conn in (self.inbox, self.outbox):
            with contextlib.suppress(OSError):
                conn.close()
        # A SIGKILLed process stuck in D state cannot be helped; do not hang on it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)


class DeadlinePool:
    """A pool of `workers` processes that apply `target` ("module:function") to items.

    `init` ("module:function", optional) runs once in each worker before it reports ready: the
    place for slow imports, so they are not charged to the first item's deadline.

    `map(items, timeout_s)` returns one Outcome per item, in order. An item's clock starts when a
    ready worker receives it (worker start-up, up to `start_timeout_s`, is not charged to it).
    An item whose worker turns out dead (the send fails, or the worker exits before answering,
    without having overrun the item's deadline) is sent once more, with a fresh deadline, to a
    fresh worker; so such an item may take up to twice `timeout_s`.
    Thread-safe: concurrent `map` calls each check out their own workers.
    """

    def __init__(
        self,
        target: str,
        workers: int = 2,
        *,
        init: str | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        for name, value in (("target", target), ("init", init)):
            if value is not None and ":" not in value:
                raise ValueError(f"{name} must look like 'module:function', got {value!r}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.target = target
        self.init = init
        self.workers = workers
        self.start_timeout_s = start_timeout_s
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pk-pool-spawn")
        self._finalizer = weakref.finalize(self, DeadlinePool._shutdown, self._idle, self._spawner)
        atexit.register(self._finalizer)

    # -- lifecycle -------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        return self._spawner.submit(self._spawn_now).result()

    def _spawn_now(self) -> _Worker:
        task_r, task_w = os.pipe()
        res_r, res_w = os.pipe()
        env = dict(os.environ)
        # The parent's sys.path (e.g. a source checkout that is not installed) must reach the worker.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _WORKER_BOOT,
                    str(task_r),
                    str(res_w),
                    self.target,
                    self.init or "",
                ],
                pass_fds=(task_r, res_w),
                stdin=subprocess.DEVNULL,
                env=env,
                close_fds=True,
            )
        finally:
            os.close(task_r)
            os.close(res_w)
        return _Worker(proc, Connection(task_w, readable=False), Connection(res_r, writable=False))

    def _checkout(self, n: int) -> list[_Worker]:
        with self._lock:
            if self._closed:
                raise RuntimeError("DeadlinePool is closed")
            taken = [self._idle.pop() for _ in range(min(n, len(self._idle)))]
        taken += [self._spawn() for _ in range(n - len(taken))]
        return taken

    def _checkin(self, workers: list[_Worker]) -> None:
        extra: list[_Worker] = []
        with self._lock:
            for w in workers:
                # Workers still starting are kept too; the next map waits for their "ready".
                keep = w.proc.poll() is None and not self._closed
                if keep and len(self._idle) < self.workers:
                    self._idle.append(w)
                    continue
                extra.append(w)
        for w in extra:
            w.kill()

    def warm_up(self) -> None:
        """Start the workers now (they import their module once) so the first map is fast."""
        ws = self._checkout(self.workers)
        try:
            _wait_ready(ws, self.start_timeout_s)
        finally:
            self._checkin(ws)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._finalizer()

    @staticmethod
    def _shutdown(idle: list[_Worker], spawner: ThreadPoolExecutor) -> None:
        while idle:
            idle.pop().kill()
        spawner.shutdown(wait=False)

    # -- the work --------------------------------------------------------------------------

    def map(self, items: Sequence[Any], timeout_s: float) -> list[Outcome]:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        n = len(items)
        if n == 0:
            return []
        call = _MapCall(self, items, timeout_s, self._checkout(min(self.workers, n)))
        try:
            return call.run()
        except BaseException:
            for w in call.workers:
                w.kill()
            call.workers = []
            raise
        finally:
            self._checkin(call.workers)


class _MapCall:
    """The state of one `DeadlinePool.map` call and the loop that schedules it.

    Each turn of `run`: send pending items to ready idle workers, run the starvation clock,
    wait for the next message or deadline, then retire (and replace) the workers that overran
    an item, died, or did not start in time.
    """

    def __init__(
        self, owner: DeadlinePool, items: Sequence[Any], timeout_s: float, workers: list[_Worker]
    ) -> None:
        self.owner = owner
        self.items = items
        self.timeout_s = timeout_s
        self.workers = workers  # checked out for this call; killed ones are replaced in place
        n = len(items)
        self.results: list[tuple[str, Any] | None] = [None] * n
        self.retries = [0] * n
        self.pending = deque(range(n))
        self.busy: dict[_Worker, tuple[int, float]] = {}  # worker -> (item index, deadline)
        self.broken: set[_Worker] = set()  # a send to it failed: its process is gone or going
        # While no worker is ready (all are starting, e.g. replacing killed ones), the item at
        # the head of the queue spends its own time limit waiting: a call never blocks past its
        # limit because a worker is slow to start. Waiting for a busy worker does not count.
        self.starved_since: float | None = None

    def unfinished(self) -> bool:
        return bool(self.pending or self.busy or self.broken)

    def run(self) -> list[Outcome]:
        while self.unfinished():
            now = time.monotonic()
            self.dispatch(now)
            if not self.unfinished():
                break
            if self.starve(now):
                continue
            dead = self.receive(self.wait_s())
            self.reap(dead)
        return [
            (*(r if r is not None else ("error", "internal: no result")), k)
            for r, k in zip(self.results, self.retries)
        ]

    def retry_or_fail(self, i: int, reason: str) -> None:
        if self.retries[i] < MAX_RETRIES:
            self.retries[i] += 1
            self.pending.appendleft(i)
        else:
            self.results[i] = ("error", reason)

    def dispatch(self, now: float) -> None:
        """Send pending items to ready idle workers; an item's deadline counts from `now`, or
        from when it began waiting for a worker to start."""
        for w in self.workers:
            if w.ready and w not in self.busy and w not in self.broken and self.pending:
                i = self.pending.popleft()
                try:
                    w.inbox.send((i, self.items[i]))
                except OSError as e:  # a dead worker (BrokenPipeError): not the item's fault
                    self.broken.add(w)
                    self.retry_or_fail(i, f"could not send item: {type(e).__name__}")
                    continue
                except Exception as e:  # an unpicklable item
                    self.results[i] = ("error", f"could not send item: {type(e).__name__}")
                    continue
                start = now if self.starved_since is None else self.starved_since
                self.busy[w] = (i, start + self.timeout_s)
                self.starved_since = None

    def starve(self, now: float) -> bool:
        """Run the starvation clock; True when it just timed out the item at the queue's head."""
        if not (
            self.pending
            and self.workers
            and not any(w.ready and w not in self.broken for w in self.workers)
        ):
            self.starved_since = None
            return False
        if self.starved_since is None:
            self.starved_since = now
            return False
        if now < self.starved_since + self.timeout_s:
            return False
        self.results[self.pending.popleft()] = (
            "timeout",
            "no grading worker became ready within the time limit",
        )
        self.starved_since = now if self.pending else None
        return True

    def wait_s(self) -> float:
        """How long to wait for a message: until the nearest deadline, or not at all."""
        if self.broken:  # replace them now
            return 0.0
        deadlines = [d for _, d in self.busy.values()]
        if self.starved_since is not None:
            deadlines.append(self.starved_since + self.timeout_s)
        deadlines += [w.started + self.owner.start_timeout_s for w in self.workers if not w.ready]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.0

    def receive(self, wait_s: float) -> list[_Worker]:
        """Wait up to `wait_s` and take in each message that arrived; returns the workers whose
        pipe closed (they died)."""
        conns = {w.outbox: w for w in self.workers}
        dead: list[_Worker] = []
        for conn in wait(list(conns), timeout=wait_s):
            w = conns[conn]
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                dead.append(w)
                continue
            except Exception as e:  # a result that cannot be unpickled here
                msg = (self.busy.get(w, (-1,))[0], "error", f"bad result: {type(e).__name__}")
            tag, status, value = msg
            if tag == "ready":
                w.ready = True
            elif w in self.busy and self.busy[w][0] == tag:
                self.results[tag] = (status, value)
                del self.busy[w]
        return dead

    def reap(self, dead: list[_Worker]) -> None:
        """Retire every worker that overran its item, is gone, or did not start in time."""
        now = time.monotonic()
        for w in list(self.workers):
            overdue = w in self.busy and now >= self.busy[w][1]
            slow_start = not w.ready and now >= w.started + self.owner.start_timeout_s
            gone = w in dead or w in self.broken or w.proc.poll() is not None
            if gone or overdue or slow_start:
                self.retire(w, overdue)

    def retire(self, w: _Worker, overdue: bool) -> None:
        """Settle `w`'s item (timeout if overdue, else a retry), kill it, and replace it."""
        if w in self.busy:
            i, _ = self.busy.pop(w)
            if overdue:
                self.results[i] = ("timeout", None)
            else:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(timeout=1.0)  # its pipe closed: it is exiting
                self.retry_or_fail(i, f"worker died twice (exit code {w.proc.poll()})")
        self.broken.discard(w)
        was_ready = w.ready
        w.kill()
        self.workers.remove(w)
        if was_ready:  # replace it now: its start-up overlaps the remaining work
            self.workers.append(self.owner._spawn())
        elif not self.workers:
            # A worker that cannot start will not start on retry either.
            for i in self.pending:
                self.results[i] = ("error", "verifier worker failed to start")
            self.pending.clear()


def _wait_ready(ws: list[_Worker], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for w in ws:
        while not w.ready and time.monotonic() < deadline:
            if not w.outbox.poll(max(0.0, deadline - time.monotonic())):
                break
            try:
                tag, _, _ = w.outbox.recv()
            except (EOFError, OSError):
                break
            w.ready = tag == "ready"


def _resolve(target: str) -> Callable[[Any], Any]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _set_parent_death_signal() -> None:
    """Linux only: SIGKILL this worker when the thread that spawned it (the pool's) dies."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main() -> None:
    """Entry point of a worker process: argv = [task_fd, result_fd, target, init or ""]."""
    parent = os.getppid()
    _set_parent_death_signal()
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    inbox = Connection(int(sys.argv[1]), writable=False)
    outbox = Connection(int(sys.argv[2]), readable=False)
    fn = _resolve(sys.argv[3])
    if sys.argv[4]:
        _resolve(sys.argv[4])()
    outbox.send(("ready", "ok", None))
    while True:
        try:
            tag, item = inbox.recv()
        except (EOFError, OSError):
            return
        try:
            out: tuple[str, Any] = ("ok", fn(item))
        except BaseException as e:  # the caller gets a short reason, the worker lives on
            out = ("error", f"{type(e).__name__}: {str(e)[:200]}")
        try:
            outbox.send((tag, *out))
        except Exception as e:
            outbox.send((tag, "error", f"unpicklable result: {type(e).__name__}"))
