"""PRM-verifier consistency filter (PROF; algorithms/filtering.py), hand-computed and against a
slow loop reference of the stated rule."""

import itertools

import pytest
import torch

from primekit.algorithms import consistency_drop_counts, consistency_filter


def _loop_filter(outcomes, scores, group_ids, drop, threshold=0.5):
    """The rule one removal at a time: take from the side with more samples left (a tie: the
    correct side), its least consistent sample (correct: lowest score; wrong: highest; equal
    scores: the earlier row)."""
    keep = [True] * len(outcomes)
    for g in dict.fromkeys(group_ids):
        rows = [i for i, x in enumerate(group_ids) if x == g]
        for _ in range(drop):
            left = [i for i in rows if keep[i]]
            pos = [i for i in left if outcomes[i] >= threshold]
            neg = [i for i in left if outcomes[i] < threshold]
            if len(pos) >= len(neg):
                victim = min(pos, key=lambda i: (scores[i], i))
            else:
                victim = min(neg, key=lambda i: (-scores[i], i))
            keep[victim] = False
    return keep


def test_hand_computed_k4_drop1():
    # Group 0: 3 correct (scores 0.9, 0.1, 0.5), 1 wrong (0.7) -> the larger side is correct:
    #   drop the correct one with the lowest process score, row 1 (0.1).
    # Group 1: 1 correct (row 4, 0.2), 3 wrong (rows 5-7: 0.8, 0.3, -0.4) -> drop the wrong one
    #   the PRM likes most, row 5 (0.8).
    # Group 2: 2 correct (0.6, -0.1), 2 wrong (0.0, 0.4) -> a tie takes a correct one: row 9.
    outcomes = torch.tensor([1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 0], dtype=torch.float32)
    scores = torch.tensor([0.9, 0.1, 0.5, 0.7, 0.2, 0.8, 0.3, -0.4, 0.6, -0.1, 0.0, 0.4])
    groups = torch.arange(3).repeat_interleave(4)
    keep, metrics = consistency_filter(outcomes, scores, groups, drop=1)
    assert (~keep).nonzero().flatten().tolist() == [1, 5, 9]
    assert float(metrics["filter/consistency_dropped"]) == pytest.approx(3 / 12)
    assert float(metrics["filter/consistency_dropped_correct"]) == pytest.approx(2 / 12)
    assert float(metrics["filter/consistency_dropped_wrong"]) == pytest.approx(1 / 12)
    # drop=2 in group 0 (3 correct, 1 wrong): both from the correct side, 0.1 then 0.5 (rows 1, 2);
    # group 2 (2/2): one correct (-0.1, row 9), then the sides are 1 correct / 2 wrong, so the
    # wrong one with the higher score, 0.4 (row 11).
    keep, _ = consistency_filter(outcomes, scores, groups, drop=2)
    assert (~keep).nonzero().flatten().tolist() == [1, 2, 5, 6, 9, 11]


def test_drop_counts_closed_form():
    # (n+, n-, drop) -> (correct drops, wrong drops); e.g. (5, 2, 4): 5/2 -> 4/2 -> 3/2 -> 2/2
    # -> (tie: a correct one) 1/2, so all four drops are correct ones.
    cases = {(3, 1, 1): (1, 0), (1, 3, 1): (0, 1), (2, 2, 1): (1, 0), (2, 2, 3): (2, 1),
             (4, 0, 2): (2, 0), (0, 5, 4): (0, 4), (5, 2, 4): (4, 0), (3, 3, 4): (2, 2)}
    for (p, q, d), expected in cases.items():
        c, w = consistency_drop_counts(torch.tensor([p]), torch.tensor([q]), d)
        assert (int(c), int(w)) == expected, (p, q, d)


def test_matches_loop_reference_interleaved_groups_and_ties():
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        k = 3 + trial % 4
        n_groups = 5
        ids = torch.tensor([7, 2, 9, 4, 11]).repeat_interleave(k)
        perm = torch.randperm(len(ids), generator=g)
        ids = ids[perm]
        outcomes = (torch.rand(len(ids), generator=g) > 0.5).float()
        # coarse scores so that ties occur
        scores = torch.randint(0, 3, (len(ids),), generator=g).float()
        for drop in range(k):
            keep, metrics = consistency_filter(outcomes, scores, ids, drop)
            expected = _loop_filter(outcomes.tolist(), scores.tolist(), ids.tolist(), drop)
            assert keep.tolist() == expected, (trial, drop)
            assert int((~keep).sum()) == drop * n_groups
            assert float(metrics["filter/consistency_dropped"]) == pytest.approx(
                drop * n_groups / len(ids))


def test_balance_never_empties_a_side_with_more_left_on_the_other():
    for p, q in itertools.product(range(5), range(5)):
        for d in range(p + q):
            c, w = consistency_drop_counts(torch.tensor([p]), torch.tensor([q]), d)
            kept_p, kept_q = p - int(c), q - int(w)
            assert kept_p >= 0 and kept_q >= 0 and int(c + w) == d
            assert abs(kept_p - kept_q) <= max(abs(p - q) - d, 1)  # as equal as allowed


def test_bad_input():
    r = torch.tensor([1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"drop must be in \[0, smallest group size 1\)"):
        consistency_filter(r, torch.zeros(3), torch.tensor([0, 0, 1]), 1)
    with pytest.raises(ValueError, match="must all be"):
        consistency_filter(r, torch.zeros(2), torch.tensor([0, 0, 1]), 0)
