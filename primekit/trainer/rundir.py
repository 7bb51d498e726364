"""The run directory is owned by one training process, holds one run, and resumes only the same
experiment.

`owned(cfg, resume=..., overwrite=...)` wraps a training run (the CLI's `primekit train`):

- a lock file `run_dir/.lock` (an exclusive `flock`, released by the kernel when the process
  dies, so a crashed run never leaves a stale lock) holds the owner's PID and host; a second
  writer is refused with one line naming them;
- a fresh run (no `--resume`) in a directory that already holds a run is refused unless
  `--overwrite` is given, which empties the directory first;
- `--resume` compares the run's config with the one stored in the latest checkpoint: a change to
  a field that changes the experiment is refused with the list of changes; the fields in
  `MAY_CHANGE` may change and each change is printed.

Every refusal is a `ConfigError` (exit status 2) raised before any model is loaded. Write errors
of the run itself (a full disk, a read-only directory) go through `write_errors`, which turns
them into one `RunDirError` line naming the path and the cause.

`owned_output(out_dir, field)` is the same for the commands whose one output directory is
written at the end and holds nothing to resume (`primekit sft`, `train-orm`, `train-prm`): the
lock (beside the directory, which is replaced whole) and `write_errors`. `lock` on its own is
the demo's hold on its `--run-dir`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from primekit import distributed as dist
from primekit.config import Config, ConfigError
from primekit.logging import console
from primekit.trainer import checkpoint as ckpt
from primekit.trainer.control import CONTROL

LOCK = ".lock"

# The config sections that define an RL experiment: `--resume` compares only these. The others
# (sft, orm, step_prm, hack_check, sim, viz: other commands' settings; parallel: memory
# switches) may change, and so may any section added later until it is listed here.
EXPERIMENT = ("model", "data", "rollout", "filter", "prm", "algorithm", "explicit", "policy",
              "critic", "verifier", "train", "eval", "live")

# Fields of those sections a resumed run may change: how long it runs, how often it evaluates,
# saves and logs, where and with how many threads or workers. Batch splitting into micro-batches
# may change too (a resume that changes one is exact only up to float rounding).
MAY_CHANGE = (
    "train.steps", "train.eval_every", "train.save_every", "train.keep_checkpoints",
    "train.report_to", "train.threads", "train.device", "train.run_dir", "train.on_nonfinite",
    "eval.", "verifier.math_workers", "verifier.code_workers", "rollout.micro_batch_size",
    "policy.micro_batch_size", "prm.micro_batch_size", "policy.max_tokens_per_micro_batch",
    "prm.max_tokens_per_micro_batch", "policy.packing", "prm.packing", "sft.", "orm.", "step_prm.",
    "hack_check.",
)


class RunDirError(RuntimeError):
    """Writing the run directory failed (disk full, read-only, permission); one line."""


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(refused, allowed): "field old -> new" for each field that differs between two
    `Config.to_dict()` mappings (JSON round-tripped). Fields only one side has (a config written
    by another primekit version) are not compared."""
    old, new = _flatten(saved), _flatten(json.loads(json.dumps(current)))
    refused, allowed = [], []
    for key in sorted(set(old) & set(new)):
        if old[key] != new[key]:
            change = f"{key} {old[key]!r} -> {new[key]!r}"
            free = key.startswith(MAY_CHANGE) or key.split(".")[0] not in EXPERIMENT
            (allowed if free else refused).append(change)
    return refused, allowed


