"""Is there a spare core to hide PRIME's PRM work on? One rollout and one PRM forward + backward,
run one after the other on 2 torch threads (what `train.threads=2` does), against side by side on
1 thread each (the PRM in a second Python thread, as a concurrent schedule would run them).

The demo's config and SFT model: the rollout is K samples of `--prompts` training prompts
(`engine.generate`, as the trainer calls it); the PRM pass is one forward + backward of the implicit
PRM over a collected, filtered batch in the PRM's micro-batches (no optimiser step, gradients
dropped). Each round runs every variant once, in turn; the first round is a warm-up. Printed: the
median seconds of each, and how much the side-by-side schedule saves on these two phases.

Usage:
    python benchmarks/idle_core.py --policy runs/demo/sft [--prompts 64] [--rounds 6] [overrides ...]

Config overrides apply to the demo's config, e.g. `filter.enabled=false` for a model that solves
nothing (the filter would keep no batch for the PRM pass), or a shorter `rollout.max_new_tokens`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import torch
from common import add_policy_argument, missing_policy

from primekit.config import load_config, resolve_config
from primekit.factory import build_rl_trainer
from primekit.models.logprobs import sequence_logprobs
from primekit.rollout.base import SamplingParams
from primekit.rollout.batching import iter_micro_batches


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_policy_argument(parser)
    parser.add_argument("--prompts", type=int, default=64, help="prompts in the timed rollout")
    parser.add_argument("--rounds", type=int, default=6, help="rounds, the first one untimed")
    parser.add_argument("--run-dir", default="runs/bench-idle-core")
    parser.add_argument("overrides", nargs="*", help="config overrides (default: none)")
    args = parser.parse_args(argv)
    if missing_policy(args.policy):
        return 2
    cfg = load_config(resolve_config("tiny"), [
        f"model.policy={args.policy}", f"train.run_dir={args.run_dir}", "train.report_to=[]",
        *args.overrides])
    trainer = build_rl_trainer(cfg)
    prm = trainer.rewarder.model
    exp, _ = trainer.collect({})  # a real filtered batch for the PRM pass
    if exp is None:
        print("the filter kept no group for the PRM pass: pass filter.enabled=false",
              file=sys.stderr)
        return 2
    K = cfg.rollout.n_samples
    prompt_ids = [trainer.train_prompt_ids[i] for i in range(args.prompts) for _ in range(K)]
    params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_new_tokens=cfg.rollout.max_new_tokens)

    def rollout() -> None:
        trainer.engine.generate(prompt_ids, params, torch.Generator().manual_seed(0))

    def prm_pass() -> None:
        prm.train()
        for mb in iter_micro_batches(exp.batch, cfg.prm.micro_batch_size, K):
            lp, _ = sequence_logprobs(prm, mb.input_ids, mb.attention_mask, mb.response_len)
            lp.sum().backward()
        prm.zero_grad(set_to_none=True)

    def side_by_side() -> float:
        def prm_thread() -> None:
            torch.set_num_threads(1)  # this thread's OpenMP pool
            prm_pass()

        start = time.perf_counter()
        worker = threading.Thread(target=prm_thread)
        worker.start()
        torch.set_num_threads(1)
        rollout()
        worker.join()
        return time.perf_counter() - start

    runs: dict[str, list[float]] = {k: [] for k in ("r2", "p2", "r1", "p1", "both")}
    for round_ in range(args.rounds):
        torch.set_num_threads(2)
        r2, p2 = _seconds(rollout), _seconds(prm_pass)
        torch.set_num_threads(1)
        r1, p1 = _seconds(rollout), _seconds(prm_pass)
        both = side_by_side()
        if round_ > 0:
            for key, value in zip(runs, (r2, p2, r1, p1, both)):
                runs[key].append(value)
        print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr)
    m = {k: statistics.median(v) for k, v in runs.items()}
    sequential = m["r2"] + m["p2"]
    print(f"rollout ({args.prompts} prompts x {K}): {m['r2']:.3f} s on 2 threads, "
          f"{m['r1']:.3f} s on 1 ({m['r1'] / m['r2']:.2f}x)")
    print(f"PRM forward + backward ({len(exp)} rows): {m['p2']:.3f} s on 2 threads, "
          f"{m['p1']:.3f} s on 1 ({m['p1'] / m['p2']:.2f}x)")
    print(f"one after the other on 2 threads: {sequential:.3f} s; side by side on 1 thread each: "
          f"{m['both']:.3f} s (saves {sequential - m['both']:.3f} s, "
          f"{100 * (1 - m['both'] / sequential):.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
