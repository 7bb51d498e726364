"""Problems from local JSONL / parquet files and from Hugging Face datasets.

Row schema (one JSON object per line, or one parquet row):
    prompt    str, required, non-empty
    answer    str (ints and floats are accepted and turned into strings)   } at least one
    tests     list of str, or dict (see Problem.tests)                     }
    id        str or int, optional (default "<file stem>-<row number>"), unique in the file
    solution  str, optional
    task      str, optional (default: the `task` argument, else "code" with tests, "math" without):
              "math", "arithmetic" (an integer answer) or "rgym" (plus field "rgym_dataset") are
              graded against `answer`, "code" by running `tests`; a row its task's verifier
              cannot grade is an error, not a row that would score an error on every response
Other fields are kept in Problem.meta, plus meta["location"] = "<file name> line <n>" (parquet:
"row <n>") unless the row has its own "location" field.

Rows in the schema of the PRIME paper's RL data (Eurus-2-RL-Data) are read too: `prompt` a list of
{"role", "content"} messages (system messages, then one user message), `ability` "math" or
"code", `reward_model` {"ground_truth", "style"}, with the ground truth the final answer (math) or
a JSON string of test cases {"inputs": [...], "outputs": [...]} (code; plus "fn_name" for
function-call tests). The user message becomes the prompt, `ability` the task; the system
message (the paper's action-format instruction) is kept in meta["system_prompt"] and is not
rendered: set `model.system_prompt` to it to train as the paper did.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

from primekit.data.code_tests import normalize_tests
from primekit.data.problem import Problem

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
KNOWN_FIELDS = {"prompt", "answer", "tests", "id", "solution", "task"}
# The tasks a file row may name, each with the field its verifier grades against
# (primekit/verifiers: VERIFIERS, less "mixed", which is a run's choice, not a row's).
FILE_TASKS = {"math": "answer", "arithmetic": "answer", "rgym": "answer", "code": "tests"}
_INTEGER = re.compile(r"[+-]?\d+")


class DatasetError(ValueError):
    """A malformed dataset row; the message names the file, the row and the field."""


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _to_python(value: Any) -> Any:
    # pandas hands parquet list columns over as numpy arrays and scalars as numpy scalars.
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return value.tolist()
    return value


def _to_python_deep(value: Any) -> Any:
    value = _to_python(value)
    if isinstance(value, dict):
        return {k: _to_python_deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_python_deep(v) for v in value]
    return value


EURUS_TASKS = ("math", "code")


def _from_eurus(row: dict, where: str) -> dict:
    """A row of the Eurus-2-RL-Data schema as a row of primekit's own schema."""
    messages = row.get("prompt")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
    ):
        raise DatasetError(f"{where}: field 'prompt' must be a list of {{role, content}} messages")
    roles = [m.get("role") for m in messages]
    if roles.count("user") != 1 or roles[-1] != "user" or set(roles) - {"system", "user"}:
        raise DatasetError(
            f"{where}: field 'prompt' must be system messages then one user message, got roles "
            f"{roles}"
        )
    ability = row.get("ability")
    if ability not in EURUS_TASKS:
        raise DatasetError(f"{where}: field 'ability' must be one of {EURUS_TASKS}, got {ability!r}")
    truth = row["reward_model"].get("ground_truth")
    out = {k: v for k, v in row.items() if k not in ("prompt", "ability", "reward_model")}
    out.update(prompt=messages[-1]["content"], task=ability,
               reward_style=row["reward_model"].get("style"))
    system = "\n\n".join(m["content"] for m in messages[:-1])
    if system:
        out["system_prompt"] = system
    if ability == "math":
        out["answer"] = truth
        return out
    if isinstance(truth, str):
        try:
            truth = json.loads(truth)
        except json.JSONDecodeError as err:
            raise DatasetError(
                f"{where}: field 'reward_model.ground_truth' of a code row must be JSON test "
                f"cases: {err.msg}"
            ) from err
    if not (isinstance(truth, dict) and isinstance(truth.get("inputs"), list)
            and isinstance(truth.get("outputs"), list)):
        raise DatasetError(
            f"{where}: field 'reward_model.ground_truth' of a code row must hold lists 'inputs' "
            f"and 'outputs', got {_type_name(truth)}"
        )
    out["tests"] = truth
    return out


