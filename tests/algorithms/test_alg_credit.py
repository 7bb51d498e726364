"""Credit assignment (algorithms/credit.py): sum-form and PURE's min-form, hand-computed and
against slow loop references."""

import math

import pytest
import torch

from primekit.algorithms import (
    CREDIT_ASSIGNMENTS,
    assign_credit,
    discounted_returns,
    min_form_returns,
    min_form_rewards,
    min_form_weights,
    sum_form_rewards,
)


def _loop_min_form(rewards, mask, tau):
    """Slow reference: PURE's transform row by row, unit by unit, with math.exp."""
    out = torch.zeros_like(rewards, dtype=torch.float64)
    for i in range(rewards.shape[0]):
        units = [k for k in range(rewards.shape[1]) if mask[i, k]]
        z = sum(math.exp(-float(rewards[i, k]) / tau) for k in units)
        for k in units:
            out[i, k] = math.exp(-float(rewards[i, k]) / tau) / z * float(rewards[i, k])
    return out


def _loop_suffix_min(rewards, mask):
    out = torch.zeros_like(rewards, dtype=torch.float64)
    for i in range(rewards.shape[0]):
        for t in range(rewards.shape[1]):
            if mask[i, t]:
                out[i, t] = min(float(rewards[i, k]) for k in range(t, rewards.shape[1])
                                if mask[i, k])
    return out


def test_min_form_hand_computed():
    # Two units with rewards 0 and ln 2 * tau at tau = 1: weights exp(0) : exp(-ln 2) = 1 : 1/2,
    # normalised 2/3 and 1/3; r' = (2/3 * 0, 1/3 * ln 2) and sum = ln(2)/3 = 0.2310.
    r = torch.tensor([[0.0, math.log(2.0), 5.0]], dtype=torch.float64)
    m = torch.tensor([[True, True, False]])
    w = min_form_weights(r, m, 1.0)
    assert torch.allclose(w, torch.tensor([[2 / 3, 1 / 3, 0.0]], dtype=torch.float64))
    out = min_form_rewards(r, m, 1.0)
    assert torch.allclose(out, torch.tensor([[0.0, math.log(2.0) / 3, 0.0]], dtype=torch.float64))
    # PURE's scale: PRM scores 0.9, -0.5, 0.7 at tau = 0.1: the weakest (-0.5) takes weight
    # 1 / (1 + e^-14 + e^-12) = 0.999993..., so the summed return is -0.49999 ~ min = -0.5.
    r = torch.tensor([[0.9, -0.5, 0.7]])
    total = min_form_rewards(r, torch.ones_like(r, dtype=torch.bool), 0.1).sum()
    assert abs(float(total) - (-0.5)) < 1e-4


def test_min_form_limits_and_loop_reference():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(5, 7, generator=g, dtype=torch.float64)
    m = torch.rand(5, 7, generator=g) > 0.3
    m[4] = False  # a row without units: all zero, no NaN
    for tau in (0.05, 0.3, 2.0):
        assert torch.allclose(min_form_rewards(r, m, tau), _loop_min_form(r, m, tau))
    out = min_form_rewards(r, m, 1.0)
    assert torch.all(out[~m] == 0) and torch.all(out[4] == 0)
    rows = m.any(1)
    exact_min = torch.stack([r[i][m[i]].min() for i in range(4)])
    mean = torch.stack([r[i][m[i]].mean() for i in range(4)])
    # tau -> 0: the summed transformed rewards -> the minimum; tau -> inf: -> the mean.
    assert torch.allclose(min_form_rewards(r, m, 1e-4).sum(1)[rows], exact_min, atol=1e-6)
    assert torch.allclose(min_form_rewards(r, m, 1e6).sum(1)[rows], mean, atol=1e-5)
    # The softmin average lies between the minimum and the mean at any temperature.
    mid = min_form_rewards(r, m, 0.5).sum(1)[rows]
    assert torch.all(mid >= exact_min - 1e-12) and torch.all(mid <= mean + 1e-12)
    w = min_form_weights(r, m, 0.5)
    assert torch.allclose(w.sum(1)[rows], torch.ones(4, dtype=torch.float64))


