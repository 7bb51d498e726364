"""Checkpoints that survive a crash at any moment, and exact resume.

Layout of one checkpoint, `run_dir/checkpoints/step_{step:06d}/`:
    policy/, prm/, critic/   HF `save_pretrained` directories (whichever models are given);
                             a module without `save_pretrained` gets `model.safetensors` only
    optimizers.pt            {name: state_dict()} of optimizers and LR schedulers
    rng.pt                   per-rank RNG states: python `random`, numpy, torch CPU, torch CUDA
                             (when available) and named torch.Generator states
    trainer_state.json       {"step": step, **state}
and `run_dir/checkpoints/latest` holds the name of the newest complete checkpoint.

Atomicity: everything is written into a hidden temp dir next to the final one, every file and
directory is fsync'd, the temp dir is renamed into place (atomic within one filesystem), then
`latest` is replaced atomically (temp file + os.replace), and only then are old checkpoints
pruned. A crash before the rename leaves a `.tmp-*` dir that readers ignore and the next save
deletes; a crash after it leaves `latest` on the previous complete checkpoint.

Collectives: every rank calls `save_checkpoint` (RNG states are gathered from all ranks so each
resumes its own stream); only the main rank writes. Every rank calls `load_checkpoint` and reads
the files, so `run_dir` must be on storage all ranks can see. Model weights are taken from the
main rank's module as a full state dict (plain or DDP-wrapped modules); FSDP-sharded modules
need their full state dict gathered by the caller first, which this module does not do.

Call `save_checkpoint` after step `s` has finished, with `state` holding what the trainer needs
to continue at step `s + 1` (data position, config); the RNG streams then continue exactly.
Pickled files are loaded with `weights_only=True`; still, load only checkpoints you trust.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from primekit import distributed as dist

CHECKPOINTS = "checkpoints"
LATEST = "latest"
_PREFIX = "step_"
_TMP_PREFIX = ".tmp-"


# Test hook for the fault-injection suite (tests/trainer/test_reliability_faults.py): with
# PRIMEKIT_FAULT="<phase>@<step>" the process kills itself with SIGKILL at that phase of saving
# that step. Phases: "<model name>" (that model written), "state" (every file written),
# "renamed" (the checkpoint renamed into place), "latest" (`latest` updated, before pruning).
FAULT_ENV = "PRIMEKIT_FAULT"


def _fault_point(phase: str, final: Path) -> None:
    if os.environ.get(FAULT_ENV) == f"{phase}@{_step_of(final)}":
        os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of `step` lives: `run_dir/checkpoints/step_{step:06d}`."""
    return Path(run_dir) / CHECKPOINTS / f"{_PREFIX}{step:06d}"


# --- RNG -------------------------------------------------------------------------------------


def _rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    if np_state["bit_generator"] != "MT19937":
        raise ValueError(f"unexpected numpy global bit generator {np_state['bit_generator']!r}")
    return {
        "python": random.getstate(),
        # Tensors instead of numpy arrays so that torch.load(weights_only=True) accepts the file.
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generators": {name: g.get_state() for name, g in generators.items()},
    }


def _set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    key = n["key"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", key, n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        if len(state["cuda"]) != torch.cuda.device_count():
            warnings.warn(
                f"checkpoint has CUDA RNG states for {len(state['cuda'])} devices, this process "
                f"sees {torch.cuda.device_count()}; restoring the first ones only",
                stacklevel=3,
            )
        for i, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, device=i)
    saved = state["generators"]
    missing = sorted(set(generators) - set(saved))
    if missing:
        raise ValueError(f"generators {missing} are not in the checkpoint (has {sorted(saved)})")
    for name, g in generators.items():
        g.set_state(saved[name])


# --- model weights -------------------------------------------------------------------------------


def _unwrap(model: Any) -> torch.nn.Module:
    if isinstance(model, tuple):
        model = model[0]
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def _save_model(model: torch.nn.Module, tokenizer: Any, out: Path) -> None:
    if hasattr(model, "save_pretrained"):
        try:
            from transformers.utils import logging as hf_logging
        except ImportError:
            hf_logging = None
        quiet = hf_logging is not None and not hf_logging.is_progress_bar_enabled()
        if hf_logging is not None:
            hf_logging.disable_progress_bar()  # no tqdm bars over our own progress bar
        try:
            model.save_pretrained(out, safe_serialization=True)
        finally:
            if hf_logging is not None and not quiet:
                hf_logging.enable_progress_bar()
    else:
        from safetensors.torch import save_model

        out.mkdir(parents=True)
        save_model(model, str(out / "model.safetensors"))
    if tokenizer is not None:
        tokenizer.save_pretrained(out)


