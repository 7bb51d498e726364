"""MathVerifier: answer extraction, golden verdicts, hard time limits from any thread."""

from __future__ import annotations

import pickle
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primekit.data.problem import Problem
from primekit.verifiers.base import Verdict
from primekit.verifiers.math import MathVerifier, extract_answer, fast_equal

TIMEOUT_S = 1.5


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier(timeout_s=TIMEOUT_S, workers=2)
    v.warm_up()
    yield v
    v.close()


def _p(answer: str) -> Problem:
    return Problem(id="t", prompt="", task="math", answer=answer)


# -- extraction -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("so \\boxed{5}.", "5"),
        ("first \\boxed{1} then \\boxed{2}", "2"),  # the last box wins
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not grouping
        ("\\boxed{3} and a truncated \\boxed{\\frac{1}{", "3"),  # unbalanced last box skipped
        ("\\fbox{7}", "7"),
        ("\\boxed 9 is it", "9"),
        ("The answer is 42.", "42"),
        ("Final answer: $\\frac{3}{4}$.", "\\frac{3}{4}"),
        ("**Answer:** 12", "12"),
        ("the answer is 1. No wait, the answer is 2.", "2"),  # last phrase wins
        ("Answer: 3\nsome trailing text", "3"),  # up to the end of the line
        ("\\boxed{4} and then the answer is 5", "4"),  # a box beats any phrase
        ("I do not know", None),
        ("\\boxed{}", None),
        ("", None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


def test_extract_answer_custom_patterns():
    assert extract_answer("RESULT => 17", patterns=[r"RESULT\s*=>\s*(\S+)"]) == "17"
    assert extract_answer("The answer is 3", patterns=[r"RESULT\s*=>\s*(\S+)"]) is None


def test_patterns_need_one_group():
    with pytest.raises(ValueError, match="capture group"):
        MathVerifier(patterns=[r"answer is \S+"])


@pytest.mark.parametrize(
    ("gold", "answer", "expected"),
    [
        ("1/2", "\\frac{1}{2}", True),  # Fraction(1, 2) both
        ("\\dfrac{3}{4}", "0.75", True),  # 3/4 == 75/100
        ("-\\frac{2}{3}", "-2/3", True),
        ("[1,3)", "\\left[1, 3\\right)", True),  # same string once spacing is gone
        ("5", "5.0", True),
        ("1/3", "0.333333", False),  # not exactly equal: left to math-verify
        ("2", "-2", False),
        ("1/0", "1/0", True),  # identical strings
        ("1/0", "2", False),  # division by zero is not a number
        ("x+1", "1+x", False),  # needs sympy
        ("", "", False),
    ],
)
def test_fast_equal_only_accepts_exact_matches(gold, answer, expected):
    assert fast_equal(gold, answer) is expected


@given(st.fractions(max_denominator=50), st.fractions(max_denominator=50))
def test_fast_equal_agrees_with_exact_arithmetic(x, y):
    def as_text(f):
        return str(f.numerator) if f.denominator == 1 else f"{f.numerator}/{f.denominator}"

    assert fast_equal(as_text(x), as_text(y)) == (x == y)


# -- golden verdicts --------------------------------------------------------------------------

# (response, gold, expected correct?)
GOLDEN = [
    # integers and formatting
    ("\\boxed{5}", "5", True),
    ("\\boxed{-3}", "-3", True),
    ("\\boxed{3}", "-3", False),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{1000}", "1000", True),
    ("\\boxed{1\\,000}", "1000", True),  # thin-space separator (math-verify alone says 1*0)
    ("\\boxed{10.0}", "10", True),
    ("\\boxed{100}", "1000", False),
    ("The answer is 42.", "42", True),
    ("The answer is 43.", "42", False),
    ("Answer: 7", "7", True),
    ("\\boxed{\\$12}", "12", True),  # currency sign
    ("\\boxed{5 \\text{ cm}}", "5", True),  # units in text
    # fractions and decimals
    ("\\boxed{\\frac{1}{2}}", "1/2", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", True),
    ("\\boxed{\\tfrac34}", "3/4", True),
    ("\\boxed{\\frac12}", "\\frac{1}{2}", True),
    ("\\boxed{2/4}", "\\frac{1}{2}", True),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
    ("\\boxed{0.333333}", "\\frac{1}{3}", True),  # agrees to 6 decimals
    ("\\boxed{0.333}", "\\frac{1}{3}", False),  # near miss
    ("\\boxed{3.14}", "3.14159", False),  # near miss
    ("\\boxed{0.25}", "\\frac{1}{4}", True),
    ("\\boxed{-\\frac{2}{3}}", "-2/3", True),
    ("\\boxed{\\frac{2}{3}}", "-2/3", False),  # sign
    # percentages
    ("\\boxed{50\\%}", "50\\%", True),
    ("\\boxed{50}", "50\\%", True),
    ("\\boxed{0.5}", "50\\%", True),
    ("\\boxed{40\\%}", "50\\%", False),
    # radicals, pi, e
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\sqrt{2}/2", True),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
    ("\\boxed{\\sqrt{3}}", "2\\sqrt{2}", False),
    ("\\boxed{2\\pi}", "2\\pi", True),
    ("\\boxed{6.283185}", "2\\pi", True),
    ("\\boxed{\\pi}", "2\\pi", False),
    ("\\boxed{3\\sqrt{3}}", "\\sqrt{27}", True),
    # expressions
    ("\\boxed{(x+1)^2}", "x^2+2x+1", True),
    ("\\boxed{x^2-1}", "x^2+1", False),
    ("\\boxed{2x+3}", "3+2x", True),
    ("\\boxed{2x+3}", "2y+3", False),  # different variable
    ("\\boxed{x = 3}", "3", True),
    ("\\boxed{3}", "x=3", True),
    ("\\boxed{x=4}", "3", False),
    ("\\boxed{\\frac{x}{2}}", "0.5x", True),
    # intervals
    ("\\boxed{[1, 3)}", "[1,3)", True),
    ("\\boxed{(1, 3)}", "[1,3)", False),  # open vs half-open
    ("\\boxed{(-\\infty, 2]}", "(-\\infty,2]", True),
    ("\\boxed{(-\\infty, 2)}", "(-\\infty,2]", False),
    ("\\boxed{[0, 1]}", "[0,1]", True),
    # sets and tuples
    ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}", True),
    ("\\boxed{\\{1, 3\\}}", "\\{1,2\\}", False),
    ("\\boxed{2, 1}", "1, 2", True),
    ("\\boxed{1, 2, 3}", "1, 2", False),
    ("\\boxed{\\infty}", "\\infty", True),
    ("\\boxed{-\\infty}", "\\infty", False),
    # multiple choice and text
    ("\\boxed{\\text{(B)}}", "B", True),
    ("\\boxed{C}", "B", False),
    # extraction decides which number is graded
    ("We get 12, so the answer is 13.", "13", True),
    ("We get 12, so the answer is 13.", "12", False),
    ("\\boxed{2} was wrong; correct is \\boxed{4}", "4", True),
    ("\\boxed{2} was wrong; correct is \\boxed{4}", "2", False),
    ("I think it is 5 but I am not sure", "5", False),  # no final-answer marker
    ("The answer is $\\frac{7}{2}$.", "3.5", True),
    ("Final answer: 3.5", "7/2", True),
    ("Final answer: 3.51", "7/2", False),
]


def test_golden_count():
    assert len(GOLDEN) >= 60
    assert sum(not ok for _, _, ok in GOLDEN) >= 20  # plenty of near misses


def test_golden_verdicts(verifier):
    responses = [r for r, _, _ in GOLDEN]
    verdicts = verifier.verify_batch(responses, [_p(g) for _, g, _ in GOLDEN])
    wrong = [
        (r, g, ok, v)
        for (r, g, ok), v in zip(GOLDEN, verdicts)
        if v.status != ("correct" if ok else "incorrect") or v.score != float(ok)
    ]
    assert wrong == []


def test_missing_answer_and_gold(verifier):
    no_answer, no_gold, bad_type = verifier.verify_batch(
        ["no number here", "\\boxed{1}", 123],  # type: ignore[list-item]
        [_p("1"), Problem(id="g", prompt="", answer=None), _p("1")],
    )
    assert (no_answer.status, no_answer.reason) == ("incorrect", "no final answer found")
    assert no_gold.status == "error" and "gold" in no_gold.reason
    assert bad_type.status == "error"


def test_length_mismatch_is_a_value_error(verifier):
    with pytest.raises(ValueError, match="equal length"):
        verifier.verify_batch(["\\boxed{1}"], [])


# -- time limits --------------------------------------------------------------------------------

# sympy evaluates this power with C big-integer arithmetic that no signal can interrupt.
STUCK = "\\boxed{9^{9^{9^{9}}}}"


def test_stuck_item_times_out_and_others_still_graded(verifier):
    t0 = time.monotonic()
    verdicts = verifier.verify_batch(
        [STUCK, "\\boxed{2}", "\\boxed{3}"], [_p("1"), _p("2"), _p("2")]
    )
    elapsed = time.monotonic() - t0
    assert [v.status for v in verdicts] == ["timeout", "correct", "incorrect"]
    assert elapsed < TIMEOUT_S + 1.0
    # the killed worker was replaced: the pool still grades (once its replacement is up)
    verifier.warm_up()
    assert verifier.verify("\\boxed{6}", _p("6")).status == "correct"


def test_time_limit_holds_off_the_main_thread(verifier):
    box: list = []

    def work():
        t0 = time.monotonic()
        box.append((verifier.verify(STUCK, _p("1")), time.monotonic() - t0))
        # The killed worker's replacement imports sympy first (seconds on a loaded machine); a
        # call made before it is up spends its own limit waiting (tested below), so wait here.
        verifier.warm_up()
        box.append(verifier.verify("\\boxed{\\frac{1}{2}}", _p("0.5")))

    th = threading.Thread(target=work)
    th.start()
    th.join(timeout=TIMEOUT_S + 10)
    (stuck, elapsed), ok = box
    assert stuck.status == "timeout" and elapsed < TIMEOUT_S + 1.0
    assert ok.status == "correct"


def test_concurrent_callers_share_the_pool():
    results: dict[int, str] = {}
    # Three callers, two pooled workers: one caller starts a worker of its own, and a worker's
    # start-up (importing sympy, seconds on a loaded machine) counts against the item waiting
    # for it, so the limit here is generous; this test is about sharing, not time limits.
    verifier = MathVerifier(timeout_s=30.0, workers=2)

    def work(i: int) -> None:
        results[i] = verifier.verify(f"\\boxed{{{i}}}", _p(str(i))).status

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
    finally:
        verifier.close()
    assert results == {i: "correct" for i in range(3)}


def test_verifier_pickles_without_its_processes(verifier):
    clone = pickle.loads(pickle.dumps(verifier))
    assert clone._pool is None and clone.timeout_s == TIMEOUT_S
    clone.warm_up()  # its own fresh workers (start-up would count against a waiting item)
    assert clone.verify("\\boxed{1}", _p("1")).status == "correct"
    clone.close()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.one_of(
        st.text(max_size=200),
        st.builds(
            lambda s: "\\boxed{" + s + "}",
            st.text(alphabet="0123456789^{}\\frac+-*/()[]x.,=", max_size=60),
        ),
        st.sampled_from(
            [
                STUCK,
                "\\boxed{" * 500,
                "}" * 1000 + "\\boxed{1}",
                "\\boxed{\\frac{\\frac{\\frac{1}{2}}{3}}{}}",
                "the answer is " + "9" * 5000,
                "\\boxed{10^{10^{10}}}",
                "\\boxed{\\int_0^\\infty e^{-x^2} dx}",
                "Answer: \x00\ud7ff\U0010ffff",
            ]
        ),
    ),
    st.sampled_from(["1", "\\frac{1}{2}", "x^2+1", "[0, 1)", "\\{1, 2\\}", "50\\%"]),
)
def test_never_raises_never_overruns(verifier, response, gold):
    t0 = time.monotonic()
    verdict = verifier.verify(response, _p(gold))
    assert time.monotonic() - t0 < TIMEOUT_S + 1.0
    assert verdict.status in ("correct", "incorrect", "error", "timeout")
    assert 0.0 <= verdict.score <= 1.0


