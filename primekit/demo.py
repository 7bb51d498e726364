"""`primekit demo`: the embedded default end to end on a CPU.

Build the tiny model, SFT it on the arithmetic demonstrations, evaluate it, run PRIME from it,
evaluate again, and print a summary table. Nothing is downloaded.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from primekit.config import CONFIG_DIR, load_config
from primekit.logging import console, print_table


def run_demo(run_dir: Path, overrides: list[str] | None = None) -> dict:
    from primekit.factory import build_rl_trainer
    from primekit.trainer.eval import evaluate_checkpoint
    from primekit.trainer.sft import run_sft

    start = time.perf_counter()
    sft_dir, rl_dir = run_dir / "sft", run_dir / "prime"
    defaults = [f"sft.out_dir={sft_dir}", f"model.policy={sft_dir}", f"train.run_dir={rl_dir}"]
    cfg = load_config(CONFIG_DIR / "tiny.yaml", defaults + list(overrides or []))

    console.rule("[bold]1/3  SFT of the tiny model")
    sft = run_sft(cfg)
    console.rule("[bold]2/3  Evaluate the SFT model")
    sft_eval = evaluate_checkpoint(cfg, str(sft_dir))
    console.rule(f"[bold]3/3  PRIME: {cfg.train.steps} RL steps")
    t_rl = time.perf_counter()
    trainer = build_rl_trainer(cfg)
    history = trainer.train()
    rl_wall = time.perf_counter() - t_rl
    rl_eval = history[-1]
    wall = time.perf_counter() - start

    k = cfg.eval.k
    rows = [
        {"model": "SFT", "pass@1 (greedy)": sft_eval["eval/pass@1_greedy"],
         f"avg@{k}": sft_eval[f"eval/avg@{k}"], f"pass@{k}": sft_eval[f"eval/pass@{k}"],
         "steps": cfg.sft.steps, "wall (s)": sft["sft/wall_s"]},
        {"model": "PRIME", "pass@1 (greedy)": rl_eval["eval/pass@1_greedy"],
         f"avg@{k}": rl_eval[f"eval/avg@{k}"], f"pass@{k}": rl_eval[f"eval/pass@{k}"],
         "steps": cfg.train.steps, "wall (s)": rl_wall},
    ]
    print_table(f"primekit demo: {len(trainer.eval_problems)} held-out problems", rows)
    gain = rl_eval["eval/pass@1_greedy"] - sft_eval["eval/pass@1_greedy"]
    console.print(f"greedy pass@1 change: {100 * gain:+.1f} points; total wall time {wall:.0f} s")
    console.print(f"SFT model: {sft_dir}\nPRIME run (checkpoints, metrics.jsonl, tensorboard): "
                  f"{rl_dir}")
    summary = {"sft": sft_eval, "prime": rl_eval, "wall_s": wall, "rl_wall_s": rl_wall,
               "sft_wall_s": sft["sft/wall_s"], "rl_steps": cfg.train.steps}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
