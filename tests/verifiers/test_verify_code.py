"""CodeVerifier: code extraction, test formats, scoring, and the sandbox doing honest work."""

from __future__ import annotations

import time

import pytest

from primekit.data.problem import Problem
from primekit.verifiers.code import CodeVerifier, extract_code, normalize_tests, to_verdict
from primekit.verifiers.sandbox import SandboxLimits, SandboxResult, namespaces_available

ADD = "def add(a, b):\n    return a + b\n"


def _fence(code: str, tag: str = "python") -> str:
    return f"Here you go.\n```{tag}\n{code}```\nDone."


def _problem(tests) -> Problem:
    return Problem(id="p", prompt="", task="code", tests=tests)


@pytest.fixture(scope="module")
def verifier():
    return CodeVerifier(timeout_s=5.0, memory_mb=512, max_workers=2)


# -- pure helpers -----------------------------------------------------------------------------


def test_extract_code_takes_the_last_python_or_untagged_block():
    response = "```python\nx = 1\n```\ntext\n```\ny = 2\n```\n```bash\nrm -rf /\n```"
    assert extract_code(response) == "y = 2\n"  # the bash block is not Python
    assert extract_code("```py\nz = 3\n```") == "z = 3\n"
    assert extract_code("```Python3 title\nw = 4\n```") == "w = 4\n"
    assert extract_code("no code at all") is None
    assert extract_code("```python\nnever closed") is None


def test_normalize_tests_formats():
    assert normalize_tests("assert f() == 1") == ("assert", ["assert f() == 1"])
    assert normalize_tests(["assert a", "assert b"]) == ("assert", ["assert a", "assert b"])
    io = {"inputs": ["1\n", ["2", "3"]], "outputs": ["1\n", ["5"]]}
    assert normalize_tests(io) == ("io", [["1\n", "1\n"], ["2\n3", "5"]])
    check = {"check": "def check(c): pass", "entry_point": "f", "extra": 1}
    assert normalize_tests(check) == (
        "check",
        [{"check": "def check(c): pass", "entry_point": "f"}],
    )
    call = {"fn_name": "add", "inputs": [[1, 2], [[3], 4]], "outputs": [3, [7]]}
    assert normalize_tests(call) == (
        "call",
        [{"fn_name": "add", "args": [1, 2], "output": 3},
         {"fn_name": "add", "args": [[3], 4], "output": [7]}],
    )
    # fn_name null (APPS rows without a function) is the stdin/stdout form
    assert normalize_tests({**io, "fn_name": None})[0] == "io"
    for bad in [None, 3, {"inputs": ["1"], "outputs": []}, {"check": "x"}, [1, 2],
                {"fn_name": "f", "inputs": [1], "outputs": [1]},
                {"fn_name": "os.system", "inputs": [[1]], "outputs": [1]},
                [], ["assert f(1) == 2", "assert f(2 =="], {"inputs": [], "outputs": []},
                {"check": "def check(c) pass", "entry_point": "f"}]:
        with pytest.raises(ValueError):
            normalize_tests(bad)


def _result(*statuses: str) -> SandboxResult:
    return SandboxResult([{"status": s, "detail": f"d-{s}"} for s in statuses], "ok")


def test_to_verdict_scores_are_fractions_passed():
    assert to_verdict(_result("passed", "passed")).status == "correct"
    v = to_verdict(_result("passed", "failed", "passed"))  # 2 of 3
    assert (v.status, v.score, v.reason) == ("incorrect", 2 / 3, "d-failed")
    v = to_verdict(_result("passed", "timeout", "failed", "passed"))  # 2 of 4, one timed out
    assert (v.status, v.score) == ("timeout", 0.5)
    v = to_verdict(_result("load_error", "load_error"))
    assert (v.status, v.score) == ("error", 0.0) and v.reason.startswith("program:")
    v = to_verdict(_result("passed", "tampered"))  # a forged report voids the lot
    assert (v.status, v.score) == ("incorrect", 0.0)
    assert to_verdict(_result("passed", "sandbox_error")).status == "error"
    assert to_verdict(SandboxResult([], "timeout", "late")).status == "timeout"
    assert to_verdict(SandboxResult([], "error", "boom")).reason == "sandbox: boom"


def test_limits_are_validated():
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(ValueError, match="max_workers"):
        CodeVerifier(max_workers=0)
    with pytest.raises(ValueError, match="isolation"):
        CodeVerifier(isolation="docker")  # type: ignore[arg-type]


# -- running programs -------------------------------------------------------------------------


def test_assert_tests_partial_credit(verifier):
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]
    v = verifier.verify(_fence(ADD), _problem(tests))
    assert (v.status, v.score) == ("incorrect", 2 / 3) and "AssertionError" in v.reason


