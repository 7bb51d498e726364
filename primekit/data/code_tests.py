"""The formats of a code problem's tests (`Problem.tests`), checked where data is read and where
code is graded (verifiers/code.py).

  a list of assert-statement strings (or one string)   each statement one test ("assert")
  {"inputs": [...], "outputs": [...]}                   stdin/stdout cases ("io")
  the same with "fn_name": "f"                          function calls ("call"; APPS/TACO):
                                                        inputs[i] the argument list of call i,
                                                        outputs[i] its expected return value
  {"check": "<def check(candidate)>", "entry_point": "f"}   HumanEval ("check"; one test)

Malformed tests are the data's fault, not the model's: a test that is not valid Python, or a
form that is none of these, is refused when the file is loaded (naming file, line and field) and
graded `error` (never `incorrect`) when a problem built elsewhere reaches the verifier.
"""

from __future__ import annotations

from typing import Any, Literal

Mode = Literal["assert", "io", "call", "check"]


def _as_text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list) and all(isinstance(s, str) for s in x):
        return "\n".join(x)
    raise ValueError(
        f"stdin/stdout cases must be strings or lists of strings, got {type(x).__name__}"
    )


def _check_python(source: str, what: str) -> None:
    """ValueError naming `what` when `source` does not compile (a test's own syntax error)."""
    try:
        compile(source, what, "exec")
    except SyntaxError as e:
        raise ValueError(f"{what} is not valid Python: {e.msg} (its line {e.lineno}): "
                         f"{source.strip()[:80]!r}") from None
    except ValueError as e:  # e.g. a null byte in the source
        raise ValueError(f"{what} is not valid Python: {e}") from None
    except (MemoryError, RecursionError):  # `assert not not ... 1`, thousands deep
        raise ValueError(f"{what} is nested too deeply for Python's compiler: "
                         f"{source.strip()[:80]!r}") from None


def normalize_tests(tests: Any) -> tuple[Mode, list[Any]]:
    """Turn any supported `Problem.tests` value into (mode, list of tests) for the sandbox.

    Raises:
        ValueError saying what is wrong: not one of the formats above, no tests at all, or a
        test (assert statement, check source) that is not valid Python.
    """
    mode, out = _normalize(tests)
    if not out:
        raise ValueError("there are no tests")
    if mode == "assert":
        for i, test in enumerate(out, start=1):
            _check_python(test, f"test {i}")
    elif mode == "check":
        _check_python(out[0]["check"], "'check'")
    return mode, out


def _normalize(tests: Any) -> tuple[Mode, list[Any]]:
    if isinstance(tests, str):
        return "assert", [tests]
    if isinstance(tests, (list, tuple)) and all(isinstance(t, str) for t in tests):
        return "assert", list(tests)
    if isinstance(tests, dict) and "check" in tests:
        if not isinstance(tests.get("entry_point"), str) or not isinstance(tests["check"], str):
            raise ValueError("check-style tests need str 'check' and str 'entry_point'")
        return "check", [{"check": tests["check"], "entry_point": tests["entry_point"]}]
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        inputs, outputs = tests["inputs"], tests["outputs"]
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            raise ValueError("'inputs' and 'outputs' must be lists")
        if len(inputs) != len(outputs):
            raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
        fn_name = tests.get("fn_name")
        if fn_name is None:
            return "io", [[_as_text(i), _as_text(o)] for i, o in zip(inputs, outputs)]
        if not isinstance(fn_name, str) or not fn_name.isidentifier():
            raise ValueError(f"'fn_name' must be a Python identifier, got {fn_name!r}")
        if not all(isinstance(args, list) for args in inputs):
            raise ValueError("function-call 'inputs' must be lists of arguments")
        return "call", [{"fn_name": fn_name, "args": a, "output": o} for a, o in zip(inputs, outputs)]
    raise ValueError(f"unsupported tests format: {type(tests).__name__} {str(tests)[:80]!r}")
