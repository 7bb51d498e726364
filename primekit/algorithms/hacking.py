"""Reward-hacking diagnostics, logged every RL step for every reward mode.

Gao et al. (arXiv 2410.15115, Sec. 4.1, Fig. 3) see PRM reward hacking as many short, useless or repeated steps and
longer responses, while the dense return keeps rising. These metrics watch for exactly that:
step count, repetition (of whole steps and of n-grams), length, the dense return and whether the
dense return still tracks success (Pearson correlation per response).

Repeated n-grams: the share of a response's n-grams (n = 4 by default) that already occurred
earlier in the same response ("rep-n" of Welleck et al. 2019), over word tokens: runs of letters/
digits/underscore, or any single other non-space character, so "7*2=14" is ["7","*","2","=","14"].
Characters would make every number a repeat; whitespace words would make a whole arithmetic step
one word.

Step gaming (PURE, arXiv 2504.15275: with a PRM alone the policy avoided the step delimiter to
write few long steps; Gao et al.: many short steps): steps per response, mean step length, the
delimiter rate and the share of steps the dense reward does not pay for, watched together with
accuracy by the dashboard's step light (primekit/viz/lights.py).

A policy losing the task under its reward (`accuracy_fall`): its accuracy on every sampled
rollout falling below its best window beyond its noise; the dashboard's accuracy light and the
trainer's console watch (primekit/trainer/watch.py). Unlike the metrics below it reads a run's
history, not one batch.

Metrics are detached 0-dim float64 tensors, like the other algorithms' metrics: the text
statistics on the CPU, the dense-reward ones on token_rewards' device (no host sync); undefined
ones are NaN, which the trainer drops.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import torch

from primekit.algorithms.masked import masked_sum
from primekit.algorithms.segmentation import compile_delimiter, steps

__all__ = [
    "accuracy_fall",
    "pearson",
    "repeated_ngram_share",
    "repeated_step_share",
    "reward_hacking_metrics",
    "step_reward_sums",
    "words",
]

_WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    """Word tokens for n-gram statistics: "7*2=14" -> ["7", "*", "2", "=", "14"]."""
    return _WORD.findall(text)


def repeated_step_share(step_texts: list[str]) -> tuple[int, int]:
    """(steps equal to an earlier step of the same response, steps), comparing stripped text.

    Whitespace-only steps are compared like any other, so blank-line padding counts as repetition.
    """
    seen: set[str] = set()
    repeats = 0
    for s in step_texts:
        key = s.strip()
        repeats += key in seen
        seen.add(key)
    return repeats, len(step_texts)


def repeated_ngram_share(text: str, n: int = 4) -> tuple[int, int]:
    """(n-grams that already occurred earlier in `text`, n-grams in `text`) over `words`."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    w = words(text)
    seen: set[tuple[str, ...]] = set()
    repeats = total = 0
    for i in range(len(w) - n + 1):
        gram = tuple(w[i : i + n])
        repeats += gram in seen
        total += 1
        seen.add(gram)
    return repeats, total


