"""Check a run's inputs before any model is loaded: model directories, the data, the runtime.

Config values (types, ranges, finiteness, combinations) are checked by `primekit.config` when the
config is loaded; what needs the file system, the tokenizer or the device is checked here, so a
bad input costs seconds instead of a model load, a training run and a lost checkpoint. Every
failure is a `ConfigError` (a ValueError) whose one-line message starts with the config field and
names the file, line or key at fault; the CLI prints it and exits with status 2.

`validated_inputs(cfg)` is the entry point; `primekit.factory` calls it first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from primekit.algorithms import ESTIMATORS
from primekit.config import Config, ConfigError
from primekit.data.problem import Problem
from primekit.data.splits import encode_prompts, load_splits
from primekit.models.hf import check_model_path, load_tokenizer

# What makes a local directory loadable by `from_pretrained`: a config, weights, a tokenizer.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass
class Inputs:
    """What validation had to load anyway, handed on so that nothing is read twice."""

    tokenizer: object
    train_problems: list[Problem]
    eval_problems: list[Problem]
    # The prompts' token ids (`encode_prompts`), computed for the length check; the trainer
    # samples from them instead of tokenising every prompt a second time.
    train_prompt_ids: list[list[int]]
    eval_prompt_ids: list[list[int]]


def _check_safetensors(path: Path, field: str) -> None:
    """The header of a safetensors file parses and its tensors fit in the file (a truncated or
    overwritten file fails here, not as a traceback from deep inside transformers)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("shorter than a safetensors header")
            n = int.from_bytes(head, "little")
            if n <= 0 or 8 + n > size:
                raise ValueError(f"header length {n} does not fit in {size} bytes")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
        if 8 + n + end > size:
            raise ValueError(f"the tensors need {8 + n + end} bytes, the file has {size}")
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise ConfigError(f"{field}: weights file {str(path)!r} is unreadable or corrupt: "
                          f"{e}") from None


# What a model directory must be for the field that names it (`check_model_dir(kind=...)`):
# "lm" a language model (policy, reference, implicit PRM); "orm" / "prm" a reward model that
# `primekit train-orm` / `train-prm` wrote (a scalar head on each token, and its training record).
REWARD_MODEL_COMMAND = {"orm": "train-orm", "prm": "train-prm"}
_RECORD_PREFIX = {"orm": "orm/", "prm": "step_prm/"}  # train_metrics.json summary keys


