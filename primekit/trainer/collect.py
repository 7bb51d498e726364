"""The collect phase: roll out, verify and filter in rounds until the step's prompt groups are in.

`collect_groups` is the online filter's refill loop (PRIME Sec. 3.4: keep the prompts whose K
samples' accuracy lies in [lo, hi]); it is given the function that samples and grades one round,
so it knows nothing of models, engines or verifiers.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from math import ceil

import torch

from primekit import distributed as dist
from primekit.algorithms import consistency_filter, filter_groups, masked_sum
from primekit.config import FilterConfig
from primekit.data.problem import Problem
from primekit.rollout.base import RolloutBatch, concat_batches
from primekit.trainer.experience import Experience
from primekit.verifiers import Verdict, verdict_stats
from primekit.verifiers.arithmetic import trace_error_counts
from primekit.verifiers.mixed import mean_by_task

# One round: K samples of each of n fresh prompts and their verdicts, rows [n*K].
Round = Callable[[int], tuple[RolloutBatch, list[Problem], list[Verdict]]]


@dataclass
class Group:
    """One prompt group (K rows) that passed the filter, with its age: the policy updates
    between the step that sampled it and now (0 in the step that sampled it)."""

    batch: RolloutBatch
    problems: list[Problem]
    verdicts: list[Verdict]
    age: int = 0


@dataclass
class GroupCarry:
    """What the online filter keeps from one step to the next.

    groups: groups that passed the filter after the step's batch was full, oldest first; a
        later step trains on them before sampling fresh ones, as long as they are at most
        `max_age` updates old (filter.carry_steps) and fit in `capacity` groups (one step's
        batch); the rest are dropped. Not checkpointed: `clear()` drops them when a checkpoint
        is written (the trainer does so at every save), so a run resumed from a checkpoint
        trains on exactly what the uninterrupted run trained on.
    seen, passed: groups sampled and groups that passed the filter, over every step and rank
        so far: their ratio sizes the first round of a step and every refill (checkpointed).
    """

    max_age: int = 1
    capacity: int = 0
    groups: list[Group] = field(default_factory=list)
    seen: int = 0
    passed: int = 0

    def clear(self) -> int:
        """Drop the carried groups (at a checkpoint); returns how many."""
        dropped, self.groups = len(self.groups), []
        return dropped

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen, "passed": self.passed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen, self.passed = int(state.get("seen", 0)), int(state.get("passed", 0))


def _split_groups(batch: RolloutBatch, problems: list[Problem], verdicts: list[Verdict],
                  rows: torch.Tensor, K: int) -> list[Group]:
    """The groups made of `rows` (whole groups, contiguous, in order) as one Group each."""
    return [Group(batch.select(rows[g : g + K]), [problems[i] for i in rows[g : g + K].tolist()],
                  [verdicts[i] for i in rows[g : g + K].tolist()])
            for g in range(0, rows.numel(), K)]


# The lowest pass rate a round is scaled by: however few groups have passed the filter so far, a
# round samples at most filter.oversample / MIN_PASS_RATE times the groups it is missing.
MIN_PASS_RATE = 0.1


def round_prompts(missing: int, filt: FilterConfig, pass_rate: float) -> int:
    """Prompts one rollout round samples for `missing` groups: all of them without the filter,
    else missing x filter.oversample / max(pass_rate, MIN_PASS_RATE), rounded up."""
    if not filt.enabled:
        return missing
    return ceil(missing * filt.oversample / max(pass_rate, MIN_PASS_RATE))


def collect_groups(rollout_round: Round, *, need: int, group_size: int, filt: FilterConfig,
                   pad_id: int, per_task: bool = False, carry: GroupCarry | None = None,
                   ) -> tuple[Experience | None, dict]:
    """Roll out and filter in rounds until `need` groups are kept (or filter.max_rounds).

    With a `carry`, groups carried from earlier steps come first (oldest first), the size of
    every round is missing groups x filter.oversample / (the pass rate of every step so far),
    and groups that pass beyond the batch are carried to the next steps instead of thrown
    away. The returned Experience's `age` [N] says how many policy updates ago each row was
    sampled (0: this step).

    Rows of the returned batch are whole groups, contiguous: group g is rows g*K .. g*K+K-1.
    Under torchrun every rank keeps the smallest count any rank kept (each optimiser step ends
    in a collective, so all ranks must take the same number; a rank's extra groups are carried
    too). Returns (None, metrics) when no group was kept.
    """
    K = group_size
    carry = carry if carry is not None else GroupCarry(max_age=0)
    dropped = 0
    for g in carry.groups:
        g.age += 1
    aged = [g for g in carry.groups if g.age <= carry.max_age]
    dropped += len(carry.groups) - len(aged)
    kept: list[Group] = aged[:need]  # whole groups, carried ones first
    carried_in = len(kept)
    surplus: list[Group] = aged[need:]  # still carried (older first), then this step's surplus
    sampled_scores, all_verdicts = [], []
    groups_seen = groups_passed = rounds = sampled_tokens = 0
    traced_correct = traced_wrong = 0  # correct arithmetic-format responses; with a wrong step
    while len(kept) < need and rounds < filt.max_rounds:
        rounds += 1
        missing = need - len(kept)
        # Rounds scale by the pass rate of every step so far (this one included), so neither
        # the first round nor a last missing group or two costs a round each.
        seen, passed = carry.seen + groups_seen, carry.passed + groups_passed
        n_prompts = round_prompts(missing, filt, passed / seen if seen else 1.0)
        batch, problems, verdicts = rollout_round(n_prompts)
        sampled_tokens += int(batch.response_mask.sum())
        scores = torch.tensor([v.score for v in verdicts])  # [n*K]
        sampled_scores.append(scores)
        all_verdicts += verdicts
        correct, wrong = trace_error_counts(batch.responses, problems, verdicts)
        traced_correct, traced_wrong = traced_correct + correct, traced_wrong + wrong
        groups_seen += len(scores) // K
        keep = torch.ones(len(scores), dtype=torch.bool)  # [n*K]
        if filt.enabled:
            group_ids = torch.arange(len(scores) // K).repeat_interleave(K)  # [n*K]
            keep, _ = filter_groups(scores, group_ids, lo=filt.lo, hi=filt.hi)
        rows = keep.nonzero().squeeze(1)  # whole groups, in order
        groups_passed += rows.numel() // K
        kept += _split_groups(batch, problems, verdicts, rows[: missing * K], K)
        surplus += _split_groups(batch, problems, verdicts, rows[missing * K :], K)
    groups_kept = len(kept)
    if dist.world_size() > 1:
        # Every rank trains on the smallest count any rank kept (-max(-x): one all-reduce).
        groups_kept = int(-dist.all_reduce_max(torch.tensor(-float(groups_kept))))
    surplus = kept[groups_kept:] + surplus
    kept = kept[:groups_kept]
    if carry.max_age > 0:
        # Keep at most `capacity` groups, the youngest (the oldest would age out first).
        keep_n = min(len(surplus), carry.capacity or need)
        surplus.sort(key=lambda g: -g.age)  # oldest first, stable
        dropped += len(surplus) - keep_n
        carry.groups = surplus[len(surplus) - keep_n :]
    else:  # no carrying: every surplus group is thrown away
        dropped += len(surplus)
        carry.groups = []
    batch_tokens = sum(int(g.batch.response_mask.sum()) for g in kept)
    counts = torch.tensor([float(groups_seen), float(groups_passed), float(carried_in),
                           float(len(carry.groups)), float(dropped), float(sampled_tokens),
                           float(batch_tokens)], dtype=torch.float64)
    seen_all, passed_all, carried_all, out_all, dropped_all, sampled_all, trained_all = (
        dist.all_reduce_sum(counts).tolist())
    carry.seen += int(seen_all)
    carry.passed += int(passed_all)
    metrics = {"sampled_tokens": sampled_tokens,
               **_global_collect_metrics(torch.cat(sampled_scores) if sampled_scores
                                         else torch.zeros(0), all_verdicts, groups_passed,
                                         groups_seen, rounds, need * K,
                                         (traced_correct, traced_wrong)),
               "filter/carried_in": carried_all, "filter/carried_out": out_all,
               "filter/carry_dropped": dropped_all, "filter/sampled_tokens": sampled_all,
               "filter/batch_tokens": trained_all}
    metrics["filter/groups_kept"] = groups_kept
    metrics["train/skipped"] = float(groups_kept == 0)
    if groups_kept == 0:
        return None, metrics
    batch = concat_batches([g.batch for g in kept], pad_id=pad_id)
    verdicts = [v for g in kept for v in g.verdicts]
    exp = Experience(
        batch=batch, problems=[p for g in kept for p in g.problems], verdicts=verdicts,
        group_ids=torch.arange(groups_kept).repeat_interleave(K),  # [N]
        outcome_rewards=torch.tensor([v.score for v in verdicts], dtype=torch.float32),
        age=torch.tensor([g.age for g in kept]).repeat_interleave(K))  # [N]
    metrics["reward/outcome_mean"] = exp.outcome_rewards.mean()
    if per_task:  # reward/outcome_mean/math, reward/outcome_mean/code, ...
        metrics.update({f"reward/outcome_mean/{task}": mean for task, mean in
                        _global_mean_by_task(exp.problems, exp.outcome_rewards).items()})
    return exp, metrics


def consistency_select(exp: Experience, drop: int) -> tuple[Experience, dict[str, torch.Tensor]]:
    """PRM-verifier consistency filter (PROF; filter.consistency_drop, algorithms/filtering.py):
    the batch without the `drop` least consistent samples of every group, and its metrics.

    A response's process score is its dense return, sum_t token_rewards (for the implicit PRM
    under credit=sum its own logit of success, Eq. 4; under credit=min about its weakest unit).
    Groups stay contiguous and equal in size (K - drop rows each)."""
    if exp.token_rewards is None:
        raise ValueError("filter.consistency_drop needs a dense reward (token_rewards)")
    scores = masked_sum(exp.token_rewards.detach().double(), exp.response_mask.to(
        exp.token_rewards.device), dim=1).cpu()  # [N]
    keep, metrics = consistency_filter(exp.outcome_rewards, scores, exp.group_ids, drop)
    return exp.select(keep.nonzero().flatten()), metrics


def _global_collect_metrics(scores: torch.Tensor, verdicts: list[Verdict], groups_kept: int,
                            groups_seen: int, rounds: int, fixed: int,
                            traced: tuple[int, int]) -> dict[str, float]:
    """The collect phase's reward/, filter/ and verify/ metrics over the rollouts of every rank
    (sums and counts all-reduced, rounds the most any rank needed), as one process with all the
    rollouts would report them; at world size 1 the local values.

    `fixed` (the batch's rows on this rank): reward/outcome_mean_fixed is the mean over the first
    `fixed` samples of the step, the same number whatever the filter does, so that its noise can
    be compared between runs that sample different amounts; NaN when a rank sampled fewer.
    `traced` (correct responses to arithmetic-format problems, of them with a wrong step:
    `trace_error_counts`) gives verify/trace_error, absent when no rank has such a response."""
    stats = verdict_stats(verdicts)
    rates = sorted(k for k in stats if k != "verify/retries")  # shares of the verdicts
    n = float(len(verdicts))
    head = scores[:fixed]  # [fixed] the step's first samples, in the order sampled
    packed = torch.tensor([float(len(scores)), float(scores.sum()), float(groups_kept),
                           float(groups_seen), stats["verify/retries"], float(head.sum()),
                           float(len(head) < fixed), float(traced[0]), float(traced[1])]
                          + [stats[k] * n for k in rates] + [n], dtype=torch.float64)
    (count, total, kept, seen, retries, head_total, short, traced_correct, traced_wrong,
     *rate_sums, n_all) = dist.all_reduce_sum(packed).tolist()
    out = {"reward/outcome_mean_sampled": total / count if count else float("nan"),
           "reward/outcome_mean_fixed": (head_total / (fixed * dist.world_size())
                                         if not short and fixed else float("nan")),
           "filter/keep_rate": kept / seen if seen else float("nan"), "verify/retries": retries,
           "filter/rounds": float(dist.all_reduce_max(torch.tensor(float(rounds))))}
    # NaN, not 0, on a step that graded nothing (it trained only on groups carried over)
    out.update({k: v / n_all if n_all else float("nan") for k, v in zip(rates, rate_sums)})
    if traced_correct:
        out["verify/trace_error"] = traced_wrong / traced_correct
    return out


def _global_mean_by_task(problems: list[Problem], scores: torch.Tensor) -> dict[str, float]:
    """`mean_by_task` over every rank's rows: {task: mean score} for the tasks any rank has."""
    means = mean_by_task(problems, scores.tolist())
    counts = {task: float(sum(p.task == task for p in problems)) for task in means}
    sums: dict[str, list[float]] = {}
    for part in dist.all_gather_object({t: (means[t] * counts[t], counts[t]) for t in means}):
        for task, (total, n) in part.items():
            acc = sums.setdefault(task, [0.0, 0.0])
            acc[0] += total
            acc[1] += n
    return {task: total / n for task, (total, n) in sorted(sums.items())}


IDLE_WARN_STEPS = 5  # steps in a row with no update before `warn_idle`


def warn_idle(steps: int, verdicts: list[Verdict], filt: FilterConfig) -> None:
    """The warning for a run that has trained on nothing `steps` steps in a row: what the last
    step's verdicts said (a verifier that cannot read the model's answers says the same thing
    of every response)."""
    counts = Counter(f"{v.status}" + (f" ({v.reason[:60]})" if v.reason else "")
                     for v in verdicts)
    said = ", ".join(f"{n / len(verdicts):.0%} {what}" for what, n in counts.most_common(2))
    warnings.warn(
        f"{steps} steps in a row trained on nothing: no sampled group's mean outcome lay in "
        f"[filter.lo, filter.hi] = [{filt.lo}, {filt.hi}]. The last step's {len(verdicts)} "
        f"verdicts: {said or 'none'}. If the verifier cannot read the model's answers, the data "
        f"or the answer format is wrong (docs/verifiers.md); otherwise the problems are too hard "
        f"or too easy for the model.", stacklevel=3)


def warn_unfilled(step: int, metrics: dict, need: int) -> None:
    """The warning for a step whose filter kept fewer groups than asked (the caller shows it
    once per run; filter/groups_kept tracks every step)."""
    warnings.warn(
        f"step {step}: the online filter kept {int(metrics['filter/groups_kept'])} of {need} "
        f"prompt groups after {int(metrics['filter/rounds'])} rounds (keep rate "
        f"{float(metrics['filter/keep_rate']):.2f}); training on what was kept. Raise "
        f"filter.max_rounds / filter.oversample, widen filter.lo/hi, or change the data "
        f"difficulty. (Shown once; see the metric filter/groups_kept for later steps.)",
        stacklevel=3)
