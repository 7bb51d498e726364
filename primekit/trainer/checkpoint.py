"""Sharded checkpoints that survive a crash at any moment, exact resume, and HF export.

Layout of one checkpoint, `run_dir/checkpoints/step_{step:06d}/`:
    weights/                 a torch.distributed.checkpoint (DCP) directory holding every
                             model's parameters ({name}.*) and every optimiser's state
                             (optim.{name}.*); each rank writes its own shards, nothing is
                             gathered on one rank
    hf/<name>/               config.json (+ generation config, tokenizer) of each HF model:
                             what `export_checkpoint` needs to rebuild it without the source
    rng.pt                   per-rank RNG states: python `random`, numpy, torch CPU, torch CUDA
                             (when available) and named torch.Generator states
    trainer_state.json       {"step": step, **state}
and `run_dir/checkpoints/latest` holds the name of the newest complete checkpoint.

Resharding: DCP stores each tensor with its global shape and the slices each rank wrote, and
loading reads whatever slices the loading ranks need, so a checkpoint saved by W ranks resumes on
W' ranks (2 -> 1, 1 -> 2, ...); the models may be FSDP2-sharded or plain on either side.

Atomicity: every rank writes into one hidden temp dir next to the final one (its name chosen by
the main rank); after all shards are written and fsync'd, the main rank adds the small files,
renames the temp dir into place (atomic within one filesystem), then replaces `latest`
atomically (temp file + os.replace), and only then prunes old checkpoints. A crash of any rank
before the rename leaves a `.tmp-*` dir that readers ignore and the next save deletes; a crash
after it leaves `latest` on the previous complete checkpoint. `run_dir` must be on storage all
ranks can see.

Call `save_checkpoint` after step `s` has finished, with `state` holding what the trainer needs
to continue at step `s + 1` (data position, config); the RNG streams then continue exactly.
Pickled files are loaded with `weights_only=True`; still, load only checkpoints you trust.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import shutil
import signal
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from primekit import distributed as dist
from primekit.models import hf
from primekit.models.optim import NonFiniteError, nonfinite_weights

CHECKPOINTS = "checkpoints"
LATEST = "latest"
WEIGHTS = "weights"  # the DCP directory inside a checkpoint
HF = "hf"  # per-model HF config and tokenizer files
_PREFIX = "step_"
_TMP_PREFIX = ".tmp-"


# Test hook for the fault-injection suite (tests/trainer/test_reliability_faults.py): with
# PRIMEKIT_FAULT="<phase>@<step>" the process kills itself with SIGKILL at that phase of saving
# that step. Phases: "weights" (every rank's shards written), "<model name>" (that model's HF
# config and tokenizer written), "state" (every file written),
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


# --- model weights and optimiser state (DCP) ------------------------------------------------------


def _weights_state(models: dict[str, torch.nn.Module],
                   optimizers: dict[str, torch.optim.Optimizer]) -> dict[str, Any]:
    """{name: model state dict, "optim.name": optimiser state dict}, keyed by parameter names
    (sharded tensors stay sharded: DCP saves and loads each rank's slices)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state: dict[str, Any] = {name: get_model_state_dict(m) for name, m in models.items()}
    for name, opt in optimizers.items():
        state[f"optim.{name}"] = get_optimizer_state_dict(models[name], opt)
    return state


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns that it assumes a single process whenever no process group is up: that is
    the intent here, so the warning is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _check_names(models: dict, optimizers: dict) -> None:
    for name in list(models) + list(optimizers):
        if not name or "/" in name or "." in name or name.startswith("."):
            raise ValueError(f"checkpoint entry names must be plain names without dots, got {name!r}")
    orphans = sorted(set(optimizers) - set(models))
    if orphans:
        raise ValueError(f"optimizers {orphans} need the model they optimise under the same name")


def _save_hf_files(model: torch.nn.Module, tokenizer: Any, out: Path) -> None:
    """config.json (+ generation config) and the tokenizer of an HF model; no weights."""
    if hasattr(model, "config") and hasattr(model.config, "save_pretrained"):
        out.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(model.config)
        # The model's own class (an FSDP2-sharded module's class is a generated subclass).
        cls = next(c for c in type(model).__mro__ if not c.__name__.startswith("FSDP"))
        config.architectures = [cls.__name__]
        config.save_pretrained(out)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(out)
    if tokenizer is not None:
        out.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(out)


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
    optimizers: dict[str, torch.optim.Optimizer] | None = None,
    generators: dict[str, torch.Generator] | None = None,
    state: dict | None = None,
    keep_last: int | None = 2,
) -> Path:
    """Atomically write the checkpoint of `step` and point `latest` at it; all ranks call this.

    Args:
        run_dir: the run's directory; checkpoints go to `run_dir/checkpoints/`.
        step: the step just finished (>= 0).
        models: {name: (model, tokenizer or None)}, plain or FSDP2-sharded modules; weights go
            to the DCP directory, HF config and tokenizer files to `hf/<name>/`.
        optimizers: {name: optimiser of models[name]}.
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
    models = {k: v if isinstance(v, tuple) else (v, None) for k, v in (models or {}).items()}
    optimizers = optimizers or {}
    generators = generators or {}
    state = dict(state or {})
    if "step" in state:
        raise ValueError(
            f"state must not contain 'step' (it is stored from `step`): {state['step']!r}"
        )
    _check_names(models, optimizers)
    try:
        state_json = json.dumps({"step": step, **state}, indent=2, sort_keys=True)
    except TypeError as e:
        raise ValueError(f"state must be JSON-serialisable: {e}") from e

    # Nothing non-finite is ever saved (a collective: every rank refuses together).
    for name, (model, _) in models.items():
        bad = nonfinite_weights(model)
        if bad is not None:
            raise NonFiniteError(f"step {step}: {name} weight {bad} is not finite; checkpoint "
                                 f"{checkpoint_dir(run_dir, step)} was not written")
    # Collected before any writing, so the saved streams are exactly where the training loop is.
    rng_states = dist.all_gather_object(_rng_state(generators))
    final = checkpoint_dir(run_dir, step)
    root = final.parent
    tmp = None
    if dist.is_main():
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f"{_TMP_PREFIX}*"):  # left by a save that crashed
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        tmp = root / f"{_TMP_PREFIX}{final.name}-{uuid.uuid4().hex}"
        tmp.mkdir()
    tmp = dist.broadcast_object(tmp)
    if models or optimizers:
        # Every rank writes its own shards (a collective; DCP fsyncs its files).
        import torch.distributed.checkpoint as dcp

        weights = _weights_state({k: m for k, (m, _) in models.items()}, optimizers)
        try:
            with _quiet_single_process():
                dcp.save(weights, checkpoint_id=str(tmp / WEIGHTS),
                         no_dist=dist.world_size() == 1)
        except BaseException:  # every rank raises (a collective); the main rank cleans up
            if dist.is_main():
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fault_point("weights", final)
    error = None
    if dist.is_main():
        try:
            _write(tmp, final, models, rng_states, state_json, keep_last)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
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
    tmp: Path,
    final: Path,
    models: dict[str, tuple[Any, Any]],
    rng_states: list[dict[str, Any]],
    state_json: str,
    keep_last: int | None,
) -> None:
    """The main rank's part: small files into `tmp`, fsync, rename to `final`, `latest`, prune."""
    root = final.parent
    for name, (model, tokenizer) in models.items():
        _save_hf_files(model, tokenizer, tmp / HF / name)
        _fault_point(name, final)
    torch.save({"world_size": len(rng_states), "ranks": rng_states}, tmp / "rng.pt")
    _write_checksums(tmp)  # every file so far (all ranks' shards are written)
    # Written last: a directory with trainer_state.json is a complete checkpoint.
    (tmp / "trainer_state.json").write_text(state_json + "\n")
    _fsync_tree(tmp)
    _fault_point("state", final)

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


