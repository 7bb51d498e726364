"""Judging what a sandboxed program produced, in the grader's own process.

For the I/O test forms the expected outputs never enter the sandbox: the runner sends back what
each test produced (its stdout, or the function's return value as JSON text) and these
functions compare it with the expected output here. The program can choose what it outputs, but
it cannot see the expected output, and nothing it made is executed or compared by its own code.
"""

from __future__ import annotations

import json
import math
from typing import Any

FLOAT_TOLERANCE = 1e-6  # relative above 1, absolute below


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= FLOAT_TOLERANCE * max(1.0, abs(y))


def same_stdout(got: str, want: str) -> bool:
    """Line-wise match ignoring trailing whitespace; else token-wise with float tolerance.

    Tokens that both read as floats match within FLOAT_TOLERANCE (relative above 1).
    """
    if [x.rstrip() for x in got.strip().splitlines()] == [
        x.rstrip() for x in want.strip().splitlines()
    ]:
        return True
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not (math.isfinite(fx) and math.isfinite(fy) and _close(fx, fy)):
            return False
    return True


def same_value(got: Any, want: Any) -> bool:
    """Equality of two plain JSON values (parsed by `json.loads`): ints and floats compare as
    numbers (floats within FLOAT_TOLERANCE), booleans only equal booleans, lists element-wise,
    dicts key by key."""
    if isinstance(got, bool) or isinstance(want, bool):
        return type(got) is type(want) and got == want
    if isinstance(got, int | float) and isinstance(want, int | float):
        if isinstance(got, int) and isinstance(want, int):
            return got == want
        return _close(float(got), float(want))
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in got)
    return type(got) is type(want) and got == want  # str, None


def same_return(got: Any, want: Any) -> bool:
    """A function test's return value against its expected output.

    APPS/TACO-style call-based data (and so the paper's code data) usually wraps the expected
    return value in a one-element list: `want = [3]` for a function returning 3. As the reference
    graders do, either `got == want` or, for a non-empty list `want`, `got == want[0]` passes.
    Tuples arrive as lists (JSON has no tuples).
    """
    if same_value(got, want):
        return True
    return isinstance(want, list) and len(want) > 0 and same_value(got, want[0])


def judge(mode: str, expected: list[Any], results: list[dict[str, str]]) -> list[dict[str, str]]:
    """Turn each "ran" result of an I/O test into "passed" or "failed" against `expected`.

    Args:
        mode: "io" (output is stdout, expected a string) or "call" (output is JSON text of the
            return value, expected a JSON value).
        expected: one expected output per test, in order.
        results: the runner's per-test results; other statuses are returned unchanged.
    Returns:
        the per-test results, without the raw outputs.
    """
    judged = []
    for result, want in zip(results, expected):
        if result.get("status") != "ran":
            judged.append({"status": result.get("status", "sandbox_error"),
                           "detail": result.get("detail", "")})
            continue
        output = result.get("output", "")
        if mode == "io":
            ok, why = same_stdout(output, want), "wrong output"
        else:
            try:
                ok, why = same_return(json.loads(output), want), "wrong return value"
            except (ValueError, RecursionError):
                ok, why = False, "return value is not JSON"
        judged.append({"status": "passed", "detail": ""} if ok else {"status": "failed",
                                                                     "detail": why})
    return judged
