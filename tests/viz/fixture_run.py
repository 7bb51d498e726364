"""A hand-written run directory: 20 PRIME steps, healthy for 10, then reward hacking."""

from __future__ import annotations

import json
from pathlib import Path

STEPS = 20


def metric_row(step: int) -> dict:
    hacked = step > 10
    return {
        "step": step, "time": 1.7e9 + step,
        "reward/outcome_mean_sampled": 0.3 if hacked else 0.5,
        "reward/outcome_mean": 0.2 if hacked else 0.5,
        # sigmoid(3) = 0.953 while hacked; sigmoid(0) = 0.5 before
        "reward/implicit_seq_mean": 3.0 if hacked else 0.0,
        "prm/acc_pairwise": 0.3 if hacked else 0.9,
        "prm/acc_abs": 0.4 if hacked else 0.85,
        "hack/dense_success_corr": -0.5 if hacked else 0.6,
        "hack/repeated_step_share": 0.4 if hacked else 0.0,
        "timing/rollout": 1.0, "timing/verify": 0.1, "timing/prm_update": 0.5,
        "timing/policy_update": 0.6, "timing/step": 2.3,
        **({"eval/pass@1_greedy": 0.55} if step == 10 else {}),
    }


SAMPLE = {"prompt": "Q:3+4=", "response": "7\nA:7", "score": 1.0, "status": "correct",
          "tokens": ["7", "\n", "A", ":", "7", "</s>"],
          "token_rewards": [0.02, -0.01, 0.0, 0.0, 0.05, 0.0]}


def write_run(run_dir: Path, steps: int = STEPS) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps(metric_row(step)) + "\n")
    with open(run_dir / "samples.jsonl", "w") as f:
        for step in (steps - 1, steps):
            for i in range(2):
                f.write(json.dumps({"step": step, **SAMPLE, "response": f"{step}-{i}"}) + "\n")
    return run_dir
