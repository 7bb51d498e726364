"""Explicit-PRM step rewards as dense RL rewards, and their refinements (Gao et al. 2024).

Notation: N sequences, T response tokens, S = max number of reasoning steps. Step tensors are
[N, S], left-aligned: `step_mask` [N, S] is 1 on steps 0..K_i-1 of sample i (K_i = its number of
steps) and 0 after. `step_rewards` r_proc[k] is the PRM score of the prefix ending at step k.
Step index k below is 0-based; Gao et al. number steps 1..K.

Refinements ("On Designing Effective RL Reward at Training Time for LLM Reasoning"):
  Clip  (Eq. 5):  r_k = min(r_proc_k - eta, 0)
  Delta (Eq. 6):  r_k = r_proc_k - r_proc_{k+1} for k < K-2;  r_{K-2} = r_proc_{K-2};  r_{K-1} = 0
                  (1-based in the paper: k < K-1, k = K-1, k = K). Return from step k
                  (Theorem 1): r_proc_k for k <= K-2 and 0 for the last step.
  Clip-Delta:     Delta applied to the clipped rewards.
  Baselines (App. D, Sec. 5.2): length normalisation r/K, length penalty r_k - k*c (k 1-based),
  PR-Normed (standardisation, Shao et al. 2024).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from primekit.algorithms.groups import _index

__all__ = [
    "PROCESS_REWARD_TRANSFORMS",
    "clip_delta_step_rewards",
    "clip_step_rewards",
    "delta_step_rewards",
    "length_normalised_step_rewards",
    "length_penalty_step_rewards",
    "normed_step_rewards",
    "place_step_rewards",
    "step_end_positions_from_mask",
    "step_returns",
]


def _step_mask(step_rewards: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    if step_rewards.dim() != 2 or step_mask.shape != step_rewards.shape:
        raise ValueError(
            f"step_rewards {tuple(step_rewards.shape)} and step_mask {tuple(step_mask.shape)} "
            "must both be [N, S]"
        )
    m = step_mask.bool()
    if m.shape[1] > 1 and bool((m[:, 1:] & ~m[:, :-1]).any()):
        raise ValueError("step_mask must be left-aligned (valid steps first, then padding)")
    return m


def _zero_off(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros_like(x))


def place_step_rewards(
    step_rewards: torch.Tensor, step_end_positions: torch.Tensor, T: int
) -> torch.Tensor:
    """Dense token rewards: each step's reward on the last token of that step.

    Formula: R[i, pos[i, k]] += r[i, k] for every k with pos[i, k] >= 0 (-1 = no step); all other
    tokens get 0. Two steps ending on the same token add up.
    Args:
        step_rewards: [N, S].
        step_end_positions: [N, S] long token index of each step's last token, -1 for none.
        T: number of response tokens.
    Returns:
        token_rewards [N, T].
    """
    if step_rewards.shape != step_end_positions.shape or step_rewards.dim() != 2:
        raise ValueError(
            f"step_rewards {tuple(step_rewards.shape)} and step_end_positions "
            f"{tuple(step_end_positions.shape)} must both be [N, S]"
        )
    pos = step_end_positions.long()
    if pos.numel() and (int(pos.max()) >= T or int(pos.min()) < -1):
        raise ValueError(
            f"step_end_positions must lie in [-1, {T - 1}], got [{int(pos.min())}, {int(pos.max())}]"
        )
    valid = pos >= 0
    out = torch.zeros(
        step_rewards.shape[0], T + 1, dtype=step_rewards.dtype, device=step_rewards.device
    )
    # invalid steps go to a spare column T that is dropped afterwards
    idx = torch.where(valid, pos, torch.full_like(pos, T))
    out = out.scatter_add(1, idx, _zero_off(step_rewards, valid))
    return out[:, :T]  # [N, T]


def step_end_positions_from_mask(step_end_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-end token indices from a token mask that marks each step's last token.

    Args:
        step_end_mask: [N, T], 1 on the last token of every step.
    Returns:
        (positions [N, S] long, ascending, -1 padded; step_mask [N, S] bool), S = max steps per row.
    """
    if step_end_mask.dim() != 2:
        raise ValueError(f"step_end_mask must be [N, T], got {tuple(step_end_mask.shape)}")
    m = step_end_mask.bool()
    n, t = m.shape
    counts = m.sum(dim=1)  # [N]
    s = int(counts.max()) if n else 0
    positions = torch.full((n, s + 1), -1, dtype=torch.long, device=m.device)
    rank = m.long().cumsum(dim=1) - 1  # [N, T], k-th step end gets rank k
    cols = torch.arange(t, device=m.device).expand(n, t)
    rank = torch.where(m, rank, torch.full_like(rank, s))  # non-ends write to spare column s
    positions = positions.scatter(1, rank, torch.where(m, cols, torch.full_like(cols, -1)))
    positions = positions[:, :s]
    return positions, positions >= 0


def clip_step_rewards(
    step_rewards: torch.Tensor, step_mask: torch.Tensor, eta: float = 0.0
) -> torch.Tensor:
    """Clip mechanism (Gao et al. Eq. 5): r_k = min(r_proc_k - eta, 0); never positive. [N, S]."""
    m = _step_mask(step_rewards, step_mask)
    return _zero_off((step_rewards - eta).clamp_max(0.0), m)


