"""The `primekit` command line: sft, train, eval, export, demo, train-orm, train-prm,
hack-check, plan, sim, dashboard, heatmap, rerank, experiment, data check.

Every command takes `--config FILE_OR_NAME` (a YAML file, or the name of a packaged config such as
`tiny` or `paper-7b`) and any number of dotted overrides (`prm.beta=0.1 train.steps=20`), given
after the command's flags.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from primekit.config import ConfigError, load_config, packaged_configs, resolve_config


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None,
                   help=f"YAML file or packaged name ({', '.join(packaged_configs())})")
    p.add_argument("overrides", nargs="*", help="dotted overrides: section.field=value")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="primekit", description="Online RL with process rewards (PRIME) for language models "
        f"on verifiable tasks. Every command takes --config FILE_OR_NAME (a YAML file, or a "
        f"packaged config: {', '.join(packaged_configs())}) and dotted overrides "
        "(prm.beta=0.1 train.steps=20) after its flags. Start with: primekit demo")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sft", help="supervised warm-up; writes an HF checkpoint to sft.out_dir")
    _add_common(p)
    p = sub.add_parser("train", help="online RL: PRIME or an outcome-only baseline")
    _add_common(p)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--resume-anyway", action="store_true",
                   help="--resume even though the model or data files changed since the checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="empty train.run_dir first if it holds an earlier run")
    p = sub.add_parser("eval", help="greedy pass@1, avg@k and pass@k on held-out problems")
    _add_common(p)
    p.add_argument("--model", default=None, help="model to evaluate (default: model.policy)")
    from primekit.reward_models.cli import add_subcommands

    add_subcommands(sub)  # train-orm, train-prm, hack-check
    p = sub.add_parser("plan", help="per-GPU memory of a config under FSDP2; does it fit")
    _add_common(p)
    p.add_argument("--gpus", type=int, default=1, help="GPUs (FSDP2 world size)")
    p.add_argument("--gpu-mem", type=float, default=80.0, help="memory per GPU, GiB")
    # 1024: data.max_prompt_length of verl's PRIME recipe (recipe/prime/run_prime_qwen*.sh).
    p.add_argument("--prompt-len", type=int, default=1024, help="longest prompt, tokens")
    p.add_argument("--model-config", default=None,
                   help="read the model's config here instead of model.policy (dir or json)")
    from primekit.viz.cli import add_subcommands as add_viz_subcommands

    add_viz_subcommands(sub)  # sim, dashboard, heatmap, rerank
    from primekit.experiment.cli import add_subcommand as add_experiment_subcommand

    add_experiment_subcommand(sub)  # experiment
    p = sub.add_parser("export", help="a checkpoint's models as plain Hugging Face directories")
    p.add_argument("run_dir", help="the run directory (its checkpoints/ are read)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--out", default=None, help="output dir (default: "
                   "RUN_DIR/export/step_NNNNNN, the step in six digits: step_000160)")
    p.add_argument("--models", nargs="*", default=None, help="names (default: all, e.g. policy prm)")
    p = sub.add_parser("demo", help="tiny model, SFT then PRIME, on a CPU in minutes")
    p.add_argument("--run-dir", default="runs/demo", help="where the demo writes everything")
    from primekit.demo import PRM_INITS

    p.add_argument("--prm-init", choices=PRM_INITS, default="separate",
                   help="where the implicit PRM and its reference start: 'separate' (default), an "
                   "SFT model of seed sft.seed+1 the demo also trains; 'policy', the policy's SFT "
                   "model as PRIME prescribes (at this size it co-adapts with the policy: "
                   "docs/experiments/prm-init-tuning.md)")
    p.add_argument("overrides", nargs="*", help="dotted overrides on top of configs/tiny.yaml")
    p = sub.add_parser("data", help="dataset files: `primekit data check FILE`")
    data = p.add_subparsers(dest="data_command", required=True)
    p = data.add_parser("check", help="validate a JSONL / parquet file or a saved HF dataset as "
                        "training reads it: rows per task, the first bad row (exit 2 if any)")
    p.add_argument("file", help="a .jsonl/.ndjson or .parquet file, or a save_to_disk directory")
    p.add_argument("--task", choices=("math", "code", "arithmetic"), default=None,
                   help="task of rows that name none (as data.task)")
    return parser


def _quiet_transformers() -> None:
    """transformers' per-load progress bars drown our own progress lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


