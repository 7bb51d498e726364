"""Exact-match grading of the procedural arithmetic task (primekit.data.arithmetic).

The task's format is defined there; the verifier only reads a response's final "A:<integer>" line
and compares it with the problem's gold answer. `first_wrong_line` and `trace_error_counts` check
the steps too: how often a right answer comes from a wrong trace (Uesato et al. 2022's trace error).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from primekit.data.arithmetic import ANSWER_PREFIX, STEP_DELIMITER, _apply, parse_expression
from primekit.data.problem import Problem
from primekit.verifiers.base import Verdict, check_batch

_INT = re.compile(r"[+-]?\d+")
_STEP = re.compile(r"(\d+)([+\-*])(\d+)=([+-]?\d+)")  # "acc<op>b=result", as `solve` writes it
_IDENTITY = ("*", 1)  # an operation that leaves the value as it is: a trace may skip it


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


def first_wrong_line(response: str, expression: str) -> int | None:
    """The index of the first line of `response` that is not a right step of `expression`'s
    left-to-right evaluation, or None when the whole response is a right trace.

    A right trace is the task's procedure (primekit.data.arithmetic.solve): line j is
    "acc<op>b=result" with acc the value so far (the first operand at the start), (op, b) the
    expression's next operation and result = acc op b; the last line is "A:<value>" once every
    operation is done. A "*1" operation changes no value and may be skipped (a trace that leaves
    it out is right), so this is stricter than the answer (a right answer reached through a
    wrong step is a wrong trace) and looser than the reference text. Anything after the answer
    line, a missing answer line (the index is then the number of lines) or an unparsable line
    is wrong.

    Example: expression "3+4*2", response "3+4=7\\n7*2=15\\nA:14" -> 1 (7*2 is 14);
    expression "3*1+4", response "3+4=7\\nA:7" -> None (the *1 skipped).
    """
    operands, operators = parse_expression(expression)
    ops = list(zip(operators, operands[1:]))  # [(op, b)] in order
    lines = response.split(STEP_DELIMITER)
    value, next_op = operands[0], 0
    for j, line in enumerate(lines):
        if line.startswith(ANSWER_PREFIX):
            while next_op < len(ops) and ops[next_op] == _IDENTITY:
                next_op += 1
            answer = line[len(ANSWER_PREFIX):].strip()
            right = (next_op == len(ops) and _INT.fullmatch(answer) is not None
                     and int(answer) == value)
            return j if not right else (j + 1 if j + 1 < len(lines) else None)
        step = _STEP.fullmatch(line)
        if step is None:
            return j
        acc, op, b, result = int(step[1]), step[2], int(step[3]), int(step[4])
        while (next_op < len(ops) and ops[next_op] != (op, b) and ops[next_op] == _IDENTITY):
            next_op += 1  # a skipped *1
        if not (acc == value and next_op < len(ops) and ops[next_op] == (op, b)
                and result == _apply(acc, op, b)):
            return j
        value, next_op = result, next_op + 1
    return len(lines)  # no answer line


def trace_error_counts(responses: Sequence[str], problems: Sequence[Problem],
                       verdicts: Sequence[Verdict]) -> tuple[int, int]:
    """(correct, wrong_trace): how many responses to arithmetic-format problems (task
    "arithmetic" with meta["expression"]: the arithmetic and chains families) the verifier
    graded correct, and how many of those have a wrong line (`first_wrong_line`).

    wrong_trace / correct is Uesato et al.'s (arXiv 2211.14275) trace error: the share of
    final-answer-correct solutions with a reasoning error. Other problems are not counted.
    """
    correct = wrong = 0
    for response, problem, verdict in zip(responses, problems, verdicts, strict=True):
        expression = problem.meta.get("expression") if problem.task == "arithmetic" else None
        if expression is None or verdict.status != "correct":
            continue
        correct += 1
        wrong += first_wrong_line(response, expression) is not None
    return correct, wrong


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
