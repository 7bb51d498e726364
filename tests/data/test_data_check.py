"""`primekit data check FILE`: every format the loaders read, good and bad files, on the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primekit import cli
from primekit.data.check import check_file

EURUS = Path(__file__).parent / "eurus2_rl_sample.jsonl"  # 6 rows: 3 math, 3 code


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": 4},
        {"prompt": "def f(): ...", "tests": ["assert f() is None"]},
        {"prompt": "3*3=", "answer": "9", "task": "arithmetic"}]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()  # only what the command prints (not the fixtures' progress bars)
    rc = cli.main(["data", "check", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_good_jsonl_counts_per_task(tmp_path, capsys):
    rc, out, err = run([str(write_jsonl(tmp_path / "good.jsonl", GOOD))], capsys)
    # 2 math rows (answer, no task), 1 code (tests), 1 arithmetic (its own task)
    assert rc == 0 and err == ""
    assert out.splitlines() == [
        f"{tmp_path / 'good.jsonl'}: JSONL, 4 rows: 4 valid, 0 bad",
        "  valid rows per task: arithmetic 1, code 1, math 2",
        "  valid rows per schema: primekit 4"]


def test_bad_jsonl_names_the_first_bad_row_line_and_field(tmp_path, capsys):
    rows = [GOOD[0], "", {"prompt": "x", "answer": ["2"]}, "{not json", {"prompt": "", "answer": "1"}]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    rc, out, err = run([str(path)], capsys)
    # line 2 is blank (skipped, as the loader does); lines 3, 4 and 5 are bad
    assert rc == 2
    assert out.splitlines()[0] == f"{path}: JSONL, 4 rows: 1 valid, 3 bad"
    assert err == ("primekit: error: first bad row: bad.jsonl line 3: field 'answer' must be a "
                   "string, got list (2 more bad rows)\n")
    report = check_file(path)
    assert (report.rows, report.bad, dict(report.tasks)) == (4, 3, {"math": 1})


def test_rows_no_verifier_can_grade_are_bad_rows(tmp_path, capsys):
    # The helper's walkthrough (2026-12-07): both rows passed `data check`, and training on them
    # scored an error on every response and exited 0.
    rows = [{"prompt": "1+1=", "answer": "2", "task": "physics"},
            {"prompt": "1+2=", "tests": ["assert f(1)==2"], "task": "math"}]
    path = write_jsonl(tmp_path / "task.jsonl", rows)
    rc, out, err = run([str(path)], capsys)
    assert rc == 2
    assert out.splitlines()[0] == f"{path}: JSONL, 2 rows: 0 valid, 2 bad"
    assert err == ("primekit: error: first bad row: task.jsonl line 1: the row's task 'physics' "
                   "has no verifier; a row's task must be one of ['arithmetic', 'code', 'math', "
                   "'rgym'] (1 more bad row)\n")
    # --task code: rows with an answer and no tests have nothing the code verifier can run
    rc, out, err = run([str(write_jsonl(tmp_path / "a.jsonl", GOOD[:2])), "--task", "code"],
                       capsys)
    assert rc == 2 and "a.jsonl line 1: the default task 'code' is graded by running field " \
        "'tests', which the row does not have" in err


def test_rows_that_broke_the_reader_are_bad_rows(tmp_path, capsys):
    # The helper's walkthrough (2026-12-08): each of these was a traceback (exit 1) in `data
    # check` and in training, or (the surrogate, the gold answer) passed the check and failed
    # in the run; a byte-order mark on line 1 was refused.
    lines = [
        '{"prompt": "q", "answer": "1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"prompt": "q", "answer": ' + "9" * 5000 + "}",
        '{"prompt": "q\\ud800x", "answer": "1"}',
        json.dumps({"prompt": "q", "tests": ["assert " + "not " * 5000 + "1"]}),
        json.dumps({"prompt": "q", "answer": "\\boxed{}"}),
    ]
    reasons = [
        "JSON nested too deeply to read",
        "Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits",
        "field 'prompt' holds '\\ud800' at character 2, a lone surrogate (not valid Unicode "
        "text)",
        "field 'tests': test 1 is nested too deeply for Python's compiler: 'assert not not",
        "field 'answer': math-verify cannot parse the gold answer '\\\\boxed{}', so every "
        "response to the row would be graded error",
    ]
    for i, (line, reason) in enumerate(zip(lines, reasons)):
        path = tmp_path / f"r{i}.jsonl"
        path.write_text(line + "\n")
        rc, out, err = run([str(path)], capsys)
        assert rc == 2 and err.startswith(f"primekit: error: first bad row: r{i}.jsonl line 1: "
                                          f"{reason}"), (i, err)
    # the loader refuses the same rows by line, bar the gold answer (parsing every gold answer
    # of a large file is the check's job, not every run's start)
    from primekit.data.files import DatasetError, load_problems

    for i in range(4):
        with pytest.raises(DatasetError, match=f"r{i}.jsonl line 1: "):
            load_problems(tmp_path / f"r{i}.jsonl")
    path = tmp_path / "bom.jsonl"
    path.write_text('{"prompt": "q", "answer": "1"}\n', encoding="utf-8-sig")
    assert run([str(path)], capsys)[0] == 0 and load_problems(path)[0].prompt == "q"


def test_invalid_utf8_json_and_duplicate_ids_are_bad_rows(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"prompt": "a", "answer": "1", "id": 7}\n{"prompt": "\xff"}\n'
                     b'{"prompt": "b", "answer": "2", "id": "7"}\n')
    report = check_file(path)
    assert report.first_bad == "x.jsonl line 2: not valid UTF-8 (byte 0xff at column 13)"
    assert report.bad == 2  # and line 3's id "7" repeats line 1's 7
    path.write_text('{"prompt": "a", "answer": "1", "id": 7}\n{"prompt": "b", "answer": "2", '
                    '"id": "7"}\n')
    assert check_file(path).first_bad == ("x.jsonl line 2: field 'id': duplicate id '7' "
                                          "(first at x.jsonl line 1)")


def test_eurus_schema(tmp_path, capsys):
    rc, out, _ = run([str(EURUS)], capsys)
    assert rc == 0
    assert "  valid rows per task: code 3, math 3" in out.splitlines()
    assert "  valid rows per schema: Eurus-2-RL 6" in out.splitlines()
    rows = [json.loads(line) for line in EURUS.read_text().splitlines()]
    idx = next(i for i, r in enumerate(rows) if r["ability"] == "code")
    rows[idx]["reward_model"]["ground_truth"] = "{not json"  # the first code row's test cases
    rc, out, err = run([str(write_jsonl(tmp_path / "eurus.jsonl", rows))], capsys)
    assert rc == 2
    assert err.startswith(f"primekit: error: first bad row: eurus.jsonl line {idx + 1}: field "
                          "'reward_model.ground_truth' of a code row must be JSON test cases")


def test_parquet(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "1+1=", "answer": "2"},
                                         {"prompt": "2+3=", "answer": "5"}]), good)
    rc, out, _ = run([str(good)], capsys)
    assert rc == 0 and out.splitlines()[0] == f"{good}: parquet, 2 rows: 2 valid, 0 bad"
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "1+1=", "answer": "2"},
                                         {"prompt": None, "answer": "5"}]), bad)
    rc, _, err = run([str(bad)], capsys)
    assert rc == 2 and err == ("primekit: error: first bad row: bad.parquet row 2: field "
                               "'prompt' must be a non-empty string, got null\n")
    notparquet = tmp_path / "text.parquet"
    notparquet.write_text("hello")
    rc, _, err = run([str(notparquet)], capsys)
    assert rc == 2 and err.startswith("primekit: error: text.parquet: cannot read as parquet")
    assert len(err.strip().splitlines()) == 1


def test_saved_hf_dataset(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": "1+1=", "answer": "2"},
                                     {"prompt": "2+3=", "answer": "5"}])
    ds.save_to_disk(str(tmp_path / "one"))
    rc, out, _ = run([str(tmp_path / "one")], capsys)
    assert rc == 0 and out.splitlines()[0] == (
        f"{tmp_path / 'one'}: Hugging Face dataset (save_to_disk), 2 rows: 2 valid, 0 bad")
    bad = datasets.Dataset.from_list([{"prompt": "1+1=", "answer": "2"},
                                      {"prompt": "2+3=", "answer": ""}])
    bad = bad.map(lambda r: {"answer": None} if r["prompt"] == "2+3=" else r)
    datasets.DatasetDict({"train": ds, "test": bad}).save_to_disk(str(tmp_path / "dict"))
    rc, out, err = run([str(tmp_path / "dict")], capsys)
    assert rc == 2 and "4 rows: 3 valid, 1 bad" in out
    assert err == ("primekit: error: first bad row: dict [test] row 2: a row needs field "
                   "'answer' or field 'tests', it has neither\n")


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.jsonl", "dataset file not found"),
    (lambda d: (d / "empty.jsonl").write_text("\n") and d / "empty.jsonl", "has no rows"),
    (lambda d: (d / "x.csv").write_text("a,b\n") and d / "x.csv", "cannot check"),
    (lambda d: d, "is a directory but not a Hugging Face dataset"),
])
def test_unreadable_files_are_one_line(tmp_path, capsys, make, message):
    rc, _, err = run([str(make(tmp_path))], capsys)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
