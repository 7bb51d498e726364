"""Configuration: nested dataclasses are the one home of every default.

A run is configured by a YAML file plus dotted command-line overrides (`prm.beta=0.1`). Unknown keys,
values of the wrong type and impossible combinations fail at start with a message that names the
field. Defaults are the PRIME paper's 7B values where they apply (Sec. 4.1 / App. of arXiv
2502.01456); `configs/tiny.yaml` scales them down for the CPU demo.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration value or combination that cannot work; the message names the field."""


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
    dtype: str = "float32"
    use_chat_template: bool = False
    system_prompt: str | None = None
    trust_remote_code: bool = False


@dataclass
class DataConfig:
    # "arithmetic" (procedural, generated from the seed) or "file" (train_path / eval_path).
    source: str = "arithmetic"
    # Verifier for file data: "math", "code" or "arithmetic"; ignored for the procedural source.
    task: str = "math"
    train_path: str | None = None
    eval_path: str | None = None
    num_train: int = 20000
    num_eval: int = 200
    min_operands: int = 2
    max_operands: int = 4
    seed: int = 1234


@dataclass
class RolloutConfig:
    backend: str = "hf"
    n_samples: int = 4  # K, samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 1024
    micro_batch_size: int = 256


@dataclass
class FilterConfig:
    """Online prompt filter (PRIME Sec. 3.4): keep groups whose mean outcome is in [lo, hi]."""

    enabled: bool = True
    lo: float = 0.2
    hi: float = 0.8
    # Prompts sampled per round: missing groups x oversample / (keep rate so far in this step).
    oversample: float = 1.5
    # Rollout rounds per step before giving up filling the batch (with a warning).
    max_rounds: int = 4


@dataclass
class PRMConfig:
    update: str = "online"  # "online" | "frozen"
    loss: str = "ce"  # "ce" | "dpo"
    forward: str = "single"  # "single" | "double"
    reference: str = "sft"  # "sft" (frozen reference model) | "rollout" (old policy log-probs)
    beta: float = 0.05
    lr: float = 1e-6
    weight_decay: float = 0.0
    mini_batch_size: int = 64  # sequences per PRM optimiser step (whole groups)
    micro_batch_size: int = 64
    grad_clip: float = 10.0
    # Run independent phases on a second thread: the reference forward beside the old-policy and
    # PRM forwards, and (single forward) the last PRM mini-batch's backward + optimiser step beside
    # the policy update. Same numbers, less wall time; holds that mini-batch's PRM activations.
    overlap: bool = False
    # Score each rollout round's kept groups (reference and PRM forwards) as soon as the round is
    # verified, instead of the whole batch after collection; with `overlap` this runs on the second
    # thread beside the next round's rollout. Applies under single forward when one PRM mini-batch
    # holds the whole step (mini_batch_size >= prompts_per_step * K), where the PRM's weights
    # cannot change between rounds; otherwise the batch is scored after collection.
    score_per_round: bool = True


@dataclass
class AlgorithmConfig:
    reward_mode: str = "prime"  # "prime" | "outcome" | "orm" | "prm" (explicit reward models)
    estimator: str = "rloo"  # "rloo" | "grpo" | "reinforce" | "ppo" | "prime-value"
    rloo_variant: str = "eq5"  # "eq5" | "reference"
    grpo_scale_by_std: bool = True
    reinforce_baseline: str = "batch-mean"  # "none" | "batch-mean"
    # The reference code scales both terms by 5 and whitens, so only their ratio matters.
    process_coef: float = 5.0
    outcome_coef: float = 5.0
    gamma: float = 1.0
    lam: float = 1.0
    whiten: bool = True
    # Reference-code option: scale process rewards by the batch's largest |reward-to-go|.
    process_max_abs_norm: bool = False
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    entropy_coef: float = 0.0


@dataclass
class ExplicitRewardConfig:
    """Explicit reward models as rewards (Gao et al. 2024), for reward_mode "orm" or "prm".

    The success reward (the verifier's outcome) is always on; the ORM or step-level PRM adds a dense
    reward, refined by `transform` (Clip: min(r - eta, 0); Delta: r_k - r_{k+1}; see
    docs/algorithms.md). Gao et al. use dense_coef 1 and success_coef 5 with PPO and KL 0.1.
    """

    orm: str | None = None  # HF directory of an ORM trained by `primekit train-orm`
    prm: str | None = None  # HF directory of a step-level PRM trained by `primekit train-prm`
    transform: str = "none"
    eta: float = 0.0
    length_penalty: float = 0.0
    dense_coef: float = 1.0
    success_coef: float = 5.0
    # Steps end at this string (the arithmetic task writes one step per line).
    step_delimiter: str = "\n"


