"""The batch one RL step works on, the prompt sampler, and row-wise forward helpers.

Rows are laid out group by group: the K samples of prompt g are rows g*K .. g*K+K-1, so a group never
splits across mini-batches that keep whole groups, and `group_ids` is simply arange(G) repeated K times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from primekit.data.problem import Problem
from primekit.models.logprobs import sequence_logprobs
from primekit.rollout.base import RolloutBatch
from primekit.verifiers.base import Verdict


@dataclass
class Experience:
    """Everything one RL step knows about its N = G*K rows; filled phase by phase."""

    batch: RolloutBatch
    problems: list[Problem]  # [N], one per row
    verdicts: list[Verdict]  # [N]
    group_ids: torch.Tensor  # [N] long
    outcome_rewards: torch.Tensor  # [N] float in [0, 1]
    old_logprobs: torch.Tensor | None = None  # [N, T]
    ref_logprobs: torch.Tensor | None = None  # [N, T]
    token_rewards: torch.Tensor | None = None  # [N, T] implicit process rewards
    values: torch.Tensor | None = None  # [N, T] critic values
    advantages: torch.Tensor | None = None  # [N, T]
    returns: torch.Tensor | None = None  # [N, T]
    extra: dict = field(default_factory=dict)

    @property
    def response_mask(self) -> torch.Tensor:
        return self.batch.response_mask.float()  # [N, T]

    def __len__(self) -> int:
        return len(self.problems)


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
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation()


def row_inputs(batch: RolloutBatch, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """input_ids / attention_mask for `rows`, trimmed to the longest prompt and response among them.

    Trimming matters on CPU: a micro-batch of short responses should not pay for the batch's longest.
    Returns (input_ids [n, p+t], attention_mask [n, p+t], t).
    """
    prompt_mask = batch.prompt_mask[rows]  # [n, P]
    response_mask = batch.response_mask[rows]  # [n, T]
    p = max(int(prompt_mask.sum(1).max()), 1)
    t = max(int(response_mask.sum(1).max()), 1)
    P = batch.prompt_ids.size(1)
    input_ids = torch.cat([batch.prompt_ids[rows, P - p :], batch.response_ids[rows, :t]], 1)
    attention = torch.cat([prompt_mask[:, P - p :], response_mask[:, :t]], 1)
    return input_ids, attention.long(), t


def chunks(n: int, size: int, multiple: int = 1) -> Iterator[torch.Tensor]:
    """Row index chunks of `size` rows, rounded down to a multiple of `multiple` (whole groups)."""
    size = max(multiple, size // multiple * multiple)
    for lo in range(0, n, size):
        yield torch.arange(lo, min(lo + size, n))


@torch.no_grad()
def batch_logprobs(model, batch: RolloutBatch, micro_batch_size: int, device,
                   multiple: int = 1) -> torch.Tensor:
    """No-grad per-token log-probs of every response in the batch: [N, T] on CPU.

    Use the same (micro_batch_size, multiple) as the forward it is compared with: equal chunks give
    equal padding, so two copies of one model give bitwise-equal log-probs (zero process rewards at
    initialisation, a PPO ratio of exactly 1 on the first mini-batch).
    """
    N, T = batch.response_ids.shape
    out = torch.zeros(N, T)
    for rows in chunks(N, micro_batch_size, multiple):
        ids, attn, t = row_inputs(batch, rows)
        lp, _ = sequence_logprobs(model, ids.to(device), attn.to(device), t)
        out[rows, :t] = lp.float().cpu()
    return out * batch.response_mask.float()


def sequence_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, t: int):
    """Critic values V(y_<k) for the last t tokens: the scalar head at the position predicting y_k.

    `critic` is an HF *ForTokenClassification model with one label. Returns [n, t].
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    values = out.logits[..., 0]  # [n, L]
    return values[:, -t - 1 : -1].float()


@torch.no_grad()
def batch_values(critic, batch: RolloutBatch, micro_batch_size: int, device) -> torch.Tensor:
    N, T = batch.response_ids.shape
    out = torch.zeros(N, T)
    for rows in chunks(N, micro_batch_size):
        ids, attn, t = row_inputs(batch, rows)
        out[rows, :t] = sequence_values(critic, ids.to(device), attn.to(device), t).cpu()
    return out * batch.response_mask.float()
