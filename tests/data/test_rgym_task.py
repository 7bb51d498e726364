"""The reasoning-gym task families (primekit.data.rgym): chain_sum's worked chains, determinism,
disjoint splits, and data.task_family=rgym:<name> / data.rgym_config in the config.

Grading is tested in tests/verifiers/test_verify_rgym.py."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed: "
                                            "pip install 'primekit[rgym]'")

from primekit.config import CONFIG_DIR, ConfigError, load_config  # noqa: E402
from primekit.data.rgym import RgymTask, chain_sum_demonstration, rgym_name, split_of  # noqa: E402
from primekit.data.splits import load_splits, verifier_task  # noqa: E402


def test_chain_sum_demonstration_by_hand():
    # 4 - 1 - 7: 4-1=3, 3-7=-4.
    assert chain_sum_demonstration("4 - 1 - 7", "-4") == "4-1=3\n3-7=-4\nA:-4"
    # -4 + 9 (a negative running value is a left operand as written): 0+9=9, 9-9=0, 0+5=5.
    assert chain_sum_demonstration("0 + 9 - 9 + 5", "5") == "0+9=9\n9-9=0\n0+5=5\nA:5"
    with pytest.raises(ValueError, match="the chain gives -4, the gold is '4'"):
        chain_sum_demonstration("4 - 1 - 7", "4")
    with pytest.raises(ValueError, match="operator must be \\+ or -"):
        chain_sum_demonstration("4 * 1", "4")


def test_problems_are_reasoning_gym_entries_with_worked_chains():
    import reasoning_gym

    problems = RgymTask("chain_sum").problems(300, "train", seed=5)
    for p in problems:
        assert p.task == "rgym" and p.meta["rgym_dataset"] == "chain_sum"
        expression = p.meta["rgym_metadata"]["expression"]
        assert p.prompt == ("State the final answer to the following arithmetic problem: "
                            f"{expression} =")
        assert 3 <= p.meta["rgym_metadata"]["num_terms"] <= 5
        assert p.answer == str(eval(expression))  # noqa: S307 (digits, + and - only)
        assert p.solution.endswith(f"\nA:{p.answer}")
        assert p.solution.count("\n") == p.meta["rgym_metadata"]["num_terms"] - 1
    # Each problem is reasoning-gym's own item for its (stream seed, index): rebuilt here.
    first = problems[0].meta["rgym_metadata"]["source_index"]
    from primekit.data.rgym import _stream_seed

    ds = reasoning_gym.create_dataset("chain_sum", seed=_stream_seed("chain_sum", "train", 5),
                                      size=first + 1, min_terms=3, max_terms=5, min_digits=1,
                                      max_digits=1)
    assert ds[first]["question"] == problems[0].prompt


def test_deterministic_per_seed():
    task = RgymTask("chain_sum")
    a = [p.prompt for p in task.problems(40, "train", seed=1)]
    assert a == [p.prompt for p in RgymTask("chain_sum").problems(40, "train", seed=1)]
    assert a != [p.prompt for p in task.problems(40, "train", seed=2)]
    assert [p.id for p in task.problems(2, "test", seed=4)] == ["rgym-chain_sum-test-4-0",
                                                                  "rgym-chain_sum-test-4-1"]


def test_train_and_test_are_disjoint():
    task = RgymTask("chain_sum")
    train = {p.prompt for p in task.problems(3000, "train", seed=0)}
    test = task.problems(300, "test", seed=1, unique=True)
    assert len({p.prompt for p in test}) == 300
    assert not train & {p.prompt for p in test}
    assert all(split_of(p.prompt, 0.1) == "test" for p in test)


def test_other_datasets_get_the_answer_line_and_config_fields_pass_through():
    # gcd has no worked chain here: the demonstration is the answer line alone.
    p = RgymTask("gcd", {"max_value": 50}).problems(3, "train", seed=0)[0]
    assert p.solution == f"A:{p.answer}"
    assert max(p.meta["rgym_metadata"]["numbers"]) <= 50
    assert rgym_name("rgym:gcd") == "gcd" and rgym_name("chains") is None


def test_config_selects_the_family_and_its_verifier():
    cfg = load_config(CONFIG_DIR / "tiny-rgym.yaml", ["data.num_train=30", "data.num_eval=10"])
    train, heldout = load_splits(cfg)
    assert len(train) == 30 and len(heldout) == 10
    assert {p.meta["family"] for p in train + heldout} == {"rgym:chain_sum"}
    assert not {p.prompt for p in train} & {p.prompt for p in heldout}
    assert verifier_task(cfg) == "rgym"
    four = load_config(CONFIG_DIR / "tiny-rgym.yaml",
                       ["data.num_train=30", "data.num_eval=10",
                        "data.rgym_config={min_terms: 4, max_terms: 4}"])
    assert {p.meta["rgym_metadata"]["num_terms"] for p in load_splits(four)[0]} == {4}


@pytest.mark.parametrize("overrides, message", [
    (["data.task_family=rgym:no_such_set"],
     "data.task_family: reasoning-gym has no dataset 'no_such_set'"),
    (["data.rgym_config={min_terms: 1, max_terms: 0}"], "data.rgym_config: reasoning-gym "),
    (["data.rgym_config={colour: red}"], "data.rgym_config: reasoning-gym 'chain_sum' config"),
    (["data.rgym_config={seed: 3}"], "data.rgym_config: 'seed' is set per split and seed by "
                                     "primekit"),
])
def test_bad_rgym_settings_fail_in_one_line(overrides, message):
    cfg = load_config(CONFIG_DIR / "tiny-rgym.yaml", ["data.num_train=10", "data.num_eval=5",
                                                      *overrides])
    with pytest.raises(ConfigError, match=message) as err:
        load_splits(cfg)
    assert "\n" not in str(err.value)
