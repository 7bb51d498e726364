"""PPO with a critic, the explicit reward models and the batch metrics in a 2-process gloo group.

The claims, each against one process with the whole batch: 2 ranks x half the batch train the
policy, the implicit PRM and the FSDP2-sharded critic to the same parameters, and each rank holds
about half of the critic's parameter and optimiser bytes; the sharded explicit ORM and PRM give
the same dense rewards; and the metrics documented as exact across ranks (docs/metrics.md) are
the 1-process values, not per-rank statistics averaged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from primekit.config import load_config
from tests.spawn import run_processes
from tests.trainer.conftest import CONFIG, small_overrides
from tests.trainer.test_distributed_trainer import PerPromptSeeded, _Parity

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # max |param difference|, as in test_distributed_trainer.py

# PRIME token rewards into PPO with a critic (GAE); no whitening, so that adv/mean and adv/std
# are statistics of the batch rather than 0 and 1; recomputed old log-probs with TIS, so that the
# rollout/ metrics are logged. The critic at tiny.yaml's policy lr: at the default 5e-6 its 2 steps
# move it by 2e-5, too little to tell a comparison from one of two untouched models.
PPO = ["algorithm.estimator=ppo", "algorithm.whiten=false", "policy.old_logprobs=recompute",
       "policy.rollout_correction=tis", "critic.lr=1e-4"]

# Metrics that docs/metrics.md lists as exact across ranks, compared after each of the 2 steps.
EXACT = ("reward/outcome_mean_sampled", "reward/outcome_mean", "reward/implicit_seq_mean",
         "reward/implicit_seq_std", "reward/implicit_token_abs_mean", "filter/keep_rate",
         "verify/correct_rate", "verify/mean_score", "verify/error_rate", "verify/retries",
         "prm/loss", "prm/reward_mean", "prm/grad_norm", "prm/acc_pairwise", "prm/acc_abs",
         "adv/mean", "adv/std", "adv/process_abs_mean", "adv/outcome_abs_mean",
         "rollout/logprob_kl", "rollout/logprob_max_abs_diff", "rollout/tis_weight_mean",
         "response/len_mean", "response/len_max", "response/truncated_rate",
         "hack/steps_per_response", "hack/repeated_step_share", "hack/repeated_ngram_share",
         "hack/response_len_chars", "hack/response_len_tokens", "hack/dense_return_mean",
         "hack/dense_success_corr", "policy/grad_norm", "policy/lr")

RESPONSES = ["3+4=7\n7*2=14\nA:14", "1+1=2\nA:2", "A:5", "9-1=8\n8-1=7\n7-1=6\nA:6",
             "2*3=6\n6+1=7\n7+1=8\nA:8", "A:3", "5-2=3\nA:3", "8/2=4\n4/2=2\nA:2"]
PROMPTS = ["3+4*2=", "1+1=", "5=", "9-1-1-1=", "2*3+1+1=", "3=", "5-2=", "8/2/2="]


def _ppo_overrides(policy: str, run_dir: str) -> list[str]:
    return small_overrides(Path(policy), Path(run_dir)) + ["train.steps=2"] + PPO


def _state(trainer) -> dict:
    from primekit.distributed import full_state_dict

    return {name: {k: v.clone() for k, v in full_state_dict(model).items()}
            for name, model in (("policy", trainer.policy), ("prm", trainer.rewarder.model),
                                ("critic", trainer.critic))}


def _critic_bytes(trainer) -> dict:
    from primekit.models.parallel import local_nbytes, optimizer_nbytes

    return {"critic": local_nbytes(trainer.critic.parameters()),
            "critic_opt": optimizer_nbytes(trainer.critic_opt)}


def _critic_init(trainer) -> dict:
    from primekit.distributed import full_state_dict

    return {k: v.clone() for k, v in full_state_dict(trainer.critic).items()}


def _two_steps(trainer) -> list[dict]:
    from primekit import distributed as dist

    trainer.engine = PerPromptSeeded(trainer.engine)
    return [dist.reduce_metrics(trainer.train_step()) for _ in range(2)]


def _record_first_critic_gradient(trainer) -> dict:
    """Fills the returned dict with the critic's full gradient (after clipping) at its first
    optimiser step (all-gathered from the shards: every rank takes part)."""
    grads: dict = {}
    step = trainer.critic_opt.step

    def recording_step(*args, **kwargs):
        if not grads:
            for name, p in trainer.critic.named_parameters():
                g = p.grad
                grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).clone()
        return step(*args, **kwargs)

    trainer.critic_opt.step = recording_step
    return grads


def _rm_batch(tokenizer):
    from primekit.reward_models.hack_check import batch_from_texts

    return batch_from_texts(tokenizer, [tokenizer(p)["input_ids"] for p in PROMPTS], RESPONSES)


def _explicit(rm_dir: str, tokenizer, rows: slice) -> dict:
    """Dense rewards and metrics of the explicit ORM and PRM (through the factory, so sharded
    under torchrun) on `rows` of the fixed batch."""
    from primekit.factory import build_rewarder
    from primekit.models.parallel import is_sharded, local_nbytes

    batch = _rm_batch(tokenizer).select(torch.arange(len(RESPONSES))[rows])
    out = {}
    for mode in ("orm", "prm"):
        # Clip at 0.5 leaves a dense penalty on the steps this random-head PRM rates below 0.5
        # (under Clip-Delta they are mostly answer steps, whose reward Delta sets to 0).
        transform = "none" if mode == "orm" else "clip"
        cfg = load_config(None, [f"algorithm.reward_mode=explicit-{mode}",
                                 f"explicit.model_path={rm_dir}", f"explicit.transform={transform}",
                                 "explicit.eta=0.5", "policy.micro_batch_size=2"])
        rewarder = build_rewarder(cfg, tokenizer, torch.device("cpu"))
        rewards, metrics = rewarder.rewards(batch, outcome_rewards=torch.zeros(len(batch)),
                                            group_ids=torch.arange(len(batch)), ref_logprobs=None)
        metrics.pop("timing/explicit_rm")
        out[mode] = {"rewards": rewards, "metrics": metrics, "sharded": is_sharded(rewarder.model),
                     "bytes": local_nbytes(rewarder.model.parameters())}
    return out


def _worker(rank: int, world: int, init_file: str, policy: str, rm_dir: str, run_dir: str,
            out: str) -> None:
    from primekit import distributed as dist
    from primekit.factory import build_rl_trainer

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world)
    try:
        torch.set_num_threads(1)
        trainer = build_rl_trainer(load_config(CONFIG, _ppo_overrides(policy, run_dir)),
                                   verifier=_Parity())
        result = {"critic_init": _critic_init(trainer),
                  "critic_grad": _record_first_critic_gradient(trainer)}
        result.update(steps=_two_steps(trainer), state=_state(trainer),
                      bytes=_critic_bytes(trainer))
        half = len(RESPONSES) // world
        # Each rank scores its contiguous half of the rows; the metrics are of all of them.
        result["explicit"] = _explicit(rm_dir, trainer.tokenizer,
                                       slice(rank * half, (rank + 1) * half))
        assert dist.world_size() == 2
        torch.save(result, Path(out) / f"rank{rank}.pt")
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def runs(sft_model_dir, tmp_path_factory):
    """The 2-rank run's results per rank, and the same work in this process on the whole batch."""
    from primekit.factory import build_rl_trainer
    from primekit.models.hf import load_tokenizer, save_model
    from primekit.reward_models.heads import init_reward_model

    tmp = tmp_path_factory.mktemp("dist_rewards")
    rm_dir = tmp / "rm"  # a fixed random-head reward model, saved as train-orm/train-prm save
    save_model(init_reward_model(sft_model_dir, seed=1), load_tokenizer(sft_model_dir), rm_dir)
    out = tmp / "out"
    out.mkdir()
    run_processes(_worker, (2, str(tmp / "store"), str(sft_model_dir), str(rm_dir),
                            str(tmp / "run"), str(out)),
                  nprocs=2, timeout_s=500, what="2-process PPO and explicit rewards")
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]

    single = build_rl_trainer(load_config(CONFIG, _ppo_overrides(str(sft_model_dir),
                                                                 str(tmp / "single"))),
                              verifier=_Parity())
    one = {"critic_init": _critic_init(single), "critic_grad": _record_first_critic_gradient(single)}
    one.update(steps=_two_steps(single), state=_state(single), bytes=_critic_bytes(single),
               explicit=_explicit(str(rm_dir), single.tokenizer, slice(None)))
    return {"ranks": ranks, "one": one, "sft": sft_model_dir}


