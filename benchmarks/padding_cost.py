"""What one padding column costs: the marginal time of a column in the demo's passes, measured by
adding columns of padding to the same batch.

`benchmarks/demo_packing.py` prices the padding packing removed as if a phase's time were
proportional to its columns. That overcharges the padding where a pass also does work that no
column causes (each operation's dispatch, the optimiser step, the clipping and the weight-norm
guards), and undercharges it where a column costs more than the average one (attention grows with
the square of a row's width). This script measures which: each pass runs on the same batch in
padded rows (the layout `demo_packing.py` prices from) at the rows' own width and with k = 0, k1,
k2, ... more columns of left padding in every row (masked out, as the prompts' own padding is),
the k values interleaved round by round; the least-squares line of time against columns
computed gives the marginal seconds per column (its slope) and the time no column causes (its
intercept). The **marginal share** slope * C0 / t(C0), at the rows' own width C0, is the share
of the pass's time that its columns account for at the margin: below 100%, padding costs less
than its proportional share; at or above, the proportional pricing does not overcharge it.

The passes, in the demo config's padded layout (`policy.max_tokens_per_micro_batch=0`,
`prm.max_tokens_per_micro_batch=0`, `sft.max_tokens_per_micro_batch=0`):

  sft-step   one step of `primekit sft`: `sft_backward` (the trainer's own function; the batch
             of sft.batch_size demonstrations as one micro-batch) and the guarded optimiser step
             (`guarded_step`: clipping, the weight-norm guard, AdamW)
  rl-passes  the model passes of one PRIME step on a batch that the demo config's PRIME steps
             sampled from `--policy` (`--batches` of them): the policy update (policy.ppo_epochs
             epochs of mini-batches of policy.mini_batch_size rows in micro-batches of
             policy.micro_batch_size, each mini-batch a forward + backward of log-probs and
             entropies and a guarded AdamW step), the PRM update (a forward + backward of the
             log-probs in micro-batches of prm.micro_batch_size and one guarded step) and the
             reference forward (no grad, the same micro-batches). The losses are stand-ins (sums
             of log-probs and entropies over the response tokens): what the trainer computes from
             the log-probs is elementwise on [rows, response] and small beside the model.

Printed per pass: n rounds, the median time at each k with its columns, the slope (microseconds per
column), the intercept, the fit's R^2 and the marginal share with its min-max over the batches;
then, per pass, whether a padding column costs at least its proportional share (marginal share
>= 100%: the proportional pricing does not overcharge the padding) or less.

Usage:
    python benchmarks/padding_cost.py --policy runs/demo/sft [--rounds 5] [--batches 3]
        [--extra 0 8 16 24] [--threads 2] [overrides ...]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable

import torch
from common import add_policy_argument, missing_policy

from primekit.config import load_config, resolve_config
from primekit.models.logprobs import micro_batch_logprobs
from primekit.models.optim import guarded_step
from primekit.rollout import batching
from primekit.rollout.base import RolloutBatch
from primekit.rollout.batching import Layout, MicroBatch


def widen(mb: MicroBatch, k: int) -> MicroBatch:
    """`mb` (padded rows) with k more padding columns at the left of every row, masked out as
    the prompts' own left padding is: the same loss, k * rows more columns computed."""
    if k == 0:
        return mb
    if mb.packed:
        raise ValueError("widen pads padded rows; a packed micro-batch has no attention mask")
    n = mb.input_ids.size(0)
    return dataclasses.replace(
        mb, input_ids=torch.cat([mb.input_ids.new_zeros(n, k), mb.input_ids], 1),  # [n, k+L]
        attention_mask=torch.cat([mb.attention_mask.new_zeros(n, k), mb.attention_mask], 1))


def widened(k: int, counter: list[int]) -> Callable:
    """`batching.iter_layout` whose micro-batches carry k more padding columns per row; adds
    the columns each micro-batch computes to counter[0]."""
    original = batching.iter_layout

    def iter_layout(batch, layout, rows=None):
        for mb in original(batch, layout, rows):
            mb = widen(mb, k)
            counter[0] += mb.tokens_computed
            yield mb
    return iter_layout