def check_resume(cfg: Config, anyway: bool = False) -> Path:
    """The checkpoint `--resume` will load; refuses a config that changes the experiment."""
    run_dir = Path(cfg.train.run_dir)
    try:  # checksums verified; a damaged newest checkpoint falls back with a warning
        path = ckpt.intact_checkpoint(run_dir)
    except ckpt.CheckpointDamaged as e:
        raise ConfigError(f"--resume: {e}") from None
    if path is None:
        raise ConfigError(f"--resume: no complete checkpoint under {str(run_dir)!r}")
    try:
        state = ckpt.read_state(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume: cannot read {path / 'trainer_state.json'}: {e}") from None
    saved = state.get("config")
    if state.get("step", 0) > cfg.train.steps:
        raise ConfigError(
            f"train.steps: {cfg.train.steps}, but the checkpoint {path} is already at step "
            f"{state['step']}; resume with train.steps >= {state['step']} (or export that "
            f"checkpoint: primekit export {run_dir})")
    if saved is None:
        console.print(f"[yellow]resume: {path} stores no config; not compared[/]")
        return path
    refused, allowed = config_changes(saved, cfg.to_dict())
    if refused:
        raise ConfigError(
            f"--resume: {path} was trained with a different experiment: {'; '.join(refused)}. "
            f"Resume with the checkpoint's values, or start a new run in another train.run_dir")
    for change in allowed:
        console.print(f"resume: {change}")
    if "inputs" in state:  # the model and data files the run started from
        changed = input_changes(state["inputs"], input_fingerprint(cfg), cfg)
        if changed and not anyway:
            raise ConfigError(
                f"--resume: the files {path} was trained from changed since: "
                f"{'; '.join(changed)}. Restore them, start a new run, or continue with these "
                f"files anyway with --resume-anyway")
        for change in changed:
            console.print(f"[yellow]resume (--resume-anyway): {change}[/]")
    return path


def _contents(run_dir: Path) -> list[Path]:
    # The live page's control file may be written before the run starts (trainer/control.py).
    keep = (LOCK, CONTROL)
    return sorted(p for p in run_dir.iterdir() if p.name not in keep) if run_dir.is_dir() else []


# What `primekit train` (and `primekit export`'s default --out) writes in a run directory, and
# the temp files of its atomic rewrites: `--overwrite` empties only a directory holding these.
RUN_FILES = ("checkpoints", "final", "export", "metrics.jsonl", "samples.jsonl", "tensorboard",
             "wandb", LOCK, CONTROL)
# What a model output directory (`models.hf.save_model`, plus the reward models' reports) holds:
# `sft`, `train-orm` and `train-prm` replace only a directory holding these.
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
               "*.bin", "tokenizer*", "special_tokens_map.json", "vocab.json", "merges.txt",
               "added_tokens.json", "chat_template.jinja", "train_metrics.json", "labels_*.jsonl")


def _names(paths: list[Path]) -> str:
    return ", ".join(p.name + ("/" if p.is_dir() else "") for p in paths[:4]) + (
        f" and {len(paths) - 4} more" if len(paths) > 4 else "")


def _is_run_file(name: str) -> bool:
    return name in RUN_FILES or (name.startswith(("metrics.jsonl", "samples.jsonl"))
                                 and name.endswith(".tmp")) or name.startswith(".final")


def check_fresh(cfg: Config, overwrite: bool) -> None:
    """A fresh run needs an empty run directory; with `overwrite`, one holding only a training
    run (`RUN_FILES`), which `empty_for_overwrite` empties once everything else has been checked.
    Deletes nothing."""
    run_dir = Path(cfg.train.run_dir)
    contents = _contents(run_dir)
    if not contents:
        return
    if not overwrite:
        raise ConfigError(
            f"train.run_dir: {str(run_dir)!r} already holds a run ({_names(contents)}); "
            f"continue it with --resume, or discard it with --overwrite")
    foreign = [p for p in contents if not _is_run_file(p.name)]
    if foreign:
        raise ConfigError(
            f"--overwrite: train.run_dir {str(run_dir)!r} holds files primekit train does not "
            f"write ({_names(foreign)}); it is not a training run, so nothing was deleted: "
            f"choose another train.run_dir, or move those files away yourself")


def empty_for_overwrite(cfg: Config) -> None:
    """`--overwrite`: empty the run directory (checked by `check_fresh`), on the main rank. The
    caller does this only after the config, data and models have been validated and loaded, so
    a bad input never costs the earlier run. A SIGINT/SIGTERM that arrived before this keeps it
    too (`signals.Stopped`, nothing deleted)."""
    from primekit.trainer import signals

    if signals.requested():
        raise signals.Stopped(signals.requested(), 0, None)
    run_dir = Path(cfg.train.run_dir)
    if not dist.is_main():
        return
    contents = _contents(run_dir)
    for p in contents:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    if contents:
        console.print(f"--overwrite: emptied {run_dir}")


def check_model_output(out_dir: Path, field: str) -> None:
    """The output directory of `sft`, `train-orm` or `train-prm` is replaced whole at the end:
    refuse one that holds anything but a model (`MODEL_FILES`), e.g. a training run."""
    from fnmatch import fnmatch

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{field}: {str(out_dir)!r} is a file, not a directory")
    if not out_dir.is_dir():
        return
    # (A `.lock` is left by a `primekit train` refused there: not a run.)
    foreign = sorted(p for p in out_dir.iterdir() if p.name != LOCK and (
        p.is_dir() or not any(fnmatch(p.name, m) for m in MODEL_FILES)))
    if foreign:
        what = ("a training run" if any(_is_run_file(p.name) for p in foreign)
                else "files that are not a model")
        raise ConfigError(
            f"{field}: {str(out_dir)!r} holds {what} ({_names(foreign)}), which this command "
            f"would replace with its model; nothing was written: choose another {field}")


