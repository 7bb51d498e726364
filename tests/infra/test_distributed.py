"""Distributed helpers at world size 1 and in a real 2-process gloo group."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from primekit import distributed as dist
from primekit.trainer import checkpoint as ckpt
from tests.spawn import run_processes


def test_single_process_defaults():
    assert (dist.rank(), dist.world_size(), dist.is_main()) == (0, 1, True)
    dist.barrier()
    assert dist.shard_indices(5) == [0, 1, 2, 3, 4]
    assert dist.shard(["a", "b"]) == ["a", "b"]
    assert dist.shard_groups(3, group_size=2) == [0, 1, 2, 3, 4, 5]
    assert dist.broadcast_object({"x": 1}) == {"x": 1}
    assert dist.all_gather_object(7) == [7]
    out = dist.reduce_metrics({"a": torch.tensor(0.5), "b": float("nan"), "c": 3}, op="sum")
    assert out["a"] == 0.5 and math.isnan(out["b"]) and out["c"] == 3.0
    assert all(type(v) is float for v in out.values())


def test_shard_sizes_by_hand():
    # 10 items over 4 ranks: divmod(10, 4) = (2, 2), so ranks 0 and 1 take 3, ranks 2 and 3 take 2.
    shards = [dist.shard_indices(10, rank=r, world_size=4) for r in range(4)]
    assert shards == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    # 5 groups of K=4 over 2 ranks: groups {0,1,2} and {3,4}; rank 1 holds samples 3*4 .. 5*4-1.
    assert dist.shard_groups(5, group_size=4, rank=1, world_size=2) == list(range(12, 20))
    assert dist.shard_groups(5, rank=0, world_size=2) == [0, 1, 2]
    assert dist.shard([], rank=2, world_size=3) == []


def test_shards_partition_the_range_on_random_inputs():
    rng = random.Random(0)
    for _ in range(200):
        n, w, k = rng.randrange(0, 50), rng.randrange(1, 9), rng.randrange(1, 5)
        shards = [dist.shard_indices(n, rank=r, world_size=w) for r in range(w)]
        assert [i for s in shards for i in s] == list(range(n))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        items = [f"item{i}" for i in range(n)]
        assert [x for r in range(w) for x in dist.shard(items, rank=r, world_size=w)] == items
        samples = [dist.shard_groups(n, group_size=k, rank=r, world_size=w) for r in range(w)]
        assert [i for s in samples for i in s] == list(range(n * k))
        for s in samples:  # whole groups only
            assert len(s) % k == 0 and all(
                i // k == s[j * k] // k for j in range(len(s) // k) for i in s[j * k : (j + 1) * k]
            )


def test_bad_arguments():
    with pytest.raises(ValueError, match="op must be one of"):
        dist.reduce_metrics({"a": 1.0}, op="median")
    with pytest.raises(ValueError, match="metric 'a' must be a number"):
        dist.reduce_metrics({"a": "x"})
    with pytest.raises(ValueError, match="metric 'v' must be a scalar"):
        dist.reduce_metrics({"v": torch.ones(3)})
    with pytest.raises(ValueError, match="rank must be in"):
        dist.shard_indices(4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        dist.shard_indices(4, rank=0, world_size=0)
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        dist.shard_groups(4, group_size=0)
    with pytest.raises(ValueError, match="n must be >= 0"):
        dist.shard_indices(-1)


def _worker(rank: int, world: int, init_file: str, run_dir: str) -> None:
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        assert (dist.rank(), dist.world_size(), dist.is_main()) == (rank, world, rank == 0)

        # 5 groups of K=4: rank 0 holds groups 0-2 (samples 0-11), rank 1 groups 3-4 (12-19).
        mine = dist.shard_groups(5, group_size=4)
        everyone = dist.all_gather_object(mine)
        assert everyone == [list(range(0, 12)), list(range(12, 20))]

        local = (
            {"a": 1.0, "prm/acc": float("nan"), "tokens": 10, "only0": 5.0, "nan": math.nan}
            if rank == 0
            else {"a": torch.tensor(3.0), "prm/acc": 0.5, "tokens": 32, "nan": math.nan}
        )
        mean = dist.reduce_metrics(local, sum_keys=["tokens"])
        # a: (1+3)/2 = 2; prm/acc: NaN on rank 0, so only rank 1's 0.5 counts; tokens: 10+32;
        # only0: present on rank 0 alone; nan: NaN everywhere stays NaN.
        assert list(mean) == ["a", "nan", "only0", "prm/acc", "tokens"]
        assert (mean["a"], mean["prm/acc"], mean["tokens"], mean["only0"]) == (2.0, 0.5, 42.0, 5.0)
        assert math.isnan(mean["nan"])
        assert dist.reduce_metrics(local, op="sum")["a"] == 4.0
        assert dist.reduce_metrics(local, op="max")["a"] == 3.0
        assert dist.reduce_metrics(local, op="min")["prm/acc"] == 0.5

        assert dist.broadcast_object({"from": rank}) == {"from": 0}
        assert dist.broadcast_object(rank, src=1) == 1

        # Checkpoint: each rank keeps its own RNG stream across save/load.
        torch.manual_seed(100 + rank)
        random.seed(100 + rank)
        gen = torch.Generator().manual_seed(7 + rank)
        model = torch.nn.Linear(2, 2)
        path = ckpt.save_checkpoint(
            Path(run_dir), 1, models={"policy": (model, None)}, generators={"g": gen}, state={}
        )
        expected = (torch.rand(2).tolist(), random.random(), torch.rand(2, generator=gen).tolist())
        torch.manual_seed(0), random.seed(0), gen.manual_seed(0)
        assert ckpt.load_checkpoint(path, models={"policy": model}, generators={"g": gen}) == {
            "step": 1
        }
        got = (torch.rand(2).tolist(), random.random(), torch.rand(2, generator=gen).tolist())
        assert got == expected
        assert dist.all_gather_object(got)[0] != dist.all_gather_object(got)[1]

        # A failed write on the main rank must fail every rank instead of hanging them.
        if rank == 0:
            ckpt._write = _failing_write
        try:
            ckpt.save_checkpoint(Path(run_dir), 2, state={})
        except OSError as e:
            assert rank == 0 and "disk full" in str(e)
        except RuntimeError as e:
            assert rank == 1 and "disk full" in str(e)
        else:
            raise AssertionError("save_checkpoint should have failed")
        assert ckpt.latest_checkpoint(Path(run_dir)) == path
        torch.distributed.barrier()  # neither rank tears the group down while the other uses it
        (Path(run_dir) / f"checked-{rank}").touch()
    finally:
        torch.distributed.destroy_process_group()
    (Path(run_dir) / f"torn-down-{rank}").touch()


def _failing_write(*args, **kwargs):
    raise OSError("disk full")


def test_two_process_gloo_group(tmp_path):
    # Rarely, on a loaded 2-core machine, a rank dies of SIGABRT ("terminate called without an
    # active exception", from torch's C++ side): 2 of 311 runs of this test with one or two cores
    # kept busy (2026-12-06). Every rank waiting for the others' teardown before exiting did not
    # prevent it (1 abort in 271 runs with the wait, 1 in 40 without). It came after both ranks'
    # torn-down markers, i.e. at exit, which tests/spawn.py now skips (os._exit once `fn` has
    # returned). Should it happen again, the failure says how far each rank got.
    run = tmp_path / "run"
    try:
        run_processes(_worker, (2, str(tmp_path / "store"), str(run)), nprocs=2,
                      timeout_s=120, what="2-process gloo test")
    except Exception as e:
        reached = sorted(p.name for p in run.glob("*-[01]")) if run.exists() else []
        raise AssertionError(f"{e}; markers of the ranks' progress: {reached or 'none'} "
                             "(checked-R: rank R passed every check; torn-down-R: rank R "
                             "destroyed its group)") from e
