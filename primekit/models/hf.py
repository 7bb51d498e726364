"""Loading and saving Hugging Face models and tokenizers (local directories or hub ids).

The one builder: every command (train, sft, eval, label, train-orm/-prm, hack-check, heatmap,
rerank, plan, export) loads models, tokenizers and model configs through the functions here,
which are primekit's only callers of `from_pretrained` (tests/models/test_hf_io.py checks it), so
`model.trust_remote_code` reaches every load, the tokenizer's included.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primekit.config import ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import (
        GenerationConfig,
        PretrainedConfig,
        PreTrainedModel,
        PreTrainedTokenizerBase,
    )

DTYPES = ("float32", "float16", "bfloat16", "float64", "auto")


def _looks_local(name_or_path: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else with a path shape is meant to be local.
    return (
        os.path.isabs(name_or_path)
        or name_or_path.startswith((".", "~"))
        or name_or_path.count("/") > 1
        or os.path.exists(name_or_path)
    )


def check_model_path(path: str, field: str) -> None:
    """A local-looking path that does not exist is almost always a typo: say so early, naming the
    config field (or flag) that holds it, as a ConfigError."""
    looks_local = path.startswith((".", "/", "~")) or path.startswith("runs/")
    if looks_local and not Path(path).expanduser().exists():
        raise ConfigError(f"{field}: model directory {path!r} does not exist")


def _check_source(name_or_path: str, what: str) -> None:
    if not isinstance(name_or_path, str | os.PathLike) or not str(name_or_path):
        raise ValueError(
            f"{what} name_or_path must be a non-empty path or hub id, got {name_or_path!r}"
        )
    path = Path(os.path.expanduser(str(name_or_path)))
    if _looks_local(str(name_or_path)) and not path.is_dir():
        raise FileNotFoundError(f"{what} directory not found: {str(name_or_path)!r}")


def load_model(
    name_or_path: str,
    *,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Load any causal LM from a local directory or a hub id, in `dtype`, onto `device`.

    Raises FileNotFoundError naming the path when a local directory is missing, and OSError naming
    the id when a hub id cannot be fetched (offline, typo, gated).
    """
    from transformers import AutoModelForCausalLM

    _check_source(name_or_path, "model")
    source = os.path.expanduser(str(name_or_path))
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=_torch_dtype(dtype), trust_remote_code=trust_remote_code
        )
    except OSError as err:
        raise OSError(f"cannot load model {str(name_or_path)!r}: {err}") from err
    return model.to(device)


def load_value_model(
    name_or_path: str,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    config: PretrainedConfig | None = None,
) -> PreTrainedModel:
    """A token-classification model with one label (a scalar per token): a critic, an ORM or a
    step-level PRM. From a causal-LM checkpoint the score head is new (initialised from the global
    RNG); `config` replaces the checkpoint's (e.g. one without dropout, `load_model_config`)."""
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    _check_source(name_or_path, "model")
    source = os.path.expanduser(str(name_or_path))
    kwargs: dict[str, Any] = {"config": config} if config is not None else {"num_labels": 1}
    # transformers reports a new score head as a table of MISSING keys on every load from a
    # causal LM: that head is new by design. Its report is held back; anything else it would
    # report (other missing, unexpected or mismatched weights) is one line here.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForTokenClassification.from_pretrained(
            source, dtype=_torch_dtype(dtype), trust_remote_code=trust_remote_code,
            output_loading_info=True, **kwargs
        )
    except OSError as err:
        raise OSError(f"cannot load model {str(name_or_path)!r}: {err}") from err
    finally:
        hf_logging.set_verbosity(verbosity)
    odd = {"not in the checkpoint (initialised)": [
               k for k in info.get("missing_keys", []) if not k.startswith("score.")],
           "not used": [k for k in info.get("unexpected_keys", []) if not k.startswith("lm_head.")],
           "of another shape (initialised)": list(info.get("mismatched_keys", []))}
    if any(odd.values()):
        import warnings

        warnings.warn(f"{name_or_path}: as a model with a scalar head, weights "
                      + "; ".join(f"{what}: {', '.join(map(str, keys[:5]))}"
                                  + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
                                  for what, keys in odd.items() if keys), stacklevel=2)
    return model.to(device)


def load_model_config(name_or_path: str | os.PathLike, *, trust_remote_code: bool = False,
                      **overrides: Any) -> PretrainedConfig:
    """A model's transformers config (config.json of a directory, a file, or a hub id), with
    `overrides` set on it (e.g. num_labels=1)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(os.path.expanduser(str(name_or_path)),
                                      trust_remote_code=trust_remote_code, **overrides)


def load_generation_config(name_or_path: str | os.PathLike) -> GenerationConfig | None:
    """A model's generation_config.json, or None when it has none. (Plain JSON: no remote code.)"""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(os.path.expanduser(str(name_or_path)))
    except OSError:  # no generation_config.json
        return None


def stop_token_ids(name_or_path: str | os.PathLike,
                   tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's eos plus the eos ids of the checkpoint's generation_config.json, sorted:
    the HF engine's stop tokens (rollout/hf.py reads them off the loaded model), for vLLM."""
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    generation = load_generation_config(name_or_path)
    eos = generation.eos_token_id if generation is not None else None
    ids += eos if isinstance(eos, list) else [] if eos is None else [eos]
    return sorted(set(ids))


def _torch_dtype(dtype: str | torch.dtype):
    import torch

    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES} or a torch.dtype, got {dtype!r}")
        return dtype if dtype == "auto" else getattr(torch, dtype)
    if isinstance(dtype, torch.dtype):
        return dtype
    raise ValueError(f"dtype must be a string or torch.dtype, got {dtype!r}")


def load_tokenizer(name_or_path: str | os.PathLike, *,
                   trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Load a tokenizer, with a pad token (falls back to eos) and left padding (for prompts)."""
    from transformers import AutoTokenizer

    _check_source(name_or_path, "tokenizer")
    source = os.path.expanduser(str(name_or_path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise OSError(f"cannot load tokenizer {str(name_or_path)!r}: {err}") from err
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer {str(name_or_path)!r} has neither a pad token nor an eos token"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, out_dir: str | Path
) -> Path:
    """Save model (safetensors) and tokenizer to out_dir atomically; returns out_dir.

    Everything is written to a sibling temp directory, flushed to disk, then renamed into place.
    A crash before the rename leaves out_dir as it was (old checkpoint or absent), never
    half-written. Replacing an existing out_dir takes two renames (old -> sibling backup,
    temp -> out_dir) because POSIX cannot rename over a non-empty directory; between them out_dir
    is briefly absent and the complete old copy sits in the `.<name>.old-*` sibling.
    """
    from primekit.runtime import signals_held

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # A SIGINT/SIGTERM now waits for the write to end (between the two renames below, out_dir
    # is briefly absent): the caller stops after it, with out_dir complete.
    with signals_held():
        return _save_model(model, tokenizer, out_dir)


def _umask_modes(root: Path) -> None:
    """Every file under `root` with the mode the user's umask gives a new file (safetensors
    writes its weights 0600, so teammates could read a model's config but not its weights)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in root.rglob("*"):
        if path.is_file():
            os.chmod(path, 0o666 & ~mask)


def _save_model(model, tokenizer, out_dir: Path) -> Path:
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{tag}"
    try:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _umask_modes(tmp)
        _fsync_tree(tmp)
        if out_dir.exists():
            backup = out_dir.parent / f".{out_dir.name}.old-{tag}"
            os.replace(out_dir, backup)
            os.replace(tmp, out_dir)
            shutil.rmtree(backup)
        else:
            os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
