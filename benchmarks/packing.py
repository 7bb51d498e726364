"""Micro-batch layouts of one forward + backward pass, side by side in one process.

The tiny model (random weights: the time does not depend on them) scores one synthetic batch of
`--rows` rows, prompts of 18-40 and responses of 12-64 tokens (10% at 64, as truncated ones) —
the shape of the demo's batches — with a policy-style loss (log-probs and entropies, backward), in
each layout (`primekit.rollout.batching.Layout`), interleaved round by round:

  padded-rows      micro_batch_size rows per forward, left/right padded (the old layout)
  sorted-B         token budget B, rows longest first, padded rows (length-sorted buckets)
  packed-1.0x      packed rows as long as the micro-batch's longest sequence
  packed-1.5x      packed rows 1.5x the longest sequence
  packed-2.0x      packed rows 2x the longest sequence
  packed-chosen    the width chosen per micro-batch among 1-2x (what ships: PACKED_ROW_FACTORS)
  packed-one-row   the whole micro-batch in one packed row (what flash attention would take)
  packed-segments  packed-chosen, but attention per sequence instead of over the whole row: each
                   layer gathers the sequences' queries, keys and values into rows of the longest
                   sequence's length, runs causal SDPA on them and scatters the result back
                   (`segment_attention` below; measured, not shipped)

All layouts compute the same loss and gradients (tests/models/test_packing.py); they differ only in
the columns they compute (printed: padding share) and in the attention mask's shape (sdpa on a
CPU builds a dense block-diagonal mask, so a packed row of C columns costs C^2 attention).
`--profile` then runs each layout 3 more times under the torch profiler and splits its CPU time into
the weights' matrix products, attention and the rest (as `op_profile.py` does).

With `--sampled DIR` the batches are instead real ones: `--batches` PRIME steps of the demo config
from that SFT model (the batches its policy update sees), scored by that model; padding is then
the demo's own.

The paper's regime (responses of hundreds to a thousand tokens, a model whose matrix products
dominate) is `--random-0.5b --response-max 1024 --prompt-max 200`: a random-weight model of
Qwen2-0.5B's shape (no download), prompts of 90-200 and responses of 192-1024 tokens (10% at
1024), with micro-batches of `--micro-rows` rows and token budgets (`--budgets`, and
`--packed-budget` for the packed layouts) sized for it. `--device auto` takes the GPU where there
is one (each pass then ends with a synchronise), `--dtype bfloat16` the dtype users train in.

Usage:
    python benchmarks/packing.py [--rows 64] [--rounds 6] [--threads 1] [--model DIR]
    python benchmarks/packing.py --sampled runs/demo/sft [--batches 3] [--rounds 4] [--profile]
    python benchmarks/packing.py --random-0.5b --rows 64 --micro-rows 8 --prompt-max 200 \
        --response-max 1024 --budgets 4096,8192 --packed-budget 8192 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch
from common import half_billion_config, synchronize

from primekit.models.logprobs import micro_batch_logprobs
from primekit.rollout import batching
from primekit.rollout.base import RolloutBatch
from primekit.rollout.batching import Layout, iter_layout


def demo_like_batch(n: int, seed: int = 1, P: int = 40, T: int = 64) -> RolloutBatch:
    """n rows, prompts of 0.45P-P tokens and responses of 0.1875T-T (10% at T): 18-40 and 12-64
    at the defaults, the demo's shape."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(round(0.45 * P), P + 1, (n,), generator=g)
    t_len = torch.randint(round(0.1875 * T), T + 1, (n,), generator=g)
    t_len[torch.rand(n, generator=g) < 0.1] = T
    prompt_ids, prompt_mask = torch.zeros(n, P, dtype=torch.long), torch.zeros(n, P, dtype=torch.long)
    response_ids, response_mask = torch.zeros(n, T, dtype=torch.long), torch.zeros(n, T, dtype=torch.long)
    for i in range(n):
        p, t = int(p_len[i]), int(t_len[i])
        prompt_ids[i, P - p :], prompt_mask[i, P - p :] = torch.randint(3, 99, (p,), generator=g), 1
        response_ids[i, :t], response_mask[i, :t] = torch.randint(3, 99, (t,), generator=g), 1
    return RolloutBatch(prompt_ids, prompt_mask, response_ids, response_mask, torch.zeros(n, T),
                        torch.ones(n, dtype=torch.bool), [""] * n)


SEGMENTS = "primekit-bench-segments"  # the attention implementation of packed-segments