def _load_weights(model: torch.nn.Module, model_dir: Path) -> None:
    """Copy the safetensors weights in `model_dir` into `model` in place.

    HF (and safetensors' `save_model`) drop one of each pair of tied tensors, e.g. `lm_head.weight`
    when it is `model.embed_tokens.weight`; a key missing from the files is accepted only when it
    shares storage with a key that is present. Any other mismatch is an error, checked before a
    single tensor is copied. Not handled: checkpoints whose keys HF renames on load (transformers
    5 weight conversions) - those raise here.
    """
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    own = model.state_dict()
    unexpected = sorted(set(weights) - set(own))
    present_ptrs = {own[k].data_ptr() for k in weights if k in own}
    missing = sorted(k for k in set(own) - set(weights) if own[k].data_ptr() not in present_ptrs)
    if missing or unexpected:
        raise ValueError(
            f"weights in {model_dir} do not match the model: missing {missing[:8]}"
            f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
            f"{'...' if len(unexpected) > 8 else ''}"
        )
    model.load_state_dict(weights, strict=False)


# --- atomic file system helpers ------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    if not hasattr(os, "O_DIRECTORY"):  # Windows cannot open a directory for fsync
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(dirpath))


def _write_latest(ckpt_root: Path, name: str) -> None:
    tmp = ckpt_root / f"{_TMP_PREFIX}{LATEST}-{uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_root / LATEST)
    _fsync_dir(ckpt_root)


def _step_of(path: Path) -> int | None:
    name = path.name
    if not name.startswith(_PREFIX) or not name[len(_PREFIX) :].isdigit():
        return None
    return int(name[len(_PREFIX) :])


def _complete(path: Path) -> bool:
    return path.is_dir() and _step_of(path) is not None and (path / "trainer_state.json").is_file()


