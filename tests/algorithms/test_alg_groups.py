import pytest
import torch

from primekit.algorithms.groups import (
    group_counts,
    group_layout,
    group_mean,
    group_std,
    group_sum,
    leave_one_out_mean,
)


def test_group_statistics_hand_interleaved_groups():
    v = torch.tensor([1.0, 10.0, 3.0, 20.0, 5.0], dtype=torch.float64)
    gid = torch.tensor([7, 2, 7, 2, 7])
    # group 7: 1, 3, 5 (sum 9, mean 3, unbiased std 2); group 2: 10, 20 (sum 30, mean 15)
    assert group_sum(v, gid).tolist() == [9.0, 30.0, 9.0, 30.0, 9.0]
    assert group_counts(v, gid).tolist() == [3.0, 2.0, 3.0, 2.0, 3.0]
    assert group_mean(v, gid).tolist() == [3.0, 15.0, 3.0, 15.0, 3.0]
    s = 50**0.5  # sqrt((25 + 25) / 1)
    assert torch.allclose(
        group_std(v, gid), torch.tensor([2.0, s, 2.0, s, 2.0], dtype=torch.float64)
    )
    # leave-one-out: (9 - 1)/2 = 4, 20, (9 - 3)/2 = 3, 10, (9 - 5)/2 = 2
    assert leave_one_out_mean(v, gid).tolist() == [4.0, 20.0, 3.0, 10.0, 2.0]


def test_group_validation():
    with pytest.raises(ValueError, match=">= 2 samples"):
        leave_one_out_mean(torch.ones(3), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="integer"):
        group_mean(torch.ones(2), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"\[N\]"):
        group_mean(torch.ones(3), torch.tensor([0, 1]))


def test_group_layout_slots_are_unique_within_groups():
    gid = torch.tensor([9, 2, 9, 5, 2, 9])
    inverse, slot, n_groups, kmax = group_layout(torch.zeros(6), gid)
    assert (n_groups, kmax) == (3, 3)
    # groups sorted by id: 2 -> 0, 5 -> 1, 9 -> 2; slots in order of appearance
    assert inverse.tolist() == [2, 0, 2, 1, 0, 2]
    assert slot.tolist() == [0, 0, 1, 0, 1, 2]
