import math

import pytest
import torch

from primekit.algorithms.advantages import (
    ESTIMATORS,
    AdvantageParts,
    broadcast_outcome_advantages,
    compute_advantages,
    discounted_returns,
    gae_advantages,
    grpo_outcome_advantages,
    implicit_value_advantages,
    implicit_values,
    normalize_by_max_abs_return,
    ppo_advantages,
    ppo_token_rewards,
    prime_grpo_process_returns,
    prime_reinforce_process_returns,
    prime_rloo_process_returns,
    reinforce_outcome_advantages,
    rloo_advantages,
    rloo_outcome_advantages,
)
from primekit.algorithms.implicit_prm import implicit_token_rewards

D = torch.float64
NAN = float("nan")
SEEDS = [0, 1, 2, 3, 4]


def random_batch(seed: int, n_groups: int = 4, max_k: int = 5, T: int = 9):
    """Ragged, right-padded batch with interleaved groups of unequal size; NaN in the padding."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, max_k + 1, (n_groups,), generator=g)
    ids = torch.cat([torch.full((int(s),), 7 * k + 3) for k, s in enumerate(sizes)])
    n = ids.shape[0]
    ids = ids[torch.randperm(n, generator=g)]
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    tr = torch.randn(n, T, generator=g, dtype=D) * 0.3
    tr = torch.where(mask, tr, torch.full_like(tr, NAN))
    outcome = torch.randint(0, 2, (n,), generator=g).to(D)
    values = torch.where(mask, torch.rand(n, T, generator=g, dtype=D), torch.full_like(tr, NAN))
    kl = torch.where(mask, torch.rand(n, T, generator=g, dtype=D) * 0.1, torch.full_like(tr, NAN))
    return tr, mask, ids, outcome, values, kl


def estimator_kwargs(name, tr, mask, ids, outcome, values, gamma=1.0, lam=1.0, **options):
    """Keyword arguments of ESTIMATORS[name].fn, as a trainer builds them from its config."""
    data = dict(outcome_rewards=outcome, response_mask=mask, token_rewards=tr)
    per_estimator = {
        "rloo": dict(group_ids=ids, gamma=gamma),
        "grpo": dict(group_ids=ids, gamma=gamma),
        "reinforce": dict(gamma=gamma),
        "ppo": dict(values=values, gamma=gamma, lam=lam),
        "prime-value": dict(gamma=gamma, lam=lam),
    }
    return data | per_estimator[name] | options


def run_estimator(name, tr, mask, ids, outcome, values, gamma=1.0, lam=1.0, options=None, **kw):
    """ESTIMATORS[name].fn then compute_advantages(**kw): the trainer's two calls."""
    kwargs = estimator_kwargs(name, tr, mask, ids, outcome, values, gamma, lam, **(options or {}))
    return compute_advantages(ESTIMATORS[name].fn(**kwargs), response_mask=mask, **kw)


# ---------------------------------------------------------------------------------------------
# loop references (one sequence at a time, plain python floats)


def ref_valid(row, mask_row):
    return [float(row[t]) for t in range(len(row)) if mask_row[t]]


def ref_rtg(xs, gamma):
    out, run = [0.0] * len(xs), 0.0
    for t in range(len(xs) - 1, -1, -1):
        run = xs[t] + gamma * run
        out[t] = run
    return out


def ref_pad(xs, T):
    return xs + [0.0] * (T - len(xs))


def ref_members(ids, i):
    return [j for j in range(len(ids)) if ids[j] == ids[i]]


def ref_process(tr, mask, ids, gamma, kind):
    n, T = tr.shape
    rows = [ref_valid(tr[i], mask[i]) for i in range(n)]
    means = [sum(r) / len(r) for r in rows]
    out = []
    for i in range(n):
        grp = ref_members(ids, i)
        others = [j for j in grp if j != i]
        k = len(grp)
        if kind == "eq5":
            b = sum(means[j] for j in others) / len(others)
            shaped = [x - b for x in rows[i]]
        elif kind == "reference":
            shaped = [x * k / (k - 1) - sum(means[j] for j in grp) / (k - 1) for x in rows[i]]
        elif kind == "grpo":
            mu = sum(means[j] for j in grp) / k
            sd = math.sqrt(sum((means[j] - mu) ** 2 for j in grp) / (k - 1))
            shaped = [(x - mu) / (sd + 1e-6) for x in rows[i]]
        elif kind == "grpo-tokens":
            toks = [x for j in grp for x in rows[j]]
            mu = sum(toks) / len(toks)
            sd = math.sqrt(sum((x - mu) ** 2 for x in toks) / (len(toks) - 1))
            shaped = [(x - mu) / (sd + 1e-6) for x in rows[i]]
        elif kind == "reinforce-none":
            shaped = list(rows[i])
        elif kind == "reinforce-batch-mean":
            b = sum(means) / n
            shaped = [x - b for x in rows[i]]
        out.append(ref_pad(ref_rtg(shaped, gamma), T))
    return torch.tensor(out, dtype=D)


