"""The configured problem splits and their prompt token ids: what every entry point trains and
evaluates on (SFT, RL, eval, reward-model sampling, hack-check)."""

from __future__ import annotations

from primekit.config import Config, ConfigError
from primekit.data.problem import Problem


def load_splits(cfg: Config, *, train: bool = True) -> tuple[list[Problem], list[Problem]]:
    """Train and held-out problems for the configured source; the two never overlap. With
    `train=False` (commands that only evaluate) a file source may give `data.eval_path` alone,
    and the training problems are then []."""
    d = cfg.data
    if d.source == "file" and not d.train_path:
        if train or not d.eval_path:
            raise ConfigError("data.train_path: required when data.source is 'file'")
        return [], _load_file("data.eval_path", d.eval_path, d.task)[: d.num_eval]
    if d.source == "arithmetic":
        task = procedural_task(cfg)
        # Training prompts are a distribution to sample from, so they may repeat. Held-out
        # problems are all distinct: drawn with replacement, the 18 two-operand test
        # expressions would each be counted several times and dominate the score.
        train = task.problems(d.num_train, split="train", seed=d.seed)
        try:
            heldout = task.problems(d.num_eval, split="test", seed=d.seed + 1, unique=True)
        except ValueError as err:
            raise ConfigError(f"data.num_eval: {err}") from None
        return train, heldout
    from primekit.data.files import split_problems

    train = _load_file("data.train_path", d.train_path, d.task)
    if d.eval_path:
        heldout = _load_file("data.eval_path", d.eval_path, d.task)
        train_prompts = {p.prompt for p in train}
        overlap = sum(p.prompt in train_prompts for p in heldout)
        if overlap:
            raise ConfigError(
                f"data.eval_path: {overlap} held-out prompts also appear in data.train_path"
            )
    else:
        train, heldout = split_problems(train, heldout_fraction=d.heldout_fraction, seed=d.seed)
    return train, heldout[: d.num_eval]


def _load_file(field: str, path: str, task: str | None) -> list[Problem]:
    """The problems of the file `path` that config field `field` names; a bad row, a missing
    file or an unreadable one is a ConfigError naming the field, the file and the row."""
    from primekit.data.files import load_problems

    try:
        return load_problems(path, task=task)
    except FileNotFoundError:
        raise ConfigError(f"{field}: no such file {str(path)!r}") from None
    except ValueError as err:  # DatasetError: the file's name and line, the field, the fault
        raise ConfigError(f"{field} {str(path)!r}: {err}") from None


def procedural_task(cfg: Config):
    """The generator of `data.task_family` (docs/tasks.md): `ArithmeticTask`, `ChainTask` or
    `RgymTask`, each with `problems(n, split, seed, unique=...)`."""
    d = cfg.data
    if d.task_family == "arithmetic":
        from primekit.data.arithmetic import ArithmeticTask

        return ArithmeticTask(min_operands=d.min_operands, max_operands=d.max_operands)
    if d.task_family == "chains":
        from primekit.data.chains import ChainTask

        return ChainTask(min_operands=d.chain_min_operands, max_operands=d.chain_max_operands)
    from primekit.data.rgym import RgymTask, rgym_name

    try:
        return RgymTask(rgym_name(d.task_family), d.rgym_config)
    except ImportError as err:
        raise ConfigError(f"data.task_family: {err}") from None
    except ValueError as err:
        field = "data.rgym_config" if "config" in str(err) else "data.task_family"
        raise ConfigError(f"{field}: {err}") from None


def verifier_task(cfg: Config) -> str:
    """The verifier for the configured data: file rows each name their own task (`data.task`
    only for rows without one), so files are graded per row ("mixed"); the arithmetic and
    chains families are graded by the arithmetic verifier, rgym:<name> by reasoning-gym's."""
    if cfg.data.source != "arithmetic":
        return "mixed"
    return "rgym" if cfg.data.task_family.startswith("rgym:") else "arithmetic"


def encode_prompts(tokenizer, problems: list[Problem], cfg: Config) -> list[list[int]]:
    from primekit.data.prompts import render_prompt

    out = []
    for p in problems:
        text = render_prompt(tokenizer, p.prompt, use_chat_template=cfg.model.use_chat_template,
                             system=cfg.model.system_prompt)
        # A chat template already writes the BOS text; plain prompts get the tokenizer's specials.
        ids = tokenizer(text, add_special_tokens=not cfg.model.use_chat_template)["input_ids"]
        out.append(list(ids))
    return out
