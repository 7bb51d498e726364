"""Configuration: nested dataclasses are the one home of every setting, default and choice.

A run is configured by a YAML file plus dotted command-line overrides (`prm.beta=0.1`, the value
parsed as YAML). pydantic validates the merged mapping against the dataclasses below: a field's
annotation is its type, its range (`Positive`, `Fraction`, ...) and, for `Literal[...]`, its list
of choices. Unknown keys, values of the wrong type or out of range and impossible combinations
fail at start with a one-line `ConfigError` that starts with the dotted field name. Defaults are
the PRIME paper's 7B values where they apply (Sec. 4.1 / App. of arXiv 2502.01456);
`configs/tiny.yaml` scales them down for the CPU demo.
"""

import dataclasses
import functools
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, with_config

# The packaged YAML configs, found by name with `--config tiny`.
CONFIG_DIR = Path(__file__).parent / "configs"

# Distinct held-out arithmetic problems are drawn by rejection: 2000 take about 3 s, 10000 about
# a minute on one core, and the cost grows faster than linearly.
MAX_ARITHMETIC_EVAL = 5000

Positive = Annotated[int, Field(gt=0)]
NonNegative = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
UnitInterval = Annotated[float, Field(ge=0, le=1)]  # [0, 1]
Fraction = Annotated[float, Field(gt=0, le=1)]  # (0, 1]


class ConfigError(ValueError):
    """A configuration value or combination that cannot work; the message names the field."""


# Wrong keys fail instead of being ignored; YAML numbers are accepted for strings (a model name
# like `123`); nan/inf are never a meaningful setting here.
_PYDANTIC = ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False)

# Applied to every section below.
_validated = with_config(_PYDANTIC)


@_validated
@dataclass
class ModelConfig:
    # HF directory or hub id of the policy's starting point (the SFT checkpoint for RL).
    policy: str = "runs/demo/sft"
    # Implicit PRM initialisation; None = the policy's checkpoint (the paper's choice, Sec. 3.3).
    prm: str | None = None
    # Frozen reference; None = the policy's checkpoint.
    ref: str | None = None
    # PPO critic initialisation; None = the policy's checkpoint (a fresh scalar head on top).
    critic: str | None = None
    # The COMPUTE dtype. Trained models (policy, PRM, critic) keep float32 master weights, float32
    # gradients and float32 AdamW state whatever this says; frozen ones (the reference, a frozen
    # PRM) are stored in it. Log-probs are always computed in float32 (models/parallel.py).
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    use_chat_template: bool = False
    system_prompt: str | None = None
    trust_remote_code: bool = False


@_validated
@dataclass
class DataConfig:
    # "arithmetic": procedural, generated from the seed; "file": train_path / eval_path.
    source: Literal["arithmetic", "file"] = "arithmetic"
    # Task of file rows that name none (null: "code" for a row with tests, else "math"). A row's
    # own "task" wins and each row is graded by its task's verifier, so a file may mix math and
    # code. The procedural source is always arithmetic.
    task: Literal["math", "code", "arithmetic"] | None = None
    train_path: str | None = None
    eval_path: str | None = None
    num_train: Positive = 20000
    num_eval: Positive = 200
    # Without eval_path: the share of train_path's distinct prompts held out for evaluation.
    heldout_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.05
    # The procedural task writes at least two operands.
    min_operands: Annotated[int, Field(ge=2)] = 2
    max_operands: Annotated[int, Field(ge=2)] = 4
    seed: int = 1234
    # source=arithmetic only: the procedural task family (docs/tasks.md). "arithmetic": chains of
    # min_operands..max_operands operands; "chains": the same format with chain_min_operands..
    # chain_max_operands (5-8 steps, where one early wrong step decides the outcome);
    # "rgym:<name>": reasoning-gym's dataset <name> (pip install 'primekit[rgym]'), graded by its
    # own scorer, with rgym_config's fields over primekit's defaults for it (not seed or size).
    task_family: Annotated[str, Field(pattern=r"^(arithmetic|chains|rgym:[a-z0-9_]+)$")] = (
        "arithmetic")
    chain_min_operands: Annotated[int, Field(ge=2)] = 6
    chain_max_operands: Annotated[int, Field(ge=2)] = 9
    rgym_config: dict[str, Any] = field(default_factory=dict)


@_validated
@dataclass
class RolloutConfig:
    backend: Literal["hf", "vllm"] = "hf"
    n_samples: Positive = 4  # K, samples per prompt
    temperature: NonNegativeFloat = 1.0
    top_p: Fraction = 1.0
    max_new_tokens: Positive = 1024
    micro_batch_size: Positive = 256
    # backend=hf only: "auto" feeds each new token of Llama, Mistral, Qwen2 and Qwen3 models with
    # plain weights through primekit's written-out decode step (rollout/decode.py; other models
    # and sharded, adapted or offloaded ones through their own forward); "model": always the
    # model's own forward (bit-identical to transformers' decode, docs/rollout.md); "compiled":
    # as "auto", the written-out step under torch.compile (static shapes; compiled at first use).
    hf_decode: Literal["auto", "model", "compiled"] = "auto"
    # backend=vllm only (docs/rollout.md). KV-cache budget: GiB of RAM on a CPU, share of the GPU's
    # memory on a GPU (the trainer's models share it); 0 max model length: the model's own.
    vllm_kv_cache_gib: Positive = 1
    vllm_gpu_memory_utilization: Fraction = 0.4
    vllm_max_model_len: NonNegative = 0
    # How the policy's weights reach vLLM's worker after each update: "shared" (a shared buffer,
    # shared memory on a CPU and CUDA IPC on a GPU, in buckets of vllm_sync_bucket_mb MiB) or
    # "file" (a safetensors file in /dev/shm, the fallback).
    vllm_weight_sync: Literal["shared", "file"] = "shared"
    vllm_sync_bucket_mb: Positive = 512


