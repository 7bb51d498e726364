"""The RL trainer in a real 2-process gloo group: nothing may assume a single process.

Each rank rolls out its own prompts, the gradients are all-reduced, metrics are reduced across
ranks and only rank 0 writes files. Replicas must therefore stay bit-identical, report identical
metrics, and never deadlock, even when the online filter keeps different numbers of groups on
different ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from primekit.config import load_config
from primekit.verifiers.base import Verdict
from tests.spawn import run_processes
from tests.trainer.conftest import CONFIG, small_overrides


class _Parity:
    """Correct when the response length is even; always wrong on the problems in `fail`, whose
    groups then never pass the online filter."""

    def __init__(self, fail: frozenset[str] = frozenset()):
        self.fail = fail

    def verify(self, response, problem):
        if problem.id in self.fail:
            return Verdict.incorrect()
        return Verdict.correct() if len(response) % 2 == 0 else Verdict.incorrect()

    def verify_batch(self, responses, problems):
        return [self.verify(r, p) for r, p in zip(responses, problems)]


def _worker(rank: int, world: int, init_file: str, policy: str, run_dir: str, out: str) -> None:
    from primekit.factory import build_rl_trainer

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world)
    try:
        torch.set_num_threads(1)
        cfg = load_config(CONFIG, small_overrides(Path(policy), Path(run_dir)) + [
            "train.steps=2", "train.save_every=1", "eval.k=1"])
        trainer = build_rl_trainer(cfg, verifier=_Parity())
        first_prompts = [trainer.train_problems[i].prompt for i in trainer.sampler.take(4)]
        trainer.sampler.load_state_dict({"epoch": 0, "position": 0})
        initial = [p.detach().clone() for p in trainer.policy.parameters()]
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
        uneven = trainer.train_step()
        torch.save({
            "first_prompts": first_prompts,
            "history": history,
            "uneven": uneven,
            "policy_changed": any(not torch.equal(a, b)
                                  for a, b in zip(initial, trainer.policy.parameters())),
            "policy": {k: v.clone() for k, v in trainer.policy.state_dict().items()},
            "prm": {k: v.clone() for k, v in trainer.rewarder.model.state_dict().items()},
        }, Path(out) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_two_ranks_stay_identical_and_only_rank0_writes(sft_model_dir, tmp_path):
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    run_processes(_worker, (2, str(tmp_path / "store"), str(sft_model_dir), str(run_dir),
                            str(out)), nprocs=2, timeout_s=300, what="2-process RL trainer")
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1))

    # Each rank drew its own prompts (PromptSampler strides the epoch's permutation by rank).
    assert not set(r0["first_prompts"]) & set(r1["first_prompts"])
    # Gradients are all-reduced, so the replicas moved, and moved identically.
    assert r0["policy_changed"] and r1["policy_changed"]
    for name in ("policy", "prm"):
        for key in r0[name]:
            assert torch.equal(r0[name][key], r1[name][key]), (name, key)
    # Metrics are reduced across ranks: both ranks hold the same history.
    assert len(r0["history"]) == 3  # two steps and the final evaluation
    for a, b in zip(r0["history"], r1["history"]):
        stable = [k for k in a if not k.startswith(("timing/", "throughput/", "eval/wall"))]
        assert {k: a[k] for k in stable} == {k: b[k] for k in stable}
    # Uneven filtering: one round of 2 prompts per rank (4 per step over 2 ranks;
    # filter/keep_rate is the rank's own share of kept groups); both ranks trained on the smaller
    # kept count, without a deadlock.
    kept = [round(r["uneven"]["filter/keep_rate"] * 2) for r in (r0, r1)]
    assert kept[0] != kept[1] and min(kept) > 0, kept
    assert r0["uneven"]["filter/groups_kept"] == r1["uneven"]["filter/groups_kept"] == min(kept)
    # Only rank 0 wrote: one metrics file with one line per logged step, both checkpoints.
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == [
        "step_000001", "step_000002"]


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
    assert (run_dir / "checkpoints" / "step_000002" / "policy" / "model.safetensors").exists()
    # sft is single-process: refused with a clear message rather than run twice into one dir.
    refused = subprocess.run([sys.executable, "-m", "primekit.cli", "sft", "--config", str(CONFIG)],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "WORLD_SIZE": "2"})
    assert refused.returncode == 2
    assert "runs in a single process" in refused.stderr