# --- integrity: a checksum per file, verified on load and export --------------------------------

CHECKSUMS = "checksums.json"  # {relative path: {"size": bytes, "sha256": hex}} of every file
FINAL_EVAL = "final_eval.json"  # the run's final evaluation, added after the checkpoint


class CheckpointDamaged(ValueError):
    """A checkpoint whose files do not match their recorded checksums; one line naming them."""


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_checksums(tmp: Path) -> None:
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    table = {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in files}
    (tmp / CHECKSUMS).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


# Checkpoints this process verified, with the (size, mtime) of every file then: a second
# verification (resume checks, then loads) hashes nothing unless a file changed since.
_VERIFIED: dict[Path, tuple] = {}


def _stat(file: Path) -> tuple[int, int] | None:
    try:
        st = file.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def damage(path: Path) -> str | None:
    """What is wrong with checkpoint `path` ("rng.pt: 812 bytes, 1563 recorded"), or None if
    every file matches its recorded size and SHA-256 (and trainer_state.json parses). A
    checkpoint written before checksums existed is not verified (None)."""
    path = Path(path)
    try:
        json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError) as e:
        return f"trainer_state.json is unreadable ({str(e).splitlines()[0][:80]})"
    table_file = path / CHECKSUMS
    if not table_file.is_file():
        return None
    try:
        table = json.loads(table_file.read_text())
    except (OSError, ValueError) as e:
        return f"{CHECKSUMS} is unreadable ({str(e).splitlines()[0][:80]})"
    stamp = tuple(_stat(path / rel) for rel in sorted(table))
    if _VERIFIED.get(path) == stamp:
        return None
    bad = []
    for rel, want in sorted(table.items()):
        file = path / rel
        try:
            size = file.stat().st_size
        except OSError:
            bad.append(f"{rel} is missing")
            continue
        if size != want["size"]:
            bad.append(f"{rel}: {size} bytes, {want['size']} recorded")
        elif _sha256(file) != want["sha256"]:
            bad.append(f"{rel}: content differs from its recorded SHA-256")
    if bad:
        return "; ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    _VERIFIED[path] = stamp
    return None


