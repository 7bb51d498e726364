"""The CUDA paths, run only where a GPU is present (CI has none): bf16 on a real device, NCCL
over 2 GPUs, and the memory plan against torch.cuda's measured peak. Marked `gpu`; the default
and slow tiers skip them. Run with `python -m pytest -m gpu -s`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.trainer.conftest import CONFIG, small_overrides

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_bf16_prime_step_on_cuda_keeps_fp32_master_weights(rl_config):
    from primekit.factory import build_rl_trainer

    trainer = build_rl_trainer(rl_config("model.dtype=bfloat16", "train.device=cuda"))
    torch.cuda.reset_peak_memory_stats()
    metrics = trainer.train_step()
    print(f"bf16 PRIME step on {torch.cuda.get_device_name()}: {metrics['timing/step']:.2f} s, "
          f"peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
    assert all(math.isfinite(v) for v in metrics.values())
    assert all(p.dtype == torch.float32 and p.is_cuda for p in trainer.policy.parameters())
    assert next(trainer.engine.model.parameters()).dtype == torch.bfloat16


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_nccl_two_ranks_train_and_save(sft_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "primekit.cli", "train", "--config", str(CONFIG),
           *small_overrides(sft_model_dir, run_dir), "train.device=cuda", "model.dtype=bfloat16",
           "train.save_every=1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 2]


def test_plan_against_the_measured_peak(rl_config, sft_model_dir):
    from primekit.factory import build_rl_trainer
    from primekit.plan import build_plan, logprob_chunk, read_model_shape

    cfg = rl_config("train.device=cuda")
    trainer = build_rl_trainer(cfg)
    torch.cuda.reset_peak_memory_stats()
    trainer.train_step()
    measured = torch.cuda.max_memory_allocated()
    plan = build_plan(cfg, read_model_shape(str(sft_model_dir)), gpus=1, gpu_mem_gib=80,
                      prompt_len=32, chunk=logprob_chunk())
    print(f"plan {plan.peak / 2**20:.1f} MiB vs measured {measured / 2**20:.1f} MiB "
          f"({plan.peak / measured - 1:+.1%})")
    # The tiny model's peak is dominated by the CUDA context-independent allocator rounding; a
    # bound, not a precise figure, until it has been measured on a real GPU.
    assert 0.3 < plan.peak / measured < 3.0
