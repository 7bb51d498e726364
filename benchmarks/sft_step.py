"""SFT steps in padded rows against packed micro-batches, side by side in one process.

Two copies of one model (each with its own AdamW) train on the same demonstrations of a config
(the demo's `tiny` unless --config says otherwise): one with each batch as a single padded
micro-batch (`sft.max_tokens_per_micro_batch=0`), one with the config's token budget and packing
(`--budget`, default the config's, else 4096). Steps alternate between the two (padded, packed,
padded, ...) so that machine noise falls on both alike; the first `--warmup` of each are not
counted. A step is what `primekit sft` does per batch: `sft_backward` (forward and backward over
the micro-batches) and the guarded optimiser step; building the batch from text is not timed.
Printed: median, min, max and n per side, the ratio of medians, the padding share of the columns
each side computes, and the two sides' losses at the last step (the same to float rounding: the
layouts compute the same loss).

Usage:
    python benchmarks/sft_step.py [--model DIR] [--steps 30] [--threads 2] [overrides ...]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time

import torch

from primekit.config import load_config, resolve_config
from primekit.data.splits import encode_prompts, load_splits
from primekit.models.optim import guarded_step
from primekit.rollout.base import batch_from_texts
from primekit.rollout.batching import iter_layout
from primekit.trainer.sft import sft_backward, sft_layout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--model", default=None,
                        help="a causal LM directory (default: the tiny model, random weights)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget", type=int, default=None,
                        help="tokens per packed micro-batch (default: the config's, else 4096)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()

    from primekit.models.hf import load_model, load_tokenizer

    torch.set_num_threads(args.threads)
    cfg = load_config(resolve_config(args.config), args.overrides)
    model_dir = args.model
    if model_dir is None:
        import tempfile

        from primekit.models.tiny import build_tiny_model

        model_dir = str(build_tiny_model(tempfile.mkdtemp() + "/tiny", seed=0))
    tokenizer = load_tokenizer(model_dir)
    base = load_model(model_dir, dtype=torch.float32, device="cpu")
    base.train()
    train, _ = load_splits(cfg)
    train = [p for p in train if p.solution]
    rows = cfg.sft.batch_size
    n_batches = args.steps + args.warmup
    if n_batches * rows > len(train):
        print(f"{n_batches} batches of {rows} need {n_batches * rows} demonstrations; the config "
              f"has {len(train)}", file=sys.stderr)
        return 2
    prompt_ids = encode_prompts(tokenizer, train[: n_batches * rows], cfg)

    budget = args.budget or cfg.sft.max_tokens_per_micro_batch or 4096
    sections = {"padded": dataclasses.replace(cfg.sft, max_tokens_per_micro_batch=0),
                "packed": dataclasses.replace(cfg.sft, max_tokens_per_micro_batch=budget,
                                       packing="packed")}
    sides = {}
    for name, section in sections.items():
        model = copy.deepcopy(base)
        optimizer = torch.optim.AdamW(model.parameters(), lr=section.lr)
        sides[name] = (model, optimizer, sft_layout(section))
    seconds = {name: [] for name in sides}
    computed = dict.fromkeys(sides, 0)
    valid = 0
    last_loss = {}
    for step in range(n_batches):
        idx = range(step * rows, (step + 1) * rows)
        batch = batch_from_texts(tokenizer, [prompt_ids[i] for i in idx],
                                 [train[i].solution for i in idx])
        counted = step >= args.warmup
        if counted:
            valid += int(batch.prompt_mask.sum() + batch.response_mask.sum())
        for name, (model, optimizer, layout) in sides.items():
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            metrics = sft_backward(model, batch, layout)
            guarded_step("sft", model, optimizer, grad_clip=cfg.sft.grad_clip, mode="raise",
                         step=step + 1, lr_field="sft.lr")
            elapsed = time.perf_counter() - start
            last_loss[name] = metrics["sft/loss"]
            if counted:
                seconds[name].append(elapsed)
                computed[name] += sum(mb.tokens_computed for mb in iter_layout(batch, layout))
        print(f"step {step + 1}/{n_batches}", file=sys.stderr)

    print(f"SFT steps of {args.config} ({rows} demonstrations each), {args.threads} thread(s), "
          f"packed budget {budget} tokens, seconds per step")
    print(f"{'layout':8} {'padding':>8} {'n':>3} {'median':>8} {'min':>8} {'max':>8} {'last loss':>10}")
    for name, ts in seconds.items():
        print(f"{name:8} {100 * (1 - valid / computed[name]):7.1f}% {len(ts):3d} "
              f"{statistics.median(ts):8.4f} {min(ts):8.4f} {max(ts):8.4f} {last_loss[name]:10.6f}")
    ratio = statistics.median(seconds["packed"]) / statistics.median(seconds["padded"])
    print(f"packed / padded step time: {ratio:.3f}x (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
