"""The long-chain family (primekit.data.chains): 5-8 steps of the arithmetic task's format, its
own random stream, the arithmetic task's splits and verifier; selected by data.task_family."""

from __future__ import annotations

import pytest

from primekit.config import CONFIG_DIR, ConfigError, load_config
from primekit.data.arithmetic import ArithmeticTask, solve, split_of
from primekit.data.chains import ChainTask
from primekit.data.splits import load_splits, verifier_task
from primekit.verifiers.arithmetic import ArithmeticVerifier


def test_hand_written_chain():
    # 7-1*6-2-2*1+1-5+1 left to right: 7-1=6, 6*6=36, 36-2=34, 34-2=32, 32*1=32, 32+1=33,
    # 33-5=28, 28+1=29.
    p = ChainTask().make_problem("7-1*6-2-2*1+1-5+1", "x")
    assert p.prompt == "7-1*6-2-2*1+1-5+1="
    assert p.solution == "7-1=6\n6*6=36\n36-2=34\n34-2=32\n32*1=32\n32+1=33\n33-5=28\n28+1=29\nA:29"
    assert (p.answer, p.task, p.meta["difficulty"], p.meta["family"]) == ("29", "arithmetic", 9,
                                                                           "chains")


def test_lengths_values_and_ids():
    problems = ChainTask().problems(2000, "train", seed=3)
    assert {p.meta["difficulty"] for p in problems} == {6, 7, 8, 9}  # 5..8 operations
    for p in problems:
        steps, answer = solve(p.prompt)
        assert len(steps) == p.meta["difficulty"] - 1
        assert p.solution.split("\n")[:-1] == steps and p.answer == str(answer)
        # Every running value stays in 1..99, as in the arithmetic task.
        assert all(1 <= int(s.split("=")[1]) <= 99 for s in steps)
    assert problems[5].id == "chains-train-3-5"
    lengths = [len(p.solution) for p in problems]
    # Bounds by construction: at least 5 steps of "a+b=c\n" (6) and "A:c" = 5*6 + 3 = 33; at
    # most 8 steps of "nn*n=nn\n" (8) and "A:nn" = 8*8 + 4 = 68 characters.
    assert min(lengths) >= 33 and max(lengths) <= 68


def test_deterministic_per_seed_and_not_the_arithmetic_stream():
    a = [p.prompt for p in ChainTask().problems(50, "train", seed=11)]
    assert a == [p.prompt for p in ChainTask().problems(50, "train", seed=11)]
    assert a != [p.prompt for p in ChainTask().problems(50, "train", seed=12)]
    # Same lengths, different family: its own stream ("chains/train/11").
    same_len = ArithmeticTask(min_operands=6, max_operands=9).problems(50, "train", seed=11)
    assert a != [p.prompt for p in same_len]


def test_train_and_test_are_disjoint():
    train = {p.meta["expression"] for p in ChainTask().problems(3000, "train", seed=0)}
    test = ChainTask().problems(300, "test", seed=1, unique=True)
    assert len({p.meta["expression"] for p in test}) == 300
    assert not train & {p.meta["expression"] for p in test}
    assert all(split_of(p.meta["expression"], 0.1) == "test" for p in test)


def test_verifier_grades_right_wrong_and_malformed():
    p = ChainTask().make_problem("7-1*6-2-2*1+1-5+1", "x")
    v = ArithmeticVerifier()
    assert v.verify(p.solution, p).status == "correct"
    # One early slip (6*6=35 at step 2) carries through every later step to a wrong answer.
    slipped = "7-1=6\n6*6=35\n35-2=33\n33-2=31\n31*1=31\n31+1=32\n32-5=27\n27+1=28\nA:28"
    assert (v.verify(slipped, p).status, v.verify(slipped, p).score) == ("incorrect", 0.0)
    assert v.verify("7-1=6\n6*6=36\nA:", p).status == "incorrect"  # malformed answer line
    assert v.verify("7-1=6\n6*6=36", p).reason == "no final answer line 'A:<integer>'"


def test_config_selects_the_family():
    cfg = load_config(CONFIG_DIR / "tiny-chains.yaml", ["data.num_train=40", "data.num_eval=10"])
    train, heldout = load_splits(cfg)
    assert {p.meta["family"] for p in train + heldout} == {"chains"}
    assert all(5 <= p.meta["difficulty"] <= 8 for p in train)  # tiny-chains: 5-8 operands
    assert verifier_task(cfg) == "arithmetic"
    # The default family is still the 2-4 operand demo task.
    base = load_config(CONFIG_DIR / "tiny.yaml", ["data.num_train=40", "data.num_eval=10"])
    assert base.data.task_family == "arithmetic"
    assert all(2 <= p.meta["difficulty"] <= 4 for p in load_splits(base)[0])


@pytest.mark.parametrize("override, message", [
    ("data.task_family=chain", "data.task_family: String should match pattern"),
    ("data.task_family=rgym:Chain-Sum", "data.task_family: String should match pattern"),
    ("data.chain_min_operands=1", "data.chain_min_operands: Input should be greater than or "
                                  "equal to 2"),
])
def test_bad_family_fields_fail_in_one_line(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(CONFIG_DIR / "tiny.yaml", [override])
    assert "\n" not in str(err.value)


def test_chain_bounds_and_file_source_combinations():
    with pytest.raises(ConfigError, match="data.chain_min_operands/chain_max_operands: need min "
                                          "<= max, got 7/6"):
        load_config(CONFIG_DIR / "tiny.yaml", ["data.chain_min_operands=7",
                                               "data.chain_max_operands=6"])
    with pytest.raises(ConfigError, match="data.task_family: 'chains' is a procedural family"):
        load_config(CONFIG_DIR / "tiny.yaml", ["data.source=file", "data.train_path=x.jsonl",
                                               "data.task_family=chains"])
