"""Hostile programs: each must be contained, scored honestly, cleaned up, and finish on time.

Pattern: where a program attacks the host, it only becomes a *correct* solution if the attack
worked ("if I could reach the listener, define add correctly"). So a score above the expected
one means containment failed, and a bug in the attack itself cannot make the test pass vacuously
because the host-side checks (files, processes, listener, secrets) are asserted separately.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from primekit.data.problem import Problem
from primekit.verifiers.code import CodeVerifier
from primekit.verifiers.sandbox import RUNNER, namespaces_available

TIMEOUT_S = 1.0
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
CORRECT_ADD = "def add(a, b):\n    return a + b\n"

pytestmark = pytest.mark.skipif(not namespaces_available(), reason="needs unshare namespaces")


def _sandbox_processes() -> list[int]:
    """Processes owned by a per-call sandbox uid (200000 and up), anywhere on the machine."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid_line = next(ln for ln in status.splitlines() if ln.startswith("Uid:"))
            if int(uid_line.split()[1]) >= 200_000:
                found.append(int(entry))
    return found


def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def run_hostile(code: str, tests=None, *, isolation="namespaces", timeout_s=TIMEOUT_S, **kw):
    """Verify `code`; assert it finished on time and left no process behind."""
    problem = Problem(
        id="hostile", prompt="", task="code", tests=ADD_TESTS if tests is None else tests
    )
    verifier = CodeVerifier(timeout_s=timeout_s, memory_mb=256, isolation=isolation, **kw)
    before = _descendants(os.getpid())
    t0 = time.monotonic()
    verdict = verifier.verify(f"```python\n{code}\n```", problem)
    elapsed = time.monotonic() - t0
    assert elapsed < timeout_s + 1.0, f"took {elapsed:.2f}s"
    assert _sandbox_processes() == [], "a sandboxed process outlived the call"
    assert _descendants(os.getpid()) - before == set(), "a child process outlived the call"
    return verdict


# -- resource exhaustion --------------------------------------------------------------------


def test_fork_bomb():
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    v = run_hostile(code)
    assert v.score == 0.0 and v.status in ("timeout", "error")


def test_memory_bomb():
    # A longer limit than the other hostile programs: on a loaded machine the time to fill 256 MB
    # must not turn this into a time-out test; the point is that RLIMIT_AS stops it.
    v = run_hostile("hog = []\nwhile True:\n    hog.append(bytearray(50 * 2**20))\n" + CORRECT_ADD,
                    timeout_s=5.0)
    assert v.score == 0.0 and "MemoryError" in v.reason


def test_many_processes_hogging_memory():
    # Each process stays under RLIMIT_AS (256 MB) but together they would take 2.4 GB; the
    # sandbox's memory cgroup (where available) caps the total and the OOM killer takes tests.
    code = (
        "import os, time\n"
        "for _ in range(12):\n"
        "    if os.fork() == 0:\n"
        "        try:\n            hog = bytearray(200 * 2**20)\n        except MemoryError:\n"
        "            pass\n"
        "        time.sleep(10)\n"
        "        os._exit(0)\n"
        "time.sleep(10)\n"
    )
    v = run_hostile(code)
    assert v.score == 0.0


def test_sandbox_cgroups_are_created_capped_and_removed():
    from primekit.verifiers.sandbox import SandboxLimits, _make_cgroups, _remove_cgroups

    groups = _make_cgroups(
        "pk-test-" + os.urandom(4).hex(), SandboxLimits(memory_mb=100, disk_mb=10)
    )
    if not groups:
        pytest.skip("no writable cgroup v1 hierarchy here")
    try:
        limits = {g.parent.name: g for g in groups}
        if "memory" in limits:  # 2 * 100 MB + 4 * 10 MB = 240 MB
            assert int((limits["memory"] / "memory.limit_in_bytes").read_text()) == 240 * 2**20
        if "pids" in limits:  # max_processes 64 + 16 for the runner's own
            assert (limits["pids"] / "pids.max").read_text().strip() == "80"
    finally:
        _remove_cgroups(groups)
    assert not any(g.exists() for g in groups)


def test_infinite_loop_at_import():
    v = run_hostile("while True:\n    pass\n" + CORRECT_ADD)
    assert (v.status, v.score) == ("timeout", 0.0)