def _grade_in_child(_: int) -> list[tuple[str, float]]:
    with MathVerifier(timeout_s=1.0, workers=1) as v:
        v.warm_up()  # worker start-up is not part of any item's time limit
        out = []
        for response, gold in ((STUCK, "1"), ("\\boxed{0.5}", "1/2")):
            t0 = time.monotonic()
            out.append((v.verify(response, _p(gold)).status, time.monotonic() - t0))
            # The stuck item's worker was killed and is restarting; a call made before it is ready
            # spends its own time limit waiting (and may time out on a loaded machine), so wait.
            v.warm_up()
        return out


def test_time_limit_holds_inside_a_daemonic_process_pool():
    import multiprocessing

    # multiprocessing.Pool workers are daemonic and may not start multiprocessing children;
    # our workers are plain subprocesses, so grading works there and keeps its deadline.
    with multiprocessing.get_context("fork").Pool(1) as mp_pool:
        (stuck, stuck_s), (ok, _) = mp_pool.map(_grade_in_child, [0], chunksize=1)[0]
    assert stuck == "timeout" and stuck_s < 2.0
    assert ok == "correct"


def test_waiting_for_a_restarting_worker_counts_against_the_limit():
    # After a time-out the worker is killed and replaced; a call made while no worker is ready
    # must still return within its limit (as "timeout" if the new worker is not up in time).
    with MathVerifier(timeout_s=0.2, workers=1) as v:
        v.warm_up()
        assert v.verify(STUCK, _p("1")).status == "timeout"
        t0 = time.monotonic()
        verdict = v.verify("\\boxed{0.5}", _p("1/2"))
        assert time.monotonic() - t0 < 0.2 + 0.5
        assert verdict.status in ("correct", "timeout")