def ref_outcome(outcome, ids, kind):
    n = len(outcome)
    o = [float(x) for x in outcome]
    res = []
    for i in range(n):
        grp = ref_members(ids, i)
        if kind == "rloo":
            res.append(o[i] - sum(o[j] for j in grp if j != i) / (len(grp) - 1))
        elif kind == "grpo":
            mu = sum(o[j] for j in grp) / len(grp)
            sd = math.sqrt(sum((o[j] - mu) ** 2 for j in grp) / (len(grp) - 1))
            res.append((o[i] - mu) / (sd + 1e-6))
        elif kind == "reinforce-none":
            res.append(o[i])
        elif kind == "reinforce-batch-mean":
            res.append(o[i] - sum(o) / n)
    return res


def ref_broadcast(adv, mask, gamma):
    n, T = mask.shape
    out = torch.zeros(n, T, dtype=D)
    for i in range(n):
        L = int(mask[i].sum())
        for t in range(L):
            out[i, t] = adv[i] * gamma ** (L - 1 - t)
    return out


def ref_gae(rewards, values, mask, gamma, lam):
    n, T = mask.shape
    adv = torch.zeros(n, T, dtype=D)
    for i in range(n):
        L = int(mask[i].sum())
        run = 0.0
        for t in range(L - 1, -1, -1):
            nv = float(values[i, t + 1]) if t + 1 < L else 0.0
            delta = float(rewards[i, t]) + gamma * nv - float(values[i, t])
            run = delta + gamma * lam * run
            adv[i, t] = run
    ret = torch.where(mask, adv + torch.nan_to_num(values), torch.zeros_like(adv))
    return adv, ret


def ref_ppo_rewards(outcome, mask, tr, kl, kl_coef, pc, oc):
    n, T = mask.shape
    out = torch.zeros(n, T, dtype=D)
    for i in range(n):
        L = int(mask[i].sum())
        for t in range(L):
            out[i, t] = pc * float(tr[i, t]) - kl_coef * float(kl[i, t])
        out[i, L - 1] += oc * float(outcome[i])
    return out


# ---------------------------------------------------------------------------------------------
# hand-computed examples


def test_rloo_grpo_reinforce_outcome_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=D)
    g = torch.zeros(4, dtype=torch.long)
    # RLOO: 1 - (0 + 0 + 1)/3 = 2/3 ; 0 - (1 + 0 + 1)/3 = -2/3
    assert torch.allclose(rloo_outcome_advantages(r, g), torch.tensor([2, -2, -2, 2], dtype=D) / 3)
    # GRPO: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.866025
    a = grpo_outcome_advantages(r, g, eps=0.0)
    assert torch.allclose(a, torch.tensor([1, -1, -1, 1], dtype=D) * math.sqrt(3) / 2)
    assert torch.allclose(grpo_outcome_advantages(r, g, scale_by_std=False), r - 0.5)
    assert torch.equal(reinforce_outcome_advantages(r), r)
    assert torch.allclose(reinforce_outcome_advantages(r, "batch-mean"), r - 0.5)


def test_leave_one_out_needs_two_samples_per_group():
    with pytest.raises(ValueError, match=">= 2 samples"):
        rloo_outcome_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=">= 2 samples"):
        prime_rloo_process_returns(
            torch.zeros(3, 2), torch.ones(3, 2), torch.tensor([5, 6, 6]), variant="reference"
        )