@dataclass
class PolicyConfig:
    lr: float = 5e-7
    weight_decay: float = 0.0
    ppo_epochs: int = 1
    mini_batch_size: int = 256  # sequences per policy optimiser step
    micro_batch_size: int = 64  # sequences per forward/backward
    clip_low: float = 0.2
    clip_high: float = 0.2
    grad_clip: float = 1.0
    loss_agg: str = "token-mean"
    # "recompute": one no-grad forward of the policy before the update (exact, any backend);
    # "rollout": reuse the sampling log-probs of the HF engine (same model, temperature 1, top-p 1).
    old_logprobs: str = "recompute"
    # Linear learning-rate warm-up over the first RL steps (0: none). Adam's first updates are
    # about lr * sign(gradient) in every coordinate, so a small policy at a high lr can lose
    # accuracy in its first steps without one.
    warmup_steps: int = 0


@dataclass
class CriticConfig:
    lr: float = 5e-6
    value_clip: float = 0.2
    grad_clip: float = 1.0


@dataclass
class TrainConfig:
    run_dir: str = "runs/prime"
    steps: int = 100
    prompts_per_step: int = 256  # B, after filtering
    seed: int = 0
    eval_every: int = 0  # 0 = only at the end
    save_every: int = 50  # 0 = only at the end
    keep_checkpoints: int = 2
    tensorboard: bool = True
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    threads: int = 0  # torch CPU threads; 0 = torch's default


@dataclass
class EvalConfig:
    num_problems: int = 200
    k: int = 4  # samples per problem for avg@k / pass@k
    temperature: float = 1.0
    max_new_tokens: int | None = None  # None = rollout.max_new_tokens


@dataclass
class SFTConfig:
    init: str = "tiny"  # HF dir / hub id, or "tiny" to build the embedded tiny model
    out_dir: str = "runs/demo/sft"
    steps: int = 600
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    # torch CPU threads during SFT; 0 = torch's default. SFT has the machine to itself, while RL
    # (train.threads) shares it with the second thread that `prm.overlap` runs.
    threads: int = 0


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
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CHOICES: dict[str, tuple[str, ...]] = {
    "data.source": ("arithmetic", "file"),
    "data.task": ("math", "code", "arithmetic"),
    "rollout.backend": ("hf", "vllm"),
    "prm.update": ("online", "frozen"),
    "prm.loss": ("ce", "dpo"),
    "prm.forward": ("single", "double"),
    "prm.reference": ("sft", "rollout"),
    "algorithm.reward_mode": ("prime", "outcome", "orm", "prm"),
    "explicit.transform": ("none", "clip", "delta", "clip-delta", "normed", "length-norm",
                           "length-penalty"),
    "algorithm.estimator": ("rloo", "grpo", "reinforce", "ppo", "prime-value"),
    "algorithm.rloo_variant": ("eq5", "reference"),
    "algorithm.reinforce_baseline": ("none", "batch-mean"),
    "algorithm.kl_kind": ("k1", "k2", "k3"),
    "policy.loss_agg": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"),
    "policy.old_logprobs": ("recompute", "rollout"),
    "train.device": ("auto", "cpu", "cuda"),
    "model.dtype": ("float32", "bfloat16", "float16"),
}


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Convert a YAML/CLI value to the annotated type `tp`, or raise ConfigError naming `name`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        is_null = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_null and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, name)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{name}: bad value {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    raise ConfigError(f"{name}: unsupported field type {tp!r}")


def _section_types(obj: Any) -> dict[str, Any]:
    return typing.get_type_hints(type(obj))


def set_value(cfg: Config, dotted: str, value: Any) -> None:
    """Set `section.field` on cfg, converting and validating the type."""
    parts = dotted.split(".")
    if len(parts) != 2:
        raise ConfigError(f"{dotted}: keys have the form section.field (e.g. prm.beta)")
    section_name, key = parts
    sections = {f.name for f in dataclasses.fields(cfg)}
    if section_name not in sections:
        raise ConfigError(f"{dotted}: unknown section {section_name!r}; valid: {sorted(sections)}")
    section = getattr(cfg, section_name)
    hints = _section_types(section)
    if key not in hints:
        raise ConfigError(f"{dotted}: unknown field {key!r} in [{section_name}]; valid: {sorted(hints)}")
    setattr(section, key, _coerce(value, hints[key], dotted))


def apply_dict(cfg: Config, data: dict[str, Any], source: str = "config") -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    for section_name, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section_name!r} must be a mapping, got {values!r}")
        for key, value in values.items():
            set_value(cfg, f"{section_name}.{key}", value)