def _check_kind(root: Path, path: str, field: str, kind: str) -> None:
    """A reward model where a language model belongs, or the reverse, or an ORM where a step PRM
    belongs: each loads (transformers initialises or drops the head) and then means nothing."""
    try:
        arch = json.loads((root / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return  # an unreadable config.json is transformers' to report
    arch = [str(a) for a in arch]
    scalar = any(a.endswith("ForTokenClassification") for a in arch)
    lm = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in arch)
    if kind == "lm" and scalar and not lm:
        raise ConfigError(f"{field}: {path!r} is a reward model ({arch[0]}: a scalar per token), "
                          f"not a language model")
    if kind not in REWARD_MODEL_COMMAND:
        return
    command = REWARD_MODEL_COMMAND[kind]
    if lm and not scalar:
        raise ConfigError(f"{field}: {path!r} is a language model ({arch[0]}), not a reward "
                          f"model: it has no trained score head (train one with primekit "
                          f"{command})")
    try:
        summary = json.loads((root / "train_metrics.json").read_text()).get("summary", {})
    except (OSError, ValueError, AttributeError):
        return  # not trained by primekit: nothing says which kind it is
    other = next((k for k in _RECORD_PREFIX if k != kind), None)
    if other is not None and any(str(key).startswith(_RECORD_PREFIX[other]) for key in summary):
        what = {"orm": "an outcome reward model (ORM)", "prm": "a step-level PRM"}
        raise ConfigError(f"{field}: {path!r} is {what[other]} (primekit "
                          f"{REWARD_MODEL_COMMAND[other]}), where {what[kind]} belongs "
                          f"(primekit {command})")


def check_model_dir(path: str | None, field: str, *, tokenizer: bool = False,
                    kind: str | None = None) -> None:
    """A local model directory has a config.json, readable weights and (if `tokenizer`) tokenizer
    files, and is the `kind` of model its field needs ("lm", "orm", "prm"; None: any); a name
    that is no local path must be a hub id that is cached or that the hub confirms
    (`check_hub_model`: one request, instead of transformers' minute of retries on a typo)."""
    if path is None:
        return
    check_model_path(path, field)
    root = Path(path).expanduser()
    if not root.exists():
        check_hub_model(path, field, "download the model first")
        return
    if not root.is_dir():
        raise ConfigError(f"{field}: {path!r} is a file, not a model directory")
    if not (root / "config.json").is_file():
        raise ConfigError(f"{field}: {path!r} has no config.json (not a model directory)")
    weights = [p for pattern in WEIGHT_PATTERNS for p in sorted(root.glob(pattern))]
    if not weights:
        raise ConfigError(f"{field}: {path!r} has no weights (*.safetensors or *.bin)")
    for file in weights:
        if file.suffix == ".safetensors":
            _check_safetensors(file, field)
    if tokenizer and not any((root / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{field}: {path!r} has no tokenizer (none of {list(TOKENIZER_FILES)})")
    if kind is not None:
        _check_kind(root, path, field, kind)


def context_length(path: str, trust_remote_code: bool) -> int | None:
    """The model's longest sequence (max_position_embeddings or n_positions), if it says."""
    from primekit.models.hf import load_model_config

    try:
        config = load_model_config(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.policy: cannot read the model config of {path!r}: "
                          f"{str(e).splitlines()[0]}") from None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_runtime(cfg: Config) -> None:
    """Settings that only the resolved device can judge."""
    from primekit.runtime import resolve_device

    device = resolve_device(cfg.train.device)
    if cfg.model.dtype == "float16" and device.type == "cpu":
        raise ConfigError("model.dtype: float16 on the CPU overflows in sampling (NaN "
                          "probabilities); use float32 or bfloat16, or train on a GPU")


# A prompt this many times the model's context in characters is refused from the tokens of its
# beginning alone: tokenizing all of a 50 MB prompt took two minutes and 19 GB on the tiny model.
# (No tokenizer here has tokens of 64 characters on average; if one did, the whole prompt would
# be tokenized as before.)
LONG_PROMPT_CHARS_PER_TOKEN = 64


def refuse_overlong_prompts(tokenizer, problems: list[Problem], cfg: Config, field: str,
                            max_new_tokens: int, context: int | None) -> None:
    """Refuse a prompt far past the context from a prefix's tokens, before `encode_prompts`
    tokenizes all of it."""
    if context is None:
        return
    limit = LONG_PROMPT_CHARS_PER_TOKEN * context
    for problem in problems:
        if len(problem.prompt) <= limit:
            continue
        head = Problem(id=problem.id, prompt=problem.prompt[:limit], task=problem.task)
        (ids,) = encode_prompts(tokenizer, [head], cfg)
        if len(ids) + max_new_tokens > context:
            where = problem.meta.get("location", problem.id)
            raise ConfigError(
                f"{field}: {where}: the prompt is {len(problem.prompt)} characters, and its "
                f"first {limit} alone are {len(ids)} tokens; with {max_new_tokens} new tokens "
                f"that exceeds the model's context of {context} tokens")


def check_problem_lengths(prompt_ids: list[list[int]], problems: list[Problem], field: str,
                          max_new_tokens: int, context: int | None) -> None:
    """Every prompt plus `max_new_tokens` fits in the model's context."""
    if context is None:
        return
    for ids, problem in zip(prompt_ids, problems):
        if len(ids) + max_new_tokens > context:
            where = problem.meta.get("location", problem.id)
            raise ConfigError(
                f"{field}: {where}: the prompt is {len(ids)} tokens; with {max_new_tokens} new "
                f"tokens that exceeds the model's context of {context} tokens")


def _data_field(cfg: Config, which: str) -> str:
    if cfg.data.source != "file":
        return "data.source"
    if which == "eval" and cfg.data.eval_path:
        return "data.eval_path"
    return "data.train_path"


def _split_source(cfg: Config, which: str, count: int) -> str:
    """Where a split's problems come from, for a message: "'eval.jsonl' holds 8"."""
    d = cfg.data
    if d.source != "file":
        return f"data.num_{which}={d.num_train if which == 'train' else d.num_eval} draws {count}"
    if which == "eval" and d.eval_path:
        where = f"data.eval_path {d.eval_path!r} holds {count}"
    elif which == "eval":
        where = (f"data.train_path {d.train_path!r} holds back {count} at "
                 f"data.heldout_fraction={d.heldout_fraction}")
    else:
        where = f"data.train_path {d.train_path!r} holds {count}"
        if not d.eval_path:
            where += f" once the held-out problems (data.heldout_fraction={d.heldout_fraction}) " \
                     f"are set aside"
    if which == "eval" and count == d.num_eval:
        where += f" (data.num_eval={d.num_eval} keeps at most that many)"
    return where


def check_split_sizes(cfg: Config, train: list[Problem], heldout: list[Problem]) -> None:
    """Enough training problems for one step's prompts and enough held-out problems for the
    evaluation: a shortfall would otherwise be filled silently (prompts repeated within a step,
    or an evaluation on fewer problems than asked for)."""
    need = cfg.train.prompts_per_step
    if len(train) < need:
        raise ConfigError(
            f"train.prompts_per_step: {need} prompts per step (over all ranks) need at least "
            f"{need} training problems, but {_split_source(cfg, 'train', len(train))}; lower "
            f"train.prompts_per_step or add problems")
    check_eval_size(cfg, heldout)


def check_eval_size(cfg: Config, heldout: list[Problem]) -> None:
    """`eval.num_problems` held-out problems exist (training and `primekit eval`)."""
    asked = cfg.eval.num_problems
    if asked > len(heldout):
        raise ConfigError(
            f"eval.num_problems: {asked} held-out problems asked for, but "
            f"{_split_source(cfg, 'eval', len(heldout))}; lower eval.num_problems to at most "
            f"{len(heldout)} or add held-out problems")


def model_roles(cfg: Config) -> dict[str, str | None]:
    """{config field: directory} of the models an RL run loads besides the policy."""
    m, a = cfg.model, cfg.algorithm
    roles: dict[str, str | None] = {}
    if (a.reward_mode == "prime" and cfg.prm.reference == "sft") or a.kl_coef > 0:
        roles["model.ref"] = m.ref
    if a.reward_mode == "prime":
        roles["model.prm"] = m.prm
    if ESTIMATORS[a.estimator].critic:
        roles["model.critic"] = m.critic
    if a.reward_mode in ("explicit-orm", "explicit-prm"):
        roles["explicit.model_path"] = cfg.explicit.model_path
    return roles


def role_kind(cfg: Config, field: str) -> str | None:
    """The kind of model (`check_model_dir`) the config field `field` of `model_roles` names."""
    if field == "explicit.model_path":
        return "orm" if cfg.algorithm.reward_mode == "explicit-orm" else "prm"
    return None if field == "model.critic" else "lm"  # a critic may start from either


def validated_inputs(cfg: Config, *, roles: dict[str, str | None] | None = None) -> Inputs:
    """Check everything a training run reads, before any model is loaded; return the tokenizer,
    the problem splits and their prompts' token ids for the trainer.

    Args:
        cfg: the run's config.
        roles: {config field: model directory} of the models the run will load besides the
            policy (e.g. {"model.prm": ...}); the policy's directory must also hold a tokenizer.
    """
    check_runtime(cfg)
    check_model_dir(cfg.model.policy, "model.policy", tokenizer=True, kind="lm")
    for field, path in (roles or {}).items():
        check_model_dir(path, field, kind=role_kind(cfg, field))
    try:
        tokenizer = load_tokenizer(cfg.model.policy, trust_remote_code=cfg.model.trust_remote_code)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.policy: cannot load the tokenizer of {cfg.model.policy!r}: "
                          f"{str(e).splitlines()[0]}") from None
    train, heldout = load_splits(cfg)
    if not train:
        raise ConfigError(f"{_data_field(cfg, 'train')}: no training problems")
    if not heldout:
        if cfg.data.source == "file" and not cfg.data.eval_path:
            raise ConfigError(
                f"data.train_path: {len(train)} rows leave no held-out problems at "
                f"data.heldout_fraction={cfg.data.heldout_fraction}; add rows or give "
                f"data.eval_path")
        raise ConfigError(f"{_data_field(cfg, 'eval')}: no held-out problems to evaluate on")
    check_split_sizes(cfg, train, heldout)
    context = context_length(cfg.model.policy, cfg.model.trust_remote_code)
    max_eval_tokens = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its "sequence length is longer" warning: we say it better
    try:
        refuse_overlong_prompts(tokenizer, train, cfg, _data_field(cfg, "train"),
                                cfg.rollout.max_new_tokens, context)
        refuse_overlong_prompts(tokenizer, heldout, cfg, _data_field(cfg, "eval"),
                                max_eval_tokens, context)
        train_ids = encode_prompts(tokenizer, train, cfg)
        check_problem_lengths(train_ids, train, _data_field(cfg, "train"),
                              cfg.rollout.max_new_tokens, context)
        eval_ids = encode_prompts(tokenizer, heldout, cfg)
        check_problem_lengths(eval_ids, heldout, _data_field(cfg, "eval"), max_eval_tokens,
                              context)
    finally:
        hf_logging.set_verbosity(verbosity)
    return Inputs(tokenizer, train, heldout, train_ids, eval_ids)


def check_output_inputs(command: str, cfg: Config) -> None:
    """What `sft`, `train-orm` and `train-prm` read, checked before their output directory (or
    the demo's run directory) is touched: the data files (named file and line on a bad row) and
    the local model directories they start from. The procedural task has no files to check (and
    drawing it takes seconds, so it is left to the command)."""
    if cfg.data.source == "file":
        load_splits(cfg)
    base = {"train-orm": ("orm.base", cfg.orm.base), "train-prm": ("step_prm.base",
                                                                   cfg.step_prm.base)}
    models: dict[str, str | None] = {}
    if command == "sft":
        models["sft.init"] = None if cfg.sft.init == "tiny" else cfg.sft.init
    elif command in base:
        field, path = base[command]
        models[field if path else "model.policy"] = path or cfg.model.policy
    if command == "train-prm" and cfg.step_prm.completer:
        check_model_dir(cfg.step_prm.completer, "step_prm.completer")
    for field, path in models.items():
        check_model_dir(path, field, tokenizer=True)


def check_eval_model(path: str, field: str = "--model") -> None:
    """`primekit eval --model`: a local model directory (config, weights, tokenizer), not a
    training run or checkpoint (sharded DCP weights: export them first); a name that is no
    local path must be a hub id that is cached, or that the hub confirms in one request
    (instead of transformers' minute of retries on a typo)."""
    root = Path(path).expanduser()
    if root.is_dir() and ((root / "checkpoints").is_dir() or (root / "trainer_state.json").is_file()
                          or (root / "weights" / ".metadata").is_file()):
        raise ConfigError(f"{field}: {path!r} is a training run or checkpoint (sharded weights), "
                          f"not a model directory; export it first (primekit export RUN_DIR), "
                          f"or evaluate RUN_DIR/final/policy of a finished run")
    if root.exists():
        check_model_dir(path, field, tokenizer=True, kind="lm")
        return
    check_hub_model(path, field, "download the model first")


def cached_hub_model(name: str) -> bool:
    """Whether `name` is a hub id whose model this machine has downloaded."""
    import huggingface_hub

    try:
        return isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def check_hub_model(path: str, field: str, otherwise: str) -> None:
    """`path`, which is no local path, must be a hub id that is cached or that the hub confirms
    in one request with a 10 s timeout (instead of transformers' retries: a minute on a typo,
    26 s offline); else one ConfigError line ending in `otherwise` (what to do instead)."""
    check_model_path(path, field)
    if path.startswith((".", "/", "~")) or path.count("/") > 1:
        raise ConfigError(f"{field}: model directory {path!r} does not exist")
    import huggingface_hub
    from huggingface_hub.utils import RepositoryNotFoundError

    if cached_hub_model(path):
        return
    try:
        huggingface_hub.model_info(path, timeout=10)
    except RepositoryNotFoundError:
        raise ConfigError(f"{field}: {path!r} is no local directory, and the Hugging Face hub "
                          f"has no model of that id") from None
    except Exception as e:  # noqa: BLE001 (offline, no network, gated: one line either way)
        raise ConfigError(f"{field}: {path!r} is no local directory and no cached hub model, and "
                          f"the hub cannot confirm it ({type(e).__name__}); check the path, or "
                          f"{otherwise}") from None
