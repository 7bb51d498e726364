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
        print(f"primekit: {error}: the current step was abandoned and not saved; the latest "
              f"checkpoint is unchanged; continue with: {error.command or resume_command(args)}",
              file=sys.stderr)
        return 128 + error.signum
    if isinstance(error, Interrupted):
        print(f"primekit: {args.command} {error}" + (f"; {error.note}" if error.note else ""),
              file=sys.stderr)
        return 128 + error.signum
    if isinstance(error, NonFiniteError | RunDirError):
        print(f"primekit: error: {error}", file=sys.stderr)
        return 1
    raise error
