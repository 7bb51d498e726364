"""Grading of the reasoning-gym task families (primekit.data.rgym) by reasoning-gym's own scorer.

A response's answer is the text of its FIRST line starting with "A:" (stripped), as for the
arithmetic task; that string is handed to the dataset's `score_answer(answer, entry)` with the
entry rebuilt from the Problem (question = prompt, answer, metadata). reasoning-gym's score is
the outcome reward: 1.0 is "correct"; below 1.0 "incorrect" with that score (chain_sum gives
partial credit when the gold is a substring of the answer: gold "4", answer "-4" scores 0.5;
that is reasoning-gym's rule, kept as it is). A response with no answer line scores 0 and is
"incorrect"; a scorer that raises is an "error".
"""

from __future__ import annotations

from typing import Any

from primekit.data.arithmetic import ANSWER_PREFIX, STEP_DELIMITER
from primekit.data.problem import Problem
from primekit.verifiers.base import Verdict, check_batch


def extract_answer(response: str) -> str | None:
    """The text after "A:" on the FIRST line that starts with it, stripped; None if there is
    no such line or it is empty. Only the first counts: several answers cannot hedge."""
    for line in response.split(STEP_DELIMITER):
        if line.startswith(ANSWER_PREFIX):
            value = line[len(ANSWER_PREFIX):].strip()
            return value or None
    return None


class RgymVerifier:
    """reasoning-gym's `score_answer` for each problem's dataset (meta["rgym_dataset"]), behind
    the Verifier protocol. The scorers are built on first use, one per dataset. Never raises."""

    def __init__(self) -> None:
        self._scorers: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_scorers": {}}  # bound methods of reasoning-gym datasets: rebuilt, not pickled

    def _scorer(self, name: str):
        if name not in self._scorers:
            from primekit.data.rgym import import_reasoning_gym

            self._scorers[name] = import_reasoning_gym().get_score_answer_fn(name)
        return self._scorers[name]

    def verify(self, response: str, problem: Problem) -> Verdict:
        try:
            name = problem.meta.get("rgym_dataset")
            if not name:
                return Verdict.error(f"problem {problem.id!r} names no reasoning-gym dataset "
                                     "(meta['rgym_dataset'])")
            if problem.answer is None:
                return Verdict.error(f"problem {problem.id!r} has no gold answer")
            answer = extract_answer(response)
            if answer is None:
                return Verdict.incorrect(reason="no final answer line 'A:<answer>'")
            entry = {"question": problem.prompt, "answer": problem.answer,
                     "metadata": problem.meta.get("rgym_metadata", {})}
            score = float(self._scorer(name)(answer, entry))
            if score == 1.0:
                return Verdict.correct()
            return Verdict.incorrect(score=min(max(score, 0.0), 1.0),
                                     reason=f"answer {answer!r} != {problem.answer!r}")
        except Exception as err:  # a verifier must grade, never crash the training step
            return Verdict.error(f"{type(err).__name__}: {err}")

    def verify_batch(self, responses: list[str], problems: list[Problem]) -> list[Verdict]:
        check_batch(responses, problems)
        return [self.verify(r, p) for r, p in zip(responses, problems)]
