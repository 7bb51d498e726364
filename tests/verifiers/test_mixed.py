"""MixedVerifier: one run, math and code rows, each graded by its own task's verifier, at once."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

from primekit.config import VerifierConfig
from primekit.data.files import load_problems
from primekit.data.problem import Problem
from primekit.verifiers import build_verifier, verdict_stats
from primekit.verifiers.mixed import MixedVerifier, mean_by_task
from primekit.verifiers.sandbox import namespaces_available

EURUS_SAMPLE = Path(__file__).resolve().parents[1] / "data" / "eurus2_rl_sample.jsonl"


def _py(code: str) -> str:
    return f"Here it is.\n```python\n{code}```\n"


# Answers to the six rows of the sample, in order: (response, expected score).
RIGHT = [
    ("7 * 8 = 56, so the answer is \\boxed{56}.", 1.0),
    ("Divide by 2: \\boxed{\\dfrac{3}{4}}", 1.0),
    ("x = \\pm 3; positive: \\boxed{3}", 1.0),
    (_py("a, b = map(int, input().split())\nprint(a + b)\n"), 1.0),
    (_py("input()\nprint(max(map(int, input().split())))\n"), 1.0),
    (_py("def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n"), 1.0),
]
WRONG = [
    ("\\boxed{54}", 0.0),
    ("\\boxed{0.75}", 1.0),  # the same number in another form is right
    ("no idea", 0.0),
    # |a| + |b|: right for "1 2" and "0 0", wrong for "10 -3" -> 2/3 of the tests
    (_py("a, b = map(int, input().split())\nprint(abs(a) + abs(b))\n"), 2 / 3),
    # prints the last number: right only for the one-number case "-4" -> 1/3
    (_py("input()\nprint(input().split()[-1])\n"), 1 / 3),
    # returns the string unchanged: right only for the one-word "x" -> 1/3
    (_py("def reverse_words(s):\n    return s\n"), 1 / 3),
]


@pytest.fixture(scope="module")
def mixed():
    verifier = build_verifier("mixed", VerifierConfig(math_timeout_s=10.0, code_timeout_s=10.0))
    yield verifier
    verifier.close()


@pytest.mark.skipif(not namespaces_available(), reason="grades code in the namespace sandbox")
@pytest.mark.parametrize("answers", [RIGHT, WRONG], ids=["right", "wrong"])
def test_the_papers_data_format_loads_and_grades_end_to_end(mixed, answers):
    problems = load_problems(EURUS_SAMPLE)
    verdicts = mixed.verify_batch([r for r, _ in answers], problems)
    assert [v.score for v in verdicts] == pytest.approx([s for _, s in answers])
    assert verdict_stats(verdicts)["verify/error_rate"] == 0.0
    # soft labels for the PRM: code scores are the fraction of tests passed
    assert mean_by_task(problems, [v.score for v in verdicts]) == pytest.approx({
        "code": sum(s for _, s in answers[3:]) / 3, "math": sum(s for _, s in answers[:3]) / 3})


def test_each_row_goes_to_its_own_tasks_verifier_and_unknown_tasks_are_errors():
    seen: dict[str, list[str]] = {}

    class Recorder:
        def __init__(self, task):
            self.task = task

        def verify_batch(self, responses, problems):
            seen.setdefault(self.task, []).extend(p.id for p in problems)
            from primekit.verifiers.base import Verdict

            return [Verdict.correct()] * len(problems)

    def build(task):
        if task == "poetry":
            raise ValueError("unknown task 'poetry'")
        return Recorder(task)

    problems = [Problem(id=str(i), prompt="", task=t)
                for i, t in enumerate(["math", "code", "math", "poetry", "code"])]
    verdicts = MixedVerifier(build).verify_batch(["r"] * 5, problems)
    assert seen == {"math": ["0", "2"], "code": ["1", "4"]}
    assert [v.status for v in verdicts] == ["correct", "correct", "correct", "error", "correct"]
    assert "no verifier for task 'poetry'" in verdicts[3].reason
    with pytest.raises(ValueError, match="equal length"):
        MixedVerifier(build).verify_batch(["r"], [])


def test_mean_by_task_hand():
    problems = [Problem(id=str(i), prompt="", task=t) for i, t in
                enumerate(["math", "code", "math", "code", "code"])]
    # math: (1 + 0) / 2 = 0.5; code: (2/3 + 1/3 + 1) / 3 = 2/3
    assert mean_by_task(problems, [1.0, 2 / 3, 0.0, 1 / 3, 1.0]) == pytest.approx(
        {"code": 2 / 3, "math": 0.5})
    assert list(mean_by_task(problems, [0.0] * 5)) == ["code", "math"]
    with pytest.raises(ValueError, match="5 problems but 1 scores"):
        mean_by_task(problems, [1.0])


def test_mixed_verifier_pickles_without_its_workers(mixed):
    mixed.verify("\\boxed{1}", Problem(id="p", prompt="", task="math", answer="1"))
    clone = pickle.loads(pickle.dumps(mixed))
    assert clone._verifiers == {}
    with clone:
        clone.warm_up()  # nothing built yet: a no-op
        # (an arithmetic problem: rebuilding works without paying a math pool's start-up here)
        problem = Problem(id="p", prompt="3+4=", task="arithmetic", answer="7")
        assert clone.verify("3+4=7\nA:7", problem).score == 1.0
        assert list(clone._verifiers) == ["arithmetic"]


@pytest.mark.skipif(not namespaces_available(), reason="grades code in the namespace sandbox")
def test_a_slow_code_item_does_not_hold_up_math_items(mixed):
    # One code response that takes 2 s, next to 16 math responses. The math group runs on its
    # own workers at the same time, so it is done long before the code item; the batch takes
    # about as long as the code item alone, not code + math.
    finished: dict[str, float] = {}
    # The module's verifiers (2 math workers, 2 sandboxes): their start-up is shared, and not
    # what this test measures.
    math_v, code_v = mixed.verifier("math"), mixed.verifier("code")
    assert (math_v.workers, code_v.max_workers) == (2, 2)

    class Timed:
        def __init__(self, task, inner):
            self.task, self.inner = task, inner

        def verify_batch(self, responses, problems):
            out = self.inner.verify_batch(responses, problems)
            finished[self.task] = time.monotonic()
            return out

    timed = MixedVerifier({"math": Timed("math", math_v), "code": Timed("code", code_v)}.get)
    math_v.warm_up()
    slow = _py("import time\ntime.sleep(2)\ndef add(a, b):\n    return a + b\n")
    responses = [slow] + [f"\\boxed{{{i}}}" for i in range(16)]
    problems = [Problem(id="c", prompt="", task="code", tests=["assert add(1, 2) == 3"])] + [
        Problem(id=f"m{i}", prompt="", task="math", answer=str(i)) for i in range(16)]
    t0 = time.monotonic()
    verdicts = timed.verify_batch(responses, problems)
    total = time.monotonic() - t0
    assert [v.score for v in verdicts] == [1.0] * 17
    math_s, code_s = finished["math"] - t0, finished["code"] - t0
    print(f"math done at {math_s:.2f} s, code at {code_s:.2f} s, batch {total:.2f} s")
    assert code_s >= 2.0
    # The bound: math never waits for the code item. (Graded one group after the other, code
    # first, math would finish after 2 s.)
    assert math_s < 1.0
    assert total < code_s + 0.5
