"""Advantage estimators: outcome baselines, PRIME process-reward terms, GAE, and their combination.

Notation: B prompts, K samples per prompt, N = B*K sequences, T response tokens (right-padded),
`response_mask` [N, T], `group_ids` [N] (samples of one prompt share an id; groups may be
interleaved and of unequal size). `token_rewards` [N, T] are implicit process rewards r_phi(y_t)
(PRIME Eq. 3); `outcome_rewards` [N] are verifier outcomes r_o(y) in [0, 1].

PRIME Eq. 5 (RLOO, arXiv 2502.01456), for sample i of its group G (|G| = K):
    A_t^i = sum_{s>=t} gamma^(s-t) * (r_phi(y_s^i) - mean_{j!=i} mean_tokens(r_phi(y^j)))
            + (r_o(y^i) - mean_{j!=i} r_o(y^j))
Process and outcome terms are baselined separately, then added (with coefficients).

Use: an estimator function (an entry of ESTIMATORS, `.fn`) returns the unweighted parts
(AdvantageParts), then `compute_advantages` weights and adds them, subtracts an optional KL
penalty and whitens:
    parts = ESTIMATORS["rloo"].fn(outcome_rewards=o, response_mask=m, group_ids=g, token_rewards=r)
    adv, returns, metrics = compute_advantages(parts, response_mask=m, process_coef=5.0,
                                               outcome_coef=5.0, whiten=True)
See docs/algorithms.md for every estimator's formula and the choices the papers leave open.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from primekit.algorithms.groups import (
    group_counts,
    group_mean,
    group_std,
    group_sum,
    leave_one_out_mean,
)
from primekit.algorithms.masked import masked_mean, masked_mean_std, masked_whiten

__all__ = [
    "ESTIMATORS",
    "AdvantageParts",
    "Estimator",
    "broadcast_outcome_advantages",
    "compute_advantages",
    "discounted_returns",
    "gae_advantages",
    "grpo_advantages",
    "grpo_outcome_advantages",
    "implicit_value_advantages",
    "implicit_values",
    "normalize_by_max_abs_return",
    "ppo_advantages",
    "ppo_token_rewards",
    "prime_grpo_process_returns",
    "prime_reinforce_process_returns",
    "prime_rloo_process_returns",
    "reinforce_advantages",
    "reinforce_outcome_advantages",
    "rloo_advantages",
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
    norm: str = "response-means",
    eps: float = 1e-6,
) -> torch.Tensor:
    """PRIME process term for GRPO (our reading of PRIME App. B.3).

    Formula, norm="response-means" (the default): with m_j = mean over sample j's valid tokens of
    r_phi, over i's group g,
      r'_t = (r_t - mean_{j in g} m_j) / (std_{j in g} m_j + eps),  G_t = sum_{s>=t} gamma^(s-t) r'_s
    (group statistics of the K response-averaged process rewards, i included; std unbiased).
    norm="tokens": the same with mean and unbiased std over all valid tokens of the group,
      r'_t = (r_t - mean_{(j,s) in g} r_{j,s}) / (std_{(j,s) in g} r_{j,s} + eps).
    The paper is ambiguous between these (std of response means or of all tokens); the means
    vary far less than the tokens, so "response-means" can give very large r'_t (measured in
    docs/experiments/estimators.md); see docs/algorithms.md.

    Args: token_rewards [N, T], response_mask [N, T], group_ids [N], gamma;
        norm: "response-means" | "tokens".
    Returns: process returns [N, T].
    """
    mask = _mask(response_mask, token_rewards)
    if norm == "response-means":
        m = _seq_token_mean(token_rewards, mask)  # [N]
        mean, std = group_mean(m, group_ids), (group_std(m, group_ids) if scale_by_std else None)
    elif norm == "tokens":
        mf = mask.to(token_rewards.dtype)  # [N, T]
        n_tok = group_sum(mf.sum(dim=1), group_ids)  # [N] valid tokens in i's group
        r = _zero_off(token_rewards, mask)  # [N, T], padding may hold NaN
        mean = group_sum(r.sum(dim=1), group_ids) / n_tok.clamp(min=1)  # [N]
        std = None
        if scale_by_std:
            dev = _zero_off(r - mean[:, None], mask)  # [N, T]
            ss = group_sum((dev * dev).sum(dim=1), group_ids)  # [N]
            std = torch.sqrt(ss / (n_tok - 1).clamp(min=1))
    else:
        raise ValueError(f"norm must be 'response-means' or 'tokens', got {norm!r}")
    shaped = token_rewards - mean[:, None]
    if std is not None:
        shaped = shaped / (std[:, None] + eps)
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
    token_rewards: torch.Tensor, response_mask: torch.Tensor, eps: float = 1e-6,
    all_reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Reference-code option ("prime_norm: batch_norm"): scale process rewards batch-wide.

    Formula: r'_t = r_t / (max_{i,t valid} |sum_{s>=t} r^i_s| + eps).
    The max is over the whole batch: under data parallelism pass `all_reduce_max` (a max over
    ranks). (The reference code takes it per reward-model worker chunk, an artefact of its
    sharding.)
    Args: token_rewards [N, T], response_mask [N, T]. Returns: [N, T].
    """
    mask = _mask(response_mask, token_rewards)
    rtg = discounted_returns(token_rewards, mask, 1.0)
    scale = rtg.abs().max() if rtg.numel() else torch.zeros((), dtype=rtg.dtype)
    if all_reduce_max is not None:
        scale = all_reduce_max(scale)
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
    include_current_token=True uses q_t instead (the "v_phi(y_<t+1)" indexing of PRIME Sec. 5.4). transform:
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