def test_stdin_stdout_tests(verifier):
    code = "import sys\na, b = map(float, sys.stdin.read().split())\nprint(a / b)\nsys.exit(0)\n"
    tests = {"inputs": ["1 3\n", "4 2\n", "1 4\n"], "outputs": ["0.3333333\n", "2.0\n", "0.3\n"]}
    v = verifier.verify(_fence(code), _problem(tests))
    # 1/3 = 0.333333333 matches 0.3333333 within 1e-6; 2.0 exact; 0.25 != 0.3  -> 2 of 3
    assert (v.status, v.score, v.reason) == ("incorrect", 2 / 3, "wrong output")


def test_stdin_stdout_nonzero_exit_fails(verifier):
    tests = {"inputs": [""], "outputs": ["hi\n"]}
    v = verifier.verify(_fence("print('hi')\nraise SystemExit(2)\n"), _problem(tests))
    assert v.score == 0.0 and "status 2" in v.reason


def test_humaneval_style_check(verifier):
    check = "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n"
    code = "def my_sort(xs):\n    return sorted(xs)\n"
    v = verifier.verify(_fence(code), _problem({"check": check, "entry_point": "my_sort"}))
    assert v.status == "correct"
    v = verifier.verify(
        _fence("def other(xs):\n    return xs\n"),
        _problem({"check": check, "entry_point": "my_sort"}),
    )
    assert v.score == 0.0 and "KeyError" in v.reason


def test_plain_returns_guard_is_what_blocks_always_equal():
    check = "def check(candidate):\n    assert candidate(1) == 2\n"
    code = "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n"
    tests = {"check": check, "entry_point": "f"}
    guarded = CodeVerifier(timeout_s=5.0).verify(_fence(code), _problem(tests))
    unguarded = CodeVerifier(timeout_s=5.0, plain_returns=False).verify(
        _fence(code), _problem(tests)
    )
    assert (guarded.score, unguarded.score) == (0.0, 1.0)


def test_syntax_error_is_a_program_error(verifier):
    v = verifier.verify(
        _fence("def add(a, b)\n    return a + b\n"), _problem(["assert add(1, 2) == 3"])
    )
    assert (v.status, v.score) == ("error", 0.0) and "SyntaxError" in v.reason


def test_a_test_with_a_syntax_error_is_the_datas_error_not_the_models(verifier):
    # A correct solution, one good test and one that does not compile: before the tests were
    # checked, the runner's SyntaxError in test 2 counted as a failed test and the model was
    # graded incorrect with score 0.5.
    v = verifier.verify(_fence(ADD), _problem(["assert add(1, 2) == 3", "assert add(2, 2) =="]))
    assert (v.status, v.score) == ("error", 0.0), v
    assert "bad tests for problem 'p'" in v.reason and "test 2 is not valid Python" in v.reason
    check = {"check": "def check(candidate)\n    assert candidate(1, 2) == 3\n",
             "entry_point": "add"}
    v = verifier.verify(_fence(ADD), _problem(check))
    assert v.status == "error" and "'check' is not valid Python" in v.reason
    v = verifier.verify(_fence(ADD), _problem({"inputs": [], "outputs": []}))
    assert v.status == "error" and "there are no tests" in v.reason
    # The same solution against well-formed tests is correct: only the tests changed.
    assert verifier.verify(_fence(ADD), _problem(["assert add(1, 2) == 3"])).status == "correct"


def test_stdlib_imports_work_inside_the_jail(verifier):
    # Modules the runner never imported must still load (the interpreter stays visible even
    # though /root and /home are hidden), and /tmp and the cwd are writable tmpfs.
    code = (
        "import fractions, heapq, decimal, sqlite3, csv, json, os\n"
        "open('scratch.txt', 'w').write('ok')\n"
        "open('/tmp/scratch.txt', 'w').write('ok')\n" + ADD
    )
    v = verifier.verify(_fence(code), _problem(["assert add(1, 2) == 3"]))
    assert v.status == "correct", v.reason


def test_missing_fence_and_bad_tests(verifier):
    v = verifier.verify("def add(a, b): return a + b", _problem(["assert add(1, 2) == 3"]))
    assert (v.status, v.reason) == ("incorrect", "no fenced python code block")
    raw = CodeVerifier(timeout_s=5.0, require_fence=False)
    assert (
        raw.verify("def add(a, b): return a + b", _problem(["assert add(1, 2) == 3"])).score == 1.0
    )
    v = verifier.verify(_fence(ADD), _problem({"weird": 1}))
    assert v.status == "error" and "bad tests" in v.reason
    assert verifier.verify(None, _problem(["assert True"])).status == "error"  # type: ignore[arg-type]


