"""Trusted half of the code sandbox: sets up the jail, runs each test in its own child process.

Never imported by the trainer: `sandbox.py` executes this file as `python -I -B sandbox_runner.py`
(-I: no script directory, user site or PYTHON* variables on sys.path), normally as PID 1 of fresh
PID, network, mount, IPC and UTS namespaces. Stdlib only. Protocol: one JSON job on stdin, one
JSON result on stdout. The runner itself never executes candidate code; every test runs in a
forked child that drops to an unprivileged uid and resource limits first.

What comes back (see docs/verifiers.md). For the I/O forms ("io": stdin/stdout; "call": a
function called with given arguments) the job holds only the inputs: the expected outputs never
enter the sandbox, and the runner returns what each test produced (stdout, or the function's
return value as plain JSON) for the host to compare in its own process. For the in-process
forms ("assert", "check") the runner draws a fresh random nonce per test, forks, and the child
runs the program and then the test; only if the test returns normally does the child write the
nonce to a pipe at a random high descriptor number and `_exit(0)`. The runner counts a pass only
when exactly that nonce arrives on that child's own pipe. Exit status, stdout and stderr are
never evidence of a pass.
"""

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
HIDDEN_DIRS = ("/root", "/home")  # host home directories: credentials live there
EXIT_TEST_FAILED, EXIT_LOAD_ERROR, EXIT_SANDBOX_ERROR = 1, 3, 70

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype, flags, data):
    enc = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mount_points():
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            # octal escapes (\040 for a space) in mount points
            point = fields[4].encode().decode("unicode_escape")
            fstype = fields[fields.index("-") + 1]
            points.append((point, set(fields[5].split(",")), fstype))
    return points


