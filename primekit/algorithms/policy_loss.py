"""Policy-gradient losses: PPO clip (PRIME Eq. 6), clipped value loss, KL estimators, entropy.

Notation: N sequences, T response tokens, `response_mask` [N, T]. All log-probs are of the sampled
tokens. `agg` is a loss aggregation mode from `masked.LOSS_AGG_MODES`. Metrics are detached 0-dim
tensors (no host sync per micro-batch on a GPU); the trainer reduces them once per step.
"""

from __future__ import annotations

import torch

from primekit.algorithms.masked import aggregate_loss, masked_mean, masked_sum

__all__ = ["entropy_loss", "kl_loss", "kl_penalty", "ppo_clip_loss", "value_loss"]


def _same_shape(**tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"tensors must share one [N, T] shape, got {shapes}")


def _masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Unbiased variance over valid entries without a data-dependent branch (no host sync); the
    # caller decides what fewer than two entries mean.
    m = mask.bool()
    n = m.sum()
    sq = masked_sum((x - masked_mean(x, m)) ** 2, m)
    return sq / (n - 1).clamp_min(1).to(x.dtype)


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss (Schulman et al. 2017; PRIME Eq. 6).

    Formula: rho_t = exp(logp_t - logp_old_t),
      loss_t = max(-A_t * rho_t, -A_t * clip(rho_t, 1 - clip_low, 1 + clip_high)),
    aggregated over valid tokens with `agg` (minimising it maximises the clipped objective).
    Metrics: policy/loss; policy/clip_frac = fraction of valid tokens where the clipped term is
    the active (larger) one; policy/approx_kl = mean k3 estimate of KL(pi_old || pi_theta),
    (rho - 1) - log rho, which is >= 0 per token; policy/ratio_mean.

    Args:
        logprobs: [N, T] current policy (with grad).
        old_logprobs: [N, T] rollout policy.
        advantages: [N, T] (detached here).
        response_mask: [N, T].
        clip_low, clip_high: clip range (asymmetric allowed, "clip-higher").
        agg: aggregation mode.
    Returns:
        (loss, metrics), metrics detached 0-dim tensors.
    """
    _same_shape(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low/clip_high must be >= 0, got {clip_low}, {clip_high}")
    adv = advantages.detach()
    log_ratio = logprobs - old_logprobs.detach()  # [N, T]
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)  # [N, T]
    loss = aggregate_loss(loss_mat, response_mask, agg)
    with torch.no_grad():
        lr = log_ratio.detach()
        metrics = {
            "policy/loss": loss.detach(),
            "policy/clip_frac": masked_mean((clipped > unclipped).float(), response_mask),
            "policy/approx_kl": masked_mean(torch.expm1(lr) - lr, response_mask),
            "policy/ratio_mean": masked_mean(ratio.detach(), response_mask),
        }
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO as in OpenAI baselines / verl).

    Formula: V_clip = V_old + clip(V - V_old, -clip, clip),
      loss_t = 0.5 * max((V - R)^2, (V_clip - R)^2); clip=None gives 0.5 * (V - R)^2.
    Metrics: critic/loss, critic/clip_frac (clipped error is the larger), critic/values_mean,
    critic/returns_mean, critic/explained_var = 1 - Var(R - V) / Var(R) over valid tokens (0 with
    fewer than two valid tokens or returns that do not vary, Var(R) = 0: nothing to explain, where
    the ratio would be -inf or nan); all detached 0-dim tensors.

    Args: values [N, T] (with grad), old_values [N, T], returns [N, T], response_mask [N, T].
    Returns: (loss, metrics).
    """
    _same_shape(values=values, old_values=old_values, returns=returns, mask=response_mask)
    ret = returns.detach()
    err = (values - ret) ** 2
    if clip is None:
        loss_mat = 0.5 * err
        clipped_active = torch.zeros_like(err, dtype=torch.bool)
    else:
        if clip < 0:
            raise ValueError(f"clip must be >= 0 or None, got {clip}")
        old = old_values.detach()
        v_clip = old + torch.clamp(values - old, -clip, clip)
        err_clip = (v_clip - ret) ** 2
        loss_mat = 0.5 * torch.maximum(err, err_clip)
        clipped_active = err_clip > err
    loss = aggregate_loss(loss_mat, response_mask, agg)
    with torch.no_grad():
        m = response_mask.bool()
        v = values.detach()
        var_returns = _masked_var(ret, m)
        defined = (m.sum() > 1) & (var_returns > 0)
        explained = 1.0 - _masked_var(ret - v, m) / torch.where(defined, var_returns, 1.0)
        metrics = {
            "critic/loss": loss.detach(),
            "critic/clip_frac": masked_mean(clipped_active.float(), m),
            "critic/values_mean": masked_mean(v, m),
            "critic/returns_mean": masked_mean(ret, m),
            "critic/explained_var": torch.where(defined, explained, torch.zeros_like(explained)),
        }
    return loss, metrics


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1"
) -> torch.Tensor:
    """Per-token estimators of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman 2020).

    With log r = logp_ref - logp (r = pi_ref / pi_theta):
      k1 = -log r = logp - logp_ref           (unbiased, can be negative)
      k2 = 0.5 * (log r)^2                     (biased, low variance, >= 0)
      k3 = (r - 1) - log r                     (unbiased, >= 0)
    Args: logprobs [N, T], ref_logprobs [N, T], kind. Returns: [N, T] (not masked).
    """
    _same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    log_r = ref_logprobs - logprobs
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    if kind == "k3":
        return torch.expm1(log_r) - log_r
    raise ValueError(f"kind must be 'k1', 'k2' or 'k3', got {kind!r}")


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kind: str = "k3",
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-to-reference loss term: aggregate of `kl_penalty` over valid tokens (ref detached).

    Formula: loss = agg_t kl_t, kl_t from `kl_penalty(kind)`.
    Args: logprobs [N, T] (with grad), ref_logprobs [N, T], response_mask [N, T], kind, agg.
    Returns: (loss, {"policy/kl": detached loss}); the trainer multiplies by its KL coefficient.
    """
    kl = kl_penalty(logprobs, ref_logprobs.detach(), kind)
    loss = aggregate_loss(kl, response_mask, agg)
    return loss, {"policy/kl": loss.detach()}


def entropy_loss(
    entropy: torch.Tensor, response_mask: torch.Tensor, agg: str = "token-mean"
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Entropy bonus as a loss: loss = -aggregate(entropy); adding coef * loss raises entropy.

    Args: entropy [N, T] per-token policy entropy (with grad), response_mask [N, T].
    Returns: (loss, {"policy/entropy": aggregate(entropy)}) - the metric is the positive entropy.
    """
    ent = aggregate_loss(entropy, response_mask, agg)
    return -ent, {"policy/entropy": ent.detach()}