def _row_to_problem(row: Any, where: str, default_id: str, task: str | None) -> Problem:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: a row must be a JSON object, got {_type_name(row)}")
    row = {k: _to_python(v) for k, v in row.items()}
    if isinstance(row.get("reward_model"), dict) and "ability" in row:
        row = _from_eurus(_to_python_deep(row), where)
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        got = "missing" if "prompt" not in row else f"got {_type_name(prompt)}"
        if isinstance(prompt, str):
            got = "got an empty string"
        raise DatasetError(f"{where}: field 'prompt' must be a non-empty string, {got}")
    answer, tests = row.get("answer"), row.get("tests")
    if answer is None and tests is None:
        raise DatasetError(f"{where}: a row needs field 'answer' or field 'tests', it has neither")
    if answer is not None:
        if isinstance(answer, float) and not math.isfinite(answer):
            # json.loads reads NaN and Infinity; as a gold answer "nan" would grade as a string.
            raise DatasetError(f"{where}: field 'answer' must be a finite number or a string, "
                               f"got {answer!r}")
        if isinstance(answer, int | float) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str):
            raise DatasetError(
                f"{where}: field 'answer' must be a string, got {_type_name(answer)}"
            )
    if tests is not None:
        ok = isinstance(tests, dict) or (
            isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)
        )
        if not ok:
            raise DatasetError(
                f"{where}: field 'tests' must be a non-empty list of strings or a dict, "
                f"got {_type_name(tests)}"
            )
        try:  # a form the verifier can run, every test valid Python (data/code_tests.py)
            normalize_tests(tests)
        except ValueError as e:
            raise DatasetError(f"{where}: field 'tests': {e}") from None
    for name in ("solution", "task"):
        if row.get(name) is not None and not isinstance(row[name], str):
            raise DatasetError(
                f"{where}: field '{name}' must be a string, got {_type_name(row[name])}"
            )
    for name in ("prompt", "answer", "solution", "system_prompt"):
        _check_unicode(row.get(name) if name != "answer" else answer, name, where)
    row_id = row.get("id")
    if row_id is None:
        row_id = default_id
    elif isinstance(row_id, int) and not isinstance(row_id, bool):
        row_id = str(row_id)
    elif not isinstance(row_id, str):
        raise DatasetError(f"{where}: field 'id' must be a string or int, got {_type_name(row_id)}")
    row_task = row.get("task") or task or ("code" if tests is not None else "math")
    _check_gradable(row_task, answer, tests, row, where,
                    "the row's" if row.get("task") else "the default")
    return Problem(
        id=row_id,
        prompt=prompt,
        task=row_task,
        answer=answer,
        tests=tests,
        solution=row.get("solution"),
        meta={"location": where, **{k: v for k, v in row.items() if k not in KNOWN_FIELDS}},
    )


def _check_unicode(text: Any, name: str, where: str) -> None:
    """JSON's \\ud800 escapes decode to a lone surrogate, which no tokenizer can encode: refuse
    it here, naming the row, rather than in the middle of a run."""
    if not isinstance(text, str):
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DatasetError(f"{where}: field '{name}' holds {text[e.start]!r} at character "
                           f"{e.start + 1}, a lone surrogate (not valid Unicode text)") from None


def _check_gradable(task: str, answer: str | None, tests: Any, row: dict, where: str,
                    whose: str) -> None:
    """Raise DatasetError unless the verifier of `task` can grade the row: a row no verifier can
    grade would score an error on every response and train on nothing (a run that exits 0)."""
    if task not in FILE_TASKS:
        raise DatasetError(f"{where}: {whose} task {task!r} has no verifier; a row's task must be "
                           f"one of {sorted(FILE_TASKS)}")
    needs = FILE_TASKS[task]
    if needs == "tests" and tests is None:
        raise DatasetError(f"{where}: {whose} task {task!r} is graded by running field 'tests', "
                           "which the row does not have")
    if needs == "answer":
        if answer is None:
            raise DatasetError(f"{where}: {whose} task {task!r} is graded against field "
                               "'answer', which the row does not have")
        if not answer.strip():
            raise DatasetError(f"{where}: field 'answer' is empty: nothing to grade against")
    if task == "arithmetic" and not _INTEGER.fullmatch(answer.strip()):
        raise DatasetError(f"{where}: task 'arithmetic' is graded by exact integer match; field "
                           f"'answer' must be an integer, got {answer!r}")
    if task == "rgym" and not row.get("rgym_dataset"):
        raise DatasetError(f"{where}: task 'rgym' needs field 'rgym_dataset' (the reasoning-gym "
                           "dataset whose scorer grades the row)")


