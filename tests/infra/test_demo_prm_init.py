"""`primekit demo --prm-init`: the PRM and its reference start from a second SFT model of seed
sft.seed + 1 (the default, chosen by prm-init-tuning), or from the policy's SFT model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primekit import cli
from primekit.config import CONFIG_DIR, ConfigError, load_config
from primekit.demo import demo_overrides, prm_sft_config

SMALL = ["sft.steps=2", "sft.threads=1", "train.steps=1", "train.threads=1",
         "data.num_train=64", "data.num_eval=4", "eval.num_problems=4", "eval.k=1",
         "train.prompts_per_step=2", "rollout.max_new_tokens=8", "filter.enabled=false",
         "train.report_to=[]"]


def _cfg(run: Path, overrides: list[str], prm_init: str):
    return load_config(CONFIG_DIR / "tiny.yaml", demo_overrides(run, overrides, prm_init))


def test_separate_prm_is_an_sft_model_of_the_next_seed_in_its_own_directory():
    run = Path("runs/d")
    cfg = _cfg(run, ["sft.seed=3"], "separate")
    assert cfg.model.policy == "runs/d/sft"
    assert cfg.model.prm == cfg.model.ref == "runs/d/sft-prm"
    prm = prm_sft_config(cfg, run)
    assert (prm.sft.seed, prm.sft.out_dir) == (4, "runs/d/sft-prm")
    # Everything else is the policy's SFT: same steps, rate, data, model.
    assert prm.sft.steps == cfg.sft.steps and prm.sft.lr == cfg.sft.lr and prm.data == cfg.data
    assert cfg.sft.seed == 3 and cfg.sft.out_dir == "runs/d/sft"  # the policy's left as it was


def test_policy_prm_and_a_users_prm_train_no_second_sft_model():
    run = Path("runs/d")
    policy = _cfg(run, [], "policy")
    assert policy.model.prm is None and policy.model.ref is None  # PRIME's: the policy's SFT model
    assert prm_sft_config(policy, run) is None
    users = _cfg(run, ["model.prm=elsewhere/prm", "model.ref=elsewhere/prm"], "separate")
    assert users.model.prm == "elsewhere/prm"  # the user's override wins
    assert prm_sft_config(users, run) is None
    # The user's PRM, the demo's reference: the reference's SFT model is still made.
    half = _cfg(run, ["model.prm=elsewhere/prm"], "separate")
    assert half.model.ref == "runs/d/sft-prm" and prm_sft_config(half, run).sft.seed == 1
    with pytest.raises(ConfigError, match="demo --prm-init: expected one of separate, policy"):
        demo_overrides(run, [], "shared")


def test_the_demos_prm_starts_where_prm_init_says(tmp_path):
    import torch

    from primekit.models.hf import load_model

    run = tmp_path / "demo"
    assert cli.main(["demo", "--run-dir", str(run), *SMALL]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["prm_from"] == str(run / "sft-prm") and summary["prm_sft_wall_s"] > 0
    # The padding its forwards computed, SFT's and the policy update's (both packed): shares.
    assert 0 <= summary["sft_padding"] < 1 and 0 <= summary["update_padding"] < 1
    assert 0 <= summary["prm_sft_padding"] < 1
    policy, prm = load_model(str(run / "sft")), load_model(str(run / "sft-prm"))
    # Another seed: another initial model and data order, so other weights.
    assert not torch.equal(policy.get_input_embeddings().weight, prm.get_input_embeddings().weight)

    assert cli.main(["demo", "--run-dir", str(run), "--prm-init", "policy", *SMALL]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["prm_from"] == str(run / "sft") and "prm_sft_wall_s" not in summary
    assert not (run / "sft-prm").exists()  # the earlier demo's was replaced, none made


def test_second_half_pairwise():
    from primekit.demo import second_half_pairwise

    # Four steps: the second half is steps 3-4; step 3 had no pair (every group's outcomes equal).
    steps = [{"prm/acc_pairwise": 0.1}, {"prm/acc_pairwise": 0.2}, {}, {"prm/acc_pairwise": 0.7}]
    assert second_half_pairwise(steps) == (0.7, "3-4")
    # Five steps: the later half is steps 3-5 (the middle step counts), (0.5 + 0.6 + 0.9) / 3.
    steps = [{}, {}, *({"prm/acc_pairwise": v} for v in (0.5, 0.6, 0.9))]
    value, span = second_half_pairwise(steps)
    assert abs(value - 2.0 / 3) < 1e-12 and span == "3-5"
    assert second_half_pairwise([{"reward/outcome_mean_sampled": 0.5}] * 4) == (None, "")
