"""The batch one RL step works on, the token-rewarder seam, and the prompt sampler.

Rows are laid out group by group: the K samples of prompt g are rows g*K .. g*K+K-1, so a group never
splits across mini-batches that keep whole groups, and `group_ids` is simply arange(G) repeated K times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from primekit.data.problem import Problem
from primekit.rollout.base import RolloutBatch
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

    @property
    def response_mask(self) -> torch.Tensor:
        return self.batch.response_mask.float()  # [N, T]

    def __len__(self) -> int:
        return len(self.problems)


class TokenRewarder(Protocol):
    """A dense token-level reward: the implicit PRM (PRIME) or an explicit ORM / step-level PRM.

    `primekit.reward_models` implements it; the trainer is given one and never imports them.
    """

    # None: `rewards` needs no reference log-probs. Otherwise (micro_batch_size, multiple): the
    # micro-batches the reference log-probs must be computed in, the rewarder's own, so that the
    # implicit PRM's log-ratio against an identical reference is exactly zero.
    reference_chunks: tuple[int, int] | None

    def rewards(self, batch: RolloutBatch, *, outcome_rewards: torch.Tensor,
                group_ids: torch.Tensor, ref_logprobs: torch.Tensor | None,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """Token rewards [N, T] (0 on padding) and metrics. A reward model trained online (the
        implicit PRM) takes its update on this batch's outcomes inside this call."""
        ...

    def trainable(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        """Models (with their optimisers) that change during training: checkpointed by name."""
        ...


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
