"""Reward-hacking diagnostics on hand-written batches."""

from __future__ import annotations

import math
import random

import pytest
import torch

from primekit.algorithms.hacking import (
    pearson,
    repeated_ngram_share,
    repeated_step_share,
    reward_hacking_metrics,
    words,
)


def test_words_and_ngrams():
    assert words("7*2=14\nA:14") == ["7", "*", "2", "=", "14", "A", ":", "14"]
    # "a b a b a", n = 2: (a,b) (b,a) (a,b) (b,a) -> the last two repeat: 2 of 4.
    assert repeated_ngram_share("a b a b a", 2) == (2, 4)
    assert repeated_ngram_share("a b", 4) == (0, 0)
    with pytest.raises(ValueError, match="n must be"):
        repeated_ngram_share("a", 0)


def test_repeated_steps_compare_stripped_text():
    assert repeated_step_share(["1+1=2\n", "1+1=2\n", "2+1=3\n", "1+1=2"]) == (2, 4)
    assert repeated_step_share([]) == (0, 0)


def test_pearson_hand_computed_and_undefined():
    # x = [1, 2, 3], y = [0, 0, 1]: sum dx dy = 1, sum dx^2 = 2, sum dy^2 = 2/3 -> 1/sqrt(4/3).
    r = pearson(torch.tensor([1.0, 2, 3]), torch.tensor([0.0, 0, 1]))
    assert isinstance(r, torch.Tensor) and r.dim() == 0
    assert float(r) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(pearson(torch.tensor([1.0, 2]), torch.tensor([1.0, 1.0])))
    assert math.isnan(pearson(torch.tensor([1.0]), torch.tensor([0.0])))
    rng = random.Random(0)
    x = torch.tensor([rng.random() for _ in range(50)], dtype=torch.float64)
    y = 3 * x + torch.tensor([rng.random() * 0.1 for _ in range(50)], dtype=torch.float64)
    import numpy as np

    assert float(pearson(x, y)) == pytest.approx(float(np.corrcoef(x.numpy(), y.numpy())[0, 1]))


def test_reward_hacking_metrics_hand_computed():
    responses = ["3+4=7\nA:7", "1+1=2\n1+1=2\n1+1=2\nA:2", "A:5"]
    mask = torch.tensor([[1] * 10 + [0] * 12, [1] * 22, [1] * 4 + [0] * 18])
    token_rewards = torch.zeros(3, 22)
    token_rewards[0, 5], token_rewards[0, 9] = 0.5, 0.5  # return 1
    token_rewards[1, [5, 11, 17, 21]] = 0.5  # return 2
    token_rewards[2, 3], token_rewards[2, 10] = 3.0, 99.0  # return 3 (99 is masked off)
    outcome = torch.tensor([0.0, 0.0, 1.0])
    m = reward_hacking_metrics(
        responses,
        step_delimiter="\n",
        outcome_rewards=outcome,
        token_rewards=token_rewards,
        response_mask=mask,
        ngram=4,
    )
    # steps: 2, 4, 1 -> 7/3; repeated steps: the 2nd and 3rd "1+1=2" -> 2 of 7.
    assert float(m["hack/steps_per_response"]) == pytest.approx(7 / 3)
    assert float(m["hack/repeated_step_share"]) == pytest.approx(2 / 7)
    # words: r0 "3 + 4 = 7 A : 7" -> 8 words, 5 4-grams, none repeated.
    # r1: "1 + 1 = 2" three times, then "A : 2" -> 18 words, 15 4-grams (i = 0..14). The 4-grams at
    # i = 0..4 are new; i = 5..11 repeat the ones 5 earlier (7 repeats); i = 12..14 reach into
    # "A : 2" and are new. r2 "A : 5" has no 4-gram. Share: 7 / (5 + 15 + 0).
    assert float(m["hack/repeated_ngram_share"]) == pytest.approx(7 / 20)
    assert float(m["hack/response_len_chars"]) == pytest.approx((9 + 21 + 3) / 3)
    assert float(m["hack/response_len_tokens"]) == pytest.approx((10 + 22 + 4) / 3)
    assert float(m["hack/dense_return_mean"]) == pytest.approx(2.0)
    # returns [1, 2, 3] vs outcomes [0, 0, 1]: sqrt(3)/2 (see test_pearson_hand_computed)
    assert float(m["hack/dense_success_corr"]) == pytest.approx(math.sqrt(3) / 2)


def test_outcome_only_has_nan_dense_metrics():
    m = reward_hacking_metrics(
        ["A:1", "A:2"],
        step_delimiter="\n",
        outcome_rewards=torch.tensor([1.0, 0.0]),
        token_rewards=None,
        response_mask=torch.ones(2, 4),
    )
    assert math.isnan(m["hack/dense_return_mean"]) and math.isnan(m["hack/dense_success_corr"])
    assert float(m["hack/steps_per_response"]) == 1.0
    assert float(m["hack/repeated_step_share"]) == 0.0
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in m.values())
    assert set(m) == {
        "hack/steps_per_response",
        "hack/repeated_step_share",
        "hack/repeated_ngram_share",
        "hack/response_len_chars",
        "hack/response_len_tokens",
        "hack/dense_return_mean",
        "hack/dense_success_corr",
        "hack/step_len_chars",
        "hack/delimiter_rate",
    }
    with pytest.raises(ValueError, match="outcome_rewards"):
        reward_hacking_metrics(
            ["A:1"],
            step_delimiter="\n",
            outcome_rewards=torch.zeros(2),
            token_rewards=None,
            response_mask=torch.ones(1, 3),
        )
