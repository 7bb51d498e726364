"""`primekit data check FILE`: validate a dataset file the way training reads it, row by row.

Formats: JSONL (.jsonl, .ndjson), parquet (.parquet) and a Hugging Face dataset saved with
`save_to_disk` (a directory; a DatasetDict's splits are checked one after another). Each row is
checked by the loader's own row check (primekit.data.files: primekit's schema, or the Eurus-2-RL
schema of the PRIME paper's data) and ids must be unique, as `load_problems` requires; the CLI
also has math-verify parse each math row's gold answer (`check_file(gold=...)`). Unlike the
loader, the check goes on past a bad row, so it can count them all: it reports the rows, the valid
rows per task and per schema, the number of bad rows and the first bad one (its line or row and
the field). A file with a bad row, or no rows, is a bad file (exit 2).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primekit.data.files import (
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    DatasetError,
    _read_parquet,
    _row_to_problem,
    jsonl_row,
)


@dataclass
class CheckReport:
    path: str
    format: str
    rows: int = 0
    bad: int = 0
    first_bad: str | None = None  # "<where>: <what is wrong>", the loader's message
    tasks: Counter = field(default_factory=Counter)  # valid rows per task
    schemas: Counter = field(default_factory=Counter)  # valid rows per schema

    @property
    def ok(self) -> bool:
        return self.bad == 0 and self.rows > 0

    def lines(self) -> list[str]:
        """The report as printed: counts, then per task and schema."""
        valid = self.rows - self.bad
        out = [f"{self.path}: {self.format}, {self.rows} rows: {valid} valid, {self.bad} bad"]
        if self.tasks:
            out.append("  valid rows per task: " + ", ".join(
                f"{t} {n}" for t, n in sorted(self.tasks.items())))
            out.append("  valid rows per schema: " + ", ".join(
                f"{s} {n}" for s, n in sorted(self.schemas.items())))
        return out


# One row as read: (where, part, default id, row), the row a DatasetError for a line that is not
# a row at all (invalid UTF-8 or JSON). Ids are unique within a part (a file, or one split).
Row = tuple[str, str, str, Any]


def _jsonl_rows(path: Path) -> Iterator[Row]:
    """Like files._read_jsonl, but an unreadable line is reported and the next one read."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                row = jsonl_row(raw, lineno, path.name)
            except DatasetError as err:
                row = err
            if row is not None:
                yield f"{path.name} line {lineno}", "", f"{path.stem}-{lineno}", row


def _hf_disk_rows(path: Path) -> Iterator[Row]:
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{path}: reading a saved Hugging Face dataset needs the `datasets` "
                           "package; install the data extra: pip install 'primekit[data]'") from None
    ds = datasets.load_from_disk(str(path))
    splits = ds.items() if isinstance(ds, datasets.DatasetDict) else [(None, ds)]
    for split, part in splits:
        name = path.name if split is None else f"{path.name} [{split}]"
        for i, row in enumerate(part, start=1):
            yield f"{name} row {i}", split or "", f"{path.name}/{split}/{i}", row


def is_saved_hf_dataset(path: Path) -> bool:
    """A directory written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`."""
    return path.is_dir() and any((path / f).is_file() for f in
                                 ("dataset_info.json", "state.json", "dataset_dict.json"))


def check_file(path: str | Path, *, task: str | None = None,
               gold: Callable[[str], str | None] | None = None) -> CheckReport:
    """Check every row of a dataset file (see the module docstring). `task` is the default for
    rows without one, as `data.task` is for training. `gold` says why a math row's gold answer
    cannot be graded against, or None (the CLI passes math-verify's parser: this layer knows no
    verifier). A file that cannot be read at all raises (FileNotFoundError, or ValueError with
    one line)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file not found: {str(path)!r}")
    suffix = path.suffix.lower()
    if path.is_dir():
        if not is_saved_hf_dataset(path):
            raise DatasetError(f"{str(path)!r} is a directory but not a Hugging Face dataset "
                               "saved with save_to_disk (no dataset_info.json, state.json or "
                               "dataset_dict.json)")
        report, rows = CheckReport(str(path), "Hugging Face dataset (save_to_disk)"), \
            _hf_disk_rows(path)
    elif suffix in JSONL_SUFFIXES:
        report, rows = CheckReport(str(path), "JSONL"), _jsonl_rows(path)
    elif suffix in PARQUET_SUFFIXES:
        try:
            rows = [(w, "", f"{path.stem}-{i}", r) for w, i, r in _read_parquet(path)]
        except DatasetError:
            raise
        except Exception as err:  # noqa: BLE001 - pyarrow's errors: not a parquet file, ...
            raise DatasetError(f"{path.name}: cannot read as parquet: "
                               f"{str(err).splitlines()[0]}") from None
        report = CheckReport(str(path), "parquet")
    else:
        raise DatasetError(f"cannot check {str(path)!r}: expected a "
                           f"{'/'.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)} file or a directory "
                           "saved by datasets' save_to_disk")
    first_seen: dict[tuple[str, str], str] = {}
    for where, part, default_id, row in rows:
        report.rows += 1
        try:
            if isinstance(row, DatasetError):
                raise row
            eurus = isinstance(row, dict) and isinstance(row.get("reward_model"), dict) \
                and "ability" in row
            problem = _row_to_problem(row, where, default_id, task)
            reason = gold(problem.answer) if gold and problem.task == "math" else None
            if reason:
                raise DatasetError(f"{where}: {reason}")
            if (part, problem.id) in first_seen:
                raise DatasetError(f"{where}: field 'id': duplicate id {problem.id!r} (first at "
                                   f"{first_seen[part, problem.id]})")
        except DatasetError as err:
            report.bad += 1
            report.first_bad = report.first_bad or str(err)
            continue
        first_seen[part, problem.id] = where
        report.tasks[problem.task] += 1
        report.schemas["Eurus-2-RL" if eurus else "primekit"] += 1
    return report


def run_check(path: str, *, task: str | None = None,
              gold: Callable[[str], str | None] | None = None) -> int:
    """`primekit data check FILE`: print the report; 0 for a good file, 2 for a bad one (the
    first bad row, or "no rows", on stderr as one line). `gold` as for `check_file`."""
    import sys

    report = check_file(path, task=task, gold=gold)
    print("\n".join(report.lines()))
    if report.first_bad:
        more = (f" ({report.bad - 1} more bad row{'s' if report.bad > 2 else ''})"
                if report.bad > 1 else "")
        print(f"primekit: error: first bad row: {report.first_bad}{more}", file=sys.stderr)
    elif report.rows == 0:
        print(f"primekit: error: {path} has no rows", file=sys.stderr)
    return 0 if report.ok else 2