def segment_index(position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The sequences of packed rows, from position ids [R, C] that restart at 0 with each (a
    row's trailing padding is a sequence of its own): gather [S*L] (sequence s's column j is flat
    column gather[s*L + j], j < L the longest length; slots past a sequence's end repeat its last
    column), back [R*C] (flat column i's place in the [S, L] layout), S and L."""
    flat = position_ids.reshape(-1)  # [R*C]
    starts = (flat == 0).nonzero().squeeze(1)  # [S]
    ends = torch.cat([starts[1:], starts.new_tensor([flat.numel()])])  # [S]
    lengths = ends - starts  # [S]
    S, L = len(starts), int(lengths.max())
    gather = torch.minimum(starts[:, None] + torch.arange(L, device=flat.device),
                           (ends - 1)[:, None])  # [S, L]
    back = torch.repeat_interleave(torch.arange(S, device=flat.device), lengths) * L + flat
    return gather.reshape(-1), back, S, L


_SEGMENTS_OF: list = [None, None]  # [position_ids, segment_index(position_ids)] of the last forward


def segment_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      position_ids=None, **kwargs):
    """Attention per sequence of packed rows (transformers' attention-function interface:
    query [R, H, C, D], key and value [R, Hk, C, D] -> [R, C, H, D]). Causal SDPA over [S, H, L,
    D]: slots past a sequence's end come after every real query, so the causal mask keeps them
    unseen, and their own outputs are never gathered back. Anything else (a padding mask, a
    cache) goes to transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    R, H, C, D = query.shape
    if attention_mask is not None or position_ids is None or key.shape[2] != C:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    # Every layer of one forward gets the same position_ids tensor: its index is built once.
    # The cache holds that tensor, so a later one can never share its identity.
    if _SEGMENTS_OF[0] is not position_ids:
        _SEGMENTS_OF[:] = [position_ids, segment_index(position_ids.expand(R, C))]
    gather, back, S, L = _SEGMENTS_OF[1]

    def by_sequence(x: torch.Tensor) -> torch.Tensor:  # [R, h, C, D] -> [S, h, L, D]
        h = x.shape[1]
        return x.transpose(1, 2).reshape(R * C, h, D)[gather].view(S, L, h, D).transpose(1, 2)

    q, k, v = by_sequence(query), by_sequence(key), by_sequence(value)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=scaling, enable_gqa=k.shape[1] != H)  # [S, H, L, D]
    return out.transpose(1, 2).reshape(S * L, H, D)[back].view(R, C, H, D), None


def register_segment_attention() -> None:
    """`SEGMENTS` as a transformers attention implementation; its mask is SDPA's, and none for
    packed rows (no padding mask), which `segment_attention` confines by their position ids."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def mask(*args, attention_mask=None, **kwargs):
        return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask,
                                                             **kwargs)

    AttentionInterface.register(SEGMENTS, segment_attention)
    AttentionMaskInterface.register(SEGMENTS, mask)