def test_discounted_returns_hand():
    r = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, NAN]], dtype=D)
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # gamma 0.5: G2 = 3, G1 = 2 + 0.5*3 = 3.5, G0 = 1 + 0.5*3.5 = 2.75; row 2: 5, 4 + 2.5 = 6.5
    expected = torch.tensor([[2.75, 3.5, 3.0], [6.5, 5.0, 0.0]], dtype=D)
    assert torch.allclose(discounted_returns(r, m, 0.5), expected)
    # gamma 1: plain suffix sums
    assert torch.allclose(
        discounted_returns(r, m, 1.0), torch.tensor([[6.0, 5.0, 3.0], [9.0, 5.0, 0.0]], dtype=D)
    )


def test_gae_hand():
    r = torch.tensor([[0.0, 0.0, 1.0]], dtype=D)
    v = torch.tensor([[0.5, 0.6, 0.7]], dtype=D)
    m = torch.ones(1, 3)
    # gamma = lam = 1: A_t = (sum of future rewards) - V_t = 1 - V_t; returns = 1
    adv, ret = gae_advantages(r, v, m, 1.0, 1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.4, 0.3]], dtype=D))
    assert torch.allclose(ret, torch.ones(1, 3, dtype=D))
    # lam = 0: one-step TD errors: 0 + 0.6 - 0.5, 0 + 0.7 - 0.6, 1 + 0 - 0.7
    adv0, _ = gae_advantages(r, v, m, 1.0, 0.0)
    assert torch.allclose(adv0, torch.tensor([[0.1, 0.1, 0.3]], dtype=D))


def test_prime_rloo_process_returns_hand_both_variants():
    # one group of two: A has token rewards [1, 3] (mean 2), B has [4] (mean 4)
    tr = torch.tensor([[1.0, 3.0], [4.0, NAN]], dtype=D)
    m = torch.tensor([[1, 1], [1, 0]])
    g = torch.tensor([8, 8])
    # eq5: A's baseline = mean(B) = 4 -> shaped [-3, -1] -> returns [-4, -1];
    #      B's baseline = mean(A) = 2 -> shaped [2] -> returns [2]
    eq5 = prime_rloo_process_returns(tr, m, g, variant="eq5")
    assert torch.allclose(eq5, torch.tensor([[-4.0, -1.0], [2.0, 0.0]], dtype=D))
    # reference: K/(K-1) = 2, sum of means / (K-1) = 6: A [2-6, 6-6] -> returns [-4, 0]; B [8-6]
    ref = prime_rloo_process_returns(tr, m, g, variant="reference")
    assert torch.allclose(ref, torch.tensor([[-4.0, 0.0], [2.0, 0.0]], dtype=D))
    # relation: per token they differ by (r_t - m_i)/(K-1): A [-1, +1] -> return diff [0, 1]
    assert torch.allclose(ref - eq5, torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=D))


def test_prime_grpo_and_reinforce_process_hand():
    tr = torch.tensor([[1.0, 3.0], [4.0, NAN]], dtype=D)
    m = torch.tensor([[1, 1], [1, 0]])
    g = torch.tensor([1, 1])
    # means 2 and 4: group mean 3, unbiased std sqrt(((2-3)^2 + (4-3)^2)/1) = sqrt(2)
    # A: [(1-3), (3-3)]/sqrt(2) -> returns [-2/sqrt(2), 0]; B: [(4-3)/sqrt(2)]
    got = prime_grpo_process_returns(tr, m, g, eps=0.0)
    s2 = math.sqrt(2)
    assert torch.allclose(got, torch.tensor([[-2 / s2, 0.0], [1 / s2, 0.0]], dtype=D))
    # norm="tokens": the group's tokens 1, 3, 4 have mean 8/3 and unbiased std
    # sqrt(((1-8/3)^2 + (3-8/3)^2 + (4-8/3)^2)/2) = sqrt((25 + 1 + 16)/9/2) = sqrt(7/3)
    # A: [(1-8/3), (3-8/3)]/sd = [-5/3, 1/3]/sd -> returns [-4/3/sd, 1/3/sd]; B: [(4/3)/sd]
    sd = math.sqrt(7 / 3)
    got = prime_grpo_process_returns(tr, m, g, norm="tokens", eps=0.0)
    assert torch.allclose(got, torch.tensor([[-4 / 3 / sd, 1 / 3 / sd], [4 / 3 / sd, 0.0]],
                                            dtype=D))
    # the token std (1.53) is larger than the means' std (1.41); unscaled, only the means shift
    got = prime_grpo_process_returns(tr, m, g, norm="tokens", scale_by_std=False)
    assert torch.allclose(got, torch.tensor([[-4 / 3, 1 / 3], [4 / 3, 0.0]], dtype=D))
    with pytest.raises(ValueError, match="norm must be"):
        prime_grpo_process_returns(tr, m, g, norm="sequences")
    # REINFORCE: plain reward-to-go; batch-mean subtracts mean of (2, 4) = 3 from each token
    assert torch.allclose(
        prime_reinforce_process_returns(tr, m), torch.tensor([[4.0, 3.0], [4.0, 0.0]], dtype=D)
    )
    assert torch.allclose(
        prime_reinforce_process_returns(tr, m, baseline="batch-mean"),
        torch.tensor([[-2.0, 0.0], [1.0, 0.0]], dtype=D),
    )