def test_ppo_critic_on_two_sharded_ranks_trains_as_one_process(runs):
    from safetensors.torch import load_file

    r0, one = runs["ranks"][0], runs["one"]
    # The critic starts from the same weights: the SFT backbone and a score head seeded like
    # rank 0, which holds the whole one-row head after sharding.
    for k, v in one["critic_init"].items():
        assert torch.equal(v, r0["critic_init"][k]), k
    # Its first update's gradient (the first mini-batch, normalised by the global token count,
    # averaged over ranks by FSDP2, clipped by the global norm) is the one-process gradient.
    g1 = torch.cat([g.flatten() for g in one["critic_grad"].values()])
    g2 = torch.cat([r0["critic_grad"][k].flatten() for k in one["critic_grad"]])
    rel = ((g1 - g2).norm() / g1.norm()).item()
    print(f"critic first gradient: |1 process - 2 ranks| / |1 process| = {rel:.3g}")
    assert g1.norm() > 0 and rel < 1e-5, rel

    # The critic's backbone starts from the SFT weights, its head from the seeded init.
    initial = {**load_file(str(runs["sft"] / "model.safetensors")), **one["critic_init"]}
    for name in ("policy", "prm", "critic"):
        diff = max((v - r0["state"][name][k]).abs().max().item()
                   for k, v in one["state"][name].items())
        moved = max((v - initial[k]).abs().max().item() for k, v in one["state"][name].items()
                    if k in initial)
        print(f"{name}: max |1 process - 2 ranks| = {diff:.3g}, max move = {moved:.3g}")
        assert moved > 20 * TOLERANCE  # the comparison is not between two untouched models
        assert diff < TOLERANCE, (name, diff)
    # Each rank holds half of the critic's parameters and AdamW state (FSDP2 pads a dim-0 that
    # does not split evenly, e.g. the 259-row embedding, by a row or so).
    for key in ("critic", "critic_opt"):
        half = one["bytes"][key] / 2
        for r in runs["ranks"]:
            assert abs(r["bytes"][key] - half) / half < 0.01, (key, r["bytes"][key], half)
        print(f"{key}: {[r['bytes'][key] for r in runs['ranks']]} bytes on the ranks, "
              f"{one['bytes'][key]} in one process")


