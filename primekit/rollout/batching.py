"""Micro-batches of a rollout batch: the one place rows are chunked, padding trimmed or removed.

Every forward and backward pass over a `RolloutBatch` (old-policy, reference, PRM, critic and
explicit reward model forwards; the policy, PRM and critic updates) iterates micro-batches from
here, so the same `Layout` always gives the same micro-batches. That matters beyond speed: two
copies of one model scored on equal micro-batches give bitwise-equal log-probs, so an untouched
implicit PRM gives process rewards of exactly zero.

Two ways to cut a pass (a `Layout`):
- by rows (`max_tokens=0`): consecutive chunks of `rows` rows, each padded to its longest prompt
  and response (the original layout);
- by a token budget (`max_tokens>0`): rows, whole groups of `multiple` at a time, longest first,
  are added to a micro-batch while the tokens it computes stay within the budget (and its rows
  within `rows`). Padded
  (`packed=False`), the sort puts rows of similar length together so little padding is left;
  packed (`packed=True`), almost none: each micro-batch's sequences are laid end to end in
  packed rows (first-fit decreasing, rows 1-2x its longest sequence, chosen per micro-batch), position ids restart
  at 0 for each sequence and attention stays inside each sequence (transformers' packed-sequence
  path: with no attention mask it derives a block-diagonal causal mask from the position ids).

Notation: N rows, P prompt columns, T response columns; a row of the batch is
[left-padding | prompt | response | right-padding].
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from primekit import distributed as dist
from primekit.rollout.base import RolloutBatch


class Layout(NamedTuple):
    """How the rows of one pass are cut into micro-batches (one forward each).

    rows: rows per micro-batch (rounded down to whole groups); with a token budget, at most.
    multiple: micro-batches keep whole runs of this many consecutive rows (groups of K).
    max_tokens: > 0: also a token budget per micro-batch, rows longest first (a group longer
        than the budget gets a micro-batch of its own); tokens computed, padding included.
    packed: padding-free packed rows (see the module docstring); needs max_tokens > 0.

    A tuple, so that `batch_logprobs(model, batch, *layout)` reads naturally.
    """

    rows: int
    multiple: int = 1
    max_tokens: int = 0
    packed: bool = False


@dataclass
class MicroBatch:
    """Some rows of a batch, as the model's inputs.

    rows: [n] long, indices into the batch.
    response_len: t, the longest response among the rows; outputs are [n, t].
    Padded layout: input_ids / attention_mask [n, p + t], the rows trimmed to their longest prompt
        p and response t; the response occupies the last t columns; position_ids None (derived
        from the mask).
    Packed layout: input_ids / position_ids [r, C], r packed rows of C columns holding the n
        sequences end to end (trailing columns of a row are padding, a segment of their own);
        attention_mask None; predict_index [n, t], the flat index into the r*C columns of the
        column whose hidden state predicts response token j of row i (-1 on response padding).
    response_mask: [n, t] bool, the rows' valid response tokens.
    """

    rows: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    response_len: int
    response_mask: torch.Tensor
    position_ids: torch.Tensor | None = None
    predict_index: torch.Tensor | None = None

    @property
    def packed(self) -> bool:
        return self.predict_index is not None

    @property
    def tokens_computed(self) -> int:
        """Columns the forward computes, padding included."""
        return self.input_ids.numel()

    def to(self, device: torch.device | str) -> MicroBatch:
        def move(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.to(device)

        return MicroBatch(self.rows, self.input_ids.to(device), move(self.attention_mask),
                          self.response_len, self.response_mask.to(device),
                          move(self.position_ids), move(self.predict_index))


def row_chunks(n: int, size: int, multiple: int = 1) -> Iterator[torch.Tensor]:
    """Consecutive index chunks of `size` rows, `size` rounded down to a multiple of `multiple`
    (at least one multiple), so chunks of a group-by-group layout keep whole groups."""
    if size < 1 or multiple < 1:
        raise ValueError(f"size and multiple must be >= 1, got size={size} multiple={multiple}")
    size = max(multiple, size // multiple * multiple)
    for lo in range(0, n, size):
        yield torch.arange(lo, min(lo + size, n))


def micro_batch(batch: RolloutBatch, rows: torch.Tensor) -> MicroBatch:
    """The padded model inputs of `rows`, trimmed to the longest prompt and response among them.

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
    return MicroBatch(rows, input_ids, attention.long(), t, response_mask[:, :t].bool())


# A packed row holds C columns, C chosen per micro-batch among these multiples of its longest
# sequence: the one that computes the fewest columns (packed rows x C), ties to the shorter row.
# Why choose: with sdpa on a CPU the block-diagonal mask is dense, so a row's attention costs C^2
# whatever it holds (one row for a whole 64-row micro-batch was 4.9x slower than padded rows,
# docs/performance.md), and no single factor fits every batch: on a synthetic batch of mixed
# lengths 1.5x left 9% padding where 1x left 22%, but on the demo's real batches (lengths much
# alike) a fixed 1.5x left 26.6% against 17.4% for trimmed padded rows. Capped at 2x, so the
# attention a row pays stays within 4x that of the longest sequence alone.
PACKED_ROW_FACTORS: tuple[float, ...] = (1.0, 1.25, 1.5, 1.75, 2.0)


