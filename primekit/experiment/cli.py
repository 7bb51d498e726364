"""`primekit experiment SPEC` and `primekit experiment --list` (docs/experiments/README.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from primekit.logging import console


def add_subcommand(sub) -> None:
    p = sub.add_parser("experiment", help="a named comparison (arms x seeds x task families) of "
                       "primekit train runs, resumable, with report.md, plots and a verdict")
    p.add_argument("spec", nargs="*", help="spec YAML file(s) or packaged spec name(s) (see "
                   "--list); several run one after the other, each with its report")
    p.add_argument("--all", action="store_true",
                   help="every packaged spec, one after the other (the whole evidence suite)")
    p.add_argument("--list", action="store_true",
                   help="the packaged specs (or the specs given), their claims and how many runs "
                   "have finished")
    p.add_argument("--out", default=None,
                   help="experiment directory (default: runs/experiments/<spec name>)")
    p.add_argument("--parallel", type=int, default=1,
                   help="runs side by side, each with train.threads = cores // N (default 1)")
    p.add_argument("--max-runs", type=int, default=None,
                   help="start at most this many unfinished runs, then report (a piece)")
    p.add_argument("--report-only", action="store_true",
                   help="write report.md and plots from the finished runs; start nothing")
    p.add_argument("--no-share", action="store_true",
                   help="train every run here, even one another experiment beside --out has "
                   "already finished with the same config and seed (default: link to it)")
    p.add_argument("--records", default=None, metavar="DIR",
                   help="run records: restore finished runs (same config, steps and input files) "
                   "and the spec's prepare models from DIR instead of training them, and record "
                   "every finished run there (docs/experiments/README.md, run records)")
    p.add_argument("--no-plots", action="store_true", help="report.md without the PNG plots")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)


def list_specs(records: Path | None = None, names: list[str] | None = None) -> list[str]:
    """One line per packaged spec (or per spec of `names`: files or packaged names): name, the
    claim, the paper's figure, arms x seeds x tasks, how many runs have finished in its default
    directory (runs/experiments/<name>, from here) and, with `records`, how many a run-record
    directory holds (by config and steps; whether their input files match is checked when they
    are restored)."""
    from primekit.experiment.runner import default_out_dir, progress, spec_record
    from primekit.experiment.spec import counted, load_spec, packaged_specs

    lines = []
    for name in names or packaged_specs():
        s = load_spec(name, check_runs=False)
        n = len(s.arms) * len(s.seeds) * len(s.tasks)
        paper = f" [{s.paper}]" if s.paper else ""
        out = default_out_dir(s)
        done = f"; {progress(s, out)[0]} finished in {out}" if (out / "runs").is_dir() else ""
        if records is not None:
            held = sum(spec_record(s, r.config(s), None, records) is not None for r in s.runs(out))
            done += f"; {held} in {records}"
        counts = " x ".join(counted(k, noun) for k, noun in
                            ((len(s.arms), "arm"), (len(s.seeds), "seed"), (len(s.tasks), "task")))
        lines.append(f"{s.name}: {s.claim}{paper} ({counts} = {counted(n, 'run')}{done})")
    return lines


def run(args, main=None) -> int:
    """`primekit experiment`; `main` is the CLI's entry, used for --in-process runs."""
    from primekit.experiment.report import write_report
    from primekit.experiment.runner import FINISHED, default_out_dir, progress, run_experiment
    from primekit.experiment.spec import SpecError, load_spec

    if args.list:
        for line in list_specs(Path(args.records) if args.records else None, list(args.spec)):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return 0
    names = list(args.spec)
    if args.all:
        from primekit.experiment.spec import packaged_specs

        names += [n for n in packaged_specs() if n not in names]
    if not names:
        raise SpecError("experiment: give a spec (a YAML file or a packaged name), --all or --list")
    if args.parallel < 1:
        raise SpecError(f"--parallel: expected at least 1, got {args.parallel}")
    if args.max_runs is not None and args.max_runs < 0:
        raise SpecError(f"--max-runs: expected at least 0, got {args.max_runs}")
    if args.out and len(names) > 1:
        raise SpecError("--out: one experiment directory per spec; give one spec with --out")
    specs = [load_spec(n) for n in names]  # every spec checked before anything runs
    failed = []
    for name, spec in zip(names, specs):
        out = Path(args.out) if args.out else default_out_dir(spec)
        if args.report_only and not (out / "runs").is_dir():
            if len(specs) > 1:
                console.print(f"{spec.name}: no runs in {out} yet; no report", markup=False,
                              highlight=False, soft_wrap=True)
                continue
            raise SpecError(f"--report-only: {out} holds no runs of this experiment; start it "
                            f"with primekit experiment {name}"
                            + (f" --out {out}" if args.out else ""))
        if not args.report_only:
            result = run_experiment(spec, out, parallel=args.parallel,
                                    in_process=main if args.in_process else None,
                                    max_runs=args.max_runs, share=not args.no_share,
                                    records=Path(args.records) if args.records else None)
            failed += [f"{spec.name}/{k}" for k, v in result.items() if v != FINISHED]
        report = write_report(spec, out, plots=not args.no_plots)
        done, total = progress(spec, out)
        console.print(f"report: {report}" + ("" if done == total else
                      f" (from {done} of {total} runs: its verdict may change as the rest finish)"),
                      markup=False, highlight=False, soft_wrap=True)
    if failed:
        console.print(f"{len(failed)} run(s) failed: {', '.join(failed)} (logs in each "
                      "experiment's logs/); run the same command again to retry them",
                      markup=False, highlight=False, soft_wrap=True)
        return 1
    return 0