# ---------------------------------------------------------------------------------------------
# estimators: each returns the unweighted parts of the advantage; `compute_advantages` weights,
# adds, penalises and whitens them. The trainer calls ESTIMATORS[name].fn(**kwargs), then
# compute_advantages(parts, ...).


class AdvantageParts(NamedTuple):
    """What an estimator returns: unweighted [N, T] terms, combined by `compute_advantages` as

        A_t = outcome_coef * outcome_t + process_coef * process_t + baseline_t
              - kl_coef * sum_{s>=t} kl_discount^(s-t) kl_s,     returns_t = A_t + values_t.

    outcome: [N, T] outcome term (for GAE estimators: GAE of the outcome reward alone).
    process: [N, T] process term, or None when there is no process reward.
    baseline: [N, T] critic term GAE(rewards = 0, values), not weighted by any coefficient
        ("ppo" only), or None.
    values: [N, T] critic values, so that returns = A + values are the critic's targets ("ppo"
        only), or None (then there are no returns).
    kl_discount: discount of the KL penalty's reward-to-go: gamma for reward-to-go estimators,
        gamma * lam for "ppo" (there the KL is a token reward inside GAE).
    """

    outcome: torch.Tensor
    process: torch.Tensor | None = None
    baseline: torch.Tensor | None = None
    values: torch.Tensor | None = None
    kl_discount: float = 1.0


def _outcome_term(
    advantages: torch.Tensor, response_mask: torch.Tensor, gamma: float, discount_outcome: bool
) -> torch.Tensor:
    # PRIME Eq. 5 as printed adds the outcome advantage undiscounted at every token; the public
    # reference code puts it on the last token and sums it into the discounted returns instead.
    _check_gamma(gamma)
    return broadcast_outcome_advantages(
        advantages, response_mask, gamma if discount_outcome else 1.0
    )


def rloo_advantages(
    *,
    outcome_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    variant: str = "eq5",
    discount_outcome: bool = False,
) -> AdvantageParts:
    """PRIME's RLOO estimator with implicit process rewards (PRIME Eq. 5, arXiv 2502.01456).

    Formula: A_t^i = process_coef * sum_{s>=t} gamma^(s-t) (r_phi(y_s^i) - mean_{j!=i} m_j)
                     + outcome_coef * w_t * (r_o(y^i) - mean_{j!=i} r_o(y^j)),
    m_j = mean over sample j's valid tokens of r_phi, j over i's group; w_t = 1 (Eq. 5 as printed,
    discount_outcome=False) or gamma^(L_i - 1 - t) (the reference code, discount_outcome=True: the
    outcome reward sits on the last token, inside the discounted return). The two agree for
    gamma = 1. `variant` picks the process baseline, see `prime_rloo_process_returns`.
    Every group needs >= 2 samples.

    Args:
        outcome_rewards: [N] verifier outcomes r_o.
        response_mask: [N, T].
        group_ids: [N].
        token_rewards: [N, T] implicit process rewards r_phi, or None (outcome-only RLOO, Eq. 4).
        gamma: discount in [0, 1].
        variant: "eq5" (the paper) or "reference" (public PRIME code).
        discount_outcome: discount the outcome term from the last token (see above).
    Returns:
        AdvantageParts(outcome [N, T], process [N, T] | None), kl_discount = gamma.
    """
    adv = rloo_outcome_advantages(outcome_rewards, group_ids)  # [N]
    outcome = _outcome_term(adv, response_mask, gamma, discount_outcome)
    process = None
    if token_rewards is not None:
        process = prime_rloo_process_returns(
            token_rewards, response_mask, group_ids, gamma, variant
        )
    return AdvantageParts(outcome, process, kl_discount=gamma)


