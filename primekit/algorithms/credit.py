"""Credit assignment of dense process rewards: summed (the usual return) or min-form (PURE).

Notation: N responses, U reward units per row (tokens [N, T] for the implicit PRM, steps [N, S]
for the explicit step PRM), `unit_mask` [N, U] 1 on the units that carry a process reward.
Every function takes and returns [N, U]; units off the mask are 0.

Sum-form (PRIME Eq. 5, Gao et al. Eq. 2): the return from unit t is sum_{k>=t} r_k, so a policy
earns more by adding units with a positive reward (Gao et al. Sec. 4.1: many short steps).

Min-form (PURE, Cheng et al., arXiv 2504.15275, "Stop Summation: Min-Form Credit Assignment"):
the value of a response is its WEAKEST unit, G_t = min_{k>=t} r_k (`min_form_returns`), which
extra units can only lower. PURE's code (CJReinforce/PURE) makes this fit estimators that sum
rewards by transforming the rewards with temperature-weighted (softmin) weights,
    w_k = exp(-r_k / tau) / sum_{j valid} exp(-r_j / tau),      r'_k = w_k * r_k,
so that sum_k r'_k = sum_k w_k r_k -> min_k r_k as tau -> 0 (and -> mean_k r_k as tau -> inf).
The transformed rewards go through any estimator unchanged (rloo, grpo, reinforce, ppo,
prime-value): the return from the first unit approximates the response's minimum; from a later
unit t it is sum_{k>=t} w_k r_k (the weights stay normalised over the whole response, as in PURE's
code), which is near the minimum for t up to the weakest unit and near 0 after it.
tau is in the reward's own units (PURE: 0.1 on PRM scores p(correct) - p(wrong) in [-1, 1]).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "CREDIT_ASSIGNMENTS",
    "assign_credit",
    "min_form_returns",
    "min_form_rewards",
    "min_form_weights",
    "sum_form_rewards",
]


def _unit_mask(rewards: torch.Tensor, unit_mask: torch.Tensor) -> torch.Tensor:
    if rewards.dim() != 2 or unit_mask.shape != rewards.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and unit_mask {tuple(unit_mask.shape)} must both be "
            "[N, U]"
        )
    return unit_mask.bool()


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def sum_form_rewards(rewards: torch.Tensor, unit_mask: torch.Tensor,
                     temperature: float | None = None) -> torch.Tensor:
    """Sum-form credit: the rewards as they are (0 off the mask). [N, U] -> [N, U].

    The estimators' reward-to-go then gives G_t = sum_{k>=t} r_k. `temperature` is ignored (it
    is accepted so that every entry of CREDIT_ASSIGNMENTS is called alike).
    """
    m = _unit_mask(rewards, unit_mask)
    return torch.where(m, rewards, torch.zeros_like(rewards))


def min_form_weights(rewards: torch.Tensor, unit_mask: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """PURE's softmin weights over each row's valid units. [N, U] -> [N, U].

    Formula: w_k = exp(-r_k / tau) / sum_{j valid} exp(-r_j / tau) for valid k, 0 elsewhere;
    each row with a valid unit sums to 1, a row without one is all 0.
    Args: rewards [N, U], unit_mask [N, U], temperature tau > 0.
    """
    _check_temperature(temperature)
    m = _unit_mask(rewards, unit_mask)
    logits = torch.where(m, -rewards / temperature,
                         torch.full_like(rewards, float("-inf")))  # [N, U]
    # A row without valid units would be softmax(-inf, ...) = NaN: give it 0 logits, then zero it.
    empty = ~m.any(dim=1, keepdim=True)  # [N, 1]
    w = torch.softmax(torch.where(empty, torch.zeros_like(logits), logits), dim=1)
    return torch.where(m, w, torch.zeros_like(w))


def min_form_rewards(rewards: torch.Tensor, unit_mask: torch.Tensor,
                     temperature: float = 0.1) -> torch.Tensor:
    """Min-form credit by PURE's temperature-weighted transform (see the module docstring).

    Formula: r'_k = w_k * r_k, w = `min_form_weights`(r, tau); sum_k r'_k -> min_k r_k as tau -> 0.
    Args: rewards [N, U], unit_mask [N, U], temperature tau > 0 (reward units; PURE: 0.1).
    Returns: [N, U], 0 off the mask.
    """
    w = min_form_weights(rewards, unit_mask, temperature)
    return torch.where(unit_mask.bool(), w * rewards, torch.zeros_like(rewards))


def min_form_returns(rewards: torch.Tensor, unit_mask: torch.Tensor) -> torch.Tensor:
    """Exact min-form return (PURE): G_t = min_{k >= t, k valid} r_k, 0 off the mask. [N, U].

    The definition the transform approximates at the first unit; used for metrics and tests.
    """
    m = _unit_mask(rewards, unit_mask)
    big = torch.finfo(rewards.dtype).max
    x = torch.where(m, rewards, torch.full_like(rewards, big))
    suffix_min = x.flip(-1).cummin(-1).values.flip(-1)  # [N, U]
    return torch.where(m, suffix_min, torch.zeros_like(rewards))


# name -> f(rewards [N, U], unit_mask [N, U], temperature) -> [N, U] (algorithm.credit).
CREDIT_ASSIGNMENTS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "sum": sum_form_rewards,
    "min": min_form_rewards,
}


def assign_credit(
    rewards: torch.Tensor,
    unit_mask: torch.Tensor,
    credit: str,
    temperature: float = 0.1,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CREDIT_ASSIGNMENTS[credit] applied to a batch, with its metrics.

    Args:
        rewards: [N, U] process rewards (after any Clip/Delta refinement).
        unit_mask: [N, U] the units that carry a reward.
        credit: "sum" or "min".
        temperature: tau of "min".
        all_reduce: a sum over data-parallel ranks, so the metrics cover every rank's rows.
    Returns:
        (credited rewards [N, U], metrics) with detached 0-dim float64 tensors over the rows that
        have a unit: credit/return_mean, mean of sum_k r'_k (the return the estimators see from
        the first unit); credit/min_return_mean, mean of min_k r_k (the exact min-form value);
        and for "min" credit/weight_max_mean, the mean largest weight max_k w_k (1: all weight on
        the weakest unit, the exact min; 1/U_i: uniform, the mean).
    """
    if credit not in CREDIT_ASSIGNMENTS:
        raise ValueError(f"credit must be one of {sorted(CREDIT_ASSIGNMENTS)}, got {credit!r}")
    m = _unit_mask(rewards, unit_mask)
    out = CREDIT_ASSIGNMENTS[credit](rewards, m, temperature)  # [N, U]
    rows = m.any(dim=1)  # [N]
    x = out.detach().double()
    # The row's minimum is the exact min-form return at its first valid unit.
    first = m.long().argmax(dim=1)  # [N], index of the first valid unit
    first_min = min_form_returns(rewards.detach().double(), m).gather(1, first[:, None])[:, 0]
    parts = [rows.double().sum(), torch.where(rows, x.sum(1), 0.0).sum(),
             torch.where(rows, first_min, 0.0).sum()]
    if credit == "min":
        w = min_form_weights(rewards.detach().double(), m, temperature)
        parts.append(torch.where(rows, w.max(dim=1).values, 0.0).sum())
    sums = torch.stack(parts)  # [3] or [4]
    if all_reduce is not None:
        sums = all_reduce(sums)
    n = sums[0].clamp_min(1)
    nan = torch.full((), float("nan"), dtype=torch.float64, device=sums.device)
    metrics = {"credit/return_mean": torch.where(sums[0] > 0, sums[1] / n, nan),
               "credit/min_return_mean": torch.where(sums[0] > 0, sums[2] / n, nan)}
    if credit == "min":
        metrics["credit/weight_max_mean"] = torch.where(sums[0] > 0, sums[3] / n, nan)
    return out, metrics
