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
    for estimator, norm, warned in (("grpo", "response-means", True), ("rloo", "tokens", False),
                                    ("grpo", "tokens", True)):
        cfg = load_config(None, [f"model.policy={tiny_model_dir}",
                                 f"algorithm.estimator={estimator}",
                                 f"algorithm.grpo_process_norm={norm}"])
        build_rewarder(cfg, tok, torch.device("cpu"))
        out = " ".join(capsys.readouterr().out.split())
        assert ("warning: PRIME with algorithm.estimator=grpo" in out) == warned, estimator


def test_grpo_process_norm_reaches_the_estimator():
    # algorithm.grpo_process_norm selects the normalisation of prime_grpo_process_returns
    ids, mask = torch.tensor([0, 0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    tr = torch.tensor([[1.0, 3.0], [4.0, 0.0]])
    got = {}
    for norm in ("response-means", "tokens"):
        a = load_config(None, [f"algorithm.grpo_process_norm={norm}"]).algorithm
        opts = ESTIMATORS["grpo"].options(a, ids, None)
        assert opts["process_norm"] == norm
        got[norm] = ESTIMATORS["grpo"].fn(outcome_rewards=torch.tensor([1.0, 0.0]),
                                          response_mask=mask, token_rewards=tr, gamma=1.0,
                                          **opts).process
    # means 2, 4 (std 1.414) vs tokens 1, 3, 4 (std 1.528): the first token's return differs,
    # -2/1.414 = -1.414 against -(4/3)/1.528 = -0.873
    assert got["response-means"][0, 0].item() == pytest.approx(-2 / 2 ** 0.5, abs=1e-5)
    assert got["tokens"][0, 0].item() == pytest.approx(-4 / 3 / (7 / 3) ** 0.5, abs=1e-5)
    with pytest.raises(ConfigError):
        load_config(None, ["algorithm.grpo_process_norm=sequences"])
