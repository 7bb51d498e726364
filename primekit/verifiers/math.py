"""Math answers: extract the final answer from a response and grade it with math-verify.

Extraction: the last `\\boxed{...}` (or `\\fbox{...}`) whose braces balance; failing that, the last
phrase such as "the answer is ...", "Final answer: ...", "Answer: ..." (configurable regexes).
Grading: `math_verify.parse` on both sides (each wrapped as `\\boxed{...}` so math-verify reads it
as LaTeX) and `math_verify.verify(gold, pred)`; that covers fractions, decimals, LaTeX, percentages
("50\\%" equals 0.5 and 50), intervals, sets and expressions up to sympy simplification.

Time: math-verify bounds its work with `signal.alarm`, which only works on the main thread of
the main interpreter (off it, math-verify raises ValueError). And no signal interrupts a C-level
big-integer power such as `9^{9^{9^{9}}}`. So grading runs in worker processes with math-verify's
own timeouts switched off and a hard per-item deadline enforced by the parent (`pool.py`): a
stuck item is SIGKILLed with its worker and comes back as a "timeout" verdict.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from fractions import Fraction

from primekit.config import VerifierConfig
from primekit.data.problem import Problem
from primekit.verifiers.base import Verdict, check_batch
from primekit.verifiers.pool import DeadlinePool

# Each regex has one group: the answer text, up to the end of the line.
DEFAULT_PATTERNS: tuple[str, ...] = (
    r"final answer\s*(?:is|:)\s*:?\s*(.+)",
    r"the answer is\s*:?\s*(.+)",
    r"answer\s*:\s*(.+)",
)
# Longer "answers" are almost always a model rambling on; sympy on them is slow and pointless.
MAX_ANSWER_CHARS = 1000

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _boxed_content(text: str, start: int) -> str | None:
    """Content of the box command whose name ends at `start`, or None if its braces never close."""
    i = start
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":  # `\boxed 5`: the next whitespace-delimited token
        m = re.match(r"[^\s$]+", text[i:])
        return m.group(0) if m else None
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":  # `\{`, `\}` and `\\` are literal, not grouping
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def _clean(answer: str) -> str:
    """Strip markdown emphasis, math delimiters and trailing punctuation around an answer."""
    s = answer.strip()
    for _ in range(3):
        s = s.strip().strip("*").strip()
        s = s.rstrip(".,;").strip()
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
                s = s[len(left) : len(s) - len(right)]
    return s.strip()


def extract_answer(response: str, patterns: Sequence[str] = DEFAULT_PATTERNS) -> str | None:
    """The final answer in `response`: the last balanced `\\boxed{}`, else the last phrase match.

    Args:
        response: model output.
        patterns: regexes (matched case-insensitively) with one group capturing the answer.
    Returns:
        the answer text (delimiters and trailing punctuation stripped) or None if there is none.
    """
    for m in reversed(list(_BOXED.finditer(response))):
        content = _boxed_content(response, m.end())
        if content is not None and content.strip():
            return content.strip()
    best: tuple[int, str] | None = None
    for pattern in patterns:
        # A lookahead finds overlapping matches, so "... the answer is 1, no, the answer is 2"
        # yields a match starting at the second phrase too.
        for m in re.finditer(f"(?=(?:{pattern}))", response, flags=re.IGNORECASE):
            if best is None or m.start() > best[0]:
                best = (m.start(), m.group(1))
    if best is None:
        return None
    answer = _clean(best[1])
    return answer or None


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
_FRAC = re.compile(r"([+-]?)\\frac\{(\d+)\}\{(\d+)\}")


_SPACING = re.compile(r"\\(?:left|right)(?![A-Za-z])|\\[!,;: ]")


def _normal_form(s: str) -> str:
    s = _SPACING.sub("", _clean(s))
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    return "".join(s.split())


def _exact_number(s: str) -> Fraction | None:
    m = _FRAC.fullmatch(s)
    if m:
        return Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) == "-" else 1)
    if _NUMBER.fullmatch(s):
        return Fraction(s)
    return None


def fast_equal(gold: str, answer: str) -> bool:
    """True when the two are the same string or the same exact number after light normalisation.

    Only ever short-cuts a "correct"; everything else goes to math-verify. It skips sympy (tens
    of ms per answer) on the most common answers, and accepts a thin-space thousands separator
    (`1\\,000` = 1000), which math-verify misreads as 1*0.
    """
    g, a = _normal_form(gold), _normal_form(answer)
    if not g or not a:
        return False
    if g == a:
        return True
    try:
        x, y = _exact_number(g), _exact_number(a)
    except (ValueError, ZeroDivisionError):
        return False
    return x is not None and x == y


def _as_boxed(s: str) -> str:
    """Wrap a bare answer so math-verify's LaTeX extractor (which prefers boxes) reads all of it."""
    s = _clean(s)
    return s if "\\boxed" in s else "\\boxed{" + s + "}"