def test_broadcast_outcome_discounts_from_last_token():
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    got = broadcast_outcome_advantages(torch.tensor([2.0, -1.0], dtype=D), m, gamma=0.5)
    # row 1: 2 * 0.5^2, 2 * 0.5, 2; row 2: -1 on its only token
    assert torch.allclose(got, torch.tensor([[0.5, 1.0, 2.0], [-1.0, 0.0, 0.0]], dtype=D))


def test_eq5_outcome_term_undiscounted_by_default_and_discounted_option_hand():
    # One group of two, gamma = 0.5. A: 3 tokens r = [0.2, 0.4, 0.0] (mean 0.2), outcome 1;
    # B: 2 tokens r = [0.6, 0.2] (mean 0.4), outcome 0.
    tr = torch.tensor([[0.2, 0.4, 0.0], [0.6, 0.2, NAN]], dtype=D)
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    kw = dict(
        outcome_rewards=torch.tensor([1.0, 0.0], dtype=D),
        response_mask=m,
        group_ids=torch.tensor([4, 4]),
        token_rewards=tr,
        gamma=0.5,
    )
    # Process term (Eq. 5, leave-one-out): A's baseline = mean(B) = 0.4 -> shaped [-0.2, 0, -0.4]
    #   returns: t2 = -0.4, t1 = 0 + 0.5 * -0.4 = -0.2, t0 = -0.2 + 0.5 * -0.2 = -0.3;
    # B's baseline = mean(A) = 0.2 -> shaped [0.4, 0] -> returns t1 = 0, t0 = 0.4.
    # Outcome term: A 1 - 0 = 1, B 0 - 1 = -1.
    # Eq. 5 as printed (default): outcome added undiscounted at every token:
    #   A [-0.3 + 1, -0.2 + 1, -0.4 + 1] = [0.7, 0.8, 0.6]; B [0.4 - 1, 0 - 1] = [-0.6, -1]
    adv, _, _ = compute_advantages(rloo_advantages(**kw), response_mask=m)
    assert torch.allclose(adv, torch.tensor([[0.7, 0.8, 0.6], [-0.6, -1.0, 0.0]], dtype=D))
    # discount_outcome=True (reference code): outcome times 0.5^(L-1-t):
    #   A outcome [0.25, 0.5, 1] -> [-0.05, 0.3, 0.6]; B [-0.5, -1] -> [-0.1, -1.0]
    adv_d, _, _ = compute_advantages(rloo_advantages(**kw, discount_outcome=True), response_mask=m)
    assert torch.allclose(adv_d, torch.tensor([[-0.05, 0.3, 0.6], [-0.1, -1.0, 0.0]], dtype=D))


@pytest.mark.parametrize("seed", SEEDS)
def test_discounted_outcome_is_the_last_token_reward_inside_the_return(seed):
    # The reference code's form: the outcome advantage is a reward on the last valid token, summed
    # into the same discounted reward-to-go as the baselined process rewards.
    tr, mask, ids, outcome, *_ = random_batch(seed)
    gamma = 0.8
    parts = rloo_advantages(
        outcome_rewards=outcome,
        response_mask=mask,
        group_ids=ids,
        token_rewards=tr,
        gamma=gamma,
        discount_outcome=True,
    )
    adv, _, _ = compute_advantages(parts, response_mask=mask)
    r_out = ppo_token_rewards(rloo_outcome_advantages(outcome, ids), mask)  # A_out on last token
    expected = prime_rloo_process_returns(tr, mask, ids, gamma) + discounted_returns(
        r_out, mask, gamma
    )
    assert torch.allclose(adv, expected, atol=1e-12)
    # with gamma = 1 both forms coincide
    kw = dict(outcome_rewards=outcome, response_mask=mask, group_ids=ids, token_rewards=tr)
    for est in (rloo_advantages, ESTIMATORS["grpo"].fn):
        a, _, _ = compute_advantages(est(**kw, discount_outcome=True), response_mask=mask)
        b, _, _ = compute_advantages(est(**kw, discount_outcome=False), response_mask=mask)
        assert torch.equal(a, b)


