"""One problem with a checkable answer: the unit every dataset yields and every verifier grades."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Problem:
    """A prompt plus what is needed to check a response to it.

    id: stable identifier (dataset name + index, or the row's own id); used for split hygiene.
    prompt: the text shown to the model (before any chat template).
    task: which verifier grades it: "arithmetic" (the procedural task), "math" or "code".
    answer: gold final answer (arithmetic / math).
    tests: code tests: a list of assert-statement strings, or a dict
        {"inputs": [...], "outputs": [...]} of stdin/stdout cases (APPS / CodeContests style),
        or {"check": "<code defining check(candidate)>", "entry_point": "f"} (HumanEval style).
    solution: a demonstration response (used by SFT), if any.
    meta: anything else (difficulty, source file and line, ...).
    """

    id: str
    prompt: str
    task: str = "math"
    answer: str | None = None
    tests: Any = None
    solution: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