def test_infinite_loop_in_one_test_keeps_the_honest_fraction():
    code = "def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n"
    v = run_hostile(code, tests=ADD_TESTS, test_timeout_s=0.4)
    # test 1 passes (a=1), test 2 loops and is cut at 0.4 s: score 1/2, status timeout
    assert (v.status, v.score) == ("timeout", 0.5)


def test_busy_threads():
    code = (
        "import threading\n"
        "def spin():\n    while True:\n        pass\n"
        "for _ in range(200):\n"
        "    try:\n        threading.Thread(target=spin, daemon=True).start()\n"
        "    except RuntimeError:\n        break\n"
        "while True:\n    pass\n"
    )
    v = run_hostile(code)
    assert v.score == 0.0 and v.status == "timeout"


def test_huge_output_in_a_function_test():
    v = run_hostile("while True:\n    print('x' * 100000)\n")
    assert v.score == 0.0 and v.status == "timeout"


def test_huge_output_in_a_stdin_stdout_test():
    tests = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    v = run_hostile("print('3')\nwhile True:\n    print('x' * 100000)\n", tests=tests)
    assert (v.score, v.status) == (0.0, "incorrect") and "output exceeded" in v.reason


def test_giant_file():
    code = (
        "with open('big', 'wb') as f:\n    for _ in range(256):\n        f.write(b'x' * 2**22)\n"
        + CORRECT_ADD
    )
    v = run_hostile(code)
    # RLIMIT_FSIZE (16 MB) stops it long before 1 GB: the write fails with EFBIG.
    assert v.score == 0.0 and "File too large" in v.reason


def test_raising_resource_limits_fails():
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "resource.setrlimit(resource.RLIMIT_NPROC, (10**6, 10**6))\n" + CORRECT_ADD
    )
    v = run_hostile(code)
    assert v.score == 0.0 and v.status == "error"


# -- the host's files, environment, network, processes -----------------------------------------


def test_writing_and_deleting_outside_the_sandbox(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    precious.chmod(0o666)
    tmp_path.chmod(0o777)
    owned = tmp_path / "owned.txt"
    code = (
        "import os, shutil\n"
        "hits = 0\n"
        f"for path in [{str(owned)!r}, '/etc/primekit_owned', '/owned', {str(RUNNER)!r}]:\n"
        "    try:\n        open(path, 'a').write('x'); hits += 1\n    except OSError:\n        pass\n"
        f"for path in [{str(precious)!r}, '/etc/hostname']:\n"
        "    try:\n        os.remove(path); hits += 1\n    except OSError:\n        pass\n"
        "try:\n    shutil.rmtree('/work', ignore_errors=False); hits += 1\nexcept OSError:\n    pass\n"
        "if hits:\n" + "\n".join("    " + ln for ln in CORRECT_ADD.splitlines())
    )
    runner_hash = hashlib.sha256(RUNNER.read_bytes()).hexdigest()
    v = run_hostile(code)
    assert v.score == 0.0
    assert precious.read_text() == "keep me" and not owned.exists()
    assert not Path("/etc/primekit_owned").exists() and not Path("/owned").exists()
    assert Path("/etc/hostname").exists()
    assert hashlib.sha256(RUNNER.read_bytes()).hexdigest() == runner_hash


def test_changing_directory_does_not_escape():
    code = (
        "import os\nos.chdir('/')\nfor d in ['/', '/etc', '/usr', '/tmp/..']:\n"
        "    try:\n        os.chdir(d); open('primekit_owned', 'w').write('x')\n"
        "    except OSError:\n        pass\n" + CORRECT_ADD
    )
    v = run_hostile(code)
    # Writing in the sandbox's own /tmp tmpfs is allowed; the host's directories are not touched.
    assert v.score == 1.0
    for d in ["/", "/etc", "/usr", "/tmp"]:
        assert not Path(d, "primekit_owned").exists()


def test_parent_environment_and_secrets_do_not_leak(monkeypatch):
    secret = "pk-secret-" + os.urandom(8).hex()
    monkeypatch.setenv("PRIMEKIT_TEST_SECRET", secret)
    code = (
        "import os, glob\n"
        "seen = repr(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
        "    try:\n        seen += open(path, 'rb').read().decode('latin-1')\n"
        "    except OSError:\n        pass\n"
        f"for path in ['/proc/{os.getpid()}/environ', '/root/.bashrc', '/etc/shadow']:\n"
        "    try:\n        seen += open(path, 'rb').read().decode('latin-1')\n"
        "    except OSError:\n        pass\n"
        "if 'pk-secret-' in seen:\n"
        + "\n".join("    " + ln for ln in CORRECT_ADD.splitlines())
        + "\n"
        "raise RuntimeError(seen[-300:])\n"
    )
    v = run_hostile(code)
    assert v.score == 0.0 and secret not in v.reason
    assert "PRIMEKIT_TEST_SECRET" not in v.reason


def test_no_network_to_a_host_listener():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
        "s.sendall(b'stolen')\n" + CORRECT_ADD
    )
    try:
        v = run_hostile(code)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
    assert v.score == 0.0 and "unreachable" in v.reason.lower()


