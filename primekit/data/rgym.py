"""Task families from the `reasoning-gym` package (pinned: `pip install 'primekit[rgym]'`).

`data.task_family=rgym:<name>` draws problems from reasoning-gym's procedural dataset <name>:
the prompt is reasoning-gym's question verbatim, the gold answer its answer, and grading is its
own `score_answer` (primekit.verifiers.rgym). The response format is this project's: optional
chain-of-thought lines, then the answer on a final "A:<answer>" line.

Demonstrations (for `primekit sft`): a worked chain where `DEMONSTRATIONS` has one for the
dataset, else the answer line alone. chain_sum (signed sums of one-digit numbers, "+" and "-"
only, e.g. "State the final answer to the following arithmetic problem: 4 - 1 - 7 =") gets one
line per step, as in the arithmetic task: "4-1=3\\n3-7=-4\\nA:-4".

Determinism and splits: reasoning-gym builds item i of a dataset from `random.Random(seed + i)`;
the seed of split S of our seed s is a keyed hash of (name, S, s), and an item lands in split S
only if the keyed hash of its question says so (`split_of`, as for the arithmetic task), so the
same question is always in the same split and train and test never share a question.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from primekit.data.arithmetic import ANSWER_PREFIX, STEP_DELIMITER
from primekit.data.problem import Problem

FAMILY_PREFIX = "rgym:"

# Our defaults for a dataset's reasoning-gym config, under `data.rgym_config` (which wins).
# chain_sum: 3-5 one-digit terms (reasoning-gym's own default, 2-6 terms of 1-4 digits, gives
# four-digit sums the 1M-parameter character model cannot learn in minutes).
DEFAULT_CONFIGS: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 3, "max_terms": 5, "min_digits": 1, "max_digits": 1},
}
# Set by us, per split and seed: a config may not name them.
RESERVED_KEYS = ("seed", "size")


def rgym_name(task_family: str) -> str | None:
    """"rgym:chain_sum" -> "chain_sum"; None for a family that is not reasoning-gym's."""
    return task_family[len(FAMILY_PREFIX):] if task_family.startswith(FAMILY_PREFIX) else None


def import_reasoning_gym():
    """The `reasoning_gym` module, imported lazily (about 2 s: it registers ~100 datasets)."""
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError(
            "the rgym task families need the reasoning-gym package: "
            "pip install 'primekit[rgym]' (reasoning-gym==0.1.25)"
        ) from None
    return reasoning_gym


def chain_sum_demonstration(expression: str, answer: str) -> str:
    """The worked chain of a chain_sum expression, one step per line, left to right:
    "4 - 1 - 7" -> "4-1=3\\n3-7=-4\\nA:-4". Raises ValueError if the chain does not reach
    `answer` (reasoning-gym's gold), so a demonstration never teaches a wrong answer."""
    tokens = expression.split()
    if len(tokens) < 3 or len(tokens) % 2 == 0:
        raise ValueError(f"chain_sum expression must look like '4 - 1 - 7', got {expression!r}")
    acc, lines = int(tokens[0]), []
    for op, b_text in zip(tokens[1::2], tokens[2::2]):
        b = int(b_text)
        if op not in ("+", "-"):
            raise ValueError(f"chain_sum operator must be + or -, got {op!r} in {expression!r}")
        result = acc + b if op == "+" else acc - b
        lines.append(f"{acc}{op}{b}={result}")
        acc = result
    if str(acc) != answer:
        raise ValueError(f"chain_sum {expression!r}: the chain gives {acc}, the gold is {answer!r}")
    return "".join(line + STEP_DELIMITER for line in lines) + f"{ANSWER_PREFIX}{answer}"


# dataset name -> (reasoning-gym entry -> demonstration response).
DEMONSTRATIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "chain_sum": lambda e: chain_sum_demonstration(e["metadata"]["expression"], e["answer"]),
}


def demonstration(name: str, entry: dict[str, Any]) -> str:
    """What SFT imitates for a reasoning-gym entry: its worked chain, or "A:<answer>"."""
    build = DEMONSTRATIONS.get(name)
    return build(entry) if build else f"{ANSWER_PREFIX}{entry['answer']}"


