"""outputs.py: the grader-side comparison of what a sandboxed program produced."""

from __future__ import annotations

from primekit.verifiers.outputs import judge, same_return, same_stdout, same_value


def test_same_stdout():
    assert same_stdout("3  \n4\n\n", "3\n4")  # trailing whitespace and blank lines ignored
    assert same_stdout("0.30000000000000004", "0.3")  # |diff| 4e-17 <= 1e-6
    assert same_stdout("1000000.5", "1000000.0")  # relative above 1: 0.5 <= 1e-6 * 1e6 = 1
    assert not same_stdout("1000002.5", "1000000.0")  # 2.5 > 1
    assert not same_stdout("3 4", "3\n5")
    assert not same_stdout("nan", "nan0")  # a non-finite float is never "close"
    assert not same_stdout("", "3")


def test_same_value_is_typed_plain_equality():
    assert same_value([1, {"a": 2.0000001}], [1, {"a": 2}])  # floats within 1e-6 relative
    assert not same_value(True, 1) and not same_value(1, True) and same_value(False, False)
    assert not same_value({"a": 1}, {"a": 1, "b": 2})
    assert not same_value([1, 2], [1, 2, 3])
    assert not same_value("1", 1) and not same_value(None, 0)
    assert same_value(10**30, 10**30) and not same_value(10**30, 10**30 + 1)  # ints exact


def test_same_return_accepts_the_apps_one_element_list():
    assert same_return(3, [3]) and same_return([3], [3]) and same_return([1, 2], [[1, 2]])
    assert not same_return(3, [4]) and not same_return(3, []) and not same_return([3], 3)


def test_judge_turns_ran_into_passed_or_failed_and_keeps_the_rest():
    results = [
        {"status": "ran", "detail": "", "output": "[1, 2]"},
        {"status": "ran", "detail": "", "output": "[2, 1]"},
        {"status": "ran", "detail": "", "output": "not json"},
        {"status": "ran", "detail": "", "output": "[" * 100000},
        {"status": "timeout", "detail": "test exceeded 1s"},
    ]
    assert judge("call", [[1, 2]] * 5, results) == [
        {"status": "passed", "detail": ""},
        {"status": "failed", "detail": "wrong return value"},
        {"status": "failed", "detail": "return value is not JSON"},
        {"status": "failed", "detail": "return value is not JSON"},
        {"status": "timeout", "detail": "test exceeded 1s"},
    ]
    io = judge("io", ["3\n", "4\n"], [{"status": "ran", "output": "3"},
                                      {"status": "ran", "output": "5"}])
    assert [r["status"] for r in io] == ["passed", "failed"]
    assert all("output" not in r for r in io)  # raw outputs are dropped after judging
