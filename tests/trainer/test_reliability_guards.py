"""Issue 22 point 2: one guarded optimiser step for every trained model, nothing non-finite saved,
learning rates within float32. Each model's divergence is injected with a learning rate far too
large (the issue's `prm.lr=1e20`); every one must stop the run before anything is saved."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from primekit.config import ConfigError, load_config
from primekit.factory import build_rl_trainer
from primekit.models.optim import WEIGHT_GROWTH_LIMIT, NonFiniteError, guarded_step
from primekit.trainer import checkpoint as ckpt
from tests.trainer.test_reliability_run import NaNVerifier

CONFIG = Path(__file__).resolve().parents[2] / "primekit" / "configs" / "tiny.yaml"


def _one_weight(value: float, grad: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    model.weight.grad = torch.full_like(model.weight, grad)
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


def test_guarded_step_applies_a_sound_step_and_refuses_a_diverged_one():
    # SGD lr 1: w = 1 - g. g = -0.5 -> w = 1.5: the norm grows 1.5x (< 2x), applied.
    model, opt = _one_weight(1.0, -0.5)
    norm, stepped = guarded_step("m", model, opt, grad_clip=10.0)
    assert stepped and float(norm) == 0.5 and model.weight.item() == 1.5
    # g = -1.5 -> w = 2.5: 2.5x > WEIGHT_GROWTH_LIMIT (2), a diverged update.
    assert WEIGHT_GROWTH_LIMIT == 2.0
    model, opt = _one_weight(1.0, -1.5)
    with pytest.raises(NonFiniteError, match=r"step 7: m update diverged: the weights' norm grew "
                                             r"from 1 to 2.5, more than 2x"):
        guarded_step("m", model, opt, grad_clip=10.0, step=7)
    # Clipping comes first: g = -1.5 clipped to norm 0.5 -> w = 1.5, applied; the norm returned
    # is the one before clipping (torch clips by 0.5 / (1.5 + 1e-6)).
    model, opt = _one_weight(1.0, -1.5)
    norm, stepped = guarded_step("m", model, opt, grad_clip=0.5)
    assert stepped and float(norm) == 1.5 and model.weight.item() == pytest.approx(1.5, abs=1e-6)


def test_guarded_step_skips_or_aborts_a_nonfinite_gradient_and_always_aborts_nonfinite_weights():
    model, opt = _one_weight(1.0, float("nan"))
    norm, stepped = guarded_step("m", model, opt, grad_clip=1.0, mode="skip")
    assert not stepped and model.weight.item() == 1.0 and model.weight.grad is None
    model, opt = _one_weight(1.0, float("inf"))
    with pytest.raises(NonFiniteError, match="m/grad_norm is not finite"):
        guarded_step("m", model, opt, grad_clip=1.0, mode="abort")
    # A finite gradient whose update overflows float32 (lr 1e38 x g 1e10): weights inf, and a
    # step already applied cannot be skipped, so "skip" aborts too.
    model, opt = _one_weight(1.0, -1e10)
    opt.param_groups[0]["lr"] = 1e38
    with pytest.raises(NonFiniteError, match="m update diverged: the weights' norm is not finite"):
        guarded_step("m", model, opt, grad_clip=1e30, mode="skip")


# One case per model the RL loop trains: the learning rate that breaks it, the message.
DIVERGED = {
    "prm": (["prm.lr=1e20"], "prm update diverged"),
    "prm-nonfinite": (["prm.lr=1e20", "prm.weight_decay=1e20"], "prm update diverged: the "
                      "weights' norm is not finite"),
    "critic": (["algorithm.estimator=ppo", "critic.lr=1e20"], "critic update diverged"),
    "policy": (["policy.lr=1e20"], "policy update diverged"),
}


@pytest.mark.parametrize("case", list(DIVERGED))
def test_a_diverged_update_of_any_trained_model_stops_before_any_save(case, rl_config):
    extra, message = DIVERGED[case]
    # train.on_nonfinite=skip: a diverged update is not skippable; it aborts anyway.
    cfg = rl_config("train.steps=1", "train.save_every=1", "train.on_nonfinite=skip", *extra)
    # Rewards by parity: the tiny SFT model is nearly always wrong, and all-zero rewards give
    # the policy a zero gradient (nothing to diverge).
    trainer = build_rl_trainer(cfg, verifier=NaNVerifier(0))
    with pytest.raises(NonFiniteError, match=f"step 1: {message}"):
        trainer.train()
    run = Path(cfg.train.run_dir)
    assert ckpt.latest_checkpoint(run) is None and not (run / "final").exists()


def test_save_refuses_nonfinite_weights(tmp_path):
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[1, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"step 3: prm weight weight is not finite; "
                                             r"checkpoint .*step_000003 was not written"):
        ckpt.save_checkpoint(tmp_path, 3, models={"prm": model})
    assert ckpt.latest_checkpoint(tmp_path) is None
    assert not ckpt.checkpoint_dir(tmp_path, 3).exists()
    assert not list((tmp_path / ckpt.CHECKPOINTS).glob(".tmp-*"))


def test_sft_divergence_stops_before_its_output_is_written(tmp_path):
    from primekit.trainer.sft import run_sft

    out = tmp_path / "sft"
    cfg = load_config(CONFIG, [f"sft.out_dir={out}", "sft.steps=3", "sft.batch_size=8",
                               "sft.warmup_steps=1", "sft.lr=1e20", "data.num_train=50",
                               "train.report_to=[]"])
    with pytest.raises(NonFiniteError, match=r"step \d: sft update diverged"):
        run_sft(cfg)
    assert not out.exists()


def test_learning_rates_beyond_float32_are_refused_at_load():
    for field in ("policy.lr", "critic.lr", "prm.lr", "sft.lr", "prm.weight_decay"):
        with pytest.raises(ConfigError, match=rf"{field}: 1e\+39 is beyond float32's range"):
            load_config(CONFIG, [f"{field}=1e39"])
    load_config(CONFIG, ["policy.lr=3e38"])  # representable: accepted (and guarded at the step)


@pytest.mark.parametrize("command,section", [("train-orm", "orm"), ("train-prm", "step_prm")])
def test_a_diverged_reward_model_fit_stops_before_its_output_is_written(command, section,
                                                                        tiny_model_dir, tmp_path):
    """The ORM / step-PRM fits take their steps through the same guard: at lr 1e20 the first
    AdamW step moves every weight by ~1e20 (far past 2x the norm), so the fit raises and the output
    directory never receives a model."""
    from tests.reward_models.test_rm_commands_and_rl import CONFIG as EXPLICIT
    from tests.reward_models.test_rm_commands_and_rl import _common, _run

    out = tmp_path / section
    with pytest.raises(NonFiniteError, match=r"update diverged"):
        _run(command, "--config", str(EXPLICIT), *_common(tiny_model_dir),
             f"{section}.out_dir={out}", f"{section}.lr=1e20", f"{section}.num_problems=4",
             f"{section}.n_samples=2", f"{section}.num_eval_problems=2", f"{section}.epochs=1",
             f"{section}.batch_size=4", *(["orm.mixed_only=false"] if section == "orm" else []))
    assert not (out / "config.json").exists() and not (out / "model.safetensors").exists()
