"""Scale-out guarantees: fp32 master weights under bf16 compute, sharded checkpoints that resume
on another number of ranks, a killed rank never corrupting the last checkpoint, and the paper's
7B config run through the GPU user's code path (FSDP2, bf16, activation checkpointing) on CPUs.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from primekit.config import load_config
from tests.spawn import run_processes
from tests.trainer.conftest import CONFIG, small_overrides
from tests.trainer.test_distributed_trainer import TOLERANCE, PerPromptSeeded, _Parity

PAPER = CONFIG.parent / "paper-7b.yaml"


def _full_state(trainer) -> dict:
    """Full weights and AdamW state of the policy and PRM (a collective when sharded)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from primekit.distributed import full_state_dict

    out = {}
    for name, (model, opt) in trainer.trainable().items():
        optim = get_optimizer_state_dict(model, opt,
                                         options=StateDictOptions(full_state_dict=True))
        out[name] = {k: v.clone() for k, v in full_state_dict(model).items()}
        out[f"optim.{name}"] = {k: {kk: vv.clone() for kk, vv in state.items()}
                                for k, state in optim["state"].items()}
    return out


def _assert_same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert sorted(a[name]) == sorted(b[name]), name
        for k in a[name]:
            if name.startswith("optim."):
                for kk in a[name][k]:
                    assert torch.equal(a[name][k][kk], b[name][k][kk]), (name, k, kk)
            else:
                assert torch.equal(a[name][k], b[name][k]), (name, k)


def _cfg(policy: Path | str, run_dir: Path | str, *extra: str):
    return load_config(CONFIG, small_overrides(Path(policy), Path(run_dir)) + list(extra))


def _steps(trainer, n: int) -> list[dict]:
    """`n` steps with rollouts that depend only on the prompt and the step number."""
    engine = PerPromptSeeded(trainer.engine)
    engine.calls = trainer.step
    trainer.engine = engine
    out = []
    for _ in range(n):
        out.append(trainer.train_step())
        trainer.step += 1
    trainer.engine = engine.inner
    return out


