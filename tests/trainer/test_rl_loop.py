"""End-to-end CPU runs of the RL loop on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from primekit.trainer.rl import RLTrainer
from primekit.verifiers.base import Verdict


class ParityVerifier:
    """Scores a response 1 when its length is even: a barely trained model is almost never right
    on the real task, and outcome-only estimators need outcomes that differ within a group."""

    def verify(self, response, problem):
        return Verdict.correct() if len(response) % 2 == 0 else Verdict.incorrect()

    def verify_batch(self, responses, problems):
        return [self.verify(r, p) for r, p in zip(responses, problems)]


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _changed(before: list[torch.Tensor], model) -> bool:
    return any(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))


def test_prime_two_steps_change_policy_and_prm_and_checkpoint_loads(rl_config):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = rl_config()
    trainer = RLTrainer(cfg)
    policy_before, prm_before = _params(trainer.policy), _params(trainer.prm)
    history = trainer.train()
    assert trainer.step == 2
    assert _changed(policy_before, trainer.policy)
    assert _changed(prm_before, trainer.prm)
    # The reference stays frozen.
    assert all(not p.requires_grad for p in trainer.ref.parameters())
    step_metrics = history[:2]
    for metrics in history:
        for key, value in metrics.items():
            assert math.isfinite(value), f"{key} = {value}"
    for key in ("prm/loss", "policy/loss", "policy/clip_frac", "timing/rollout",
                "timing/prm_update", "timing/policy_update", "reward/outcome_mean",
                "filter/keep_rate", "response/len_mean", "adv/std"):
        assert all(key in m for m in step_metrics), key
    assert "eval/pass@1_greedy" in history[-1]
    ckpt = cfg.train.run_dir + "/checkpoints/step_000002"
    for name in ("policy", "prm"):
        model = AutoModelForCausalLM.from_pretrained(f"{ckpt}/{name}")
        AutoTokenizer.from_pretrained(f"{ckpt}/{name}")
        live = dict(getattr(trainer, name).named_parameters())
        for key, value in model.named_parameters():
            assert torch.equal(value, live[key].detach()), key


# The online filter on (keeping only groups with 3 of 4 parity-correct samples): several rollout rounds per
# step, so per-round scoring (prm.score_per_round) scores the batch in pieces.
MULTI_ROUND = ("filter.enabled=true", "filter.lo=0.75", "filter.hi=0.75", "filter.oversample=1.5",
               "filter.max_rounds=8")


@pytest.mark.parametrize(
    "extra",
    [("prm.score_per_round=false",), ("prm.score_per_round=true",),
     ("prm.score_per_round=true", "prm.overlap=true", *MULTI_ROUND)],
    ids=["whole-batch", "per-round", "per-round-overlap-multi-round"],
)
def test_process_rewards_are_exactly_zero_at_initialisation(rl_config, extra):
    # PRM, reference and policy all start from the SFT checkpoint, so beta * (log pi_prm -
    # log pi_ref) is exactly 0 for every token of the first batch scored before any PRM update
    # (one PRM mini-batch holds the whole batch: 4 prompts x 4 samples = 16 rows), whether the
    # batch is scored whole or round by round, in one thread or two.
    trainer = RLTrainer(rl_config(*extra))
    trainer.verifier = ParityVerifier()
    timing: dict[str, float] = {}
    exp, metrics = trainer.collect(timing)
    assert ("round_scores" in exp.extra) == ("prm.score_per_round=true" in extra)
    if MULTI_ROUND[0] in extra:
        assert metrics["filter/rounds"] >= 2 and len(exp.extra["round_scores"]) >= 2
    trainer.score_logprobs(exp, timing)
    metrics = trainer.update_prm(exp, timing)
    trainer._join_prm()
    assert exp.response_mask.sum() > 0
    assert torch.count_nonzero(exp.token_rewards) == 0
    assert metrics["reward/implicit_token_abs_mean"] == 0.0


def test_per_round_scoring_matches_whole_batch_scoring(rl_config, tmp_path):
    # Scoring each rollout round's groups as they arrive changes only how rows are padded into
    # micro-batches, not the arithmetic: one step from the same rollouts gives the same PRM loss,
    # token rewards and updated weights up to float rounding.
    runs = {}
    for per_round in (False, True):
        trainer = RLTrainer(rl_config("train.steps=1", *MULTI_ROUND,
                                      f"prm.score_per_round={per_round}",
                                      f"train.run_dir={tmp_path / str(per_round)}"))
        trainer.verifier = ParityVerifier()
        timing: dict[str, float] = {}
        exp, metrics = trainer.collect(timing)
        assert metrics["filter/rounds"] >= 2
        trainer.score_logprobs(exp, timing)
        metrics.update(trainer.update_prm(exp, timing))
        trainer._join_prm()
        runs[per_round] = (trainer, exp, metrics)
    (whole, whole_exp, whole_m), (rounds, rounds_exp, rounds_m) = runs[False], runs[True]
    assert torch.equal(whole_exp.batch.response_ids, rounds_exp.batch.response_ids)
    assert "round_scores" in rounds_exp.extra and "round_scores" not in whole_exp.extra
    assert rounds_m["prm/loss"] == pytest.approx(whole_m["prm/loss"], rel=1e-5)
    torch.testing.assert_close(rounds_exp.ref_logprobs, whole_exp.ref_logprobs)
    torch.testing.assert_close(rounds_exp.token_rewards, whole_exp.token_rewards)
    for a, b in zip(whole.prm.parameters(), rounds.prm.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "extra",
    [
        ("algorithm.reward_mode=outcome",),
        ("algorithm.estimator=grpo", "prm.loss=dpo", "prm.forward=double"),
        ("algorithm.estimator=reinforce", "prm.reference=rollout"),
        ("algorithm.estimator=ppo", "algorithm.kl_coef=0.1"),
        ("algorithm.estimator=prime-value",),
    ],
    ids=["rloo-outcome", "grpo-dpo-double", "reinforce-policy-ref", "ppo-critic-kl", "prime-value"],
)
def test_variants_run_one_step(rl_config, extra):
    trainer = RLTrainer(rl_config("train.steps=1", "eval.k=1", *extra))
    trainer.verifier = ParityVerifier()
    before = _params(trainer.policy)
    metrics = trainer.train_step()
    assert _changed(before, trainer.policy)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    if "algorithm.reward_mode=outcome" in extra:
        assert trainer.prm is None and trainer.ref is None
        assert "prm/loss" not in metrics
    if "prm.forward=double" in extra:
        assert "timing/prm_rescore" in metrics
    if "prm.reference=rollout" in extra:
        assert trainer.ref is None
    if "algorithm.estimator=ppo" in extra:
        assert "critic/loss" in metrics


def test_resume_matches_uninterrupted_run(rl_config, tmp_path):
    # 4 steps straight vs 2 steps, a fresh process-like restart from the checkpoint, 2 more steps.
    common = ("train.steps=4", "eval.k=1", "train.save_every=2")
    full = RLTrainer(rl_config(*common, f"train.run_dir={tmp_path / 'full'}"))
    full_history = full.train()

    half = RLTrainer(rl_config("train.steps=2", "eval.k=1", "train.save_every=2",
                               f"train.run_dir={tmp_path / 'split'}"))
    half.train()
    resumed = RLTrainer(rl_config(*common, f"train.run_dir={tmp_path / 'split'}"), resume=True)
    assert resumed.step == 2
    resumed_history = resumed.train()

    for a, b in zip(full.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(full.prm.parameters(), resumed.prm.parameters()):
        assert torch.equal(a, b)

    def stable(metrics):
        return {k: v for k, v in metrics.items()
                if not k.startswith(("timing/", "throughput/")) and k != "eval/wall_s"}

    assert stable(full_history[3]) == stable(resumed_history[-2])
    assert stable(full_history[-1]) == stable(resumed_history[-1])


@pytest.mark.parametrize(
    "extra", [("prm.score_per_round=false",), ("prm.score_per_round=true", *MULTI_ROUND)],
    ids=["whole-batch", "per-round-multi-round"])
def test_overlap_gives_the_same_numbers_as_sequential(rl_config, tmp_path, extra):
    # prm.overlap moves the reference forward, the PRM's backward + step and (per-round scoring)
    # the forwards of all but the last rollout round to a second thread; the arithmetic is
    # unchanged, so parameters and metrics must match bit for bit.
    runs = {}
    for overlap in (False, True):
        trainer = RLTrainer(rl_config("train.steps=2", "eval.k=1", f"prm.overlap={overlap}",
                                      f"train.run_dir={tmp_path / str(overlap)}", *extra))
        trainer.verifier = ParityVerifier()
        metrics = [trainer.train_step(), trainer.train_step()]
        runs[overlap] = (trainer, metrics)
    (seq, seq_metrics), (ovl, ovl_metrics) = runs[False], runs[True]
    for name in ("policy", "prm"):
        for a, b in zip(getattr(seq, name).parameters(), getattr(ovl, name).parameters()):
            assert torch.equal(a, b), name
    for a, b in zip(seq_metrics, ovl_metrics):
        for key in a:
            if not key.startswith(("timing/", "throughput/")):
                assert a[key] == b[key], key


def test_policy_lr_warms_up_linearly_by_step(rl_config):
    # policy.warmup_steps=4 at lr 4e-4: step 1 trains at 4e-4 * 1/4, step 2 at 4e-4 * 2/4.
    trainer = RLTrainer(rl_config("policy.warmup_steps=4", "policy.lr=4e-4",
                                  "algorithm.reward_mode=outcome"))
    trainer.verifier = ParityVerifier()
    lrs = []
    for _ in range(2):
        lrs.append(trainer.train_step()["policy/lr"])
        trainer.step += 1
    assert lrs == [pytest.approx(1e-4), pytest.approx(2e-4)]
    assert trainer.policy_opt.param_groups[0]["lr"] == pytest.approx(2e-4)
