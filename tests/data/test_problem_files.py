"""load_problems / load_hf_problems / split_problems: schema, error messages, hygiene."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest

from primekit.data.files import DatasetError, load_hf_problems, load_problems, split_problems
from primekit.data.problem import Problem


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_load_jsonl_fields_defaults_and_meta(tmp_path):
    path = _write(
        tmp_path / "data.jsonl",
        [
            {"prompt": "1+1=", "answer": "2", "id": "a", "solution": "1+1=2\nA:2", "level": 3},
            {"prompt": "What is 6*7?", "answer": 42},
            "",  # blank lines are skipped, line numbers still count them
            {"prompt": "def f(): ...", "tests": ["assert f() is None"]},
            {"prompt": "echo", "tests": {"inputs": ["x\n"], "outputs": ["x\n"]}, "task": "code"},
        ],
    )
    a, b, c, d = load_problems(path)
    assert (a.id, a.answer, a.solution, a.task) == ("a", "2", "1+1=2\nA:2", "math")
    assert a.meta == {"level": 3, "location": "data.jsonl line 1"}
    assert (b.id, b.answer) == ("data-2", "42")  # int answer becomes a string; id from the line
    assert (c.id, c.task, c.tests) == ("data-4", "code", ["assert f() is None"])
    assert d.tests == {"inputs": ["x\n"], "outputs": ["x\n"]}
    # data.task fills in the task of rows without one: line 4 (tests, no answer) would then be an
    # arithmetic problem with nothing to grade against, which is refused by line.
    with pytest.raises(DatasetError, match="data.jsonl line 4: the default task 'arithmetic' is "
                       "graded against field 'answer', which the row does not have"):
        load_problems(path, task="arithmetic")
    two = _write(tmp_path / "two.jsonl", [{"prompt": "1+1=", "answer": "2"},
                                           {"prompt": "def f(): ...", "tests": ["assert 1"],
                                            "task": "code"}])
    assert [p.task for p in load_problems(two, task="arithmetic")] == ["arithmetic", "code"]


@pytest.mark.parametrize(
    "row, message",
    [
        (
            {"prompt": "p", "answer": [1, 2]},
            "data.jsonl line 3: field 'answer' must be a string, got list",
        ),
        ({"answer": "1"}, "data.jsonl line 3: field 'prompt' must be a non-empty string, missing"),
        (
            {"prompt": "", "answer": "1"},
            "field 'prompt' must be a non-empty string, got an empty string",
        ),
        ({"prompt": 5, "answer": "1"}, "field 'prompt' must be a non-empty string, got int"),
        ({"prompt": "p"}, "data.jsonl line 3: a row needs field 'answer' or field 'tests'"),
        (
            {"prompt": "p", "tests": "assert 1"},
            "field 'tests' must be a non-empty list of strings or a dict, got str",
        ),
        ({"prompt": "p", "tests": [1]}, "field 'tests'"),
        (
            {"prompt": "p", "answer": "1", "id": 1.5},
            "field 'id' must be a string or int, got float",
        ),
        (
            {"prompt": "p", "answer": "1", "solution": 3},
            "field 'solution' must be a string, got int",
        ),
        ({"prompt": "p", "answer": True}, "field 'answer' must be a string, got bool"),
        ([1, 2], "data.jsonl line 3: a row must be a JSON object, got list"),
        # Rows no verifier could grade: every response would score an error, nothing trains.
        (
            {"prompt": "p", "answer": "1", "task": "physics"},
            "data.jsonl line 3: the row's task 'physics' has no verifier; a row's task must be "
            "one of ['arithmetic', 'code', 'math', 'rgym']",
        ),
        (
            {"prompt": "p", "tests": ["assert f(1) == 2"], "task": "math"},
            "line 3: the row's task 'math' is graded against field 'answer', which the row does "
            "not have",
        ),
        (
            {"prompt": "p", "answer": "2", "task": "code"},
            "line 3: the row's task 'code' is graded by running field 'tests', which the row does "
            "not have",
        ),
        ({"prompt": "p", "answer": "  "}, "line 3: field 'answer' is empty: nothing to grade"),
        (
            {"prompt": "p", "answer": "two", "task": "arithmetic"},
            "line 3: task 'arithmetic' is graded by exact integer match; field 'answer' must be "
            "an integer, got 'two'",
        ),
        ({"prompt": "p", "answer": "7", "task": "rgym"}, "line 3: task 'rgym' needs field "
         "'rgym_dataset'"),
        ({"prompt": "p", "answer": "7", "task": "mixed"}, "the row's task 'mixed' has no verifier"),
        ('{"prompt": "p", "answer": ', "data.jsonl line 3: invalid JSON"),
        (
            {"prompt": "p", "answer": "1", "id": "x"},
            "data.jsonl line 3: duplicate id 'x' (first at data.jsonl line 1)",
        ),
    ],
)
def test_malformed_rows_name_file_line_and_field(tmp_path, row, message):
    path = _write(
        tmp_path / "data.jsonl",
        [{"prompt": "ok", "answer": "1", "id": "x"}, {"prompt": "ok2", "answer": "2"}, row],
    )
    with pytest.raises(DatasetError) as err:
        load_problems(path)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)


def test_missing_file_and_unknown_extension(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_problems(tmp_path / "nope.jsonl")
    (tmp_path / "data.csv").write_text("prompt,answer\n")
    with pytest.raises(ValueError, match="data.csv"):
        load_problems(tmp_path / "data.csv")


def test_parquet_without_pyarrow_or_pandas_says_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "data.parquet").write_bytes(b"PAR1")
    # A None entry in sys.modules makes `import` raise ImportError.
    for mod in ("pyarrow", "pyarrow.parquet", "pandas"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(DatasetError,
                       match=r"data.parquet: reading parquet needs pyarrow.*primekit\[data\]"):
        load_problems(tmp_path / "data.parquet")


def test_parquet_through_pandas_like_reader(tmp_path, monkeypatch):
    # Stands in for pandas (not installed here): rows come back with numpy-style list values.
    class Arr(list):
        def tolist(self):
            return list(self)

    class Frame:
        def to_dict(self, orient):
            assert orient == "records"
            return [{"prompt": "p1", "answer": "1"}, {"prompt": "p2", "tests": Arr(["assert 1"])}]

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(
        sys.modules, "pandas", types.SimpleNamespace(read_parquet=lambda path: Frame())
    )
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    a, b = load_problems(tmp_path / "d.parquet")
    assert (a.id, a.meta["location"], b.tests, type(b.tests)) == (
        "d-1",
        "d.parquet row 1",
        ["assert 1"],
        list,
    )


def test_load_hf_problems_with_a_stand_in_datasets_module(monkeypatch):
    class FakeDataset(list):
        column_names = ["question", "final", "source"]

    rows = FakeDataset(
        [
            {"question": "1+2?", "final": "3", "source": "s"},
            {"question": "2+2?", "final": 4, "source": "s"},
        ]
    )
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    a, b = load_hf_problems("org/set", "test", prompt_field="question", answer_field="final")
    assert calls == [("org/set", "test")]
    assert (a.prompt, a.answer, a.task, a.id, a.meta["source"]) == (
        "1+2?",
        "3",
        "math",
        "org/set/test/0",
        "s",
    )
    assert b.answer == "4" and b.meta["location"] == "org/set [test] row 1"
    with pytest.raises(DatasetError, match="no column 'prompt'"):
        load_hf_problems("org/set", "test")


def test_load_hf_problems_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"primekit\[data\]"):
        load_hf_problems("org/set", "train")


def test_split_problems_never_overlaps_by_prompt():
    # 300 distinct prompts, each appearing 3 times under different ids.
    problems = [Problem(id=str(i), prompt=f"q{i % 300}", answer="1") for i in range(900)]
    train, heldout = split_problems(problems, 0.2, seed=0)
    assert len(train) + len(heldout) == 900
    assert {p.prompt for p in train}.isdisjoint({p.prompt for p in heldout})
    assert len({p.prompt for p in heldout}) == 60  # round(0.2 * 300)
    train_ids = {p.id for p in train}
    assert [p.id for p in train] == [p.id for p in problems if p.id in train_ids]  # order kept
    again = split_problems(problems, 0.2, seed=0)
    assert [p.id for p in again[1]] == [p.id for p in heldout]
    assert [p.id for p in split_problems(problems, 0.2, seed=1)[1]] != [p.id for p in heldout]
    assert split_problems(problems, 0.0, seed=0)[1] == []
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_problems(problems, 1.0, seed=0)


# -- the PRIME paper's RL data format (Eurus-2-RL-Data) -----------------------------------------

EURUS_SAMPLE = Path(__file__).with_name("eurus2_rl_sample.jsonl")


def test_eurus_schema_rows_load_as_math_and_code_problems():
    problems = load_problems(EURUS_SAMPLE)
    assert [p.task for p in problems] == ["math"] * 3 + ["code"] * 3
    m, c, f = problems[1], problems[3], problems[5]
    assert (m.prompt, m.answer, m.tests) == ("Write $\\frac{6}{8}$ in lowest terms.",
                                             "\\frac{3}{4}", None)
    assert m.meta["data_source"] == "numina_cn_k12" and m.meta["reward_style"] == "rule"
    assert m.meta["system_prompt"].startswith("Think step by step.")
    assert m.meta["extra_info"] == {"index": 1, "split": "train"}
    assert m.meta["location"] == "eurus2_rl_sample.jsonl line 2"
    # the code ground truth is a JSON string of test cases in the file; parsed here
    assert c.answer is None and c.tests == {"inputs": ["1 2\n", "10 -3\n", "0 0\n"],
                                            "outputs": ["3\n", "7\n", "0\n"]}
    assert f.tests["fn_name"] == "reverse_words" and f.tests["inputs"][0] == ["hello world"]
    # data.task only fills in for rows without a task: it never overrides `ability`
    assert [p.task for p in load_problems(EURUS_SAMPLE, task="math")][3:] == ["code"] * 3


def test_rows_without_a_task_are_code_with_tests_and_math_without(tmp_path):
    path = _write(tmp_path / "mixed.jsonl", [{"prompt": "a", "answer": "1"},
                                             {"prompt": "b", "tests": ["assert True"]}])
    assert [p.task for p in load_problems(path)] == ["math", "code"]


def _eurus(**over):
    row = {"data_source": "x", "ability": "code",
           "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
           "reward_model": {"ground_truth": '{"inputs": ["1"], "outputs": ["1"]}', "style": "rule"}}
    return {**row, **over}


@pytest.mark.parametrize(
    "row, message",
    [
        (_eurus(ability="poetry"), "line 1: field 'ability' must be one of ('math', 'code'), "
                                   "got 'poetry'"),
        (_eurus(reward_model={"ground_truth": "{not json"}),
         "line 1: field 'reward_model.ground_truth' of a code row must be JSON test cases"),
        (_eurus(reward_model={"ground_truth": '{"inputs": 1}'}),
         "must hold lists 'inputs' and 'outputs', got dict"),
        (_eurus(prompt="plain text"), "line 1: field 'prompt' must be a list of {role, content}"),
        (_eurus(prompt=[{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]),
         "system messages then one user message, got roles ['user', 'assistant']"),
        (_eurus(ability="math", reward_model={"ground_truth": None}),
         "line 1: a row needs field 'answer' or field 'tests'"),
    ],
)
def test_eurus_schema_errors_name_the_line_and_field(tmp_path, row, message):
    with pytest.raises(DatasetError, match=re.escape(message)):
        load_problems(_write(tmp_path / "eurus.jsonl", [row]))


@pytest.mark.parametrize("text,message", [
    ('{"prompt": "a", "answer": NaN}\n', "data.jsonl line 1: field 'answer' must be a finite"),
    ('\n{"prompt": "a", "answer": -Infinity}\n', "data.jsonl line 2: field 'answer' must be"),
    ("", "data.jsonl has no rows"),
    ("\n \n\t\n", "data.jsonl has no rows"),
])
def test_non_finite_answers_and_empty_files_are_rejected(tmp_path, text, message):
    (tmp_path / "data.jsonl").write_text(text)
    with pytest.raises(DatasetError, match=message):
        load_problems(tmp_path / "data.jsonl")


def test_invalid_utf8_names_file_line_and_byte(tmp_path):
    (tmp_path / "data.jsonl").write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xc3("}\n')
    with pytest.raises(DatasetError, match=r"data.jsonl line 2: not valid UTF-8 \(byte 0xc3 at "
                                           r"column 13\)"):
        load_problems(tmp_path / "data.jsonl")
