"""Process set-up shared by every entry point: device, seeding, threads, dtype.

A base module (next to config, distributed and logging): anything in primekit may import it, and
it imports nothing of ours but primekit.config.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from primekit.config import ConfigError


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


def model_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
