"""Run an experiment: every (task, arm, seed) of a spec as an ordinary `primekit train` run.

Layout of an experiment directory (default `runs/experiments/<spec name>`):

    spec.yaml                 the spec as it was last run (a copy)
    logs/prepare-<i>.log      the spec's `prepare` commands (models the runs need), if any ran
    .lock                     held while an experiment process runs here (a second is refused)
    sft/<task>/               the SFT model of each task family (spec key `sft`), if any
    runs/<task>--<arm>--s<seed>/   one ordinary run directory each (metrics.jsonl, checkpoints/,
                              final/)
    logs/<run id>.log         each run's own output, appended per attempt
    attempts.jsonl            one line per attempt: run, exit status, seconds, how it started
    report.md, plots/         written after the runs (primekit.experiment.report)

A run is finished when its own final files say so (`run_state`): its newest complete checkpoint is
at `train.steps`, its metrics.jsonl holds the final evaluation at that step, and `final/` exists
(with `train.export_final`). Finished runs are never started again; a run with a checkpoint
continues with `primekit train --resume` (the trainer's own config check refuses a spec that
changed the experiment); a run directory without a checkpoint is started again with
`--overwrite` (there is nothing in it to keep).

Each run is a subprocess (`python -m primekit.cli train ...`, in its own session): a crash, an
out-of-memory kill or a hung run takes down that run only, and the next runs go on. A first
SIGINT/SIGTERM to the experiment forwards one SIGINT to each running run (the trainer then saves a
checkpoint at the end of its step and exits), waits for them, and stops; run the same command
again to continue. If the experiment process is killed outright, each run gets that SIGINT from
the kernel (Linux: PR_SET_PDEATHSIG), so no orphaned run keeps its run directory locked. `in_process=main` calls the given CLI entry (`primekit.cli.main`, handed in by
the caller: this package does not import the CLI that imports it) in this process instead: no
isolation and no parallel runs; the tests use it to skip a ~10 s Python start per run.

Shared runs. Many specs have an arm that is the base config itself (PRIME with the tiny config at
100 steps is the `single` arm of forward-and-reference, the `sum` arm of hacking-remedies-implicit,
the `sft-init` arm of prm-init, ...). Before starting a run from nothing, the runner looks for a
finished run in the other experiment directories beside `out_dir` (`<out_dir>/../*/runs/*`) whose
stored config is the same in every field but where it lives and how it was run (`NOT_THE_RUN`:
run directory, threads, checkpoint cadence, loggers, verifier workers, micro-batch layout), that
finished at the same `train.steps` and that logs the metrics this spec's verdicts read of it. If
it finds one,
`runs/<run id>` becomes a symbolic link to it (one `"how": "shared"` line in attempts.jsonl) and
nothing is trained. A run from an older primekit matches only if every field added since is at
its default (`same_run`). A shared run that this spec wants continued (a larger `train.steps`)
is first copied, so the other experiment's run is never changed. A run is linked only if it
started from the same model and data files (the input fingerprints its checkpoint stores).
`share=False` (`--no-share`, or `share: false` in the spec) turns this off: every run is trained
here. Fields of NOT_THE_RUN that change the arithmetic and that the spec's arms set
(`Spec.strict`: the layout, in packed-layout) must match as well.

Run records (`records`, `--records DIR`; primekit.experiment.records): runs and `prepare` models
restored from a directory that outlives this machine instead of being trained, and every finished
run recorded there. A run not yet started is looked for in that order: this spec's own records
(so a report rebuilt from records reads the runs it recorded, even beside an experiment that
has since finished the same config: packed-layout's packed PRIME runs are prime-vs-rloo's PRIME
arm today, but prime-vs-rloo recorded padded ones), a shared run beside `out_dir`, then any other
spec's records.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from primekit.config import Config, ConfigError
from primekit.experiment.records import (
    copy_tree,
    find_record,
    model_copy,
    nothing_trained,
    record_path,
    restore,
    restored,
    same_run,
    write_record,
)
from primekit.experiment.spec import Run, Spec, SpecError, counted, sft_dir
from primekit.logging import console

FINISHED, RESUME, RESTART, FRESH = "finished", "resume", "restart", "fresh"


def default_out_dir(spec: Spec) -> Path:
    return Path("runs") / "experiments" / spec.name


def _trainer_state(run_dir: Path) -> dict | None:
    """trainer_state.json of the newest complete checkpoint (step, config, inputs, ...), or None."""
    from primekit.trainer import checkpoint as ckpt

    path = ckpt.latest_checkpoint(run_dir)
    if path is None:
        return None
    try:
        return json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None


def _checkpoint_step(run_dir: Path) -> tuple[int | None, dict | None]:
    """(step, stored config) of the newest complete checkpoint; (None, None) without one."""
    state = _trainer_state(run_dir)
    if state is None:
        return None, None
    return int(state.get("step", -1)), state.get("config")


def final_eval_step(run_dir: Path) -> int | None:
    """The step of the last metrics.jsonl line that holds an evaluation (eval/ keys), or None."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    last = None
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut by a crash
            continue
        if any(k.startswith("eval/") for k in row):
            last = int(row["step"])
    return last