def _train_two_steps_on_two_ranks(config: Path, overrides: list[str], run_dir: Path) -> list[dict]:
    """`primekit train --config config` under torchrun on 2 gloo ranks, 2 steps saved at each:
    checks the exit status, the step-2 checkpoint's two shards and the metric lines (2 steps and
    the final evaluation, all finite); returns the lines."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "primekit.cli", "train", "--config", str(config), *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    shards = sorted(p.name for p in (run_dir / "checkpoints" / "step_000002" / "weights").glob("*"))
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 2]
    assert all(math.isfinite(v) for m in lines for v in m.values() if isinstance(v, float))
    return lines


# ---------------------------------------------------------------- bf16 with fp32 master weights
def test_bf16_compute_moves_fp32_master_weights_like_fp32(sft_model_dir, tmp_path):
    # The bug this guards against: bf16 weights stepped by AdamW at lr 1e-6 do not move at all
    # (an update below half a bf16 ulp rounds away). With fp32 master weights they move as in fp32.
    from primekit.factory import build_rl_trainer

    extra = ("algorithm.reward_mode=outcome", "policy.lr=1e-6", "policy.ppo_epochs=1",
             "policy.warmup_steps=0")
    t32 = build_rl_trainer(_cfg(sft_model_dir, tmp_path / "a", *extra), verifier=_Parity())
    t16 = build_rl_trainer(_cfg(sft_model_dir, tmp_path / "b", *extra, "model.dtype=bfloat16"),
                           verifier=_Parity())
    assert all(p.dtype == torch.float32 for p in t16.policy.parameters())  # master weights
    assert t16.engine.model is not t16.policy  # it samples from its own bf16 copy
    assert next(t16.engine.model.parameters()).dtype == torch.bfloat16

    exp, _ = t32.collect({})
    exp.old_logprobs = t32.old_logprobs(exp.batch)
    exp.ref_logprobs = exp.old_logprobs
    exp.advantages, exp.returns, _ = t32.advantages(exp)
    before = {k: v.detach().clone() for k, v in t32.policy.named_parameters()}
    t32.update_policy(exp)
    t16.update_policy(copy.deepcopy(exp))
    d32 = torch.cat([(p.detach() - before[k]).flatten() for k, p in t32.policy.named_parameters()])
    d16 = torch.cat([(p.detach() - before[k]).flatten() for k, p in t16.policy.named_parameters()])
    moved = (d16 != 0).float().mean().item()
    rel = ((d16 - d32).norm() / d32.norm()).item()
    print(f"bf16 compute: {moved:.4f} of weights moved; |d16 - d32| / |d32| = {rel:.3f}")
    assert moved > 0.95
    assert rel < 0.2  # measured 0.064. AdamW's first step is ~lr * sign(grad): bf16 flips only small gradients
    # After the update the sampler holds the new weights (in bf16).
    t16.engine.sync_weights(t16.policy)
    for k, v in t16.engine.model.state_dict().items():
        assert torch.equal(v, t16.policy.state_dict()[k].to(torch.bfloat16)), k


# ---------------------------------------------------------------- resume across world sizes
def _resume_worker(rank: int, world: int, init_file: str, policy: str, run_a: str, run_b: str,
                   out: str) -> None:
    from primekit.distributed import reduce_metrics
    from primekit.factory import build_rl_trainer

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world)
    try:
        torch.set_num_threads(1)
        # Resume at 2 ranks what 1 process saved at step 2.
        trainer = build_rl_trainer(_cfg(policy, run_a), resume=True, verifier=_Parity())
        loaded = _full_state(trainer)
        trainer.cfg.train.run_dir = run_b
        _steps(trainer, 1)
        trainer.save()  # step 3, sharded over 2 ranks
        saved = _full_state(trainer)
        after = [reduce_metrics(m) for m in _steps(trainer, 1)]  # step 4, uninterrupted
        final = _full_state(trainer)
        if rank == 0:
            torch.save({"loaded": loaded, "saved": saved, "after": after, "final": final},
                       Path(out) / "worker.pt")
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_sharded_checkpoints_resume_across_world_sizes(sft_model_dir, tmp_path):
    from primekit.factory import build_rl_trainer

    run_a, run_b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    out.mkdir()
    one = build_rl_trainer(_cfg(sft_model_dir, run_a), verifier=_Parity())
    _steps(one, 2)
    one.save()
    saved_by_one = _full_state(one)
    del one

    run_processes(_resume_worker, (2, str(tmp_path / "store"), str(sft_model_dir), str(run_a),
                                   str(run_b), str(out)),
                  nprocs=2, timeout_s=400, what="2-rank resume")
    w = torch.load(out / "worker.pt", weights_only=False)
    # 1 -> 2: the shards the ranks loaded make up exactly what one process saved.
    _assert_same_state(w["loaded"], saved_by_one)

    # 2 -> 1: one process loads the 2-rank checkpoint exactly, and its next step matches the
    # 2-rank run's uninterrupted next step within the tolerance of test_distributed_trainer.
    resumed = build_rl_trainer(_cfg(sft_model_dir, run_b), resume=True, verifier=_Parity())
    assert resumed.step == 3
    _assert_same_state(_full_state(resumed), w["saved"])
    after = _steps(resumed, 1)
    for key in ("reward/outcome_mean", "prm/loss", "prm/acc_abs"):
        assert abs(after[0][key] - w["after"][0][key]) < 1e-4, key
    final = _full_state(resumed)
    for name in ("policy", "prm"):
        diff = max((v - w["final"][name][k]).abs().max().item() for k, v in final[name].items())
        assert diff < TOLERANCE, (name, diff)


# ---------------------------------------------------------------- a rank killed while saving
def _kill_worker(rank: int, world: int, init_file: str, policy: str, run_dir: str,
                 out: str) -> None:
    import torch.distributed.checkpoint as dcp

    from primekit.factory import build_rl_trainer

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world)
    torch.set_num_threads(1)
    trainer = build_rl_trainer(_cfg(policy, run_dir), verifier=_Parity())
    _steps(trainer, 1)
    trainer.save()  # step 1: complete
    state = _full_state(trainer)
    if rank == 0:
        torch.save(state, Path(out) / "step1.pt")
    _steps(trainer, 1)
    if rank == 1:  # dies inside the sharded save of step 2, before writing its shard
        dcp.save = lambda *a, **kw: os.kill(os.getpid(), signal.SIGKILL)
    trainer.save()


@pytest.mark.slow
def test_killing_a_rank_during_a_sharded_save_keeps_the_last_checkpoint(sft_model_dir, tmp_path):
    from primekit.factory import build_rl_trainer
    from primekit.trainer.checkpoint import latest_checkpoint

    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    with pytest.raises(Exception, match="signal|SIGKILL|exit"):
        run_processes(_kill_worker, (2, str(tmp_path / "store"), str(sft_model_dir),
                                     str(run_dir), str(out)),
                      nprocs=2, timeout_s=400, what="2-rank save killed")
    root = run_dir / "checkpoints"
    assert latest_checkpoint(run_dir) == root / "step_000001"
    # The unfinished save never became step 2. Its temp dir is either left behind (ignored by
    # readers, deleted by the next save) or already removed by rank 0, when gloo reported the
    # dead peer to rank 0's dcp.save before the launcher stopped it (a race: seen 1 in 3 runs).
    assert not (root / "step_000002").exists()
    resumed = build_rl_trainer(_cfg(sft_model_dir, run_dir), resume=True, verifier=_Parity())
    assert resumed.step == 1
    _assert_same_state(_full_state(resumed), torch.load(out / "step1.pt", weights_only=False))


# ---------------------------------------------------------------- the paper's config, 2 ranks
@pytest.mark.slow
def test_paper_7b_config_runs_on_two_ranks_with_the_gpu_code_path(sft_model_dir, tmp_path):
    # configs/paper-7b.yaml with the tiny model and a small file of the same schema: bf16 compute
    # over fp32 master weights, FSDP2 over 2 gloo ranks, activation checkpointing, sharded
    # checkpoints; then resumed in a single process, and exported. Changed for a CPU and a
    # tiny model: the device, sizes, the filter (the tiny model fails most problems) and the chat
    # template (the tiny tokenizer has none).
    data, heldout = tmp_path / "math.jsonl", tmp_path / "heldout.jsonl"
    for path, bs in ((data, range(1, 5)), (heldout, range(5, 7))):
        rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(1, 9) for b in bs]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    overrides = [
        f"model.policy={sft_model_dir}", "model.use_chat_template=false",
        f"data.train_path={data}", f"data.eval_path={heldout}", "data.num_eval=8",
        "rollout.max_new_tokens=16", "rollout.micro_batch_size=16", "filter.enabled=false",
        "prm.mini_batch_size=16", "prm.micro_batch_size=4",
        "policy.mini_batch_size=16", "policy.micro_batch_size=4",
        f"train.run_dir={run_dir}", "train.device=cpu", "train.steps=2", "train.prompts_per_step=4",
        "train.save_every=1", "train.eval_every=0", "train.report_to=[]",
        "eval.num_problems=8", "eval.k=1",
    ]
    cfg = load_config(PAPER, overrides)
    assert (cfg.model.dtype, cfg.parallel.activation_checkpointing) == ("bfloat16", True)
    _train_two_steps_on_two_ranks(PAPER, overrides, run_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    # 2 -> 1 through the CLI: one more step in a single process from the 2-rank checkpoint.
    resume = [sys.executable, "-m", "primekit.cli", "train", "--config", str(PAPER), "--resume",
              *overrides, "train.steps=3"]
    done = subprocess.run(resume, capture_output=True, text=True, timeout=500, env=env)
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "resumed from" in done.stdout
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(run_dir / "final" / "policy")
    assert next(policy.parameters()).dtype == torch.float32


# ---------------------------------------------------------------- explicit reward model, torchrun
@pytest.mark.slow
def test_tiny_explicit_config_trains_on_two_ranks_through_torchrun(sft_model_dir, tmp_path):
    # configs/tiny-explicit.yaml as a user runs it, under torchrun on 2 gloo ranks: the policy,
    # the critic (estimator ppo) and the explicit step-level PRM (a saved random-head reward
    # model) all FSDP2-sharded, with a KL term against the reference. Sizes cut for a CPU.
    from primekit.models.hf import load_tokenizer, save_model
    from primekit.reward_models.heads import init_reward_model

    rm_dir = tmp_path / "prm"
    save_model(init_reward_model(sft_model_dir, seed=1), load_tokenizer(sft_model_dir), rm_dir)
    run_dir = tmp_path / "run"
    config = CONFIG.parent / "tiny-explicit.yaml"
    overrides = [
        f"model.policy={sft_model_dir}", f"explicit.model_path={rm_dir}", f"train.run_dir={run_dir}",
        "data.num_train=200", "data.num_eval=8", "rollout.max_new_tokens=16",
        "policy.mini_batch_size=16", "policy.micro_batch_size=8", "train.steps=2",
        "train.prompts_per_step=4", "train.save_every=1", "train.eval_every=0",
        "train.report_to=[]", "eval.num_problems=8", "eval.k=1"]
    lines = _train_two_steps_on_two_ranks(config, overrides, run_dir)
    for m in lines[:2]:  # the two training steps: explicit rewards, a critic, a KL term
        assert m["explicit/steps_mean"] > 0 and math.isfinite(m["explicit/step_reward_mean"])
        assert math.isfinite(m["critic/loss"]) and math.isfinite(m["policy/kl"])
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["config"]["algorithm"]["reward_mode"] == "explicit-prm"
    # The final export holds the trained models, whole, in float32.
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(run_dir / "final" / "policy")
    assert next(policy.parameters()).dtype == torch.float32
    assert (run_dir / "final" / "critic").is_dir()