def sft_pass(cfg):
    """One `primekit sft` step (the module docstring): sft_backward with its layout, guarded
    AdamW step. Returns run(model_state, batch, k) -> columns computed."""
    from primekit.trainer import sft as sft_module

    layout = sft_module.sft_layout(cfg.sft)

    def run(state, batch: RolloutBatch, k: int) -> int:
        model, optimizer = state
        counter = [0]
        original = sft_module.iter_layout
        sft_module.iter_layout = widened(k, counter)
        try:
            optimizer.zero_grad(set_to_none=True)
            sft_module.sft_backward(model, batch, layout)
        finally:
            sft_module.iter_layout = original
        guarded_step("sft", model, optimizer, grad_clip=cfg.sft.grad_clip, step=1)
        return counter[0]
    return run


def rl_pass(cfg):
    """The model passes of one PRIME step (the module docstring). Returns run(state, batch, k)
    -> columns computed."""
    p, q = cfg.policy, cfg.prm
    k_group = cfg.rollout.n_samples
    policy_layout = Layout(p.micro_batch_size, k_group)
    prm_layout = Layout(q.micro_batch_size, k_group)

    def forward_backward(model, batch, rows, layout, k, counter, entropy: bool) -> None:
        n_tokens = int(batch.response_mask[rows].sum())
        for mb in widened(k, counter)(batch, layout, rows):
            lp, ent = micro_batch_logprobs(model, mb, compute_entropy=entropy)  # [n, t]
            mask = mb.response_mask.to(lp.dtype)
            total = lp if ent is None else lp + 0.01 * ent
            (-(total * mask).sum() / n_tokens).backward()

    def run(state, batch: RolloutBatch, k: int) -> int:
        policy, policy_opt, prm, prm_opt = state
        counter = [0]
        n = len(batch.responses)
        for _ in range(p.ppo_epochs):
            for mini in batching.row_chunks(n, p.mini_batch_size, k_group):
                policy_opt.zero_grad(set_to_none=True)
                forward_backward(policy, batch, mini, policy_layout, k, counter, entropy=True)
                guarded_step("policy", policy, policy_opt, grad_clip=p.grad_clip, step=1)
        with torch.no_grad():  # the reference forward (the PRM's frozen copy)
            for mb in widened(k, counter)(batch, prm_layout):
                micro_batch_logprobs(prm, mb)
        prm_opt.zero_grad(set_to_none=True)
        forward_backward(prm, batch, torch.arange(n), prm_layout, k, counter, entropy=False)
        guarded_step("prm", prm, prm_opt, grad_clip=q.grad_clip, step=1)
        return counter[0]
    return run