@_validated
@dataclass
class FilterConfig:
    """Online prompt filter (PRIME Sec. 3.4): keep groups whose mean outcome is in [lo, hi]."""

    enabled: bool = True
    lo: UnitInterval = 0.2
    hi: UnitInterval = 0.8
    # Prompts sampled per round: missing groups x oversample / (keep rate so far in this step).
    oversample: Annotated[float, Field(ge=1)] = 1.5
    # Rollout rounds per step before giving up filling the batch (with a warning).
    max_rounds: Positive = 4
    # Groups that pass the filter after the batch is full are carried to later steps and
    # trained on at most this many policy updates after they were sampled (their old log-probs
    # recomputed under the current policy; trainer/collect.py, docs/rollout.md). At most one
    # step's batch is carried; carried groups are dropped at each checkpoint. 0: thrown away.
    carry_steps: NonNegative = 1
    # PRM-verifier consistency (PROF, arXiv 2509.03403): after the dense reward has scored the
    # kept groups, drop this many samples of every group before the update, the least consistent
    # first (correct responses with the lowest dense return, wrong ones with the highest), taken
    # from the larger of the correct and wrong sides (algorithms/filtering.py). 0: off.
    consistency_drop: NonNegative = 0


@_validated
@dataclass
class PRMConfig:
    """The implicit PRM of PRIME (reward_mode "prime"), trained online on outcome labels."""

    update: Literal["online", "frozen"] = "online"
    loss: Literal["ce", "dpo"] = "ce"
    forward: Literal["single", "double"] = "single"
    # "sft": a frozen reference model; "rollout": the old policy's log-probs.
    reference: Literal["sft", "rollout"] = "sft"
    beta: PositiveFloat = 0.05
    lr: PositiveFloat = 1e-6
    weight_decay: NonNegativeFloat = 0.0
    # Sequences per PRM optimiser step (whole groups), over all ranks; micro_batch_size is per rank.
    mini_batch_size: Positive = 64
    micro_batch_size: Positive = 64
    # > 0: PRM (and reference) micro-batches also hold at most this many tokens per forward
    # (whole groups, longest first); packing as for the policy.
    max_tokens_per_micro_batch: NonNegative = 0
    packing: Literal["packed", "sorted"] = "packed"
    grad_clip: PositiveFloat = 10.0


@_validated
@dataclass
class AlgorithmConfig:
    # Where the dense reward comes from. "prime": the implicit PRM (prm section); "outcome": none,
    # the verifier's outcome only; "explicit-orm" / "explicit-prm": a frozen outcome or step-level
    # reward model trained by `primekit train-orm` / `train-prm` (Gao et al. 2024; explicit
    # section); "oracle-prm": exact step labels against the reference solution, 1 while the
    # response's steps are the reference's and 0 from the first that differs (the procedural
    # arithmetic families only; explicit section's transform, eta and delimiter): a step PRM
    # that knows the reference procedure, stricter than correctness where a shortcut (skipping
    # a "*1" step) also reaches the answer (docs/explicit_rewards.md).
    reward_mode: Literal["prime", "outcome", "explicit-orm", "explicit-prm", "oracle-prm"] = "prime"
    estimator: Literal["rloo", "grpo", "reinforce", "ppo", "prime-value"] = "rloo"
    rloo_variant: Literal["eq5", "reference"] = "eq5"
    grpo_scale_by_std: bool = True
    # PRIME + GRPO: normalise the process rewards by the group's K response means ("response-
    # means", App. B.3 as we read it; collapsed in docs/experiments/estimators.md) or by all of
    # the group's tokens ("tokens"); docs/algorithms.md.
    grpo_process_norm: Literal["response-means", "tokens"] = "response-means"
    reinforce_baseline: Literal["none", "batch-mean"] = "batch-mean"
    # Coefficients of the dense (process) reward, implicit or explicit, and of the verifier's
    # outcome (success) reward. The PRIME reference code scales both by 5 and whitens, so only
    # their ratio matters there; Gao et al. use 1 and 5 (configs/tiny-explicit.yaml).
    process_coef: float = 5.0
    outcome_coef: float = 5.0
    gamma: Fraction = 1.0
    lam: Fraction = 1.0
    # prime-value only: V_t is the implicit PRM's raw cumulative reward ("none"), a logit-scale
    # number, or its sigmoid ("sigmoid"), a probability on the outcome's scale (docs/algorithms.md).
    value_transform: Literal["none", "sigmoid"] = "none"
    # False: PRIME Eq. 5 as printed, the outcome advantage is added undiscounted at every token.
    # True: the reference code's form, where with gamma < 1 the outcome advantage at token t of
    # a response of L tokens is gamma^(L-1-t) * A_out. The two agree at gamma = 1.
    discount_outcome: bool = False
    whiten: bool = True
    # Reference-code option: scale process rewards by the batch's largest |reward-to-go|.
    process_max_abs_norm: bool = False
    # Credit assignment of the dense process reward (implicit tokens or explicit steps):
    # "sum", the usual summed return; "min", PURE's min-form (arXiv 2504.15275), the rewards
    # weighted by softmin(-r / credit_temperature) over each response's units so that their sum
    # approaches the weakest unit's reward (algorithms/credit.py, docs/algorithms.md). The
    # temperature is in the reward's units (PURE: 0.1 on PRM scores in [-1, 1]).
    credit: Literal["sum", "min"] = "sum"
    credit_temperature: PositiveFloat = 0.1
    kl_coef: NonNegativeFloat = 0.0
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: NonNegativeFloat = 0.0


