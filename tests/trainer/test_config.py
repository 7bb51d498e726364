"""Configuration: defaults, YAML + dotted overrides, and errors that name the field."""

from __future__ import annotations

import re

import pytest

from primekit.cli import main
from primekit.config import CONFIG_DIR, Config, ConfigError, load_config, resolve_config, validate
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
        ("prm.betta=0.1", "prm.betta: unknown field 'betta'; valid: ['beta', 'forward', "),
        ("prn.beta=0.1", "prn: unknown section 'prn'; valid: ['algorithm', 'critic', "),
        ("prm.beta=high", "prm.beta: Input should be a valid number, unable to parse string as a "
                          "number, got 'high'"),
        ("train.steps=2.5", "train.steps: Input should be a valid integer, got a number with a "
                            "fractional part, got 2.5"),
        ("prm.loss=hinge", "prm.loss: Input should be 'ce' or 'dpo', got 'hinge'"),
        ("algorithm.reward_mode=prm", "algorithm.reward_mode: Input should be 'prime', 'outcome', "
                                      "'explicit-orm', 'explicit-prm' or 'oracle-prm', got 'prm'"),
        ("train.report_to=[tensorboard, mlflow]", "train.report_to.1: Input should be "
                                                  "'tensorboard' or 'wandb', got 'mlflow'"),
        ("filter.lo=0.9", "filter.lo/filter.hi: need lo <= hi, got lo=0.9 hi=0.8"),
        ("filter.hi=1.5", "filter.hi: Input should be less than or equal to 1, got 1.5"),
        ("rollout.n_samples=1", "rollout.n_samples: rloo needs at least 2"),
        ("prm.update=frozen", "prm.update: a frozen PRM initialised from the policy"),
        ("prm.beta=-1", "prm.beta: Input should be greater than 0, got -1"),
        ("prm.lr=.nan", "prm.lr: Input should be a finite number, got nan"),
        ("sft.threads=-2", "sft.threads: Input should be greater than or equal to 0, got -2"),
        ("data.heldout_fraction=1", "data.heldout_fraction: Input should be less than 1, got 1"),
        ("verifier.math_workers=0", "verifier.math_workers: Input should be greater than 0"),
        ("algorithm.reward_mode=explicit-prm", "explicit.model_path: reward_mode=explicit-prm "
                                               "needs the directory of a trained reward model "
                                               "(primekit train-prm)"),
        ("prm.overlap=true", "prm.overlap: unknown field 'overlap'"),
        ("explicit.dense_coef=1", "explicit.dense_coef: unknown field 'dense_coef'"),
        ("prm=0.1", "prm: keys have the form section.field"),
        # pydantic alone takes true as 1 for a number: `train.steps=true` trained one step
        ("train.steps=true", "train.steps: expected int, got True (true and false are for "
                             "switches)"),
        ("prm.beta=false", "prm.beta: expected float, got False"),
        ("viz.rerank_ns=[]", "viz.rerank_ns: List should have at least 1 item"),  # IndexError
        # a bad pattern failed only once the models had loaded; one matching "" was accepted
        ("explicit.step_delimiter=re:(", "explicit.step_delimiter: 're:(' is not a valid "
                                         "regular expression: missing ), unterminated subpattern"),
        ("explicit.step_delimiter=re:x*", "explicit.step_delimiter: 're:x*' matches the empty "
                                          "string, so every character would end a step"),
        ("model.prm=true", "model.prm: expected str or null, got True"),
        ("algorithm.estimator=true", "algorithm.estimator: expected one of 'rloo', 'grpo', "
                                     "'reinforce', 'ppo', 'prime-value', got True"),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_config(None, [override])
    assert "\n" not in str(err.value)