def first_fit_decreasing(lengths: list[int], width: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Place sequences of `lengths` (each <= width) in rows of `width` columns, longest first,
    each into the first row with room. Returns the rows' free columns [r] and each sequence's
    (row, first column) [n]."""
    free: list[int] = []
    place: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    shortest = min(lengths)
    open_rows: list[int] = []  # rows that can still take the shortest sequence, in order
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((r for r in open_rows if free[r] >= lengths[i]), None)
        if r is None:
            r = len(free)
            free.append(width)
            open_rows.append(r)
        place[i] = (r, width - free[r])
        free[r] -= lengths[i]
        if free[r] < shortest:
            open_rows.remove(r)
    return free, place


def packed_row_width(lengths: list[int], factors: tuple[float, ...] = PACKED_ROW_FACTORS) -> int:
    """C for packed rows of these sequence lengths: among int(factor x longest) for each factor
    (at most the total length), the width whose first-fit-decreasing packing computes the fewest
    columns (rows x C); ties go to the shorter row (less attention per row)."""
    return _packed_row_width(tuple(sorted(lengths)), factors)


@functools.lru_cache(maxsize=256)  # every pass over a batch packs the same micro-batches again
def _packed_row_width(lengths: tuple[int, ...], factors: tuple[float, ...]) -> int:
    longest, total = lengths[-1], sum(lengths)
    widths = sorted({min(max(int(longest * f), longest), total) for f in factors})
    return min(widths, key=lambda c: (len(first_fit_decreasing(list(lengths), c)[0]) * c, c))


def packed_micro_batch(batch: RolloutBatch, rows: torch.Tensor) -> MicroBatch:
    """The padding-free model inputs of `rows`: their sequences (prompt + response, no padding)
    placed first-fit decreasing in packed rows of `packed_row_width` columns."""
    prompt_mask = batch.prompt_mask[rows].bool()  # [n, P], left-padded
    response_mask = batch.response_mask[rows].bool()  # [n, T], right-padded
    p_len, t_len = prompt_mask.sum(1), response_mask.sum(1)  # [n]
    lengths = (p_len + t_len).tolist()
    C = packed_row_width(lengths, PACKED_ROW_FACTORS)  # read at call time (benchmarks vary it)
    free, place = first_fit_decreasing(lengths, C)
    # Each sequence's first flat column r * C + c, and its tokens end to end: the valid prompt
    # tokens then the valid response tokens of each row, rows in order ([S] in all).
    start = torch.tensor([r * C + c for r, c in place])  # [n]
    tokens = torch.cat([batch.prompt_ids[rows], batch.response_ids[rows]], 1)[
        torch.cat([prompt_mask, response_mask], 1)]  # [S]
    seq_len = p_len + t_len  # [n]
    offset = torch.arange(len(tokens)) - torch.repeat_interleave(
        seq_len.cumsum(0) - seq_len, seq_len)  # [S], each token's position in its sequence
    column = torch.repeat_interleave(start, seq_len) + offset  # [S], flat columns of [r, C]
    # Padding columns are never attended to from a sequence nor read: any id will do.
    input_ids = torch.zeros(len(free) * C, dtype=batch.prompt_ids.dtype)  # [r*C]
    input_ids[column] = tokens
    position_ids = torch.arange(C).repeat(len(free))  # [r*C]; trailing padding: own segment
    position_ids[column] = offset
    position_ids = position_ids.view(len(free), C)
    # Padding after the last sequence of a row restarts at 0, so it is a segment of its own.
    for r, f in enumerate(free):
        if f:
            position_ids[r, C - f :] = torch.arange(f)
    # Response token j of sequence i sits at column start + p + j, predicted by the one before.
    t = max(int(t_len.max()), 1)
    j = torch.arange(t)  # [t]
    predict_index = torch.where(j < t_len[:, None], (start + p_len - 1)[:, None] + j,
                                -1)  # [n, t]
    return MicroBatch(rows, input_ids.view(len(free), C), None, t, response_mask[:, :t],
                      position_ids, predict_index)


def _token_budget_chunks(batch: RolloutBatch, rows: torch.Tensor, layout: Layout,
                         ) -> Iterator[torch.Tensor]:
    """Whole groups of `layout.multiple` rows, longest group first, gathered into chunks whose
    tokens computed stay within `layout.max_tokens` (a single group may exceed it alone) and
    whose rows stay within `layout.rows` (rounded down to whole groups, at least one).

    Padded, a chunk's columns are its rows times its longest prompt and response. Packed, groups
    are added while their tokens fit, and then, since the packed rows' trailing padding comes on
    top, the chunk's packed columns (rows x width of `packed_micro_batch`) are counted and its
    shortest groups handed to the next chunk until they fit too: the budget bounds the columns
    a forward computes in both layouts, which is what memory follows (`primekit plan`)."""
    k = layout.multiple
    max_groups = max(1, layout.rows // k)
    if len(rows) % k:
        raise ValueError(f"{len(rows)} rows do not split into whole groups of {k}")
    p_len = batch.prompt_mask[rows].sum(1)  # [n]
    t_len = batch.response_mask[rows].sum(1)  # [n]
    groups = rows.view(-1, k)  # [n/k, k]
    g_p, g_t = p_len.view(-1, k), t_len.view(-1, k)  # [n/k, k]
    # Per group, as Python ints (one conversion each, not one per group): its longest prompt,
    # longest response, longest sequence, total tokens and its sequences' lengths.
    p_max, t_max = g_p.max(1).values.tolist(), g_t.max(1).values.tolist()
    g_len, g_sum = (g_p + g_t).max(1).values.tolist(), (g_p + g_t).sum(1).tolist()
    g_seqs = (g_p + g_t).tolist()  # [n/k][k]
    # Sorted by length (ties by position, so the order is deterministic).
    pending = collections.deque(sorted(range(len(groups)), key=lambda g: (-g_len[g], g)))
    while pending:
        chunk: list[int] = []
        max_p = max_t = total = 0
        while pending:
            g = pending[0]
            gp, gt, gl = p_max[g], t_max[g], g_sum[g]
            if layout.packed:
                cost = total + gl
            else:
                cost = (len(chunk) + 1) * k * (max(max_p, gp) + max(max_t, gt))
            if chunk and (cost > layout.max_tokens or len(chunk) == max_groups):
                break
            chunk.append(pending.popleft())
            max_p, max_t, total = max(max_p, gp), max(max_t, gt), total + gl
        if layout.packed:
            while len(chunk) > 1 and packed_columns(
                    [n for g in chunk for n in g_seqs[g]]) > layout.max_tokens:
                pending.appendleft(chunk.pop())
        yield groups[chunk].reshape(-1)


def packed_columns(lengths: list[int]) -> int:
    """Columns (padding included) of `packed_micro_batch` over sequences of these lengths."""
    width = packed_row_width(lengths, PACKED_ROW_FACTORS)
    return len(first_fit_decreasing(lengths, width)[0]) * width


def iter_layout(batch: RolloutBatch, layout: Layout,
                rows: torch.Tensor | None = None) -> Iterator[MicroBatch]:
    """The micro-batches of `layout` over `rows` (default: all rows; a mini-batch's indices).

    The micro-batches' `rows` index the whole batch, whatever order they come in.
    """
    if layout.packed and layout.max_tokens <= 0:
        raise ValueError("a packed layout needs a token budget (max_tokens > 0)")
    rows = torch.arange(len(batch.responses)) if rows is None else rows
    if layout.max_tokens <= 0:
        for chunk in row_chunks(len(rows), layout.rows, layout.multiple):
            yield micro_batch(batch, rows[chunk])
        return
    build = packed_micro_batch if layout.packed else micro_batch
    chunks = list(_token_budget_chunks(batch, rows, layout))
    if dist.world_size() > 1:
        # Under torchrun every model is FSDP2-sharded: each micro-batch's forward (and backward)
        # all-gathers each layer's weights with the other ranks, so all ranks must run the same
        # number of them. A token budget cuts each rank's rows into its own count; ranks with
        # fewer split theirs up to the most any rank needs. Every rank calls this together, with
        # as many rows as the others (trainer/collect.py keeps as many groups on each rank).
        most = int(dist.all_reduce_max(torch.tensor(len(chunks))))
        chunks = split_to_count(chunks, most, layout.multiple)
    for chunk in chunks:
        yield build(batch, chunk)


def split_to_count(chunks: list[torch.Tensor], count: int, multiple: int = 1,
                   ) -> list[torch.Tensor]:
    """`chunks` (row indices, whole groups of `multiple` rows) split until there are `count`:
    each time the chunk with the most groups (the first such) into its first and second half
    of groups, in place, so the order and every chunk's token budget hold. A split chunk of g
    groups leaves ceil(g/2) and floor(g/2).

    Raises ValueError if the chunks hold fewer than `count` groups.
    """
    sizes = [len(c) // multiple for c in chunks]  # groups per chunk
    if sum(sizes) < count:
        raise ValueError(f"{sum(sizes)} groups cannot fill {count} micro-batches")
    chunks = list(chunks)
    while len(chunks) < count:
        i = max(range(len(chunks)), key=lambda j: (sizes[j], -j))
        half = (sizes[i] + 1) // 2 * multiple  # rows in the first half
        chunks[i : i + 1] = [chunks[i][:half], chunks[i][half:]]
        sizes[i : i + 1] = [(sizes[i] + 1) // 2, sizes[i] // 2]
    return chunks


def iter_micro_batches(batch: RolloutBatch, size: int, multiple: int = 1,
                       rows: torch.Tensor | None = None) -> Iterator[MicroBatch]:
    """Padded micro-batches of `size` rows (a multiple of `multiple`) over `rows` (default: all
    rows): `iter_layout` with `Layout(size, multiple)`."""
    yield from iter_layout(batch, Layout(size, multiple), rows)