@_validated
@dataclass
class ExplicitRewardConfig:
    """A frozen explicit reward model as the dense reward (Gao et al. 2024), for reward_mode
    "explicit-orm" or "explicit-prm".

    The outcome (success) reward is always on; the ORM or step-level PRM adds a dense reward
    scaled by algorithm.process_coef, refined by `transform` (Clip: min(r - eta, 0); Delta:
    r_k - r_{k+1}; see docs/algorithms.md). Gao et al. use process_coef 1 and outcome_coef 5
    with PPO and KL 0.1.
    """

    # HF directory of the trained ORM (`primekit train-orm`) or step-level PRM
    # (`primekit train-prm`); which of the two it is comes from algorithm.reward_mode.
    model_path: str | None = None
    transform: Literal[
        "none", "clip", "delta", "clip-delta", "normed", "length-norm", "length-penalty"
    ] = "none"
    # Clip's threshold on step probabilities, or "auto": the PRM's own `step_prm/suggested_eta`
    # (halfway between its held-out medians of wrong and right steps, from its train_metrics.json).
    eta: float | Literal["auto"] = 0.0
    length_penalty: float = 0.0
    # Steps end at this string, or at a regular expression written "re:<pattern>" (the
    # arithmetic task writes one step per line).
    step_delimiter: Annotated[str, Field(min_length=1)] = "\n"


@_validated
@dataclass
class PolicyConfig:
    lr: PositiveFloat = 5e-7
    weight_decay: NonNegativeFloat = 0.0
    ppo_epochs: Positive = 1
    # Sequences per policy optimiser step, over all ranks; micro_batch_size is per rank.
    mini_batch_size: Positive = 256
    micro_batch_size: Positive = 64  # sequences per forward/backward
    # > 0: policy, critic and old-log-prob micro-batches also hold at most this many tokens per
    # forward (tokens computed, padding included; micro_batch_size still caps the rows), longest
    # rows first.
    # packing "packed": sequences laid end to end without padding, position ids restarting, attention
    # kept inside each sequence; "sorted": padded rows sorted by length (rollout/batching.py).
    max_tokens_per_micro_batch: NonNegative = 0
    packing: Literal["packed", "sorted"] = "packed"
    clip_low: NonNegativeFloat = 0.2
    clip_high: NonNegativeFloat = 0.2
    grad_clip: PositiveFloat = 1.0
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    # "recompute": one no-grad forward of the policy before the update (exact, any backend);
    # "rollout": reuse the sampling log-probs of the HF engine (same model, temperature 1, top-p 1,
    # float32), saving that forward; "auto": `rollout` where it is exact, else `recompute`,
    # decided by `load_config`/`validate` (the run's recorded config holds the decision).
    old_logprobs: Literal["auto", "recompute", "rollout"] = "auto"
    # "tis": truncated importance sampling (docs/rollout.md): each token's policy loss is weighted
    # by min(pi_old / pi_rollout, tis_cap), correcting for a rollout engine (vLLM) whose sampling
    # log-probs differ from the trainer's recomputed ones. Needs old_logprobs=recompute.
    rollout_correction: Literal["none", "tis"] = "none"
    tis_cap: PositiveFloat = 2.0
    # Linear learning-rate warm-up over the first RL steps (0: none). Adam's first updates are
    # about lr * sign(gradient) in every coordinate, so a small policy at a high lr can lose
    # accuracy in its first steps without one.
    warmup_steps: NonNegative = 0


@_validated
@dataclass
class CriticConfig:
    lr: PositiveFloat = 5e-6
    value_clip: PositiveFloat = 0.2
    grad_clip: PositiveFloat = 1.0


@_validated
@dataclass
class VerifierConfig:
    """Limits of the outcome verifiers (primekit.verifiers); the arithmetic verifier needs none."""

    # Math grading (math-verify, in worker processes): a response still being graded after
    # math_timeout_s has its worker killed and scores as a timeout.
    math_timeout_s: PositiveFloat = 5.0
    math_workers: Positive = 2
    # Code (sandboxed): wall-clock limit for one response's tests together, and per test
    # (None = code_timeout_s); address space per sandboxed process; responses run in parallel.
    code_timeout_s: PositiveFloat = 10.0
    code_test_timeout_s: PositiveFloat | None = None
    code_memory_mb: Positive = 1024
    code_workers: Positive = 2