def test_ppo_token_rewards_hand():
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    tr = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, NAN]], dtype=D)
    kl = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, NAN]], dtype=D)
    got = ppo_token_rewards(torch.tensor([1.0, 0.0], dtype=D), m, tr, kl, 0.1, 1.0, 5.0)
    # process + (-0.1 * kl) + 5 * outcome on the last valid token
    expected = torch.tensor([[0.0, 0.1, 5.2], [0.2, 0.3, 0.0]], dtype=D)
    assert torch.allclose(got, expected)


def test_implicit_value_advantages_hand():
    tr = torch.tensor([[0.1, 0.2, -0.1]], dtype=D)
    m = torch.ones(1, 3)
    r_o = torch.tensor([1.0], dtype=D)
    # V_t = sum_{s<t} r_s = [0, 0.1, 0.3]; gamma = lam = 1: A_t = r_o - V_t = [1, 0.9, 0.7]
    assert torch.allclose(implicit_values(tr, m), torch.tensor([[0.0, 0.1, 0.3]], dtype=D))
    parts = implicit_value_advantages(outcome_rewards=r_o, token_rewards=tr, response_mask=m)
    assert torch.allclose(parts.outcome, torch.tensor([[1.0, 0.9, 0.7]], dtype=D))
    assert parts.process is None and parts.values is None and parts.kl_discount == 1.0
    # lam = 0: A_t = V_{t+1} - V_t = r_t for t < last, and r_o - V_last = 0.7 at the last token
    adv0 = implicit_value_advantages(
        outcome_rewards=r_o, token_rewards=tr, response_mask=m, lam=0.0
    ).outcome
    assert torch.allclose(adv0, torch.tensor([[0.1, 0.2, 0.7]], dtype=D))
    # value_transform="sigmoid": V = sigmoid([0, 0.1, 0.3]); gamma = lam = 1: A_t = r_o - V_t
    sig = implicit_value_advantages(
        outcome_rewards=r_o, token_rewards=tr, response_mask=m, value_transform="sigmoid"
    ).outcome
    expected = 1.0 - torch.sigmoid(torch.tensor([[0.0, 0.1, 0.3]], dtype=D))
    assert torch.allclose(sig, expected)
    # inclusive indexing shifts the baseline by the token's own reward: V = [0.1, 0.3, 0.2]
    vi = implicit_values(tr, m, include_current_token=True)
    assert torch.allclose(vi, torch.tensor([[0.1, 0.3, 0.2]], dtype=D))
    vs = implicit_values(tr, m, transform="sigmoid")
    assert vs[0, 0].item() == pytest.approx(0.5)


def test_normalize_by_max_abs_return_hand():
    tr = torch.tensor([[1.0, -3.0], [0.5, NAN]], dtype=D)
    m = torch.tensor([[1, 1], [1, 0]])
    # reward-to-go: row 1 [-2, -3], row 2 [0.5]: max |.| = 3
    got = normalize_by_max_abs_return(tr, m, eps=0.0)
    assert torch.allclose(got, torch.tensor([[1 / 3, -1.0], [0.5 / 3, 0.0]], dtype=D))


# ---------------------------------------------------------------------------------------------
# loop-reference vs vectorised, ragged lengths, non-contiguous groups


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_process_terms_match_loop(seed, gamma):
    tr, mask, ids, *_ = random_batch(seed)
    cases = {
        "eq5": prime_rloo_process_returns(tr, mask, ids, gamma, "eq5"),
        "reference": prime_rloo_process_returns(tr, mask, ids, gamma, "reference"),
        "grpo": prime_grpo_process_returns(tr, mask, ids, gamma),
        "grpo-tokens": prime_grpo_process_returns(tr, mask, ids, gamma, norm="tokens"),
        "reinforce-none": prime_reinforce_process_returns(tr, mask, gamma),
        "reinforce-batch-mean": prime_reinforce_process_returns(
            tr, mask, gamma, baseline="batch-mean"
        ),
    }
    for kind, got in cases.items():
        assert torch.allclose(got, ref_process(tr, mask, ids, gamma, kind), atol=1e-10), kind


