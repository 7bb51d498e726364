"""A briefly fine-tuned tiny model and a small RL config, shared by the trainer tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from primekit.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "primekit" / "configs" / "tiny.yaml"


def small_overrides(policy: Path, run_dir: Path) -> list[str]:
    return [
        f"model.policy={policy}",
        f"train.run_dir={run_dir}",
        "train.steps=2",
        "train.prompts_per_step=4",
        "train.save_every=0",
        "train.report_to=[]",
        "rollout.max_new_tokens=24",
        # An SFT model this short-trained is nearly always wrong; the filter would drop everything.
        "filter.enabled=false",
        "prm.mini_batch_size=16",
        "prm.micro_batch_size=16",
        "policy.mini_batch_size=8",
        "policy.micro_batch_size=8",
        "eval.num_problems=8",
        "eval.k=2",
        "data.num_train=200",
        "data.num_eval=8",
    ]


@pytest.fixture(scope="session")
def sft_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from primekit.trainer.sft import run_sft

    out = tmp_path_factory.mktemp("sft") / "model"
    cfg = load_config(CONFIG, [f"sft.out_dir={out}", "sft.steps=30", "sft.batch_size=32",
                               "sft.warmup_steps=5", "data.num_train=500",
                               "train.report_to=[]"])
    run_sft(cfg)
    return out


@pytest.fixture
def rl_config(sft_model_dir: Path, tmp_path: Path):
    def make(*extra: str):
        return load_config(CONFIG, small_overrides(sft_model_dir, tmp_path / "run") + list(extra))

    return make


@pytest.fixture
def rl_overrides(sft_model_dir: Path):
    """`small_overrides` as `primekit train` arguments: rl_overrides(run_dir, *extra)."""
    return lambda run_dir, *extra: small_overrides(sft_model_dir, run_dir) + list(extra)