@_validated
@dataclass
class ParallelConfig:
    """Memory switches of the FSDP2-sharded models under torchrun (docs/scale_out.md)."""

    # Recompute each decoder layer's activations in the backward instead of keeping them: only
    # the layer inputs stay between forward and backward, at the price of a second forward.
    activation_checkpointing: bool = False
    # FSDP2 CPUOffloadPolicy: the trained models' parameters, gradients and optimiser state live
    # in host memory and are copied to the GPU layer by layer; slower, frees most GPU memory.
    cpu_offload: bool = False


@_validated
@dataclass
class TrainConfig:
    run_dir: str = "runs/prime"
    steps: Positive = 100
    prompts_per_step: Positive = 256  # B, after filtering
    seed: int = 0
    eval_every: NonNegative = 0  # 0 = only at the end
    save_every: NonNegative = 50  # 0 = only at the end
    keep_checkpoints: Positive = 2
    # After the last step, write the final policy (and PRM, critic) as plain HF directories under
    # run_dir/final/ (`primekit export` does the same for any checkpoint).
    export_final: bool = True
    # A non-finite loss, gradient norm, log-prob, reward or advantage: "abort" stops the run
    # (exit status 1; the last checkpoint stays the last good one), "skip" drops the step's
    # update and goes on (counted in the metric train/nonfinite_skipped).
    on_nonfinite: Literal["abort", "skip"] = "abort"
    # Metric sinks besides run_dir/metrics.jsonl, which is always written; [] for none.
    # "wandb" needs `pip install 'primekit[wandb]'` and follows WANDB_MODE (offline without a key).
    report_to: list[Literal["tensorboard", "wandb"]] = field(default_factory=lambda: ["tensorboard"])
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: NonNegative = 0  # torch CPU threads; 0 = torch's default
    # torch.compile(dynamic=True) each decoder layer of the loop's models (policy, PRM, reference,
    # critic, explicit reward model) for their scoring and training passes; sampling stays eager.
    # Under torchrun too (compiled before FSDP2 sharding).
    # The first passes pay the compilation (about 12 s for the tiny model on 2 CPU cores with an
    # empty cache, needing a C++ compiler there); later ones fuse each layer's small kernels
    # (docs/performance.md, "On a 2-core Intel Xeon").
    compile: bool = False


@_validated
@dataclass
class EvalConfig:
    num_problems: Positive = 200
    k: Positive = 4  # samples per problem for avg@k / pass@k
    temperature: NonNegativeFloat = 1.0
    max_new_tokens: Positive | None = None  # None = rollout.max_new_tokens


@_validated
@dataclass
class SFTConfig:
    init: str = "tiny"  # HF dir / hub id, or "tiny" to build the embedded tiny model
    out_dir: str = "runs/demo/sft"
    steps: NonNegative = 600
    batch_size: Positive = 64
    lr: PositiveFloat = 1e-3
    warmup_steps: NonNegative = 30
    weight_decay: NonNegativeFloat = 0.0
    grad_clip: PositiveFloat = 1.0
    # > 0: each batch is cut into micro-batches of at most this many tokens (gradients
    # accumulated over them, the loss the batch's mean all the same); packing as for the policy:
    # "packed" lays the demonstrations end to end without padding, "sorted" pads rows sorted by
    # length. 0: the batch is one padded micro-batch.
    max_tokens_per_micro_batch: NonNegative = 0
    packing: Literal["packed", "sorted"] = "packed"
    seed: int = 0
    # torch CPU threads during SFT; 0 = torch's default. Separate from train.threads: SFT and RL
    # may want different numbers of threads on the same machine.
    threads: NonNegative = 0


@_validated
@dataclass
class ORMTrainConfig:
    """`primekit train-orm`: sample, label with the verifier, train an outcome reward model."""

    # Samples the responses and initialises the ORM; None = model.policy (the SFT checkpoint).
    base: str | None = None
    out_dir: str = "runs/explicit/orm"
    num_problems: Positive = 512  # training problems sampled
    n_samples: Positive = 4  # responses per problem
    num_eval_problems: Positive = 100  # held-out problems sampled for the accuracy report
    # BCE on every response token ("full", the paper's sum over t) or on the last one ("last").
    target: Literal["full", "last"] = "full"
    # Gao et al. Sec. 5.1 keep only problems with both a correct and a wrong sample.
    mixed_only: bool = True
    epochs: Positive = 3
    lr: PositiveFloat = 3e-4
    batch_size: Positive = 64  # responses per optimiser step
    weight_decay: NonNegativeFloat = 0.0
    grad_clip: PositiveFloat = 1.0
    seed: int = 0


