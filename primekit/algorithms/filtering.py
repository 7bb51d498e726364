"""Online filters: prompts of medium difficulty (PRIME Sec. 3.3) and PRM-verifier consistency
(PROF, Ye et al., arXiv 2509.03403).

Notation: N sequences, `group_ids` [N] (samples of one prompt share an id), outcome_rewards [N],
process_scores [N] (one number per response from the dense reward: what the PRM thinks of it).
"""

from __future__ import annotations

import torch

from primekit.algorithms.groups import _index, group_mean

__all__ = ["consistency_drop_counts", "consistency_filter", "filter_groups"]


def filter_groups(
    outcome_rewards: torch.Tensor,
    group_ids: torch.Tensor,
    lo: float = 0.2,
    hi: float = 0.8,
    *,
    tol: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Keep every sample of a group whose mean outcome lies in [lo, hi] (PRIME Sec. 3.3).

    Formula: keep_i = lo - tol <= mean_{j in g(i)} r_o(y^j) <= hi + tol. The tolerance makes the
    bounds inclusive despite float rounding (with K = 5, 1/5 = 0.2 is kept; with K = 4 the paper's
    [0.2, 0.8] keeps 1/4, 2/4, 3/4).

    Args:
        outcome_rewards: [N].
        group_ids: [N].
        lo, hi: accuracy bounds, lo <= hi.
        tol: float tolerance on both bounds.
    Returns:
        (keep [N] bool, metrics) with filter/keep_rate (kept groups / groups, 0 without groups),
        filter/groups, filter/kept_groups, as detached 0-dim float tensors.
    """
    if lo > hi:
        raise ValueError(f"lo must be <= hi, got lo={lo}, hi={hi}")
    mean = group_mean(outcome_rewards.to(torch.float64), group_ids)  # [N]
    keep = (mean >= lo - tol) & (mean <= hi + tol)
    inverse, counts = _index(outcome_rewards, group_ids)
    n_groups = counts.shape[0]
    kept = torch.zeros(n_groups, dtype=torch.bool, device=keep.device)
    kept[inverse] = keep  # all samples of a group share the decision
    n_kept = kept.sum().to(torch.float64)
    metrics = {
        "filter/keep_rate": n_kept / max(n_groups, 1),
        "filter/groups": torch.full((), float(n_groups), dtype=torch.float64, device=keep.device),
        "filter/kept_groups": n_kept,
    }
    return keep, metrics


def consistency_drop_counts(n_correct: torch.Tensor, n_wrong: torch.Tensor,
                            drop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """How many correct and wrong samples each group gives up (our balance rule for PROF).

    Rule: `drop` samples leave every group, one at a time from whichever side (correct or wrong)
    has more samples left; a tie takes a correct one (a correct response with flawed steps is
    the outcome reward's blind spot that PROF targets). Closed form with D = |n+ - n-|:
        from the larger side min(drop, D); the remaining r = drop - min(drop, D) split
        ceil(r/2) correct, floor(r/2) wrong.
    Kept counts are therefore as equal as the group allows (PROF: "maintaining positive/negative
    training sample balance"); a side is never emptied while the other has more.
    Args: n_correct [G], n_wrong [G] long; drop < n_correct + n_wrong for every group.
    Returns: (correct_drops [G], wrong_drops [G]) long.
    """
    diff = n_correct - n_wrong  # [G]
    first = diff.abs().clamp_max(drop)  # [G] from the larger side
    rest = drop - first
    correct = torch.where(diff > 0, first, 0) + (rest + 1) // 2
    wrong = torch.where(diff < 0, first, 0) + rest // 2
    return correct, wrong


def consistency_filter(
    outcome_rewards: torch.Tensor,
    process_scores: torch.Tensor,
    group_ids: torch.Tensor,
    drop: int,
    *,
    threshold: float = 0.5,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PRM-verifier consistency filter (PROF, arXiv 2509.03403, Algorithm 1; our balance rule).

    A response is correct when r_o >= threshold. In each group, the correct responses are ranked
    by process score ascending and the wrong ones descending, so that the least consistent come
    first (correct with a LOW process score, wrong with a HIGH one); `consistency_drop_counts`
    says how many of each side leave; the first ones of each ranking are dropped. Every group
    loses exactly `drop` samples, so groups stay equal in size (and ranks agree under torchrun).
    Equal scores drop the earlier row first (a stable sort); the samples of a group are i.i.d.
    Args:
        outcome_rewards: [N] verifier outcomes.
        process_scores: [N] the dense reward's score of each response (higher = better).
        group_ids: [N].
        drop: samples dropped per group, 0 <= drop < every group's size.
        threshold: outcome at or above which a response counts as correct.
    Returns:
        (keep [N] bool, metrics) with detached 0-dim float64 tensors, shares of the N rows:
        filter/consistency_dropped (all dropped), filter/consistency_dropped_correct (correct
        responses dropped for a low process score), filter/consistency_dropped_wrong (wrong
        responses dropped for a high one).
    """
    n = outcome_rewards.shape[0]
    if process_scores.shape != (n,) or group_ids.shape != (n,):
        raise ValueError(f"outcome_rewards, process_scores and group_ids must all be [{n}], got "
                         f"{tuple(process_scores.shape)} and {tuple(group_ids.shape)}")
    inverse, counts = _index(outcome_rewards, group_ids)  # [N], [G]
    if n == 0:
        zero = torch.zeros((), dtype=torch.float64)
        return torch.ones(0, dtype=torch.bool), {k: zero for k in (
            "filter/consistency_dropped", "filter/consistency_dropped_correct",
            "filter/consistency_dropped_wrong")}
    if drop < 0 or drop >= int(counts.min()):
        raise ValueError(f"drop must be in [0, smallest group size {int(counts.min())}), "
                         f"got {drop}")
    correct = outcome_rewards >= threshold  # [N]
    g = counts.shape[0]
    n_correct = torch.zeros(g, dtype=torch.long, device=correct.device).index_add(
        0, inverse, correct.long())
    drop_c, drop_w = consistency_drop_counts(n_correct, counts - n_correct, drop)  # [G] each
    # Least consistent first: ascending score for correct, descending for wrong.
    key = torch.where(correct, process_scores, -process_scores).double()  # [N]
    order = torch.argsort(key, stable=True)
    order = order[torch.argsort(correct[order].long(), stable=True)]
    order = order[torch.argsort(inverse[order], stable=True)]  # by group, side, then key
    segment = inverse[order] * 2 + correct[order].long()  # [N] (group, side) of each sorted row
    pos = torch.arange(n, device=segment.device)
    new = torch.ones(n, dtype=torch.bool, device=segment.device)
    new[1:] = segment[1:] != segment[:-1]
    start = torch.cummax(torch.where(new, pos, 0), dim=0).values  # first position of the segment
    rank = torch.empty_like(pos)
    rank[order] = pos - start  # [N] place in its (group, side) ranking
    quota = torch.where(correct, drop_c[inverse], drop_w[inverse])  # [N]
    keep = rank >= quota
    dropped = ~keep
    denom = float(max(n, 1))
    metrics = {
        "filter/consistency_dropped": dropped.double().sum() / denom,
        "filter/consistency_dropped_correct": (dropped & correct).double().sum() / denom,
        "filter/consistency_dropped_wrong": (dropped & ~correct).double().sum() / denom,
    }
    return keep, metrics