def sampled_batches(policy: str, steps: int, overrides: tuple[str, ...] = ()) -> list[RolloutBatch]:
    """The rollout batches of `steps` PRIME steps of the demo config (with `overrides`) from
    `policy`."""
    from primekit.config import load_config, resolve_config
    from primekit.factory import build_rl_trainer

    run_dir = tempfile.mkdtemp(prefix="primekit-bench-packing-run-")
    cfg = load_config(resolve_config("tiny"), [
        f"model.policy={policy}", f"train.run_dir={run_dir}", "train.report_to=[]",
        f"train.threads={torch.get_num_threads()}", "eval.num_problems=8", *overrides])
    trainer = build_rl_trainer(cfg)
    out = []
    for _ in range(steps):
        trainer.run_step()
        out.append(trainer.last_experience.batch)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=None, help="a causal LM directory (default: the tiny model)")
    parser.add_argument("--sampled", default=None, metavar="SFT",
                        help="time real demo batches sampled by this SFT model (and score with it)")
    parser.add_argument("--batches", type=int, default=3, help="with --sampled: steps sampled")
    parser.add_argument("--random-0.5b", dest="random_half", action="store_true",
                        help="a random-weight model of Qwen2-0.5B's shape")
    parser.add_argument("--prompt-max", type=int, default=40, help="synthetic batch: longest prompt")
    parser.add_argument("--response-max", type=int, default=64,
                        help="synthetic batch: longest response")
    parser.add_argument("--micro-rows", type=int, default=0,
                        help="rows per micro-batch (default: all --rows in one)")
    parser.add_argument("--budgets", default="512,1024,2048",
                        help="token budgets of the length-sorted layouts")
    parser.add_argument("--packed-budget", type=int, default=100_000,
                        help="token budget of the packed layouts (packed-chosen-1024 aside)")
    parser.add_argument("--device", default="auto", help="auto: the GPU where there is one")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--profile", action="store_true",
                        help="split each layout's CPU time: products, attention, the rest")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from primekit.runtime import resolve_device

    device, dtype = resolve_device(args.device), getattr(torch, args.dtype)
    model_dir = args.model or args.sampled
    if args.random_half:
        from transformers import Qwen2ForCausalLM

        torch.manual_seed(0)
        model = Qwen2ForCausalLM(half_billion_config())
    else:
        if model_dir is None:
            from primekit.models.tiny import build_tiny_model

            model_dir = build_tiny_model(tempfile.mkdtemp(prefix="primekit-bench-packing-") + "/m")
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    model = model.to(device=device, dtype=dtype).train()
    batches = sampled_batches(args.sampled, args.batches) if args.sampled else [
        demo_like_batch(args.rows, P=args.prompt_max, T=args.response_max)]
    n = (len(batches[0].responses) // 2 if args.sampled else args.micro_rows or args.rows)
    budget = args.packed_budget
    shipped = batching.PACKED_ROW_FACTORS
    variants = {"padded-rows": (Layout(n, 4), shipped)}
    # name: (layout, the packed row widths to choose from, x the longest sequence)
    for b in (int(x) for x in args.budgets.split(",") if x):
        variants[f"sorted-{b}"] = (Layout(n, 4, b), shipped)
    variants |= {
        "packed-1.0x": (Layout(n, 4, budget, True), (1.0,)),
        "packed-1.5x": (Layout(n, 4, budget, True), (1.5,)),
        "packed-2.0x": (Layout(n, 4, budget, True), (2.0,)),
        "packed-chosen": (Layout(n, 4, budget, True), shipped),
        "packed-chosen-1024": (Layout(n, 4, 1024, True), shipped),
        "packed-one-row": (Layout(n, 4, budget, True), (float(n * 200),)),
        "packed-segments": (Layout(n, 4, budget, True), shipped),
    }
    if args.sampled or args.response_max > 64:  # known to lose (above) / over the budget
        del variants["packed-one-row"]
    if args.response_max > 64:  # a 1024-token budget holds less than one group
        del variants["packed-chosen-1024"]
    valid = sum(int(b.prompt_mask.sum() + b.response_mask.sum()) for b in batches)
    sync = synchronize(device)

    register_segment_attention()
    attention = model.config._attn_implementation or "sdpa"

    def run(name: str) -> int:
        layout, factors = variants[name]
        batching.PACKED_ROW_FACTORS = factors
        model.config._attn_implementation = SEGMENTS if name == "packed-segments" else attention
        computed = 0
        for b in batches:
            model.zero_grad(set_to_none=True)
            for mb in iter_layout(b, layout):
                computed += mb.tokens_computed
                lp, ent = micro_batch_logprobs(model, mb, compute_entropy=True)
                ((lp + 0.01 * ent).float().sum() / b.response_mask.sum()).backward()
        sync()
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
    what = f"{len(batches)} sampled batches of {len(batches[0].responses)} rows in micro-batches of {n}" \
        if args.sampled else f"{args.rows} rows (micro-batches of {n})"
    params = sum(p.numel() for p in model.parameters()) / 1e6
    where = f"{device}" if device.type != "cpu" else f"{args.threads} thread(s)"
    print(f"{what}, {valid} tokens, {params:.1f} M parameters, {args.dtype}, {where}, "
          f"forward + backward, seconds")
    build = layout_build_ms(batches, variants)
    print(f"{'layout':18} {'padding':>8} {'n':>3} {'median':>8} {'min':>8} {'max':>8} "
          f"{'vs padded':>9} {'build ms':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:18} {100 * (1 - valid / computed[name]):7.1f}% {len(ts):3d} {med:8.3f} "
              f"{min(ts):8.3f} {max(ts):8.3f} {med / base:8.3f}x {build[name]:9.2f}")
    print("build ms: the host time to cut the batches into that layout's micro-batches "
          "(rollout.batching.iter_layout), median of 20, included in the pass times")
    if args.profile:
        print_profile(variants, run, computed)
    return 0


PROFILED_CALLS = 3


def print_profile(variants: dict, run, computed: dict[str, int]) -> None:
    """Each layout's pass PROFILED_CALLS times under the torch profiler: self CPU seconds per
    call in the weights' products, attention and the rest, and its columns against padded rows'."""
    from op_profile import profiled

    print(f"{'profiled':18} {'columns':>8} {'products':>9} {'attention':>10} {'rest':>8}")
    for name in variants:
        _, parts = profiled(lambda name=name: run(name), PROFILED_CALLS)
        print(f"{name:18} {computed[name] / computed['padded-rows']:7.3f}x {parts['weight products']:9.3f} "
              f"{parts['attention']:10.3f} {parts['rest']:8.3f}")
    print(f"columns: against padded rows'; products, attention, rest: self CPU seconds per call, "
          f"mean of {PROFILED_CALLS} profiled calls (benchmarks/op_profile.py's split)")


def layout_build_ms(batches: list[RolloutBatch], variants: dict) -> dict[str, float]:
    """Median milliseconds (of 20) to build each variant's micro-batches of all `batches`."""
    out = {}
    for name, (layout, factors) in variants.items():
        batching.PACKED_ROW_FACTORS = factors
        ts = []
        for _ in range(20):
            t0 = time.perf_counter()
            for b in batches:
                list(iter_layout(b, layout))
            ts.append(1000 * (time.perf_counter() - t0))
        out[name] = statistics.median(ts)
    return out


if __name__ == "__main__":
    sys.exit(main())
