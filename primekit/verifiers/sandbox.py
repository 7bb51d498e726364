"""Run untrusted Python against tests in a jail: namespaces, an unprivileged uid, limits, a deadline.

Host side. For each program: a fresh temporary directory, then
`unshare --pid --fork --kill-child --mount-proc --net --ipc --uts python -I -B sandbox_runner.py`
in its own session with a scrubbed environment. The runner (PID 1 of the new PID namespace)
makes the filesystem read-only, hides /root and /home, mounts size-capped tmpfs on /tmp,
/var/tmp, /dev/shm and the working directory, and runs each test in a child that drops to a
random unused uid under rlimits (see sandbox_runner.py for how a pass is proven; for the
stdin/stdout and function-call forms only the inputs go in, and `run_program` compares the
outputs that come back with the expected ones here, in the grader's process). The host kills
the session at `timeout_s` plus a small grace; the kernel then kills every process in the PID
namespace, setsid'd daemons included. Exactly what is and is not guaranteed: docs/verifiers.md.

Fallback (`isolation="none"`, or "auto" where unshare is missing or not permitted): no
namespaces, so no network isolation and no read-only filesystem; still own session, scrubbed
environment, rlimits, a separate uid when running as root, and a child-subreaper runner that
SIGKILLs every descendant after each test.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from primekit.data.code_tests import Mode
from primekit.verifiers.outputs import judge

log = logging.getLogger(__name__)

RUNNER = Path(__file__).with_name("sandbox_runner.py")
UNSHARE_FLAGS = ["--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc", "--uts"]
# The host's hard kill comes this long after the runner's own budget (interpreter start-up).
GRACE_S = 0.75
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one program (all its tests together unless stated otherwise).

    timeout_s: wall clock for the whole call; the process tree is killed past it (+GRACE_S).
    test_timeout_s: wall clock per test (None: timeout_s); CPU rlimit is this rounded up + 1 s.
    memory_mb: RLIMIT_AS per process (address space, so thread stacks count too).
    max_processes: RLIMIT_NPROC for the per-call uid (processes and threads); only when root.
    file_size_mb: RLIMIT_FSIZE; open_files: RLIMIT_NOFILE.
    disk_mb: size of each tmpfs (working directory, /tmp, /var/tmp, /dev/shm).
    output_bytes: stdout kept per test; a stdin/stdout test that prints more fails.
    total_memory_mb: memory cgroup limit for the whole sandbox, tmpfs pages included (None:
        2 * memory_mb + 4 * disk_mb); applied only where a cgroup can be created (root).
    """

    timeout_s: float = 10.0
    test_timeout_s: float | None = None
    memory_mb: int = 1024
    max_processes: int = 64
    file_size_mb: int = 16
    open_files: int = 64
    disk_mb: int = 64
    output_bytes: int = 1 << 20
    total_memory_mb: int | None = None

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {value}")


@dataclass
class SandboxResult:
    """What happened to one program.

    tests: per test {"status": passed|failed|timeout|load_error|tampered|sandbox_error, "detail"}
        (the runner's "ran" for an I/O test becomes passed or failed here, in `run_program`).
    status: "ok" (the runner reported), "timeout" (the host killed it) or "error" (no report).
    """

    tests: list[dict[str, str]]
    status: Literal["ok", "timeout", "error"]
    detail: str = ""
    isolation: str = "namespaces"
    wall_s: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(t["status"] == "passed" for t in self.tests)