def test_killing_the_parent_siblings_and_everyone():
    sibling = subprocess.Popen(["sleep", "30"])
    code = (
        "import os, signal\n"
        f"for pid in [os.getppid(), 1, {os.getpid()}, {sibling.pid}]:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n" + CORRECT_ADD
    )
    try:
        v = run_hostile(code)
        assert sibling.poll() is None, "the host's sibling process was killed"
    finally:
        sibling.kill()
        sibling.wait()
    # Every kill fails (other uid, other PID namespace) and the program then loads normally.
    assert v.score == 1.0


def test_detached_daemon_does_not_outlive_the_call():
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        while True:\n            time.sleep(0.05)\n"
        "    os._exit(0)\n" + CORRECT_ADD
    )
    v = run_hostile(code)  # run_hostile asserts no sandbox-uid process and no new child remain
    assert v.score == 1.0


def test_escalating_privileges_fails():
    code = (
        "import os\nwon = False\n"
        "for attempt in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.chroot('/')):\n"
        "    try:\n        attempt(); won = True\n    except OSError:\n        pass\n"
        "if won:\n" + "\n".join("    " + ln for ln in CORRECT_ADD.splitlines())
    )
    v = run_hostile(code)
    assert v.score == 0.0


# -- attacks on the harness -------------------------------------------------------------------


def test_os_exit_zero_before_the_tests():
    v = run_hostile("import os\nos._exit(0)\n")
    assert v.score == 0.0 and "before the test finished" in v.reason


def test_sys_exit_zero_before_the_tests():
    v = run_hostile("import sys\nsys.exit(0)\n")
    assert v.score == 0.0


def test_fake_success_output():
    code = (
        'import sys\nprint(\'All tests passed!\')\nprint(\'{"results": [{"status": "passed"}]}\')\n'
        "sys.stderr.write('OK\\n')\nsys.stdout.flush()\nimport os\nos._exit(0)\n"
    )
    v = run_hostile(code)
    assert v.score == 0.0


def test_forged_report_on_every_descriptor():
    code = (
        "import os\nfor fd in range(3, 1024):\n"
        "    try:\n        os.write(fd, b'passed ' * 8)\n    except OSError:\n        pass\n"
        "os._exit(0)\n"
    )
    v = run_hostile(code)
    assert v.score == 0.0 and "forged" in v.reason


def test_patching_builtins_and_exit_hooks():
    code = (
        "import builtins, sys, os, atexit\n"
        "builtins.AssertionError = type('Never', (BaseException,), {})\n"
        "sys.exit = lambda *a: None\n"
        "os._exit = lambda *a: None\n"
        "os.write = lambda fd, data: len(data)\n"
        "sys.excepthook = lambda *a: None\n"
        "atexit.register(lambda: print('passed'))\n"
        "def add(a, b):\n    return 0\n"
    )
    v = run_hostile(code)
    assert (v.status, v.score) == ("incorrect", 0.0)


def test_always_equal_result_object_is_rejected():
    check = (
        "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"
    )
    code = (
        "class Anything:\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Anything()\n"
    )
    v = run_hostile(code, tests={"check": check, "entry_point": "add"})
    assert v.score == 0.0 and "non-plain" in v.reason


def test_raising_base_exceptions_from_the_solution():
    code = "def add(a, b):\n    raise KeyboardInterrupt\n"
    v = run_hostile(code)
    assert v.score == 0.0


# -- without namespaces (fallback): the process guarantees still hold ---------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        while True:\n            pass\n    os._exit(0)\n" + CORRECT_ADD,
            1.0,
        ),
        (
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            0.0,
        ),
        ("import os\nos.kill(os.getppid(), 9)\n" + CORRECT_ADD, 0.0),
    ],
    ids=["daemon", "fork-bomb", "kill-parent"],
)
def test_fallback_without_namespaces_cleans_up(code, expected):
    v = run_hostile(code, isolation="none")
    assert v.score == expected


