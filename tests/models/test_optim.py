"""The optimiser helpers every trained model steps through (`primekit/models/optim.py`): the
weights' norm read by the divergence guard, and the AdamW constructor."""

from __future__ import annotations

import math

import pytest
import torch

from primekit.models import optim


def test_weight_norm_by_hand():
    # sqrt(3^2 + 4^2 + 12^2) = sqrt(9 + 16 + 144) = sqrt(169) = 13, over two tensors.
    params = [torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])]
    assert optim.weight_norm(params) == 13.0
    assert optim.weight_norm([]) == 0.0
    assert optim.weight_norm([torch.zeros(0), torch.tensor([5.0])]) == 5.0  # empty tensors skipped


def test_weight_norm_matches_the_per_tensor_float64_loop():
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(64, 33, generator=gen) * 30, torch.randn(7, generator=gen),
              torch.randn(5, 5, generator=gen).to(torch.bfloat16), torch.randn(3, 2, 2, generator=gen)]
    # The loop the foreach norm replaced: each tensor in float64, summed in float64.
    loop = math.sqrt(sum(float(torch.linalg.vector_norm(p.double())) ** 2 for p in params))
    # Each tensor's norm in its own dtype: bfloat16 keeps 8 bits of mantissa, a relative error
    # up to about 2^-8 on its 25 values, whose share of the total is small.
    assert optim.weight_norm(params) == pytest.approx(loop, rel=1e-4)
    assert optim.weight_norm(params[:2]) == pytest.approx(
        math.sqrt(sum(float(torch.linalg.vector_norm(p.double())) ** 2 for p in params[:2])),
        rel=1e-6)


def test_weight_norm_of_finite_garbage_past_float32s_range_is_finite():
    # 1e20^2 overflows float32 (max ~3.4e38): the float64 path gives sqrt(1e40 + 9e40) =
    # sqrt(10) * 1e20, which the divergence message prints as the norm the weights grew to.
    assert optim.weight_norm([torch.tensor([1e20, 3e20]), torch.ones(2)]) == pytest.approx(
        math.sqrt(10) * 1e20, rel=1e-6)


def test_weight_norm_is_not_finite_where_a_weight_is_not():
    assert math.isinf(optim.weight_norm([torch.tensor([1.0, float("inf")]), torch.ones(3)]))
    assert math.isnan(optim.weight_norm([torch.tensor([float("nan")]), torch.ones(3)]))


def test_adamw_is_fused_where_supported_and_steps_as_the_default_does():
    torch.manual_seed(0)
    shipped, default = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    default.load_state_dict(shipped.state_dict())
    opt = optim.adamw(shipped.parameters(), lr=1e-2, weight_decay=0.1)
    assert opt.defaults["fused"] is True  # float32 parameters on a CPU
    ref = torch.optim.AdamW(default.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(5):
        x = torch.randn(4, 16)
        for model, o in ((shipped, opt), (default, ref)):
            o.zero_grad()
            model(x).pow(2).sum().backward()
            o.step()
    # The same update rule: five steps of lr 1e-2 move the weights by ~5e-2; they agree to
    # float32 rounding.
    for a, b in zip(shipped.parameters(), default.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # An optimiser state saved by the default implementation loads into the fused one.
    fresh = optim.adamw(default.parameters(), lr=1e-2, weight_decay=0.1)
    fresh.load_state_dict(ref.state_dict())
    assert int(fresh.state_dict()["state"][0]["step"]) == 5


def test_adamw_falls_back_where_the_fused_kernel_does_not_apply():
    # Complex parameters: torch's fused AdamW would refuse them at the first step.
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))
    opt = optim.adamw([p], lr=1e-3)
    assert not opt.defaults["fused"]
    p.grad = torch.ones_like(p)
    opt.step()  # the default implementation steps complex parameters
    assert torch.all(p.real < 0)
    assert not optim.fused_adamw_supported([])
