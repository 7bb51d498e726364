"""What the benchmarks share: the SFT checkpoint they start from (`--policy`). Imported by the
scripts in this folder as `common` (they run as `python benchmarks/NAME.py`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch


def add_policy_argument(parser: argparse.ArgumentParser, use: str = "start from") -> None:
    parser.add_argument("--policy", default="runs/demo/sft", help=f"SFT checkpoint to {use}")


def synchronize(device: torch.device) -> Callable[[], None]:
    """A callable that waits for the device's queued work (a no-op on the CPU): timed spans on a
    GPU end with it, so that they time the work and not its launch."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def half_billion_config():
    """Qwen2-0.5B's shape (494 M parameters), for random-weight models (no download)."""
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                       max_position_embeddings=2048, tie_word_embeddings=True,
                       torch_dtype="float32")


def missing_policy(policy: str) -> bool:
    """True (after saying what to run) when there is no SFT checkpoint at `policy`."""
    if Path(policy).exists():
        return False
    print(f"no SFT checkpoint at {policy}: run `primekit demo` or `primekit sft` first",
          file=sys.stderr)
    return True
