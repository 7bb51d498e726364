"""The procedural arithmetic task: format, left-to-right semantics, splits, verifier."""

from __future__ import annotations

import random
import time

import pytest

from primekit.data.arithmetic import (
    STEP_DELIMITER,
    ArithmeticTask,
    ArithmeticVerifier,
    demonstration,
    extract_final_answer,
    solve,
    split_of,
)
from primekit.data.problem import Problem


def test_left_to_right_hand_examples():
    # 3+4*2-5: (3+4)=7, 7*2=14, 14-5=9 (precedence would give 3+8-5=6).
    assert solve("3+4*2-5") == (["3+4=7", "7*2=14", "14-5=9"], 9)
    assert demonstration("3+4*2-5=") == "3+4=7\n7*2=14\n14-5=9\nA:9"
    # 9-3*4+1: 9-3=6, 6*4=24, 24+1=25.
    assert solve("9-3*4+1")[1] == 25
    assert STEP_DELIMITER == "\n"


def test_problem_fields_and_value_ranges():
    task = ArithmeticTask(min_operands=2, max_operands=5)
    problems = task.problems(3000, "train", seed=7)
    assert {p.meta["difficulty"] for p in problems} == {2, 3, 4, 5}
    for p in problems:
        assert p.task == "arithmetic"
        assert p.prompt == p.meta["expression"] + "="
        assert (
            p.prompt.count("+") + p.prompt.count("-") + p.prompt.count("*")
            == p.meta["difficulty"] - 1
        )
        steps, answer = solve(p.prompt)
        assert p.answer == str(answer)
        assert p.solution == STEP_DELIMITER.join(steps) + f"\nA:{answer}"
        # Every running value (each step's result) stays in [1, 99]; operands are 1..9.
        for step in steps:
            assert 1 <= int(step.split("=")[1]) <= 99
        assert all(
            1 <= int(x) <= 9 for x in p.prompt[:-1].replace("-", "+").replace("*", "+").split("+")
        )
    assert len({p.id for p in problems}) == len(problems)


def test_reproducible_from_seed_and_different_across_seeds():
    task = ArithmeticTask()
    a = [p.prompt for p in task.problems(200, "train", seed=1)]
    assert a == [p.prompt for p in task.problems(200, "train", seed=1)]
    assert a != [p.prompt for p in task.problems(200, "train", seed=2)]


def test_train_and_test_splits_never_overlap():
    task = ArithmeticTask(min_operands=2, max_operands=4)
    train = {p.prompt for seed in range(3) for p in task.problems(3000, "train", seed=seed)}
    test = {p.prompt for p in task.problems(3000, "test", seed=0)}
    assert len(train) > 4000 and len(test) > 1000
    assert train.isdisjoint(test)
    # The split is a property of the expression alone, and about test_fraction of it is "test".
    rng = random.Random(0)
    exprs = {task.sample_expression(rng, 4) for _ in range(5000)}
    share = sum(split_of(e, 0.1) == "test" for e in exprs) / len(exprs)
    assert 0.08 < share < 0.12


def test_unique_problems_and_exhaustion():
    task = ArithmeticTask(min_operands=2, max_operands=2)
    problems = task.problems(100, "train", seed=0, unique=True)
    assert len({p.prompt for p in problems}) == 100
    # 198 two-operand expressions exist in total; 18 of them are test ones.
    with pytest.raises(ValueError, match="unique"):
        task.problems(100, "test", seed=0, unique=True)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"min_operands": 1}, "min_operands"),
        ({"min_operands": 3, "max_operands": 2}, "max_operands"),
        ({"operators": ["/"]}, "operators"),
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"max_value": 5}, "max_value"),
    ],
)
def test_bad_task_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ArithmeticTask(**kwargs)


def test_bad_problem_arguments():
    with pytest.raises(ValueError, match="split"):
        ArithmeticTask().problems(3, "validation")
    with pytest.raises(ValueError, match="n must"):
        ArithmeticTask().problems(-1)


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
