"""The `primekit` command line: sft, train, eval, demo, train-orm, train-prm, hack-check.

Every command takes `--config FILE_OR_NAME` (a YAML file, or the name of a packaged config such as
`tiny` or `paper-7b`) and any number of dotted overrides (`prm.beta=0.1 train.steps=20`), given
after the command's flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from primekit.config import ConfigError, load_config, resolve_config


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML file or packaged name (tiny, paper-7b)")
    p.add_argument("overrides", nargs="*", help="dotted overrides: section.field=value")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="primekit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sft", help="supervised warm-up; writes an HF checkpoint to sft.out_dir")
    _add_common(p)
    p = sub.add_parser("train", help="online RL: PRIME or an outcome-only baseline")
    _add_common(p)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="empty train.run_dir first if it holds an earlier run")
    p = sub.add_parser("eval", help="greedy pass@1, avg@k and pass@k on held-out problems")
    _add_common(p)
    p.add_argument("--model", default=None, help="model to evaluate (default: model.policy)")
    from primekit.reward_models.cli import add_subcommands

    add_subcommands(sub)  # train-orm, train-prm, hack-check
    p = sub.add_parser("demo", help="tiny model, SFT then PRIME, on a CPU in minutes")
    p.add_argument("--run-dir", default="runs/demo", help="where the demo writes everything")
    p.add_argument("overrides", nargs="*", help="dotted overrides on top of configs/tiny.yaml")
    return parser


def _quiet_transformers() -> None:
    """transformers' per-load progress bars drown our own progress lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_transformers()
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and args.command not in ("train", "eval"):
            raise ConfigError(f"primekit {args.command} runs in a single process; under torchrun "
                              "only `primekit train` and `primekit eval` are data-parallel")
        from primekit.reward_models.cli import dispatch

        if dispatch(args):
            return 0
        if args.command == "demo":
            from primekit.demo import run_demo

            run_demo(Path(args.run_dir), args.overrides)
            return 0
        cfg = load_config(resolve_config(args.config), args.overrides)
        if args.command in ("train", "eval"):
            # Data-parallel under torchrun: one process per device, joined here.
            from primekit import distributed as dist

            with dist.process_group_from_env():
                _run_distributed_command(args, cfg)
            return 0
        if args.command == "sft":
            from primekit.trainer.sft import run_sft

            print(run_sft(cfg))
    except ConfigError as e:
        print(f"primekit: configuration error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as e:  # bad data rows, missing model directories, ...
        print(f"primekit: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the run's own failures that have a one-line message
        from primekit.trainer.outcomes import one_line_failure

        return one_line_failure(e, args)
    except KeyboardInterrupt:  # Ctrl-C outside a training loop: nothing to save
        print("primekit: interrupted", file=sys.stderr)
        return 130
    return 0


def _run_distributed_command(args, cfg) -> None:
    if args.command == "train":
        from primekit.factory import build_rl_trainer
        from primekit.trainer import rundir, signals

        with rundir.owned(cfg, resume=args.resume, overwrite=args.overwrite), \
                signals.graceful_stop():
            build_rl_trainer(cfg, resume=args.resume).train()
    else:
        from primekit.logging import print_table
        from primekit.trainer.eval import evaluate_checkpoint

        metrics = evaluate_checkpoint(cfg, args.model or cfg.model.policy)
        print_table(f"evaluation of {args.model or cfg.model.policy}",
                    [{"metric": k, "value": v} for k, v in metrics.items()])


if __name__ == "__main__":
    sys.exit(main())