def stored_run(run_dir: Path) -> tuple[int | None, dict | None]:
    """(step, config) of a run directory: its newest complete checkpoint's, or, for a run restored
    from a run record (primekit.experiment.records), the record's; (None, None) without either."""
    head = restored(run_dir)
    if head is not None:
        return head.get("steps"), head.get("config")
    return _checkpoint_step(run_dir)


def run_state(run_dir: Path, cfg: Config) -> str:
    """FINISHED, RESUME (a checkpoint to continue), RESTART (files but no checkpoint) or FRESH.
    A run restored from a record is FINISHED at the record's steps (it has no checkpoint)."""
    steps = cfg.train.steps
    head = restored(run_dir)
    if head is not None:
        return FINISHED if (head.get("steps") == steps
                            and final_eval_step(run_dir) == steps) else RESTART
    step, _ = _checkpoint_step(run_dir)
    if (step == steps and final_eval_step(run_dir) == steps
            and (not cfg.train.export_final or (run_dir / "final").is_dir())):
        return FINISHED
    if step is not None:
        return RESUME
    contents = [p for p in run_dir.iterdir() if p.name != ".lock"] if run_dir.is_dir() else []
    return RESTART if contents else FRESH


def _logged_keys(run_dir: Path) -> set[str]:
    from primekit.experiment.runlog import read_run

    log = read_run(run_dir)
    return set(log.series) if log is not None else set()


def _stored_inputs(run_dir: Path) -> dict | None:
    """The input fingerprints a run started from (checkpoint or record), None if not stored."""
    state = restored(run_dir) or _trainer_state(run_dir) or {}
    return state.get("inputs")


def find_shared(cfg: Config, out_dir: Path, needs: frozenset[str] = frozenset(),
                inputs: Callable[[], dict] | None = None,
                strict: tuple[str, ...] = ()) -> Path | None:
    """A finished run of another experiment beside `out_dir` that is this run (`same_run`),
    started from the same model and data files (`inputs()`, `rundir.input_fingerprint(cfg)`,
    hashed only when a candidate gets that far; a run that stored none is not checked) and that
    logs every metric in `needs` (what this spec's verdicts read of it: a run trained before a
    metric existed is not linked), or None. `strict`: fields of NOT_THE_RUN that must match too
    (`Spec.strict`). Only real directories are candidates (never another
    experiment's link)."""
    here = out_dir.resolve()
    for exp in sorted(p for p in out_dir.resolve().parent.iterdir() if p.is_dir()):
        if exp == here or not (exp / "runs").is_dir():
            continue
        for cand in sorted((exp / "runs").iterdir()):
            if cand.is_symlink() or not cand.is_dir():
                continue
            step, saved = stored_run(cand)
            if (step == cfg.train.steps and saved is not None and same_run(saved, cfg, strict)
                    and run_state(cand, cfg) == FINISHED and needs <= _logged_keys(cand)
                    and (inputs is None or _stored_inputs(cand) in (None, inputs()))):
                return cand
    return None


def _unshare(run_dir: Path) -> None:
    """A linked run this experiment must change: replace the link by a copy of what it points
    at (a dangling link by nothing)."""
    target = run_dir.resolve()
    run_dir.unlink()
    if target.is_dir():
        tmp = run_dir.with_name(run_dir.name + ".copying")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(target, tmp, symlinks=True)
        tmp.rename(run_dir)


def progress(spec: Spec, out_dir: Path) -> tuple[int, int]:
    """(finished runs, all runs) of `spec` in `out_dir` (links to shared runs count)."""
    runs = spec.runs(out_dir)
    done = sum(run_state(r.run_dir, r.config(spec)) == FINISHED for r in runs
               if r.run_dir.exists())
    return done, len(runs)


