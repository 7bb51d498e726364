"""Rollout throughput: the HF engine, plain `transformers` `generate` and vLLM, same prompts.

Every engine gets the same batch of prompts (the demo's arithmetic prompts, encoded as the trainer
encodes them), the same sampling (temperature, top-p) and the same max new tokens. Each is called
once untimed (warm-up: vLLM's first calls build kernels), then `--repeats` rounds call every
engine once in turn (on a shared machine the load changes by the minute; interleaving spreads
it evenly). A row reports generated tokens (EOS included, padding not) per second of wall time
over its timed calls. `hf` is the engine as the trainer runs it (`rollout.hf_decode=auto`:
the written-out decode step where the model allows it), `hf-model` the same engine with the
model's own forward at every decode step (`rollout.hf_decode=model`), `hf-compiled` the
written-out step under `torch.compile` (`rollout.hf_decode=compiled`; the warm-up call compiles).

vLLM parts (when vLLM can be imported, i.e. in the `.venv-vllm` of `.ci/vllm.sh`):
- `vllm (primekit engine)`: `VLLMRolloutEngine.generate`, what the trainer calls: one request
  per sequence with its own seed, sampling log-probs on.
- `--diagnose`: the same `LLM` called directly with those features switched off one at a time,
  `n=K` requests instead of K copies of each prompt, and a 1-token call (the fixed cost per
  call), to tell where the time goes.
- weight sync: `sync_weights(policy)` repeated (`--syncs`), the cost paid after every update.
- `--steps N`: N PRIME steps of `configs/tiny.yaml` with rollout.backend=vllm after one warm-up
  step: `timing/weight_sync` as a share of `timing/step`, the issue's target being <= 10 %.

The HF parts run with `--threads` torch threads in this process; vLLM runs in its own
processes (its worker binds one OpenMP thread per core it is given). With
VLLM_ENABLE_V1_MULTIPROCESSING=0 vLLM runs in this process instead and takes over its torch
threads (printed). On a GPU machine the HF parts use the GPU (`--device auto`) and vLLM is
whichever build is installed.

Usage:
    python benchmarks/rollout.py --policy runs/demo/sft [--batch 64] [--max-new-tokens 64]
        [--repeats 3] [--engines hf,hf-model,hf-compiled,generate,vllm] [--diagnose] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from common import add_policy_argument, missing_policy
from rich.console import Console
from rich.table import Table

from primekit.config import load_config, resolve_config
from primekit.data.splits import encode_prompts, load_splits
from primekit.models.hf import load_model, load_tokenizer, stop_token_ids
from primekit.rollout.base import RolloutBatch, SamplingParams
from primekit.rollout.hf import HFRolloutEngine
from primekit.runtime import resolve_device

console = Console(width=120)


def interleaved(calls: dict[str, object], repeats: int) -> dict[str, list[tuple[int, float]]]:
    """{name: [(tokens, seconds) per timed call]} over `repeats` rounds; each round calls every
    engine once, in turn, so that the load of a shared machine falls on all of them alike. Each
    `call(i)` returns the number of tokens it generated; one untimed call per engine comes first
    (warm-up)."""
    for call in calls.values():
        call(-1)
    timed = {name: [] for name in calls}
    for i in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            tokens = call(i)
            timed[name].append((tokens, time.perf_counter() - start))
    return timed


def hf_engine_call(policy, tokenizer, prompts, params, forced: bool = False,
                   decode: str = "auto"):
    # forced: an EOS id that no vocabulary entry has, so every row runs max_new_tokens.
    engine = HFRolloutEngine(policy, tokenizer, micro_batch_size=len(prompts),
                             eos_token_ids=[-1] if forced else None, decode=decode)

    def call(i: int) -> int:
        batch = engine.generate(prompts, params, torch.Generator().manual_seed(1000 + i))
        if i == -1:
            console.print(f"HF engine, decode={decode}: decode steps through {engine.decode_path}")
        return int(batch.response_mask.sum())

    return call


def transformers_generate_call(policy, tokenizer, prompts, params, forced: bool = False):
    """`model.generate` on the left-padded batch; tokens counted up to the first EOS (forced:
    min_new_tokens = max_new_tokens, every token counted)."""
    eos = sorted({tokenizer.eos_token_id, *_as_list(policy.generation_config.eos_token_id)}
                 - {None})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    width = max(len(p) for p in prompts)
    device = next(policy.parameters()).device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    def call(i: int) -> int:
        torch.manual_seed(1000 + i)
        with torch.no_grad():
            out = policy.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                  temperature=params.temperature, top_p=params.top_p, top_k=0,
                                  max_new_tokens=params.max_new_tokens, eos_token_id=eos,
                                  pad_token_id=pad,
                                  min_new_tokens=params.max_new_tokens if forced else 0)
        new = out[:, width:]  # [N, T]
        is_eos = torch.isin(new, torch.tensor(eos, device=new.device))
        # Tokens up to and including the first EOS; rows without one count all T.
        if forced:
            return new.numel()
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, new.shape[1])
        return int(first.sum())

    return call


def _as_list(x) -> list:
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def vllm_engine_call(engine, prompts, params):
    def call(i: int) -> int:
        batch: RolloutBatch = engine.generate(prompts, params,
                                              torch.Generator().manual_seed(1000 + i))
        return int(batch.response_mask.sum())

    return call


def vllm_raw_call(engine, prompts, params, *, seeds: bool, logprobs: bool, n: int = 1,
                  max_tokens: int | None = None):
    """`LLM.generate` directly, one request per prompt (each asking for `n` samples)."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt

    requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]

    def call(i: int) -> int:
        sampling = [VLLMSamplingParams(
            n=n, temperature=params.temperature, top_p=params.top_p,
            max_tokens=max_tokens or params.max_new_tokens, stop_token_ids=engine.eos_token_ids,
            logprobs=0 if logprobs else None, seed=(10_000 * i + j) if seeds else None,
            detokenize=False) for j in range(len(prompts))]
        outs = engine.llm.generate(requests, sampling, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    return call


def prime_steps(args, policy_dir: str, run_dir: str) -> list[dict[str, float]]:
    from primekit.factory import build_rl_trainer

    cfg = load_config(resolve_config(args.config), [
        f"model.policy={policy_dir}", "rollout.backend=vllm", f"train.run_dir={run_dir}",
        "train.report_to=[]", *args.overrides])
    console.print(f"PRIME steps: policy.old_logprobs resolved to {cfg.policy.old_logprobs}")
    trainer = build_rl_trainer(cfg)
    steps = []
    for i in range(1 + args.steps):
        m = trainer.train_step()
        if i:  # the first step warms the engine up
            steps.append(m)
        phases = ", ".join(f"{k.removeprefix('timing/')} {v:.2f}" for k, v in m.items()
                           if k.startswith("timing/") and k != "timing/step")
        print(f"step {i + 1}/{1 + args.steps}: {m['timing/step']:.2f} s ({phases})", flush=True)
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny")
    add_policy_argument(parser, "sample from")
    parser.add_argument("--batch", type=int, default=64, help="sequences per call")
    parser.add_argument("--k", type=int, default=1,
                        help="samples per prompt: batch/k distinct prompts, each k times")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per engine")
    parser.add_argument("--forced", action="store_true",
                        help="no stop at EOS: every row generates --max-new-tokens (HF parts)")
    parser.add_argument("--engines", default="hf,generate,vllm")
    parser.add_argument("--diagnose", action="store_true", help="vLLM variants (see above)")
    parser.add_argument("--syncs", type=int, default=5, help="timed vLLM weight syncs")
    parser.add_argument("--steps", type=int, default=0, help="timed PRIME steps with vLLM")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the HF parts")
    parser.add_argument("--device", default="auto", help="device of the HF parts")
    parser.add_argument("overrides", nargs="*", help="config overrides of the --steps run")
    args = parser.parse_args(argv)
    if missing_policy(args.policy):
        return 2
    if args.batch % args.k:
        print(f"--batch {args.batch} is not a multiple of --k {args.k}", file=sys.stderr)
        return 2
    engines = args.engines.split(",")
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)

    cfg = load_config(resolve_config(args.config), [f"model.policy={args.policy}",
                                                    f"data.num_train={args.batch // args.k}"])
    tokenizer = load_tokenizer(args.policy)
    distinct = encode_prompts(tokenizer, load_splits(cfg)[0][: args.batch // args.k], cfg)
    prompts = [p for p in distinct for _ in range(args.k)]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                            max_new_tokens=args.max_new_tokens)
    policy = load_model(args.policy, dtype=torch.float32, device=str(device)).eval()
    console.print(f"{len(prompts)} sequences ({len(distinct)} prompts x {args.k}), prompt "
                  f"lengths {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
                  f"temperature {args.temperature}, top-p {args.top_p}, max "
                  f"{args.max_new_tokens} new tokens; {args.repeats} timed calls after 1 warm-up; "
                  f"{sum(p.numel() for p in policy.parameters()):,} parameters, HF on {device}, "
                  f"{args.threads} threads")

    calls = {}
    if "hf" in engines:
        calls["primekit HF engine"] = hf_engine_call(policy, tokenizer, prompts, params,
                                                     args.forced)
    if "hf-model" in engines:  # the same engine with the model's own forward at every step
        calls["primekit HF engine, decode=model"] = hf_engine_call(
            policy, tokenizer, prompts, params, args.forced, decode="model")
    if "hf-compiled" in engines:  # the written-out step under torch.compile
        calls["primekit HF engine, decode=compiled"] = hf_engine_call(
            policy, tokenizer, prompts, params, args.forced, decode="compiled")
    if "generate" in engines:
        calls["transformers generate"] = transformers_generate_call(policy, tokenizer, prompts,
                                                                    params, args.forced)
    sync_ms: list[float] = []
    engine = None
    if "vllm" in engines:
        from primekit.rollout.vllm import VLLMRolloutEngine

        start = time.perf_counter()
        engine = VLLMRolloutEngine(args.policy, tokenizer, seed=0,
                                   eos_token_ids=stop_token_ids(args.policy, tokenizer),
                                   max_model_len=max(map(len, prompts)) + args.max_new_tokens)
        console.print(f"vLLM engine start: {time.perf_counter() - start:.1f} s "
                      f"(VLLM_ENABLE_V1_MULTIPROCESSING="
                      f"{os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING')}), torch threads here "
                      f"now {torch.get_num_threads()}")
        start = time.perf_counter()
        engine.generate(prompts, params, torch.Generator().manual_seed(0))
        console.print(f"vLLM first generate: {time.perf_counter() - start:.1f} s")
        calls["vllm (primekit engine)"] = vllm_engine_call(engine, prompts, params)
        if args.diagnose:
            for seeds, logprobs in ((True, True), (False, True), (True, False), (False, False)):
                name = (f"vllm raw: {'seed per request' if seeds else 'no seeds'}, "
                        f"{'logprobs' if logprobs else 'no logprobs'}")
                calls[name] = vllm_raw_call(engine, prompts, params, seeds=seeds,
                                            logprobs=logprobs)
            if args.k > 1:
                calls[f"vllm raw: n={args.k}, seeds, logprobs"] = vllm_raw_call(
                    engine, distinct, params, seeds=True, logprobs=True, n=args.k)
            calls["vllm raw: 1 new token (fixed cost per call)"] = vllm_raw_call(
                engine, prompts, params, seeds=True, logprobs=True, max_tokens=1)
    timed = interleaved(calls, args.repeats)
    if engine is not None:
        for _ in range(args.syncs):
            start = time.perf_counter()
            engine.sync_weights(policy)
            sync_ms.append(1000 * (time.perf_counter() - start))
        console.print(f"vLLM weight sync: {statistics.mean(sync_ms):.0f} ms mean of "
                      f"{len(sync_ms)} ({min(sync_ms):.0f} to {max(sync_ms):.0f} ms)")
        engine.close()  # the --steps trainer starts its own

    table = Table(title=f"rollout throughput: {len(prompts)} sequences, max "
                        f"{args.max_new_tokens} new tokens, T={args.temperature}, "
                        f"top-p {args.top_p}")
    first = "transformers generate" if "transformers generate" in timed else next(iter(timed), None)
    for col in ("engine", "tokens/s median", "min", "max", "n", "tokens per call", "s per call",
                f"x {first}"):
        table.add_column(col, justify="left" if col == "engine" else "right")
    base = statistics.median(t / s for t, s in timed[first]) if first else 1.0
    for name, calls_ in timed.items():
        rates = [t / s for t, s in calls_]
        table.add_row(name, f"{statistics.median(rates):,.0f}", f"{min(rates):,.0f}",
                      f"{max(rates):,.0f}", str(len(rates)),
                      f"{statistics.mean(t for t, _ in calls_):.0f}",
                      f"{statistics.median(s for _, s in calls_):.3f}",
                      f"{statistics.median(rates) / base:.2f}")
    console.print(table)

    if args.steps and "vllm" in engines:
        with tempfile.TemporaryDirectory() as tmp:
            steps = prime_steps(args, args.policy, tmp)
        sync = statistics.mean(m["timing/weight_sync"] for m in steps)
        step = statistics.mean(m["timing/step"] for m in steps)
        rollout = statistics.mean(m["timing/rollout"] for m in steps)
        console.print(f"PRIME step with vLLM ({len(steps)} steps after 1 warm-up): step "
                      f"{step:.2f} s, rollout {rollout:.2f} s, weight sync {1000 * sync:.0f} ms "
                      f"= {100 * sync / step:.1f} % of the step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
