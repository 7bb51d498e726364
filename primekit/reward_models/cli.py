"""`primekit train-orm`, `primekit train-prm`, `primekit hack-check`.

Each takes `--config` and dotted overrides like the other commands (the config supplies the model,
data, sampling and explicit-reward settings); options that are not RL configuration are flags.
`primekit.cli` wires these in with `add_subcommands(sub)` and `dispatch(args)`.
"""

from __future__ import annotations

import argparse

__all__ = ["COMMANDS", "add_subcommands", "dispatch"]

COMMANDS = ("train-orm", "train-prm", "hack-check")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", default=None, help="YAML file or packaged name (tiny-explicit, tiny)"
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides: section.field=value")


def _add_sampling(
    p: argparse.ArgumentParser,
    problems: int,
    samples: int,
    eval_problems: int,
    epochs: int,
    lr: float,
) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="model that samples the responses and initialises the reward model "
        "(default: model.policy, the SFT checkpoint)",
    )
    p.add_argument("--num-problems", type=int, default=problems, help="training problems sampled")
    p.add_argument("--samples", type=int, default=samples, help="responses sampled per problem")
    p.add_argument(
        "--eval-problems",
        type=int,
        default=eval_problems,
        help="held-out problems sampled for the accuracy report",
    )
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--batch-size", type=int, default=64, help="responses per optimiser step")
    p.add_argument("--seed", type=int, default=0)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Add train-orm, train-prm and hack-check to the `primekit` sub-parsers."""
    p = sub.add_parser("train-orm", help="sample, label with the verifier, train an outcome RM")
    _add_common(p)
    _add_sampling(p, problems=512, samples=4, eval_problems=100, epochs=3, lr=3e-4)
    p.add_argument("--out-dir", default="runs/explicit/orm", help="where the ORM is saved")
    p.add_argument(
        "--target",
        choices=("full", "last"),
        default="full",
        help="BCE on every response token (full) or on the last token only",
    )
    p.add_argument(
        "--all-groups",
        action="store_true",
        help="train on every problem, not only those with both correct and wrong samples",
    )

    p = sub.add_parser(
        "train-prm", help="sample, label steps by Monte-Carlo completion, train a step-level PRM"
    )
    _add_common(p)
    _add_sampling(p, problems=192, samples=2, eval_problems=48, epochs=6, lr=3e-4)
    p.add_argument("--out-dir", default="runs/explicit/prm", help="where the PRM is saved")
    p.add_argument(
        "--completer",
        default=None,
        help="model that completes step prefixes (default: the sampling model)",
    )
    p.add_argument(
        "--completions",
        type=int,
        default=8,
        help="completions per step prefix (N; Gao et al. and Math-Shepherd: 8)",
    )
    p.add_argument(
        "--label",
        choices=("hard", "soft"),
        default="hard",
        help="hard: 1 if any completion is correct (paper); soft: fraction correct",
    )

    p = sub.add_parser(
        "hack-check",
        help="returns of PR, Clip, Delta, ... on synthetic repetitions "
        "of correct responses (Gao et al. App. C)",
    )
    _add_common(p)
    p.add_argument("--prm", default=None, help="step-level PRM (default: explicit.prm)")
    p.add_argument(
        "--out-dir",
        default="runs/explicit/hack-check",
        help="where hack_check.json and hack_check.png go",
    )
    p.add_argument("--num-responses", type=int, default=32, help="correct responses to vary")
    p.add_argument("--max-repeats", type=int, default=8, help="variants with 1..R repetitions")
    p.add_argument(
        "--source",
        choices=("demos", "sampled"),
        default="demos",
        help="held-out demonstrations, or correct samples of model.policy",
    )
    p.add_argument(
        "--separator",
        default=None,
        help="text ending an inserted step (default: explicit.step_delimiter)",
    )
    p.add_argument("--seed", type=int, default=0)


def _print_summary(title: str, summary: dict) -> None:
    from primekit.logging import print_table

    print_table(title, [{"metric": k, "value": v} for k, v in summary.items()])


def dispatch(args: argparse.Namespace) -> bool:
    """Run args.command if it is one of ours; True if it was. ConfigError propagates."""
    if args.command not in COMMANDS:
        return False
    from primekit.cli import resolve_config
    from primekit.config import load_config

    cfg = load_config(resolve_config(args.config), args.overrides)
    if args.command == "train-orm":
        from primekit.reward_models.orm import train_orm

        summary = train_orm(
            cfg,
            out_dir=args.out_dir,
            model_path=args.model,
            num_problems=args.num_problems,
            samples=args.samples,
            eval_problems=args.eval_problems,
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            target=args.target,
            mixed_only=not args.all_groups,
            seed=args.seed,
        )
        _print_summary("train-orm", summary)
    elif args.command == "train-prm":
        from primekit.reward_models.prm import train_prm

        summary = train_prm(
            cfg,
            out_dir=args.out_dir,
            model_path=args.model,
            completer_path=args.completer,
            num_problems=args.num_problems,
            samples=args.samples,
            n_completions=args.completions,
            eval_problems=args.eval_problems,
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            label=args.label,
            seed=args.seed,
        )
        _print_summary("train-prm", summary)
    else:
        from primekit.reward_models.hack_check import hack_check

        hack_check(
            cfg,
            out_dir=args.out_dir,
            prm_path=args.prm,
            num_responses=args.num_responses,
            max_repeats=args.max_repeats,
            source=args.source,
            separator=args.separator,
            seed=args.seed,
        )
    return True
