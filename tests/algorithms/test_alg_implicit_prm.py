import math

import pytest
import torch

from primekit.algorithms.implicit_prm import (
    implicit_sequence_rewards,
    implicit_token_rewards,
    prm_absolute_accuracy,
    prm_ce_loss,
    prm_dpo_loss,
    prm_pairwise_accuracy,
    prm_pairwise_counts,
)

D = torch.float64


def test_implicit_token_and_sequence_rewards_hand():
    prm = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -0.5, -0.5]], dtype=D)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, -1.0, -0.25]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    r = implicit_token_rewards(prm, ref, mask, beta=0.1)
    # 0.1 * (-1 + 1.5) = 0.05, 0.1 * (-2 + 1) = -0.1, padding 0; row 2: 0, 0.05, -0.025
    assert torch.allclose(r, torch.tensor([[0.05, -0.1, 0.0], [0.0, 0.05, -0.025]], dtype=D))
    assert torch.allclose(implicit_sequence_rewards(r, mask), torch.tensor([-0.05, 0.025], dtype=D))


def test_prm_equal_to_reference_gives_zero_rewards():
    lp = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    r = implicit_token_rewards(lp, lp.clone(), torch.ones(3, 4), beta=0.05)
    assert torch.equal(r, torch.zeros(3, 4))


def test_prm_ce_loss_hand():
    # two sequences with the same log-ratios [2, 0]; beta 0.5 -> R = 1; labels 1 and 0
    ref = torch.zeros(2, 2, dtype=D)
    prm = torch.tensor([[2.0, 0.0], [2.0, 0.0]], dtype=D)
    loss, m = prm_ce_loss(prm, ref, torch.ones(2, 2), torch.tensor([1.0, 0.0], dtype=D), beta=0.5)
    # -log sigmoid(1) = log(1 + e^-1) = 0.313262; -log sigmoid(-1) = log(1 + e) = 1.313262
    expected = (math.log1p(math.exp(-1)) + math.log1p(math.e)) / 2
    assert loss.item() == pytest.approx(expected)
    assert float(m["prm/loss"]) == pytest.approx(expected)
    assert float(m["prm/acc_abs"]) == pytest.approx(0.5)  # R > 0 predicts "correct" for both
    # untrained PRM (R = 0): log 2 whatever the label, soft labels included
    z = torch.zeros(3, 2, dtype=D)
    loss0, _ = prm_ce_loss(z, z, torch.ones(3, 2), torch.tensor([1.0, 0.0, 0.5], dtype=D), 0.05)
    assert loss0.item() == pytest.approx(math.log(2))
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in m.values())
    assert not any(v.requires_grad for v in m.values())


def test_prm_ce_gradient_matches_hand_derivation_and_finite_differences():
    g = torch.Generator().manual_seed(3)
    prm = torch.randn(4, 5, generator=g, dtype=D).requires_grad_(True)
    ref = torch.randn(4, 5, generator=g, dtype=D).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]])
    y = torch.tensor([1.0, 0.0, 0.3, 1.0], dtype=D)
    beta = 0.7
    loss, _ = prm_ce_loss(prm, ref, mask, y, beta)
    loss.backward()
    # dL/dlogp_prm[i, t] = beta * (sigmoid(R_i) - y_i) / N on valid tokens
    R = beta * ((prm - ref) * mask).sum(-1)
    hand = beta * (torch.sigmoid(R) - y)[:, None] / 4 * mask
    assert torch.allclose(prm.grad, hand.detach(), atol=1e-12)
    assert ref.grad is None or torch.all(ref.grad == 0)  # the reference is detached
    # central finite differences on two entries
    for i, t in [(0, 2), (3, 1)]:
        h = 1e-6
        p1, p2 = prm.detach().clone(), prm.detach().clone()
        p1[i, t] += h
        p2[i, t] -= h
        fd = (prm_ce_loss(p1, ref, mask, y, beta)[0] - prm_ce_loss(p2, ref, mask, y, beta)[0]) / (
            2 * h
        )
        assert fd.item() == pytest.approx(prm.grad[i, t].item(), rel=1e-6)


def test_prm_ce_loss_is_stable_for_large_rewards():
    prm = torch.full((1, 10), 200.0)
    loss, _ = prm_ce_loss(prm, torch.zeros(1, 10), torch.ones(1, 10), torch.tensor([0.0]), beta=1.0)
    assert loss.item() == pytest.approx(2000.0)  # -log(1 - sigmoid(2000)) = 2000, not inf


def test_prm_ce_loss_validates_inputs():
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="outcome_rewards"):
        prm_ce_loss(z, z, torch.ones(1, 2), torch.tensor([1.5]), 0.05)
    with pytest.raises(ValueError, match="beta"):
        prm_ce_loss(z, z, torch.ones(1, 2), torch.tensor([1.0]), 0.0)


def test_prm_dpo_loss_hand():
    # groups 4 (non-contiguous) and 9; only (0, 2) in group 4 is an ordered pair with o0 > o2
    prm = torch.tensor([[0.5], [3.0], [-0.5], [1.0]], dtype=D, requires_grad=True)
    ref = torch.zeros(4, 1, dtype=D)
    gid = torch.tensor([4, 9, 4, 9])
    y = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=D)
    loss, m = prm_dpo_loss(prm, ref, torch.ones(4, 1), y, gid, beta=1.0)
    # -log sigmoid(R0 - R2) = -log sigmoid(1) = 0.313262
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1)))
    assert float(m["prm/dpo_pairs"]) == 1.0
    assert not m["prm/loss"].requires_grad  # detached: logging it keeps no graph alive
    loss.backward()
    s = 1 - 1 / (1 + math.exp(-1))  # 1 - sigmoid(1)
    assert torch.allclose(prm.grad[:, 0], torch.tensor([-s, 0.0, s, 0.0], dtype=D))


