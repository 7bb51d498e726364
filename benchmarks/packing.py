"""Micro-batch layouts of one forward + backward pass, side by side in one process.

The tiny model (random weights: the time does not depend on them) scores one synthetic batch of
`--rows` rows, prompts of 18-40 and responses of 12-64 tokens (10% at 64, as truncated ones) —
the shape of the demo's batches — with a policy-style loss (log-probs and entropies, backward), in
each layout (`primekit.rollout.batching.Layout`), interleaved round by round:

  padded-rows      micro_batch_size rows per forward, left/right padded (the old layout)
  sorted-budget    token budget, rows longest first, padded rows (length-sorted buckets)
  packed-1.0x      packed rows as long as the micro-batch's longest sequence
  packed-1.5x      packed rows 1.5x the longest sequence (what ships: PACKED_ROW_FACTOR)
  packed-2.0x      packed rows 2x the longest sequence
  packed-one-row   the whole micro-batch in one packed row (what flash attention would take)

All layouts compute the same loss and gradients (tests/models/test_packing.py); they differ only in
the columns they compute (printed: padding share) and in the attention mask's shape (sdpa on a
CPU builds a dense block-diagonal mask, so a packed row of C columns costs C^2 attention).

Usage:
    python benchmarks/packing.py [--rows 64] [--rounds 6] [--threads 1] [--model DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch

from primekit.models.logprobs import micro_batch_logprobs
from primekit.rollout import batching
from primekit.rollout.base import RolloutBatch
from primekit.rollout.batching import Layout, iter_layout


def demo_like_batch(n: int, seed: int = 1, P: int = 40, T: int = 64) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(18, P + 1, (n,), generator=g)
    t_len = torch.randint(12, T + 1, (n,), generator=g)
    t_len[torch.rand(n, generator=g) < 0.1] = T
    prompt_ids, prompt_mask = torch.zeros(n, P, dtype=torch.long), torch.zeros(n, P, dtype=torch.long)
    response_ids, response_mask = torch.zeros(n, T, dtype=torch.long), torch.zeros(n, T, dtype=torch.long)
    for i in range(n):
        p, t = int(p_len[i]), int(t_len[i])
        prompt_ids[i, P - p :], prompt_mask[i, P - p :] = torch.randint(3, 99, (p,), generator=g), 1
        response_ids[i, :t], response_mask[i, :t] = torch.randint(3, 99, (t,), generator=g), 1
    return RolloutBatch(prompt_ids, prompt_mask, response_ids, response_mask, torch.zeros(n, T),
                        torch.ones(n, dtype=torch.bool), [""] * n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=None, help="a causal LM directory (default: the tiny model)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    model_dir = args.model
    if model_dir is None:
        from primekit.models.tiny import build_tiny_model

        model_dir = build_tiny_model(tempfile.mkdtemp(prefix="primekit-bench-packing-") + "/m")
    model = AutoModelForCausalLM.from_pretrained(model_dir).float().train()
    b = demo_like_batch(args.rows)
    n, budget = args.rows, 100_000
    variants = {  # name: (layout, PACKED_ROW_FACTOR or None for "one row")
        "padded-rows": (Layout(n, 4), 1.5), "sorted-budget": (Layout(n, 4, 1024), 1.5),
        "packed-1.0x": (Layout(n, 4, budget, True), 1.0),
        "packed-1.5x": (Layout(n, 4, budget, True), 1.5),
        "packed-2.0x": (Layout(n, 4, budget, True), 2.0),
        "packed-one-row": (Layout(n, 4, budget, True), float(n * 200)),
    }
    valid = int(b.prompt_mask.sum() + b.response_mask.sum())

    def run(name: str) -> int:
        layout, factor = variants[name]
        batching.PACKED_ROW_FACTOR = factor
        model.zero_grad(set_to_none=True)
        computed = 0
        for mb in iter_layout(b, layout):
            computed += mb.tokens_computed
            lp, ent = micro_batch_logprobs(model, mb, compute_entropy=True)
            ((lp + 0.01 * ent).sum() / b.response_mask.sum()).backward()
        return computed

    computed = {name: run(name) for name in variants}  # warm-up
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in variants:
            t0 = time.perf_counter()
            run(name)
            times[name].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    base = statistics.median(times["padded-rows"])
    print(f"{args.rows} rows, {valid} tokens, {args.threads} thread(s), forward + backward, seconds")
    print(f"{'layout':16} {'padding':>8} {'n':>3} {'median':>8} {'min':>8} {'max':>8} {'vs padded':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:16} {100 * (1 - valid / computed[name]):7.1f}% {len(ts):3d} {med:8.3f} "
              f"{min(ts):8.3f} {max(ts):8.3f} {med / base:8.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