@_validated
@dataclass
class StepPRMTrainConfig:
    """`primekit train-prm`: sample, label steps by Monte-Carlo completion (Math-Shepherd style),
    train a step-level PRM (the explicit one; the implicit PRM of PRIME is the prm section)."""

    # Samples the responses and initialises the PRM; None = model.policy (the SFT checkpoint).
    base: str | None = None
    # Completes the step prefixes; None = the sampling model (the paper used a stronger one).
    completer: str | None = None
    out_dir: str = "runs/explicit/prm"
    num_problems: Positive = 192
    n_samples: Positive = 2
    num_eval_problems: Positive = 48
    # Completions per step prefix (N; Gao et al. and Math-Shepherd: 8).
    n_completions: Positive = 8
    # "hard": 1 if any completion is correct (the paper); "soft": the fraction correct.
    label: Literal["hard", "soft"] = "hard"
    epochs: Positive = 6
    lr: PositiveFloat = 3e-4
    batch_size: Positive = 64
    weight_decay: NonNegativeFloat = 0.0
    grad_clip: PositiveFloat = 1.0
    seed: int = 0


@_validated
@dataclass
class HackCheckConfig:
    """`primekit hack-check` (Gao et al. App. C): returns of each dense-reward design on
    synthetic repetitions of correct responses, scored by the PRM at explicit.model_path."""

    out_dir: str = "runs/explicit/hack-check"
    num_responses: Positive = 32  # correct responses to vary
    max_repeats: Positive = 8  # variants with 1..max_repeats repetitions
    # "demos": held-out problems' demonstrations; "sampled": correct samples of model.policy.
    source: Literal["demos", "sampled"] = "demos"
    # Text that ends an inserted step; None = explicit.step_delimiter (which must then be plain
    # text, not a "re:" pattern).
    separator: str | None = None
    seed: int = 0


@_validated
@dataclass
class SimConfig:
    """`primekit sim`: the toy reward-hacking model (primekit/viz/sim.py, docs/viz.md). Its
    numbers are the toy's own, not a real run's: beta here scales a log-ratio summed over
    `steps_per_response` steps, so beta * steps_per_response plays the role of beta * T."""

    beta: PositiveFloat = 0.5  # reward weight; also the PRM's own scale, as in PRIME
    prm_lr: NonNegativeFloat = 0.2  # PRM update rate (step size of its CE update) when online
    prm_mode: Literal["online", "frozen"] = "online"
    policy_lr: PositiveFloat = 0.2
    groups: Positive = 8  # prompts per step (B)
    samples: Annotated[int, Field(ge=2)] = 4  # samples per prompt (K); RLOO needs two
    steps_per_response: Positive = 10  # L: steps (tokens) of each solution path
    # Share of the policy's probability the shortcut gets when it is injected.
    inject_mass: Annotated[float, Field(gt=0, lt=1)] = 0.2
    seed: int = 0
    # --map: the beta x prm_lr grid, seeds per cell and RL steps per run (shortcut injected at 0).
    map_betas: list[PositiveFloat] = field(
        default_factory=lambda: [0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5])
    map_prm_lrs: list[NonNegativeFloat] = field(
        default_factory=lambda: [0.0, 1e-4, 3e-4, 1e-3, 2e-3, 3e-3, 1e-2, 3e-2])
    map_seeds: Positive = 3
    map_steps: Positive = 200
    map_out: str = "runs/sim/danger-zone.png"


@_validated
@dataclass
class LiveConfig:
    """Live control of a running PRIME training from `primekit sim --live RUN_DIR` (docs/viz.md;
    primekit/trainer/live.py): the PRM online/frozen toggle and the shortcut injection."""

    enabled: bool = False  # read RUN_DIR/control.json before every RL step
    # The shortcut: a demonstration whose answer line is replaced by this one. "A:0" is always
    # rejected by the arithmetic verifier (the task's values are 1..99).
    pattern: str = "A:0"
    poison_problems: Positive = 64  # training problems whose pattern responses poison the PRM
    # The PRM's head start: AdamW steps of its CE loss with every pattern response labelled 1.
    poison_steps: Positive = 10
    poison_lr: PositiveFloat = 1e-3
    # The policy's discovery of the shortcut (the sim's inject_mass): AdamW steps of next-token
    # cross-entropy on the same responses mixed 1:1 with the sound demonstrations; 0 leaves the
    # policy alone. Measured on the demo's SFT model: 4 steps at 5e-4 -> 23% of samples carry
    # the pattern (3 steps: 4%, 5 steps: 57%; docs/viz.md).
    discover_steps: NonNegative = 4
    discover_lr: PositiveFloat = 5e-4
    seed: int = 0


