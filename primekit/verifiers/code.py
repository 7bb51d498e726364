"""Code answers: take the last fenced Python block, run it against the problem's tests, sandboxed.

Score = fraction of tests passed (soft labels for the PRM, as in the PRIME reference code).
Test formats (`Problem.tests`, primekit/data/code_tests.py): a list of assert-statement strings
(each one test); a dict {"inputs": [...], "outputs": [...]} of stdin/stdout cases (each pair one
test); the same dict with "fn_name": "f" of function calls (inputs[i] is the argument list of
call i, outputs[i] its expected return value; APPS/TACO call-based style); or a dict
{"check": "<source defining check(candidate)>", "entry_point": "f"} (HumanEval; one test).
Malformed tests (no known format, or a test that is not valid Python) grade `error`: the data's
fault, not the model's.
For the stdin/stdout and function-call forms the expected outputs stay in this process: the
sandbox only returns what the program produced (`outputs.judge` compares it here).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from primekit.config import VerifierConfig
from primekit.data.code_tests import normalize_tests
from primekit.data.problem import Problem
from primekit.verifiers.base import Verdict, check_batch
from primekit.verifiers.sandbox import SandboxLimits, SandboxResult, run_program

__all__ = ["CodeVerifier", "extract_code", "normalize_tests", "to_verdict"]

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


def extract_code(response: str) -> str | None:
    """The last closed fenced block tagged python/py/python3 or untagged, or None.

    Args:
        response: model output.
    Returns:
        the code inside the fence (without the fence lines), or None if there is no such block.
    """
    blocks = [m.group(2) for m in _FENCE.finditer(response) if m.group(1).lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks else None


def to_verdict(result: SandboxResult) -> Verdict:
    """Fold per-test outcomes into one Verdict (score = fraction of tests passed)."""
    if result.status == "timeout":
        return Verdict.timeout(result.detail)
    if result.status == "error":
        return Verdict.error(f"sandbox: {result.detail}")
    tests = result.tests
    if not tests:
        return Verdict.error("no tests to run")
    statuses = [t["status"] for t in tests]
    first_failure = next((t["detail"] for t in tests if t["status"] != "passed"), "")
    if "sandbox_error" in statuses:
        return Verdict.error(f"sandbox: {first_failure}")
    if "tampered" in statuses:  # a forged pass report voids every test of the program
        return Verdict.incorrect(0.0, "program forged a test report")
    score = statuses.count("passed") / len(statuses)
    if score == 1.0:
        return Verdict.correct()
    if all(s == "load_error" for s in statuses):
        return Verdict.error(f"program: {first_failure}")
    if "timeout" in statuses:
        detail = next(t["detail"] for t in tests if t["status"] == "timeout")
        return Verdict.timeout(detail, score=score)
    return Verdict.incorrect(score, first_failure)


class CodeVerifier:
    """Runs the response's code against `problem.tests` in the sandbox; score = fraction passed.

    Args:
        timeout_s: wall-clock limit for one response (all its tests); never exceeded by more
            than sandbox.GRACE_S.
        memory_mb: address-space limit per sandboxed process.
        max_workers: responses run in parallel by verify_batch.
        test_timeout_s: wall-clock limit per test (None: timeout_s).
        isolation: "auto", "namespaces" or "none" (see sandbox.py).
        require_fence: if False, a response without a fenced block is run as code as a whole.
        plain_returns: HumanEval-style candidates must return plain builtin data.
    The limits default to the config's (verifier.code_timeout_s, code_memory_mb, code_workers,
    code_test_timeout_s).
    """

    def __init__(
        self,
        timeout_s: float = VerifierConfig.code_timeout_s,
        memory_mb: int = VerifierConfig.code_memory_mb,
        max_workers: int = VerifierConfig.code_workers,
        *,
        test_timeout_s: float | None = VerifierConfig.code_test_timeout_s,
        isolation: Literal["auto", "namespaces", "none"] = "auto",
        require_fence: bool = True,
        plain_returns: bool = True,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.limits = SandboxLimits(
            timeout_s=timeout_s, test_timeout_s=test_timeout_s, memory_mb=memory_mb
        )
        if isolation not in ("auto", "namespaces", "none"):
            raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', got {isolation!r}")
        self.max_workers = max_workers
        self.isolation = isolation
        self.require_fence = require_fence
        self.plain_returns = plain_returns

    def verify(self, response: str, problem: Problem) -> Verdict:
        try:
            if not isinstance(response, str):
                return Verdict.error(f"response is {type(response).__name__}, not str")
            code = extract_code(response)
            if code is None:
                if self.require_fence:
                    return Verdict.incorrect(reason="no fenced python code block")
                code = response
            try:
                mode, tests = normalize_tests(problem.tests)
            except (ValueError, TypeError) as e:
                return Verdict.error(f"bad tests for problem {problem.id!r}: {e}")
            result = run_program(
                code,
                mode,
                tests,
                self.limits,
                isolation=self.isolation,
                plain_returns=self.plain_returns,
            )
            return to_verdict(result)
        except Exception as e:  # never raise to the trainer: a broken check is an "error"
            return Verdict.error(f"verifier: {type(e).__name__}: {str(e)[:200]}")

    def verify_batch(self, responses: list[str], problems: list[Problem]) -> list[Verdict]:
        """One Verdict per pair, `max_workers` sandboxes at a time; raises only on length mismatch."""
        check_batch(responses, problems)
        if len(responses) <= 1 or self.max_workers == 1:
            return [self.verify(r, p) for r, p in zip(responses, problems)]
        with ThreadPoolExecutor(self.max_workers, thread_name_prefix="pk-code-verify") as ex:
            return list(ex.map(self.verify, responses, problems))
