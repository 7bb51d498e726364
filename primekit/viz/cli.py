"""`primekit sim`, `primekit dashboard`, `primekit heatmap`, `primekit rerank`.

Settings live in primekit.config (`sim.*` for the toy model and its map, `viz.*` for the lights,
dashboard, heatmap and rerank, plus `prm.beta`, `rollout.*`, `data.*` for sampling and scoring);
every command takes `--config` and dotted overrides after its flags, like the others.
`primekit.cli` wires these in with `add_subcommands(sub)` and `dispatch(args)`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from primekit.config import packaged_configs

__all__ = ["COMMANDS", "add_subcommands", "dispatch"]

COMMANDS = ("sim", "dashboard", "heatmap", "rerank")


def _common(p: argparse.ArgumentParser, serve: bool) -> None:
    p.add_argument("--config", default=None,
                   help=f"YAML file or packaged name ({', '.join(packaged_configs())})")
    if serve:
        p.add_argument("--port", type=int, default=None, help="port (default viz.port; 0 = any)")
        p.add_argument("--no-browser", action="store_true", help="only print the URL")


def _models(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="policy checkpoint that samples the responses")
    p.add_argument("--prm", required=True, help="implicit PRM, a Hugging Face model directory "
                   "(a finished run's RUN/final/prm, or RUN/export/step_000160/prm from `primekit "
                   "export RUN`)")
    p.add_argument("--ref", default=None, help="reference model (default: the one --prm was "
                   "trained against where --prm is a run's final/prm or export/step_NNNNNN/prm, "
                   "from its checkpoint's config; else --model)")
    p.add_argument("--problems", type=_positive_int, default=None, help="held-out problems "
                   "(default viz.num_problems)")


def _positive_int(text: str) -> int:
    """--problems N: an integer of at least 1 (0 would silently mean the default, and a negative
    slice nearly the whole held-out set)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="the reward-hacking simulation on a local web page (toy PRIME)")
    _common(p, serve=True)
    p.add_argument("--map", action="store_true", help="first sweep beta x PRM update rate and "
                   "show the danger-zone map (PNG at sim.map_out)")
    p.add_argument("--live", metavar="RUN_DIR", default=None, help="attach the page to a real "
                   "run (`primekit train ... live.enabled=true`): its PRM toggle and shortcut "
                   "act on the run's models")
    p.add_argument("overrides", nargs="*", help="dotted overrides: sim.beta=0.3 ...")
    p = sub.add_parser("dashboard", help="follow runs' metrics.jsonl live: curves, the four "
                       "lights, timing, latest responses")
    _common(p, serve=True)
    p.add_argument("paths", nargs="+", metavar="RUN_DIR",
                   help="run directories (an argument with '=' is a dotted override)")
    p = sub.add_parser("heatmap", help="responses with every token coloured by its implicit "
                       "reward; HTML and PNG in viz.out_dir")
    _common(p, serve=False)
    _models(p)
    p.add_argument("overrides", nargs="*", help="dotted overrides")
    p = sub.add_parser("rerank", help="best-of-N with the implicit PRM vs majority, random, "
                       "oracle; table and plot in viz.out_dir")
    _common(p, serve=False)
    _models(p)
    p.add_argument("overrides", nargs="*", help="dotted overrides")


def dispatch(args: argparse.Namespace) -> bool:
    """Run args.command if it is one of ours; True if it was. ConfigError propagates."""
    if args.command not in COMMANDS:
        return False
    from primekit.config import ConfigError, load_config, resolve_config

    overrides = getattr(args, "overrides", None) or []
    if args.command == "dashboard":
        overrides = [a for a in args.paths if "=" in a and not Path(a).is_dir()]
        run_dirs = [Path(a) for a in args.paths if a not in overrides]
    cfg = load_config(resolve_config(args.config), overrides)
    port = cfg.viz.port if getattr(args, "port", None) is None else args.port
    if args.command == "sim" and args.live:
        from primekit.viz.live import run_live

        if args.map:
            raise ConfigError("--map draws the toy's map; it does not combine with --live")
        run_live(Path(args.live), cfg.viz, port=port, open_browser=not args.no_browser)
    elif args.command == "sim":
        from primekit.viz.simpage import run_sim

        run_sim(cfg.sim, cfg.viz, port=port, open_browser=not args.no_browser,
                with_map=args.map)
    elif args.command == "dashboard":
        from primekit.viz.dashboard import run_dashboard

        run_dashboard(run_dirs, cfg.viz, port=port, open_browser=not args.no_browser)
    else:
        from primekit.viz.heatmap import run_heatmap
        from primekit.viz.rerank import run_rerank

        run = run_heatmap if args.command == "heatmap" else run_rerank
        out = run(cfg, model=args.model, prm=args.prm, ref=args.ref,
                  num_problems=args.problems or cfg.viz.num_problems)
        if args.command == "heatmap":
            print("\n".join(str(p) for p in out))
    return True
