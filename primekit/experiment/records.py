"""Run records: what a finished run contributes to a report, kept where it outlives the machine.

A run directory (checkpoints, exported models, samples) stays on the machine that trained it;
reports read only its metrics.jsonl. A *run record* is that metrics.jsonl, gzipped, under one
header line with the run's stored config, the fingerprints of the model and data files it started
from (`rundir.input_fingerprint`), the machine and the primekit commit:

    <records>/<spec name>/<run id>.jsonl.gz
    <records>/models/<path, / as -->/ the models a spec's `prepare` steps made (runs--demo--sft)

With `primekit experiment SPEC --records DIR`, the runner (a) restores a spec's `prepare` models
from `DIR/models/` instead of training them, and saves the ones it trains there; (b) restores, for
every run not yet finished, a record with the same config (`same_run`), the same
`train.steps` and the same input fingerprints, as a run directory holding metrics.jsonl and
`record.json` (the header): finished for the report, never trained again; and (c) records every
finished run of the spec that no record holds yet. The fingerprints are the point: a record
counts only for runs that start from bit-identical models, so runs trained on different machines
(whose float rounding gives different SFT models) are never mixed in one comparison unless they
started from the same files — which restoring the `prepare` models makes them do.

A restored run cannot be continued (it has no checkpoint): a spec that raises `train.steps` past it
trains that run again from the start.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from primekit.config import Config

RECORD = "record.json"  # in a run directory restored from a record: the record's header
MODELS = "models"
FORMAT = 1


# Config fields that say where a run lives and how it was executed, not what it computes or reports.
# The micro-batch layout (padded rows, or packed by a token budget) is how a pass is executed: the
# same losses and gradients up to float rounding (tests/models/test_packing.py), as with the
# number of threads, and RL trains the same in either (docs/experiments/packed-layout.md); so a
# record stays the same run whichever layout a config chooses (the tiny configs pack since
# 2026-12-04, after most records were made).
# The whole `sft` section too: an RL run never reads it (its SFT model is an input file, and the
# record's fingerprint of that file is what ties the run to it), so the tiny configs' SFT
# settings (new on 2026-12-05) leave the records made from the former SFT models in force.
NOT_THE_RUN = ("train.run_dir", "train.threads", "train.report_to", "train.save_every",
               "train.keep_checkpoints", "verifier.math_workers", "verifier.code_workers",
               "policy.max_tokens_per_micro_batch", "policy.packing",
               "prm.max_tokens_per_micro_batch", "prm.packing", "sft.")
# Those of them that change the arithmetic (float rounding, which RL amplifies), not only the
# bookkeeping: a spec whose arms set one of them asks whether it matters (`Spec.strict`).
ROUNDING = ("train.threads", "policy.max_tokens_per_micro_batch", "policy.packing",
            "prm.max_tokens_per_micro_batch", "prm.packing", "sft.max_tokens_per_micro_batch",
            "sft.packing")


def same_run(saved: dict, cfg: Config, strict: tuple[str, ...] = ()) -> bool:
    """Whether a stored config (`trainer_state.json`) describes the run `cfg` asks for: the same
    value in every field, up to `NOT_THE_RUN`. A field the stored config lacks (added to primekit
    after that run) matches only at its default, the behaviour the run had before the field
    existed; a stored field primekit no longer has never matches. `strict` names fields of
    `NOT_THE_RUN` that must match all the same: those a spec's arms vary (`Spec.strict`), where
    how a pass is executed is the question itself."""
    from primekit.trainer.rundir import _flatten

    old, new = _flatten(saved), _flatten(json.loads(json.dumps(cfg.to_dict())))
    if set(old) - set(new):
        return False
    defaults = _flatten(json.loads(json.dumps(Config().to_dict())))
    for k, value in new.items():
        if k.startswith(NOT_THE_RUN) and not k.startswith(strict):
            continue
        if k in old:
            if old[k] != value:
                return False
        elif k not in defaults or defaults[k] != value:
            return False
    return True


def record_path(records: Path, spec_name: str, run_id: str) -> Path:
    return records / spec_name / f"{run_id}.jsonl.gz"


def restored(run_dir: Path) -> dict | None:
    """The header of the record a run directory was restored from, or None (a trained run)."""
    path = run_dir / RECORD
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def _commit() -> str | None:
    """The git commit of the primekit source tree, when it is a checkout (else None)."""
    try:
        out = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def write_record(run_dir: Path, path: Path, header: dict) -> Path:
    """Write `path`: `header` (the run's config, steps, inputs, machine) and the run's
    metrics.jsonl lines (whole JSON lines only), gzipped; atomically (a temp file renamed)."""
    lines = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            json.loads(line)
        except ValueError:  # a line cut by a crash
            continue
        lines.append(line)
    head = {"primekit_record": FORMAT, **header, "commit": _commit(),
            "recorded": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # mtime=0: the same run gives the same bytes (no spurious diff when it is recorded again).
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write((json.dumps(head, sort_keys=True) + "\n").encode())
        f.write(("\n".join(lines) + "\n").encode())
    os.replace(tmp, path)
    return path


def read_header(path: Path) -> dict | None:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            head = json.loads(f.readline())
    except (OSError, ValueError, EOFError):
        return None
    return head if isinstance(head, dict) and head.get("primekit_record") == FORMAT else None


def _logged_keys(path: Path) -> set[str]:
    keys: set[str] = set()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        f.readline()
        for line in f:
            try:
                keys.update(json.loads(line))
            except ValueError:
                continue
    return keys


def find_record(cfg: Config, inputs: dict | None, records: Path,
                needs: frozenset[str] = frozenset(), *, strict: tuple[str, ...] = (),
                spec: str | None = None, only: bool = False) -> Path | None:
    """A record of the run `cfg` asks for: the same config up to how it was executed
    (`same_run`, with `strict`), the same `train.steps`, the same input fingerprints `inputs`
    (None: not checked, for counting only), and every metric in `needs` logged; or None.
    `spec`: that spec's own records first (so a report rebuilt from records reads the runs it
    recorded), then any other spec's; with `only` (a spec with `share: false`) its own alone."""
    if not records.is_dir():
        return None
    own = sorted(records.glob(f"{spec}/*.jsonl.gz")) if spec else []
    others = [] if only else [p for p in sorted(records.glob("*/*.jsonl.gz"))
                              if spec is None or p.parent.name != spec]
    for path in own + others:
        if path.parent.name == MODELS:
            continue
        head = read_header(path)
        if (head is not None and head.get("steps") == cfg.train.steps
                and (inputs is None or head.get("inputs") == inputs)
                and same_run(head.get("config") or {}, cfg, strict)
                and needs <= _logged_keys(path)):
            return path
    return None