def grpo_advantages(
    *,
    outcome_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    scale_by_std: bool = True,
    process_norm: str = "response-means",
    eps: float = 1e-6,
    discount_outcome: bool = False,
) -> AdvantageParts:
    """GRPO with implicit process rewards (PRIME App. B.3, our reading; Shao et al. 2024).

    Formula: A_t^i = process_coef * sum_{s>=t} gamma^(s-t) (r_phi(y_s^i) - mean_g m) / (std_g m + eps)
                     + outcome_coef * w_t * (r_o^i - mean_g r_o) / (std_g r_o + eps),
    g = i's group (i included), std unbiased; scale_by_std=False drops both divisions; w_t as in
    `rloo_advantages` (1, or gamma^(L_i - 1 - t) with discount_outcome=True).

    Args:
        outcome_rewards: [N]; response_mask: [N, T]; group_ids: [N].
        token_rewards: [N, T] implicit process rewards, or None (outcome-only GRPO).
        gamma: discount in [0, 1].
        scale_by_std: divide by the group std (outcome and process alike).
        process_norm: "response-means" (std of the K response means, as above) or "tokens"
            (mean and std over all valid tokens of the group); `prime_grpo_process_returns`.
        eps: added to the std.
        discount_outcome: discount the outcome term from the last token.
    Returns:
        AdvantageParts(outcome [N, T], process [N, T] | None), kl_discount = gamma.
    """
    adv = grpo_outcome_advantages(outcome_rewards, group_ids, scale_by_std=scale_by_std, eps=eps)
    outcome = _outcome_term(adv, response_mask, gamma, discount_outcome)  # [N, T]
    process = None
    if token_rewards is not None:
        process = prime_grpo_process_returns(
            token_rewards, response_mask, group_ids, gamma, scale_by_std=scale_by_std,
            norm=process_norm, eps=eps,
        )
    return AdvantageParts(outcome, process, kl_discount=gamma)


def reinforce_advantages(
    *,
    outcome_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    baseline: str = "batch-mean",
    discount_outcome: bool = False,
) -> AdvantageParts:
    """REINFORCE with implicit process rewards (PRIME App. B.3; Williams 1992).

    Formula: A_t^i = process_coef * sum_{s>=t} gamma^(s-t) (r_phi(y_s^i) - b_p)
                     + outcome_coef * w_t * (r_o^i - b_o),
    b_p = b_o = 0 ("none", the paper's plain REINFORCE) or the batch means of the response-averaged
    process reward and of r_o ("batch-mean", our default); w_t as in `rloo_advantages`.

    Args:
        outcome_rewards: [N]; response_mask: [N, T].
        token_rewards: [N, T] implicit process rewards, or None (outcome-only).
        gamma: discount in [0, 1].
        baseline: "none" or "batch-mean".
        discount_outcome: discount the outcome term from the last token.
    Returns:
        AdvantageParts(outcome [N, T], process [N, T] | None), kl_discount = gamma.
    """
    adv = reinforce_outcome_advantages(outcome_rewards, baseline)  # [N]
    outcome = _outcome_term(adv, response_mask, gamma, discount_outcome)  # [N, T]
    process = None
    if token_rewards is not None:
        process = prime_reinforce_process_returns(
            token_rewards, response_mask, gamma, baseline=baseline
        )
    return AdvantageParts(outcome, process, kl_discount=gamma)


