"""How a training run that did not finish ends on the command line: one line and an exit status.

`one_line_failure` is the CLI's last handler for the run's own failures; anything it does not know
is re-raised, so a bug still shows its traceback.

    Stopped (first SIGINT/SIGTERM)     checkpoint path and the resume command; 128 + signal
    Abandoned (a second signal)        the step was not saved; 128 + signal
    Interrupted (nothing to resume)    what was left behind (its note); 128 + signal
    NonFiniteError, RunDirError        the message (quantity and step; path and cause); 1
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from primekit.config import load_config, resolve_config
from primekit.trainer import checkpoint as ckpt
from primekit.trainer.guards import NonFiniteError
from primekit.trainer.rundir import RunDirError
from primekit.trainer.signals import Abandoned, Interrupted, Stopped


def resume_command(args) -> str:
    """The `primekit train ... --resume` line that continues this run."""
    words = ["primekit", "train"]
    if getattr(args, "config", None):
        words += ["--config", args.config]
    words += list(getattr(args, "overrides", []) or []) + ["--resume"]
    return shlex.join(words)


def restart_command(args) -> str:
    """The `primekit train ... --overwrite` line that starts this run again."""
    return resume_command(args).removesuffix(" --resume") + " --overwrite"


def _has_checkpoint(args) -> bool:
    """Whether the run directory of these `primekit train` arguments holds a complete checkpoint
    (True where that cannot be told: the resume line is then the likelier one)."""
    try:
        cfg = load_config(resolve_config(args.config), list(args.overrides or []))
    except Exception:  # noqa: BLE001 (only choosing which line to print)
        return True
    return ckpt.latest_checkpoint(Path(cfg.train.run_dir)) is not None


def one_line_failure(error: BaseException, args) -> int:
    if isinstance(error, Stopped):
        if error.checkpoint is not None:
            where = f"checkpoint {error.checkpoint}; continue with: "
            command = error.command or resume_command(args)
        else:
            where = "no checkpoint was written (no step had finished); start again with: "
            command = error.command or restart_command(args)
        print(f"primekit: {error}; {where}{command}", file=sys.stderr)
        return 128 + error.signum
    if isinstance(error, Abandoned):
        if error.command:
            command = error.command
        else:  # a second signal before the first checkpoint leaves nothing to resume
            command = resume_command(args) if _has_checkpoint(args) else restart_command(args)
        what = error.note or ("the current step was abandoned and not saved; the latest "
                              "checkpoint is unchanged")
        print(f"primekit: {error}: {what}; continue with: {command}", file=sys.stderr)
        return 128 + error.signum
    if isinstance(error, Interrupted):
        print(f"primekit: {args.command} {error}" + (f"; {error.note}" if error.note else ""),
              file=sys.stderr)
        return 128 + error.signum
    if isinstance(error, NonFiniteError | RunDirError):
        print(f"primekit: error: {error}", file=sys.stderr)
        return 1
    raise error
