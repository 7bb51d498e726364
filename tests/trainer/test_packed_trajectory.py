"""The trainer's passes in packed and token-budget micro-batches against padded rows.

Every pass of one PRIME step with a critic (old log-probs, reference, PRM forward and backward,
critic values and update, policy update) is run by the real trainer code on one collected batch
in three layouts; their outputs and gradients must agree with the padded, row-count layout
within 1e-6 (fp32). Then three whole steps of the padded and packed trainers, sampling with the
same seed, must follow the same trajectory.
"""

from __future__ import annotations

import copy

import pytest
import torch

from primekit.factory import build_rl_trainer
from primekit.models.logprobs import batch_values
from primekit.trainer.critic import update_critic

# One policy and one PRM mini-batch holding the whole batch (4 prompts x 4 samples), one epoch:
# the .grad each update leaves behind is that mini-batch's whole gradient.
COMMON = ("policy.old_logprobs=recompute", "algorithm.estimator=ppo", "algorithm.kl_coef=0.01",
          "policy.ppo_epochs=1", "policy.mini_batch_size=16", "policy.micro_batch_size=16")
LAYOUTS = {
    # The tiny configs pack by default: padded rows are asked for.
    "padded-rows": ("policy.micro_batch_size=4", "prm.micro_batch_size=8",
                    "policy.max_tokens_per_micro_batch=0", "prm.max_tokens_per_micro_batch=0"),
    "packed-tokens": ("policy.max_tokens_per_micro_batch=400", "prm.max_tokens_per_micro_batch=400"),
    "sorted-tokens": ("policy.max_tokens_per_micro_batch=400", "prm.max_tokens_per_micro_batch=400",
                      "policy.packing=sorted", "prm.packing=sorted"),
}


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _close(a, b, what: str, atol: float = 1e-6) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys() and a, what
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=f"{what} {k}")
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=what)


def _passes(trainer, exp):
    """The step's passes on `exp` (a copy), in the trainer's own layout: outputs and gradients."""
    exp = copy.copy(exp)
    out = {"old": trainer.old_logprobs(exp.batch)}
    out["ref"] = trainer.ref_logprobs(exp.batch, out["old"])
    exp.old_logprobs, exp.ref_logprobs = out["old"], out["ref"]
    exp.token_rewards, prm_metrics = trainer.rewarder.rewards(
        exp.batch, outcome_rewards=exp.outcome_rewards, group_ids=exp.group_ids,
        ref_logprobs=exp.ref_logprobs)
    out["token_rewards"], out["prm_loss"] = exp.token_rewards, prm_metrics["prm/loss"]
    out["prm_grads"] = _grads(trainer.rewarder.model)
    exp.values = batch_values(trainer.critic, exp.batch, *trainer.layout)
    out["values"] = exp.values
    exp.advantages, exp.returns, _ = trainer.advantages(exp)
    critic_metrics = update_critic(trainer.critic, trainer.critic_opt, exp, trainer.cfg,
                                   trainer.mini_batch_rows, trainer.device)
    out["critic_loss"], out["critic_grads"] = critic_metrics["critic/loss"], _grads(trainer.critic)
    policy_metrics = trainer.update_policy(exp)
    out["policy_loss"], out["policy_grads"] = policy_metrics["policy/loss"], _grads(trainer.policy)
    return out


def test_every_pass_agrees_over_layouts(rl_config):
    trainers = {name: build_rl_trainer(rl_config(*COMMON, *extra))
                for name, extra in LAYOUTS.items()}
    base = trainers["padded-rows"]
    for t in trainers.values():  # the critic's value head is freshly initialised in each
        t.critic.load_state_dict(base.critic.state_dict())
    assert trainers["packed-tokens"].layout.packed and not base.layout.max_tokens
    exp, _ = base.collect({})
    assert len(exp) == 16 and exp.response_mask.sum() > 0
    results = {name: _passes(t, exp) for name, t in trainers.items()}
    for name, out in results.items():
        for key, value in out.items():
            _close(value, results["padded-rows"][key], f"{name} {key}")
    # The packed layout really removed padding: its micro-batches compute fewer columns.
    from primekit.rollout.batching import iter_layout

    def computed(t):
        return sum(mb.tokens_computed for mb in iter_layout(exp.batch, t.layout))

    assert computed(trainers["packed-tokens"]) < computed(base)


def _stable(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith(("timing/", "throughput/"))}


def test_three_steps_follow_the_same_trajectory(rl_config):
    # Same seeds, same SFT checkpoint; only the layout differs. Float rounding differs (1e-7 in
    # log-probs), so metrics are compared to 1e-4 absolute and the sampled tokens must be equal.
    runs = {}
    for name in ("padded-rows", "packed-tokens"):
        trainer = build_rl_trainer(rl_config("policy.old_logprobs=recompute", *LAYOUTS[name]))
        history, batches = [], []
        for _ in range(3):
            history.append(_stable(trainer.train_step()))
            batches.append(trainer.last_experience.batch.response_ids.clone())
            trainer.step += 1
        runs[name] = (history, batches, trainer)
    (h_pad, b_pad, t_pad), (h_pack, b_pack, t_pack) = runs["padded-rows"], runs["packed-tokens"]
    for step, (a, b) in enumerate(zip(h_pad, h_pack)):
        assert torch.equal(b_pad[step], b_pack[step]), f"step {step + 1}: different samples"
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], abs=1e-4), f"step {step + 1} {k}"
    for a, b in zip(t_pad.policy.parameters(), t_pack.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-3)


@pytest.mark.parametrize("layout", ["packed-tokens", "sorted-tokens"])
def test_every_packed_model_is_probed_before_training(rl_config, monkeypatch, layout):
    # The policy and critic in the policy's micro-batches, the PRM and (PRIME) the reference in
    # the PRM's: each model whose layout packs is probed once when the trainer is built.
    import primekit.factory as factory

    probed = []
    monkeypatch.setattr(factory, "check_packed_attention",
                        lambda model, section, head="lm": probed.append((section, head)))
    build_rl_trainer(rl_config(*COMMON, *LAYOUTS[layout]))
    expected = [("policy", "lm"), ("prm", "lm"), ("prm", "lm"), ("policy", "value")]
    assert sorted(probed) == (sorted(expected) if layout == "packed-tokens" else [])


@pytest.mark.parametrize("layout", ["padded-rows", "packed-tokens"])
def test_the_update_reports_the_padding_its_forwards_compute(rl_config, layout):
    # throughput/update_padding against the policy update's own micro-batches: the columns they
    # compute (padding included) and the batch's real tokens, over every epoch.
    from primekit.rollout.batching import iter_layout, row_chunks

    trainer = build_rl_trainer(rl_config(*COMMON, *LAYOUTS[layout], "policy.ppo_epochs=2"))
    metrics = trainer.train_step()
    batch = trainer.last_experience.batch
    columns = sum(mb.tokens_computed for mini in row_chunks(len(batch.responses),
                                                             trainer.mini_batch_rows)
                  for mb in iter_layout(batch, trainer.layout, mini))
    valid = int(batch.prompt_mask.sum() + batch.response_mask.sum())
    assert metrics["throughput/update_padding"] == pytest.approx(1 - valid / columns)
    assert 0 < metrics["throughput/update_padding"] < 1
