"""Advantage estimators: outcome baselines, PRIME process-reward terms, GAE, and their combination.

Notation: B prompts, K samples per prompt, N = B*K sequences, T response tokens (right-padded),
`response_mask` [N, T], `group_ids` [N] (samples of one prompt share an id; groups may be
interleaved and of unequal size). `token_rewards` [N, T] are implicit process rewards r_phi(y_t)
(PRIME Eq. 3); `outcome_rewards` [N] are verifier outcomes r_o(y) in [0, 1].

PRIME Eq. 5 (RLOO), for sample i of its group G (|G| = K):
    A_t^i = sum_{s>=t} gamma^(s-t) * (r_phi(y_s^i) - mean_{j!=i} mean_tokens(r_phi(y^j)))
            + (r_o(y^i) - mean_{j!=i} r_o(y^j))
Process and outcome terms are baselined separately, then added (with coefficients).
See docs/algorithms.md for every estimator's formula and the choices the papers leave open.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from primekit.algorithms.groups import (
    group_counts,
    group_mean,
    group_std,
    group_sum,
    leave_one_out_mean,
)
from primekit.algorithms.masked import masked_mean, masked_whiten

__all__ = [
    "ESTIMATORS",
    "broadcast_outcome_advantages",
    "compute_advantages",
    "discounted_returns",
    "gae_advantages",
    "grpo_outcome_advantages",
    "implicit_value_advantages",
    "implicit_values",
    "normalize_by_max_abs_return",
    "ppo_token_rewards",
    "prime_grpo_process_returns",
    "prime_reinforce_process_returns",
    "prime_rloo_process_returns",
    "reinforce_outcome_advantages",
    "rloo_outcome_advantages",
]


# ---------------------------------------------------------------------------------------------
# helpers


def _mask(response_mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.dim() != 2:
        raise ValueError(f"expected a [N, T] tensor, got shape {tuple(like.shape)}")
    if response_mask.shape != like.shape:
        raise ValueError(
            f"response_mask has shape {tuple(response_mask.shape)}, expected {tuple(like.shape)}"
        )
    return response_mask.bool()


def _zero_off(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros_like(x))


def _check_gamma(gamma: float, name: str = "gamma") -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {gamma}")


def _last_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last valid token per row, -1 for an empty row. [N, T] -> [N] long."""
    t = mask.shape[1]
    pos = torch.arange(t, device=mask.device).expand_as(mask)
    return torch.where(mask, pos, torch.full_like(pos, -1)).amax(dim=1)


