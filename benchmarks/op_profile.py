"""Where the time of a step's two kinds of work goes: matrix products, attention, everything else.

Two passes of the outcome-only RLOO step that `benchmarks/vs_trl.py` compares with TRL, on the
same shapes (16 prompts x 4 samples, every response `--tokens` long, float32):

  update    one forward + backward of the policy loss (log-probs and entropies, as the policy
            update computes them, through `primekit.models.logprobs`) over the 64 rows;
  rollout   one `generate` of the HF engine (the written-out decode step) over the same 64
            prompts, every row forced to `--tokens` new tokens.

Each pass runs under the torch profiler (`--calls` calls after one warm-up); its CPU time is
split into matrix products of the weights (`mm`, `addmm`), attention (`bmm`, `baddbmm` and the
SDPA kernels) and the rest (norms, rotary embedding, activations, copies, sampling). The script
also counts the weights' matrix-product FLOPs (2 per multiply-add; the backward twice the
forward) and times one matrix product of the model's own shape alone, so the products' rate
can be read against what this CPU attains on that shape. The last lines give each pass's time
if everything but its matrix products and attention cost nothing: a floor for any
implementation that does the same products, fused or not.

`--compile` also times the update with the decoder under `torch.compile(dynamic=True)` (first
call, with the compilation, and the steady state): the fusion of the "rest" that a compiler buys.
`--attention` times one decode step's attention for one layer (64 rows, the model's heads, a
preallocated cache as the engine keeps it) written three ways: the shipped `baddbmm` + `bmm`
(`rollout/decode.py`), elementwise products with a sum, and SDPA.

Usage:
    python benchmarks/op_profile.py --policy runs/demo/sft [--threads 1] [--tokens 64]
        [--calls 3] [--compile] [--attention]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from common import add_policy_argument, missing_policy

from primekit.models.hf import load_model, load_tokenizer
from primekit.models.logprobs import micro_batch_logprobs
from primekit.rollout.base import RolloutBatch, SamplingParams
from primekit.rollout.batching import micro_batch
from primekit.rollout.hf import HFRolloutEngine

WEIGHT_PRODUCTS = ("aten::mm", "aten::addmm")
ATTENTION = ("aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def weight_flops_per_token(model, predicted: bool = True) -> int:
    """2 x the multiply-adds of one token through the model's linear layers (the decoder's
    projections, and the lm_head for a token whose next-token distribution is computed)."""
    decoder = sum(m.weight.numel() for name, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and name != "lm_head")
    head = model.get_output_embeddings().weight.numel() if predicted else 0
    return 2 * (decoder + head)


def split(prof, calls: int) -> dict[str, float]:
    """Seconds per call in weight products, attention and the rest (self CPU time)."""
    out = {"weight products": 0.0, "attention": 0.0, "rest": 0.0}
    for e in prof.key_averages():
        kind = ("weight products" if e.key in WEIGHT_PRODUCTS else
                "attention" if e.key in ATTENTION else "rest")
        out[kind] += e.self_cpu_time_total / 1e6 / calls
    return out


def attainable_gflops(rows: int, d_in: int, d_out: int, repeats: int = 30) -> float:
    """GFLOP/s of one [rows, d_in] x [d_in, d_out] product alone (median of `repeats`)."""
    a, b = torch.randn(rows, d_in), torch.randn(d_in, d_out)
    median_time(lambda: a @ b, 5)  # warm-up
    return 2 * rows * d_in * d_out / median_time(lambda: a @ b, repeats) / 1e9


def profiled(fn, calls: int) -> tuple[float, dict[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm-up
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    return (time.perf_counter() - t0) / calls, split(prof, calls)


def median_time(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_policy_argument(parser, "profile")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per row (forced)")
    parser.add_argument("--calls", type=int, default=3, help="profiled calls per pass")
    parser.add_argument("--compile", action="store_true", help="also time a compiled update")
    parser.add_argument("--attention", action="store_true", help="decode attention, three ways")
    args = parser.parse_args(argv)
    if missing_policy(args.policy):
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = load_model(args.policy)
    tokenizer = load_tokenizer(args.policy)
    prompt = tokenizer.encode("12+7*3-4=")  # a demo-like prompt: 9 characters
    n, T, P = 64, args.tokens, len(prompt)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=T)
    engine = HFRolloutEngine(model, tokenizer, eos_token_ids=[-1])  # no EOS: every row T tokens
    generator = torch.Generator().manual_seed(0)
    batch: RolloutBatch = engine.generate([prompt] * n, params, generator)
    mb = micro_batch(batch, torch.arange(n))

    def update(m=model) -> None:
        m.zero_grad(set_to_none=True)
        lp, ent = micro_batch_logprobs(m, mb, compute_entropy=True)
        ((lp + 0.01 * ent).sum() / mb.response_mask.sum()).backward()

    def rollout() -> None:
        engine.generate([prompt] * n, params, generator)

    per_token = weight_flops_per_token(model)
    decoder_per_token = weight_flops_per_token(model, predicted=False)
    # Forward: every column through the decoder, the T predicting columns through the lm_head;
    # backward twice that. Rollout: the prompt once (one lm_head column) and T-1 decode steps.
    flops = {"update": 3 * (n * (P + T) * decoder_per_token + n * T * (per_token - decoder_per_token)),
             "rollout": n * P * decoder_per_token + n * T * per_token}
    D, inner = model.config.hidden_size, model.config.intermediate_size
    rate = {"update": attainable_gflops(n * (P + T), D, inner), "rollout": attainable_gflops(n, D, inner)}
    print(f"{args.policy}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; "
          f"{n} rows, prompt {P} + {T} forced tokens, float32, {args.threads} thread(s), "
          f"{args.calls} profiled calls per pass")
    results = {}
    for name, fn in (("update", update), ("rollout", rollout)):
        wall, parts = profiled(fn, args.calls)
        results[name] = (wall, parts)
        cpu = sum(parts.values())
        gflops = flops[name] / 1e9
        print(f"\n{name}: {wall:.3f} s per call (profiled), {gflops:.1f} GFLOP in weight products")
        for kind, s in parts.items():
            print(f"  {kind:16} {s:.3f} s  {100 * s / cpu:5.1f}%")
        print(f"  weight products at {gflops / parts['weight products']:.0f} GFLOP/s; one "
              f"[{n * (P + T) if name == 'update' else n}, {D}] x [{D}, {inner}] product alone: "
              f"{rate[name]:.0f} GFLOP/s")
    # Unprofiled times (the profiler's own cost per operation inflates the decode's many small
    # ones); the floors below scale these by each pass's share of weight products + attention.
    plain = {"update": median_time(update, 5), "rollout": median_time(rollout, 5)}
    print("\nfloor if all but the weight products and attention were free (same products), "
          "unprofiled median of 5:")
    for name, (_, parts) in results.items():
        share = (parts["weight products"] + parts["attention"]) / sum(parts.values())
        print(f"  {name:8} {plain[name]:.3f} s, floor {share * plain[name]:.3f} s ({share:.2f}x)")
    if args.compile:
        # The decoder compiled in place: `sequence_logprobs` calls the model's decoder module
        # itself (then the lm_head), so compiling the outer model would not be used.
        model.get_decoder().compile(dynamic=True)
        t0 = time.perf_counter()
        update()
        first = time.perf_counter() - t0
        fused = median_time(update, 5)
        print(f"\nupdate with the decoder under torch.compile(dynamic=True): first call "
              f"{first:.1f} s (compiling), then {fused:.3f} s against {plain['update']:.3f} s "
              f"eager (median of 5): {plain['update'] / fused:.2f}x")
    if args.attention:
        attention_variants(model.config, n, P + T - 1)
    return 0


def attention_variants(config, m: int, capacity: int, repeats: int = 300) -> None:
    """Median microseconds of one layer's decode-step attention, three ways, at three lengths."""
    import torch.nn.functional as F

    from primekit.rollout.decode import single_query_attention

    H, G = config.num_attention_heads, config.num_key_value_heads
    d = config.hidden_size // H
    scale = d ** -0.5
    cache_k, cache_v = torch.randn(m, G, capacity, d), torch.randn(m, G, capacity, d)
    q = torch.randn(m, H, d)
    print(f"\ndecode-step attention, one layer: {m} rows, {H} heads ({G} key/value) of {d}, "
          f"a cache of {capacity} positions; median of {repeats} calls, microseconds")
    qg = q.view(m, G, H // G, d)

    def shipped(keys, values, bias):
        return single_query_attention(q, keys, values, bias, scale)

    def products_and_sum(keys, values, bias):
        scores = (qg[:, :, :, None, :] * keys[:, :, None]).sum(-1) * scale + bias[:, None, None]
        return (scores.softmax(-1)[..., None] * values[:, :, None]).sum(3)

    def sdpa(keys, values, bias):
        return F.scaled_dot_product_attention(q[:, :, None, :], keys, values,
                                              attn_mask=bias[:, None, None, :], scale=scale,
                                              enable_gqa=H != G)

    variants = {"baddbmm + bmm (ships)": shipped, "products + sum": products_and_sum,
                "SDPA": sdpa}
    for L in sorted({min(10, capacity), capacity // 2, capacity}):
        # Views of the cache, as the engine's preallocated layers give them.
        args = (cache_k[:, :, :L], cache_v[:, :, :L], torch.zeros(m, L))
        row = []
        for name, fn in variants.items():
            fn(*args)  # warm-up
            row.append(f"{name} {1e6 * median_time(lambda: fn(*args), repeats):.0f}")  # noqa: B023
        print(f"  {L:3d} positions: " + ", ".join(row))

if __name__ == "__main__":
    sys.exit(main())
