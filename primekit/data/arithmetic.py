"""A procedural multi-step arithmetic task with chain-of-thought: the embedded demo task.

Format (character-level, short, because every character costs CPU time):
    prompt:    "3+4*2-5="
    solution:  "3+4=7\\n7*2=14\\n14-5=9\\nA:9"
Expressions are evaluated strictly LEFT TO RIGHT (no operator precedence): "3+4*2" is
(3+4)*2 = 14. Each step "acc<op>b=result" ends with STEP_DELIMITER ("\\n"); the final line
"A:<integer>" holds the answer and has no delimiter (the model emits EOS after it).

Construction keeps every running value in [min_value, max_value] (default 1..99: no negatives,
at most two digits, and no zero, which would otherwise be ~10% of answers, reached by "x-x" or
"0*...", and a cheap constant guess for a policy): each next operator is drawn uniformly among those with at least one operand
in [min_operand, max_operand] that keeps the result in range, then the operand uniformly among
those. The number of operands (min_operands..max_operands, uniform) is the difficulty knob and is
recorded as meta["difficulty"].

Train/test hygiene: a keyed hash of the expression string decides its split, so the same
expression always lands in the same split whatever the seed, and the splits never overlap.

Grading (answer extraction, ArithmeticVerifier) lives in primekit.verifiers.arithmetic: verifiers
depend on data, never the other way round.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

from primekit.data.problem import Problem

STEP_DELIMITER = "\n"
ANSWER_PREFIX = "A:"
OPERATORS = ("+", "-", "*")


def _apply(acc: int, op: str, b: int) -> int:
    if op == "+":
        return acc + b
    if op == "-":
        return acc - b
    if op == "*":
        return acc * b
    raise ValueError(f"unknown operator {op!r}")


def parse_expression(expression: str) -> tuple[list[int], list[str]]:
    """Split "3+4*2" (optionally ending in "=") into operands [3, 4, 2] and operators ["+", "*"]."""
    expr = expression[:-1] if expression.endswith("=") else expression
    tokens = re.split(r"([+\-*])", expr)
    operands, operators = tokens[0::2], tokens[1::2]
    if not expr or not all(t.isdigit() for t in operands):
        raise ValueError(f"expression must look like '3+4*2-5=', got {expression!r}")
    return [int(t) for t in operands], operators


def solve(expression: str) -> tuple[list[str], int]:
    """The step lines and the left-to-right value of an expression: "3+4*2" -> (["3+4=7", "7*2=14"], 14)."""
    operands, operators = parse_expression(expression)
    acc, steps = operands[0], []
    for op, b in zip(operators, operands[1:]):
        result = _apply(acc, op, b)
        steps.append(f"{acc}{op}{b}={result}")
        acc = result
    return steps, acc


def demonstration(expression: str) -> str:
    """The reference chain of thought for an expression (what SFT imitates)."""
    steps, answer = solve(expression)
    return "".join(s + STEP_DELIMITER for s in steps) + f"{ANSWER_PREFIX}{answer}"


def split_of(expression: str, test_fraction: float) -> str:
    """ "test" for a fixed, hash-chosen test_fraction of all expressions, else "train"."""
    digest = hashlib.blake2b(expression.encode(), digest_size=8, person=b"primekit-arith").digest()
    return "test" if int.from_bytes(digest, "big") < test_fraction * 2**64 else "train"


class ArithmeticTask:
    """Generator of arithmetic problems with a difficulty knob and fixed train/test splits.

    Args:
        min_operands, max_operands: range of the number of operands (difficulty), inclusive.
        min_value, max_value: every running value stays in [min_value, max_value].
        min_operand, max_operand: range of each operand written in the prompt.
        operators: subset of "+", "-", "*".
        test_fraction: share of all possible expressions reserved for the test split.
    """

    # Names the random stream and the problem ids ("arithmetic-train-0-5"); a subclass with
    # other defaults (primekit.data.chains) draws its own stream under its own name.
    family = "arithmetic"

    def __init__(
        self,
        min_operands: int = 2,
        max_operands: int = 4,
        max_value: int = 99,
        *,
        min_value: int = 1,
        min_operand: int = 1,
        max_operand: int = 9,
        operators: Sequence[str] = OPERATORS,
        test_fraction: float = 0.1,
    ) -> None:
        if not isinstance(min_operands, int) or min_operands < 2:
            raise ValueError(f"min_operands must be an int >= 2, got {min_operands!r}")
        if not isinstance(max_operands, int) or max_operands < min_operands:
            raise ValueError(
                f"max_operands must be an int >= min_operands ({min_operands}), got {max_operands!r}"
            )
        if not 0 <= min_operand <= max_operand:
            raise ValueError(
                f"need 0 <= min_operand <= max_operand, got {min_operand!r}, {max_operand!r}"
            )
        if not 0 <= min_value <= min_operand:
            raise ValueError(
                f"need 0 <= min_value <= min_operand ({min_operand}), got {min_value!r}"
            )
        if max_value < max_operand:
            raise ValueError(f"max_value must be >= max_operand ({max_operand}), got {max_value!r}")
        bad = [op for op in operators if op not in OPERATORS]
        if bad or not operators:
            raise ValueError(
                f"operators must be a non-empty subset of {OPERATORS}, got {operators!r}"
            )
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
        self.min_operands, self.max_operands = min_operands, max_operands
        self.min_value, self.max_value = min_value, max_value
        self.min_operand, self.max_operand = min_operand, max_operand
        self.operators = tuple(operators)
        self.test_fraction = test_fraction

    def _feasible(self, acc: int, op: str) -> list[int]:
        lo, hi = self.min_operand, self.max_operand
        return [
            b for b in range(lo, hi + 1) if self.min_value <= _apply(acc, op, b) <= self.max_value
        ]

    def sample_expression(self, rng: random.Random, n_operands: int) -> str:
        """One expression with n_operands operands, e.g. "3+4*2-5" (no trailing "=")."""
        acc = rng.randint(self.min_operand, self.max_operand)
        parts = [str(acc)]
        for _ in range(n_operands - 1):
            choices = [(op, bs) for op in self.operators if (bs := self._feasible(acc, op))]
            op, bs = rng.choice(choices)
            b = rng.choice(bs)
            acc = _apply(acc, op, b)
            parts += [op, str(b)]
        return "".join(parts)

    def make_problem(self, expression: str, id: str) -> Problem:
        """The Problem for an expression given without the trailing "="."""
        steps, answer = solve(expression)
        return Problem(
            id=id,
            prompt=expression + "=",
            task="arithmetic",  # the verifier's name: every family of this format is graded alike
            answer=str(answer),
            solution=demonstration(expression),
            meta={"difficulty": len(steps) + 1, "expression": expression},
        )

    def problems(
        self, n: int, split: str = "train", seed: int = 0, *, unique: bool = False
    ) -> list[Problem]:
        """n problems of the given split, reproducible from seed.

        Without `unique`, an expression may repeat (the 2-operand space is only a few hundred
        expressions). With `unique=True` all n prompts differ; ValueError if the split has fewer.
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        rng = random.Random(f"{self.family}/{split}/{seed}")
        out: list[Problem] = []
        seen: set[str] = set()
        attempts, max_attempts = 0, 1000 + 200 * n
        while len(out) < n:
            attempts += 1
            if attempts > max_attempts:
                raise ValueError(
                    f"could not draw {n} unique {split!r} problems (found {len(out)}); "
                    "ask for fewer or widen the task"
                )
            n_operands = rng.randint(self.min_operands, self.max_operands)
            expression = self.sample_expression(rng, n_operands)
            if split_of(expression, self.test_fraction) != split:
                continue
            if unique:
                if expression in seen:
                    continue
                seen.add(expression)
            out.append(self.make_problem(expression, f"{self.family}-{split}-{seed}-{len(out)}"))
        return out
