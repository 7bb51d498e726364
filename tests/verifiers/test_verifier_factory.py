"""build_verifier picks by task name; verdict_stats summarises a batch."""

from __future__ import annotations

import math

import pytest

from primekit.config import load_config
from primekit.data.problem import Problem
from primekit.verifiers import (
    CodeVerifier,
    MathVerifier,
    Verdict,
    Verifier,
    build_verifier,
    verdict_stats,
)


def test_build_verifier_by_task_with_the_config_limits():
    limits = load_config(None, ["verifier.math_timeout_s=3", "verifier.math_workers=1",
                                "verifier.code_timeout_s=2", "verifier.code_memory_mb=256",
                                "verifier.code_workers=3", "verifier.code_test_timeout_s=0.5"]).verifier
    math = build_verifier("math", limits)
    assert isinstance(math, MathVerifier) and (math.timeout_s, math.workers) == (3.0, 1)
    code = build_verifier("code", limits)
    assert isinstance(code, CodeVerifier)
    assert (code.limits.timeout_s, code.limits.test_timeout_s, code.limits.memory_mb,
            code.max_workers) == (2.0, 0.5, 256, 3)


def test_verifier_defaults_are_the_configs():
    # One home for each limit: the classes and build_verifier without limits use the config's.
    math, code = build_verifier("math"), build_verifier("code")
    assert (math.timeout_s, math.workers) == (5.0, 2) == (MathVerifier().timeout_s,
                                                          MathVerifier().workers)
    assert (code.limits.timeout_s, code.limits.memory_mb, code.max_workers) == (10.0, 1024, 2)
    assert (CodeVerifier().limits.timeout_s, CodeVerifier().max_workers) == (10.0, 2)


def test_build_verifier_arithmetic():
    from primekit.verifiers.arithmetic import ArithmeticVerifier

    verifier = build_verifier("arithmetic")
    assert isinstance(verifier, ArithmeticVerifier)
    problem = Problem(id="p", prompt="3+4=", task="arithmetic", answer="7")
    assert verifier.verify("3+4=7\nA:7", problem) == Verdict.correct()


def test_build_verifier_mixed_builds_each_task_with_the_config_limits():
    from primekit.verifiers.mixed import MixedVerifier

    limits = load_config(None, ["verifier.math_timeout_s=3", "verifier.code_memory_mb=300"]).verifier
    verifier = build_verifier("mixed", limits)
    assert isinstance(verifier, MixedVerifier) and verifier._verifiers == {}  # built on use
    assert verifier.verifier("math").timeout_s == 3.0
    assert verifier.verifier("code").limits.memory_mb == 300
    assert "single task, not 'mixed'" in verifier.verifier("mixed")
    v = verifier.verify("3+4=7\nA:7", Problem(id="p", prompt="3+4=", task="arithmetic", answer="7"))
    assert v == Verdict.correct()
    verifier.close()


def test_unknown_task_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"'poetry'.*\['arithmetic', 'code', 'math', 'mixed', 'rgym'\]"):
        build_verifier("poetry")


def test_verifiers_satisfy_the_protocol():
    def takes(v: Verifier) -> Verifier:
        return v

    for v in (MathVerifier(), CodeVerifier()):
        assert takes(v) is v and callable(v.verify) and callable(v.verify_batch)


def test_verdict_stats_hand_computed():
    verdicts = [
        Verdict.correct(),  # 1.0
        Verdict.incorrect(0.5),  # 0.5
        Verdict.error("boom"),  # 0.0
        Verdict.timeout(score=0.25),  # 0.25
        Verdict.incorrect(),  # 0.0
    ]
    # error 1/5, timeout 1/5, correct 1/5, mean (1 + 0.5 + 0 + 0.25 + 0) / 5 = 0.35
    assert verdict_stats(verdicts) == pytest.approx(
        {
            "verify/error_rate": 0.2,
            "verify/timeout_rate": 0.2,
            "verify/correct_rate": 0.2,
            "verify/mean_score": 0.35,
            "verify/retries": 0.0,
        }
    )
    # retries is a count over the batch: 2 + 1 = 3
    retried = [Verdict(1.0, "correct", retries=2), Verdict(0.0, "incorrect", retries=1)]
    assert verdict_stats(retried)["verify/retries"] == 3.0
    with pytest.raises(ValueError, match="retries"):
        Verdict(1.0, "correct", retries=-1)
    assert math.isnan(verdict_stats([])["verify/mean_score"])  # nothing graded: not a 0 score
    assert verdict_stats([])["verify/retries"] == 0.0