@pytest.mark.parametrize("seed", SEEDS)
def test_outcome_estimators_match_loop(seed):
    _, _, ids, outcome, *_ = random_batch(seed)
    got = {
        "rloo": rloo_outcome_advantages(outcome, ids),
        "grpo": grpo_outcome_advantages(outcome, ids),
        "reinforce-none": reinforce_outcome_advantages(outcome),
        "reinforce-batch-mean": reinforce_outcome_advantages(outcome, "batch-mean"),
    }
    for kind, a in got.items():
        assert torch.allclose(a, torch.tensor(ref_outcome(outcome, ids, kind), dtype=D)), kind


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (0.99, 0.0)])
def test_gae_and_returns_match_loop(seed, gamma, lam):
    tr, mask, _, _, values, _ = random_batch(seed)
    adv, ret = gae_advantages(tr, values, mask, gamma, lam)
    adv_ref, ret_ref = ref_gae(tr, values, mask, gamma, lam)
    assert torch.allclose(adv, adv_ref, atol=1e-10)
    assert torch.allclose(ret, ret_ref, atol=1e-10)
    rtg = torch.tensor(
        [ref_pad(ref_rtg(ref_valid(tr[i], mask[i]), gamma), 9) for i in range(len(tr))]
    )
    assert torch.allclose(discounted_returns(tr, mask, gamma), rtg.to(D), atol=1e-10)


def loop_compute(
    estimator, tr, mask, ids, outcome, values, kl, gamma, lam, pc, oc, kl_coef, discount_outcome
):
    """ESTIMATORS + compute_advantages rebuilt from the loop references."""
    if estimator == "ppo":
        rewards = ref_ppo_rewards(outcome, mask, tr, kl, kl_coef, pc, oc)
        return ref_gae(rewards, values, mask, gamma, lam)
    if estimator == "prime-value":
        r = torch.nan_to_num(tr)
        v = torch.zeros_like(r)
        for i in range(len(r)):
            L = int(mask[i].sum())
            for t in range(1, L):
                v[i, t] = v[i, t - 1] + r[i, t - 1]
        rewards = ref_ppo_rewards(outcome, mask, torch.zeros_like(r), kl, 0.0, 0.0, oc)
        adv, _ = ref_gae(rewards, oc * v, mask, gamma, lam)
    else:
        kind = {"rloo": ("rloo", "eq5"), "grpo": ("grpo", "grpo")}.get(
            estimator, ("reinforce-batch-mean", "reinforce-batch-mean")
        )
        out = ref_broadcast(
            ref_outcome(outcome, ids, kind[0]), mask, gamma if discount_outcome else 1.0
        )
        adv = oc * out + pc * ref_process(tr, mask, ids, gamma, kind[1])
    kl_rtg = torch.tensor(
        [ref_pad(ref_rtg(ref_valid(kl[i], mask[i]), gamma), mask.shape[1]) for i in range(len(kl))],
        dtype=D,
    )
    return adv - kl_coef * kl_rtg, None


def test_estimator_registry():
    assert set(ESTIMATORS) == {"rloo", "grpo", "reinforce", "ppo", "prime-value"}
    assert ESTIMATORS["rloo"].fn is rloo_advantages and ESTIMATORS["ppo"].fn is ppo_advantages
    # What the trainer reads off an entry instead of branching on names.
    assert [n for n, e in ESTIMATORS.items() if e.critic] == ["ppo"]
    assert {n for n, e in ESTIMATORS.items() if e.min_samples == 2} == {"rloo", "grpo"}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("estimator", "discount_outcome"),
    [
        (e, d)
        for e in sorted(ESTIMATORS)
        for d in (True, False)
        if d or e in {"rloo", "grpo", "reinforce"}
    ],
)
def test_compute_advantages_matches_loop(seed, estimator, discount_outcome):
    tr, mask, ids, outcome, values, kl = random_batch(seed)
    gamma, lam, pc, oc, kl_coef = 0.95, 0.9, 0.7, 2.0, 0.05
    options = {}
    if estimator in {"rloo", "grpo", "reinforce"}:
        options["discount_outcome"] = discount_outcome
    adv, ret, metrics = run_estimator(
        estimator,
        tr,
        mask,
        ids,
        outcome,
        values,
        gamma,
        lam,
        options,
        process_coef=pc,
        outcome_coef=oc,
        kl=kl,
        kl_coef=kl_coef,
    )
    adv_ref, ret_ref = loop_compute(
        estimator, tr, mask, ids, outcome, values, kl, gamma, lam, pc, oc, kl_coef, discount_outcome
    )
    assert torch.allclose(adv, adv_ref, atol=1e-9)
    if estimator == "ppo":
        assert torch.allclose(ret, ret_ref, atol=1e-9)
    else:
        assert ret is None
    assert set(metrics) == {"adv/mean", "adv/std", "adv/process_abs_mean", "adv/outcome_abs_mean"}
    for v in metrics.values():  # detached 0-dim tensors: the trainer reduces them once per step
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad
        assert math.isfinite(float(v))


