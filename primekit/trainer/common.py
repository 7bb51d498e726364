"""Pieces shared by the SFT, RL and eval entry points: device, seeding, problems, prompt encoding."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from primekit.config import Config, ConfigError
from primekit.data.problem import Problem


def resolve_device(name: str) -> torch.device:
    """train.device: "auto" is the process's current CUDA device (cuda:LOCAL_RANK under torchrun,
    see primekit.distributed.process_group_from_env) when CUDA is available, else the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' requested but torch sees no CUDA device")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def set_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


def load_splits(cfg: Config) -> tuple[list[Problem], list[Problem]]:
    """Train and held-out problems for the configured source; the two never overlap."""
    d = cfg.data
    if d.source == "arithmetic":
        from primekit.data.arithmetic import ArithmeticTask

        task = ArithmeticTask(min_operands=d.min_operands, max_operands=d.max_operands)
        # Training prompts are a distribution to sample from, so they may repeat. Held-out
        # problems are all distinct: drawn with replacement, the 18 two-operand test
        # expressions would each be counted several times and dominate the score.
        train = task.problems(d.num_train, split="train", seed=d.seed)
        try:
            heldout = task.problems(d.num_eval, split="test", seed=d.seed + 1, unique=True)
        except ValueError as err:
            raise ConfigError(f"data.num_eval: {err}") from None
        return train, heldout
    from primekit.data.files import load_problems, split_problems

    train = load_problems(d.train_path, task=d.task)
    if d.eval_path:
        heldout = load_problems(d.eval_path, task=d.task)
        train_prompts = {p.prompt for p in train}
        overlap = sum(p.prompt in train_prompts for p in heldout)
        if overlap:
            raise ConfigError(
                f"data.eval_path: {overlap} held-out prompts also appear in data.train_path"
            )
    else:
        train, heldout = split_problems(train, heldout_fraction=0.05, seed=d.seed)
    return train, heldout[: d.num_eval]


def verifier_task(cfg: Config) -> str:
    return "arithmetic" if cfg.data.source == "arithmetic" else cfg.data.task


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


def model_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def check_model_path(path: str, field: str) -> None:
    """A local-looking path that does not exist is almost always a typo: say so early."""
    looks_local = path.startswith((".", "/", "~")) or path.startswith("runs/")
    if looks_local and not Path(path).expanduser().exists():
        raise ConfigError(f"{field}: model directory {path!r} does not exist")
