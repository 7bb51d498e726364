"""The RL trainer in a real 2-process gloo group, with every model FSDP2-sharded.

The claims: 2 ranks x half the batch train the models as 1 process x the whole batch does; each
rank stores about half of each trained model's parameters and optimiser state; metrics are
reduced across ranks, only rank 0 writes files, and uneven filtering never deadlocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from primekit.config import load_config
from primekit.rollout.base import concat_batches
from primekit.verifiers.base import Verdict
from tests.spawn import run_processes
from tests.trainer.conftest import CONFIG, small_overrides

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # max |param difference| between 2 sharded ranks and 1 process (seen 1.6e-6)


class _Parity:
    """Right and wrong in turn for each problem (its 1st, 3rd, ... sample right), whatever the
    response says, so that every group of two or more samples has both outcomes and passes the
    online filter on any machine (a rule on the sampled text made the filter's counts hinge on
    the CPU's float rounding); always wrong on the problems in `fail`, whose groups then never
    pass. A problem's samples are graded on one rank in the same order in both layouts, so one
    process and two ranks see the same outcomes."""

    def __init__(self, fail: frozenset[str] = frozenset()):
        self.fail = fail
        self.seen: dict[str, int] = {}

    def verify(self, response, problem):
        if problem.id in self.fail:
            return Verdict.incorrect()
        n = self.seen[problem.id] = self.seen.get(problem.id, -1) + 1
        return Verdict.correct() if n % 2 == 0 else Verdict.incorrect()

    def verify_batch(self, responses, problems):
        return [self.verify(r, p) for r, p in zip(responses, problems)]


class PerPromptSeeded:
    """Wraps an engine so that each prompt's K samples depend only on the prompt and the call
    count, not on which rank draws it or on the other prompts of the batch."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def sync_weights(self, model):
        self.inner.sync_weights(model)

    def generate(self, prompt_ids, params, generator=None):
        self.calls += 1
        parts, i = [], 0
        while i < len(prompt_ids):
            j = i
            while j < len(prompt_ids) and prompt_ids[j] == prompt_ids[i]:
                j += 1
            seed = zlib.crc32(bytes(str(prompt_ids[i]), "utf8")) * 1000 + self.calls
            parts.append(self.inner.generate(prompt_ids[i:j], params,
                                             torch.Generator().manual_seed(seed)))
            i = j
        return concat_batches(parts, pad_id=self.inner.pad_id)


def _overrides(policy: str, run_dir: str) -> list[str]:
    return small_overrides(Path(policy), Path(run_dir)) + ["train.steps=2", "eval.k=1"]


def _state(trainer) -> dict:
    """Full weights of the trained models (all-gathered: every rank calls this)."""
    from primekit.distributed import full_state_dict

    return {"policy": {k: v.clone() for k, v in full_state_dict(trainer.policy).items()},
            "prm": {k: v.clone() for k, v in full_state_dict(trainer.rewarder.model).items()}}


def _bytes(trainer) -> dict:
    from primekit.models.parallel import local_nbytes, optimizer_nbytes

    return {"policy": local_nbytes(trainer.policy.parameters()),
            "policy_opt": optimizer_nbytes(trainer.policy_opt),
            "prm": local_nbytes(trainer.rewarder.model.parameters()),
            "prm_opt": optimizer_nbytes(trainer.rewarder.optimizer),
            "ref": local_nbytes(trainer.ref.parameters())}


def _two_steps(trainer) -> list[dict]:
    trainer.engine = PerPromptSeeded(trainer.engine)
    return [trainer.train_step() for _ in range(2)]


def _worker(rank: int, world: int, init_file: str, policy: str, run_dir: str, out: str) -> None:
    from primekit import distributed as dist
    from primekit.factory import build_rl_trainer

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world)
    try:
        torch.set_num_threads(1)
        cfg = load_config(CONFIG, _overrides(policy, run_dir))
        trainer = build_rl_trainer(cfg, verifier=_Parity())
        steps = [dist.reduce_metrics(m) for m in _two_steps(trainer)]
        result = {"steps": steps, "state": _state(trainer), "bytes": _bytes(trainer)}

        # Then the loop as a user runs it: one more step, final eval, a sharded save, export.
        trainer.engine = trainer.engine.inner
        trainer.step, trainer.cfg.train.steps = 2, 3
        history = trainer.train()

        # One more step in which the filter keeps fewer groups on rank 1 than on rank 0.
        trainer.cfg.filter.enabled = True
        trainer.cfg.filter.max_rounds = 1
        trainer.cfg.filter.oversample = 1.0
        state = trainer.sampler.state_dict()
        upcoming = trainer.sampler.take(1)  # rank 1 fails the first prompt it is about to draw
        trainer.sampler.load_state_dict(state)
        trainer.verifier = _Parity(frozenset(
            trainer.train_problems[i].id for i in upcoming) if rank == 1 else frozenset())
        result.update(history=history, uneven=trainer.train_step())
        # The next step starts with the group rank 0 kept beyond that batch (carried), rank 1
        # with none: the carried rows' old log-probs are recomputed by a sharded forward, which
        # both ranks must run (one rank alone left the other waiting, then gloo aborted).
        result["carried"] = trainer.train_step()
        torch.save(result, Path(out) / f"rank{rank}.pt")
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