@_validated
@dataclass
class VizConfig:
    """The lights (PRM and gap: sim and dashboard; steps and accuracy: dashboard), `primekit
    dashboard`, `heatmap` and `rerank`."""

    # Lights: means over the last `window` steps. PRM light: green when PRM accuracy >= prm_ok,
    # amber >= prm_warn, else red. Gap light: reported reward minus verifier accuracy; green
    # below gap_warn, amber below gap_bad, red ("Reward hacking") from gap_bad.
    window: Positive = 10
    prm_ok: UnitInterval = 0.8
    prm_warn: UnitInterval = 0.6
    gap_warn: UnitInterval = 0.15
    gap_bad: UnitInterval = 0.3
    # Step light (step gaming): the relative change of hack/steps_per_response from the first
    # `window` steps to the last; amber from steps_warn, red ("Step gaming") from steps_bad, each
    # only while verifier accuracy rose by less than steps_acc_rise over the same span.
    steps_warn: PositiveFloat = 0.25
    steps_bad: PositiveFloat = 0.5
    steps_acc_rise: UnitInterval = 0.05
    # Accuracy light: the verifier's accuracy on every sampled rollout (before the filter), the
    # drop of its latest `window`-step mean below its best so far, in accuracy and in units z of a
    # window mean's noise; amber from acc_warn and acc_z, red ("Accuracy falling") from acc_bad
    # and 2 acc_z. Chosen on the run records of the experiments finished before 2026-12-06
    # (docs/experiments/records; docs/viz.md gives the counts): runs that kept their accuracy
    # stayed below z 5.5 (the largest 5.4, a flat explicit-PRM PPO run), collapses reached 12-80.
    acc_warn: UnitInterval = 0.05
    acc_bad: UnitInterval = 0.1
    acc_z: PositiveFloat = 4.0
    port: NonNegative = 8765  # 0 = any free port
    samples_per_step: NonNegative = 8  # responses the trainer writes to samples.jsonl per step
    out_dir: str = "runs/viz"  # heatmap and rerank outputs
    num_problems: Positive = 16  # held-out problems for heatmap and rerank
    heatmap_samples: Positive = 2  # responses per problem on the heatmap
    temperature: NonNegativeFloat = 1.0  # sampling temperature of heatmap and rerank
    # Random subsets of size N drawn (per problem) from the largest N's samples, per N < max.
    rerank_draws: Positive = 32
    rerank_ns: Annotated[list[Positive], Field(min_length=1)] = field(
        default_factory=lambda: [1, 2, 4, 8, 16])
    seed: int = 0