def _cause(e: OSError) -> str:
    return e.strerror or os.strerror(e.errno) if e.errno else str(e)


@contextmanager
def lock(target: Path, field: str, lock_file: Path | None = None) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_file` (default `target/.lock`) for the block, with this
    process's PID and host in it; another holder is refused with one `ConfigError` line naming
    `field`, `target` and the holder. `target` (or the lock file's directory) is created."""
    import fcntl

    lock_file = lock_file or target / LOCK
    short = field.split()[-1].rsplit(".", 1)[-1]  # run_dir, out_dir, --run-dir
    made = None if lock_file.parent.exists() else lock_file.parent  # a directory made for the lock
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"{field}: cannot write to {str(target)!r}: {_cause(e)}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(f"{field}: {str(target)!r} is in use by {holder} (lock file "
                              f"{lock_file}); wait for it or use another {short}") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"PID {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
            os.fsync(fd)
        except OSError as e:
            raise ConfigError(f"{field}: cannot write to {str(target)!r}: {_cause(e)}") from None
        yield
    finally:
        # A directory made here that holds nothing but the lock (a command refused before it
        # wrote anything: a bad input, a missing checkpoint) is removed, lock first, while the
        # flock is still held: a process that opened the old lock file is refused, one that
        # opens it after the unlink makes a new one. Any other lock file stays (removing it
        # would race another holder).
        if made is not None:
            with contextlib.suppress(OSError):
                if os.listdir(made) == [lock_file.name]:
                    lock_file.unlink()
                    made.rmdir()
        os.close(fd)  # releases the flock


def output_lock_file(out_dir: Path) -> Path:
    """The lock of an output directory that is replaced whole (`models.hf.save_model` renames
    a new copy into place): beside it, `.<name>.lock`, since a lock inside would be renamed
    away with the old copy."""
    return out_dir.parent / f".{out_dir.name}.lock"


@contextmanager
def owned_output(out_dir: Path, field: str) -> Iterator[None]:
    """Own the one output directory of a command with nothing to resume (`sft.out_dir`,
    `orm.out_dir`, `step_prm.out_dir`): a second writer is refused (`lock`), and a failed write
    is one `RunDirError` line (`write_errors`). A new run replaces the directory at its end, as
    a whole, so an earlier output needs no `--overwrite`: it stays until the new one is
    complete."""
    out_dir = Path(out_dir)
    check_model_output(out_dir, field)  # before the lock file is made beside it
    with lock(out_dir, field, output_lock_file(out_dir)), \
            write_errors(out_dir.parent, intact=f"{field} {str(out_dir)!r} is as it was",
                         what=field):
        yield


@contextmanager
def owned(cfg: Config, *, resume: bool, overwrite: bool,
          resume_anyway: bool = False) -> Iterator[Path | None]:
    """Own `train.run_dir` for a training run (main rank only; the other ranks only train).

    Yields the checkpoint a resume will load (None for a fresh run)."""
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite: choose one (continue the run, or discard it)")
    if not dist.is_main():
        yield None
        return
    run_dir = Path(cfg.train.run_dir)
    with lock(run_dir, "train.run_dir"):
        path = check_resume(cfg, resume_anyway) if resume else None
        if not resume:
            check_fresh(cfg, overwrite)
        with write_errors(run_dir):
            yield path


# How a full disk shows when the writer gives no errno: torch.save's stream writer, safetensors'
# Rust writer.
_DISK_FULL = ("No space left on device", "StorageFull", "file write failed", "unexpected pos",
              "PytorchStreamWriter failed")
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


@contextmanager
def write_errors(run_dir: Path, intact: str = "the previous checkpoint is intact",
                 what: str = "a checkpoint") -> Iterator[None]:
    """Turn a failed write under `run_dir` into one `RunDirError` line: the path and the cause.

    Checkpoints (and `save_model`'s directories) are written atomically, so the previous one is
    intact whenever this fires; `intact` says so in the message, `what` names what was being
    written."""
    try:
        yield
    except BaseException as e:  # DCP's CheckpointException is not an Exception subclass
        from primekit.trainer import signals

        stop = signals.wrapped_stop(e, f"the write of {what} was abandoned; {intact}")
        if stop is not None:  # a second Ctrl-C inside the writer: a stop, not a failed write
            raise stop from None
        if isinstance(e, OSError):
            if e.errno not in _WRITE_ERRNOS:
                raise
            where = e.filename or run_dir
            raise RunDirError(f"cannot write {where}: {_cause(e)}; {intact}") from None
        text = str(e)
        if isinstance(e, (KeyboardInterrupt, SystemExit, RunDirError)) or not any(
                marker in text for marker in _DISK_FULL):
            raise  # (a RunDirError: already one line, from a nested write_errors)
        free = shutil.disk_usage(run_dir).free if run_dir.exists() else 0
        # The line that says why (DCP wraps the cause in a multi-line report).
        cause = next(line.strip() for line in text.splitlines()
                     if any(marker in line for marker in _DISK_FULL))
        raise RunDirError(f"cannot write {what} under {run_dir}: the write failed with "
                          f"{free} bytes free on its disk ({cause[:120]}); {intact}") from None


def drop_rows_after(path: Path, step: int) -> None:
    """Keep only the rows of a JSONL log (`samples.jsonl`) with "step" <= `step`: a resumed run
    continues from its checkpoint's step, so the dead timeline's later rows go (a partial last
    line too). Atomic (temp file + rename)."""
    path = Path(path)
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
        try:
            if line.endswith("\n") and json.loads(line).get("step", -1) <= step:
                kept.append(line)
        except ValueError:
            continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def _fingerprint_fields(cfg: Config) -> dict[str, str | None]:
    """The files that define a run beyond its config: the initial policy (also the reference
    unless model.ref is set), the reference, PRM, critic and explicit RM, and the data files."""
    m, d = cfg.model, cfg.data
    fields = {"model.policy": m.policy, "model.ref": m.ref, "model.prm": m.prm,
              "model.critic": m.critic, "explicit.model_path": cfg.explicit.model_path}
    if d.source == "file":
        fields.update({"data.train_path": d.train_path, "data.eval_path": d.eval_path})
    return fields


def input_fingerprint(cfg: Config) -> dict[str, dict[str, dict[str, Any]]]:
    """{field: {relative file: {"size", "sha256"}}} of every local file or model directory named
    by `_fingerprint_fields` (hub ids are not local: their id is in the config). Hashing reads
    every byte once (a 7B model's 15 GB take tens of seconds)."""

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for field, where in _fingerprint_fields(cfg).items():
        if where:
            found = tree_fingerprint(Path(where).expanduser())
            if found is not None:
                out[field] = found
    return out


def tree_fingerprint(root: Path) -> dict[str, dict[str, Any]] | None:
    """{relative file: {"size", "sha256"}} of a file or of every file below a directory (hidden
    ones left out); None when `root` does not exist."""
    from primekit.trainer.checkpoint import _sha256

    if root.is_file():
        files = {root.name: root}
    elif root.is_dir():
        files = {str(p.relative_to(root)): p for p in sorted(root.rglob("*"))
                 if p.is_file() and not any(part.startswith(".")
                                            for part in p.relative_to(root).parts)}
    else:
        return None
    return {rel: {"size": p.stat().st_size, "sha256": _sha256(p)} for rel, p in files.items()}


def input_changes(saved: dict[str, dict], current: dict[str, dict], cfg: Config) -> list[str]:
    """What changed in the fingerprinted inputs, by field and file."""
    where = _fingerprint_fields(cfg)
    changes = []
    for field, files in sorted(saved.items()):
        now = current.get(field)
        if now is None:
            changes.append(f"{field} {where.get(field)!r} is gone")
            continue
        diffs = []
        for rel in sorted(set(files) | set(now)):
            old, new = files.get(rel), now.get(rel)
            if old is None or new is None:
                diffs.append(f"{rel} {'added' if old is None else 'removed'}")
            elif old["size"] != new["size"]:
                diffs.append(f"{rel} {old['size']} -> {new['size']} bytes")
            elif old["sha256"] != new["sha256"]:
                diffs.append(f"{rel} content changed (sha256 {old['sha256'][:10]} -> "
                             f"{new['sha256'][:10]})")
        if diffs:
            more = f" and {len(diffs) - 3} more" if len(diffs) > 3 else ""
            changes.append(f"{field} {where.get(field)!r}: {', '.join(diffs[:3])}{more}")
    return changes