def ppo_advantages(
    *,
    outcome_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor | None,
    token_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> AdvantageParts:
    """PPO with a critic: GAE on dense process + outcome token rewards (PRIME App. B.3; Gao Eq. 2).

    Formula: A = GAE_{gamma,lam}(R, V) with R_t = outcome_coef * r_o [t = last valid token]
      + process_coef * r_phi(y_t) - kl_coef * kl_t, returns = A + V (see `gae_advantages`).
    GAE is linear in (rewards, values), so it splits into the parts
      outcome = GAE(r_o on the last token, 0), process = GAE(r_phi, 0), baseline = GAE(0, V),
    and the KL share is GAE(kl, 0) = sum_{s>=t} (gamma*lam)^(s-t) kl_s (kl_discount).

    Args:
        outcome_rewards: [N].
        response_mask: [N, T].
        values: [N, T] critic values V_t of the state before token t (required).
        token_rewards: [N, T] dense process rewards, or None (outcome-only).
        gamma, lam: in [0, 1].
    Returns:
        AdvantageParts(outcome, process | None, baseline, values), all [N, T], kl_discount =
        gamma * lam.
    """
    if values is None:
        raise ValueError("estimator 'ppo' needs `values` [N, T] from the critic")
    mask = _mask(response_mask, values)
    if token_rewards is not None:
        _mask(mask, token_rewards)
    r_out = ppo_token_rewards(outcome_rewards, mask)  # [N, T], r_o on the last valid token
    r_proc = torch.zeros_like(r_out) if token_rewards is None else _zero_off(token_rewards, mask)
    dtype = torch.promote_types(torch.promote_types(r_out.dtype, r_proc.dtype), values.dtype)
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)  # [N, T]
    # One GAE on the three shares stacked along N: a single backward scan over T, not three.
    rewards = torch.cat([r_out.to(dtype), r_proc.to(dtype), zeros])  # [3N, T]
    vals = torch.cat([zeros, zeros, values.to(dtype)])  # [3N, T]
    adv, _ = gae_advantages(rewards, vals, mask.repeat(3, 1), gamma, lam)
    outcome, process, baseline = adv.chunk(3)  # each [N, T]
    return AdvantageParts(
        outcome,
        None if token_rewards is None else process,
        baseline,
        values=_zero_off(values.to(dtype), mask),
        kl_discount=gamma * lam,
    )


def implicit_value_advantages(
    *,
    outcome_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    token_rewards: torch.Tensor | None,
    gamma: float = 1.0,
    lam: float = 1.0,
    value_transform: str = "none",
    include_current_token: bool = False,
) -> AdvantageParts:
    """The implicit PRM as value model for the outcome reward (PRIME Sec. 5.4 ablation).

    Formula: A = outcome_coef * GAE_{gamma,lam}(R, V), R_t = r_o [t = last valid token],
    V = implicit_values(token_rewards, value_transform, include_current_token). With
    gamma = lam = 1: A_t = outcome_coef * (r_o - V_t), the outcome baselined by the PRM's running
    estimate; with lam = 0, A_t = V_{t+1} - V_t, which for value_transform="none" is the process
    reward itself. There is no process term (process_coef is unused) and no critic (no returns).

    Args:
        outcome_rewards: [N].
        response_mask: [N, T].
        token_rewards: [N, T] implicit process rewards (required).
        gamma, lam: in [0, 1].
        value_transform: "none" (logit scale) or "sigmoid" (probability), see `implicit_values`.
        include_current_token: V_t = q_t instead of q_{t-1}, see `implicit_values`.
    Returns:
        AdvantageParts(outcome [N, T]), kl_discount = gamma (the KL penalty is a plain discounted
        reward-to-go here, as for the reward-to-go estimators).
    """
    if token_rewards is None:
        raise ValueError("estimator 'prime-value' needs `token_rewards` from the implicit PRM")
    values = implicit_values(
        token_rewards,
        response_mask,
        transform=value_transform,
        include_current_token=include_current_token,
    )  # [N, T]
    rewards = ppo_token_rewards(outcome_rewards, response_mask)  # [N, T]
    adv, _ = gae_advantages(rewards, values, response_mask, gamma, lam)
    return AdvantageParts(adv, kl_discount=gamma)


# name -> estimator; every estimator takes keyword arguments only and returns AdvantageParts.
@dataclass(frozen=True)
class Estimator:
    """One estimator as the trainer uses it: the function, and what calling it takes.

    fn: the estimator function itself (returns AdvantageParts).
    options: (algorithm, group_ids [N], values [N, T] or None) -> fn's own keyword arguments;
        `algorithm` is the config's algorithm section (any object with its fields).
    critic: trains a value model whose values `options` reads; the KL penalty then goes into
        the token rewards (Gao et al.'s PPO) instead of the policy loss.
    min_samples: samples per prompt it needs (a leave-one-out or group baseline: 2).
    """

    fn: Callable[..., AdvantageParts]
    options: Callable[[Any, torch.Tensor, torch.Tensor | None], dict[str, Any]]
    critic: bool = False
    min_samples: int = 1