def test_min_form_returns_exact_and_loop():
    # rewards 3, 1, 2, (pad): G = min of the future = 1, 1, 2, 0
    r = torch.tensor([[3.0, 1.0, 2.0, 9.0]])
    m = torch.tensor([[True, True, True, False]])
    assert min_form_returns(r, m).tolist() == [[1.0, 1.0, 2.0, 0.0]]
    g = torch.Generator().manual_seed(1)
    r = torch.randn(4, 6, generator=g, dtype=torch.float64)
    m = torch.rand(4, 6, generator=g) > 0.4
    assert torch.equal(min_form_returns(r, m), _loop_suffix_min(r, m))


def test_extra_positive_units_pay_under_sum_not_under_min():
    # The hack min-form removes: repeating a good step (reward 0.9) adds 0.9 per copy to the
    # summed return, while the min-form return (tau -> 0) stays at the weakest step, 0.2.
    base = torch.tensor([[0.2, 0.9, 0.0, 0.0]])
    padded = torch.tensor([[0.2, 0.9, 0.9, 0.9]])
    m_base = torch.tensor([[True, True, False, False]])
    m_pad = torch.ones(1, 4, dtype=torch.bool)
    assert float(sum_form_rewards(padded, m_pad).sum()) - float(sum_form_rewards(base, m_base).sum()) \
        == pytest.approx(1.8)
    min_base = float(min_form_rewards(base, m_base, 0.01).sum())
    min_pad = float(min_form_rewards(padded, m_pad, 0.01).sum())
    assert min_base == pytest.approx(0.2, abs=1e-6) and min_pad == pytest.approx(0.2, abs=1e-6)


def test_transformed_rewards_compose_with_the_summed_return():
    # The estimators sum rewards-to-go: from the first unit the return of the transformed rewards
    # is the softmin average; from after the weakest unit it is ~0 (PURE's global weights).
    r = torch.tensor([[0.5, -1.0, 0.8]])
    m = torch.ones(1, 3, dtype=torch.bool)
    g = discounted_returns(min_form_rewards(r, m, 0.05), m.float(), 1.0)
    assert float(g[0, 0]) == pytest.approx(-1.0, abs=1e-6)
    assert float(g[0, 2]) == pytest.approx(0.0, abs=1e-6)


def test_assign_credit_metrics_and_dict():
    # Row 0: rewards 0.2, 0.6 -> min 0.2; row 1: 0.4 alone -> min 0.4, weight 1.
    r = torch.tensor([[0.2, 0.6], [0.4, 0.0]])
    m = torch.tensor([[True, True], [True, False]])
    out, metrics = assign_credit(r, m, "sum")
    assert torch.equal(out, torch.tensor([[0.2, 0.6], [0.4, 0.0]]))
    assert float(metrics["credit/return_mean"]) == pytest.approx((0.8 + 0.4) / 2)
    assert float(metrics["credit/min_return_mean"]) == pytest.approx((0.2 + 0.4) / 2)
    assert "credit/weight_max_mean" not in metrics
    out, metrics = assign_credit(r, m, "min", temperature=0.1)
    # row 0 weights: 1 / (1 + e^-4) = 0.98201 on 0.2 and 0.01799 on 0.6
    w0 = 1 / (1 + math.exp(-4.0))
    assert float(out[0].sum()) == pytest.approx(w0 * 0.2 + (1 - w0) * 0.6, rel=1e-5)
    assert float(metrics["credit/weight_max_mean"]) == pytest.approx((w0 + 1.0) / 2, rel=1e-6)
    assert set(CREDIT_ASSIGNMENTS) == {"sum", "min"}
    with pytest.raises(ValueError, match="credit must be one of"):
        assign_credit(r, m, "max")
    with pytest.raises(ValueError, match="temperature must be > 0"):
        min_form_rewards(r, m, 0.0)
    with pytest.raises(ValueError, match=r"must both be \[N, U\]"):
        min_form_rewards(r, m[:, :1], 0.1)