def test_two_sharded_ranks_train_as_one_process(sft_model_dir, tmp_path):
    from primekit.factory import build_rl_trainer

    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    run_processes(_worker, (2, str(tmp_path / "store"), str(sft_model_dir), str(run_dir),
                            str(out)), nprocs=2, timeout_s=400, what="2-process RL trainer")
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1))

    # The same two steps in one process without sharding, on the whole batch.
    cfg = load_config(CONFIG, _overrides(str(sft_model_dir), str(tmp_path / "single")))
    single = build_rl_trainer(cfg, verifier=_Parity())
    one_steps = _two_steps(single)
    one = _state(single)
    one_bytes = _bytes(single)

    # Same parameters: ranks see the batch in another order and split (sums in another order),
    # so float32 rounding differs; AdamW normalises updates, so a rounding-level gradient
    # difference can move a weight by up to ~lr per step. Measured: see TOLERANCE.
    from safetensors.torch import load_file

    initial = load_file(str(sft_model_dir / "model.safetensors"))
    for name in ("policy", "prm"):
        diff = max((v - r0["state"][name][k]).abs().max().item() for k, v in one[name].items())
        moved = max((v - initial[k]).abs().max().item() for k, v in one[name].items()
                    if k in initial)
        print(f"{name}: max |1 process - 2 ranks| = {diff:.3g}, max move = {moved:.3g}")
        assert moved > 20 * TOLERANCE  # the comparison is not between two untouched models
        assert diff < TOLERANCE, (name, diff)
    # Metrics agree too (all the exact ones are compared in test_distributed_rewards.py; the
    # policy loss is a mean of per-rank micro-batch values, docs/metrics.md "Across ranks").
    for a, b in zip(one_steps, r0["steps"]):
        for key in ("reward/outcome_mean", "prm/loss", "prm/acc_abs"):
            assert abs(a[key] - b[key]) < 1e-4, (key, a[key], b[key])

    # Each rank holds half of every sharded model's bytes, measured from the local shards (FSDP2
    # pads a dim-0 that does not split evenly, e.g. the 259-row embedding, by a row or so).
    for key in ("policy", "policy_opt", "prm", "prm_opt", "ref"):
        half = one_bytes[key] / 2
        for r in (r0, r1):
            assert abs(r["bytes"][key] - half) / half < 0.01, (key, r["bytes"][key], half)
        assert r0["bytes"][key] + r1["bytes"][key] == pytest.approx(one_bytes[key], rel=1e-3)

    # Metrics are reduced across ranks: both ranks hold the same history.
    assert len(r0["history"]) == 2  # step 3 and the final evaluation
    for a, b in zip(r0["history"], r1["history"]):
        stable = [k for k in a if not k.startswith(("timing/", "throughput/", "eval/wall"))]
        assert {k: a[k] for k in stable} == {k: b[k] for k in stable}
    # Uneven filtering: one round of 2 prompts per rank, and rank 1 fails one of its prompts, so
    # 3 of the 4 groups sampled pass (filter/keep_rate is over all ranks); both ranks trained on
    # the smaller kept count, rank 1's 1, without a deadlock.
    assert r0["uneven"]["filter/keep_rate"] == r1["uneven"]["filter/keep_rate"] == 0.75
    assert r0["uneven"]["filter/groups_kept"] == r1["uneven"]["filter/groups_kept"] == 1
    # Rank 0's surplus group came into the next step (the count is summed over ranks).
    assert r0["carried"]["filter/carried_in"] == r1["carried"]["filter/carried_in"] == 1
    assert r0["carried"]["filter/groups_kept"] >= 1
    # Only rank 0 wrote: one metrics file, one sharded checkpoint with both ranks' shards, and
    # the exported final models.
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [3, 3]
    ckpt = run_dir / "checkpoints" / "step_000003" / "weights"
    assert sorted(p.name for p in ckpt.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (run_dir / "final" / "policy" / "model.safetensors").is_file()


def test_cli_train_under_torchrun(sft_model_dir, tmp_path):
    # `torchrun --nproc_per_node 2 -m primekit.cli train ...` on CPUs: the CLI joins a gloo group
    # from the environment, both ranks train, rank 0 alone writes the run directory.
    run_dir = tmp_path / "run"
    overrides = small_overrides(sft_model_dir, run_dir) + ["train.save_every=1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "primekit.cli", "train", "--config", str(CONFIG), *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 2]
    assert (run_dir / "checkpoints" / "step_000002" / "weights" / ".metadata").is_file()
    assert (run_dir / "final" / "policy" / "model.safetensors").is_file()
    # sft is single-process: refused with a clear message rather than run twice into one dir.
    refused = subprocess.run([sys.executable, "-m", "primekit.cli", "sft", "--config", str(CONFIG)],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "WORLD_SIZE": "2"})
    assert refused.returncode == 2
    assert "runs in a single process" in refused.stderr
