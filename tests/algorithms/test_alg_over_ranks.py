"""Batch statistics over data-parallel ranks: each of two (simulated) ranks holds part of a
batch; with the all-reduce they return what one process with the whole batch returns, which the
mean of the per-rank values (what the metrics were before) does not."""

from __future__ import annotations

import math

import pytest
import torch

from primekit.algorithms import (
    AdvantageParts,
    compute_advantages,
    logprob_mismatch,
    masked_mean,
    masked_mean_std,
    reward_hacking_metrics,
)
from tests.fake_ranks import on_two_ranks

# Rank 0 has 4 valid tokens, rank 1 has 2: unequal counts, so per-rank means do not average
# to the batch's mean.
X0 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
M0 = torch.tensor([[1, 1, 1], [1, 0, 0]])
X1 = torch.tensor([[10.0, 20.0, 0.0]])
M1 = torch.tensor([[1, 1, 0]])


def test_masked_mean_and_std_over_ranks_are_the_whole_batchs():
    # The whole batch 1, 2, 3, 4, 10, 20: mean 40 / 6; unbiased std from the two-pass sum.
    x, m = torch.cat([X0, X1]), torch.cat([M0, M1])
    mean, std = masked_mean_std(x, m)
    assert mean.item() == pytest.approx(40 / 6)
    dev = [v - 40 / 6 for v in (1, 2, 3, 4, 10, 20)]
    assert std.item() == pytest.approx(math.sqrt(sum(d * d for d in dev) / 5))

    both = on_two_ranks(lambda d, s, _: masked_mean_std(*d, all_reduce=s), (X0, M0), (X1, M1))
    for r_mean, r_std in both:
        assert (r_mean.item(), r_std.item()) == pytest.approx((mean.item(), std.item()))
    # The per-rank average the metrics used to log: (2.5 + 15) / 2 = 8.75, not 6.67.
    alone = [masked_mean_std(X0, M0), masked_mean_std(X1, M1)]
    assert (alone[0][0] + alone[1][0]).item() / 2 == pytest.approx(8.75)
    means = on_two_ranks(lambda d, s, _: masked_mean(*d, all_reduce=s), (X0, M0), (X1, M1))
    assert [v.item() for v in means] == pytest.approx([40 / 6] * 2)
    with pytest.raises(ValueError, match="dim=None"):
        masked_mean(X0, M0, dim=1, all_reduce=lambda t: t)


def test_advantage_metrics_over_ranks():
    def run(d, s, _):
        x, m = d
        return compute_advantages(AdvantageParts(outcome=x), response_mask=m, outcome_coef=2.0,
                                  all_reduce=s)[2]

    whole = run((torch.cat([X0, X1]), torch.cat([M0, M1])), None, None)
    for metrics in on_two_ranks(run, (X0, M0), (X1, M1)):
        for key in ("adv/mean", "adv/std", "adv/outcome_abs_mean", "adv/process_abs_mean"):
            assert metrics[key].item() == pytest.approx(whole[key].item()), key
    assert whole["adv/mean"].item() == pytest.approx(80 / 6)  # 2 x the outcome term


def test_hacking_metrics_and_correlation_over_ranks():
    responses = ["1+1=2\n2+2=4\n2+2=4\nA:4", "A:3", "5-1=4\nA:4", "7*2=14\n14+1=15\nA:15 A:15"]
    rewards = torch.tensor([[0.5, -0.2, 0.1, 0.0], [0.3, 0.0, 0.0, 0.0], [-0.4, 0.2, 0.0, 0.0],
                            [0.9, 0.1, 0.2, 0.3]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    outcome = torch.tensor([1.0, 0.0, 1.0, 0.0])

    def run(rows, s, _):
        return reward_hacking_metrics([responses[i] for i in rows], step_delimiter="\n",
                                      outcome_rewards=outcome[rows], token_rewards=rewards[rows],
                                      response_mask=mask[rows], all_reduce=s)

    whole = run([0, 1, 2, 3], None, None)
    assert math.isfinite(whole["hack/dense_success_corr"].item())
    ranks = on_two_ranks(run, [0, 1, 2], [3])  # 3 responses and 1: uneven, as filtering leaves
    for metrics in ranks:
        assert metrics.keys() == whole.keys()
        for key, value in whole.items():
            assert metrics[key].item() == pytest.approx(value.item()), key
    # Alone, rank 1's single response has no correlation at all (NaN), and the steps per
    # response average to (7/3 + 3) / 2 instead of the batch's 10/4.
    alone = run([3], None, None)
    assert math.isnan(alone["hack/dense_success_corr"].item())
    assert whole["hack/steps_per_response"].item() == pytest.approx(10 / 4)


def test_logprob_mismatch_over_ranks():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -0.2, -0.3]])
    sampled = torch.tensor([[-1.1, -2.0, -0.4], [-0.1, -0.9, -0.3]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])

    def run(rows, s, m):
        return logprob_mismatch(old[rows], sampled[rows], mask[rows], all_reduce=s,
                                all_reduce_max=m)

    whole = run([0, 1], None, None)
    assert whole["rollout/logprob_max_abs_diff"].item() == pytest.approx(0.7)
    for metrics in on_two_ranks(run, [0], [1]):
        for key, value in whole.items():
            assert metrics[key].item() == pytest.approx(value.item()), key