def restore(path: Path, run_dir: Path) -> dict:
    """Make `run_dir` the finished run a record holds: its metrics.jsonl and `record.json`."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        head = json.loads(f.readline())
        body = f.read()
    tmp = run_dir.with_name(run_dir.name + ".restoring")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "metrics.jsonl").write_text(body, encoding="utf-8")
    (tmp / RECORD).write_text(json.dumps(head, indent=1, sort_keys=True), encoding="utf-8")
    if run_dir.is_dir():  # nothing trained there (`nothing_trained`): what it holds is kept
        for entry in run_dir.iterdir():
            if entry.name not in (".lock", "metrics.jsonl", RECORD):
                entry.rename(tmp / entry.name)
        shutil.rmtree(run_dir)
    tmp.rename(run_dir)
    return head


def nothing_trained(run_dir: Path) -> bool:
    """No run has trained in `run_dir`: no metrics.jsonl, no checkpoints. It may hold a model that
    a spec's `prepare` step restored from records into it (online-vs-frozen-prm's trained PRM is
    `final/prm` of prime-vs-rloo's PRIME run of seed 0); a record restored there keeps it."""
    return not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()


def model_copy(records: Path, creates: str) -> Path | None:
    """Where a `prepare` step's model is kept under `records`: one directory, its relative path
    joined by "--" (`runs/demo/sft` -> `models/runs--demo--sft`: a nested `runs/` would fall under
    the `runs/` line most ML repositories' .gitignore has). None for an absolute path or one
    leaving the working directory, which name places outside any checkout."""
    p = Path(creates)
    if p.is_absolute() or ".." in p.parts:
        return None
    return records / MODELS / "--".join(p.parts)


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a model directory whole, atomically (a temp directory renamed)."""
    tmp = dst.with_name(dst.name + ".copying")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tmp)
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)