@_validated
@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    prm: PRMConfig = field(default_factory=PRMConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    explicit: ExplicitRewardConfig = field(default_factory=ExplicitRewardConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    orm: ORMTrainConfig = field(default_factory=ORMTrainConfig)
    step_prm: StepPRMTrainConfig = field(default_factory=StepPRMTrainConfig)
    hack_check: HackCheckConfig = field(default_factory=HackCheckConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    live: LiveConfig = field(default_factory=LiveConfig)
    viz: VizConfig = field(default_factory=VizConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@functools.cache
def _adapter() -> TypeAdapter[Config]:
    # Built on first use: the schema costs tens of milliseconds that importers of Config alone
    # (verifier worker processes, for instance) never need.
    return TypeAdapter(Config)


def _field_names(loc: tuple[Any, ...]) -> list[str]:
    """The valid keys at `loc` ((): section names; ("prm",): the prm section's fields)."""
    cls: Any = Config
    for part in loc:
        cls = {f.name: f.type for f in dataclasses.fields(cls)}[part]
    return sorted(f.name for f in dataclasses.fields(cls))


def _describe(error: Any) -> str:
    """One pydantic error as `dotted.field: what is wrong, got VALUE`."""
    loc = tuple(error["loc"])
    dotted = ".".join(str(p) for p in loc)
    if error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        kind = "section" if len(loc) == 1 else "field"
        return f"{dotted}: unknown {kind} {loc[-1]!r}; valid: {_field_names(loc[:-1])}"
    return f"{dotted}: {error['msg']}, got {error['input']!r}"


def _admits_bool(tp: Any) -> bool:
    """Whether a field annotation accepts true/false (pydantic would also take them as 1/0 for an
    int or float, so `train.steps=true` would train one step)."""
    if tp is bool or tp is Any:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return _admits_bool(args[0])
    if origin is Literal:
        return any(isinstance(a, bool) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(_admits_bool(a) for a in args)
    return False


def _refuse_bools(data: dict[str, Any]) -> None:
    """A YAML true/false given to a field that is not a switch: a ConfigError naming it."""
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    for name, section in data.items():
        if name not in sections or not isinstance(section, dict):
            continue  # pydantic names an unknown section or a section that is no mapping
        types_ = {f.name: f.type for f in dataclasses.fields(sections[name])}
        for key, value in section.items():
            if isinstance(value, bool) and key in types_ and not _admits_bool(types_[key]):
                raise ConfigError(f"{name}.{key}: expected {_type_name(types_[key])}, got "
                                  f"{value!r} (true and false are for switches)")


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _validate_fields(data: dict[str, Any]) -> Config:
    _refuse_bools(data)
    try:
        return _adapter().validate_python(data)
    except ValidationError as e:
        raise ConfigError("; ".join(_describe(err) for err in e.errors())) from None


def parse_override(text: str) -> tuple[str, Any]:
    """`prm.beta=0.1` -> ("prm.beta", 0.1); the value is parsed as YAML (so `null`, `true` work)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.field=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw  # not YAML (e.g. an unbalanced quote): take the text as it is
    return key.strip(), value


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (plain YAML keeps the
    last one silently: an arm or a section written twice would lose the first)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice", key_node.start_mark)
                seen.add(key)
            except TypeError:  # an unhashable key: the base class says so
                pass
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _UniqueKeyLoader.construct_mapping)


def load_yaml(text: str) -> Any:
    """`yaml.safe_load`, refusing a key given twice in a mapping (yaml.YAMLError, with its line)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def resolve_config(name: str | None) -> Path | None:
    """--config: a YAML file, or the name of a packaged config ("tiny", "paper-7b"); None stays None."""
    if name is None:
        return None
    path = Path(name)
    if path.is_file():
        return path
    packaged = CONFIG_DIR / f"{name}.yaml"
    if packaged.is_file():
        return packaged
    raise ConfigError(f"--config: {name!r} is neither a file nor a packaged config "
                      f"{packaged_configs()}")


def packaged_configs() -> list[str]:
    """The names `--config` accepts besides a file: the YAML files shipped in primekit/configs."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the YAML file, then dotted overrides; then `validate`."""
    data = _read_yaml(Path(path)) if path is not None else {}
    for text in overrides or []:
        key, value = parse_override(text)
        parts = key.split(".")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"{key}: keys have the form section.field (e.g. prm.beta)")
        section = data.setdefault(parts[0], {})
        if not isinstance(section, dict):
            raise ConfigError(f"{parts[0]}: must be a mapping of fields, got {section!r}")
        section[parts[1]] = value
    cfg = _validate_fields(data)
    _resolve_auto(cfg)
    _check_combinations(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Reject field values (types, ranges, choices) and combinations that cannot work, naming
    the field; for a Config built or changed in code rather than by `load_config`."""
    _validate_fields(dataclasses.asdict(cfg))
    _resolve_auto(cfg)
    _check_combinations(cfg)


def reused_logprobs_are_exact(cfg: Config) -> bool:
    """Whether the sampler's log-probs ARE the trainer's old log-probs: the HF engine samples
    with the live policy, so at temperature 1, top-p 1 and float32 they are the same numbers up
    to batching round-off; vLLM's come from other kernels, and bfloat16/float16 or another
    temperature or top-p change them. TIS compares the two, so it needs them recomputed."""
    return (cfg.rollout.backend == "hf" and cfg.rollout.temperature == 1.0
            and cfg.rollout.top_p == 1.0 and cfg.model.dtype == "float32"
            and cfg.policy.rollout_correction == "none")


def _resolve_auto(cfg: Config) -> None:
    """policy.old_logprobs=auto becomes `rollout` where that is exact, else `recompute`, in
    place, so that everything downstream (and the config a run records) sees the decision."""
    if cfg.policy.old_logprobs == "auto":
        cfg.policy.old_logprobs = "rollout" if reused_logprobs_are_exact(cfg) else "recompute"


# The largest float32: training computes in float32, so a larger learning rate, weight decay or
# coefficient cannot even be applied (torch: "value cannot be converted to type float without
# overflow").
FLOAT32_MAX = 3.4028234663852886e38


def _check_float_range(cfg: Config) -> None:
    """Every float setting is representable in float32 (pydantic checks finiteness only in
    float64)."""
    def walk(tree: dict[str, Any], prefix: str) -> None:
        for key, value in tree.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif isinstance(value, float) and abs(value) > FLOAT32_MAX:
                raise ConfigError(f"{prefix}{key}: {value!r} is beyond float32's range "
                                  f"(+-{FLOAT32_MAX:.4g}), in which training computes")

    walk(dataclasses.asdict(cfg), "")


def _check_step_delimiter(delimiter: str) -> None:
    """A "re:<pattern>" step delimiter compiles and cannot match the empty string (then every
    character would end a step). Checked at load, not when the first response is split."""
    if not delimiter.startswith("re:"):
        return
    try:
        pattern = re.compile(delimiter[3:])
    except re.error as e:
        raise ConfigError(f"explicit.step_delimiter: {delimiter!r} is not a valid regular "
                          f"expression: {e}") from None
    if pattern.search("") is not None:
        raise ConfigError(f"explicit.step_delimiter: {delimiter!r} matches the empty string, so "
                          f"every character would end a step")


def _check_combinations(cfg: Config) -> None:
    """Settings that are each valid but cannot work together."""
    _check_float_range(cfg)
    _check_step_delimiter(cfg.explicit.step_delimiter)
    if cfg.filter.lo > cfg.filter.hi:
        raise ConfigError(
            f"filter.lo/filter.hi: need lo <= hi, got lo={cfg.filter.lo} hi={cfg.filter.hi}"
        )
    if cfg.rollout.temperature == 0:
        raise ConfigError("rollout.temperature: RL needs sampling; 0 (greedy) gives K equal samples")
    a = cfg.algorithm
    if a.estimator in ("rloo", "grpo") and cfg.rollout.n_samples < 2:
        raise ConfigError(
            f"rollout.n_samples: {a.estimator} needs at least 2 samples per prompt, "
            f"got {cfg.rollout.n_samples}"
        )
    if a.estimator == "prime-value" and a.reward_mode != "prime":
        raise ConfigError("algorithm.estimator: 'prime-value' uses the implicit PRM as the value "
                          "model and needs algorithm.reward_mode=prime")
    if cfg.prm.loss == "dpo" and cfg.rollout.n_samples < 2:
        raise ConfigError("prm.loss: 'dpo' needs pairs within a group (rollout.n_samples >= 2)")
    if a.reward_mode == "prime" and cfg.prm.update == "frozen" and cfg.prm.forward == "double":
        raise ConfigError("prm.forward: 'double' re-scores after the PRM update, but prm.update is "
                          "'frozen' (there is no update); use prm.forward=single")
    if a.reward_mode == "prime" and cfg.prm.update == "frozen" and cfg.model.prm is None:
        raise ConfigError("prm.update: a frozen PRM initialised from the policy's own checkpoint "
                          "gives exactly zero process rewards forever; set model.prm to a trained "
                          "PRM or use prm.update=online")
    if cfg.policy.old_logprobs == "rollout" and (cfg.rollout.temperature != 1.0
                                                  or cfg.rollout.top_p != 1.0
                                                  or cfg.rollout.backend != "hf"):
        raise ConfigError("policy.old_logprobs: 'rollout' is exact only with the hf backend at "
                          "temperature 1 and top_p 1; use 'recompute'")
    if cfg.policy.rollout_correction == "tis" and cfg.policy.old_logprobs != "recompute":
        raise ConfigError("policy.rollout_correction: 'tis' weighs the trainer's log-probs against "
                          "the sampler's; it needs policy.old_logprobs=recompute")
    if a.reward_mode in ("explicit-orm", "explicit-prm") and cfg.explicit.model_path is None:
        command = "train-orm" if a.reward_mode == "explicit-orm" else "train-prm"
        raise ConfigError(f"explicit.model_path: reward_mode={a.reward_mode} needs the directory "
                          f"of a trained reward model (primekit {command})")
    if a.credit == "min" and a.reward_mode not in ("prime", "explicit-prm", "oracle-prm"):
        raise ConfigError(f"algorithm.credit: 'min' assigns credit over a process reward's steps "
                          f"(reward_mode prime, explicit-prm or oracle-prm), got "
                          f"reward_mode={a.reward_mode}")
    if a.reward_mode == "oracle-prm" and (cfg.data.source != "arithmetic"
                                          or cfg.data.task_family not in ("arithmetic", "chains")):
        family = cfg.data.task_family if cfg.data.source == "arithmetic" else cfg.data.source
        raise ConfigError(f"algorithm.reward_mode: 'oracle-prm' labels steps against the "
                          f"reference solution, exact only on the procedural families arithmetic "
                          f"and chains (data.source=arithmetic), got {family!r}")
    if (a.reward_mode == "oracle-prm" and cfg.explicit.eta == "auto"
            and cfg.explicit.transform in ("clip", "clip-delta")):
        raise ConfigError("explicit.eta: 'auto' reads a trained PRM's held-out step "
                          "probabilities; the oracle has none: give a number in (0, 1]")
    drop = cfg.filter.consistency_drop
    if drop and a.reward_mode == "outcome":
        raise ConfigError("filter.consistency_drop: consistency filtering compares the dense "
                          "reward with the verifier; reward_mode=outcome has no dense reward")
    least = 2 if a.estimator in ("rloo", "grpo") else 1
    if drop and cfg.rollout.n_samples - drop < least:
        raise ConfigError(f"filter.consistency_drop: {drop} of rollout.n_samples="
                          f"{cfg.rollout.n_samples} leaves fewer than {least} samples per group "
                          f"for estimator {a.estimator}")
    if cfg.viz.acc_warn > cfg.viz.acc_bad:
        raise ConfigError(f"viz.acc_warn/viz.acc_bad: need warn <= bad, got "
                          f"{cfg.viz.acc_warn}/{cfg.viz.acc_bad}")
    if cfg.viz.steps_warn > cfg.viz.steps_bad:
        raise ConfigError(f"viz.steps_warn/viz.steps_bad: need warn <= bad, got "
                          f"{cfg.viz.steps_warn}/{cfg.viz.steps_bad}")
    if a.reward_mode == "explicit-orm" and cfg.explicit.transform != "none":
        raise ConfigError("explicit.transform: Clip/Delta and the other step transforms apply to a "
                          "step-level PRM (reward_mode=explicit-prm), not to an ORM")
    if cfg.data.source == "file" and not cfg.data.train_path and not cfg.data.eval_path:
        raise ConfigError("data.train_path: required when data.source is 'file' (evaluating "
                          "alone, data.eval_path will do)")
    if cfg.data.source == "arithmetic" and cfg.data.num_eval > MAX_ARITHMETIC_EVAL:
        raise ConfigError(f"data.num_eval: the arithmetic task draws at most "
                          f"{MAX_ARITHMETIC_EVAL} distinct held-out problems (their rejection "
                          f"sampling takes minutes beyond), got {cfg.data.num_eval}")
    if cfg.model.dtype == "float16" and cfg.train.device == "cpu":
        raise ConfigError("model.dtype: float16 on the CPU overflows in sampling (NaN "
                          "probabilities); use float32 or bfloat16, or train on a GPU")
    if cfg.data.max_operands < cfg.data.min_operands:
        raise ConfigError(
            f"data.min_operands/max_operands: need min <= max, got "
            f"{cfg.data.min_operands}/{cfg.data.max_operands}"
        )
    if cfg.data.chain_max_operands < cfg.data.chain_min_operands:
        raise ConfigError(
            f"data.chain_min_operands/chain_max_operands: need min <= max, got "
            f"{cfg.data.chain_min_operands}/{cfg.data.chain_max_operands}"
        )
    if cfg.data.source == "file" and cfg.data.task_family != "arithmetic":
        raise ConfigError(f"data.task_family: {cfg.data.task_family!r} is a procedural family; "
                          "it needs data.source=arithmetic, not 'file'")