def test_bad_yaml_names_the_field_and_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("prm:\n  beta: [0.1]\nrollout: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    # Every problem on one line, each starting with its dotted name, in the sections' order.
    assert str(err.value) == (
        "rollout: Input should be a dictionary or an instance of RolloutConfig, got 4; "
        "prm.beta: Input should be a valid number, got [0.1]"
    )
    path.write_text("prm: {beta: 0.1\n")
    with pytest.raises(ConfigError, match=f"{re.escape(str(path))}: not valid YAML at line 2"):
        load_config(path)
    # A key given twice: plain YAML keeps the last silently; here it is refused with its line.
    path.write_text("prm:\n  beta: 0.1\n  lr: 1.0e-3\n  beta: 0.2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: not valid YAML at line 4: key 'beta' given twice"
    # ... while a switch takes true and false, and a merge key may be overridden
    path.write_text("train: &t {compile: true}\nfilter: {enabled: false}\n")
    cfg = load_config(path)
    assert (cfg.train.compile, cfg.filter.enabled) == (True, False)


def test_choices_and_new_fields_parse_from_overrides():
    cfg = load_config(None, [
        "algorithm.reward_mode=explicit-orm", "explicit.model_path=runs/orm",
        "algorithm.value_transform=sigmoid", "algorithm.discount_outcome=true",
        "train.report_to=[]", "data.heldout_fraction=0.1", "verifier.code_memory_mb=512",
        "step_prm.n_completions=4", "hack_check.source=sampled", "model.policy=123",
    ])
    assert (cfg.algorithm.reward_mode, cfg.explicit.model_path) == ("explicit-orm", "runs/orm")
    assert cfg.algorithm.value_transform == "sigmoid" and cfg.algorithm.discount_outcome is True
    assert cfg.train.report_to == [] and Config().train.report_to == ["tensorboard"]
    assert cfg.data.heldout_fraction == 0.1 and cfg.verifier.code_memory_mb == 512
    assert cfg.step_prm.n_completions == 4 and cfg.hack_check.source == "sampled"
    assert cfg.model.policy == "123"  # a YAML number where a path is expected stays a path


def test_validate_rechecks_a_config_changed_in_code():
    cfg = load_config(None)
    cfg.prm.loss = "hinge"
    with pytest.raises(ConfigError, match="prm.loss: Input should be 'ce' or 'dpo'"):
        validate(cfg)
    cfg.prm.loss = "ce"
    cfg.algorithm.reward_mode = "explicit-orm"
    cfg.explicit.model_path = "runs/orm"
    cfg.explicit.transform = "clip"
    with pytest.raises(ConfigError, match="explicit.transform: Clip/Delta"):
        validate(cfg)


@pytest.mark.parametrize("overrides, resolved", [
    ([], "rollout"),  # the demo: HF engine, temperature 1, top-p 1, float32
    (["rollout.backend=vllm"], "recompute"),
    (["rollout.temperature=0.7"], "recompute"),
    (["rollout.top_p=0.9"], "recompute"),
    (["model.dtype=bfloat16"], "recompute"),  # the HF engine samples from its own bf16 copy
    (["policy.rollout_correction=tis"], "recompute"),  # TIS compares the two log-probs
    (["policy.old_logprobs=recompute"], "recompute"),  # an explicit choice is kept
    (["policy.old_logprobs=rollout"], "rollout"),
])
def test_old_logprobs_auto_resolves_at_load_and_the_run_records_the_decision(overrides, resolved):
    assert Config().policy.old_logprobs == "auto"
    cfg = load_config(CONFIG_DIR / "tiny.yaml", overrides)
    assert cfg.policy.old_logprobs == resolved
    assert cfg.to_dict()["policy"]["old_logprobs"] == resolved  # what checkpoints store


def test_old_logprobs_explicit_rollout_stays_refused_where_it_is_not_exact():
    for override in ("rollout.backend=vllm", "rollout.temperature=0.7", "rollout.top_p=0.9"):
        with pytest.raises(ConfigError, match="policy.old_logprobs: 'rollout' is exact only"):
            load_config(CONFIG_DIR / "tiny.yaml", ["policy.old_logprobs=rollout", override])


def test_validate_resolves_auto_in_a_config_built_in_code():
    cfg = Config()
    validate(cfg)
    assert cfg.policy.old_logprobs == "rollout"  # Config's defaults: hf, T=1, top-p 1, float32
    cfg = Config()
    cfg.rollout.backend = "vllm"
    validate(cfg)
    assert cfg.policy.old_logprobs == "recompute"


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


def test_heldout_fraction_splits_a_training_file(tmp_path):
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(40)))
    common = ["data.source=file", "data.task=arithmetic", f"data.train_path={data}"]
    for fraction, held in ((0.05, 2), (0.25, 10)):
        train, heldout = load_splits(load_config(None, [*common, f"data.heldout_fraction={fraction}"]))
        assert (len(train), len(heldout)) == (40 - held, held)
        assert {p.prompt for p in train}.isdisjoint(p.prompt for p in heldout)


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


def test_config_choices_match_the_functions_they_select():
    # A choice is listed once, as a Literal in config.py; the dicts that map a name to its
    # function must offer exactly those names, so neither side can drift.
    import typing

    from primekit.algorithms import ESTIMATORS
    from primekit.algorithms.process_rewards import PROCESS_REWARD_TRANSFORMS
    from primekit.config import AlgorithmConfig, ExplicitRewardConfig

    def choices(cls, name):
        return set(typing.get_args(typing.get_type_hints(cls)[name]))

    assert choices(AlgorithmConfig, "estimator") == set(ESTIMATORS)
    assert choices(ExplicitRewardConfig, "transform") == set(PROCESS_REWARD_TRANSFORMS)


def test_overrides_may_stand_between_flags_and_keep_their_order(capsys):
    from primekit.cli import parse_args

    # A walkthrough typed the override after --resume: argparse takes one run of positionals
    # and refused `train.steps=2` as an unrecognised argument.
    args = parse_args(["train", "--config", "tiny", "train.run_dir=r", "--resume", "train.steps=2",
                       "train.run_dir=s"])
    assert args.resume and args.overrides == ["train.run_dir=r", "train.steps=2", "train.run_dir=s"]
    assert load_config(resolve_config("tiny"), args.overrides).train.run_dir == "s"  # later wins
    # Anything else out of place is still a usage error, as is a stray override where the
    # command takes none (export).
    for argv in (["train", "--config", "tiny", "a.b=1", "--resume", "bogus"],
                 ["export", "runs/x", "--step", "3", "train.steps=2"]):
        with pytest.raises(SystemExit) as exit_:
            parse_args(argv)
        assert exit_.value.code == 2
        assert "unrecognized arguments" in capsys.readouterr().err
