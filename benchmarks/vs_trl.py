"""One outcome-only RLOO step of primekit against one step of TRL's GRPOTrainer, same model/batch.

Both sides: the demo's SFT model in float32 (on the CPU, or the GPU: --device), the same 16
arithmetic prompts x 4 samples at every step (ours: its prompt sampler rewound before each step),
at most 64 new tokens (stopping at EOS, or `--forced`: every row 64 tokens), temperature 1, the arithmetic
verifier as the only reward, old log-probs computed by a separate forward after generation, one
optimiser step (AdamW) over the 64 rows as one mini-batch. Timed: the whole step, rollout
included. The sides alternate (`--repeats` rounds, one untimed warm-up each) in one process, so a
shared machine's load falls on both alike.

Differences in work that remain (printed too):
- primekit: RLOO advantages (leave-one-out baseline), PPO-clip loss, no KL; old log-probs
  recomputed (policy.old_logprobs=recompute). Its HF engine decodes with our own loop.
- TRL: GRPO with `num_iterations=2` (the setting under which TRL computes old log-probs after
  generation; with max_steps=1 only one optimiser step runs), beta 0 (no reference model),
  gradient checkpointing off (TRL's default is on: a second forward in the backward),
  group-mean baseline scaled by the group std (scale_rewards), `model.generate` for sampling,
  a fresh GRPOTrainer per timed step (built untimed; the step is timed from the trainer
  callback's on_step_begin to on_step_end).

Run with a python that has both primekit and trl (TRL is not a dependency):
    python -m venv /tmp/trl-venv --system-site-packages
    /tmp/trl-venv/bin/pip install trl==1.16.0
    /tmp/trl-venv/bin/python benchmarks/vs_trl.py --policy runs/demo/sft [--repeats 5] [--forced]
        [overrides of our side ...]
Without trl the script says so and exits 0 (skipped).

Measured with TRL 1.16.0 from the demo's SFT model, 1 thread, 2-core machine with its background
jobs stopped (2026-12-01, docs/performance.md): stopping at EOS primekit 0.771 s vs TRL 1.001 s
(medians, n 7): 0.771x; `--forced` 1.716 s vs 1.688 s: 1.017x (the same matrix products).
With the HF engine's written-out decode step (2026-12-04, another machine): 0.573 s vs 0.708 s,
0.810x at EOS; 1.149 s vs 1.235 s, 0.931x forced. Phase by phase (2026-12-04, a 2-core AMD EPYC
with AVX-512, padded rows): at EOS 0.424 s vs 0.536 s, 0.791x; forced 1.020 s vs 1.212 s, 0.841x.
With the packed micro-batches the tiny config has since (2026-12-05, the same machine): at EOS
0.344 s vs 0.540 s, 0.638x (a second run 0.642x; rollout 0.098 vs 0.179 s, old log-probs 0.061 vs
0.082 s, update 0.182 vs 0.282 s): the 0.67x target is met; forced 1.016 s vs 1.208 s, 0.840x, not
met (no padding to remove; again 2026-12-06: 0.648x at EOS, 0.785x forced; docs/performance.md, "Against TRL, phase by phase";
`benchmarks/op_profile.py` for the floor). On one H100 (2026-12-05, both sides on the GPU):
0.810x at EOS and 0.770x forced (packed), 0.733x at EOS with padded rows
(`policy.max_tokens_per_micro_batch=0`): our rollout is 0.63-0.68x `generate`'s and 69-76%
of the step (docs/performance.md, "On one H100").

`--trl-compile` gives TRL's side `torch_compile=True` (pair it with our `train.compile=true`):
on a 2-core Xeon (2026-12-07, forced, n 7) TRL 1.268 s compiled against 1.288 s eager, ours
compiled 0.730x the compiled TRL step (docs/performance.md, "On a 2-core Intel Xeon"); with
`rollout.hf_decode=compiled` on our side too, 0.708x the compiled TRL step and 0.626-0.661x
TRL's default one (four sittings; seven with `train.compile=true`: mean 0.647x, "The compiled
decode step").

`--device auto` (the default) runs both sides on the GPU where there is one (ours with
`train.device`, TRL's through accelerate), every timed span ending with a synchronise; on a CPU
machine both run on the CPU as before.

Each side's phases are printed too: ours from the trainer's `timing/*` metrics; TRL's by timing
its `_generate` and `_get_per_token_logps_and_entropies` (without grad: the old log-probs; with
grad: the loss's forward), the rest of its step being the backward, optimiser, rewards and
bookkeeping.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch
from common import add_policy_argument, missing_policy, synchronize

from primekit.config import load_config, resolve_config

# Our step's phases, from the trainer's own `timing/*` metrics (the rest of the step: "other").
OUR_PHASES = {"rollout": "rollout", "old log-prob forward": "old_logprobs",
              "policy update (forward, backward, optimiser)": "policy_update"}


def ours(policy: str, run_dir: str, forced: bool, threads: int, device: torch.device,
         overrides: list[str]):
    from primekit.factory import build_rl_trainer

    cfg = load_config(resolve_config("tiny"), [
        f"model.policy={policy}", f"train.run_dir={run_dir}", "train.report_to=[]",
        "algorithm.reward_mode=outcome", "algorithm.estimator=rloo", "filter.enabled=false",
        "train.prompts_per_step=16", "rollout.n_samples=4", "rollout.max_new_tokens=64",
        "policy.old_logprobs=recompute", "policy.ppo_epochs=1", "policy.mini_batch_size=64",
        "policy.micro_batch_size=64", f"train.threads={threads}", f"train.device={device.type}",
        *overrides])
    trainer = build_rl_trainer(cfg)
    if forced:
        trainer.engine.eos_token_ids = [-1]  # no token has this id: every row runs 64 tokens

    state = trainer.sampler.state_dict()

    sync = synchronize(device)

    def step() -> tuple[float, dict[str, float]]:
        trainer.sampler.load_state_dict(state)  # the same 16 prompts at every step, as TRL's
        sync()
        start = time.perf_counter()
        metrics = trainer.train_step()
        sync()
        seconds = time.perf_counter() - start
        trainer.step += 1
        phases = {name: metrics[f"timing/{key}"] for name, key in OUR_PHASES.items()}
        phases["other"] = seconds - sum(phases.values())
        return seconds, phases

    return trainer, step


def trl_side(policy: str, prompts: list[str], problems, verifier, forced: bool,
             device: torch.device, compile_model: bool = False):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(policy)
    by_prompt = {p: prob for p, prob in zip(prompts, problems)}

    def reward(prompts, completions, **_):
        return [verifier.verify(c, by_prompt[p]).score for p, c in zip(prompts, completions)]

    sync = synchronize(device)

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            sync()
            self.seconds = time.perf_counter() - self.start

    # The step's phases, timed by wrapping TRL's own methods (calls within a step are summed):
    # `_generate` is the sampling; `_get_per_token_logps_and_entropies` runs twice, for the old
    # log-probs (without grad) and as the loss's forward (with grad).
    spent: dict[str, float] = {}

    def timed_method(name: str) -> None:
        method = getattr(GRPOTrainer, name)

        def wrapper(self, *args, **kwargs):
            key = name if name == "_generate" else f"{name}/grad={torch.is_grad_enabled()}"
            sync()
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                sync()
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - start

        setattr(GRPOTrainer, name, wrapper)

    for name in ("_generate", "_get_per_token_logps_and_entropies"):
        timed_method(name)

    def step() -> tuple[float, dict[str, float]]:
        spent.clear()
        with tempfile.TemporaryDirectory() as out:
            args = GRPOConfig(
                output_dir=out, per_device_train_batch_size=64, num_generations=4,
                max_completion_length=64, num_iterations=2, max_steps=1, beta=0.0,
                learning_rate=1e-4, temperature=1.0, top_k=0, top_p=1.0, logging_steps=1,
                report_to=[], save_strategy="no", use_cpu=device.type == "cpu", bf16=False, fp16=False,
                dataloader_num_workers=0, seed=0, gradient_checkpointing=False,
                torch_compile=compile_model,
                generation_kwargs={"min_new_tokens": 64} if forced else None)
            model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
            timer = Timer()
            trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args,
                                  train_dataset=Dataset.from_dict({"prompt": prompts}),
                                  processing_class=tokenizer, callbacks=[timer])
            trainer.train()
            phases = {"rollout": spent.get("_generate", 0.0),
                      "old log-prob forward":
                          spent.get("_get_per_token_logps_and_entropies/grad=False", 0.0),
                      "the loss's forward":
                          spent.get("_get_per_token_logps_and_entropies/grad=True", 0.0)}
            phases["backward, optimiser and the rest"] = timer.seconds - sum(phases.values())
            return timer.seconds, phases

    return step


def summary(xs: list[float]) -> str:
    return (f"median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f}, "
            f"n {len(xs)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_policy_argument(parser, "train from")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--forced", action="store_true", help="every row 64 tokens (no EOS stop)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto", help="auto: the GPU where there is one")
    parser.add_argument("--trl-compile", action="store_true",
                        help="TRL's side with torch_compile=True (transformers' Trainer compiles "
                             "the whole model through accelerate); pair with train.compile=true")
    parser.add_argument("overrides", nargs="*",
                        help="config overrides of our side, e.g. policy.max_tokens_per_micro_batch=0"
                             " (padded rows)")
    args = parser.parse_args(argv)
    if missing_policy(args.policy):
        return 2
    try:
        import trl
    except ImportError as e:
        print(f"skipped: TRL cannot be imported here ({e}); see the docstring for the venv")
        return 0
    torch.set_num_threads(args.threads)
    from primekit.runtime import resolve_device

    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer, our_step = ours(args.policy, run_dir, args.forced, args.threads, device,
                                 args.overrides)
        state = trainer.sampler.state_dict()
        idx = trainer.sampler.take(16)  # the prompts every step of ours draws
        trainer.sampler.load_state_dict(state)
        problems = [trainer.train_problems[i] for i in idx]
        prompts = [trainer.tokenizer.decode(trainer.train_prompt_ids[i]) for i in idx]
        their_step = trl_side(args.policy, prompts, problems, trainer.verifier, args.forced,
                              device, args.trl_compile)
        where = (torch.cuda.get_device_name(device) if device.type == "cuda"
                 else f"{args.threads} thread(s)")
        print(f"TRL {trl.__version__}{' (torch_compile)' if args.trl_compile else ''}; "
              f"16 prompts x 4, max 64 new tokens"
              f"{' forced' if args.forced else ' (EOS stops)'}, fp32, {where}; "
              f"{args.repeats} timed steps each after 1 warm-up, alternating", flush=True)
        our_step(), their_step()
        times: dict[str, list[float]] = {"primekit": [], "trl": []}
        phases: dict[str, dict[str, list[float]]] = {"primekit": {}, "trl": {}}
        for i in range(args.repeats):
            for name, step in (("primekit", our_step), ("trl", their_step)):
                seconds, parts = step()
                times[name].append(seconds)
                for part, s in parts.items():
                    phases[name].setdefault(part, []).append(s)
            print(f"round {i + 1}: primekit {times['primekit'][-1]:.3f} s, "
                  f"trl {times['trl'][-1]:.3f} s", flush=True)
    for name, xs in times.items():
        print(f"{name}: {summary(xs)}")
        for part, ys in phases[name].items():
            print(f"  {part}: median {statistics.median(ys):.3f} s")
    ratio = statistics.median(times["primekit"]) / statistics.median(times["trl"])
    print(f"primekit / TRL step time: {ratio:.3f}x (medians; target <= 0.67x)")
    print("differences in work: see the module docstring (RLOO vs GRPO advantages, our decode "
          "loop vs model.generate, TRL's callback-timed step inside Trainer.train)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
