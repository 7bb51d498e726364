"""One verifier for data that mixes tasks: each problem is graded by the verifier of its own task.

The paper's RL data (Eurus-2-RL-Data) mixes math and code rows in one run. `MixedVerifier`
groups a batch by `Problem.task` and runs the groups at the same time, each on its own verifier
with its own workers (math: `verifier.math_workers` grading processes; code:
`verifier.code_workers` sandboxes). So neither task waits in the other's queue: math items are
graded while slow code items run, and a batch takes about as long as its slowest group, not the
sum of the groups. The price is that both pools use the CPUs at once (math_workers +
code_workers processes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from primekit.data.problem import Problem
from primekit.verifiers.base import Verdict, Verifier, check_batch


class MixedVerifier:
    """Grades each (response, problem) with the verifier of `problem.task`, all tasks at once.

    Args:
        build: task name -> its verifier; called once per task, on first use, so a math-only run
            never starts a sandbox and a code-only run never starts math workers. A task it
            rejects (ValueError) scores `error` verdicts naming the task, never an exception.
    """

    def __init__(self, build: Callable[[str], Verifier]) -> None:
        self._build = build
        self._verifiers: dict[str, Verifier | str] = {}  # task -> verifier, or why there is none
        self._lock = threading.Lock()

    def verifier(self, task: str) -> Verifier | str:
        """The verifier of `task` (built on first use), or the reason there is none."""
        with self._lock:
            if task not in self._verifiers:
                try:
                    self._verifiers[task] = self._build(task)
                except ValueError as e:
                    self._verifiers[task] = f"no verifier for task {task!r}: {e}"
            return self._verifiers[task]

    def verify(self, response: str, problem: Problem) -> Verdict:
        return self.verify_batch([response], [problem])[0]

    def verify_batch(self, responses: list[str], problems: list[Problem]) -> list[Verdict]:
        """One Verdict per pair, in order; the tasks' groups are graded concurrently."""
        check_batch(responses, problems)
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(problems):
            groups.setdefault(getattr(p, "task", None) or "", []).append(i)
        verdicts: list[Verdict | None] = [None] * len(problems)

        def grade(task: str) -> None:
            rows = groups[task]
            verifier = self.verifier(task)
            if isinstance(verifier, str):
                out = [Verdict.error(verifier)] * len(rows)
            else:
                out = verifier.verify_batch([responses[i] for i in rows],
                                            [problems[i] for i in rows])
            for i, v in zip(rows, out):
                verdicts[i] = v

        if len(groups) <= 1:
            for task in groups:
                grade(task)
        else:
            with ThreadPoolExecutor(len(groups), thread_name_prefix="pk-mixed-verify") as ex:
                for future in [ex.submit(grade, task) for task in groups]:
                    future.result()
        return [v if v is not None else Verdict.error("internal: not graded") for v in verdicts]

    def warm_up(self) -> None:
        """Start the workers of every verifier built so far (those that have any)."""
        for v in list(self._verifiers.values()):
            if hasattr(v, "warm_up"):
                v.warm_up()

    def close(self) -> None:
        for v in list(self._verifiers.values()):
            if hasattr(v, "close"):
                v.close()

    def __enter__(self) -> MixedVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:  # picklable: the per-task verifiers are rebuilt on use
        return {"_build": self._build, "_verifiers": {}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def mean_by_task(problems: Sequence[Problem], scores: Sequence[float]) -> dict[str, float]:
    """Mean score per task over a batch: {task: mean}, for the tasks present (sorted by name)."""
    if len(problems) != len(scores):
        raise ValueError(f"{len(problems)} problems but {len(scores)} scores")
    sums: dict[str, list[float]] = {}
    for p, s in zip(problems, scores):
        acc = sums.setdefault(p.task, [0.0, 0.0])
        acc[0] += float(s)
        acc[1] += 1.0
    return {task: total / n for task, (total, n) in sorted(sums.items())}
