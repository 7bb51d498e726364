"""algorithm.credit=min and filter.consistency_drop end to end: one RL step on the tiny model for
every estimator and every PRM kind (implicit PRIME PRM, explicit step PRM, oracle step PRM)."""

from __future__ import annotations

import math

import pytest
import torch

from primekit.algorithms import min_form_rewards
from primekit.factory import build_rl_trainer
from primekit.verifiers.base import Verdict


class ParityVerifier:
    """1 for a response of even length: outcomes that differ within a group, so that every
    estimator has a non-zero advantage (the barely trained model is almost never right)."""

    def verify_batch(self, responses, problems):
        return [Verdict.correct() if len(r) % 2 == 0 else Verdict.incorrect() for r in responses]


@pytest.fixture(scope="module")
def step_prm_dir(sft_model_dir, tmp_path_factory):
    """A step PRM with a fresh (seeded, random) score head on the SFT backbone: untrained, but
    its step probabilities differ from step to step, which is all these tests need."""
    from transformers import AutoTokenizer

    from primekit.reward_models.heads import init_reward_model

    out = tmp_path_factory.mktemp("step-prm")
    init_reward_model(sft_model_dir, seed=3).save_pretrained(out)
    AutoTokenizer.from_pretrained(sft_model_dir).save_pretrained(out)
    return out


KINDS = {"implicit": ("algorithm.reward_mode=prime",),
         "explicit": ("algorithm.reward_mode=explicit-prm", "explicit.transform=clip-delta",
                      "explicit.eta=0.5"),
         "oracle": ("algorithm.reward_mode=oracle-prm", "explicit.transform=delta")}
# Every estimator with each PRM kind; three in the default suite, the rest marked slow (one RL
# step takes tens of seconds on the shared 2-core machine).
FAST = {("implicit", "rloo"), ("explicit", "ppo"), ("oracle", "rloo")}
CASES = [pytest.param(kind, est, id=f"{kind}-{est}",
                      marks=() if (kind, est) in FAST else pytest.mark.slow)
         for kind in KINDS for est in ("rloo", "grpo", "reinforce", "ppo", "prime-value")
         if not (kind != "implicit" and est == "prime-value")]


@pytest.mark.parametrize(("kind", "estimator"), CASES)
def test_one_step_min_credit_and_consistency(rl_config, step_prm_dir, kind, estimator):
    extra = KINDS[kind] + (f"algorithm.estimator={estimator}", "algorithm.credit=min",
                           "algorithm.credit_temperature=0.05", "filter.consistency_drop=1",
                           "train.steps=1", "train.export_final=false")
    if kind == "explicit":
        extra += (f"explicit.model_path={step_prm_dir}",)
    trainer = build_rl_trainer(rl_config(*extra), verifier=ParityVerifier())
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    history = trainer.train()
    m = history[0]
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, trainer.policy.parameters()))
    for key, value in m.items():
        assert math.isfinite(value), f"{key} = {value}"
    # K = 4, one sample of every group dropped before the update; by reason, the two add up.
    assert m["filter/consistency_dropped"] == pytest.approx(0.25)
    assert m["filter/consistency_dropped_correct"] + m["filter/consistency_dropped_wrong"] == \
        pytest.approx(0.25)
    # Min-form weights: between uniform (1/U) and all on the weakest unit (1).
    assert 0.0 < m["credit/weight_max_mean"] <= 1.0
    assert m["credit/return_mean"] >= m["credit/min_return_mean"] - 1e-9
    for key in ("hack/steps_per_response", "hack/step_len_chars", "hack/delimiter_rate",
                "hack/nonpositive_step_share"):
        assert key in m, key
    assert 0.0 <= m["hack/nonpositive_step_share"] <= 1.0


def test_explicit_min_credit_is_the_softmin_of_the_step_rewards(rl_config, step_prm_dir):
    # The same batch through the step PRM with credit=sum and credit=min (transform none, so
    # every step reward is a probability > 0 on its step's last token): each response's summed
    # min-credit reward is PURE's softmin average of its step rewards, sum_k w_k r_k.
    common = ("algorithm.reward_mode=explicit-prm", f"explicit.model_path={step_prm_dir}",
              "explicit.transform=none", "algorithm.estimator=rloo")
    trainer = build_rl_trainer(rl_config(*common))
    exp, _ = trainer.collect({})
    summed, _ = trainer.rewarder.rewards(exp.batch, outcome_rewards=exp.outcome_rewards,
                                         group_ids=exp.group_ids, ref_logprobs=None)
    trainer_min = build_rl_trainer(rl_config(*common, "algorithm.credit=min",
                                             "algorithm.credit_temperature=0.02"))
    credited, metrics = trainer_min.rewarder.rewards(exp.batch, outcome_rewards=exp.outcome_rewards,
                                                     group_ids=exp.group_ids, ref_logprobs=None)
    units = summed != 0  # [N, T] step ends
    assert int(units.sum()) > len(exp)  # several steps per response on average
    expected = min_form_rewards(summed, units, 0.02)  # [N, T]
    assert torch.allclose(credited, expected, atol=1e-6)
    row_min = torch.where(units, summed, torch.full_like(summed, 2.0)).min(1).values
    assert torch.all(credited.sum(1) >= row_min - 1e-6)
    assert metrics["credit/min_return_mean"] == pytest.approx(float(row_min.mean()), rel=1e-5)