# --- public API ----------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    models: dict[str, tuple[Any, Any]] | None = None,
    optimizers: dict[str, Any] | None = None,
    generators: dict[str, torch.Generator] | None = None,
    state: dict | None = None,
    keep_last: int | None = 2,
) -> Path:
    """Atomically write the checkpoint of `step` and point `latest` at it; all ranks call this.

    Args:
        run_dir: the run's directory; checkpoints go to `run_dir/checkpoints/`.
        step: the step just finished (>= 0).
        models: {name: (model, tokenizer or None)}, e.g. {"policy": (policy, tok)}; each is saved
            to `<name>/` with `save_pretrained` (plain modules: `<name>/model.safetensors`).
        optimizers: {name: object with state_dict()} (optimizers, LR schedulers, grad scalers).
        generators: {name: torch.Generator} whose states are saved with the global RNGs.
        state: JSON-able trainer state (data position, config, ...); must not contain "step".
        keep_last: how many checkpoints with step <= `step` to keep (the new one included);
            older ones are deleted after the new one is complete. None keeps all. Checkpoints
            with a larger step (from a run resumed at an earlier step) are left alone.
    Returns:
        the checkpoint directory, on every rank.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    models = models or {}
    optimizers = optimizers or {}
    generators = generators or {}
    state = dict(state or {})
    if "step" in state:
        raise ValueError(
            f"state must not contain 'step' (it is stored from `step`): {state['step']!r}"
        )
    for name in list(models) + list(optimizers):
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"checkpoint entry names must be plain file names, got {name!r}")
    try:
        state_json = json.dumps({"step": step, **state}, indent=2, sort_keys=True)
    except TypeError as e:
        raise ValueError(f"state must be JSON-serialisable: {e}") from e

    # Collected before any writing, so the saved streams are exactly where the training loop is.
    rng_states = dist.all_gather_object(_rng_state(generators))
    final = checkpoint_dir(run_dir, step)
    error = None
    if dist.is_main():
        try:
            _write(final, models, optimizers, rng_states, state_json, keep_last)
        except BaseException as e:
            if dist.world_size() > 1:
                dist.broadcast_object(f"{type(e).__name__}: {e}")
            raise
    # Doubles as the barrier: the other ranks return only once the checkpoint is complete, and
    # fail instead of hanging when the main rank's write failed.
    error = dist.broadcast_object(error)
    if error is not None:
        raise RuntimeError(f"saving checkpoint {final} failed on the main rank: {error}")
    return final


def _write(
    final: Path,
    models: dict[str, tuple[Any, Any]],
    optimizers: dict[str, Any],
    rng_states: list[dict[str, Any]],
    state_json: str,
    keep_last: int | None,
) -> None:
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{_TMP_PREFIX}*"):  # left by a save that crashed
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    tmp = root / f"{_TMP_PREFIX}{final.name}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        for name, entry in models.items():
            model, tokenizer = entry if isinstance(entry, tuple) else (entry, None)
            _save_model(_unwrap(model), tokenizer, tmp / name)
            _fault_point(name, final)
        torch.save({k: o.state_dict() for k, o in optimizers.items()}, tmp / "optimizers.pt")
        torch.save({"world_size": len(rng_states), "ranks": rng_states}, tmp / "rng.pt")
        # Written last: a directory with trainer_state.json is a complete checkpoint.
        (tmp / "trainer_state.json").write_text(state_json + "\n")
        _fsync_tree(tmp)
        _fault_point("state", final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    if final.exists():  # re-saving a step, e.g. after resuming from an earlier checkpoint
        old = root / f"{_TMP_PREFIX}old-{final.name}-{uuid.uuid4().hex}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    _fsync_dir(root)
    _fault_point("renamed", final)
    _write_latest(root, final.name)
    _fault_point("latest", final)

    if keep_last is not None:
        step = _step_of(final)
        done = sorted((s, p) for p in root.iterdir() if _complete(p) and (s := _step_of(p)) <= step)
        for _, p in done[:-keep_last]:
            shutil.rmtree(p)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of the run, or None.

    Follows `checkpoints/latest`; if that file is missing or names something that is not a
    complete checkpoint, falls back to the complete `step_*` dir with the largest step.
    Temp dirs of unfinished saves are never returned.
    """
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return None
    pointer = root / LATEST
    if pointer.is_file():
        target = root / pointer.read_text().strip()
        if target.parent == root and _complete(target):
            return target
    done = [p for p in root.iterdir() if _complete(p)]
    return max(done, key=_step_of) if done else None


def load_checkpoint(
    path: Path,
    *,
    models: dict[str, Any] | None = None,
    optimizers: dict[str, Any] | None = None,
    generators: dict[str, torch.Generator] | None = None,
) -> dict:
    """Restore a checkpoint in place and return its trainer state; all ranks call this.

    Args:
        path: a checkpoint directory (e.g. from `latest_checkpoint`).
        models: {name: module} (or {name: (module, tokenizer)}, as given to save); weights are
            copied into the existing modules.
        optimizers: {name: object with load_state_dict()}; every name must be in the checkpoint.
        generators: {name: torch.Generator} to restore; the global python, numpy, torch and CUDA
            RNGs are always restored.
    Returns:
        the trainer state dict, with "step".
    """
    path = Path(path)
    if not _complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint directory")
    models = models or {}
    optimizers = optimizers or {}
    generators = generators or {}

    for name, model in models.items():
        model_dir = path / name
        if not model_dir.is_dir():
            raise ValueError(f"model {name!r} is not in checkpoint {path}")
        _load_weights(_unwrap(model), model_dir)

    if optimizers:
        saved = torch.load(path / "optimizers.pt", map_location="cpu", weights_only=True)
        missing = sorted(set(optimizers) - set(saved))
        if missing:
            raise ValueError(
                f"optimizers {missing} are not in checkpoint {path} (has {sorted(saved)})"
            )
        for name, opt in optimizers.items():
            opt.load_state_dict(saved[name])

    rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
    r = dist.rank()
    if r >= rng["world_size"] or dist.world_size() != rng["world_size"]:
        warnings.warn(
            f"checkpoint was saved with world size {rng['world_size']}, now {dist.world_size()}; "
            "ranks beyond the saved ones reuse rank 0's RNG state",
            stacklevel=2,
        )
    _set_rng_state(rng["ranks"][r if r < rng["world_size"] else 0], generators)

    return json.loads((path / "trainer_state.json").read_text())