def delta_step_rewards(step_rewards: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """Delta mechanism (Gao et al. Eq. 6), 0-based k over the K valid steps of each sample.

    Formula: r_k = r_proc_k - r_proc_{k+1} if k < K-2; r_proc_k if k = K-2; 0 if k = K-1 (the last
    step's reward is dropped: the success reward covers it). So the return from step k telescopes
    to r_proc_k for every k <= K-2, and 0 from the last step (Theorem 1). K = 1 gives all zeros.
    Args: step_rewards [N, S], step_mask [N, S]. Returns: [N, S].
    """
    m = _step_mask(step_rewards, step_mask)
    r = _zero_off(step_rewards, m)
    nxt = torch.zeros_like(r)
    nxt[:, :-1] = r[:, 1:]
    k_last = m.sum(dim=1, keepdim=True) - 1  # [N, 1], index of the last valid step
    idx = torch.arange(r.shape[1], device=r.device)[None, :]  # [1, S]
    out = torch.where(idx < k_last - 1, r - nxt, r)  # k = K-2 keeps r_proc_{K-2}
    out = torch.where(idx == k_last, torch.zeros_like(out), out)
    return _zero_off(out, m)


def clip_delta_step_rewards(
    step_rewards: torch.Tensor, step_mask: torch.Tensor, eta: float = 0.0
) -> torch.Tensor:
    """Clip then Delta (Gao et al. Sec. 4.2, "PR-Clip-Delta"). [N, S] -> [N, S]."""
    return delta_step_rewards(clip_step_rewards(step_rewards, step_mask, eta), step_mask)


def length_normalised_step_rewards(
    step_rewards: torch.Tensor, step_mask: torch.Tensor
) -> torch.Tensor:
    """Length normalisation (Gao et al. App. D): r_k = r_proc_k / K, K = number of steps. [N, S]."""
    m = _step_mask(step_rewards, step_mask)
    k = m.sum(dim=1, keepdim=True).clamp_min(1).to(step_rewards.dtype)
    return _zero_off(step_rewards / k, m)


def length_penalty_step_rewards(
    step_rewards: torch.Tensor, step_mask: torch.Tensor, penalty: float
) -> torch.Tensor:
    """Length penalty (Gao et al. App. D): r_k = r_proc_k - k * c with k the 1-based step index.

    The penalty grows with the step index, so the return falls quadratically in the step count.
    Args: step_rewards [N, S], step_mask [N, S], penalty c. Returns: [N, S].
    """
    m = _step_mask(step_rewards, step_mask)
    k = torch.arange(
        1, step_rewards.shape[1] + 1, device=step_rewards.device, dtype=step_rewards.dtype
    )
    return _zero_off(step_rewards - penalty * k[None, :], m)


def normed_step_rewards(
    step_rewards: torch.Tensor,
    step_mask: torch.Tensor,
    eps: float = 1e-8,
    *,
    group_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """PR-Normed (Gao et al. Sec. 5.2; Shao et al. 2024 process supervision): standardisation.

    Formula: r_k = (r_proc_k - mean) / (std + eps), mean and std (population) over all valid
    steps of the batch, or of each prompt's group when `group_ids` [N] is given (DeepSeekMath's
    per-question form). Gao et al. only say "standard normalization"; the batch is our default.
    Args: step_rewards [N, S], step_mask [N, S]. Returns: [N, S].
    """
    m = _step_mask(step_rewards, step_mask)
    x = _zero_off(step_rewards, m)
    if group_ids is None:
        n = m.sum().clamp_min(1).to(x.dtype)
        mean = x.sum() / n
        var = _zero_off((x - mean) ** 2, m).sum() / n
        return _zero_off((x - mean) / (var.sqrt() + eps), m)
    inverse, counts = _index(x[:, 0], group_ids)
    g = counts.shape[0]
    cnt = torch.zeros(g, dtype=x.dtype, device=x.device).index_add(0, inverse, m.sum(1).to(x.dtype))
    tot = torch.zeros(g, dtype=x.dtype, device=x.device).index_add(0, inverse, x.sum(1))
    mean = (tot / cnt.clamp_min(1))[inverse][:, None]  # [N, 1]
    sq = _zero_off((x - mean) ** 2, m).sum(1)
    var = torch.zeros(g, dtype=x.dtype, device=x.device).index_add(0, inverse, sq) / cnt.clamp_min(
        1
    )
    return _zero_off((x - mean) / (var.sqrt()[inverse][:, None] + eps), m)


def _identity(step_rewards: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    return _zero_off(step_rewards, _step_mask(step_rewards, step_mask))


def step_returns(step_rewards: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """Return from each step: G_k = sum_{j>=k, valid} r_j (undiscounted, as in Gao et al.). [N, S]."""
    m = _step_mask(step_rewards, step_mask)
    r = _zero_off(step_rewards, m)
    return _zero_off(r.flip(-1).cumsum(-1).flip(-1), m)


# name -> f(step_rewards [N, S], step_mask [N, S], **params) -> [N, S]. Params by name:
# "clip"/"clip-delta": eta; "length-penalty": penalty; "normed": eps, group_ids.
PROCESS_REWARD_TRANSFORMS: dict[str, Callable[..., torch.Tensor]] = {
    "none": _identity,
    "clip": clip_step_rewards,
    "delta": delta_step_rewards,
    "clip-delta": clip_delta_step_rewards,
    "length-norm": length_normalised_step_rewards,
    "length-penalty": length_penalty_step_rewards,
    "normed": normed_step_rewards,
}
