"""Grading the arithmetic task: the first "A:" line's integer against the gold answer."""

from __future__ import annotations

import time

import pytest

from primekit.data.arithmetic import ArithmeticTask
from primekit.data.problem import Problem
from primekit.verifiers.arithmetic import (
    ArithmeticVerifier,
    extract_final_answer,
    first_wrong_line,
    trace_error_counts,
)
from primekit.verifiers.base import Verdict


@pytest.mark.parametrize(
    "response, expected",
    [
        ("3+4=7\nA:7", "7"),
        ("A: 12 ", "12"),
        ("7*2=14\nA:14\nA:15", "14"),  # the first answer line counts
        ("A:9x", None),
        ("A:", None),
        ("the answer is 9", None),
        ("x A:9", None),  # must start the line
        ("", None),
    ],
)
def test_extract_final_answer(response, expected):
    assert extract_final_answer(response) == expected


def test_verifier_verdicts():
    problem = ArithmeticTask().make_problem("3+4*2-5", "p0")
    v = ArithmeticVerifier()
    assert v.verify("3+4=7\n7*2=14\n14-5=9\nA:9", problem).status == "correct"
    assert v.verify("A:09", problem).score == 1.0  # integer comparison
    wrong = v.verify("A:6", problem)
    assert (wrong.status, wrong.score) == ("incorrect", 0.0) and "6" in wrong.reason
    malformed = v.verify("3+4=7\n7*2=", problem)
    assert malformed.status == "incorrect" and "A:" in malformed.reason
    no_gold = v.verify("A:9", Problem(id="x", prompt="1+1=", task="arithmetic"))
    assert no_gold.status == "error"
    broken = v.verify(None, problem)  # type: ignore[arg-type]
    assert broken.status == "error"
    with pytest.raises(ValueError, match="equal length"):
        v.verify_batch(["A:1"], [])


def test_verifier_throughput():
    problems = ArithmeticTask().problems(5000, "train", seed=0)
    responses = [p.solution if i % 2 else "A:0" for i, p in enumerate(problems)]
    start = time.perf_counter()
    verdicts = ArithmeticVerifier().verify_batch(responses, problems)
    elapsed = time.perf_counter() - start
    assert [x.score for x in verdicts] == [float(i % 2) for i in range(5000)]
    assert 5000 / elapsed > 5000  # thousands per second (measured ~500k/s)


# "3+4*2-5": left to right 3+4=7, 7*2=14, 14-5=9.
@pytest.mark.parametrize(
    "response, expected",
    [
        ("3+4=7\n7*2=14\n14-5=9\nA:9", None),  # the reference: a right trace
        ("3+4=7\n7*2=15\n15-5=10\nA:10", 1),  # 7*2 is 14: wrong from line 1
        ("3+4=7\n7*2=15\n14-5=9\nA:9", 1),  # right answer, wrong trace (Uesato's trace error)
        ("3+4=7\n7*2=14\n14-5=9\nA: 9 ", None),  # spaces around the answer, as the verifier
        ("3+4=7\n7*2=14\nA:9", 2),  # answer before the last operation
        ("3+4=7\n14-5=9\nA:9", 1),  # an operation left out that is not *1
        ("3+4=7\n7-5=2\n2*2=4\nA:4", 1),  # operations out of order
        ("3+4=7\n7*2=14\n14-5=9", 3),  # no answer line: wrong at len(lines)
        ("3+4=7\n7*2=14\n14-5=9\nA:9\n9+0=9", 4),  # anything after the answer line
        ("3+4=7\n7*2=14\n14-5=9\nA:8", 3),  # the answer is not the value
        ("3+4=7\n7*2=\n", 1),  # unparsable line
        ("3 + 4=7\n7*2=14\n14-5=9\nA:9", 0),  # not the task's format
        ("4+3=7\n7*2=14\n14-5=9\nA:9", 0),  # the first operand must start the trace
        ("", 0),
    ],
)
def test_first_wrong_line(response, expected):
    assert first_wrong_line(response, "3+4*2-5") == expected


@pytest.mark.parametrize(
    "expression, response, expected",
    [
        # "3*1+4": 3*1=3, 3+4=7. The *1 changes nothing: writing it or skipping it is right.
        ("3*1+4", "3*1=3\n3+4=7\nA:7", None),
        ("3*1+4", "3+4=7\nA:7", None),
        ("3+4*1", "3+4=7\nA:7", None),  # a trailing *1 skipped before the answer line
        ("3+4*1*1-2", "3+4=7\n7*1=7\n7-2=5\nA:5", None),  # one of two *1 written
        ("3*1+4", "3*4=12\nA:12", 0),  # *1 is skipped, not rewritten as another operation
        ("2*2+1", "2+1=3\nA:3", 0),  # only *1 may be skipped: *2 may not
    ],
)
def test_first_wrong_line_skips_times_one(expression, response, expected):
    assert first_wrong_line(response, expression) == expected


def test_trace_error_counts():
    task = ArithmeticTask()
    p = task.make_problem("3+4*2-5", "p0")
    other = Problem(id="m", prompt="1+1=", task="math", answer="2")  # not arithmetic: not counted
    responses = ["3+4=7\n7*2=14\n14-5=9\nA:9",  # correct, right trace
                 "3+4=7\n7*2=15\n14-5=9\nA:9",  # correct, wrong trace
                 "A:9",  # correct, no steps: wrong trace
                 "3+4=7\nA:7",  # incorrect: not counted
                 "A:2"]
    problems = [p, p, p, p, other]
    verdicts = ArithmeticVerifier().verify_batch(responses[:4], problems[:4]) + [Verdict.correct()]
    # 3 correct arithmetic responses, 2 of them with a wrong line: trace error 2/3.
    assert trace_error_counts(responses, problems, verdicts) == (3, 2)