_OVERRIDE = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)+=.*", re.DOTALL)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with dotted overrides allowed between flags too: argparse takes one run
    of positionals, so in `train --config tiny a.b=1 --resume c.d=2` it would refuse `c.d=2` as
    an unrecognised argument (a valid override, only out of place). Such overrides join the
    others in the order given; anything else unrecognised is the usual usage error."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(args, "overrides", None) is None or not all(map(_OVERRIDE.fullmatch, extra)):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    # This module imports nothing heavy, so a Ctrl-C while torch and the rest load (the first
    # seconds of every command) ends here in one line, like one in a command with nothing to save.
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("primekit: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    from primekit.trainer.signals import Interrupted

    args = parse_args(argv)
    _quiet_transformers()
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and args.command not in ("train", "eval"):
            raise ConfigError(f"primekit {args.command} runs in a single process; under torchrun "
                              "only `primekit train` and `primekit eval` are data-parallel")
        if args.command in OUTPUTS:
            _run_to_output(args)
            return 0
        from primekit.reward_models.cli import dispatch

        if dispatch(args):
            return 0
        from primekit.viz.cli import dispatch as dispatch_viz

        if dispatch_viz(args):
            return 0
        if args.command == "experiment":
            from primekit.experiment.cli import run as run_experiment

            return run_experiment(args, main)
        if args.command == "export":
            _export(args)
            return 0
        if args.command == "data":
            from primekit.data.check import run_check
            from primekit.verifiers.math import gold_problem

            return run_check(args.file, task=args.task, gold=gold_problem)
        if args.command == "demo":
            from primekit.demo import run_demo

            run_demo(Path(args.run_dir), args.overrides, args.prm_init)
            return 0
        cfg = load_config(resolve_config(args.config), args.overrides)
        if args.command in ("train", "eval"):
            # Data-parallel under torchrun: one process per device, joined here.
            from primekit import distributed as dist

            with dist.process_group_from_env():
                _run_distributed_command(args, cfg)
            return 0
        if args.command == "plan":
            from primekit.plan import run_plan

            run_plan(cfg, gpus=args.gpus, gpu_mem_gib=args.gpu_mem, prompt_len=args.prompt_len,
                     model_config=args.model_config)
            return 0
    except ConfigError as e:
        print(f"primekit: configuration error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as e:  # bad data rows, missing model directories, ...
        print(f"primekit: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the run's own failures that have a one-line message
        from primekit.trainer.outcomes import one_line_failure

        return one_line_failure(e, args)
    except Interrupted as e:  # SIGINT/SIGTERM in a command with nothing to resume
        from primekit.trainer.outcomes import one_line_failure

        return one_line_failure(e, args)
    except KeyboardInterrupt:  # Ctrl-C outside a training loop: nothing to save
        print("primekit: interrupted", file=sys.stderr)
        return 130
    return 0


# Commands whose one output directory is written at the end and holds nothing to resume.
OUTPUTS = {"sft": "sft.out_dir", "train-orm": "orm.out_dir", "train-prm": "step_prm.out_dir"}


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _run_to_output(args) -> None:
    """sft, train-orm, train-prm: own the output directory (a second writer is refused) and stop
    at once on SIGINT/SIGTERM, saying whether the output was written (it is replaced by a
    rename, so a new inode means a new output)."""
    from operator import attrgetter

    from primekit.trainer import rundir, signals

    cfg = load_config(resolve_config(args.config), args.overrides)
    field = OUTPUTS[args.command]
    out = Path(attrgetter(field)(cfg))
    before = _identity(out)
    from primekit.validate import check_output_inputs

    check_output_inputs(args.command, cfg)  # data files and models before the output is touched
    try:
        with rundir.owned_output(out, field), signals.stop_at_once():
            if args.command == "sft":
                from primekit.trainer.sft import run_sft

                print(run_sft(cfg))
            else:
                from primekit.reward_models.cli import dispatch

                dispatch(args)
    except signals.Interrupted as e:
        e.note = (f"{field} {str(out)!r} was written before the stop" if _identity(out) != before
                  else f"{field} {str(out)!r} is as it was (not written"
                       + (f"; the steps taken are logged in {str(out)}-logs"
                          if args.command == "sft" else "")
                       + f"); {args.command} has no resume: run it again")
        raise


def _run_distributed_command(args, cfg) -> None:
    if args.command == "train":
        from primekit.factory import build_rl_trainer
        from primekit.trainer import rundir, signals

        resume = args.resume or args.resume_anyway
        with rundir.owned(cfg, resume=resume, overwrite=args.overwrite,
                          resume_anyway=args.resume_anyway), signals.graceful_stop():
            trainer = build_rl_trainer(cfg, resume=resume)
            if args.overwrite:  # only now: config, data and models are validated and loaded
                rundir.empty_for_overwrite(cfg)
            trainer.train()
    else:
        from primekit.logging import print_table
        from primekit.trainer.eval import evaluate_checkpoint

        metrics = evaluate_checkpoint(cfg, args.model or cfg.model.policy)
        print_table(f"evaluation of {args.model or cfg.model.policy}",
                    [{"metric": k, "value": v} for k, v in metrics.items()])


def _export(args) -> None:
    from primekit.trainer import checkpoint as ckpt
    from primekit.trainer.rundir import write_errors

    run_dir = Path(args.run_dir)
    # The newest intact checkpoint (a damaged newer one is skipped with a warning); an asked-for
    # step is verified by export_checkpoint.
    path = (ckpt.intact_checkpoint(run_dir) if args.step is None
            else ckpt.checkpoint_dir(run_dir, args.step))
    if path is None or not path.is_dir():
        which = "no complete checkpoint" if args.step is None else f"no checkpoint of step {args.step}"
        raise FileNotFoundError(f"{which} under {run_dir / ckpt.CHECKPOINTS}")
    out = Path(args.out) if args.out else run_dir / "export" / path.name
    names = tuple(args.models) if args.models else None
    # A read-only or full --out: one line (the export is atomic: --out is as it was).
    with write_errors(out.parent, what=f"--out {out}", intact=f"{out} is as it was"):
        exported = ckpt.export_checkpoint(path, out, names)
    for name, where in exported.items():
        print(f"{name}: {where}")


if __name__ == "__main__":
    sys.exit(main())