def test_exact_metrics_equal_the_one_process_values(runs):
    r0, r1, one = *runs["ranks"], runs["one"]
    seen = set()
    for step, (a, b, c) in enumerate(zip(one["steps"], r0["steps"], r1["steps"]), 1):
        assert b == c  # reduced: every rank logs the same line
        # The same keys on both sides (hack/dense_success_corr is left out of step 1 by both:
        # the PRM's first rewards are all 0, so the correlation is undefined).
        assert [k for k in EXACT if k in a] == [k for k in EXACT if k in b]
        seen |= {k for k in EXACT if k in a}
        for key in (k for k in EXACT if k in a):
            # float32 sums in another order; log-probs recomputed in other micro-batches differ by
            # ~1e-7, which is all rollout/logprob_* measure here (both runs: ~1e-6 or less).
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), (step, key, a[key], b[key])
        print(f"step {step}:", {k: (round(a[k], 6), round(b[k], 6)) for k in EXACT if k in a})
    assert seen == set(EXACT), set(EXACT) - seen


def test_sharded_explicit_reward_models_score_as_one_process(runs):
    r0, r1, one = *runs["ranks"], runs["one"]
    half = len(RESPONSES) // 2
    for mode in ("orm", "prm"):
        assert r0["explicit"][mode]["sharded"] and not one["explicit"][mode]["sharded"]
        full = one["explicit"][mode]["rewards"]  # [8, T]
        assert full.abs().sum() > 0
        for r, rows in ((r0, slice(0, half)), (r1, slice(half, None))):
            mine = r["explicit"][mode]["rewards"]
            assert torch.allclose(mine, full[rows, : mine.shape[1]], atol=1e-6), mode
            assert full[rows, mine.shape[1]:].abs().sum() == 0  # only padding beyond
        # Metrics over every rank's responses and steps, not averaged per rank.
        a, b = one["explicit"][mode]["metrics"], r0["explicit"][mode]["metrics"]
        assert a.keys() == b.keys() == r1["explicit"][mode]["metrics"].keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (mode, key)
        # Half of the reward model's bytes on each rank.
        whole = one["explicit"][mode]["bytes"]
        for r in (r0, r1):
            assert abs(r["explicit"][mode]["bytes"] - whole / 2) / (whole / 2) < 0.01
