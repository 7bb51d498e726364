"""The procedural arithmetic task: format, left-to-right semantics, splits.

Its grading is tested in tests/verifiers/test_verify_arithmetic.py."""

from __future__ import annotations

import random

import pytest

from primekit.data.arithmetic import (
    STEP_DELIMITER,
    ArithmeticTask,
    demonstration,
    solve,
    split_of,
)


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