def fit(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least squares y = a + b x over (x, y) points: (b, a, R^2)."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    ss = sum((y - my) ** 2 for y in ys)
    r2 = 1 - sum((y - a - b * x) ** 2 for x, y in points) / ss if ss > 0 else 1.0
    return b, a, r2


def measure(name: str, run, state, batches: list[RolloutBatch], extra: list[int], rounds: int,
            ) -> float:
    """Time `run` on each batch at each k, interleaved; print the fit; return the median
    marginal share over batches."""
    print(f"\n{name}: {len(batches)} batch(es), {rounds} rounds each (the first not counted)")
    print(f"{'batch':>5} {'k':>3} {'columns':>8} {'median s':>9} {'min':>7} {'max':>7}")
    shares, pooled = [], []
    for i, batch in enumerate(batches):
        times: dict[int, list[float]] = {k: [] for k in extra}
        columns: dict[int, int] = {}
        for r in range(rounds + 1):
            for k in (extra if r % 2 == 0 else extra[::-1]):  # alternate the order
                start = time.perf_counter()
                columns[k] = run(state, batch, k)
                if r:
                    times[k].append(time.perf_counter() - start)
        for k in extra:
            ts = times[k]
            print(f"{i:5d} {k:3d} {columns[k]:8d} {statistics.median(ts):9.4f} {min(ts):7.4f} "
                  f"{max(ts):7.4f}")
        points = [(columns[k], statistics.median(times[k])) for k in extra]
        b, a, r2 = fit(points)
        c0, t0 = points[0]
        shares.append(b * c0 / t0)
        pooled.append((b * c0, t0))
        print(f"      slope {1e6 * b:.2f} us/column, intercept {a:.4f} s, R^2 {r2:.3f}, "
              f"marginal share at {c0} columns {100 * shares[-1]:.1f}%")
    share = statistics.median(shares)
    print(f"{name}: marginal share {100 * share:.1f}% (median over {len(shares)} batch(es), "
          f"{100 * min(shares):.1f} to {100 * max(shares):.1f}%); the time no column causes "
          f"{100 * (1 - share):.1f}%")
    return share


def sft_batches(cfg, tokenizer, n: int) -> list[RolloutBatch]:
    """The first n SFT batches of the config's demonstrations, in the trainer's layout."""
    from primekit.data.splits import encode_prompts, load_splits
    from primekit.rollout.base import batch_from_texts

    train, _ = load_splits(cfg)
    train = [t for t in train if t.solution][: n * cfg.sft.batch_size]
    prompt_ids = encode_prompts(tokenizer, train, cfg)
    rows = cfg.sft.batch_size
    return [batch_from_texts(tokenizer, prompt_ids[i * rows:(i + 1) * rows],
                             [t.solution for t in train[i * rows:(i + 1) * rows]])
            for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_policy_argument(parser)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per batch and k")
    parser.add_argument("--batches", type=int, default=3, help="batches per pass")
    parser.add_argument("--extra", type=int, nargs="+", default=[0, 8, 16, 24],
                        help="padding columns added to every row (the first must be 0)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", nargs="+", default=["sft-step", "rl-passes"],
                        choices=["sft-step", "rl-passes"])
    parser.add_argument("overrides", nargs="*",
                        help="config overrides (for the passes and the PRIME steps that sample)")
    args = parser.parse_args(argv)
    if missing_policy(args.policy):
        return 2
    if args.extra[0] != 0 or len(set(args.extra)) < 2 or min(args.extra) < 0:
        parser.error("--extra: start at 0 and give at least two distinct values >= 0")
    from primekit.models.hf import load_model, load_tokenizer

    torch.set_num_threads(args.threads)
    cfg = load_config(resolve_config("tiny"), [
        "policy.max_tokens_per_micro_batch=0", "prm.max_tokens_per_micro_batch=0",
        "sft.max_tokens_per_micro_batch=0", *args.overrides])
    print(f"{args.threads} thread(s); the demo config's padded layout; SFT model {args.policy}")
    model = load_model(args.policy, dtype=torch.float32, device="cpu")
    model.train()
    shares = {}
    if "sft-step" in args.passes:
        batches = sft_batches(cfg, load_tokenizer(args.policy), args.batches)
        state = (model, torch.optim.AdamW(model.parameters(), lr=cfg.sft.lr))
        shares["sft"] = measure("sft-step", sft_pass(cfg), state, batches, args.extra,
                                args.rounds)
    if "rl-passes" in args.passes:
        from packing import sampled_batches

        batches = sampled_batches(args.policy, args.batches, tuple(args.overrides))
        prm = copy.deepcopy(model)
        state = (model, torch.optim.AdamW(model.parameters(), lr=cfg.policy.lr), prm,
                 torch.optim.AdamW(prm.parameters(), lr=cfg.prm.lr))
        shares["rl"] = measure("rl-passes", rl_pass(cfg), state, batches, args.extra,
                               args.rounds)
    for name, share in shares.items():
        if share <= 0:
            print(f"{name}: no marginal cost measured (slope <= 0: the timings' noise exceeds the "
                  f"added columns' cost; give more --rounds or larger --extra)")
            continue
        verdict = ("at least" if share >= 1 else "less than")
        print(f"{name}: a padding column costs {verdict} its proportional share of the pass "
              f"(marginal share {100 * share:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
