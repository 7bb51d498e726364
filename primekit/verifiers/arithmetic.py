"""Exact-match grading of the procedural arithmetic task (primekit.data.arithmetic).

The task's format is defined there; this module only reads a response's final "A:<integer>" line
and compares it with the problem's gold answer.
"""

from __future__ import annotations

import re

from primekit.data.arithmetic import ANSWER_PREFIX, STEP_DELIMITER
from primekit.data.problem import Problem
from primekit.verifiers.base import Verdict, check_batch

_INT = re.compile(r"[+-]?\d+")


def extract_final_answer(response: str) -> str | None:
    """The integer on the FIRST line that starts with "A:", or None if there is none.

    The first answer line counts, not the last: a policy must not be able to hedge by writing
    several answers. Surrounding spaces are ignored; anything else after the integer
    ("A:9x", "A:") makes the response malformed (None).
    """
    for line in response.split(STEP_DELIMITER):
        if line.startswith(ANSWER_PREFIX):
            value = line[len(ANSWER_PREFIX) :].strip()
            return value if _INT.fullmatch(value) else None
    return None


class ArithmeticVerifier:
    """Exact-match verifier for the arithmetic task: correct iff the first "A:" line's integer
    equals problem.answer. Never raises."""

    def verify(self, response: str, problem: Problem) -> Verdict:
        try:
            if problem.answer is None:
                return Verdict.error(f"problem {problem.id!r} has no gold answer")
            predicted = extract_final_answer(response)
            if predicted is None:
                return Verdict.incorrect(reason="no final answer line 'A:<integer>'")
            if int(predicted) == int(problem.answer):
                return Verdict.correct()
            return Verdict.incorrect(reason=f"answer {predicted} != {problem.answer}")
        except Exception as err:  # a verifier must grade, never crash the training step
            return Verdict.error(f"{type(err).__name__}: {err}")

    def verify_batch(self, responses: list[str], problems: list[Problem]) -> list[Verdict]:
        check_batch(responses, problems)
        return [self.verify(r, p) for r, p in zip(responses, problems)]
