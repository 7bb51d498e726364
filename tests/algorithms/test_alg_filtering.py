import pytest
import torch

from primekit.algorithms.filtering import filter_groups


def test_k4_keeps_one_two_three_of_four():
    # five prompts with 0..4 correct answers out of K = 4, groups interleaved
    outcomes, ids = [], []
    for n_correct, gid in zip(range(5), [10, 3, 7, 42, 5]):
        outcomes += [1.0] * n_correct + [0.0] * (4 - n_correct)
        ids += [gid] * 4
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    r, g = torch.tensor(outcomes)[perm], torch.tensor(ids)[perm]
    keep, metrics = filter_groups(r, g)
    kept_ids = set(g[keep].tolist())
    assert kept_ids == {3, 7, 42}  # accuracies 1/4, 2/4, 3/4
    assert int(keep.sum()) == 12
    assert {k: float(v) for k, v in metrics.items()} == {
        "filter/keep_rate": 3 / 5,
        "filter/groups": 5.0,
        "filter/kept_groups": 3.0,
    }
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())


def test_k5_keeps_bounds_inclusive():
    # accuracy 0/5, 1/5 = 0.2 (kept, the lower bound), 4/5 = 0.8 (kept), 5/5 (dropped)
    r = torch.tensor([0.0] * 5 + [1, 0, 0, 0, 0] + [1, 1, 1, 1, 0] + [1.0] * 5, dtype=torch.float32)
    g = torch.repeat_interleave(torch.arange(4), 5)
    keep, metrics = filter_groups(r, g)
    assert keep.tolist() == [False] * 5 + [True] * 10 + [False] * 5
    assert float(metrics["filter/keep_rate"]) == 0.5


def test_soft_labels_at_bound_kept_despite_float_rounding():
    # float32 mean of (0.1, 0.2, 0.3) is not exactly 0.2
    r = torch.tensor([0.1, 0.2, 0.3, 0.9, 0.9, 0.9], dtype=torch.float32)
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    keep, _ = filter_groups(r, g)
    assert keep.tolist() == [True, True, True, False, False, False]


def test_filter_rejects_inverted_bounds():
    with pytest.raises(ValueError, match="lo must be <= hi"):
        filter_groups(torch.zeros(2), torch.tensor([0, 0]), lo=0.9, hi=0.1)