def check_finished_config(run: Run, cfg: Config) -> None:
    """A finished (or resumable) run must have been trained with this spec's config for it, up
    to the fields a resume may change other than the evaluation's: a run left by an edited spec
    is refused, not silently reused, and its evaluations are the ones the report says."""
    from primekit.trainer.rundir import config_changes

    _, saved = stored_run(run.run_dir)
    if saved is None:
        return
    refused, allowed = config_changes(saved, cfg.to_dict())
    refused += [change for change in allowed if change.startswith("eval.")]
    if refused:
        raise SpecError(f"run {run.run_id}: {run.run_dir} was trained with another config than "
                        f"the spec now gives ({'; '.join(refused[:3])}); give a new --out or "
                        f"delete that run directory")


@dataclass
class Launch:
    """One started attempt of a run (or of a task family's SFT)."""

    name: str
    argv: list[str]  # primekit CLI arguments
    log: Path
    how: str  # FRESH / RESUME / RESTART / "sft"
    start: float = 0.0
    proc: subprocess.Popen | None = None
    rc: int | None = None


def train_argv(spec: Spec, run: Run, how: str, threads: int | None) -> list[str]:
    argv = ["train"]
    base = spec.base_path()
    if base is not None:
        argv += ["--config", str(base)]
    argv += {RESUME: ["--resume"], RESTART: ["--overwrite"]}.get(how, [])
    extra = [f"train.threads={threads}"] if threads is not None else []
    return argv + run.overrides + extra


InProcess = Callable[[list[str]], int] | None  # primekit.cli.main, or None for subprocesses


def _start(launch: Launch, in_process: InProcess) -> None:
    launch.log.parent.mkdir(parents=True, exist_ok=True)
    launch.start = time.time()
    header = (f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {launch.how}: primekit "
              f"{' '.join(launch.argv)}\n")
    with open(launch.log, "a", encoding="utf-8") as f:
        f.write(header)
    if in_process is not None:
        try:
            launch.rc = in_process(list(launch.argv))
        except Exception:  # a crash of this run only: its traceback goes to its log
            import traceback

            with open(launch.log, "a", encoding="utf-8") as f:
                f.write(traceback.format_exc())
            launch.rc = 1
        return
    log = open(launch.log, "a", encoding="utf-8")  # noqa: SIM115 (the child holds it)
    code = "import sys; from primekit.cli import main; sys.exit(main())"
    launch.proc = subprocess.Popen([sys.executable, "-c", code, *launch.argv], stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True,  # our Ctrl-C is forwarded, once
                                   preexec_fn=_stop_with_parent)
    log.close()


def _stop_with_parent() -> None:
    """In the child, before it runs: SIGINT when the experiment process dies (even by SIGKILL),
    so an orphaned run checkpoints and exits instead of holding its run directory (Linux
    prctl(PR_SET_PDEATHSIG); elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    import contextlib
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGINT)  # 1 = PR_SET_PDEATHSIG


def latest_step(run_dir: Path) -> int | None:
    """The step of the last complete line of `run_dir`/metrics.jsonl (read from its end), or None."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):  # a line cut by a crash, or by the 64 KiB window
            continue
    return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("-inf")


@dataclass
class Running:
    """What the display knows of a started run: where it logs, how far it must go, from where."""

    run_dir: Path
    steps: int  # train.steps
    first: int  # its step when this attempt started (a resumed run's checkpoint)
    start: float  # time.time() at launch


