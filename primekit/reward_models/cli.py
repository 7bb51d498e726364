"""`primekit train-orm`, `primekit train-prm`, `primekit hack-check`.

Each takes `--config` and dotted overrides like the other commands, and nothing else: every
setting, default included, lives in primekit.config (the `orm`, `step_prm` and `hack_check`
sections, plus the model, data, rollout, verifier and explicit sections they share with RL).
`primekit.cli` wires these in with `add_subcommands(sub)` and `dispatch(args)`.
"""

from __future__ import annotations

import argparse

from primekit.config import packaged_configs

__all__ = ["COMMANDS", "add_subcommands", "dispatch"]

COMMANDS = ("train-orm", "train-prm", "hack-check")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None,
                   help=f"YAML file or packaged name ({', '.join(packaged_configs())})")
    p.add_argument("overrides", nargs="*", help="dotted overrides: section.field=value")


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Add train-orm, train-prm and hack-check to the `primekit` sub-parsers."""
    p = sub.add_parser(
        "train-orm",
        help="sample, label with the verifier, train an outcome RM (settings: orm.*)",
    )
    _add_common(p)
    p = sub.add_parser(
        "train-prm",
        help="sample, label steps by Monte-Carlo completion, train a step-level PRM "
        "(settings: step_prm.*)",
    )
    _add_common(p)
    p = sub.add_parser(
        "hack-check",
        help="returns of PR, Clip, Delta, ... on synthetic repetitions of correct responses "
        "(Gao et al. App. C; settings: hack_check.*, the PRM at explicit.model_path)",
    )
    _add_common(p)


def _print_summary(title: str, summary: dict) -> None:
    from primekit.logging import print_table

    print_table(title, [{"metric": k, "value": v} for k, v in summary.items()])


def dispatch(args: argparse.Namespace) -> bool:
    """Run args.command if it is one of ours; True if it was. ConfigError propagates."""
    if args.command not in COMMANDS:
        return False
    from primekit.config import load_config, resolve_config

    cfg = load_config(resolve_config(args.config), args.overrides)
    if args.command == "train-orm":
        from primekit.reward_models.orm import train_orm

        _print_summary("train-orm", train_orm(cfg))
    elif args.command == "train-prm":
        from primekit.reward_models.prm import train_prm

        _print_summary("train-prm", train_prm(cfg))
    else:
        from primekit.reward_models.hack_check import hack_check

        hack_check(cfg)
    return True