def test_verify_batch_runs_in_parallel_and_keeps_order(verifier):
    slow = "import time\ntime.sleep(0.6)\n"
    responses = [_fence(slow + ADD), _fence(slow + "def add(a, b):\n    return 0\n")] * 2
    problems = [_problem(["assert add(1, 2) == 3"])] * 4
    t0 = time.monotonic()
    verdicts = verifier.verify_batch(responses, problems)
    elapsed = time.monotonic() - t0
    assert [v.score for v in verdicts] == [1.0, 0.0, 1.0, 0.0]
    assert elapsed < 4 * 0.6  # two at a time: about 2 x (0.6 s + start-up), not 4 x
    with pytest.raises(ValueError, match="equal length"):
        verifier.verify_batch(responses, problems[:1])


@pytest.mark.skipif(not namespaces_available(), reason="compares with the namespace mode")
def test_fallback_mode_runs_honest_code():
    # Without namespaces the program runs under a private uid; the preloaded stdlib still works.
    v = CodeVerifier(timeout_s=5.0, isolation="none").verify(
        _fence(ADD), _problem(["assert add(1, 2) == 3"])
    )
    assert v.status == "correct", v.reason


# -- the I/O forms: outputs come back, the comparison happens here --------------------------


def test_expected_outputs_never_enter_the_sandbox(monkeypatch):
    from primekit.verifiers import sandbox

    jobs = []
    real_launch = sandbox._launch
    monkeypatch.setattr(sandbox, "_launch", lambda job, *a: jobs.append(job) or real_launch(job, *a))
    secret_out, secret_ret = "out-7f3a9c", "ret-5b2e81"
    stdio = {"inputs": ["x\n"], "outputs": [secret_out]}
    call = {"fn_name": "f", "inputs": [["x"]], "outputs": [secret_ret]}
    v = CodeVerifier(timeout_s=5.0)
    assert v.verify(_fence(f"input()\nprint({secret_out!r})\n"), _problem(stdio)).score == 1.0
    assert v.verify(_fence(f"def f(x):\n    return {secret_ret!r}\n"), _problem(call)).score == 1.0
    assert [j["tests"] for j in jobs] == [["x\n"], [{"fn_name": "f", "args": ["x"]}]]
    # ... the expected outputs did not (they appear only in the program, which we wrote)
    assert [secret_out in repr(j["tests"]) for j in jobs] == [False, False]
    assert [secret_ret in repr(j["tests"]) for j in jobs] == [False, False]


def test_function_call_tests(verifier):
    tests = {"fn_name": "add", "inputs": [[1, 2], [2, 2], [0, 0]], "outputs": [3, 4, 0]}
    assert verifier.verify(_fence(ADD), _problem(tests)).status == "correct"
    # partial credit: the fraction of calls that return the right value
    half = "def add(a, b):\n    return a + b if a == 1 else -1\n"
    v = verifier.verify(_fence(half), _problem(tests))
    assert (v.status, v.score, v.reason) == ("incorrect", 1 / 3, "wrong return value")


def test_function_call_conventions(verifier):
    # LeetCode style (a method of Solution), tuples as lists, APPS's one-element-list outputs,
    # and printing inside the function does not disturb the returned value.
    leet = (
        "class Solution:\n    def pair(self, n):\n        print('debug', n)\n"
        "        return (n, n * 2)\n"
    )
    tests = {"fn_name": "pair", "inputs": [[1], [2]], "outputs": [[1, 2], [[2, 4]]]}
    assert verifier.verify(_fence(leet), _problem(tests)).status == "correct"
    floats = {"fn_name": "f", "inputs": [[]], "outputs": [0.3]}
    assert verifier.verify(_fence("def f():\n    return 0.1 + 0.2\n"), _problem(floats)).score == 1.0


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("def f():\n    return {1, 2}\n", "non-plain set"),
        ("def f():\n    return float('nan')\n", "Out of range float"),
        ("def g():\n    return 1\n", "no function named 'f'"),
        ("def f():\n    return True\n", "wrong return value"),  # True is not 1
    ],
    ids=["set", "nan", "missing", "bool-for-int"],
)
def test_function_call_failures(verifier, code, reason):
    v = verifier.verify(_fence(code), _problem({"fn_name": "f", "inputs": [[]], "outputs": [1]}))
    assert (v.status, v.score) == ("incorrect", 0.0) and reason in v.reason, v


def test_function_call_program_that_does_not_load_is_a_program_error(verifier):
    v = verifier.verify(_fence("def f(:\n"), _problem({"fn_name": "f", "inputs": [[]],
                                                        "outputs": [1]}))
    assert v.status == "error" and v.reason.startswith("program:") and "SyntaxError" in v.reason
