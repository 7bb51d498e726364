"""The three commands through the CLI seam, then every reward mode for two RL steps (tiny model).

The reward models are trained by `train-orm` / `train-prm` themselves, for a handful of steps on a
few problems; the tiny model is the random-init one (what matters here is that every path runs and
that the explicit reward model stays frozen, not what it learned).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import pytest
import torch

from primekit.reward_models.cli import COMMANDS, add_subcommands, dispatch

CONFIG = Path(__file__).resolve().parents[2] / "primekit" / "configs" / "tiny-explicit.yaml"
HACK_KEYS = (
    "hack/steps_per_response",
    "hack/repeated_step_share",
    "hack/repeated_ngram_share",
    "hack/response_len_chars",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    return parser


def _run(*argv: str) -> bool:
    return dispatch(_parser().parse_args(list(argv)))


def _common(policy: Path) -> list[str]:
    return [
        f"model.policy={policy}",
        "rollout.max_new_tokens=16",
        "data.num_train=50",
        "data.num_eval=8",
        "train.report_to=[]",
        "train.threads=0",
    ]


def _train_reward_models(root: Path, common: list[str]) -> None:
    """`train-orm` into root/orm and `train-prm` into root/prm, a handful of steps each."""
    assert _run(
        "train-orm",
        "--config",
        str(CONFIG),
        *common,
        f"orm.out_dir={root / 'orm'}",
        "orm.num_problems=6",
        "orm.n_samples=2",
        "orm.num_eval_problems=3",
        "orm.epochs=1",
        "orm.batch_size=6",
        "orm.mixed_only=false",
    )
    assert _run(
        "train-prm",
        "--config",
        str(CONFIG),
        *common,
        f"step_prm.out_dir={root / 'prm'}",
        "step_prm.num_problems=3",
        "step_prm.n_samples=2",
        "step_prm.n_completions=2",
        "step_prm.num_eval_problems=2",
        "step_prm.epochs=1",
    )


@pytest.fixture(scope="module")
def work(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("explicit")
    common = _common(tiny_model_dir)
    _train_reward_models(root, common)
    return root, common


def test_commands_take_only_config_and_overrides():
    parser = _parser()
    for command in COMMANDS:
        args = parser.parse_args([command, "--config", "tiny-explicit", "orm.epochs=2"])
        assert vars(args) == {
            "command": command,
            "config": "tiny-explicit",
            "overrides": ["orm.epochs=2"],
        }
    # The settings that were flags are config fields now, with their defaults in one place.
    with pytest.raises(SystemExit):
        parser.parse_args(["train-orm", "--epochs", "2"])


def test_train_orm_output(work):
    root, _ = work
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(root / "orm")
    assert model.config.num_labels == 1
    summary = json.loads((root / "orm" / "train_metrics.json").read_text())["summary"]
    assert summary["orm/train_responses"] == 12 and summary["orm/heldout/count"] == 6
    assert math.isfinite(summary["orm/loss_train_last_epoch"])


def test_train_prm_output(work):
    root, _ = work
    meta = json.loads((root / "prm" / "train_metrics.json").read_text())
    s = meta["summary"]
    assert meta["n_completions"] == 2 and s["step_prm/train_responses"] == 6
    assert 0.0 <= s["step_prm/heldout/acc"] <= 1.0
    assert 0.0 <= s["step_prm/heldout_prob_all_p25"] <= s["step_prm/heldout_prob_all_p75"] <= 1.0
    rows = [json.loads(x) for x in (root / "prm" / "labels_heldout.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for r in rows:
        assert len(r["steps"]) == len(r["label"]) == len(r["prm_prob"])
        assert "".join(r["steps"]) == r["response"]
        assert set(r["label"]) <= {0.0, 1.0}


def test_hack_check_command(work, capsys):
    root, common = work
    out = root / "hack"
    assert _run(
        "hack-check",
        "--config",
        str(CONFIG),
        *common,
        f"explicit.model_path={root / 'prm'}",
        f"hack_check.out_dir={out}",
        "hack_check.num_responses=3",
        "hack_check.max_repeats=2",
    )
    report = json.loads((out / "hack_check.json").read_text())
    assert report["responses"] == 3 and len(report["rows"]) == 1 + 3 * 2
    assert report["max_gain"]["PR-Delta"] <= 1e-5
    assert all(r["PR-Clip"] <= 0 for r in report["rows"])
    assert (out / "hack_check.png").stat().st_size > 1000
    assert "PR-Clip-Delta" in capsys.readouterr().out


def test_a_model_of_the_wrong_kind_is_refused_by_its_field(work, tiny_model_dir, capsys):
    # The helper's walkthrough (2026-12-08): a language model as the explicit reward model (a
    # fresh random score head) and an ORM given to hack-check both ran to the end, exit 0, on
    # rewards that meant nothing; a reward model as the policy loaded with a warning.
    from primekit import cli
    from primekit.config import ConfigError, load_config
    from primekit.factory import build_rl_trainer

    root, common = work
    for path, what in (
            (root / "orm", "is an outcome reward model (ORM) (primekit train-orm), where a "
                           "step-level PRM belongs (primekit train-prm)"),
            (tiny_model_dir, "is a language model (Qwen2ForCausalLM), not a reward model: it has "
                             "no trained score head (train one with primekit train-prm)")):
        assert cli.main(["hack-check", "--config", str(CONFIG), *common,
                         f"explicit.model_path={path}"]) == 2
        assert capsys.readouterr().err.strip() == (
            f"primekit: configuration error: explicit.model_path: '{path}' {what}")
    for extra, message in (
            ([f"explicit.model_path={root / 'prm'}", "algorithm.reward_mode=explicit-orm",
              "explicit.transform=none"], re.escape("is a step-level PRM (primekit train-prm), "
                                                    "where an outcome reward model (ORM) belongs")),
            ([f"explicit.model_path={tiny_model_dir}"], "is a language model"),
            ([f"model.policy={root / 'prm'}", f"explicit.model_path={root / 'prm'}"],
             "model.policy: .* is a reward model \\(Qwen2ForTokenClassification: a scalar per "
             "token\\), not a language model")):
        with pytest.raises(ConfigError, match=message):
            build_rl_trainer(load_config(CONFIG, [*common, *extra]))


def test_dispatch_leaves_other_commands_alone():
    assert dispatch(argparse.Namespace(command="train")) is False


MODES = {
    "SR": ("algorithm.reward_mode=outcome",),
    "SR+OR": ("algorithm.reward_mode=explicit-orm", "explicit.transform=none"),
    "SR+PR": ("explicit.transform=none",),
    "SR+PR-Clip": ("explicit.transform=clip",),
    "SR+PR-Delta": ("explicit.transform=delta",),
    "SR+PR-Clip-Delta": ("explicit.transform=clip-delta",),
    "SR+PR-Normed": ("explicit.transform=normed",),
    "SR+PR-LenNorm": ("explicit.transform=length-norm",),
    "SR+PR-LenPenalty": ("explicit.transform=length-penalty",),
    "PRIME": ("algorithm.reward_mode=prime", "algorithm.estimator=rloo", "algorithm.kl_coef=0"),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_reward_mode_two_rl_steps(work, mode, tmp_path):
    root, common = work
    _two_rl_steps(root, common, mode, tmp_path / "run")


def _two_rl_steps(root: Path, common: list[str], mode: str, run_dir: Path) -> None:
    """Two RL steps in reward mode `mode` with root's reward models: hack metrics present, the
    policy updated, the explicit reward model frozen and unchanged."""
    from primekit.config import load_config
    from primekit.factory import build_rl_trainer
    from primekit.reward_models.dense import ExplicitRewarder

    cfg = load_config(
        CONFIG,
        [
            *common,
            f"explicit.model_path={root / ('orm' if mode == 'SR+OR' else 'prm')}",
            f"train.run_dir={run_dir}",
            "train.steps=2",
            "train.prompts_per_step=2",
            "rollout.n_samples=2",
            "eval.num_problems=2",
            "eval.k=1",
            "policy.mini_batch_size=4",
            *MODES[mode],
        ],
    )
    trainer = build_rl_trainer(cfg)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    rewarders = [r for r in [trainer.rewarder] if isinstance(r, ExplicitRewarder)]
    assert len(rewarders) == (
        1 if cfg.algorithm.reward_mode in ("explicit-orm", "explicit-prm") else 0
    )
    rm_before = [p.detach().clone() for r in rewarders for p in r.model.parameters()]
    history = trainer.train()
    steps = [m for m in history if "policy/loss" in m]
    assert len(steps) == 2
    for m in steps:
        for key in HACK_KEYS:
            assert key in m, key
        assert math.isfinite(m["hack/steps_per_response"]) and m["hack/steps_per_response"] >= 1
        if mode == "SR":  # no dense reward: NaN, or left out of the line (docs/metrics.md)
            assert math.isnan(m.get("hack/dense_return_mean", math.nan))
        else:
            assert math.isfinite(m["hack/dense_return_mean"])
        if "Clip" in mode:
            assert m["hack/dense_return_mean"] <= 1e-6
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, trainer.policy.parameters()))
    rm_after = [p.detach() for r in rewarders for p in r.model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(rm_before, rm_after))
    assert all(not p.requires_grad for r in rewarders for p in r.model.parameters())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["SR+OR", "SR+PR-Clip-Delta"])
def test_explicit_reward_models_train_and_reward_on_cuda(tiny_model_dir, tmp_path, mode):
    # train-orm and train-prm on the GPU, then PPO with their rewards (critic, frozen reward
    # model, policy all on the GPU): the same checks as on the CPU above.
    common = [*_common(tiny_model_dir), "train.device=cuda"]
    _train_reward_models(tmp_path, common)
    _two_rl_steps(tmp_path, common, mode, tmp_path / "run")
