"""What the benchmarks share: the SFT checkpoint they start from (`--policy`). Imported by the
scripts in this folder as `common` (they run as `python benchmarks/NAME.py`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_policy_argument(parser: argparse.ArgumentParser, use: str = "start from") -> None:
    parser.add_argument("--policy", default="runs/demo/sft", help=f"SFT checkpoint to {use}")


def missing_policy(policy: str) -> bool:
    """True (after saying what to run) when there is no SFT checkpoint at `policy`."""
    if Path(policy).exists():
        return False
    print(f"no SFT checkpoint at {policy}: run `primekit demo` or `primekit sft` first",
          file=sys.stderr)
    return True
