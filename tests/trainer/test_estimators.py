"""The estimator entries (algorithms/advantages.ESTIMATORS): each entry builds the keyword
arguments its own function takes, and the config's per-estimator checks agree with the entries."""

from __future__ import annotations

import inspect

import pytest
import torch

from primekit.algorithms import ESTIMATORS, AdvantageParts
from primekit.config import AlgorithmConfig, ConfigError, load_config


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_each_entry_builds_the_arguments_of_its_function(name):
    est, a = ESTIMATORS[name], AlgorithmConfig()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    group_ids = torch.tensor([0, 0, 1, 1])  # 2 prompts x 2 samples
    values = torch.full((4, 3), 0.5) * mask if est.critic else None
    options = est.options(a, group_ids, values)
    assert set(options) <= set(inspect.signature(est.fn).parameters), options
    parts = est.fn(outcome_rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]), response_mask=mask,
                   token_rewards=0.1 * mask, gamma=a.gamma, **options)
    assert isinstance(parts, AdvantageParts) and parts.outcome.shape == (4, 3)
    # Only an estimator with a critic reads the values.
    assert ("values" in options) == est.critic


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_the_configs_sample_check_agrees_with_min_samples(name):
    one = [f"algorithm.estimator={name}", "rollout.n_samples=1", "prm.loss=ce"]
    if ESTIMATORS[name].min_samples > 1:
        with pytest.raises(ConfigError, match=f"{name} needs at least 2 samples"):
            load_config(None, one)
    else:
        assert load_config(None, one).rollout.n_samples == 1


def test_prime_with_grpo_warns(tiny_model_dir, capsys):
    # docs/experiments/estimators.md: PRIME + GRPO (App. B.3's normalisation) collapsed every seed
    import torch

    from primekit.config import load_config
    from primekit.factory import build_rewarder
    from primekit.models.hf import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    for estimator, warned in (("grpo", True), ("rloo", False)):
        cfg = load_config(None, [f"model.policy={tiny_model_dir}",
                                 f"algorithm.estimator={estimator}"])
        build_rewarder(cfg, tok, torch.device("cpu"))
        out = " ".join(capsys.readouterr().out.split())
        assert ("warning: PRIME with algorithm.estimator=grpo" in out) == warned, estimator
