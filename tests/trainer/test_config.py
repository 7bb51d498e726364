"""Configuration: defaults, YAML + dotted overrides, and errors that name the field."""

from __future__ import annotations

import pytest

from primekit.cli import main
from primekit.config import Config, ConfigError, load_config
from primekit.data.splits import load_splits


def test_paper_defaults():
    cfg = Config()
    assert cfg.prm.beta == 0.05
    assert cfg.rollout.n_samples == 4
    assert (cfg.policy.lr, cfg.prm.lr) == (5e-7, 1e-6)
    assert (cfg.filter.lo, cfg.filter.hi) == (0.2, 0.8)
    assert cfg.algorithm.kl_coef == 0.0 and cfg.policy.ppo_epochs == 1


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("prm:\n  beta: 0.1\ntrain:\n  steps: 7\n")
    cfg = load_config(path, ["prm.beta=0.2", "model.prm=null", "filter.enabled=false"])
    assert cfg.prm.beta == 0.2 and cfg.train.steps == 7
    assert cfg.model.prm is None and cfg.filter.enabled is False


@pytest.mark.parametrize(
    "override, message",
    [
        ("prm.betta=0.1", "prm.betta: unknown field 'betta'"),
        ("prn.beta=0.1", "prn.beta: unknown section 'prn'"),
        ("prm.beta=high", "prm.beta: expected a number"),
        ("train.steps=2.5", "train.steps: expected an integer"),
        ("prm.loss=hinge", "prm.loss: 'hinge' is not one of"),
        ("filter.lo=0.9", "filter.lo/filter.hi"),
        ("rollout.n_samples=1", "rollout.n_samples: rloo needs at least 2"),
        ("prm.update=frozen", "prm.update: a frozen PRM initialised from the policy"),
        ("prm.beta=-1", "prm.beta: must be > 0"),
        ("sft.threads=-2", "sft.threads: must be >= 0"),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(None, [override])


def test_impossible_combination_double_forward_on_frozen_prm():
    with pytest.raises(ConfigError, match="prm.forward"):
        load_config(None, ["prm.update=frozen", "model.prm=some/prm", "prm.forward=double"])


def test_procedural_heldout_problems_are_distinct_and_never_trained_on():
    cfg = load_config(None, ["data.num_train=3000", "data.num_eval=400"])
    train, heldout = load_splits(cfg)
    assert len(heldout) == 400 and len({p.prompt for p in heldout}) == 400
    assert {p.prompt for p in train}.isdisjoint(p.prompt for p in heldout)
    # Training prompts are sampled with replacement: the 180 two-operand train expressions
    # repeat many times among 3000 draws.
    assert len({p.prompt for p in train}) < len(train)
    # Only 18 two-operand expressions are held out, so 100 distinct ones cannot exist.
    only_two = ["data.min_operands=2", "data.max_operands=2", "data.num_eval=100"]
    with pytest.raises(ConfigError, match="data.num_eval: could not draw 100 unique 'test'"):
        load_splits(load_config(None, only_two))


def test_cli_reports_config_errors(capsys):
    assert main(["train", "--config", "tiny", "prm.betta=1"]) == 2
    assert "prm.betta: unknown field" in capsys.readouterr().err
    assert main(["train", "--config", "nope"]) == 2
    assert "--config: 'nope'" in capsys.readouterr().err


def test_cli_reports_a_malformed_dataset_row(tmp_path, capsys):
    data = tmp_path / "problems.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": [4]}\n')
    code = main(["sft", "--config", "tiny", "data.source=file", "data.task=arithmetic",
                 f"data.train_path={data}", "sft.steps=1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "problems.jsonl line 2" in err and "'answer'" in err
