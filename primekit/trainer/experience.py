"""The batch one RL step works on, the token-rewarder seam, and the prompt sampler.

Rows are laid out group by group: the K samples of prompt g are rows g*K .. g*K+K-1, so a group never
splits across mini-batches that keep whole groups, and `group_ids` is simply arange(G) repeated K times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Protocol

import torch

from primekit import distributed as dist
from primekit.algorithms import (
    logprob_mismatch,
    masked_mean,
    reward_hacking_metrics,
    segment_batch,
    truncated_importance_weights,
)
from primekit.config import PolicyConfig, PRMConfig
from primekit.data.problem import Problem
from primekit.rollout.base import RolloutBatch
from primekit.rollout.batching import Layout
from primekit.verifiers.base import Verdict


@dataclass
class Experience:
    """Everything one RL step knows about its N = G*K rows; filled phase by phase, tensors only."""

    batch: RolloutBatch
    problems: list[Problem]  # [N], one per row
    verdicts: list[Verdict]  # [N]
    group_ids: torch.Tensor  # [N] long
    outcome_rewards: torch.Tensor  # [N] float in [0, 1]
    old_logprobs: torch.Tensor | None = None  # [N, T]
    ref_logprobs: torch.Tensor | None = None  # [N, T]
    token_rewards: torch.Tensor | None = None  # [N, T] dense rewards (implicit or explicit)
    values: torch.Tensor | None = None  # [N, T] critic values
    advantages: torch.Tensor | None = None  # [N, T]
    returns: torch.Tensor | None = None  # [N, T]
    # [N] long: policy updates since the row was sampled (0: this step's policy sampled it;
    # > 0: a group carried by the online filter from an earlier step, trainer/collect.py).
    age: torch.Tensor | None = None

    @property
    def response_mask(self) -> torch.Tensor:
        return self.batch.response_mask.float()  # [N, T]

    def __len__(self) -> int:
        return len(self.problems)

    def select(self, rows: torch.Tensor) -> Experience:
        """The rows at `rows` (1-D long row numbers, in order), every per-row field with them."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, RolloutBatch):
                value = value.select(rows)
            elif isinstance(value, list):
                value = [value[i] for i in rows.tolist()]
            elif isinstance(value, torch.Tensor):
                value = value[rows.to(value.device)]
            picked[f.name] = value
        return Experience(**picked)


