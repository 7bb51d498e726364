"""Outcome verifiers: every one returns a `Verdict`, never raises, never blocks past its limit.

`build_verifier(task, limits)` picks one by `Problem.task`, with the time, memory and worker limits
of the config's verifier section ("mixed": each problem graded by the verifier of its own task);
`verdict_stats` summarises a batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from primekit.config import VerifierConfig
from primekit.verifiers.base import Verdict, Verifier
from primekit.verifiers.code import CodeVerifier
from primekit.verifiers.math import MathVerifier


def _math(limits: VerifierConfig) -> Verifier:
    return MathVerifier(timeout_s=limits.math_timeout_s, workers=limits.math_workers)


def _code(limits: VerifierConfig) -> Verifier:
    return CodeVerifier(
        timeout_s=limits.code_timeout_s,
        memory_mb=limits.code_memory_mb,
        max_workers=limits.code_workers,
        test_timeout_s=limits.code_test_timeout_s,
    )


def _arithmetic(limits: VerifierConfig) -> Verifier:
    # Lazy: math and code users never need the arithmetic task's module (primekit.data.arithmetic).
    from primekit.verifiers.arithmetic import ArithmeticVerifier

    return ArithmeticVerifier()  # exact match: no time, memory or workers to limit


def _rgym(limits: VerifierConfig) -> Verifier:
    # Lazy like _arithmetic: reasoning-gym is an optional extra, imported at the first grading.
    from primekit.verifiers.rgym import RgymVerifier

    return RgymVerifier()  # reasoning-gym's own scorers: pure Python, no limits to apply


def _one_task(task: str, limits: VerifierConfig) -> Verifier:
    if task == "mixed":
        raise ValueError("a problem's task must be a single task, not 'mixed'")
    return build_verifier(task, limits)


def _mixed(limits: VerifierConfig) -> Verifier:
    # Lazy like _arithmetic; the builder is a partial of module functions so the verifier pickles.
    from primekit.verifiers.mixed import MixedVerifier

    return MixedVerifier(functools.partial(_one_task, limits=limits))


VERIFIERS: dict[str, Callable[[VerifierConfig], Verifier]] = {
    "math": _math,
    "code": _code,
    "arithmetic": _arithmetic,
    "rgym": _rgym,
    "mixed": _mixed,
}


def build_verifier(task: str, limits: VerifierConfig | None = None) -> Verifier:
    """The verifier for `task` ("math", "code", "arithmetic", or "mixed": each problem by the
    verifier of its own `Problem.task`) with the limits of `limits` (the config's verifier
    section; None: its defaults).

    Raises:
        ValueError if `task` is not one of VERIFIERS.
    """
    if task not in VERIFIERS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(VERIFIERS)}")
    return VERIFIERS[task](limits if limits is not None else VerifierConfig())


def verdict_stats(verdicts: Sequence[Verdict]) -> dict[str, float]:
    """Rates of each status and the mean score over a batch (NaN for an empty batch: nothing
    was graded, which a rate of 0 would hide; retries 0).

    Returns:
        {"verify/error_rate", "verify/timeout_rate", "verify/correct_rate", "verify/mean_score",
         "verify/retries"}; retries is a count (items re-sent because their worker died).
    """
    n = len(verdicts)
    if n == 0:
        nan = float("nan")
        return {
            "verify/error_rate": nan,
            "verify/timeout_rate": nan,
            "verify/correct_rate": nan,
            "verify/mean_score": nan,
            "verify/retries": 0.0,
        }
    return {
        "verify/error_rate": sum(v.status == "error" for v in verdicts) / n,
        "verify/timeout_rate": sum(v.status == "timeout" for v in verdicts) / n,
        "verify/correct_rate": sum(v.status == "correct" for v in verdicts) / n,
        "verify/mean_score": sum(v.score for v in verdicts) / n,
        "verify/retries": float(sum(v.retries for v in verdicts)),
    }


__all__ = [
    "VERIFIERS",
    "CodeVerifier",
    "MathVerifier",
    "Verdict",
    "Verifier",
    "build_verifier",
    "verdict_stats",
]