def _parse(latex: str) -> list:
    from math_verify import parse

    # parsing_timeout=None: no signal.alarm; the pool's hard deadline bounds the time instead.
    return parse(_as_boxed(latex), parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list:
    return _parse(gold)


def gold_problem(answer: str) -> str | None:
    """Why math-verify would grade every response to a row with this gold answer `error` (it
    cannot parse it: `\\boxed{}`, `}{`), or None. For `primekit data check`."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if _parse_gold(answer):
        return None
    return (f"field 'answer': math-verify cannot parse the gold answer {answer[:60]!r}, so every "
            "response to the row would be graded error")


def worker_init() -> None:
    """Pool-worker start-up: import sympy/math-verify and build its parsers once (about 1 s)."""
    import logging

    # math-verify warns once that its timeouts are off; that is deliberate here.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _parse("\\frac{1}{2}")
    _parse("x^2+1")


def grade_one(item: tuple[str, str, tuple[str, ...]]) -> tuple[str, str]:
    """Grade (response, gold, patterns) -> (status, reason). Runs inside a pool worker."""
    from math_verify import verify

    response, gold, patterns = item
    answer = extract_answer(response, patterns)
    if answer is None:
        return "incorrect", "no final answer found"
    if len(answer) > MAX_ANSWER_CHARS:
        return "incorrect", f"answer longer than {MAX_ANSWER_CHARS} characters"
    if fast_equal(gold, answer):
        return "correct", ""
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return "error", f"could not parse gold answer {gold[:60]!r}"
    pred = _parse(answer)
    if not pred:
        return "incorrect", "could not parse the answer"
    ok = verify(gold_parsed, pred, timeout_seconds=None)
    return ("correct", "") if ok else ("incorrect", "")


class MathVerifier:
    """Grades math responses against `problem.answer` with math-verify, in worker processes.

    Args:
        timeout_s: hard limit per response (the worker grading it is killed past it).
        patterns: answer-phrase regexes for `extract_answer` (used when there is no \\boxed{}).
        workers: number of grading processes (started on first use, reused afterwards).
    The limits default to the config's (verifier.math_timeout_s, verifier.math_workers).
    """

    def __init__(
        self,
        timeout_s: float = VerifierConfig.math_timeout_s,
        patterns: Sequence[str] = DEFAULT_PATTERNS,
        workers: int = VerifierConfig.math_workers,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        for p in patterns:
            if re.compile(p).groups != 1:
                raise ValueError(f"each pattern needs exactly one capture group, got {p!r}")
        self.timeout_s = float(timeout_s)
        self.patterns = tuple(patterns)
        self.workers = workers
        self._pool: DeadlinePool | None = None

    @property
    def pool(self) -> DeadlinePool:
        if self._pool is None:
            self._pool = DeadlinePool(
                "primekit.verifiers.math:grade_one",
                self.workers,
                init="primekit.verifiers.math:worker_init",
            )
        return self._pool

    def warm_up(self) -> None:
        """Start the grading processes now (each imports sympy once, about a second)."""
        self.pool.warm_up()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:  # picklable: worker processes do not travel
        return {**self.__dict__, "_pool": None}

    def verify(self, response: str, problem: Problem) -> Verdict:
        return self.verify_batch([response], [problem])[0]

    def verify_batch(self, responses: list[str], problems: list[Problem]) -> list[Verdict]:
        """One Verdict per (response, problem); never raises except for mismatched lengths."""
        check_batch(responses, problems)
        verdicts: list[Verdict | None] = [None] * len(responses)
        items, where = [], []
        for i, (response, problem) in enumerate(zip(responses, problems)):
            gold = getattr(problem, "answer", None)
            if not isinstance(response, str):
                verdicts[i] = Verdict.error(f"response is {type(response).__name__}, not str")
            elif not isinstance(gold, str) or not gold.strip():
                verdicts[i] = Verdict.error("problem has no gold answer")
            else:
                items.append((response, gold, self.patterns))
                where.append(i)
        try:
            outcomes = self.pool.map(items, self.timeout_s)
        except Exception as e:  # the pool itself broke: every pending item is an error
            outcomes = [("error", f"grading pool failed: {type(e).__name__}: {e}", 0)] * len(items)
        for i, (status, value, retries) in zip(where, outcomes):
            verdict = _to_verdict(status, value, self.timeout_s)
            verdicts[i] = dataclasses.replace(verdict, retries=retries) if retries else verdict
        return [v if v is not None else Verdict.error("internal: not graded") for v in verdicts]


def _to_verdict(status: str, value: object, timeout_s: float) -> Verdict:
    if status == "timeout":
        reason = value if isinstance(value, str) else f"math grading exceeded {timeout_s:g}s"
        return Verdict.timeout(reason)
    if status == "error":
        return Verdict.error(str(value))
    verdict_status, reason = value  # type: ignore[misc]
    if verdict_status == "correct":
        return Verdict.correct()
    if verdict_status == "error":
        return Verdict.error(reason)
    return Verdict.incorrect(reason=reason)
