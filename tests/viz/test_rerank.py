"""Best-of-N strategies (primekit/viz/rerank.py) on fixed fixtures."""

from __future__ import annotations

import random

import pytest

from primekit.viz.rerank import STRATEGIES, majority, rerank_table, subsets

# Three problems, four samples each: scores, final answers and PRM statistics.
FIXTURE = [
    {"scores": [1, 0, 0, 1], "answers": ["7", "3", "3", "7"],
     "sum": [0.4, -0.2, 0.1, 0.3], "mean": [0.1, -0.1, 0.05, 0.02], "min": [0.0, -0.3, -0.1, -0.2]},
    {"scores": [0, 0, 1, 0], "answers": ["5", "5", "6", None],
     "sum": [0.5, 0.2, 0.1, -0.1], "mean": [0.01, 0.02, 0.03, -0.01], "min": [-0.1, -0.5, 0.0, -0.2]},
    {"scores": [0, 0, 0, 0], "answers": [None, None, "1", "2"],
     "sum": [0.0, 0.0, 0.0, 0.0], "mean": [0.0, 0.0, 0.0, 0.0], "min": [0.0, 0.0, 0.0, 0.0]},
]


def test_full_set_by_hand():
    (row,) = rerank_table(FIXTURE, [4], draws=8)
    # N = 4 (the whole set). oracle: 1, 1, 0 -> 2/3. random: 1/2, 1/4, 0 -> 0.25.
    # prm-sum picks 0.4 (score 1), 0.5 (0), tie of all four (mean 0) -> 1/3.
    # prm-mean picks 0.1 (1), 0.03 (1), tie (0) -> 2/3. prm-min picks 0.0 (1), 0.0 (1), tie -> 2/3.
    # majority: "7" vs "3" tie -> mean of all four = 0.5; "5" twice -> 0; "1" vs "2" tie -> 0.
    assert row == pytest.approx({"N": 4, "prm-sum": 1 / 3, "prm-mean": 2 / 3, "prm-min": 2 / 3,
                                 "majority": 0.5 / 3, "random": 0.25, "oracle": 2 / 3})


def test_oracle_bounds_every_strategy_and_n1_is_random():
    rng = random.Random(1)
    problems = []
    for _ in range(20):  # random problems: 16 samples with random scores, answers, PRM stats
        problems.append({"scores": [float(rng.random() < 0.4) for _ in range(16)],
                         "answers": [rng.choice(["1", "2", "3", None]) for _ in range(16)],
                         **{k: [rng.gauss(0, 1) for _ in range(16)] for k in ("sum", "mean", "min")}})
    rows = rerank_table(problems, [1, 2, 4, 8, 16], draws=16, seed=3)
    for row in rows:
        for name in STRATEGIES:
            assert row["oracle"] >= row[name] - 1e-12, (row["N"], name)
    n1 = rows[0]
    for name in STRATEGIES:  # one sample: every strategy picks it
        assert n1[name] == pytest.approx(n1["random"])
    assert rows[-1]["oracle"] > n1["oracle"]  # more samples, a better best one


def test_majority_without_answers_falls_back_to_random():
    p = {"scores": [1, 0], "answers": [None, None]}
    assert majority(p, [0, 1]) == 0.5


def test_subsets():
    rng = random.Random(0)
    assert subsets(4, 1, 5, rng) == [[0], [1], [2], [3]]
    assert subsets(4, 4, 5, rng) == [[0, 1, 2, 3]]
    two = subsets(4, 2, 5, rng)
    assert len(two) == 5 and all(len(set(s)) == 2 for s in two)
    with pytest.raises(ValueError, match="exceeds"):
        subsets(4, 8, 5, rng)


def test_pairwise_of_counts_pairs_within_a_problem_by_hand():
    import torch

    from primekit.viz.rerank import pairwise_of
    from primekit.viz.scoring import Scored

    # Two problems x K = 3. Summed rewards (over the mask): problem 0: 0.3, -0.1, 0.2 with
    # scores 1, 0, 0 -> pairs (0,1) right (0.3 > -0.1), (0,2) right (0.3 > 0.2); samples 1 and 2
    # share a score: no pair. Problem 1: 0.0, 0.5, 0.5 with scores 0, 1, 0 -> (1,0) right,
    # (1,2) a tie (0.5 = 0.5) counts 1/2. Total 3.5 of 4 pairs.
    rewards = torch.tensor([[0.1, 0.2, 9.0], [-0.1, 0.0, 0.0], [0.2, 0.0, 0.0],
                            [0.0, 0.0, 0.0], [0.25, 0.25, 0.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 0, 0]])
    scored = Scored(problems=[None] * 6, responses=[""] * 6, tokens=[[]] * 6,
                    scores=torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]), statuses=["x"] * 6,
                    token_rewards=rewards, response_mask=mask, k=3, beta=0.05)
    assert pairwise_of(scored) == (3.5, 4.0)