def split_of(question: str, test_fraction: float) -> str:
    """ "test" for a fixed, hash-chosen test_fraction of all questions, else "train"."""
    digest = hashlib.blake2b(question.encode(), digest_size=8, person=b"primekit-rgym").digest()
    return "test" if int.from_bytes(digest, "big") < test_fraction * 2**64 else "train"


def _stream_seed(name: str, split: str, seed: int) -> int:
    digest = hashlib.blake2b(f"{name}/{split}/{seed}".encode(), digest_size=4,
                             person=b"primekit-rgym").digest()
    return int.from_bytes(digest, "big") >> 1  # < 2**31: reasoning-gym adds the item index


def _jsonable(value: Any) -> Any:
    """reasoning-gym metadata with tuples as lists, so a Problem's meta survives JSON."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class RgymTask:
    """Problems from reasoning-gym's procedural dataset `name`, with fixed train/test splits.

    Args:
        name: a reasoning-gym dataset ("chain_sum", ...).
        config: its reasoning-gym config fields, over DEFAULT_CONFIGS[name] (not seed or size).
        test_fraction: share of all questions reserved for the test split.

    Raises:
        ValueError: unknown dataset, reserved or unknown config key (reasoning-gym's message).
        ImportError: reasoning-gym is not installed.
    """

    def __init__(self, name: str, config: dict[str, Any] | None = None,
                 test_fraction: float = 0.1) -> None:
        rg = import_reasoning_gym()
        from reasoning_gym.factory import DATASETS

        if name not in DATASETS:
            raise ValueError(f"reasoning-gym has no dataset {name!r}; e.g. 'chain_sum'")
        config = dict(config or {})
        reserved = [k for k in RESERVED_KEYS if k in config]
        if reserved:
            raise ValueError(f"{reserved[0]!r} is set per split and seed by primekit, not in the "
                             "config")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
        self.name, self.test_fraction = name, test_fraction
        self.config = {**DEFAULT_CONFIGS.get(name, {}), **config}
        try:  # a bad field fails here, once, rather than at the first draw
            rg.create_dataset(name, seed=0, size=1, **self.config)
        except (TypeError, AssertionError, ValueError) as err:
            raise ValueError(f"reasoning-gym {name!r} config {self.config}: {err}") from None

    def make_problem(self, entry: dict[str, Any], id: str) -> Problem:
        """The Problem for a reasoning-gym entry {"question", "answer", "metadata"}."""
        answer = str(entry["answer"])
        if STEP_DELIMITER in answer:
            raise ValueError(f"reasoning-gym {self.name!r} answer {answer!r} spans several lines; "
                             "the 'A:' answer line cannot hold it")
        return Problem(
            id=id,
            prompt=entry["question"],
            task="rgym",
            answer=answer,
            solution=demonstration(self.name, {**entry, "answer": answer}),
            meta={"family": f"{FAMILY_PREFIX}{self.name}", "rgym_dataset": self.name,
                  "rgym_metadata": _jsonable(entry.get("metadata", {}))},
        )

    def problems(self, n: int, split: str = "train", seed: int = 0, *,
                 unique: bool = False) -> list[Problem]:
        """n problems of the given split, reproducible from seed (all distinct with `unique`;
        ValueError if the split has fewer than n within 1000 + 200 n draws)."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        rg = import_reasoning_gym()
        max_attempts = 1000 + 200 * n
        dataset = rg.create_dataset(self.name, seed=_stream_seed(self.name, split, seed),
                                    size=max_attempts, **self.config)
        out: list[Problem] = []
        seen: set[str] = set()
        for index in range(max_attempts):
            if len(out) == n:
                break
            entry = dataset[index]
            question = entry["question"]
            if split_of(question, self.test_fraction) != split:
                continue
            if unique:
                if question in seen:
                    continue
                seen.add(question)
            out.append(self.make_problem(entry, f"rgym-{self.name}-{split}-{seed}-{len(out)}"))
        if len(out) < n:
            raise ValueError(f"could not draw {n} unique {split!r} problems of reasoning-gym "
                             f"{self.name!r} (found {len(out)}); ask for fewer or widen its config")
        return out