# -- workers that die: no sample is mis-scored --------------------------------------------------


def test_a_worker_that_died_while_idle_costs_no_verdict():
    from primekit.verifiers import verdict_stats

    # A generous limit: the retried item waits for a fresh worker to import sympy (1-2 s here).
    with MathVerifier(timeout_s=20.0, workers=1) as v:
        v.warm_up()
        (idle,) = v.pool._idle
        idle.proc.kill()  # dies between calls, as an OOM kill or an operator's kill would
        idle.proc.wait()
        verdicts = v.verify_batch(["\\boxed{2}", "\\boxed{3}"], [_p("2"), _p("2")])
        # Before: ("error", "could not send item: BrokenPipeError") for the first item.
        assert [(x.status, x.retries) for x in verdicts] == [("correct", 1), ("incorrect", 0)]
        assert verdict_stats(verdicts)["verify/retries"] == 1.0
        assert v.verify("\\boxed{5}", _p("5")) == Verdict.correct()  # retries 0 again


def test_pool_retries_an_item_once_when_its_worker_dies_while_grading(tmp_path):
    from primekit.verifiers.pool import DeadlinePool

    marker = tmp_path / "die-once"
    marker.touch()
    # Target os.system: each item is a shell line run by the worker; `kill -9 $PPID` kills it.
    die_once = f"if [ -e {marker} ]; then rm {marker}; kill -9 $PPID; fi"
    pool = DeadlinePool("os:system", workers=1)
    try:
        out = pool.map([die_once, "kill -9 $PPID", "true"], timeout_s=20.0)
    finally:
        pool.close()
    assert out == [
        ("ok", 0, 1),  # died once; the retry on a fresh worker ran it to the end
        ("error", "worker died twice (exit code -9)", 1),  # dies every time: one retry only
        ("ok", 0, 0),
    ]