@functools.lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """Whether `unshare` can give us PID/net/mount namespaces here (root, or a permissive kernel)."""
    exe = shutil.which("unshare")
    if exe is None or not sys.platform.startswith("linux"):
        return False
    try:
        probe = subprocess.run(
            [exe, *UNSHARE_FLAGS, sys.executable, "-I", "-c", "import os; print(os.getpid())"],
            capture_output=True,
            timeout=20,
            env=_clean_env("/"),
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == b"1"


def _clean_env(workdir: str) -> dict[str, str]:
    """The only environment the program sees: nothing inherited from the trainer."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _sandbox_uid() -> int | None:
    """A random uid no account uses, so RLIMIT_NPROC and kill permissions are per call."""
    if os.geteuid() != 0:
        return None
    return 200_000 + secrets.randbelow(1 << 30)


def run_program(
    code: str,
    mode: Mode,
    tests: list[Any],
    limits: SandboxLimits | None = None,
    *,
    isolation: Literal["auto", "namespaces", "none"] = "auto",
    plain_returns: bool = True,
) -> SandboxResult:
    """Run `code` against `tests` in the sandbox. Never raises for anything the program does.

    Args:
        code: the program (Python source).
        mode: "assert" (each test is Python source run after the program; it passes if it
            returns normally), "io" (each test is [stdin, expected stdout]; the program runs as
            __main__), "call" (each test is {"fn_name", "args", "output"}: the function's return
            value for those arguments must equal "output") or "check" (each test is {"check":
            source defining check(candidate), "entry_point": name}; HumanEval style).
            For "io" and "call" only the inputs enter the sandbox; the outputs are compared here.
        tests: the tests, in the format of `mode`.
        limits: resource limits (default SandboxLimits()).
        isolation: "namespaces" (fail if unavailable), "none", or "auto" (namespaces if possible).
        plain_returns: in "check" mode, the candidate must return plain builtin data.
    Returns:
        a SandboxResult with one entry per test.
    """
    limits = limits or SandboxLimits()
    if mode not in ("assert", "io", "call", "check"):
        raise ValueError(f"mode must be 'assert', 'io', 'call' or 'check', got {mode!r}")
    if isolation not in ("auto", "namespaces", "none"):
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', got {isolation!r}")
    isolated = isolation == "namespaces" or (isolation == "auto" and namespaces_available())
    if isolation == "auto" and not isolated:
        _warn_fallback_once()
    if not tests:
        return SandboxResult([], "ok", isolation="namespaces" if isolated else "none")
    expected: list[Any] = []
    if mode == "io":  # the expected outputs stay here: the sandbox gets the inputs only
        tests, expected = [t[0] for t in tests], [t[1] for t in tests]
    elif mode == "call":
        expected = [t["output"] for t in tests]
        tests = [{"fn_name": t["fn_name"], "args": t["args"]} for t in tests]
    t0 = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="primekit-sbx-")
    cgroups = _make_cgroups(Path(workdir).name, limits)
    try:
        job = {
            "code": code,
            "mode": mode,
            "tests": tests,
            "workdir": workdir,
            "uid": _sandbox_uid(),
            "isolated": isolated,
            "plain_returns": plain_returns,
            "timeout_s": limits.timeout_s,
            "test_timeout_s": limits.test_timeout_s or limits.timeout_s,
            "memory_mb": limits.memory_mb,
            "max_processes": limits.max_processes,
            "file_size_mb": limits.file_size_mb,
            "open_files": limits.open_files,
            "disk_mb": limits.disk_mb,
            "output_bytes": limits.output_bytes,
            "cgroups": [str(c) for c in cgroups],
        }
        result = _launch(job, limits, isolated)
    finally:
        _remove_cgroups(cgroups)
        shutil.rmtree(workdir, ignore_errors=True)
    if expected:
        result.tests = judge(mode, expected, result.tests)
    result.wall_s = time.monotonic() - t0
    return result


def _launch(job: dict[str, Any], limits: SandboxLimits, isolated: bool) -> SandboxResult:
    cmd = [sys.executable, "-I", "-B", str(RUNNER)]
    if isolated:
        cmd = [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, *cmd]
    kind = "namespaces" if isolated else "none"
    try:
        payload = json.dumps(job).encode()
    except (TypeError, ValueError) as e:
        return SandboxResult([], "error", f"tests are not JSON-serialisable: {e}", kind)
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=_clean_env(job["workdir"]),
            cwd="/",
        )
    except OSError as e:
        return SandboxResult([], "error", f"could not start the sandbox: {e}", kind)
    try:
        out, err = proc.communicate(payload, timeout=limits.timeout_s + GRACE_S)
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        if not isolated and job["uid"] is not None:
            _kill_uid(job["uid"])
        return SandboxResult([], "timeout", f"program exceeded {limits.timeout_s:g}s", kind)
    except BaseException:
        _kill_session(proc)
        raise
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return SandboxResult([], "error", f"runner exited {proc.returncode}: {tail[0][:300]}", kind)
    try:
        report = json.loads(out)
        tests = report["results"]
    except (ValueError, KeyError, TypeError) as e:
        return SandboxResult([], "error", f"unreadable runner report: {e}", kind)
    for w in report.get("warnings", []):
        log.warning("sandbox: %s", w)
    return SandboxResult(tests, "ok", "", kind, warnings=report.get("warnings", []))


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the runner's session; with namespaces, the kernel then empties the PID namespace."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired, OSError, ValueError):
        proc.communicate(timeout=2.0)


def _make_cgroups(name: str, limits: SandboxLimits) -> list[Path]:
    """Best effort: cgroup v1 memory and pids groups capping the whole sandbox (root only).

    RLIMIT_AS is per process, so without this, max_processes processes could each take
    memory_mb. The runner joins these groups before anything else, so every process of the
    sandbox is in them, and `_remove_cgroups` can kill by membership.
    """
    if os.geteuid() != 0:
        return []
    total = limits.total_memory_mb or 2 * limits.memory_mb + 4 * limits.disk_mb
    wanted = [
        ("memory", "memory.limit_in_bytes", str(total * 1024 * 1024)),
        ("pids", "pids.max", str(limits.max_processes + 16)),
    ]
    made = []
    for controller, knob, value in wanted:
        path = CGROUP_ROOT / controller / f"primekit-{name}"
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            (path / knob).write_text(value)
        except OSError:
            path.rmdir()
            continue
        made.append(path)
    return made


def _remove_cgroups(cgroups: list[Path]) -> None:
    """SIGKILL anything still in the sandbox's cgroups, then remove them."""
    for path in cgroups:
        for _ in range(200):
            try:
                pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        for _ in range(100):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # the last killed processes are still exiting
                time.sleep(0.01)
        else:
            log.warning("sandbox: could not remove cgroup %s", path)


def _kill_uid(uid: int) -> None:
    """Fallback cleanup: SIGKILL every process owned by this call's private uid."""
    for _ in range(100):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uids = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("Uid:")), [])
            if str(uid) in uids:
                found = True
                with contextlib.suppress(OSError):
                    os.kill(int(entry), signal.SIGKILL)
        if not found:
            return
        time.sleep(0.01)


@functools.lru_cache(maxsize=1)
def _warn_fallback_once() -> None:
    log.warning(
        "sandbox: unshare namespaces unavailable; running without network/filesystem isolation "
        "(see docs/verifiers.md, 'Fallback')"
    )
