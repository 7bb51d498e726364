"""Token-budget micro-batches under torchrun: every rank cuts as many as the rank that needs the
most (each micro-batch's forward is a collective of the FSDP2-sharded model)."""

from __future__ import annotations

import pytest
import torch

from primekit.rollout.batching import Layout, iter_layout, split_to_count
from tests.models.test_packing import _batch
from tests.spawn import run_processes


def test_split_to_count_by_hand():
    # One chunk of 4 groups of 2 rows. To 3 chunks: the 4 groups split 2 + 2, then the first
    # (the first of the largest) 1 + 1: order kept, every row once.
    out = split_to_count([torch.arange(8)], 3, multiple=2)
    assert [c.tolist() for c in out] == [[0, 1], [2, 3], [4, 5, 6, 7]]
    # Chunks of 3 and 1 groups of one row to 4: 3 -> 2 + 1, then 2 -> 1 + 1.
    out = split_to_count([torch.tensor([5, 6, 7]), torch.tensor([9])], 4)
    assert [c.tolist() for c in out] == [[5], [6], [7], [9]]
    # Already enough: unchanged.
    assert [c.tolist() for c in split_to_count([torch.arange(4)], 1, 2)] == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="2 groups cannot fill 3"):
        split_to_count([torch.arange(4)], 3, multiple=2)


def _worker(rank: int, world: int, init_file: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world)
    try:
        # Groups of 2 rows, 4 groups on each rank. Rank 0: sequences of 2 + 3 = 5 tokens, 40 in
        # all, packed into 40 columns: one micro-batch within a budget of 40. Rank 1: 2 + 8 =
        # 10 tokens, 20 a group: two groups per micro-batch, so two micro-batches.
        n = 3 if rank == 0 else 8
        b = _batch([[4, 5]] * 8, [[7] * n] * 8)
        chunks = [mb.rows.tolist() for mb in iter_layout(b, Layout(99, 2, 40, packed=True))]
        torch.save(chunks, f"{out}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_ranks_cut_the_same_number_of_micro_batches(tmp_path):
    alone = [mb.rows.tolist() for mb in iter_layout(_batch([[4, 5]] * 8, [[7] * 3] * 8),
                                                      Layout(99, 2, 40, packed=True))]
    assert alone == [list(range(8))]  # in one process rank 0's rows are one micro-batch
    run_processes(_worker, (2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, timeout_s=120,
                  what="2-process iter_layout")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    # Rank 1 needs two; rank 0 splits its one (4 groups) into 2 + 2 groups.
    assert r1 == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert r0 == [[0, 1, 2, 3], [4, 5, 6, 7]]