def setup_jail(job, warnings):
    """Read-only filesystem, hidden home directories, throwaway tmpfs for every writable place."""
    for point, opts, fstype in _mount_points():
        if fstype == "proc":
            # Left writable so each child can raise its own oom_score_adj; the program is not
            # root, so the rest of /proc (sysctl, sysrq-trigger) refuses it anyway.
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        flags |= MS_NODEV if "nodev" in opts else 0
        flags |= MS_NOEXEC if "noexec" in opts else 0
        try:
            _mount(None, point, None, flags, None)
        except OSError as e:
            if point == "/":
                warnings.append(f"could not make / read-only: {e}")
    # The interpreter may live under a hidden directory (pyenv in /root): keep it visible.
    keep = []
    for p in sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path}):
        hidden = p and os.path.isdir(p) and any(p.startswith(h + "/") for h in HIDDEN_DIRS)
        if hidden and not any(p.startswith(k + "/") or p == k for k in keep):
            keep.append(p)
    kept_fds = {p: os.open(p, os.O_PATH) for p in keep}
    for hidden in HIDDEN_DIRS:
        if os.path.isdir(hidden):
            _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for p, fd in kept_fds.items():
        os.makedirs(p, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC, None)
        _mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID, None)
        os.close(fd)
    for hidden in HIDDEN_DIRS:
        if os.path.isdir(hidden):
            _mount(None, hidden, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    size = f"size={job['disk_mb']}m,nr_inodes=8192"
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    workdir = job["workdir"]
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    owner = f",uid={job['uid']},gid={job['uid']}" if job["uid"] is not None else ""
    _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=0700{owner}")


# -- the child: everything below runs with the candidate's privileges ----------------------


def _say(prefix, exc):
    try:
        msg = f"{prefix}{type(exc).__name__}: {exc}"
    except BaseException:  # a hostile __str__
        msg = f"{prefix}{type(exc).__name__}"
    with contextlib.suppress(BaseException):
        os.write(2, ("\n" + msg[:500] + "\n").encode("utf-8", "replace"))


_PLAIN = (int, float, complex, str, bytes, bool, type(None))
_CONTAINERS = (list, tuple, set, frozenset)


def _is_plain(value, depth=0):
    """Exactly builtin data (no subclasses): values whose == cannot be redefined by the program."""
    t = type(value)
    if t in _PLAIN:
        return True
    if depth > 50:
        return False
    if t in _CONTAINERS:
        return all(_is_plain(v, depth + 1) for v in value)
    if t is dict:
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def _guard(fn):
    """HumanEval candidates must return plain data: blocks `__eq__`-always-True result objects."""

    def guarded(*args, **kwargs):
        result = fn(*args, **kwargs)
        if not _is_plain(result):
            raise TypeError(f"candidate returned a non-plain {type(result).__name__}")
        return result

    return guarded


def _plain_json(value, depth=0):
    """`value` as JSON text if it is exactly plain data (no subclasses), else TypeError.

    The host parses this text itself, so a return value can only ever be data: an object whose
    `__eq__` always returns True never reaches the comparison.
    """
    if depth > 100:
        raise TypeError("return value nested deeper than 100 levels")
    t = type(value)
    if value is None or t in (bool, int, str):
        return json.dumps(value)
    if t is float:
        return json.dumps(value, allow_nan=False)  # ValueError for nan/inf: not plain JSON
    if t in (list, tuple):
        return "[" + ",".join(_plain_json(v, depth + 1) for v in value) + "]"
    if t is dict:
        items = []
        for k, v in value.items():
            if type(k) not in (str, int):
                raise TypeError(f"dict key of type {type(k).__name__}")
            items.append(json.dumps(str(k)) + ":" + _plain_json(v, depth + 1))
        return "{" + ",".join(items) + "}"
    raise TypeError(f"candidate returned a non-plain {t.__name__}")


def _call_entry(module, fn_name):
    """The function under test: `fn_name` of the module, or of a `Solution()` (LeetCode style)."""
    namespace = module.__dict__
    solution = namespace.get("Solution")
    if isinstance(solution, type) and hasattr(solution, fn_name):
        return getattr(solution(), fn_name)
    if fn_name in namespace:
        return namespace[fn_name]
    raise NameError(f"no function named {fn_name!r}")


def _child_main(job, test, report_fd, nonce):
    import builtins
    import io
    import types

    write, exit_ = os.write, os._exit  # bound before the program can patch `os`
    # Fresh stream objects on the child's fds 0/1/2 (the runner's own were the job and result).
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(open(0, "rb", closefd=False))  # noqa: SIM115
    out = open(1, "wb", closefd=False)  # noqa: SIM115
    err = open(2, "wb", closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(out, write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(err, write_through=True)
    sys.argv = ["solution.py"]
    mode = job["mode"]
    name = "__main__" if mode == "io" else "solution"
    module = types.ModuleType(name)
    module.__file__ = "solution.py"
    module.__builtins__ = builtins
    sys.modules[name] = module
    try:
        program = compile(job["code"], "solution.py", "exec")
    except BaseException as e:
        _say("program failed to load: ", e)
        exit_(EXIT_LOAD_ERROR)
    if mode == "io":
        status = 0
        try:
            exec(program, module.__dict__)
        except SystemExit as e:
            status = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        except BaseException as e:
            _say("", e)
            status = EXIT_TEST_FAILED
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
        exit_(status & 0xFF)
    try:
        exec(program, module.__dict__)
    except BaseException as e:
        _say("program failed to load: ", e)
        exit_(EXIT_LOAD_ERROR)
    if mode == "call":
        # The return value, as plain JSON, goes to the report pipe; the host compares it. Writing
        # anything there itself gains the program nothing it could not get by returning it.
        try:
            value = _call_entry(module, test["fn_name"])(*test["args"])
            text = _plain_json(value)
        except BaseException as e:
            _say("test failed: ", e)
            exit_(EXIT_TEST_FAILED)
        data = text.encode("utf-8", "replace")
        while data:
            data = data[write(report_fd, data):]
        exit_(0)
    try:
        if mode == "assert":
            exec(compile(test, "test.py", "exec"), module.__dict__)
        else:
            exec(compile(test["check"], "test.py", "exec"), module.__dict__)
            candidate = module.__dict__[test["entry_point"]]
            module.__dict__["check"](_guard(candidate) if job["plain_returns"] else candidate)
    except BaseException as e:
        _say("test failed: ", e)
        exit_(EXIT_TEST_FAILED)
    write(report_fd, nonce)
    exit_(0)


def _enter_child(job, fds, report_fd):
    """In the forked child: own session, fds 0/1/2 and the report pipe only, limits, no root."""
    import resource

    os.setsid()
    with open("/proc/self/oom_score_adj", "w") as f:  # under memory pressure, die first
        f.write("1000")
    stdin_fd, out_w, err_w, rep_w = fds
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(rep_w, report_fd)
    os.closerange(3, report_fd)
    os.closerange(report_fd + 1, 65536)
    mb = 1024 * 1024
    cpu = int(job["test_timeout_s"]) + 1
    for limit, value in (
        (resource.RLIMIT_AS, job["memory_mb"] * mb),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, job["file_size_mb"] * mb),
        (resource.RLIMIT_NOFILE, job["open_files"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    if job["uid"] is not None:
        # RLIMIT_NPROC counts per real uid; the uid is unique to this call, so the limit is ours.
        resource.setrlimit(resource.RLIMIT_NPROC, (job["max_processes"],) * 2)
        os.setgroups([])
        os.setgid(job["uid"])
        os.setuid(job["uid"])
    os.chdir(job["workdir"])
    os.umask(0o077)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)


# -- the runner: waits for each child and cleans up ----------------------------------------


def _kill_everything_else(isolated, runner_pid):
    """SIGKILL every process of this sandbox except the runner, and reap them."""
    for _ in range(2000):
        if isolated:
            try:
                os.kill(-1, signal.SIGKILL)  # as PID 1: everyone in this PID namespace but us
                alive = True
            except ProcessLookupError:
                alive = False
        else:
            alive = _kill_descendants(runner_pid)
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not alive:
            return
        time.sleep(0.001)


def _kill_descendants(root_pid):
    """Fallback without a PID namespace: the runner is a child subreaper, so orphans reparent
    to it and every process the test started is still in its /proc ancestry."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {root_pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return bool(found)


def run_test(job, index, time_left, isolated):
    test = job["tests"][index]
    nonce = os.urandom(16).hex().encode()
    (out_r, err_r, rep_r), child_fds = _child_pipes(job, test)
    report_fd = 256 + int.from_bytes(os.urandom(2), "little") % 700
    limit = min(time_left, job["test_timeout_s"])
    started = time.monotonic()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _run_child(job, test, child_fds, report_fd, nonce)  # never returns
    # The parent, from here to the kill: nothing but closing, waiting and reading.
    for fd in child_fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    outputs = _Outputs(job, out_r, err_r, rep_r)
    exit_status, timed_out, overflow = _wait_child(pid, pidfd, outputs, started + limit)
    overflow = outputs.drain_leftovers(overflow)
    _kill_everything_else(isolated, os.getpid())
    os.close(pidfd)
    outputs.close()
    if timed_out:
        return {"status": "timeout", "detail": f"test exceeded {limit:.3g}s"}
    return _verdict(job, outputs, exit_status, overflow, nonce)


def _child_pipes(job, test):
    """Pipes for the child's stdout, stderr and report; its stdin, a memory file holding the
    test's input ("io") or nothing. Returns (the parent's read ends, the child's fds)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    rep_r, rep_w = os.pipe()
    stdin_fd = os.memfd_create("stdin")
    if job["mode"] == "io":
        os.write(stdin_fd, test.encode())
        os.lseek(stdin_fd, 0, os.SEEK_SET)
    return (out_r, err_r, rep_r), (stdin_fd, out_w, err_w, rep_w)


def _run_child(job, test, fds, report_fd, nonce):
    """In the forked child: enter the jail, run the test, and exit; never returns."""
    try:
        _enter_child(job, fds, report_fd)
    except BaseException as e:
        _say("sandbox setup failed: ", e)
        os._exit(EXIT_SANDBOX_ERROR)
    try:
        _child_main(job, test, report_fd, nonce)
    finally:
        os._exit(EXIT_TEST_FAILED)


class _Outputs:
    """The parent's read ends of the child's stdout, stderr and report pipes, and what came
    through them (stderr: its last 2000 bytes; the judged channel: up to the cap)."""

    def __init__(self, job, out_r, err_r, rep_r):
        self.out_r, self.err_r, self.rep_r = out_r, err_r, rep_r
        self.cap, self.err_cap = job["output_bytes"], 2000
        self.bufs = {out_r: bytearray(), err_r: bytearray(), rep_r: bytearray()}
        self.open_fds = set(self.bufs)
        # The channel that carries a test's output: stdout ("io"), the report pipe ("call").
        self.output_fd = {"io": out_r, "call": rep_r}.get(job["mode"])

    def drain(self, fd):
        """Read one chunk; True when the output channel of an I/O test went over the cap."""
        chunk = os.read(fd, 65536)
        if not chunk:
            self.open_fds.discard(fd)
            return False
        buf, cap = self.bufs[fd], self.cap
        if fd == self.err_r:
            buf += chunk
            del buf[: max(0, len(buf) - self.err_cap)]
        elif fd == self.output_fd:
            if len(buf) + len(chunk) > cap:
                return True
            buf += chunk
        elif fd == self.out_r:
            # chatty, but not judged on stdout: keep up to the cap, drop the rest
            buf += chunk[: max(0, cap - len(buf))]
        elif len(buf) < 256:  # the nonce channel of "assert"/"check"
            buf += chunk[: 256 - len(buf)]
        return False

    def drain_leftovers(self, overflow):
        """Whatever the child wrote before exiting is in the pipes now; grandchildren may keep
        the write ends open forever, so read only what is there. Returns `overflow`, updated."""
        for fd in list(self.open_fds):
            while not overflow and fd in self.open_fds and select.select([fd], [], [], 0)[0]:
                overflow = self.drain(fd)
        return overflow

    def close(self):
        for fd in self.bufs:
            os.close(fd)

    def text(self, fd):
        return bytes(self.bufs[fd]).decode("utf-8", "replace")

    def last_error_line(self):
        err_text = bytes(self.bufs[self.err_r][-self.err_cap :]).decode("utf-8", "replace").strip()
        return err_text.splitlines()[-1][:300] if err_text else ""


def _wait_child(pid, pidfd, outputs, deadline):
    """The parent's wait: read the pipes until the child exits, its judged output goes over the
    cap, or the deadline passes. Returns (exit_status or None, timed_out, overflow)."""
    exit_status, timed_out, overflow = None, False, False
    while exit_status is None and not overflow:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        readable, _, _ = select.select([*outputs.open_fds, pidfd], [], [], remaining)
        for fd in readable:
            if fd == pidfd:
                _, exit_status = os.waitpid(pid, 0)
            elif outputs.drain(fd):
                overflow = True
                break
    return exit_status, timed_out, overflow


def _verdict(job, outputs, exit_status, overflow, nonce):
    """The result of a test that ended in time, from its exit status and what it wrote."""
    last_line = outputs.last_error_line()
    if outputs.output_fd is not None:
        # An I/O test: return what it produced; the host, which alone knows the expected
        # output, judges it ("ran" is not a pass).
        if overflow:  # the child may still be running: no exit status
            return {"status": "failed", "detail": f"output exceeded {outputs.cap} bytes"}
        code = os.WEXITSTATUS(exit_status) if os.WIFEXITED(exit_status) else None
        # "io": the exit status is the program's own, not the runner's load-error code
        if code == EXIT_LOAD_ERROR and job["mode"] == "call":
            return {"status": "load_error", "detail": last_line or "program failed to load"}
        if code != 0:
            return {"status": "failed", "detail": _describe(exit_status, last_line)}
        return {"status": "ran", "detail": "", "output": outputs.text(outputs.output_fd)}
    report = bytes(outputs.bufs[outputs.rep_r])
    if report == nonce:
        return {"status": "passed", "detail": ""}
    if report:
        return {"status": "tampered", "detail": "report channel carried a forged message"}
    code = os.WEXITSTATUS(exit_status) if os.WIFEXITED(exit_status) else None
    if code == EXIT_LOAD_ERROR:
        return {"status": "load_error", "detail": last_line or "program failed to load"}
    if code == EXIT_SANDBOX_ERROR and last_line.startswith("sandbox setup failed"):
        return {"status": "sandbox_error", "detail": last_line}
    return {"status": "failed", "detail": _describe(exit_status, last_line)}


def _describe(exit_status, last_line):
    if os.WIFSIGNALED(exit_status):
        sig = os.WTERMSIG(exit_status)
        what = {signal.SIGXCPU: " (CPU time limit)", signal.SIGKILL: " (killed)"}.get(sig, "")
        return f"killed by {signal.Signals(sig).name}{what}"
    code = os.WEXITSTATUS(exit_status)
    if code == EXIT_TEST_FAILED and last_line:
        return last_line
    return f"exited with status {code} before the test finished" + (
        f": {last_line}" if last_line else ""
    )


def main():
    started = time.monotonic()
    job = json.loads(sys.stdin.buffer.read())
    warnings = []
    isolated = job["isolated"]
    for cgroup in job["cgroups"]:  # first, so that every process of the sandbox is counted
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write("0")
    # The OOM killer should take a test, not us. Lowering needs CAP_SYS_RESOURCE and some hosts
    # refuse it even to root; the children raising theirs to 1000 is what matters.
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")
    if isolated:
        if os.getpid() != 1:
            raise RuntimeError("isolated mode needs the runner to be PID 1 of a new namespace")
        setup_jail(job, warnings)
    else:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if job["uid"] is not None:
            os.chown(job["workdir"], job["uid"], job["uid"])
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries cannot give root back
    results = []
    for i in range(len(job["tests"])):
        time_left = job["timeout_s"] - (time.monotonic() - started)
        if time_left <= 0.01:
            results.append({"status": "timeout", "detail": "no time left for this test"})
            continue
        results.append(run_test(job, i, time_left, isolated))
    sys.stdout.write(json.dumps({"results": results, "warnings": warnings}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