def jsonl_row(raw: bytes, lineno: int, name: str) -> Any:
    """One line of a JSONL file (`name` line `lineno`) as its JSON value, None for a blank line;
    a DatasetError naming the line for anything that is not a JSON value."""
    where = f"{name} line {lineno}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DatasetError(f"{where}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at column "
                           f"{err.start + 1})") from None
    if lineno == 1:
        line = line.removeprefix("\ufeff")  # a byte-order mark some editors write
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise DatasetError(f"{where}: invalid JSON: {err.msg} (column {err.colno})") from None
    except ValueError as err:  # an integer of more than 4300 digits
        raise DatasetError(f"{where}: {str(err).split(';')[0]}") from None
    except RecursionError:
        raise DatasetError(f"{where}: JSON nested too deeply to read") from None


def _read_jsonl(path: Path):
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            row = jsonl_row(raw, lineno, path.name)
            if row is not None:
                yield f"{path.name} line {lineno}", lineno, row


def _read_parquet(path: Path):
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    except ImportError:
        try:
            import pandas as pd
        except ImportError:
            raise DatasetError(
                f"{path.name}: reading parquet needs pyarrow (or pandas); install the data "
                "extra: pip install 'primekit[data]'"
            ) from None
        rows = pd.read_parquet(path).to_dict("records")
    for i, row in enumerate(rows, start=1):
        yield f"{path.name} row {i}", i, row


def load_problems(path: str | Path, *, task: str | None = None) -> list[Problem]:
    """All problems of a local .jsonl/.ndjson or .parquet file, in file order.

    `task` is the default for rows without a "task" field. Raises DatasetError (a ValueError)
    naming the file, line/row and field for a malformed row or invalid JSON, and for an id
    that repeats, invalid UTF-8, a file without rows, and parquet without a reader installed.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        rows = _read_jsonl(path)
    elif suffix in PARQUET_SUFFIXES:
        rows = _read_parquet(path)
    else:
        raise ValueError(
            f"cannot read {str(path)!r}: expected a {JSONL_SUFFIXES + PARQUET_SUFFIXES} file"
        )
    problems, first_seen = [], {}
    for where, number, row in rows:
        problem = _row_to_problem(row, where, f"{path.stem}-{number}", task)
        if problem.id in first_seen:
            raise DatasetError(
                f"{where}: duplicate id {problem.id!r} (first at {first_seen[problem.id]})"
            )
        first_seen[problem.id] = where
        problems.append(problem)
    if not problems:
        raise DatasetError(f"{path.name} has no rows ({str(path)!r} is empty or blank)")
    return problems


def load_hf_problems(
    name: str,
    split: str,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    task: str = "math",
) -> list[Problem]:
    """Problems from a Hugging Face dataset (hub id or local path), via `datasets.load_dataset`.

    prompt_field / answer_field name the columns to read; every other column goes to meta.
    """
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "load_hf_problems needs the `datasets` package; install the data extra: "
            "pip install 'primekit[data]'"
        ) from None
    ds = datasets.load_dataset(name, split=split)
    columns = list(ds.column_names)
    for field in (prompt_field, answer_field):
        if field not in columns:
            raise DatasetError(f"{name} [{split}]: no column {field!r}; columns are {columns}")
    used = {prompt_field, answer_field}
    problems = []
    for i, row in enumerate(ds):
        where = f"{name} [{split}] row {i}"
        # Other columns go to meta; "id" and "solution" columns are used as such; stray
        # "prompt"/"answer"/"task"/"tests" columns (when other fields were chosen) are dropped.
        mapped = {k: v for k, v in row.items() if k not in used and k not in KNOWN_FIELDS}
        mapped.update({k: row[k] for k in ("id", "solution") if k in row and k not in used})
        mapped.update(prompt=row[prompt_field], answer=row[answer_field])
        problems.append(_row_to_problem(mapped, where, f"{name}/{split}/{i}", task))
    return problems


def split_problems(
    problems: list[Problem], heldout_fraction: float, seed: int
) -> tuple[list[Problem], list[Problem]]:
    """Split into (train, heldout) by prompt text: all copies of a prompt land on one side.

    A seeded shuffle of the distinct prompts puts round(heldout_fraction * #prompts) of them in
    heldout. Both lists keep the input order.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must lie in [0, 1), got {heldout_fraction!r}")
    prompts = sorted({p.prompt for p in problems})
    random.Random(seed).shuffle(prompts)
    heldout = set(prompts[: round(heldout_fraction * len(prompts))])
    return [p for p in problems if p.prompt not in heldout], [
        p for p in problems if p.prompt in heldout
    ]
