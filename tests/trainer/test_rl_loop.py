"""End-to-end CPU runs of the RL loop on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from primekit.factory import build_rl_trainer
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
    trainer = build_rl_trainer(cfg)
    prm = trainer.rewarder.model
    policy_before, prm_before = _params(trainer.policy), _params(prm)
    history = trainer.train()
    assert trainer.step == 2
    assert _changed(policy_before, trainer.policy)
    assert _changed(prm_before, prm)
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
    # The last checkpoint is exported as plain HF directories under run_dir/final/.
    final = cfg.train.run_dir + "/final"
    for name, live_model in (("policy", trainer.policy), ("prm", prm)):
        model = AutoModelForCausalLM.from_pretrained(f"{final}/{name}")
        AutoTokenizer.from_pretrained(f"{final}/{name}")
        live = dict(live_model.named_parameters())
        for key, value in model.named_parameters():
            assert torch.equal(value, live[key].detach()), key


# The online filter on (keeping only groups with 3 of 4 parity-correct samples): several rollout
# rounds per step, refilled until the batch holds prompts_per_step groups.
MULTI_ROUND = ("filter.enabled=true", "filter.lo=0.75", "filter.hi=0.75", "filter.oversample=1.5",
               "filter.max_rounds=8")


@pytest.mark.parametrize("extra", [(), MULTI_ROUND], ids=["one-round", "multi-round"])
def test_process_rewards_are_exactly_zero_at_initialisation(rl_config, extra):
    # PRM, reference and policy all start from the SFT checkpoint, so beta * (log pi_prm -
    # log pi_ref) is exactly 0 for every token of the first batch scored before any PRM update
    # (one PRM mini-batch holds the whole batch: 4 prompts x 4 samples = 16 rows), also when the
    # batch was collected over several rollout rounds.
    trainer = build_rl_trainer(rl_config(*extra), verifier=ParityVerifier())
    exp, metrics = trainer.collect({})
    if extra:
        assert metrics["filter/rounds"] >= 2
    old = trainer.old_logprobs(exp.batch)
    ref = trainer.ref_logprobs(exp.batch, old)
    rewards, prm_metrics = trainer.rewarder.rewards(exp.batch, outcome_rewards=exp.outcome_rewards,
                                                    group_ids=exp.group_ids, ref_logprobs=ref)
    assert exp.response_mask.sum() > 0
    assert torch.count_nonzero(rewards) == 0
    assert float(prm_metrics["reward/implicit_token_abs_mean"]) == 0.0
    # The collected batch is whole groups, contiguous, and every group passed the filter.
    K = trainer.cfg.rollout.n_samples
    assert torch.equal(exp.group_ids, torch.arange(len(exp) // K).repeat_interleave(K))
    if extra:
        assert torch.all(exp.outcome_rewards.view(-1, K).mean(1) == 0.75)


def test_rewarder_and_verifier_are_injected(rl_config):
    # The trainer uses the rewarder it is given: a fake paying +1 per token on even rows and 0 on
    # odd ones. Its process term reaches the advantages (a constant reward would not: Eq. 5's
    # leave-one-out baseline cancels it), and with process_coef=1, outcome_coef=0 and no
    # whitening the advantages are exactly that term. Row 0 (even), K = 4, gamma = 1: its token
    # t gets sum_{s>=t} (1 - mean_{j!=0} m_j), where the token means m_j of rows 1, 2, 3 are
    # 0, 1, 0, so (1 - 1/3) * (L_0 - t): the last token 2/3, the one before 4/3.
    class EvenRowsRewarder:
        reference_chunks = None
        calls = 0

        def rewards(self, batch, *, outcome_rewards, group_ids, ref_logprobs, problems=None):
            EvenRowsRewarder.calls += 1
            assert ref_logprobs is not None  # the old log-probs stand in without a reference
            even = (torch.arange(len(outcome_rewards)) % 2 == 0).float()[:, None]  # [N, 1]
            return batch.response_mask.float() * even, {"fake/called": 1.0}

        def trainable(self):
            return {}

    trainer = build_rl_trainer(
        rl_config("algorithm.reward_mode=outcome", "algorithm.process_coef=1",
                  "algorithm.outcome_coef=0", "algorithm.whiten=false"),
        verifier=ParityVerifier(), rewarder=EvenRowsRewarder())
    exp, _ = trainer.collect({})
    exp.old_logprobs = trainer.old_logprobs(exp.batch)
    exp.ref_logprobs = trainer.ref_logprobs(exp.batch, exp.old_logprobs)
    exp.token_rewards, _ = trainer.rewarder.rewards(exp.batch, outcome_rewards=exp.outcome_rewards,
                                                    group_ids=exp.group_ids,
                                                    ref_logprobs=exp.ref_logprobs)
    advantages, _, _ = trainer.advantages(exp)
    length = int(exp.response_mask[0].sum())
    assert length >= 2
    assert advantages[0, length - 1].item() == pytest.approx(2 / 3)
    assert advantages[0, length - 2].item() == pytest.approx(4 / 3)
    metrics = trainer.train_step()
    assert EvenRowsRewarder.calls == 2 and metrics["fake/called"] == 1.0
    assert metrics["adv/process_abs_mean"] > 0


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
    trainer = build_rl_trainer(rl_config("train.steps=1", "eval.k=1", *extra),
                               verifier=ParityVerifier())
    before = _params(trainer.policy)
    metrics = trainer.train_step()
    assert _changed(before, trainer.policy)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    if "algorithm.reward_mode=outcome" in extra:
        assert trainer.rewarder is None and trainer.ref is None
        assert "prm/loss" not in metrics
    if "prm.forward=double" in extra:
        assert "timing/prm_rescore" in metrics
    if "prm.reference=rollout" in extra:
        assert trainer.ref is None
    if "algorithm.estimator=ppo" in extra:
        assert "critic/loss" in metrics
        # The KL penalty in the token rewards is reported; at step 1 the policy is the reference.
        assert abs(metrics["policy/kl"]) < 1e-3


def test_resume_matches_uninterrupted_run(rl_config, tmp_path):
    # 4 steps straight vs 2 steps, a fresh process-like restart from the checkpoint, 2 more steps.
    common = ("train.steps=4", "eval.k=1", "train.save_every=2")
    full = build_rl_trainer(rl_config(*common, f"train.run_dir={tmp_path / 'full'}"))
    full_history = full.train()

    half = build_rl_trainer(rl_config("train.steps=2", "eval.k=1", "train.save_every=2",
                               f"train.run_dir={tmp_path / 'split'}"))
    half.train()
    resumed = build_rl_trainer(rl_config(*common, f"train.run_dir={tmp_path / 'split'}"),
                               resume=True)
    assert resumed.step == 2
    resumed_history = resumed.train()

    for a, b in zip(full.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(full.rewarder.model.parameters(), resumed.rewarder.model.parameters()):
        assert torch.equal(a, b)

    def stable(metrics):
        return {k: v for k, v in metrics.items()
                if not k.startswith(("timing/", "throughput/")) and k != "eval/wall_s"}

    assert stable(full_history[3]) == stable(resumed_history[-2])
    assert stable(full_history[-1]) == stable(resumed_history[-1])


def test_policy_lr_warms_up_linearly_by_step(rl_config):
    # policy.warmup_steps=4 at lr 4e-4: step 1 trains at 4e-4 * 1/4, step 2 at 4e-4 * 2/4.
    trainer = build_rl_trainer(rl_config("policy.warmup_steps=4", "policy.lr=4e-4",
                                         "algorithm.reward_mode=outcome"), verifier=ParityVerifier())
    lrs = []
    for _ in range(2):
        lrs.append(trainer.train_step()["policy/lr"])
        trainer.step += 1
    assert lrs == [pytest.approx(1e-4), pytest.approx(2e-4)]
    assert trainer.policy_opt.param_groups[0]["lr"] == pytest.approx(2e-4)


def test_a_step_whose_filter_keeps_nothing_is_skipped(rl_config):
    # Every response wrong: every group's mean outcome is 0 < filter.lo = 0.2, so after
    # filter.max_rounds = 2 rounds nothing is kept; the step reports it and changes nothing.
    class AlwaysWrong(ParityVerifier):
        def verify(self, response, problem):
            return Verdict.incorrect()

    trainer = build_rl_trainer(rl_config("filter.enabled=true", "filter.max_rounds=2"),
                               verifier=AlwaysWrong())
    before = _params(trainer.policy)
    with pytest.warns(UserWarning, match="kept 0 of 4 prompt groups after 2 rounds"):
        metrics = trainer.train_step()
    assert metrics["train/skipped"] == 1.0 and metrics["filter/groups_kept"] == 0.0
    assert metrics["filter/rounds"] == 2.0 and metrics["reward/outcome_mean_sampled"] == 0.0
    assert all(isinstance(v, float) for v in metrics.values())
    assert not _changed(before, trainer.policy)


def test_prompts_are_tokenised_once(rl_config, monkeypatch):
    # Validation encodes every prompt for its length check (primekit.validate); the trainer
    # samples from those ids instead of encoding the prompts a second time (1.24 s for the demo's
    # 20,500 prompts on the shared 2-core machine).
    import primekit.trainer.rl as rl
    import primekit.validate as validate
    from primekit.data.splits import encode_prompts

    calls = []
    monkeypatch.setattr(validate, "encode_prompts",
                        lambda tok, problems, cfg: calls.append(len(problems)) or
                        encode_prompts(tok, problems, cfg))

    def refuse(*args):
        raise AssertionError("the trainer tokenised the prompts again")

    monkeypatch.setattr(rl, "encode_prompts", refuse)
    cfg = rl_config("algorithm.reward_mode=outcome")
    trainer = build_rl_trainer(cfg, verifier=ParityVerifier())
    assert calls == [len(trainer.train_problems), len(trainer.eval_problems)]
    assert trainer.train_prompt_ids == encode_prompts(trainer.tokenizer, trainer.train_problems, cfg)
    assert trainer.eval_prompt_ids == encode_prompts(trainer.tokenizer, trainer.eval_problems, cfg)


def test_critic_trains_without_dropout(rl_config):
    # transformers' token-classification head drops 10% of its input in training by default;
    # the critic's values must not be noisy against the (eval-mode) old values they are clipped
    # against, nor its update depend on random masks (factory.build_critic).
    from primekit.factory import build_critic

    critic = build_critic(rl_config("algorithm.estimator=ppo"), torch.device("cpu")).train()
    dropouts = [m.p for m in critic.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(p == 0.0 for p in dropouts)
    ids = torch.randint(3, 100, (2, 12))
    with torch.no_grad():
        assert torch.equal(critic(input_ids=ids).logits, critic(input_ids=ids).logits)
