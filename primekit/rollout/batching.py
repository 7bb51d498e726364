"""Micro-batches of a rollout batch: the one place rows are chunked and padding is trimmed.

Every forward and backward pass over a `RolloutBatch` (old-policy, reference, PRM, critic and
explicit reward model forwards; the policy, PRM and critic updates) iterates
`iter_micro_batches`, so the same (size, multiple) always gives the same rows and the same
padding. That matters beyond speed: two copies of one model scored on equal micro-batches give
bitwise-equal log-probs, so an untouched implicit PRM gives process rewards of exactly zero.

Notation: N rows, P prompt columns, T response columns; a row is
[left-padding | prompt | response | right-padding].
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from primekit.rollout.base import RolloutBatch


@dataclass
class MicroBatch:
    """Rows of a batch, trimmed to their longest prompt p and longest response t.

    rows: [n] long, indices into the batch (or into the `rows` subset's batch).
    input_ids / attention_mask: [n, p + t], the model's inputs.
    response_len: t; the response occupies the last t columns.
    """

    rows: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_len: int

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(self.rows, self.input_ids.to(device), self.attention_mask.to(device),
                          self.response_len)


def row_chunks(n: int, size: int, multiple: int = 1) -> Iterator[torch.Tensor]:
    """Consecutive index chunks of `size` rows, `size` rounded down to a multiple of `multiple`
    (at least one multiple), so chunks of a group-by-group layout keep whole groups."""
    if size < 1 or multiple < 1:
        raise ValueError(f"size and multiple must be >= 1, got size={size} multiple={multiple}")
    size = max(multiple, size // multiple * multiple)
    for lo in range(0, n, size):
        yield torch.arange(lo, min(lo + size, n))


def micro_batch(batch: RolloutBatch, rows: torch.Tensor) -> MicroBatch:
    """The model inputs of `rows`, trimmed to the longest prompt and response among them.

    Trimming matters on a CPU: a micro-batch of short responses should not pay for the batch's
    longest one.
    """
    prompt_mask = batch.prompt_mask[rows]  # [n, P]
    response_mask = batch.response_mask[rows]  # [n, T]
    p = max(int(prompt_mask.sum(1).max()), 1)
    t = max(int(response_mask.sum(1).max()), 1)
    P = batch.prompt_ids.size(1)
    input_ids = torch.cat([batch.prompt_ids[rows, P - p :], batch.response_ids[rows, :t]], 1)
    attention = torch.cat([prompt_mask[:, P - p :], response_mask[:, :t]], 1)  # [n, p + t]
    return MicroBatch(rows, input_ids, attention.long(), t)


def iter_micro_batches(batch: RolloutBatch, size: int, multiple: int = 1,
                       rows: torch.Tensor | None = None) -> Iterator[MicroBatch]:
    """Micro-batches of `size` rows (a multiple of `multiple`) over `rows` (default: all rows).

    With `rows` (a mini-batch's indices) the micro-batches are chunks of that subset and their
    `rows` index the whole batch.
    """
    n = len(batch.responses) if rows is None else len(rows)
    for chunk in row_chunks(n, size, multiple):
        yield micro_batch(batch, chunk if rows is None else rows[chunk])
