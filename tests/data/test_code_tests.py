"""Malformed code tests are refused when a data file is loaded, naming file, line and field
(data/code_tests.py via data/files.py); well-formed ones of every format load."""

from __future__ import annotations

import json

import pytest

from primekit.data.files import DatasetError, load_problems

GOOD = [
    {"prompt": "add", "tests": ["assert add(1, 2) == 3"]},
    {"prompt": "echo", "tests": {"inputs": ["1\n"], "outputs": ["1\n"]}},
    {"prompt": "call", "tests": {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}},
    {"prompt": "he", "tests": {"check": "def check(c):\n    assert c(1, 2) == 3\n",
                               "entry_point": "add"}},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_test_format_loads(tmp_path):
    problems = load_problems(_write(tmp_path / "ok.jsonl", GOOD))
    assert [p.task for p in problems] == ["code"] * 4


@pytest.mark.parametrize("tests, message", [
    (["assert add(1, 2) == 3", "assert add(2, 2) =="],
     "test 2 is not valid Python: invalid syntax"),
    ({"check": "def check(c)\n    pass\n", "entry_point": "add"}, "'check' is not valid Python"),
    ({"inputs": [], "outputs": []}, "there are no tests"),
    ({"inputs": ["1"], "outputs": []}, "1 inputs but 0 outputs"),
    ({"fn_name": "a.b", "inputs": [[1]], "outputs": [1]}, "'fn_name' must be a Python identifier"),
    ({"inputs": [1], "outputs": ["1"]}, "stdin/stdout cases must be strings"),
    ({"cases": []}, "unsupported tests format"),
])
def test_malformed_tests_are_refused_at_load_with_file_line_and_field(tmp_path, tests, message):
    path = _write(tmp_path / "rows.jsonl", [GOOD[0], {"prompt": "bad", "tests": tests}])
    with pytest.raises(DatasetError) as err:
        load_problems(path)
    assert str(err.value).startswith("rows.jsonl line 2: field 'tests': "), err.value
    assert message in str(err.value)
