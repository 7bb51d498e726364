"""Grading the reasoning-gym families: the first "A:" line's text, scored by reasoning-gym's own
`score_answer` (chain_sum: compute_decimal_reward), as a Verdict."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed: "
                                            "pip install 'primekit[rgym]'")

from primekit.data.problem import Problem  # noqa: E402
from primekit.verifiers import build_verifier, verdict_stats  # noqa: E402
from primekit.verifiers.rgym import RgymVerifier, extract_answer  # noqa: E402

# A hand-written chain_sum problem, as RgymTask writes it: 4 - 1 - 7 = -4.
PROBLEM = Problem(
    id="hand-0",
    prompt="State the final answer to the following arithmetic problem: 4 - 1 - 7 =",
    task="rgym",
    answer="-4",
    meta={"rgym_dataset": "chain_sum",
          "rgym_metadata": {"source_dataset": "chain_sum", "source_index": 0, "num_terms": 3,
                            "num_digits": 1, "expression": "4 - 1 - 7"}},
)


@pytest.mark.parametrize("response, expected", [
    ("4-1=3\n3-7=-4\nA:-4", "-4"),
    ("A: -4 ", "-4"),
    ("A:-4\nA:4", "-4"),  # the first answer line counts
    ("A:", None),
    ("A:   ", None),
    ("the answer is -4", None),
    (" A:-4", None),  # must start the line
    ("", None),
])
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize("response, status, score", [
    ("4-1=3\n3-7=-4\nA:-4", "correct", 1.0),
    # reasoning-gym compares decimals: a leading "+0" or ".0" is the same number.
    ("A:-4.0", "correct", 1.0),
    # Wrong: an early slip (4-1=2) carries to -5; "-4" is not a substring of "-5": 0.
    ("4-1=2\n2-7=-5\nA:-5", "incorrect", 0.0),
    # reasoning-gym's partial credit: the gold "-4" inside "-45" scores len("-4")/len("-45").
    ("A:-45", "incorrect", 2 / 3),
    ("4-1=3\n3-7=-4", "incorrect", 0.0),  # malformed: no answer line
    ("4-1=3\n3-7=-4\nA:", "incorrect", 0.0),  # malformed: empty answer
    ("A:minus four", "incorrect", 0.0),
])
def test_grades_right_wrong_and_malformed(response, status, score):
    verdict = RgymVerifier().verify(response, PROBLEM)
    assert (verdict.status, verdict.score) == (status, pytest.approx(score))


def test_broken_problems_are_errors_not_wrong_answers():
    v = RgymVerifier()
    no_dataset = Problem(id="a", prompt=PROBLEM.prompt, task="rgym", answer="-4")
    assert v.verify("A:-4", no_dataset).status == "error"
    unknown = Problem(id="b", prompt=PROBLEM.prompt, task="rgym", answer="-4",
                      meta={"rgym_dataset": "no_such_set"})
    verdict = v.verify("A:-4", unknown)
    assert verdict.status == "error" and "no_such_set" in verdict.reason
    no_gold = Problem(id="c", prompt=PROBLEM.prompt, task="rgym", meta=PROBLEM.meta)
    assert v.verify("A:-4", no_gold).status == "error"


def test_factory_batch_and_pickling():
    v = build_verifier("rgym")
    assert isinstance(v, RgymVerifier)
    v.verify("A:-4", PROBLEM)  # builds and caches chain_sum's scorer
    clone = pickle.loads(pickle.dumps(v))  # the cached scorer is rebuilt, not pickled
    verdicts = clone.verify_batch(["A:-4", "A:4", "x"], [PROBLEM] * 3)
    # "A:4": "-4" is not inside "4": 0.
    assert [d.status for d in verdicts] == ["correct", "incorrect", "incorrect"]
    assert verdict_stats(verdicts)["verify/correct_rate"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="equal length"):
        clone.verify_batch(["A:-4"], [])


def test_mixed_files_can_name_the_rgym_task():
    # A file row with "task": "rgym" is graded by reasoning-gym through the mixed verifier.
    mixed = build_verifier("mixed")
    assert mixed.verify_batch(["A:-4", "A:3"], [PROBLEM, PROBLEM])[0].status == "correct"
