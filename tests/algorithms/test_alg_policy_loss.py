import math

import pytest
import torch

from primekit.algorithms.policy_loss import (
    entropy_loss,
    kl_loss,
    kl_penalty,
    ppo_clip_loss,
    value_loss,
)


def test_ppo_clip_loss_hand():
    # four tokens: ratio 1.5 or 0.5, advantage +1 or -1, clip 0.2; a fifth padded token
    old = torch.zeros(1, 5, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5, 9.0]], dtype=torch.float64))
    logp.requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, metrics = ppo_clip_loss(logp, old, adv, mask)
    # token losses max(-A*rho, -A*clip(rho)):
    #   rho 1.5, A +1: max(-1.5, -1.2) = -1.2 (clipped)   rho 1.5, A -1: max(1.5, 1.2) = 1.5
    #   rho 0.5, A +1: max(-0.5, -0.8) = -0.5             rho 0.5, A -1: max(0.5, 0.8) = 0.8 (clipped)
    # token-mean: (-1.2 + 1.5 - 0.5 + 0.8) / 4 = 0.15
    assert loss.item() == pytest.approx(0.15)
    assert float(metrics["policy/loss"]) == pytest.approx(0.15)
    assert float(metrics["policy/clip_frac"]) == pytest.approx(0.5)
    assert float(metrics["policy/ratio_mean"]) == pytest.approx((1.5 + 1.5 + 0.5 + 0.5) / 4)
    # k3 of KL(old || new): (rho - 1) - log rho
    k3 = [0.5 - math.log(1.5), 0.5 - math.log(1.5), -0.5 - math.log(0.5), -0.5 - math.log(0.5)]
    assert float(metrics["policy/approx_kl"]) == pytest.approx(sum(k3) / 4)
    loss.backward()
    # clipped tokens get no gradient; unclipped: d(-A*rho)/dlogp = -A*rho / 4
    expected = torch.tensor([[0.0, 1.5 / 4, -0.5 / 4, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected)


def test_ppo_clip_asymmetric_clip_high():
    logp = torch.log(torch.tensor([[1.25]]))
    loss, m = ppo_clip_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.28)
    # rho 1.25 is inside [0.8, 1.28]: loss = -1.25, nothing clipped
    assert loss.item() == pytest.approx(-1.25)
    assert float(m["policy/clip_frac"]) == 0.0


def test_ppo_clip_loss_at_ratio_one_is_minus_mean_advantage():
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    z = torch.zeros(2, 3)
    loss, _ = ppo_clip_loss(z, z, adv, mask, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(-(2.0 + 4.0) / 2)


def test_value_loss_hand():
    v = torch.tensor([[1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.0]])
    ret = torch.tensor([[2.0, 0.1]])
    loss, m = value_loss(v, old, ret, torch.ones(1, 2), clip=0.2)
    # token 0: V = 1, V_clip = 0.5 + 0.2 = 0.7; errors (1-2)^2 = 1, (0.7-2)^2 = 1.69 -> 0.5*1.69
    # token 1: V = V_old = 0; both errors 0.01 -> 0.5*0.01
    assert loss.item() == pytest.approx((0.845 + 0.005) / 2)
    assert float(m["critic/clip_frac"]) == pytest.approx(0.5)
    loss.backward()
    # token 0's active branch is the clipped one, flat in V: grad 0; token 1: (0 - 0.1) / 2
    assert torch.allclose(v.grad, torch.tensor([[0.0, -0.05]]))
    loss_nc, _ = value_loss(v, old, ret, torch.ones(1, 2), clip=None)
    assert loss_nc.item() == pytest.approx((0.5 * 1.0 + 0.5 * 0.01) / 2)
    # means over both tokens: V (1 + 0)/2, R (2 + 0.1)/2; R - V = [1, 0.1]:
    # Var(R - V) = 2 * 0.45^2 / 1 = 0.405, Var(R) = 2 * 0.95^2 / 1 = 1.805 -> 1 - 0.405/1.805
    assert float(m["critic/values_mean"]) == pytest.approx(0.5)
    assert float(m["critic/returns_mean"]) == pytest.approx(1.05)
    assert float(m["critic/explained_var"]) == pytest.approx(1 - 0.405 / 1.805)
    # a single valid token has no variance: explained_var is reported as 0
    _, m1 = value_loss(v, old, ret, torch.tensor([[1, 0]]), clip=0.2)
    assert float(m1["critic/explained_var"]) == 0.0
    # returns that do not vary (every response of a micro-batch wrong, outcome reward only: R = 0)
    # leave nothing to explain: 0, not 1 - Var(R - V) / 0 = -inf (found on a GPU, 2026-12-05)
    _, m0 = value_loss(v, old, torch.zeros(1, 2), torch.ones(1, 2), clip=0.2)
    assert float(m0["critic/explained_var"]) == 0.0
    # values equal to constant returns: 1 - 0 / 0 would be nan
    _, mc = value_loss(torch.full((1, 2), 0.5), old, torch.full((1, 2), 0.5), torch.ones(1, 2),
                       clip=None)
    assert float(mc["critic/explained_var"]) == 0.0


def test_loss_metrics_are_detached_scalar_tensors():
    # Tensors, not floats: a float() per metric per micro-batch would sync with the GPU.
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    z = torch.zeros(2, 3)
    results = [
        ppo_clip_loss(logp, z, torch.ones(2, 3), mask)[1],
        value_loss(logp, z, torch.ones(2, 3), mask)[1],
        kl_loss(logp, z, mask)[1],
        entropy_loss(logp, mask)[1],
    ]
    for metrics in results:
        for key, v in metrics.items():
            assert isinstance(v, torch.Tensor) and v.dim() == 0, key
            assert not v.requires_grad, key


def test_kl_penalty_hand():
    logp = torch.zeros(1, 1)
    ref = torch.log(torch.tensor([[0.5]]))
    # log r = log(0.5) = -0.6931: k1 = 0.6931, k2 = 0.5 * 0.4805 = 0.2402, k3 = (0.5 - 1) + 0.6931
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.log(2) - 0.5)
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k4")


def test_k1_and_k3_are_unbiased_kl_estimators_exactly():
    # E_{x~p}[k(x)] summed over a small vocabulary equals KL(p || q) exactly for k1 and k3
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(7, generator=g, dtype=torch.float64), 0)
    logq = torch.log_softmax(torch.randn(7, generator=g, dtype=torch.float64), 0)
    kl = (logp.exp() * (logp - logq)).sum()
    for kind in ("k1", "k3"):
        est = (logp.exp() * kl_penalty(logp[None], logq[None], kind)[0]).sum()
        assert est.item() == pytest.approx(kl.item(), rel=1e-12)
    assert torch.all(kl_penalty(logp[None], logq[None], "k3") >= 0)


def test_kl_loss_and_entropy_loss_signs():
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    ref = torch.log(torch.tensor([[0.5, 0.5]]))
    loss, m = kl_loss(logp, ref, torch.tensor([[1, 0]]), kind="k1")
    assert loss.item() == pytest.approx(math.log(2))
    assert float(m["policy/kl"]) == pytest.approx(math.log(2))
    ent = torch.tensor([[1.0, 3.0], [2.0, 100.0]])
    loss, m = entropy_loss(ent, torch.tensor([[1, 1], [1, 0]]))
    assert loss.item() == pytest.approx(-2.0)  # -(1 + 3 + 2) / 3
    assert float(m["policy/entropy"]) == pytest.approx(2.0)