def test_prm_dpo_loss_without_pairs_is_zero_and_differentiable():
    prm = torch.randn(4, 3, requires_grad=True)
    y = torch.tensor([1.0, 1.0, 0.0, 0.0])
    loss, m = prm_dpo_loss(
        prm, torch.zeros(4, 3), torch.ones(4, 3), y, torch.tensor([0, 0, 1, 1]), 0.05
    )
    assert loss.item() == 0.0 and float(m["prm/dpo_pairs"]) == 0.0
    loss.backward()
    assert torch.equal(prm.grad, torch.zeros(4, 3))


def test_pairwise_counts_hand():
    # group A (id 2): R = [1, 2, 0], o = [1, 0, 0]: pair (0,1) wrong order -> 0, (0,2) right -> 1,
    #   (1,2) equal outcomes -> no pair.  group B (id 0): R = [3, 3], o = [0, 1]: tie -> 0.5
    R = torch.tensor([1.0, 3.0, 2.0, 3.0, 0.0])
    o = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    gid = torch.tensor([2, 0, 2, 0, 2])
    n_correct, n_pairs = prm_pairwise_counts(R, o, gid)
    assert (n_correct.item(), n_pairs.item()) == (1.5, 3.0)
    assert prm_pairwise_accuracy(R, o, gid).item() == pytest.approx(0.5)
    assert math.isnan(prm_pairwise_accuracy(R, torch.ones(5), gid).item())


def test_untrained_prm_pairwise_accuracy_is_one_half():
    o = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert prm_pairwise_accuracy(torch.zeros(4), o, torch.zeros(4, dtype=torch.long)).item() == 0.5


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pairwise_counts_match_loop(seed):
    g = torch.Generator().manual_seed(seed)
    n = 13
    R = torch.randint(-2, 3, (n,), generator=g).float()  # small ints: ties happen
    o = torch.randint(0, 3, (n,), generator=g).float() / 2  # soft labels 0, 0.5, 1
    gid = torch.randint(0, 4, (n,), generator=g) * 5
    correct, pairs = 0.0, 0
    for i in range(n):
        for j in range(i + 1, n):
            if gid[i] != gid[j] or o[i] == o[j]:
                continue
            pairs += 1
            if R[i] == R[j]:
                correct += 0.5
            elif (R[i] > R[j]) == (o[i] > o[j]):
                correct += 1
    n_correct, n_pairs = prm_pairwise_counts(R, o, gid)
    assert n_pairs.item() == pairs and n_correct.item() == pytest.approx(correct)


def test_absolute_accuracy_hand():
    R = torch.tensor([0.3, -0.1, 0.0, 2.0])
    o = torch.tensor([1.0, 0.0, 1.0, 0.2])
    # predictions R > 0: T, F, F, T; labels o > 0.5: T, F, T, F -> 2 of 4 agree
    assert prm_absolute_accuracy(R, o).item() == pytest.approx(0.5)
    assert prm_absolute_accuracy(R, o, threshold=0.1).item() == pytest.approx(0.75)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prm_dpo_loss_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    n = 11
    prm = torch.randn(n, 3, generator=g, dtype=D)
    ref = torch.randn(n, 3, generator=g, dtype=D)
    mask = torch.arange(3)[None, :] < torch.randint(1, 4, (n,), generator=g)[:, None]
    y = torch.randint(0, 3, (n,), generator=g).to(D) / 2
    gid = torch.randint(0, 3, (n,), generator=g) * 11
    R = [0.3 * float(((prm[i] - ref[i]) * mask[i]).sum()) for i in range(n)]
    terms = [
        -math.log(1 / (1 + math.exp(-(R[i] - R[j]))))
        for i in range(n)
        for j in range(n)
        if gid[i] == gid[j] and y[i] > y[j]
    ]
    loss, m = prm_dpo_loss(prm, ref, mask, y, gid, beta=0.3)
    assert float(m["prm/dpo_pairs"]) == len(terms)
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-10)


def test_prm_ce_loss_takes_soft_labels_from_partial_code_credit():
    # A code response passing 2 of 3 tests has the label y = 2/3 (PRIME's reference code does
    # the same). BCE(sigmoid(R), y) is minimised where sigmoid(R) = y, i.e. R = log(y / (1 - y))
    # = log 2, where the loss is the binary entropy
    # H(2/3) = -(2/3 log(2/3) + 1/3 log(1/3)) = 0.636514 and the gradient is 0.
    y = torch.tensor([2 / 3], dtype=D)
    mask = torch.ones(1, 2)
    prm = torch.tensor([[math.log(2), 0.0]], dtype=D, requires_grad=True)  # beta 1: R = log 2
    loss, _ = prm_ce_loss(prm, torch.zeros(1, 2, dtype=D), mask, y, beta=1.0)
    loss.backward()
    assert loss.item() == pytest.approx(0.636514, abs=1e-6)
    assert prm.grad.abs().max().item() < 1e-12
    # Off the optimum the gradient pulls sigmoid(R) towards y: at R = 0, dL/dR = 1/2 - 2/3 < 0.
    z = torch.zeros(1, 2, dtype=D, requires_grad=True)
    prm_ce_loss(z, torch.zeros(1, 2, dtype=D), mask, y, beta=1.0)[0].backward()
    assert z.grad[0, 0].item() == pytest.approx(0.5 - 2 / 3)