# The estimators by name (algorithm.estimator, whose Literal lists these names; a test checks
# both agree): adding one is its function and one entry here.
ESTIMATORS: dict[str, Estimator] = {
    "rloo": Estimator(rloo_advantages, min_samples=2, options=lambda a, group_ids, values: {
        "group_ids": group_ids, "variant": a.rloo_variant,
        "discount_outcome": a.discount_outcome}),
    "grpo": Estimator(grpo_advantages, min_samples=2, options=lambda a, group_ids, values: {
        "group_ids": group_ids, "scale_by_std": a.grpo_scale_by_std,
        "process_norm": a.grpo_process_norm, "discount_outcome": a.discount_outcome}),
    "reinforce": Estimator(reinforce_advantages, options=lambda a, group_ids, values: {
        "baseline": a.reinforce_baseline, "discount_outcome": a.discount_outcome}),
    "ppo": Estimator(ppo_advantages, critic=True, options=lambda a, group_ids, values: {
        "values": values, "lam": a.lam}),
    "prime-value": Estimator(implicit_value_advantages, options=lambda a, group_ids, values: {
        "lam": a.lam, "value_transform": a.value_transform}),
}


def compute_advantages(
    parts: AdvantageParts,
    *,
    response_mask: torch.Tensor,
    process_coef: float = 1.0,
    outcome_coef: float = 1.0,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    whiten: bool = False,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """Token advantages of one batch: weight and add an estimator's parts, KL penalty, whitening.

    Formula: A_t = outcome_coef * outcome_t + process_coef * process_t + baseline_t
                   - kl_coef * sum_{s>=t} d^(s-t) kl_s,   d = parts.kl_discount,
    0 off the mask; returns_t = A_t + values_t when parts.values is set (critic targets, before
    whitening). Process and outcome were baselined separately by the estimator and are only now
    added (PRIME Sec. 3.2). whiten=True standardises A over all valid tokens of the batch (the
    reference code does; then only the ratio process_coef / outcome_coef matters).

    Args:
        parts: from an estimator function (ESTIMATORS[name].fn).
        response_mask: [N, T].
        process_coef, outcome_coef: weights of the two terms (process_coef unused when
            parts.process is None).
        kl: [N, T] per-token KL estimate (see `policy_loss.kl_penalty`), or None.
        kl_coef: weight of the KL penalty.
        whiten: standardise the final advantages.
        all_reduce: a sum over data-parallel ranks, so that whitening and the metrics use the
            whole batch's counts, means and variance (`masked_whiten`, `masked_mean_std`); None
            in a single process.
    Returns:
        (advantages [N, T], returns [N, T] or None, metrics) with detached 0-dim tensor metrics:
        adv/mean, adv/std (after whitening), adv/process_abs_mean = masked mean |process_coef *
        process|, adv/outcome_abs_mean = masked mean |A - process share| (the outcome term plus,
        where present, the critic baseline and the KL penalty), both before whitening; all over
        the valid tokens of every rank when `all_reduce` is given.
    """
    mask = _mask(response_mask, parts.outcome)
    rest = outcome_coef * parts.outcome  # [N, T]: everything but the process share
    if parts.baseline is not None:
        rest = rest + parts.baseline
    if kl is not None and kl_coef != 0.0:
        _mask(mask, kl)
        rest = rest - kl_coef * discounted_returns(kl, mask, parts.kl_discount)
    proc = None if parts.process is None else process_coef * parts.process
    adv = _zero_off(rest if proc is None else rest + proc, mask)
    returns = None if parts.values is None else _zero_off(adv + parts.values, mask)
    with torch.no_grad():
        zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
        metrics = {
            "adv/process_abs_mean": zero if proc is None else masked_mean(
                proc.abs(), mask, all_reduce=all_reduce),
            "adv/outcome_abs_mean": masked_mean(rest.abs(), mask, all_reduce=all_reduce),
        }
    if whiten:
        adv = masked_whiten(adv, mask, all_reduce=all_reduce)
    with torch.no_grad():
        metrics["adv/mean"], metrics["adv/std"] = masked_mean_std(adv, mask, all_reduce)
    return adv, returns, {k: v.detach() for k, v in metrics.items()}
