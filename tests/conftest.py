"""Shared fixtures. `tiny_model_dir`: the embedded tiny model, built once per test session."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

# Every model in the default suite is tiny: intra-op threads buy nothing and, on a shared 2-core
# machine, their spin-waiting made single forwards 10-50x slower (measured 3 s vs 0.04 s).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def python_sigint_handler():
    """Python's own SIGINT handler (KeyboardInterrupt) during every test, as in a terminal.

    A process started in the background by a non-interactive shell (`nohup bash .ci/run &`) begins
    with SIGINT ignored, and Python then keeps it ignored; the tests that send themselves SIGINT,
    or check that a handler was restored, expect the terminal's case.
    """
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly built tiny char-level Qwen2 model + tokenizer (random init, seed 0).

    Session-scoped and read-only by convention: copy it (shutil.copytree) before writing into it.
    """
    from primekit.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model")