class TokenRewarder(Protocol):
    """A dense token-level reward: the implicit PRM (PRIME) or an explicit ORM / step-level PRM.

    `primekit.reward_models` implements it; the trainer is given one and never imports them.
    """

    # None: `rewards` needs no reference log-probs. Otherwise the `Layout` (rollout/batching.py)
    # the reference log-probs must be computed in, the rewarder's own micro-batches, so that the
    # implicit PRM's log-ratio against an identical reference is exactly zero.
    reference_chunks: Layout | None

    # True pauses the update of a rewarder trained online (live control's PRM toggle,
    # trainer/live.py): `rewards` then only scores. A rewarder that never trains ignores it.
    frozen: bool

    def rewards(self, batch: RolloutBatch, *, outcome_rewards: torch.Tensor,
                group_ids: torch.Tensor, ref_logprobs: torch.Tensor | None,
                problems: list[Problem] | None = None,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """Token rewards [N, T] (0 on padding) and metrics. A reward model trained online (the
        implicit PRM) takes its update on this batch's outcomes inside this call; `problems`
        (one per row) for a rewarder that reads them (the oracle step PRM)."""
        ...

    def trainable(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        """Models (with their optimisers) that change during training: checkpointed by name."""
        ...


def micro_layout(section: PolicyConfig | PRMConfig, multiple: int = 1) -> Layout:
    """The micro-batch layout of a config section with micro_batch_size,
    max_tokens_per_micro_batch and packing (policy, prm): by rows, or by a token budget packed
    or length-sorted."""
    budget = section.max_tokens_per_micro_batch
    return Layout(section.micro_batch_size, multiple, budget,
                  budget > 0 and section.packing == "packed")


class PromptSampler:
    """Epoch-wise shuffled prompt indices; its state is (epoch, position), so resume is exact.

    Each rank draws from its own stride of the epoch's permutation, so ranks never share a prompt
    within an epoch.
    """

    def __init__(self, n: int, seed: int, rank: int = 0, world_size: int = 1):
        if n < world_size:
            raise ValueError(f"PromptSampler: {n} prompts cannot be sharded over {world_size} ranks")
        self.n, self.seed, self.rank, self.world_size = n, seed, rank, world_size
        self.epoch, self.position = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()[self.rank :: self.world_size]

    def take(self, count: int) -> list[int]:
        out: list[int] = []
        while len(out) < count:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation()
            room = min(count - len(out), len(self._order) - self.position)
            out += self._order[self.position : self.position + room]
            self.position += room
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        """Restore (epoch, position). Saved by another number of ranks, the position is carried
        over as the number of prompts all ranks drew together in this epoch, so the run goes on
        with the next unseen prompts (every rank draws the same count per step)."""
        saved_world = state.get("world_size", self.world_size)
        self.epoch = state["epoch"]
        self.position = state["position"] * saved_world // self.world_size
        self._order = self._permutation()


def batch_metrics(exp: Experience, step_delimiter: str,
                  tokenizer=None) -> dict[str, torch.Tensor | float]:
    """Response lengths and the reward-hacking diagnostics of a step's batch: under torchrun,
    of the whole batch over all ranks (a collective). With a tokenizer and a dense reward, the
    steps' token positions too, for hack/nonpositive_step_share."""
    lengths = exp.batch.response_mask.sum(1).double()  # [N]
    n, total, truncated = dist.all_reduce_sum(torch.stack([  # over ranks
        lengths.new_tensor(float(len(lengths))), lengths.sum(),
        (~exp.batch.finished).double().sum()]))
    metrics = {"response/len_mean": total / n, "response/truncated_rate": truncated / n,
               "response/len_max": dist.all_reduce_max(lengths.max())}
    positions = None
    if tokenizer is not None and exp.token_rewards is not None:
        positions, _ = segment_batch(tokenizer, exp.batch.response_ids, exp.batch.response_mask,
                                     step_delimiter)  # [N, S]
    hack = reward_hacking_metrics(
        exp.batch.responses, step_delimiter=step_delimiter, outcome_rewards=exp.outcome_rewards,
        token_rewards=exp.token_rewards, response_mask=exp.response_mask,
        all_reduce=dist.all_reduce_sum, step_end_positions=positions)
    # An undefined correlation (constant rewards) is left out, as other undefined metrics are.
    metrics.update({k: v for k, v in hack.items() if math.isfinite(v)})
    return metrics


def correct_for_sampler(exp: Experience, policy: PolicyConfig,
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The advantages [N, T] corrected for the sampler, and metrics. With old log-probs
    recomputed by the trainer: their gap to the sampler's (metrics), and with
    policy.rollout_correction=tis new advantages weighted by the truncated importance weights
    (`exp` is left as it is). Weighting each token's clipped loss by w >= 0 is weighting its
    advantage, since max(-A w r, -A w clip(r)) = w max(-A r, -A clip(r)); critic returns stay."""
    if policy.old_logprobs == "rollout":  # the same tensor: nothing to compare or correct
        return exp.advantages, {}
    cpu = exp.old_logprobs.device
    sampled, mask = exp.batch.sampling_logprobs.to(cpu), exp.response_mask.to(cpu)  # [N, T]
    metrics = dict(logprob_mismatch(exp.old_logprobs, sampled, mask,
                                    all_reduce=dist.all_reduce_sum,
                                    all_reduce_max=dist.all_reduce_max))  # over all ranks
    if policy.rollout_correction == "tis":
        w = truncated_importance_weights(exp.old_logprobs, sampled, mask,
                                         cap=policy.tis_cap)  # [N, T]
        metrics["rollout/tis_weight_mean"] = masked_mean(w, mask, all_reduce=dist.all_reduce_sum)
        return exp.advantages * w.to(exp.advantages.device), metrics  # [N, T]
    return exp.advantages, metrics


def sample_rows(exp: Experience, tokenizer, n: int) -> list[dict]:
    """The first `n` responses of a batch with their tokens, verdicts and token rewards: the
    rows of samples.jsonl (logging.append_samples)."""
    rows = []
    for i in range(min(n, len(exp))):
        valid = exp.batch.response_mask[i].bool()
        ids = exp.batch.response_ids[i][valid].tolist()
        rewards = None if exp.token_rewards is None else exp.token_rewards[i][valid].tolist()
        rows.append({"prompt": exp.problems[i].prompt, "response": exp.batch.responses[i],
                     "score": exp.verdicts[i].score, "status": exp.verdicts[i].status,
                     "tokens": [tokenizer.decode([t]) for t in ids], "token_rewards": rewards})
    return rows