# -- verdicts the program cannot reach (the I/O forms) -----------------------------------------
# For stdin/stdout tests and function-call tests given as input/output pairs, the sandbox only
# produces outputs and the grader compares them in its own process; the expected outputs never
# enter the sandbox. Each forgery below worked when the comparison (or the expected output) was
# inside the sandbox.

STDIO_TESTS = {"inputs": ["1 2\n", "2 2\n"], "outputs": ["3\n", "4\n"]}
CALL_TESTS = {"fn_name": "add", "inputs": [[1, 2], [2, 2]], "outputs": [3, 4]}
CORRECT_STDIO = "a, b = map(int, input().split())\nprint(a + b)\n"
WRONG_ADD = "def add(a, b):\n    return 0\n"

# Walk up to the harness's frame and write its nonce to its report descriptor.
FRAME_WALK_NONCE = (
    "import os, sys\n"
    "f = sys._getframe()\n"
    "while f is not None:\n"
    "    if 'nonce' in f.f_locals and 'report_fd' in f.f_locals:\n"
    "        os.write(f.f_locals['report_fd'], f.f_locals['nonce'])\n"
    "        os._exit(0)\n"
    "    f = f.f_back\n"
) + WRONG_ADD
# Walk up the frames (or scan the heap) for the [stdin, expected stdout] pair and print it.
FRAME_WALK_EXPECTED = (
    "import sys\n"
    "data = sys.stdin.read()\n"
    "f = sys._getframe()\n"
    "while f is not None:\n"
    "    for v in list(f.f_locals.values()):\n"
    "        if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == data:\n"
    "            print(v[1])\n"
    "            raise SystemExit(0)\n"
    "    f = f.f_back\n"
    "print('no idea')\n"
)
HEAP_SCAN_EXPECTED = (
    "import gc, sys\n"
    "data = sys.stdin.read()\n"
    "for o in gc.get_objects():\n"
    "    if isinstance(o, list) and len(o) == 2 and o[0] == data and isinstance(o[1], str):\n"
    "        print(o[1])\n"
    "        raise SystemExit(0)\n"
    "print('no idea')\n"
)
ALWAYS_EQUAL = (
    "class Anything:\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = object.__hash__\n"
    "def add(a, b):\n    return Anything()\n"
)
ALWAYS_EQUAL_INT = (
    "class Sneaky(int):\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\n"
    "def add(a, b):\n    return [Sneaky(0)][0]\n"
)


@pytest.mark.parametrize(
    ("code", "tests"),
    [(CORRECT_STDIO, STDIO_TESTS), (CORRECT_ADD, CALL_TESTS)],
    ids=["stdio", "call"],
)
@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_io_forms_pass_an_honest_solution(code, tests, isolation):
    # The control for the forgeries below: the same tests do pass a real solution.
    assert run_hostile(code, tests=tests, isolation=isolation, timeout_s=3.0).score == 1.0


@pytest.mark.parametrize(
    ("code", "tests"),
    [
        (FRAME_WALK_EXPECTED, STDIO_TESTS),
        (HEAP_SCAN_EXPECTED, STDIO_TESTS),
        (FRAME_WALK_NONCE, CALL_TESTS),
        (ALWAYS_EQUAL, CALL_TESTS),
        (ALWAYS_EQUAL_INT, CALL_TESTS),
    ],
    ids=["stdio-frame-walk", "stdio-heap-scan", "call-frame-walk", "call-always-equal",
         "call-always-equal-int"],
)
@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_forgeries_fail_on_the_io_forms(code, tests, isolation):
    # In the fallback too: what keeps the verdict out of reach is that the expected outputs never
    # enter the sandbox, not the namespaces.
    # (3 s, not 1 s: scanning the heap twice must not turn into a time-out on a loaded machine)
    v = run_hostile(code, tests=tests, isolation=isolation, timeout_s=3.0)
    assert (v.score, v.status) == (0.0, "incorrect"), v


@pytest.mark.parametrize("code", [FRAME_WALK_NONCE, ALWAYS_EQUAL], ids=["frame-walk", "always-eq"])
def test_assert_form_is_still_forgeable_as_documented(code):
    # docs/verifiers.md, "What the harness does not guarantee": assert strings run in the
    # program's own process, so both forgeries still pass them. If this starts failing, the limit
    # is gone: update the docs.
    assert run_hostile(code, tests=ADD_TESTS).score == 1.0