class Display:
    """Runs done / running / left, failures, each running run's step and an ETA: a rich bar on a
    terminal, plain lines otherwise (and in-process, where the trainer prints its own bar).
    `tick()` refreshes the running runs' steps every `every` seconds (a plain line each time when
    not on a terminal)."""

    def __init__(self, total: int, done: int, parallel: int, live: bool,
                 every: float | None = None):
        self.total, self.done, self.parallel = total, done, parallel
        self.failed = 0
        self.durations: list[float] = []
        self.active: dict[str, Running] = {}  # the running runs, in the order they started
        self.every = every if every is not None else (10.0 if live else 600.0)
        self._last_tick = time.time()
        self._bar = None
        if live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(TextColumn("experiment"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), console=console)
            self._task = self._bar.add_task("runs", total=total, completed=done, info="")
            self._bar.start()

    @property
    def running(self) -> list[str]:
        return list(self.active)

    def started(self, run_id: str, run: Running) -> None:
        self.active[run_id] = run

    def ended(self, run_id: str, seconds: float | None = None) -> None:
        """`run_id` stopped; `seconds`: it finished, in that long (a resumed attempt's time
        scaled to its whole `train.steps`, the mean length of a run for the ETA)."""
        r = self.active.pop(run_id, None)
        if seconds is not None:
            if r is not None and 0 < r.first < r.steps:
                seconds *= r.steps / (r.steps - r.first)
            self.durations.append(seconds)

    def _rates(self, now: float) -> dict[str, tuple[int, float]]:
        """run id -> (its step, seconds per step this attempt) for running runs past their first
        step of this attempt (the rate includes the attempt's start-up). A metrics.jsonl not
        written since the launch is the last attempt's: a resumed run drops the steps that attempt
        logged after its checkpoint only once it has started."""
        rates = {}
        for run_id, r in self.active.items():
            if _mtime(r.run_dir / "metrics.jsonl") < r.start:
                continue
            step = latest_step(r.run_dir)
            if step is not None and step > r.first:
                rates[run_id] = (step, (now - r.start) / (step - r.first))
        return rates

    def eta(self, now: float | None = None) -> str:
        """Seconds of work left over `parallel` slots: each running run's steps left at its own
        rate so far, and each run not started at the mean length of a run (finished this
        session, or running runs extrapolated to their full length)."""
        from primekit.logging import _fmt_duration

        now = time.time() if now is None else now
        rates = self._rates(now)
        whole = list(self.durations) + [self.active[i].steps * rate
                                        for i, (_, rate) in rates.items()]
        if not whole:
            return "?"
        per_run = sum(whole) / len(whole)
        work = 0.0
        for run_id in self.running:
            if run_id in rates:
                step, rate = rates[run_id]
                work += max(0, self.active[run_id].steps - step) * rate
            else:
                work += 0.5 * per_run  # no step of this attempt yet
        left = self.total - self.done - self.failed - len(self.running)
        work += max(0, left) * per_run
        return _fmt_duration(work / max(1, min(self.parallel, left + len(self.running))))

    def steps(self) -> str:
        """`run step/steps` of each running run (its step once its metrics.jsonl has one)."""
        parts = []
        for run_id, r in self.active.items():
            step = latest_step(r.run_dir)
            parts.append(f"{run_id} {'-' if step is None else step}/{r.steps}")
        return ", ".join(parts)

    def info(self, now: float | None = None) -> str:
        left = self.total - self.done - self.failed - len(self.running)
        failed = f" · failed {self.failed}" if self.failed else ""
        return (f"done {self.done} · running {len(self.running)} · left {left}{failed} · "
                f"eta {self.eta(now)}")

    def tick(self, now: float | None = None) -> None:
        """Every `every` seconds while runs are running: the bar's steps and ETA refreshed, or
        one plain line with them."""
        now = time.time() if now is None else now
        if not self.running or now - self._last_tick < self.every:
            return
        self._last_tick = now
        if self._bar is not None:
            self._bar.update(self._task, info=f"{self.info(now)} · {self.steps()}")
        else:
            console.print(f"progress: {self.steps()} [{self.done}/{self.total}; {self.info(now)}]",
                          markup=False, highlight=False, soft_wrap=True)

    def event(self, text: str) -> None:
        self._last_tick = time.time()
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, info=self.info())
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            console.print(f"{text} [{self.done}/{self.total}; {self.info()}]", markup=False,
                          highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def threads_per_run(parallel: int, cores: int | None = None) -> int | None:
    """train.threads for `parallel` runs side by side: cores // parallel (at least 1); None
    (the config's own) for one run at a time."""
    if parallel <= 1:
        return None
    return max(1, (cores or os.cpu_count() or 1) // parallel)


def run_experiment(spec: Spec, out_dir: Path, *, parallel: int = 1, in_process: InProcess = None,
                   max_runs: int | None = None, share: bool = True, records: Path | None = None,
                   on_launch: Callable[[Launch], None] | None = None) -> dict[str, str]:
    """Run what is left of `spec` in `out_dir`; returns run id -> FINISHED or "failed (rc N)".

    `max_runs` stops after starting that many runs (a piece of a long experiment); `share` links
    runs that another experiment beside `out_dir` already finished (module docstring); `records`
    is a run-record directory to restore runs and `prepare` models from and to record finished
    runs in (primekit.experiment.records); `on_launch` is called with each launch before it
    starts (the tests count launches with it)."""
    from primekit.trainer.rundir import lock

    if in_process is not None and parallel > 1:
        raise SpecError("--parallel: runs side by side need subprocesses (not --in-process)")
    out_dir.mkdir(parents=True, exist_ok=True)
    with lock(out_dir, "experiment --out"):
        copy = out_dir / "spec.yaml"
        if spec.path is not None and not (copy.exists() and copy.samefile(spec.path)):
            shutil.copyfile(spec.path, copy)
        _run_prepare(spec, out_dir, in_process, on_launch, records)
        _run_sft(spec, out_dir, in_process, on_launch)
        runs = spec.runs(out_dir)
        configs = {r.run_id: r.config(spec) for r in runs}
        for r in runs:
            if r.run_dir.is_symlink() and (not r.run_dir.exists() or run_state(
                    r.run_dir, configs[r.run_id]) != FINISHED):
                _unshare(r.run_dir)
            if restored(r.run_dir) is not None and run_state(
                    r.run_dir, configs[r.run_id]) != FINISHED:
                shutil.rmtree(r.run_dir)  # a record's copy for other steps: nothing trained here
        states = {r.run_id: run_state(r.run_dir, configs[r.run_id]) for r in runs}
        # This spec's own records before any other experiment's run: a report rebuilt from
        # records reads the runs it recorded, whatever finished beside it since.
        if records is not None:
            _restore_records(spec, out_dir, runs, configs, states, records, own=True)
        if share and spec.share:
            _share(spec, out_dir, runs, configs, states)
        if records is not None:
            _restore_records(spec, out_dir, runs, configs, states, records)
        for r in runs:
            if states[r.run_id] in (FINISHED, RESUME):
                check_finished_config(r, configs[r.run_id])
        todo = [r for r in runs if states[r.run_id] != FINISHED]
        if max_runs is not None:
            todo = todo[:max_runs]
        check_model_paths(todo, configs, out_dir)
        result = {r.run_id: FINISHED for r in runs if states[r.run_id] == FINISHED}
        display = Display(len(runs), len(result), parallel,
                          live=console.is_terminal and in_process is None)
        shape = " x ".join((counted(len(spec.tasks), "task family", "task families"),
                            counted(len(spec.arms), "arm"), counted(len(spec.seeds), "seed")))
        display.event(f"experiment {spec.name}: {counted(len(runs), 'run')} ({shape}), "
                      f"{len(result)} already finished, in {out_dir}")
        try:
            _loop(spec, out_dir, todo, states, result, display, parallel, in_process, on_launch,
                  (lambda run: _save_records(spec, [run], configs, records)) if records else None)
        finally:
            display.close()
            if records is not None:
                _save_records(spec, runs, configs, records)
        return result


def check_model_paths(todo: list[Run], configs: dict[str, Config], out_dir: Path) -> None:
    """Refuse, before any run starts, a run to train whose models are neither local model
    directories (after the spec's `prepare` steps) nor hub ids that are cached or that the hub
    confirms: otherwise every run of that task or arm would fail one by one, each after the runs
    before it trained. Paths under `out_dir` may be made by the experiment's own runs and are
    left to the run. Relative paths are relative to the directory primekit runs in."""
    from primekit.validate import check_model_dir, model_roles, role_kind

    out = out_dir.resolve()
    checked = set()
    for run in todo:
        cfg = configs[run.run_id]
        for field, path in {"model.policy": cfg.model.policy, **model_roles(cfg)}.items():
            if (path is None or (field, path) in checked
                    or out in Path(path).expanduser().resolve().parents):
                continue
            checked.add((field, path))
            try:
                check_model_dir(path, field, kind=role_kind(cfg, field))
            except ConfigError as e:
                raise SpecError(f"run {run.run_id}: {e} (nothing was started; a `prepare` step "
                                "of the spec can make it)") from None


class _Fingerprints:
    """`rundir.input_fingerprint` of each run's config, hashed once per set of input paths."""

    def __init__(self):
        self._done: dict[str, dict] = {}

    def __call__(self, cfg: Config) -> dict:
        from primekit.trainer.rundir import _fingerprint_fields, input_fingerprint

        where = json.dumps(_fingerprint_fields(cfg), sort_keys=True)
        if where not in self._done:
            self._done[where] = input_fingerprint(cfg)
        return self._done[where]


def _needs(spec: Spec, run: Run) -> frozenset[str]:
    """The metrics this spec's verdicts read of `run`'s arm."""
    return frozenset(v.metric for v in spec.verdicts if any(run.arm in pair for pair in v.compare))


def unlogged_metric(spec: Spec, run: Run) -> tuple[str, bool] | None:
    """A metric a verdict reads of `run`'s arm that the finished `run` never logged: (message,
    whether it is a typo: a logged key is close to it). A typo stops the experiment before it
    trains the rest for a verdict that cannot be computed; another metric may be logged only by
    some runs (a rare event), so it is a warning."""
    import difflib

    logged = _logged_keys(run.run_dir)
    for metric in sorted(_needs(spec, run) - logged):
        close = difflib.get_close_matches(metric, sorted(logged), n=1, cutoff=0.8)
        if close:
            return (f"verdict metric {metric!r}: run {run.run_id} logs no such metric; did you "
                    f"mean {close[0]!r}? (docs/metrics.md lists them)", True)
        return (f"warning: verdict metric {metric!r}: finished run {run.run_id} never logged it; "
                f"its verdict will be inconclusive unless other runs do (docs/metrics.md)", False)
    return None


def _share(spec: Spec, out_dir: Path, runs: list[Run], configs: dict[str, Config],
           states: dict[str, str]) -> None:
    """Link each run not yet started to the same run finished by another experiment."""
    inputs = _Fingerprints()
    for r in runs:
        if states[r.run_id] != FRESH:
            continue
        cfg = configs[r.run_id]
        found = find_shared(cfg, out_dir, _needs(spec, r), lambda cfg=cfg: inputs(cfg),
                            spec.strict)
        if found is None:
            continue
        if r.run_dir.is_dir():  # FRESH: at most an empty directory (or a stale .lock)
            shutil.rmtree(r.run_dir)
        r.run_dir.parent.mkdir(parents=True, exist_ok=True)
        r.run_dir.symlink_to(os.path.relpath(found, r.run_dir.parent.resolve()))
        states[r.run_id] = FINISHED
        row = {"run": r.run_id, "how": "shared", "rc": 0, "seconds": 0.0,
               "from": str(found), "end": round(time.time(), 1)}
        with open(out_dir / "attempts.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def spec_record(spec: Spec, cfg: Config, inputs: dict | None, records: Path,
                needs: frozenset[str] = frozenset(), own: bool = False) -> Path | None:
    """`records.find_record` for a run of `spec`: with the fields its arms vary (`Spec.strict`),
    its own records first, and only those when it does not share (`Spec.share`) or `own`."""
    return find_record(cfg, inputs, records, needs, strict=spec.strict, spec=spec.name,
                       only=own or not spec.share)


def _restore_records(spec: Spec, out_dir: Path, runs: list[Run], configs: dict[str, Config],
                     states: dict[str, str], records: Path, own: bool = False) -> None:
    """Restore each run not yet started from a record of the same run (`records.find_record`:
    same config, steps and input files; with `own`, only this spec's records), one
    `"how": "record"` line in attempts.jsonl each. A run directory where nothing was trained but
    a `prepare` step restored a model (`records.nothing_trained`) counts as not yet started."""
    inputs = _Fingerprints()
    for r in runs:
        if not (states[r.run_id] == FRESH
                or (states[r.run_id] == RESTART and nothing_trained(r.run_dir))):
            continue
        found = spec_record(spec, configs[r.run_id], inputs(configs[r.run_id]), records,
                            _needs(spec, r), own)
        if found is None:
            continue
        head = restore(found, r.run_dir)
        states[r.run_id] = FINISHED
        row = {"run": r.run_id, "how": "record", "rc": 0, "seconds": 0.0, "from": str(found),
               "machine": head.get("machine"), "end": round(time.time(), 1)}
        with open(out_dir / "attempts.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def _run_machines(run_dir: Path) -> str:
    """The machine(s) a run trained on, from its own experiment's attempts.jsonl (the one it lives
    in, when it is another experiment's run linked here); this machine if none is recorded."""
    real = run_dir.resolve()
    path = real.parent.parent / "attempts.jsonl"
    seen = set()
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("run") == real.name and row.get("machine") and row.get("how") not in (
                    "shared", "record"):
                seen.add(row["machine"])
    return " and ".join(sorted(seen)) or machine()


def _save_records(spec: Spec, runs: list[Run], configs: dict[str, Config], records: Path) -> None:
    """Record every finished, trained run of `spec` that no record in `records` holds yet."""
    for r in runs:
        cfg = configs[r.run_id]
        if (not r.run_dir.is_dir() or restored(r.run_dir) is not None
                or run_state(r.run_dir, cfg) != FINISHED):
            continue
        state = _trainer_state(r.run_dir) or {}
        inputs = state.get("inputs") or {}
        if spec_record(spec, cfg, inputs, records) is not None:
            continue  # recorded already (perhaps by another spec sharing the run)
        path = write_record(r.run_dir, record_path(records, spec.name, r.run_id), {
            "run": r.run_id, "spec": spec.name, "steps": cfg.train.steps,
            "config": state.get("config"), "inputs": inputs, "machine": _run_machines(r.run_dir)})
        console.print(f"recorded {r.run_id}: {path}", markup=False, highlight=False,
                      soft_wrap=True)


MODEL_COPY_MAX_BYTES = 256 << 20  # larger prepare models are not copied into a records directory


def _prepare_models(step, records: Path | None) -> None:
    """Before a prepare step: restore its model from `records` when it is missing here."""
    copy = model_copy(records, step.creates) if records is not None else None
    if copy is None or step.done() or not (copy.is_dir() and any(copy.iterdir())):
        return
    copy_tree(copy, Path(step.creates))
    console.print(f"experiment: prepare {step.creates}: restored from {copy}", markup=False,
                  soft_wrap=True)


def _keep_model(step, records: Path | None) -> None:
    """After a prepare step: copy its model into `records` if none is kept there yet; say so when
    the one here differs from the kept one (records of runs from the kept model then never match
    runs from this one)."""
    from primekit.trainer.rundir import tree_fingerprint

    copy = model_copy(records, step.creates) if records is not None else None
    here = Path(step.creates)
    if copy is None or not here.is_dir():
        return
    if copy.is_dir() and any(copy.iterdir()):
        if tree_fingerprint(copy) != tree_fingerprint(here):
            console.print(f"experiment: prepare {step.creates} differs from its copy in {copy}: "
                          f"run records made from that copy will not be restored: their runs are "
                          f"trained here, or with --max-runs 0 left out of the report (delete "
                          f"{step.creates} to use the copy)", markup=False, soft_wrap=True)
        return
    size = sum(p.stat().st_size for p in here.rglob("*") if p.is_file())
    if size > MODEL_COPY_MAX_BYTES:
        console.print(f"experiment: prepare {step.creates} ({size / 2**20:.0f} MiB) is not copied "
                      f"into {records} (more than {MODEL_COPY_MAX_BYTES >> 20} MiB)", markup=False,
                      soft_wrap=True)
        return
    copy_tree(here, copy)
    console.print(f"experiment: prepare {step.creates}: kept in {copy}", markup=False,
                  soft_wrap=True)


def _run_prepare(spec: Spec, out_dir: Path, in_process: InProcess, on_launch,
                 records: Path | None = None) -> None:
    """The spec's `prepare` commands, in order, each only while what it creates is missing (and,
    with `records`, cannot be restored from there)."""
    for i, step in enumerate(spec.prepare):
        _prepare_models(step, records)
        if step.done():
            _keep_model(step, records)
            continue
        launch = Launch(f"prepare-{i}", list(step.run), out_dir / "logs" / f"prepare-{i}.log",
                        "prepare")
        if on_launch is not None:
            on_launch(launch)
        console.print(f"experiment: prepare {step.creates}: primekit {' '.join(step.run)}",
                      markup=False, soft_wrap=True)
        _start(launch, in_process)
        rc = launch.rc if in_process is not None else launch.proc.wait()
        _record(out_dir, launch, rc)
        if rc != 0:
            raise SpecError(f"prepare[{i}]: primekit {' '.join(step.run)} failed (exit status "
                            f"{rc}); see {launch.log}")
        if not step.done():
            raise SpecError(f"prepare[{i}]: primekit {' '.join(step.run)} exited 0 but did not "
                            f"create {step.creates}")
        _keep_model(step, records)


def _run_sft(spec: Spec, out_dir: Path, in_process: InProcess, on_launch) -> None:
    """One `primekit sft` per task family (spec key `sft`), skipped when its model exists (sft
    replaces its output directory whole at the end, so an existing one is complete)."""
    if spec.sft is None:
        return
    base = spec.base_path()
    for task in spec.tasks:
        target = sft_dir(out_dir, task)
        if (target / "config.json").is_file():
            continue
        argv = ["sft"] + (["--config", str(base)] if base is not None else [])
        launch = Launch(f"sft-{task}", argv + spec.sft_overrides(out_dir, task),
                        out_dir / "logs" / f"sft-{task}.log", "sft")
        if on_launch is not None:
            on_launch(launch)
        console.print(f"experiment: SFT for task family {task} -> {target}", markup=False)
        _start(launch, in_process)
        rc = launch.rc if in_process is not None else launch.proc.wait()
        _record(out_dir, launch, rc)
        if rc != 0:
            raise SpecError(f"sft for task {task} failed (exit status {rc}); see {launch.log}")


def machine() -> str:
    """This machine in a few words for the report: CPU model (Linux /proc/cpuinfo) and cores."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def _record(out_dir: Path, launch: Launch, rc: int) -> None:
    row = {"run": launch.name, "how": launch.how, "rc": rc,
           "seconds": round(time.time() - launch.start, 1), "end": round(time.time(), 1),
           "machine": machine()}
    with open(out_dir / "attempts.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def _loop(spec, out_dir, todo, states, result, display, parallel, in_process, on_launch,
          on_finished: Callable[[Run], None] | None = None) -> None:
    """Start the runs of `todo`, `parallel` at a time, until all have ended; `on_finished` is
    called with each run that finishes (to record it at once, not only at the end)."""
    threads = threads_per_run(parallel)
    queue = list(todo)
    running: list[tuple[Run, Launch]] = []
    typo: list[str] = []  # a verdict metric no run logs, with a logged key close to it
    warned: set[str] = set()

    def check_metrics(run: Run) -> None:
        problem = unlogged_metric(spec, run)
        if problem is None or problem[0] in warned:
            return
        warned.add(problem[0])
        if problem[1]:
            typo.append(problem[0])
            queue.clear()  # the runs already going finish; no new one starts
        display.event(problem[0] if not problem[1] else f"{problem[0]}: no further run starts")

    for run in spec.runs(out_dir):
        if result.get(run.run_id) == FINISHED:
            check_metrics(run)

    def finish(run: Run, launch: Launch, rc: int) -> None:
        _record(out_dir, launch, rc)
        display.ended(run.run_id, time.time() - launch.start if rc == 0 else None)
        if rc == 0:
            display.done += 1
            result[run.run_id] = FINISHED
            if on_finished is not None:
                on_finished(run)
            display.event(f"finished {run.run_id} ({time.time() - launch.start:.0f} s)")
            check_metrics(run)
        else:
            display.failed += 1
            result[run.run_id] = f"failed (rc {rc})"
            display.event(f"FAILED {run.run_id} (exit status {rc}; log {launch.log})")

    previous = signal.getsignal(signal.SIGTERM)
    if in_process is None:  # SIGTERM stops the experiment like Ctrl-C (forwarded to the runs)
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while queue or running:
            while queue and len(running) < parallel:
                run = queue.pop(0)
                launch = Launch(run.run_id, train_argv(spec, run, states[run.run_id], threads),
                                out_dir / "logs" / f"{run.run_id}.log", states[run.run_id])
                if on_launch is not None:
                    on_launch(launch)
                first = (_checkpoint_step(run.run_dir)[0] or 0) if launch.how == RESUME else 0
                steps = run.config(spec).train.steps
                display.started(run.run_id, Running(run.run_dir, steps, first, time.time()))
                display.event(f"start {run.run_id} ({launch.how})")
                _start(launch, in_process)
                if in_process is not None:
                    finish(run, launch, launch.rc)
                else:
                    running.append((run, launch))
            for run, launch in list(running):
                rc = launch.proc.poll()
                if rc is not None:
                    running.remove((run, launch))
                    finish(run, launch, rc)
            if running:
                display.tick()
                time.sleep(0.5)
        if typo:
            raise SpecError(f"{spec.path or spec.name}: {typo[0]}; correct the spec's verdict and "
                            f"run the same command again (finished runs are kept)")
    except KeyboardInterrupt:
        def forward(signum=None, frame=None) -> None:
            for _, launch in running:  # a SIGINT each: the trainer checkpoints and exits
                if launch.proc.poll() is None:
                    launch.proc.send_signal(signal.SIGINT)

        forward()
        # While they save: a second Ctrl-C/SIGTERM is forwarded too (the trainer then stops at
        # once without saving), and never cuts short this wait.
        before = signal.signal(signal.SIGINT, forward), signal.signal(signal.SIGTERM, forward)
        try:
            for _, launch in running:
                _record(out_dir, launch, launch.proc.wait())
        finally:
            signal.signal(signal.SIGINT, before[0])
            signal.signal(signal.SIGTERM, before[1])
        display.event(f"stopped: {len(running)} running run(s) asked to checkpoint and stop; "
                      f"run the same command again to continue")
        raise
    finally:
        if in_process is None:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
