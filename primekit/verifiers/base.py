"""The verdict every verifier returns, so that "wrong" and "broken" are never confused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from primekit.data.problem import Problem

Status = Literal["correct", "incorrect", "error", "timeout"]


@dataclass(frozen=True)
class Verdict:
    """Outcome of checking one response.

    score: the outcome reward in [0, 1] (fraction of tests passed for code; 0/1 otherwise).
    status: "correct" (score == 1), "incorrect" (checked, not fully right), "error" (the checker
        or the program failed; `reason` says how) or "timeout" (a time limit was hit).
    reason: a short human-readable explanation, empty for plain correct/incorrect.
    retries: how many times grading was restarted on a fresh worker because the one grading it
        died (not a time-out); the verdict is still that of a complete grading.
    """

    score: float
    status: Status
    reason: str = ""
    retries: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"Verdict.score must lie in [0, 1], got {self.score}")
        if self.retries < 0:
            raise ValueError(f"Verdict.retries must be >= 0, got {self.retries}")

    @classmethod
    def correct(cls) -> Verdict:
        return cls(1.0, "correct")

    @classmethod
    def incorrect(cls, score: float = 0.0, reason: str = "") -> Verdict:
        return cls(score, "incorrect", reason)

    @classmethod
    def error(cls, reason: str, score: float = 0.0) -> Verdict:
        return cls(score, "error", reason)

    @classmethod
    def timeout(cls, reason: str = "time limit exceeded", score: float = 0.0) -> Verdict:
        return cls(score, "timeout", reason)


class Verifier(Protocol):
    """Grades responses to problems. Never raises to its caller, never blocks past its limit."""

    def verify(self, response: str, problem: Problem) -> Verdict: ...

    def verify_batch(self, responses: list[str], problems: list[Problem]) -> list[Verdict]: ...


def check_batch(responses: list[str], problems: list[Problem]) -> None:
    """`verify_batch`'s one precondition: a response per problem. A mismatch is a bug in the
    caller, not a property of a response, so it raises instead of grading."""
    if len(responses) != len(problems):
        raise ValueError(f"responses and problems must have equal length, got {len(responses)} "
                         f"and {len(problems)}")
