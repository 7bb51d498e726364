import math

import pytest
import torch

from primekit.algorithms.masked import (
    LOSS_AGG_MODES,
    aggregate_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

NAN = float("nan")


def test_masked_sum_and_mean_ignore_padding_even_nan():
    x = torch.tensor([[1.0, 2.0, NAN], [4.0, NAN, NAN]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_sum(x, m).item() == 7.0  # 1 + 2 + 4
    assert torch.equal(masked_sum(x, m, dim=-1), torch.tensor([3.0, 4.0]))
    assert masked_mean(x, m).item() == pytest.approx(7.0 / 3.0)
    assert torch.allclose(masked_mean(x, m, dim=-1), torch.tensor([1.5, 4.0]))


def test_masked_mean_of_empty_slice_is_zero():
    x = torch.tensor([[5.0, 6.0], [1.0, 3.0]])
    m = torch.tensor([[0, 0], [1, 1]])
    assert torch.equal(masked_mean(x, m, dim=-1), torch.tensor([0.0, 2.0]))


def test_masked_var_hand():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1, 1, 1, 0])
    # mean 2, squared deviations 1 + 0 + 1 = 2: unbiased 2/2 = 1, biased 2/3
    assert masked_var(x, m).item() == pytest.approx(1.0)
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2.0 / 3.0)
    with pytest.raises(ValueError):
        masked_var(x, torch.tensor([1, 0, 0, 0]))
    with pytest.raises(ValueError):
        masked_var(x, torch.zeros(4))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_whiten_gives_zero_mean_unit_std(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 9, generator=g, dtype=torch.float64) * 3 + 5
    lengths = torch.randint(1, 10, (6,), generator=g)
    m = torch.arange(9)[None, :] < lengths[:, None]
    x = torch.where(m, x, torch.full_like(x, NAN))
    w = masked_whiten(x, m)
    valid = w[m]
    assert valid.mean().abs().item() < 1e-10
    assert valid.std().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.all(w[~m] == 0)
    # shift_mean=False only rescales: the mean is kept
    w2 = masked_whiten(x, m, shift_mean=False)
    assert w2[m].mean().item() == pytest.approx(x[m].mean().item(), rel=1e-9)
    assert w2[m].std().item() == pytest.approx(1.0, abs=1e-6)


def test_masked_whiten_degenerate_inputs_do_not_raise():
    x = torch.tensor([[3.0, 3.0, 3.0]])
    assert torch.equal(masked_whiten(x, torch.ones(1, 3)), torch.zeros(1, 3))  # zero variance
    assert torch.equal(masked_whiten(x, torch.tensor([[1, 0, 0]])), torch.zeros(1, 3))  # one entry
    assert torch.equal(masked_whiten(x, torch.zeros(1, 3)), torch.zeros(1, 3))


def test_aggregate_loss_modes_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the empty third row is left out
    # token-mean: (1 + 2 + 3 + 4) / 4 = 2.5
    assert aggregate_loss(loss, m, "token-mean").item() == pytest.approx(2.5)
    # seq-mean-token-sum: (6 + 4) / 2 = 5
    assert aggregate_loss(loss, m, "seq-mean-token-sum").item() == pytest.approx(5.0)
    # seq-mean-token-mean: (2 + 4) / 2 = 3
    assert aggregate_loss(loss, m, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert set(LOSS_AGG_MODES) == {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"}


def test_aggregate_loss_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        aggregate_loss(torch.zeros(1, 2), torch.ones(1, 2), "mean")


def test_aggregate_loss_is_differentiable():
    loss = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    m = torch.tensor([[1, 1], [1, 0]])
    aggregate_loss(loss, m, "seq-mean-token-mean").backward()
    # (mean(1,2) + 3) / 2: d/dl00 = d/dl01 = 1/4, d/dl10 = 1/2, padding 0
    assert torch.allclose(loss.grad, torch.tensor([[0.25, 0.25], [0.5, 0.0]]))
    assert not math.isnan(loss.grad.sum().item())
