"""Grading the arithmetic task: the first "A:" line's integer against the gold answer."""

from __future__ import annotations

import time

import pytest

from primekit.data.arithmetic import ArithmeticTask
from primekit.data.problem import Problem
from primekit.verifiers.arithmetic import ArithmeticVerifier, extract_final_answer


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