def _seq_token_mean(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(token_rewards, mask, dim=-1)  # [N]; 0 for an empty row


# ---------------------------------------------------------------------------------------------
# outcome estimators ([N] -> [N])


def rloo_outcome_advantages(outcome_rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO outcome advantage (Ahmadian et al. 2024; PRIME Eq. 4 / second term of Eq. 5).

    Formula: A^i = r_o(y^i) - mean_{j in g(i), j != i} r_o(y^j). Every group needs >= 2 samples.
    Args: outcome_rewards [N], group_ids [N]. Returns: [N].
    """
    return outcome_rewards - leave_one_out_mean(outcome_rewards, group_ids)


def grpo_outcome_advantages(
    outcome_rewards: torch.Tensor,
    group_ids: torch.Tensor,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO outcome advantage (Shao et al. 2024, outcome supervision).

    Formula: A^i = (r_o^i - mean_g r_o) / (std_g r_o + eps), std unbiased (n-1) over the group,
    as torch.std and the public GRPO code; scale_by_std=False keeps only the mean shift.
    Args: outcome_rewards [N], group_ids [N]. Returns: [N].
    """
    centred = outcome_rewards - group_mean(outcome_rewards, group_ids)
    if not scale_by_std:
        return centred
    return centred / (group_std(outcome_rewards, group_ids) + eps)


def reinforce_outcome_advantages(
    outcome_rewards: torch.Tensor, baseline: str = "none"
) -> torch.Tensor:
    """REINFORCE outcome advantage (Williams 1992).

    Formula: A^i = r_o^i ("none", PRIME App. B.3) or r_o^i - mean_batch r_o ("batch-mean").
    Args: outcome_rewards [N]. Returns: [N].
    """
    if baseline == "none":
        return outcome_rewards.clone()
    if baseline == "batch-mean":
        return outcome_rewards - outcome_rewards.mean()
    raise ValueError(f"baseline must be 'none' or 'batch-mean', got {baseline!r}")


def broadcast_outcome_advantages(
    advantages: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """Spread a per-sequence outcome advantage over its valid tokens.

    Formula: A_t^i = gamma^(L_i - t) * A^i for valid t, L_i = index of the last valid token (the
    outcome is a reward on that token, so its reward-to-go at t is discounted by the distance).
    Args: advantages [N], response_mask [N, T]. Returns: [N, T].
    """
    _check_gamma(gamma)
    mask = response_mask.bool()
    if advantages.shape != (mask.shape[0],):
        raise ValueError(f"advantages must be [{mask.shape[0]}], got {tuple(advantages.shape)}")
    out = advantages[:, None].expand(mask.shape).to(torch.result_type(advantages, 1.0))
    if gamma != 1.0:
        pos = torch.arange(mask.shape[1], device=mask.device)[None, :]  # [1, T]
        dist = (_last_index(mask)[:, None] - pos).clamp_min(0)  # [N, T]
        out = out * gamma ** dist.to(out.dtype)
    return _zero_off(out, mask)


# ---------------------------------------------------------------------------------------------
# token-level returns


def discounted_returns(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Reward-to-go over the valid tokens.

    Formula: G_t = sum_{s>=t, s valid} gamma^(s-t) r_s; 0 off the mask. gamma = 1 uses a reversed
    cumulative sum; otherwise a backward scan over T (discount counts positions, so responses must
    be right-padded, i.e. without holes, for gamma < 1 to mean "per token").
    Args: token_rewards [N, T], response_mask [N, T], gamma in [0, 1]. Returns: [N, T].
    """
    _check_gamma(gamma)
    mask = _mask(response_mask, token_rewards)
    r = _zero_off(token_rewards, mask)
    if gamma == 1.0:
        out = r.flip(-1).cumsum(-1).flip(-1)  # [N, T]
    else:
        out = torch.zeros_like(r)
        running = torch.zeros_like(r[:, 0])  # [N]
        for t in range(r.shape[1] - 1, -1, -1):
            running = r[:, t] + gamma * running
            out[:, t] = running
    return _zero_off(out, mask)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016).

    Formula: delta_t = r_t + gamma * V_{t+1} - V_t, A_t = sum_{l>=0} (gamma*lam)^l delta_{t+l},
    returns_t = A_t + V_t. V after the last valid token is 0 (the episode ends there). Rewards and
    values off the mask are ignored; responses must be right-padded.
    Args:
        token_rewards: [N, T] (e.g. from `ppo_token_rewards`).
        values: [N, T], V_t = value of the state before emitting token t.
        response_mask: [N, T].
        gamma, lam: in [0, 1].
    Returns:
        (advantages [N, T], returns [N, T]), 0 off the mask.
    """
    _check_gamma(gamma)
    _check_gamma(lam, "lam")
    mask = _mask(response_mask, token_rewards)
    if values.shape != token_rewards.shape:
        raise ValueError(f"values {tuple(values.shape)} must match {tuple(token_rewards.shape)}")
    r = _zero_off(token_rewards, mask)
    v = _zero_off(values, mask)
    adv = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])  # [N]
    next_v = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        delta = r[:, t] + gamma * next_v - v[:, t]
        running = delta + gamma * lam * running
        adv[:, t] = running
        next_v = v[:, t]
    adv = _zero_off(adv, mask)
    return adv, _zero_off(adv + v, mask)


# ---------------------------------------------------------------------------------------------
# PRIME process-reward terms ([N, T] -> [N, T] returns)


def prime_rloo_process_returns(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    gamma: float = 1.0,
    variant: str = "eq5",
) -> torch.Tensor:
    """PRIME process-reward term with a leave-one-out baseline (first term of PRIME Eq. 5).

    With m_j = mean over sample j's valid tokens of r_phi and K_i = |g(i)|:
      "eq5" (the paper):  r'_t = r_t - mean_{j in g(i), j != i} m_j
      "reference" (public PRIME code): r'_t = r_t * K/(K-1) - sum_{j in g(i)} m_j / (K-1)
    then G_t = sum_{s>=t} gamma^(s-t) r'_s. The two differ by (r_t - m_i)/(K-1) per token, so
    with gamma = 1 they agree at the first token of every response (that difference sums to 0).
    Every group needs >= 2 samples.

    Args:
        token_rewards: [N, T] implicit process rewards.
        response_mask: [N, T].
        group_ids: [N].
        gamma: discount.
        variant: "eq5" or "reference".
    Returns:
        Process returns [N, T].
    """
    mask = _mask(response_mask, token_rewards)
    m = _seq_token_mean(token_rewards, mask)  # [N]
    if variant == "eq5":
        shaped = token_rewards - leave_one_out_mean(m, group_ids)[:, None]  # [N, T]
    elif variant == "reference":
        k = group_counts(m, group_ids)
        if int(k.min()) < 2:
            raise ValueError("the 'reference' RLOO variant needs every group to have >= 2 samples")
        k = k[:, None]  # [N, 1]
        shaped = token_rewards * k / (k - 1) - group_sum(m, group_ids)[:, None] / (k - 1)
    else:
        raise ValueError(f"variant must be 'eq5' or 'reference', got {variant!r}")
    return discounted_returns(shaped, mask, gamma)


def prime_grpo_process_returns(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    gamma: float = 1.0,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """PRIME process term for GRPO (our reading of PRIME App. B.3).

    Formula: with m_j = mean over sample j's valid tokens of r_phi, over i's group g:
      r'_t = (r_t - mean_{j in g} m_j) / (std_{j in g} m_j + eps),  G_t = sum_{s>=t} gamma^(s-t) r'_s
    (group statistics of the response-averaged process rewards, including i itself; std unbiased).
    Ambiguous in the paper: whether std is of the K response means or of all tokens of the group,
    and whether the normalised per-token reward or its return is normalised; see docs/algorithms.md.

    Args: token_rewards [N, T], response_mask [N, T], group_ids [N], gamma.
    Returns: process returns [N, T].
    """
    mask = _mask(response_mask, token_rewards)
    m = _seq_token_mean(token_rewards, mask)  # [N]
    shaped = token_rewards - group_mean(m, group_ids)[:, None]
    if scale_by_std:
        shaped = shaped / (group_std(m, group_ids)[:, None] + eps)
    return discounted_returns(shaped, mask, gamma)


def prime_reinforce_process_returns(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    *,
    baseline: str = "none",
) -> torch.Tensor:
    """PRIME process term for REINFORCE (PRIME App. B.3).

    Formula: G_t = sum_{s>=t} gamma^(s-t) (r_s - b), b = 0 ("none", the paper's REINFORCE) or the
    batch mean over sequences of the response-averaged process reward ("batch-mean", our option,
    mirroring `reinforce_outcome_advantages`).
    Args: token_rewards [N, T], response_mask [N, T], gamma. Returns: [N, T].
    """
    mask = _mask(response_mask, token_rewards)
    if baseline == "none":
        shaped = token_rewards
    elif baseline == "batch-mean":
        shaped = token_rewards - _seq_token_mean(token_rewards, mask).mean()
    else:
        raise ValueError(f"baseline must be 'none' or 'batch-mean', got {baseline!r}")
    return discounted_returns(shaped, mask, gamma)


def normalize_by_max_abs_return(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """Reference-code option ("prime_norm: batch_norm"): scale process rewards batch-wide.

    Formula: r'_t = r_t / (max_{i,t valid} |sum_{s>=t} r^i_s| + eps).
    Args: token_rewards [N, T], response_mask [N, T]. Returns: [N, T].
    """
    mask = _mask(response_mask, token_rewards)
    rtg = discounted_returns(token_rewards, mask, 1.0)
    scale = rtg.abs().max() if rtg.numel() else torch.zeros((), dtype=rtg.dtype)
    return _zero_off(token_rewards / (scale + eps), mask)


def ppo_token_rewards(
    outcome_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    process_coef: float = 1.0,
    outcome_coef: float = 1.0,
) -> torch.Tensor:
    """Per-token rewards fed to GAE for PPO with a critic (PRIME App. B.3; Gao et al. Eq. 2).

    Formula: R_t = outcome_coef * r_o * [t = last valid token] + process_coef * r_phi(y_t)
                   - kl_coef * kl_t, 0 off the mask. A row with no valid token gets nothing.
    Args:
        outcome_rewards: [N].
        response_mask: [N, T].
        token_rewards: [N, T] dense process rewards, or None.
        kl: [N, T] per-token KL estimate (see `policy_loss.kl_penalty`), or None.
        kl_coef, process_coef, outcome_coef: weights (Gao et al.: 0.1, 1, 5).
    Returns:
        [N, T] rewards.
    """
    mask = response_mask.bool()
    n, t = mask.shape
    if outcome_rewards.shape != (n,):
        raise ValueError(f"outcome_rewards must be [{n}], got {tuple(outcome_rewards.shape)}")
    dtype = torch.result_type(outcome_rewards, 1.0)
    out = torch.zeros(n, t, dtype=dtype, device=mask.device)  # [N, T]
    last = _last_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = outcome_coef * outcome_rewards[rows].to(dtype)
    if token_rewards is not None:
        _mask(mask, token_rewards)
        out = out + process_coef * _zero_off(token_rewards, mask)
    if kl is not None and kl_coef != 0.0:
        _mask(mask, kl)
        out = out - kl_coef * _zero_off(kl, mask)
    return _zero_off(out, mask)


def implicit_values(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    transform: str = "none",
    include_current_token: bool = False,
) -> torch.Tensor:
    """State values from the implicit PRM (PRIME Sec. 5.4 "implicit PRM as value model").

    The implicit PRM's Q after token t is q_t = sum_{s<=t} r_phi(y_s) (Yuan et al. 2024, PRIME
    Sec. 3.1). Our value of the state before token t is V_t = q_{t-1} = sum_{s<t} r_phi(y_s)
    (V_0 = 0): it does not depend on the action y_t, so it is a valid baseline.
    include_current_token=True uses q_t instead (the digest's "v(y_<t+1)" indexing). transform:
    "none" keeps the logit scale the CE loss trains (sigmoid(q_T) ~ P(correct)); "sigmoid" maps to
    a probability, i.e. the outcome's own [0, 1] scale.
    Args: token_rewards [N, T], response_mask [N, T]. Returns: values [N, T], 0 off the mask.
    """
    mask = _mask(response_mask, token_rewards)
    r = _zero_off(token_rewards, mask)
    q = r.cumsum(-1)  # [N, T], inclusive
    v = q if include_current_token else q - r
    if transform == "sigmoid":
        v = torch.sigmoid(v)
    elif transform != "none":
        raise ValueError(f"transform must be 'none' or 'sigmoid', got {transform!r}")
    return _zero_off(v, mask)


def implicit_value_advantages(
    outcome_rewards: torch.Tensor,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    *,
    outcome_coef: float = 1.0,
    transform: str = "none",
    include_current_token: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages with the implicit PRM as the value model (PRIME Sec. 5.4 ablation).

    Formula: GAE(gamma, lam) on rewards R_t = outcome_coef * r_o at the last token, values
    V_t = outcome_coef * implicit_values(...). With gamma = lam = 1: A_t = outcome_coef *
    (r_o - V_t), the outcome reward baselined by the PRM's running estimate; with lam = 0,
    A_t = V_{t+1} - V_t, which for transform="none" is the process reward itself.
    Returns: (advantages [N, T], values [N, T]).
    """
    values = outcome_coef * implicit_values(
        token_rewards,
        response_mask,
        transform=transform,
        include_current_token=include_current_token,
    )
    rewards = ppo_token_rewards(outcome_rewards, response_mask, outcome_coef=outcome_coef)
    adv, _ = gae_advantages(rewards, values, response_mask, gamma, lam)
    return adv, values


# ---------------------------------------------------------------------------------------------
# combination used by the trainer

# Each estimator returns (outcome part [N, T], process part [N, T] | None, returns | None) with
# the coefficients already applied; `compute_advantages` adds the parts.
_Parts = tuple[torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"]


def _rloo(a: dict) -> _Parts:
    out = broadcast_outcome_advantages(
        rloo_outcome_advantages(a["outcome_rewards"], a["group_ids"]),
        a["response_mask"],
        a["gamma"],
    )
    proc = None
    if a["token_rewards"] is not None:
        proc = prime_rloo_process_returns(
            a["token_rewards"], a["response_mask"], a["group_ids"], a["gamma"], a["rloo_variant"]
        )
    return _scale(a, out, proc) + (None,)


def _grpo(a: dict) -> _Parts:
    s, e = a["grpo_scale_by_std"], a["grpo_eps"]
    adv = grpo_outcome_advantages(a["outcome_rewards"], a["group_ids"], scale_by_std=s, eps=e)
    out = broadcast_outcome_advantages(adv, a["response_mask"], a["gamma"])
    proc = None
    if a["token_rewards"] is not None:
        proc = prime_grpo_process_returns(
            a["token_rewards"],
            a["response_mask"],
            a["group_ids"],
            a["gamma"],
            scale_by_std=s,
            eps=e,
        )
    return _scale(a, out, proc) + (None,)


def _reinforce(a: dict) -> _Parts:
    adv = reinforce_outcome_advantages(a["outcome_rewards"], a["reinforce_baseline"])
    out = broadcast_outcome_advantages(adv, a["response_mask"], a["gamma"])
    proc = None
    if a["token_rewards"] is not None:
        proc = prime_reinforce_process_returns(
            a["token_rewards"], a["response_mask"], a["gamma"], baseline=a["reinforce_baseline"]
        )
    return _scale(a, out, proc) + (None,)


def _ppo(a: dict) -> _Parts:
    if a["values"] is None:
        raise ValueError("estimator 'ppo' needs `values` [N, T] from the critic")
    mask, gamma, lam = a["response_mask"], a["gamma"], a["lam"]
    rewards = ppo_token_rewards(
        a["outcome_rewards"],
        mask,
        a["token_rewards"],
        a["kl"],
        a["kl_coef"],
        a["process_coef"],
        a["outcome_coef"],
    )
    adv, returns = gae_advantages(rewards, a["values"], mask, gamma, lam)
    proc = None
    if a["token_rewards"] is not None:
        # GAE is linear in (rewards, values): the process share is GAE(process rewards, V = 0);
        # the rest (outcome, value baseline, KL) is reported as the outcome share.
        proc_r = a["process_coef"] * _zero_off(a["token_rewards"], mask.bool())
        proc, _ = gae_advantages(proc_r, torch.zeros_like(proc_r), mask, gamma, lam)
    out = adv if proc is None else adv - proc
    return out, proc, returns


def _prime_value(a: dict) -> _Parts:
    if a["token_rewards"] is None:
        raise ValueError("estimator 'prime-value' needs `token_rewards` from the implicit PRM")
    adv, _ = implicit_value_advantages(
        a["outcome_rewards"],
        a["token_rewards"],
        a["response_mask"],
        a["gamma"],
        a["lam"],
        outcome_coef=a["outcome_coef"],
        transform=a["value_transform"],
    )
    return adv, None, None


def _scale(a: dict, out: torch.Tensor, proc: torch.Tensor | None) -> tuple:
    return a["outcome_coef"] * out, None if proc is None else a["process_coef"] * proc


ESTIMATORS: dict[str, Callable[[dict], _Parts]] = {
    "rloo": _rloo,
    "grpo": _grpo,
    "reinforce": _reinforce,
    "ppo": _ppo,
    "prime-value": _prime_value,
}


def compute_advantages(
    estimator: str,
    *,
    outcome_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    process_coef: float = 1.0,
    outcome_coef: float = 1.0,
    rloo_variant: str = "eq5",
    grpo_scale_by_std: bool = True,
    reinforce_baseline: str = "batch-mean",
    whiten: bool = False,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    grpo_eps: float = 1e-6,
    process_max_abs_norm: bool = False,
    value_transform: str = "none",
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """Token advantages for one RL batch: outcome_coef * A_outcome + process_coef * A_process.

    estimator (a key of ESTIMATORS):
      "rloo":        RLOO outcome + PRIME Eq. 5 process term (`rloo_variant`: "eq5" | "reference")
      "grpo":        GRPO outcome + group-normalised process term (PRIME App. B.3, our reading)
      "reinforce":   REINFORCE outcome + process reward-to-go (`reinforce_baseline`)
      "ppo":         GAE(gamma, lam) on `ppo_token_rewards` with critic `values`; the coefficients
                     and KL enter the rewards; returns = GAE returns (critic targets)
      "prime-value": the implicit PRM as value model for the outcome (PRIME Sec. 5.4); needs
                     token_rewards; process_coef is unused (there is no process reward term)
    token_rewards=None means outcome-only. The outcome advantage is spread over valid tokens,
    discounted from the last token when gamma < 1. For estimators other than "ppo", a KL term
    (kl_coef > 0) is added as -kl_coef * reward-to-go of `kl` without a baseline.
    process_max_abs_norm: first scale token_rewards by `normalize_by_max_abs_return` (reference
    code option). whiten: standardise the final advantages over all valid tokens of the batch
    (the reference code does; then only process_coef / outcome_coef matters).

    Args:
        estimator: name in ESTIMATORS.
        outcome_rewards: [N]; response_mask: [N, T]; group_ids: [N].
        token_rewards: [N, T] implicit process rewards or None; values: [N, T] critic values.
    Returns:
        (advantages [N, T], returns [N, T] for "ppo" else None, metrics) with float metrics
        adv/mean, adv/std (after whitening), adv/process_abs_mean, adv/outcome_abs_mean (before).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; valid: {sorted(ESTIMATORS)}")
    mask = response_mask.bool()
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be [N, T], got {tuple(mask.shape)}")
    if token_rewards is not None:
        _mask(mask, token_rewards)
        if process_max_abs_norm:
            token_rewards = normalize_by_max_abs_return(token_rewards, mask)
    args = {
        "outcome_rewards": outcome_rewards,
        "response_mask": mask,
        "group_ids": group_ids,
        "token_rewards": token_rewards,
        "values": values,
        "gamma": gamma,
        "lam": lam,
        "process_coef": process_coef,
        "outcome_coef": outcome_coef,
        "rloo_variant": rloo_variant,
        "grpo_scale_by_std": grpo_scale_by_std,
        "grpo_eps": grpo_eps,
        "reinforce_baseline": reinforce_baseline,
        "kl": kl,
        "kl_coef": kl_coef,
        "value_transform": value_transform,
    }
    out, proc, returns = ESTIMATORS[estimator](args)
    adv = out if proc is None else out + proc
    if estimator != "ppo" and kl is not None and kl_coef != 0.0:
        _mask(mask, kl)
        adv = adv - kl_coef * discounted_returns(kl, mask, gamma)
    adv = _zero_off(adv, mask)
    if whiten:
        adv = masked_whiten(adv, mask)
    valid = adv[mask]
    metrics = {
        "adv/mean": float(valid.mean()) if valid.numel() else 0.0,
        "adv/std": float(valid.std()) if valid.numel() > 1 else 0.0,
        "adv/process_abs_mean": float(masked_mean(proc.abs(), mask)) if proc is not None else 0.0,
        "adv/outcome_abs_mean": float(masked_mean(out.abs(), mask)),
    }
    return adv, returns, metrics