def pearson(x: torch.Tensor, y: torch.Tensor,
            all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Pearson correlation of two vectors; NaN when N < 2 or either is constant.

    Formula: sum dx dy / sqrt(sum dx^2 * sum dy^2), dx = x - mean x, dy = y - mean y.
    Args: x [N], y [N] (same device); all_reduce: sums a tensor over data-parallel ranks, so that
        the means and sums are over every rank's entries (two all-reduces); None: x and y alone.
    Returns: 0-dim float64 tensor on x's device.
    """
    x, y = x.detach().double().flatten(), y.detach().double().flatten()
    if x.shape != y.shape:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)} must have the same length")
    first = torch.stack([x.new_tensor(float(len(x))), x.sum(), y.sum()])  # [3]: n, sum x, sum y
    if all_reduce is not None:
        first = all_reduce(first)
    n, sx, sy = first
    dx, dy = x - sx / n.clamp_min(1), y - sy / n.clamp_min(1)
    absmax = torch.stack([x.abs().max() if len(x) else x.new_zeros(()),
                          y.abs().max() if len(y) else y.new_zeros(())])
    # The centred sums and the scale in one all-reduce; summed over ranks, the per-rank largest
    # |x| and |y| bound the global ones (within a factor W), which is all the threshold needs.
    second = torch.cat([torch.stack([(dx * dy).sum(), (dx * dx).sum(), (dy * dy).sum()]), absmax])
    if all_reduce is not None:
        second = all_reduce(second)
    sxy, sxx, syy, ax, ay = second
    den = (sxx * syy).sqrt()  # 0 for N < 2: dx = dy = 0
    # A vector constant up to rounding has a spread ~1e-16 of its scale: treat it as constant.
    scale = torch.maximum(torch.maximum(ax, ay), torch.ones_like(den))
    nan = torch.full_like(den, math.nan)
    return torch.where(den <= 1e-12 * scale * scale, nan, sxy / den)


def step_reward_sums(token_rewards: torch.Tensor, step_end_positions: torch.Tensor,
                     response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's dense reward: the sum of the token rewards of its tokens.

    Formula: R[i, k] = sum of token_rewards[i, t] over the valid tokens t with
    pos[i, k-1] < t <= pos[i, k] (pos[i, -1] = -1); valid tokens after the last step end (EOS)
    belong to the last step. For an explicit step PRM (each step's reward on its last token) this
    is the step reward itself; for the implicit PRM, the step's implicit reward (PRIME Sec. 3.1).
    Args:
        token_rewards: [N, T]; step_end_positions: [N, S] ascending, -1 padded (segment_batch);
        response_mask: [N, T].
    Returns:
        (step_rewards [N, S], step_mask [N, S] bool); rows without a step are all 0 / False.
    """
    n, t = token_rewards.shape
    if response_mask.shape != (n, t) or step_end_positions.dim() != 2 or \
            step_end_positions.shape[0] != n:
        raise ValueError(f"token_rewards {tuple(token_rewards.shape)}, response_mask "
                         f"{tuple(response_mask.shape)} and step_end_positions "
                         f"{tuple(step_end_positions.shape)} must be [N, T], [N, T], [N, S]")
    pos = step_end_positions.long().to(token_rewards.device)
    step_mask = pos >= 0  # [N, S]
    s = pos.shape[1]
    ends = torch.zeros(n, t + 1, dtype=torch.long, device=pos.device)  # spare column t for -1
    ends = ends.scatter_add(1, torch.where(step_mask, pos, t), step_mask.long())[:, :t]  # [N, T]
    before = ends.cumsum(1) - ends  # [N, T] step ends strictly before token t = its step index
    last = (step_mask.sum(1, keepdim=True) - 1).clamp_min(0)  # [N, 1]
    step_of = torch.minimum(before, last)  # [N, T]
    valid = response_mask.bool() & step_mask.any(1, keepdim=True)
    r = torch.where(valid, token_rewards, torch.zeros_like(token_rewards))
    out = torch.zeros(n, max(s, 1), dtype=token_rewards.dtype, device=token_rewards.device)
    out = out.scatter_add(1, step_of.clamp_max(max(s, 1) - 1), r)[:, :s]  # [N, S]
    return torch.where(step_mask, out, torch.zeros_like(out)), step_mask


def reward_hacking_metrics(
    responses: list[str],
    *,
    step_delimiter: str,
    outcome_rewards: torch.Tensor,
    token_rewards: torch.Tensor | None,
    response_mask: torch.Tensor,
    ngram: int = 4,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    step_end_positions: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-batch reward-hacking diagnostics, keys under "hack/" (Gao et al. Sec. 4.1, Fig. 3).

    hack/steps_per_response: mean number of steps (segmentation.steps with step_delimiter).
    hack/step_len_chars: mean step length in characters, pooled (characters / steps).
    hack/delimiter_rate: matches of step_delimiter per valid response token, pooled.
    hack/nonpositive_step_share: share of steps whose dense reward (`step_reward_sums`) is <= 0,
        pooled; a key only with step_end_positions, NaN without token_rewards.
    hack/repeated_step_share: repeated steps / all steps, pooled over the batch.
    hack/repeated_ngram_share: repeated word n-grams / all n-grams (n = `ngram`), pooled.
    hack/response_len_chars: mean response length in characters.
    hack/response_len_tokens: mean number of valid response tokens (EOS included).
    hack/dense_return_mean: mean over responses of sum_t token_rewards (unscaled); NaN when
        token_rewards is None (outcome-only).
    hack/dense_success_corr: Pearson correlation over responses of the dense return with the
        outcome reward; NaN when undefined (no dense reward, N < 2, or either is constant).
    Every statistic is pooled over the whole batch: with `all_reduce` (a sum over data-parallel
    ranks) over every rank's responses, exactly as one process with all of them.
    Args:
        responses: N decoded responses; outcome_rewards: [N]; token_rewards: [N, T] dense rewards
        (PRIME's implicit rewards, or the explicit RM's, before any coefficient) or None;
        response_mask: [N, T].
        ngram: n of the repeated n-gram share.
        all_reduce: sums a tensor over ranks (every rank must call this together); None: alone.
        step_end_positions: [N, S] step-end token positions (segmentation.segment_batch with the
            same delimiter), for hack/nonpositive_step_share; None: that key is left out.
    Returns:
        {name: detached 0-dim float64 tensor}; NaN where undefined (e.g. an empty batch).
    """
    n = len(responses)
    if outcome_rewards.shape != (n,) or response_mask.dim() != 2 or response_mask.shape[0] != n:
        raise ValueError(
            f"need outcome_rewards [{n}] and response_mask [{n}, T] for {n} responses; "
            f"got {tuple(outcome_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    if token_rewards is not None and token_rewards.shape != response_mask.shape:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)} must match response_mask "
            f"{tuple(response_mask.shape)}"
        )
    step_lists = [steps(r, step_delimiter) for r in responses]
    grams = [repeated_ngram_share(r, ngram) for r in responses]
    pattern = compile_delimiter(step_delimiter)
    delimiters = sum(sum(1 for _ in pattern.finditer(r)) for r in responses)
    mask = response_mask.bool()
    sums = torch.tensor([  # [8] pooled counts, float64 on the CPU
        float(n), float(sum(repeated_step_share(s)[0] for s in step_lists)),
        float(sum(len(s) for s in step_lists)), float(sum(g[0] for g in grams)),
        float(sum(g[1] for g in grams)), float(sum(len(r) for r in responses)),
        float(mask.sum()), float(delimiters)], dtype=torch.float64)
    if all_reduce is not None:
        sums = all_reduce(sums)
    n_all, rep_steps, n_steps, rep_grams, n_grams, chars, tokens, delims = sums.tolist()
    text = {
        "hack/steps_per_response": n_steps / n_all if n_all else math.nan,
        "hack/step_len_chars": chars / n_steps if n_steps else math.nan,
        "hack/delimiter_rate": delims / tokens if tokens else math.nan,
        "hack/repeated_step_share": rep_steps / n_steps if n_steps else 0.0,
        "hack/repeated_ngram_share": rep_grams / n_grams if n_grams else 0.0,
        "hack/response_len_chars": chars / n_all if n_all else math.nan,
        "hack/response_len_tokens": tokens / n_all if n_all else math.nan,
    }
    out = {k: torch.tensor(v, dtype=torch.float64) for k, v in text.items()}
    nan = torch.full((), math.nan, dtype=torch.float64, device=mask.device)
    out["hack/dense_return_mean"] = out["hack/dense_success_corr"] = nan
    if step_end_positions is not None:
        out["hack/nonpositive_step_share"] = nan
    if token_rewards is not None and step_end_positions is not None:
        step_r, step_m = step_reward_sums(token_rewards.detach().double(), step_end_positions,
                                          mask.to(token_rewards.device))
        counts = torch.stack([((step_r <= 0) & step_m).sum(), step_m.sum()]).double()  # [2]
        if all_reduce is not None:
            counts = all_reduce(counts)
        out["hack/nonpositive_step_share"] = torch.where(
            counts[1] > 0, counts[0] / counts[1].clamp_min(1), nan)
    if token_rewards is not None and n_all:
        dense_return = masked_sum(token_rewards.detach().double(), mask, dim=1)  # [N]
        total = dense_return.sum()
        if all_reduce is not None:
            total = all_reduce(total)
        out["hack/dense_return_mean"] = total / n_all
        out["hack/dense_success_corr"] = pearson(
            dense_return, outcome_rewards.to(dense_return.device), all_reduce)
    return out


def accuracy_fall(accuracies: Sequence[float | None], window: int, *, warn: float, bad: float,
                  z_min: float) -> dict:
    """Is the policy losing the task? The dashboard's accuracy light and the trainer's console
    watch, over a run's per-step accuracy on every sampled rollout (before any filter).

    With m_j the mean of the j-th window of `window` consecutive values (oldest first):
        drop = max_j m_j - m_last              (below the best window so far)
        sd_step^2 = mean_t (x_t - x_{t-1})^2 / 2   (successive differences: a trend does not
                                                 inflate it)
        z = drop / (sd_step / sqrt(window))    (in units of a window mean's noise)
    red "Accuracy falling" when drop >= bad and z >= 2 z_min; amber "Accuracy slipping" when
    drop >= warn and z >= z_min; else green "Accuracy holding"; grey "Not enough steps yet" with
    fewer than `window` values. None and non-finite values (steps that sampled nothing) are
    skipped. The z guard keeps a flat but noisy run from reading as a fall: the best of many
    windows sits above their mean by chance.

    Returns {"color", "label", "value": drop, "best", "last", "z"} ("value" None while grey).
    """
    xs = [float(v) for v in accuracies if v is not None and math.isfinite(v)]
    if len(xs) < window:
        return {"color": "grey", "label": "Not enough steps yet", "value": None}
    means = [sum(xs[i - window:i]) / window for i in range(window, len(xs) + 1)]  # oldest first
    best = max(means)
    drop = best - means[-1]
    diffs = [b - a for a, b in zip(xs, xs[1:])]
    noise = math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs)) / window) if diffs else 0.0
    z = drop / noise if noise > 0 else 0.0  # no noise: every value equal, so no drop either
    if drop >= bad and z >= 2 * z_min:
        color, label = "red", "Accuracy falling"
    elif drop >= warn and z >= z_min:
        color, label = "amber", "Accuracy slipping"
    else:
        color, label = "green", "Accuracy holding"
    return {"color": color, "label": label, "value": drop, "best": best, "last": means[-1],
            "z": z}