def _verified(path: Path) -> None:
    """Raise `CheckpointDamaged` unless checkpoint `path` is intact (checked on the main rank;
    a collective under torchrun)."""
    problem = damage(path) if dist.is_main() else None
    problem = dist.broadcast_object(problem) if dist.world_size() > 1 else problem
    if problem is not None:
        raise CheckpointDamaged(f"checkpoint {path} is damaged: {problem}")


def intact_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of the run whose files match their checksums, or None when
    there is no complete checkpoint. A damaged newer one is skipped with a warning naming the
    damage; if every complete checkpoint is damaged, `CheckpointDamaged` (one line). Not a
    collective (call it on one rank and broadcast)."""
    first = latest_checkpoint(run_dir)
    if first is None:
        return None
    root = Path(run_dir) / CHECKPOINTS
    rest = sorted((p for p in root.iterdir() if _complete(p) and p != first), key=_step_of,
                  reverse=True)
    problems = []
    for path in [first, *rest]:
        problem = damage(path)
        if problem is None:
            for where, what in problems:
                warnings.warn(f"checkpoint {where} is damaged ({what}); using {path.name}, the "
                              f"newest intact checkpoint", stacklevel=2)
            return path
        problems.append((path.name, problem))
    raise CheckpointDamaged(f"no intact checkpoint under {root}: " + "; ".join(
        f"{name}: {what}" for name, what in problems[:3]))


def write_final_eval(path: Path, metrics: dict[str, float]) -> None:
    """Record the run's final evaluation beside checkpoint `path` (atomically); not part of
    the checksummed files."""
    tmp = Path(path) / f"{_TMP_PREFIX}{FINAL_EVAL}"
    tmp.write_text(json.dumps(metrics, sort_keys=True) + "\n")
    os.replace(tmp, Path(path) / FINAL_EVAL)


def read_state(path: Path) -> dict:
    """Checkpoint `path`'s trainer_state.json: {"step", "config", ...} (OSError, ValueError
    when it is missing or does not parse)."""
    return json.loads((Path(path) / "trainer_state.json").read_text())


def read_final_eval(path: Path | None) -> dict[str, float] | None:
    """The final evaluation recorded beside checkpoint `path`, or None."""
    try:
        return json.loads((Path(path) / FINAL_EVAL).read_text()) if path is not None else None
    except (OSError, ValueError):
        return None


def load_checkpoint(
    path: Path,
    *,
    models: dict[str, Any] | None = None,
    optimizers: dict[str, torch.optim.Optimizer] | None = None,
    generators: dict[str, torch.Generator] | None = None,
) -> dict:
    """Restore a checkpoint in place and return its trainer state; all ranks call this.

    The world size and the models' sharding may differ from the saving run's (DCP reshards).

    Args:
        path: a checkpoint directory (e.g. from `latest_checkpoint`).
        models: {name: module} (or {name: (module, tokenizer)}, as given to save); weights are
            copied into the existing modules. Every parameter must be in the checkpoint.
        optimizers: {name: optimiser of models[name]}; every name must be in the checkpoint.
        generators: {name: torch.Generator} to restore; the global python, numpy, torch and CUDA
            RNGs are always restored.
    Returns:
        the trainer state dict, with "step".
    """
    path = Path(path)
    if not _complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint directory")
    _verified(path)
    models = {k: v[0] if isinstance(v, tuple) else v for k, v in (models or {}).items()}
    optimizers = optimizers or {}
    generators = generators or {}
    _check_names(models, optimizers)

    if models:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        saved = dcp.FileSystemReader(str(path / WEIGHTS)).read_metadata().state_dict_metadata
        wanted = list(models) + [f"optim.{k}" for k in optimizers]
        missing = [k for k in wanted if not any(key.startswith(k + ".") for key in saved)]
        if missing:
            raise ValueError(f"models/optimizers {missing} are not in checkpoint {path}")
        weights = _weights_state(models, optimizers)
        for name in models:  # checked before a single tensor is copied
            own = {f"{name}.{k}": tuple(v.shape) for k, v in weights[name].items()}
            theirs = {k: tuple(m.size) for k, m in saved.items()
                      if k.startswith(name + ".") and hasattr(m, "size")}
            if own != theirs:
                diff = (sorted(set(own) ^ set(theirs))
                        or sorted(k for k in own if own[k] != theirs[k]))
                raise ValueError(f"weights of {name!r} in {path} do not match the model: "
                                 f"{diff[:6]}{'...' if len(diff) > 6 else ''}")
        try:
            with _quiet_single_process():
                dcp.load(weights, checkpoint_id=str(path / WEIGHTS),
                         no_dist=dist.world_size() == 1)
        except (Exception, CheckpointException) as e:  # DCP wraps the cause in a long message
            raise ValueError(f"checkpoint {path} does not match the models/optimizers: "
                             f"{str(e).strip().splitlines()[-1][:300]}") from e
        for name, model in models.items():
            set_model_state_dict(model, weights[name])
        for name, opt in optimizers.items():
            set_optimizer_state_dict(models[name], opt, weights[f"optim.{name}"])

    try:
        rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (a damaged file: one line, not torch's traceback)
        raise CheckpointDamaged(f"checkpoint {path}: rng.pt is unreadable: "
                                f"{str(e).strip().splitlines()[0][:200]}") from None
    r = dist.rank()
    if r >= rng["world_size"] or dist.world_size() != rng["world_size"]:
        warnings.warn(
            f"checkpoint was saved with world size {rng['world_size']}, now {dist.world_size()}; "
            "ranks beyond the saved ones reuse rank 0's RNG state",
            stacklevel=2,
        )
    _set_rng_state(rng["ranks"][r if r < rng["world_size"] else 0], generators)

    return read_state(path)


def export_checkpoint(path: Path, out_dir: Path, names: tuple[str, ...] | None = None,
                      dtype: torch.dtype = torch.float32) -> dict[str, Path]:
    """Write each HF model of checkpoint `path` as a plain `save_pretrained` directory.

    Rebuilds every model from `hf/<name>/config.json`, reads its (possibly sharded) weights from
    the DCP directory in this one process, and saves weights, config and tokenizer to
    `out_dir/<name>/`, which `AutoModelForCausalLM.from_pretrained` loads (the critic:
    `AutoModelForTokenClassification`). Run it in a single process (no process group needed).

    Args:
        path: a complete checkpoint directory.
        out_dir: where the `<name>/` directories go (created).
        names: which models (default: every model with an HF config in the checkpoint).
        dtype: dtype of the exported weights.
    Returns:
        {name: exported directory}.
    """
    import torch.distributed.checkpoint as dcp
    import transformers
    from torch.distributed.checkpoint.api import CheckpointException

    path, out_dir = Path(path), Path(out_dir)
    if not _complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint directory")
    problem = damage(path)  # every file against its checksum, before anything is read
    if problem is not None:  # (one process exports: no collective here)
        raise CheckpointDamaged(f"checkpoint {path} is damaged: {problem}")
    available = sorted(p.parent.name for p in (path / HF).glob("*/config.json"))
    names = tuple(available) if names is None else names
    unknown = sorted(set(names) - set(available))
    if unknown:
        raise ValueError(f"{unknown} have no HF config in {path} (exportable: {available})")
    # The run's own model.trust_remote_code reads its configs and tokenizers (hf.py).
    saved = json.loads((path / "trainer_state.json").read_text()).get("config") or {}
    trust = bool(saved.get("model", {}).get("trust_remote_code", False))
    if out_dir.exists():  # replaced whole: only an earlier export of these models
        other = sorted(p.name for p in out_dir.iterdir() if p.name not in names)
        if other or not out_dir.is_dir():
            raise ValueError(f"export: {str(out_dir)!r} holds other files "
                             f"({', '.join(other[:4])}); give an empty or new --out")
    # Atomic: every model is written into a temp directory beside out_dir, renamed into place at
    # the end; a crash, a signal or a full disk leaves out_dir as it was (or absent).
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}{_TMP_PREFIX}{uuid.uuid4().hex[:8]}"
    exported = {}
    try:
        for name in names:
            src = path / HF / name
            config = hf.load_model_config(src, trust_remote_code=trust)
            arch = (getattr(config, "architectures", None) or [None])[0]
            cls = getattr(transformers, arch or "", None)
            if cls is None:
                raise ValueError(f"{src}/config.json names no transformers architecture "
                                 f"({arch!r})")
            with torch.device("cpu"):
                model = cls(config).to(dtype)
            weights = {name: model.state_dict()}
            try:
                with _quiet_single_process():
                    dcp.load(weights, checkpoint_id=str(path / WEIGHTS), no_dist=True)
            except (Exception, CheckpointException) as e:  # the latter is no Exception subclass
                raise CheckpointDamaged(f"checkpoint {path}: the weights of {name!r} cannot be "
                                        f"read: {str(e).strip().splitlines()[-1][:200]}") from None
            model.load_state_dict(weights[name])
            model.tie_weights()
            bad = nonfinite_weights(model, collective=False)  # one process exports
            if bad is not None:
                raise NonFiniteError(f"checkpoint {path}: {name} weight {bad} is not finite; "
                                     f"not exported")
            model.save_pretrained(tmp / name, safe_serialization=True)
            if (src / "tokenizer_config.json").is_file():
                hf.load_tokenizer(src, trust_remote_code=trust).save_pretrained(tmp / name)
            if (src / "generation_config.json").is_file():
                hf.load_generation_config(src).save_pretrained(tmp / name)
            exported[name] = out_dir / name
        _fsync_tree(tmp)
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}{_TMP_PREFIX}old-{uuid.uuid4().hex[:8]}"
            os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.rename(tmp, out_dir)
        _fsync_dir(out_dir.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return exported