@pytest.mark.parametrize("seed", SEEDS)
def test_compute_advantages_rloo_reference_variant_and_whiten(seed):
    tr, mask, ids, outcome, *_ = random_batch(seed)
    adv, _, metrics = run_estimator(
        "rloo",
        tr,
        mask,
        ids,
        outcome,
        None,
        options={"variant": "reference"},
        process_coef=5.0,
        outcome_coef=5.0,
        whiten=True,
    )
    raw = 5 * ref_broadcast(ref_outcome(outcome, ids, "rloo"), mask, 1.0) + 5 * ref_process(
        tr, mask, ids, 1.0, "reference"
    )
    v = raw[mask]
    expected = torch.where(
        mask, (raw - v.mean()) / torch.sqrt(v.var() + 1e-8), torch.zeros_like(raw)
    )
    assert torch.allclose(adv, expected, atol=1e-9)
    assert float(metrics["adv/mean"]) == pytest.approx(0.0, abs=1e-9)
    assert float(metrics["adv/std"]) == pytest.approx(1.0, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# invariants


@pytest.mark.parametrize("seed", SEEDS)
def test_prm_equal_to_reference_gives_zero_process_advantage(seed):
    _, mask, ids, outcome, values, _ = random_batch(seed)
    lp = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=D)
    tr = implicit_token_rewards(lp, lp.clone(), mask, beta=0.05)
    for variant in ("eq5", "reference"):
        assert torch.equal(
            prime_rloo_process_returns(tr, mask, ids, variant=variant), torch.zeros_like(tr)
        )
    assert torch.equal(prime_grpo_process_returns(tr, mask, ids), torch.zeros_like(tr))
    assert torch.equal(prime_grpo_process_returns(tr, mask, ids, norm="tokens"),
                       torch.zeros_like(tr))
    for est in sorted(ESTIMATORS):
        with_prm, _, metrics = run_estimator(est, tr, mask, ids, outcome, values)
        assert float(metrics["adv/process_abs_mean"]) == 0.0, est
        if est != "prime-value":  # there the PRM is the value model, not a reward
            outcome_only, _, _ = run_estimator(est, None, mask, ids, outcome, values)
            assert torch.equal(with_prm, outcome_only), est


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_process_term_invariant_to_per_group_token_shift(seed):
    # Adding the same constant delta_g to every valid token of every sample in group g (any
    # lengths) shifts each token mean by delta_g and the baseline by delta_g: Eq. 5 is unchanged
    # at every token; so is the reference variant (delta*K/(K-1) - K*delta/(K-1) = 0).
    tr, mask, ids, *_ = random_batch(seed)
    shift = {int(g): 0.37 * (k + 1) for k, g in enumerate(ids.unique())}
    delta = torch.tensor([shift[int(g)] for g in ids], dtype=D)[:, None]
    for variant in ("eq5", "reference"):
        before = prime_rloo_process_returns(tr, mask, ids, 0.9, variant)
        after = prime_rloo_process_returns(tr + delta, mask, ids, 0.9, variant)
        assert torch.allclose(before, after, atol=1e-10), variant


