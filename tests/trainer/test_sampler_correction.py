"""correct_for_sampler (trainer/experience.py): TIS-weighted advantages returned, the batch's own
left as they were."""

from __future__ import annotations

import math

import pytest
import torch

from primekit.config import PolicyConfig
from primekit.data.problem import Problem
from primekit.rollout.base import RolloutBatch
from primekit.trainer.experience import Experience, correct_for_sampler
from primekit.verifiers.base import Verdict


def _exp() -> Experience:
    # One response of 2 tokens (the third is padding). pi_old / pi_rollout = 0.5/0.25 = 2 and
    # 0.2/0.4 = 0.5.
    mask = torch.tensor([[1, 1, 0]])
    batch = RolloutBatch(prompt_ids=torch.tensor([[5]]), prompt_mask=torch.ones(1, 1, dtype=torch.long),
                         response_ids=torch.tensor([[7, 8, 0]]), response_mask=mask,
                         sampling_logprobs=torch.tensor([[math.log(0.25), math.log(0.4), 0.0]]),
                         finished=torch.tensor([True]), responses=["x"])
    return Experience(batch=batch, problems=[Problem(id="p", prompt="q")],
                      verdicts=[Verdict.correct()], group_ids=torch.tensor([0]),
                      outcome_rewards=torch.tensor([1.0]),
                      old_logprobs=torch.tensor([[math.log(0.5), math.log(0.2), 0.0]]),
                      advantages=torch.tensor([[2.0, -4.0, 0.0]]))


def test_tis_returns_weighted_advantages_and_leaves_the_batch_alone():
    exp = _exp()
    before = exp.advantages.clone()
    adv, metrics = correct_for_sampler(exp, PolicyConfig(old_logprobs="recompute",
                                                         rollout_correction="tis", tis_cap=1.5))
    # w = min(ratio, 1.5) = [1.5, 0.5, 0]: [2 * 1.5, -4 * 0.5, 0] = [3, -2, 0].
    assert torch.allclose(adv, torch.tensor([[3.0, -2.0, 0.0]]))
    assert torch.equal(exp.advantages, before)  # not rescaled in place
    assert float(metrics["rollout/tis_weight_mean"]) == pytest.approx(1.0)  # (1.5 + 0.5) / 2
    assert "rollout/logprob_kl" in metrics


def test_without_tis_the_advantages_pass_through():
    exp = _exp()
    adv, metrics = correct_for_sampler(exp, PolicyConfig(old_logprobs="recompute"))
    assert adv is exp.advantages and "rollout/tis_weight_mean" not in metrics
    assert "rollout/logprob_kl" in metrics  # the mismatch is still measured
    adv, metrics = correct_for_sampler(exp, PolicyConfig(old_logprobs="rollout"))
    assert adv is exp.advantages and metrics == {}