def parse_override(text: str) -> tuple[str, Any]:
    """`prm.beta=0.1` -> ("prm.beta", 0.1); the value is parsed as YAML (so `null`, `true` work)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.field=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the YAML file, then dotted overrides; then `validate`."""
    cfg = Config()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        data = yaml.safe_load(p.read_text()) or {}
        apply_dict(cfg, data, source=str(p))
    for text in overrides or []:
        key, value = parse_override(text)
        set_value(cfg, key, value)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Reject values and combinations that cannot work, naming the field."""
    for dotted, choices in CHOICES.items():
        section, key = dotted.split(".")
        value = getattr(getattr(cfg, section), key)
        if value not in choices:
            raise ConfigError(f"{dotted}: {value!r} is not one of {list(choices)}")

    def positive(dotted: str, allow_zero: bool = False) -> None:
        section, key = dotted.split(".")
        value = getattr(getattr(cfg, section), key)
        if value < 0 or (value == 0 and not allow_zero):
            raise ConfigError(f"{dotted}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")

    for dotted in ("rollout.n_samples", "rollout.max_new_tokens", "rollout.micro_batch_size",
                   "prm.mini_batch_size", "prm.micro_batch_size", "policy.ppo_epochs",
                   "policy.mini_batch_size", "policy.micro_batch_size", "train.steps",
                   "train.prompts_per_step", "eval.k", "sft.batch_size", "filter.max_rounds",
                   "data.num_eval"):
        positive(dotted)
    for dotted in ("prm.lr", "policy.lr", "critic.lr", "sft.lr", "rollout.top_p", "prm.beta",
                   "algorithm.gamma", "algorithm.lam"):
        positive(dotted)
    for dotted in ("rollout.temperature", "eval.temperature", "algorithm.kl_coef",
                   "algorithm.entropy_coef", "policy.clip_low", "policy.clip_high",
                   "train.eval_every", "train.save_every", "sft.steps", "train.threads", "sft.threads",
                   "eval.num_problems", "policy.warmup_steps"):
        positive(dotted, allow_zero=True)
    if cfg.rollout.top_p > 1:
        raise ConfigError(f"rollout.top_p: must be in (0, 1], got {cfg.rollout.top_p}")
    if cfg.algorithm.gamma > 1 or cfg.algorithm.lam > 1:
        raise ConfigError("algorithm.gamma and algorithm.lam must be in (0, 1]")
    if not 0 <= cfg.filter.lo <= cfg.filter.hi <= 1:
        raise ConfigError(
            f"filter.lo/filter.hi: need 0 <= lo <= hi <= 1, got lo={cfg.filter.lo} hi={cfg.filter.hi}"
        )
    if cfg.filter.oversample < 1:
        raise ConfigError(f"filter.oversample: must be >= 1, got {cfg.filter.oversample}")
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
    if a.reward_mode in ("orm", "prm") and getattr(cfg.explicit, a.reward_mode) is None:
        raise ConfigError(f"explicit.{a.reward_mode}: reward_mode={a.reward_mode} needs the path "
                          f"of a trained reward model (primekit train-{a.reward_mode})")
    if a.reward_mode == "orm" and cfg.explicit.transform != "none":
        raise ConfigError("explicit.transform: Clip/Delta and the other step transforms apply to a "
                          "step-level PRM (reward_mode=prm), not to an ORM")
    if not cfg.explicit.step_delimiter:
        raise ConfigError("explicit.step_delimiter: must not be empty")
    if cfg.data.source == "file" and not cfg.data.train_path:
        raise ConfigError("data.train_path: required when data.source is 'file'")
    if cfg.data.min_operands < 2 or cfg.data.max_operands < cfg.data.min_operands:
        raise ConfigError(
            f"data.min_operands/max_operands: need 2 <= min <= max, got "
            f"{cfg.data.min_operands}/{cfg.data.max_operands}"
        )