def test_rloo_process_term_and_sequence_offset():
    # A per-prompt offset c on the summed implicit reward (PRIME App. C.2: CE is only determined
    # up to such a c) placed on ONE token of each sample:
    #   equal lengths -> the first-token return (whole-sequence term) is unchanged, later tokens
    #   move; unequal lengths -> even the first-token return changes, because the Eq. 5 baseline
    #   averages per-token means, and c/L_j differs across samples.
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([0, 1, 0, 1, 0, 1])
    tr = torch.randn(6, 5, generator=g, dtype=D)
    c = torch.tensor([1.5, -2.0, 1.5, -2.0, 1.5, -2.0], dtype=D)
    bumped = tr.clone()
    bumped[:, 2] += c
    full = torch.ones(6, 5, dtype=torch.bool)
    before = prime_rloo_process_returns(tr, full, ids)
    after = prime_rloo_process_returns(bumped, full, ids)
    assert torch.allclose(before[:, 0], after[:, 0], atol=1e-12)
    # token 3 (after the bump): the return loses (L - t) * c / L = 2 * c / 5
    assert torch.allclose(after[:, 3] - before[:, 3], -2 * c / 5, atol=1e-12)
    ragged = torch.arange(5)[None, :] < torch.tensor([5, 5, 3, 4, 4, 3])[:, None]
    b2 = prime_rloo_process_returns(tr, ragged, ids)
    a2 = prime_rloo_process_returns(bumped, ragged, ids)
    assert not torch.allclose(b2[:, 0], a2[:, 0], atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_variants_agree_on_first_token_with_gamma_one(seed):
    tr, mask, ids, *_ = random_batch(seed)
    eq5 = prime_rloo_process_returns(tr, mask, ids, variant="eq5")
    ref = prime_rloo_process_returns(tr, mask, ids, variant="reference")
    assert torch.allclose(eq5[:, 0], ref[:, 0], atol=1e-10)
    # and per token they differ by the reward-to-go of (r_t - m_i) / (K - 1)
    k = torch.tensor([int((ids == g).sum()) for g in ids], dtype=D)[:, None]
    m = torch.tensor(
        [sum(ref_valid(tr[i], mask[i])) / int(mask[i].sum()) for i in range(len(tr))], dtype=D
    )
    diff = discounted_returns((torch.nan_to_num(tr) - m[:, None]) / (k - 1), mask, 1.0)
    assert torch.allclose(ref - eq5, diff, atol=1e-10)


def test_ppo_parts_decompose_and_returns_are_adv_plus_values():
    tr, mask, ids, outcome, values, _ = random_batch(7)
    adv, ret, metrics = run_estimator("ppo", tr, mask, ids, outcome, values, gamma=1.0, lam=0.95)
    assert torch.allclose(ret, torch.where(mask, adv + values, torch.zeros_like(adv)))
    proc, _ = gae_advantages(torch.nan_to_num(tr), torch.zeros_like(tr), mask, 1.0, 0.95)
    assert float(metrics["adv/process_abs_mean"]) == pytest.approx(proc[mask].abs().mean().item())
    # the parts add up to the one-shot GAE on the summed rewards (GAE is linear)
    parts = ppo_advantages(
        outcome_rewards=outcome, response_mask=mask, values=values, token_rewards=tr, lam=0.95
    )
    one_shot, _ = gae_advantages(ppo_token_rewards(outcome, mask, tr), values, mask, 1.0, 0.95)
    summed = parts.outcome + parts.process + parts.baseline
    assert torch.allclose(summed, one_shot, atol=1e-12)
    assert parts.kl_discount == 0.95


def test_estimator_errors():
    m = torch.ones(2, 3)
    o, g = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="values"):
        ppo_advantages(outcome_rewards=o, response_mask=m, values=None)
    with pytest.raises(ValueError, match="token_rewards"):
        implicit_value_advantages(outcome_rewards=o, response_mask=m, token_rewards=None)
    with pytest.raises(ValueError, match="variant"):
        rloo_advantages(
            outcome_rewards=o,
            response_mask=m,
            group_ids=g,
            token_rewards=torch.zeros(2, 3),
            variant="eq6",
        )
    with pytest.raises(ValueError, match="baseline"):
        ESTIMATORS["reinforce"].fn(outcome_rewards=o, response_mask=m, baseline="ema")
    with pytest.raises(ValueError, match="transform"):
        ESTIMATORS["prime-value"].fn(
            outcome_rewards=o,
            response_mask=m,
            token_rewards=torch.zeros(2, 3),
            value_transform="tanh",
        )
    with pytest.raises(ValueError, match="gamma"):
        rloo_advantages(outcome_rewards=o, response_mask=m, group_ids=g, gamma=1.5)
    with pytest.raises(ValueError, match="response_mask"):
        compute_advantages(AdvantageParts(torch.zeros(2, 3)), response_mask=torch.ones(2, 4))
