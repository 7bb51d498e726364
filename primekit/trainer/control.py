"""The live control file: RUN_DIR/control.json, written by `primekit sim --live RUN_DIR`
(primekit/viz/live.py) and read by a `live.enabled` run before every step (trainer/live.py):

    {"prm": "online" | "frozen", "inject": n}

  prm     a state: "frozen" pauses the implicit PRM's update; "online" is PRIME's normal update.
  inject  an event counter: each request above the count the run already handled injects the
          shortcut once.

Only the file format lives here, so that the page and the trainer share it without either
importing the other's machinery.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CONTROL = "control.json"
MODES = ("online", "frozen")


def read_control(run_dir: Path) -> dict:
    """control.json as {"prm": mode or None, "inject": n}; a missing or half-written file asks
    for nothing."""
    try:
        data = json.loads((Path(run_dir) / CONTROL).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"prm": None, "inject": 0}
    mode = data.get("prm")
    if mode not in (*MODES, None):
        raise ValueError(f"{CONTROL}: prm must be one of {MODES}, got {mode!r}")
    return {"prm": mode, "inject": int(data.get("inject", 0))}


def write_control(run_dir: Path, *, prm: str, inject: int) -> None:
    """Write control.json atomically (the trainer never reads half a file)."""
    if prm not in MODES:
        raise ValueError(f"prm must be one of {MODES}, got {prm!r}")
    path = Path(run_dir) / CONTROL
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"prm": prm, "inject": int(inject)}))
    os.replace(tmp, path)
