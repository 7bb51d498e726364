"""Process set-up shared by every entry point: device, seeding, threads, dtype, and holding
SIGINT/SIGTERM back while a write that must not be cut in half runs.

A base module (next to config, distributed and logging): anything in primekit may import it, and
it imports nothing of ours but primekit.config.
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends, then go to the handlers in force before it.

    For a write that must finish once begun (models.hf.save_model's renames): a Ctrl-C, or a
    handler that raises on the first signal (trainer.signals.stop_at_once), then stops the
    program after the write instead of in the middle of it. Python sets handlers on the main
    thread only; elsewhere the block runs unprotected.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for s in dict.fromkeys(pending):  # each signal once, in the order received
            signal.raise_signal(s)


def check_compiler(setting: str) -> None:
    """Raise ValueError now, with the fix, where torch.compile would find no C++ compiler at the
    first compiled call, after the models' load: its CPU kernels are built with one (on a GPU
    Triton builds its own, with whatever C compiler it finds). `setting` names what asked for
    compiling, e.g. "train.compile=true"."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:  # another torch's layout: the first compiled call will say
        return
    try:
        get_cpp_compiler()
    except Exception as e:  # torch's InvalidCxxCompiler
        raise ValueError(f"{setting} needs a C++ compiler ({e}): install one (g++ or clang++), "
                         "or turn it off") from None
