"""An experiment spec: a claim, and the runs that test it, as data (docs/experiments/README.md).

A spec is a YAML file:

    name: prime-vs-rloo                       # the experiment's directory name
    claim: PRIME reaches RLOO's final training reward in fewer steps
    paper: "PRIME Fig. 3: 2.5x sample efficiency, +6.9% final training reward"
    base: tiny                                # packaged config name or YAML path
    overrides: {train.steps: 60}              # every run
    sft: {sft.steps: 1000}                    # optional: one `primekit sft` per task family
    prepare:                                  # optional: what the runs need, made once, in order
      - {creates: runs/demo/sft, run: "sft --config tiny"}
    tasks:                                    # task families: name -> overrides
      arith-2-4: {data.min_operands: 2, data.max_operands: 4}
    arms:                                     # arm name -> overrides
      prime: {algorithm.reward_mode: prime}
      rloo: {algorithm.reward_mode: outcome}
      clipped: {explicit.eta: {arith-2-4: 0.8}}  # a value per task family: a mapping of them all
    seeds: [0, 1, 2]                          # train.seed of each run (or a count: 3)
    verdict:                                  # one mapping, or a list of them
      rule: steps-ratio                       # or: difference
      metric: reward/outcome_mean_sampled
      compare: [[prime, rloo]]                # [treatment, baseline] pairs
      ...                                     # see Verdict
    budget: 60 steps x 32 prompts x 4 samples, eval on 200 problems
    share: false                              # optional: train every run here (module docstring)
    map:                                      # optional: arms on a two-parameter grid
      x: prm.lr                               # override fields the mapped arms set
      y: prm.beta
      metrics: [eval/pass@1_greedy]           # one table and heatmap each
      baseline: rloo                          # optional: cells as differences from this arm

Overrides are a mapping of dotted config fields to values, or a list of `field=value` strings;
`{task}` in a value is replaced by the task family's name (a model trained per task family). An
arm's value may instead be a mapping from every task family's name to that family's value (a
threshold chosen per task family's reward model, say); the arm's other fields, and the other arms,
stay common, so runs they share with other specs stay shared.
Runs are shared between specs (linked from another experiment's directory, restored from another
spec's run record) when their configs agree up to how they were executed (`records.NOT_THE_RUN`:
threads, micro-batch layout, ...). `share: false` trains every run of the spec here, from the
primekit it runs on: for a comparison that must not mix versions. An arm that sets a field of
NOT_THE_RUN that changes the arithmetic (threads, layout) makes that field part of the run for
this spec (`Spec.strict`).
Each run is configured as base <- overrides <- the task's <- the arm's <- train.seed, and every
run's config is built (and so validated by primekit.config) when the spec is loaded: an unknown
key or a bad override is one `SpecError` line naming the spec file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from primekit.config import Config, ConfigError, load_config, load_yaml, resolve_config
from primekit.experiment.records import ROUNDING

# The packaged specs, found by name with `primekit experiment NAME`.
SPEC_DIR = Path(__file__).parent / "specs"

RULES = ("steps-ratio", "difference", "equivalence")
STATISTICS = ("final", "noise")
DIRECTIONS = ("greater", "less")
MIN_SEEDS = 3  # fewer seeds per arm than this: the verdict is "inconclusive" whatever the numbers


class SpecError(ConfigError):
    """A spec that cannot run; one line naming the spec file and the key."""


def counted(k: int, noun: str, plural: str | None = None) -> str:
    """'1 task', '2 tasks'; `plural` where adding an s will not do ('task families')."""
    return f"{k} {noun}" if k == 1 else f"{k} {plural or noun + 's'}"


@dataclass
class Verdict:
    """How a claim is decided, per (treatment, baseline) pair and task family.

    rule "difference": the treatment's final `metric` minus the baseline's, mean over seeds, with
    a 95% Welch t-interval (`statistic` "noise" compares instead each run's standard deviation of
    the step-to-step changes of a per-step metric: how noisy training is, not where it ends).
    rule "equivalence": the same difference, where the claim is that the arms are close:
    reproduced when the interval lies wholly within +-`boundary` (the margin), not reproduced
    when it lies wholly outside it, inconclusive otherwise. rule "steps-ratio": the baseline's mean steps-to-threshold divided by
    the treatment's (how many times fewer steps the treatment needs), with a 95% seeded bootstrap
    interval over seeds; `threshold` is a number, or "baseline-final": the baseline's mean final
    smoothed metric (the paper's "steps to reach RLOO's final reward").

    Reproduced when the interval lies wholly beyond `boundary` in `direction`; not reproduced when
    it lies wholly on the other side, or when it excludes `min_effect` (the smallest effect that
    would count as the claim, e.g. the paper's number); inconclusive otherwise, and whenever an
    arm has fewer than MIN_SEEDS finished seeds.
    """

    metric: str
    compare: list[list[str]]
    rule: str = "difference"
    boundary: float | None = None  # default 0 for difference, 1 for steps-ratio
    direction: str = "greater"
    min_effect: float | None = None
    # Final value of a per-step metric: mean over the last `window` steps (eval/ metrics: the
    # final evaluation). Steps-to-threshold: the first step whose trailing `window`-step mean
    # reaches the threshold.
    window: int = 10
    statistic: str = "final"
    threshold: float | str = "baseline-final"
    bootstrap: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.boundary is None:
            self.boundary = {"steps-ratio": 1.0, "equivalence": 0.02}.get(self.rule, 0.0)


# The commands a `prepare` step may run: the ones that make a model the runs read.
PREPARE_COMMANDS = ("sft", "train", "train-prm", "train-orm")


@dataclass
class Prepare:
    """Spec key `prepare`: one `primekit <run>` command that makes a path the runs need (an SFT
    model, a second SFT model for a separate PRM, a step PRM, a trained PRM), run before the
    runs, in the listed order, only while `creates` does not exist (or is empty). Paths are
    relative to the directory primekit runs in, like the runs' own model paths."""

    creates: str
    run: list[str]  # primekit CLI arguments

    def done(self) -> bool:
        path = Path(self.creates)
        return path.is_file() or (path.is_dir() and any(path.iterdir()))


@dataclass
class Grid:
    """Spec key `map`: the arms that set both override fields `x` and `y` placed on a grid (one
    arm per cell), each cell the arm's final value of each of `metrics` (mean over seeds, 95%
    t-interval), or with `baseline` its difference from that arm (Welch 95% interval). The
    danger-zone spec maps (beta, PRM lr) this way."""

    x: str
    y: str
    metrics: list[str]
    baseline: str | None = None

    def cells(self, arms: dict[str, list[str]]) -> dict[str, tuple[Any, Any]]:
        """Mapped arm -> (its x value, its y value), in the arms' order; values parsed back from
        the override text (JSON, else YAML), so numbers sort as numbers."""
        out = {}
        for arm, ovr in arms.items():
            values = dict(o.split("=", 1) for o in ovr)
            if self.x in values and self.y in values:
                out[arm] = (_parse_value(values[self.x]), _parse_value(values[self.y]))
        return out


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)  # "1e-05" is a number to JSON, a string to YAML 1.1
    except ValueError:
        return yaml.safe_load(text)


@dataclass
class Spec:
    name: str
    claim: str
    base: str
    arms: dict[str, list[str]]
    seeds: list[int]
    verdicts: list[Verdict]
    paper: str = ""
    overrides: list[str] = field(default_factory=list)
    tasks: dict[str, list[str]] = field(default_factory=lambda: {"default": []})
    sft: list[str] | None = None
    budget: str = ""
    grid: Grid | None = None  # spec key `map`
    prepare: list[Prepare] = field(default_factory=list)
    path: Path | None = None  # the file it was read from
    # arm -> task family -> the arm's overrides whose value is given per task family
    arm_tasks: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # False: every run trained by this spec itself, none linked from another experiment or
    # restored from another spec's records (a comparison that must run on one primekit version)
    share: bool = True

    @property
    def strict(self) -> tuple[str, ...]:
        """The fields of `records.NOT_THE_RUN` that change the arithmetic (`records.ROUNDING`:
        threads, micro-batch layout) and that an arm sets: for this spec they are the question,
        so a run matches another (shared, recorded) only with the same values
        (`records.same_run`). Bookkeeping fields an arm sets (`train.save_every`) stay out."""
        keys = {o.split("=", 1)[0] for a in self.arms for t in self.tasks
                for o in self.arm_overrides(a, t)}
        return tuple(sorted(k for k in keys if k.startswith(ROUNDING)))

    def arm_overrides(self, arm: str, task: str) -> list[str]:
        """The overrides of `arm` in task family `task`: its common ones, then its per-task ones."""
        return [*self.arms[arm], *self.arm_tasks.get(arm, {}).get(task, [])]

    @property
    def window(self) -> int:
        """The final-metric window of the report's tables: the first verdict's."""
        return self.verdicts[0].window

    def base_path(self) -> Path | None:
        return resolve_config(self.base)

    def runs(self, out_dir: Path) -> list[Run]:
        """Every (task, arm, seed) run, task-major, then seed, then arm: interleaving the arms
        gives a comparison with every arm after the first few runs."""
        out = []
        for task, task_ovr in self.tasks.items():
            sft = [f"model.policy={sft_dir(out_dir, task)}"] if self.sft is not None else []
            for seed in self.seeds:
                for arm in self.arms:
                    run_id = f"{task}--{arm}--s{seed}"
                    run_dir = out_dir / "runs" / run_id
                    arm_ovr = self.arm_overrides(arm, task)
                    ovr = [*self.overrides, *task_ovr, *sft, *arm_ovr, f"train.seed={seed}",
                           f"train.run_dir={run_dir}"]
                    ovr = [o.replace("{task}", task) for o in ovr]
                    out.append(Run(task, arm, seed, run_id, run_dir, ovr))
        return out

    def sft_overrides(self, out_dir: Path, task: str) -> list[str]:
        """The `primekit sft` overrides of one task family (spec.sft set)."""
        return [*self.overrides, *self.tasks[task], *(self.sft or []),
                f"sft.out_dir={sft_dir(out_dir, task)}"]


@dataclass
class Run:
    task: str
    arm: str
    seed: int
    run_id: str
    run_dir: Path
    overrides: list[str]  # on top of the spec's base config

    def config(self, spec: Spec) -> Config:
        return load_config(spec.base_path(), self.overrides)


def sft_dir(out_dir: Path, task: str) -> Path:
    return out_dir / "sft" / task


_KEYS = {f.name for f in dataclasses.fields(Spec)} - {"path", "verdicts", "grid"} | {"verdict",
                                                                                   "map"}
_REQUIRED = ("name", "claim", "base", "arms", "seeds", "verdict")
_VERDICT_KEYS = {f.name for f in dataclasses.fields(Verdict)}


def _value_text(value: Any) -> str:
    # JSON is YAML: the override parser reads it back as the same value (strings stay strings).
    return value if isinstance(value, str) else json.dumps(value)


def _overrides(raw: Any, where: str, err) -> list[str]:
    """A mapping {field: value} or a list of "field=value" strings -> "field=value" strings."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        out = []
        for key, value in raw.items():
            if not isinstance(key, str) or key.count(".") != 1:
                raise err(f"{where}: override key {key!r} is not section.field (e.g. prm.beta)")
            out.append(f"{key}={_value_text(value)}")
        return out
    if isinstance(raw, list) and all(isinstance(x, str) and "=" in x for x in raw):
        return list(raw)
    raise err(f"{where}: expected a mapping of section.field: value (or a list of "
              f"'section.field=value' strings), got {raw!r}")


def _arm_overrides(raw: Any, where: str, err, tasks: list[str]
                   ) -> tuple[list[str], dict[str, list[str]]]:
    """An arm's overrides: (the common "field=value" strings, {task: its per-task strings}).

    A value that is a mapping from every task family's name to a value is given per task family.
    """
    if not isinstance(raw, dict):
        return _overrides(raw, where, err), {}
    common, per_task = {}, {t: [] for t in tasks}
    for key, value in raw.items():
        if isinstance(value, dict):
            names = [str(k) for k in value]
            if sorted(names) != sorted(tasks):
                raise err(f"{where}.{key}: a value per task family needs exactly the task "
                          f"families {tasks} as keys, got {names}")
            for task, v in value.items():
                if isinstance(v, dict):
                    raise err(f"{where}.{key}.{task}: expected a value, got a mapping")
                per_task[str(task)].extend(_overrides({key: v}, where, err))
        else:
            common[key] = value
    per_task = {t: o for t, o in per_task.items() if o}
    return _overrides(common, where, err), per_task


# Set by the experiment for each run (`Spec.runs`): a spec that sets them would be overridden.
_RUN_FIELDS = {"train.seed": "the spec's seeds", "train.run_dir": "the experiment's --out"}
# Free text, where braces are the user's own; in every other value `{name}` is a placeholder.
_FREE_TEXT = ("model.system_prompt", "live.pattern", "hack_check.separator")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _check_layers(arms: dict[str, list[str]], arm_tasks: dict[str, dict[str, list[str]]],
                  tasks: dict[str, list[str]], common: list[str], err) -> None:
    """Overrides that would silently not do what they say: a field the experiment sets for each
    run, a placeholder other than {task}, and two arms that would train the same runs."""
    layers = [("overrides", common), *((f"tasks.{t}", o) for t, o in tasks.items()),
              *((f"arms.{a}", o) for a, o in arms.items()),
              *((f"arms.{a}", o) for a, per in arm_tasks.items() for o in per.values())]
    for where, ovr in layers:
        for text in ovr:
            key, _, value = text.partition("=")
            key = key.strip()
            if key in _RUN_FIELDS:
                raise err(f"{where}.{key}: set by the experiment for each run (from "
                          f"{_RUN_FIELDS[key]}); remove it")
            unknown = [m for m in _PLACEHOLDER.findall(value) if m != "task"]
            if unknown and key not in _FREE_TEXT:
                raise err(f"{where}.{key}: unknown placeholder {{{unknown[0]}}} in {value!r}; "
                          f"the only one is {{task}} (the task family's name)")
    seen: dict[str, str] = {}
    for arm in arms:
        same = json.dumps([sorted(arms[arm]), sorted((t, sorted(o)) for t, o in
                                                     arm_tasks.get(arm, {}).items())])
        if same in seen:
            raise err(f"arms.{arm}: the same overrides as arm {seen[same]!r}; the two arms would "
                      f"train the same runs")
        seen[same] = arm


def packaged_specs() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def resolve_spec(name: str) -> Path:
    """A spec file path, or the name of a packaged spec."""
    path = Path(name)
    if path.is_file():
        return path
    packaged = SPEC_DIR / f"{name}.yaml"
    if packaged.is_file():
        return packaged
    raise SpecError(f"experiment: {name!r} is neither a spec file nor a packaged spec "
                    f"({', '.join(packaged_specs())})")


def load_spec(name: str | Path, *, check_runs: bool = True) -> Spec:
    """Read and validate a spec; with `check_runs`, build every run's config (validating every
    override against primekit.config) and refuse anything that cannot run, in one line."""
    path = resolve_spec(str(name))

    def err(msg: str) -> SpecError:
        return SpecError(f"{path}: {msg}")

    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise err(f"not valid YAML{at}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise err(f"expected a mapping of spec keys, got {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise err(f"unknown key {unknown[0]!r}; valid: {sorted(_KEYS)}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise err(f"missing key {missing[0]!r}")
    for key in ("name", "claim", "base"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise err(f"{key}: expected a non-empty string, got {data[key]!r}")
    if "/" in data["name"] or data["name"].startswith("."):
        raise err(f"name: {data['name']!r} must be a plain directory name")
    arms = data["arms"]
    if not isinstance(arms, dict) or len(arms) < 2:
        raise err(f"arms: expected a mapping of at least two arm names to overrides, got {arms!r}")
    tasks_raw = data["tasks"] if data.get("tasks") is not None else {"default": {}}
    if not isinstance(tasks_raw, dict) or not tasks_raw:
        raise err(f"tasks: expected a mapping of task family names to overrides, got {tasks_raw!r}")
    tasks = {str(t): _overrides(o, f"tasks.{t}", err) for t, o in tasks_raw.items()}
    for a, o in arms.items():
        if o is None:
            raise err(f"arms.{a}: no overrides given (write {{}} for the base config as it is)")
    parsed = {str(a): _arm_overrides(o, f"arms.{a}", err, list(tasks)) for a, o in arms.items()}
    arm_ovr = {a: common for a, (common, _) in parsed.items()}
    arm_tasks = {a: per_task for a, (_, per_task) in parsed.items() if per_task}
    for what, names in (("arms", arm_ovr), ("tasks", tasks)):
        bad = [n for n in names if not n or "/" in n or "--" in n or n.startswith(".")]
        if bad:
            raise err(f"{what}.{bad[0]}: a name must be non-empty, without '/', '--' or a "
                      f"leading '.'")
    common = _overrides(data.get("overrides"), "overrides", err)
    _check_layers(arm_ovr, arm_tasks, tasks, common, err)
    seeds = data["seeds"]
    if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds > 0:
        seeds = list(range(seeds))
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise err(f"seeds: expected a positive count or a list of distinct integers, got {seeds!r}")
    raw = data["verdict"]
    many = isinstance(raw, list)
    verdicts = [_verdict(r, f"verdict[{i}]" if many else "verdict", arm_ovr, err)
                for i, r in enumerate(raw if many else [raw])]
    if not verdicts:
        raise err("verdict: expected a mapping (or a list of them), got []")
    sft = data.get("sft")
    spec = Spec(
        name=data["name"], claim=data["claim"].strip(), base=data["base"], arms=arm_ovr,
        seeds=seeds, verdicts=verdicts, paper=str(data.get("paper") or "").strip(),
        overrides=common, tasks=tasks,
        sft=None if sft is None or sft is False else _overrides(sft if sft is not True else {},
                                                                "sft", err),
        budget=str(data.get("budget") or "").strip(), path=path,
        grid=_grid(data["map"], arm_ovr, err) if data.get("map") is not None else None,
        prepare=_prepare(data.get("prepare"), err), arm_tasks=arm_tasks,
        share=_share_key(data.get("share", True), err))
    try:
        spec.base_path()
    except ConfigError as e:
        raise err(f"base: {e}") from None
    if check_runs:
        _check_runs(spec, err)
    return spec


def _share_key(raw: Any, err) -> bool:
    if not isinstance(raw, bool):
        raise err(f"share: expected true or false, got {raw!r}")
    return raw


def _verdict(raw: Any, where: str, arms: dict[str, list[str]], err) -> Verdict:
    if not isinstance(raw, dict):
        raise err(f"{where}: expected a mapping, got {raw!r}")
    unknown = sorted(set(raw) - _VERDICT_KEYS)
    if unknown:
        raise err(f"{where}.{unknown[0]}: unknown key; valid: {sorted(_VERDICT_KEYS)}")
    for key in ("metric", "compare"):
        if key not in raw:
            raise err(f"{where}: missing key {key!r}")
    v = Verdict(**raw)
    if v.rule not in RULES:
        raise err(f"{where}.rule: {v.rule!r} is not one of {list(RULES)}")
    if v.statistic not in STATISTICS:
        raise err(f"{where}.statistic: {v.statistic!r} is not one of {list(STATISTICS)}")
    if v.rule == "equivalence" and not v.boundary > 0:
        raise err(f"{where}.boundary: equivalence needs a margin > 0, got {v.boundary!r}")
    if v.direction not in DIRECTIONS:
        raise err(f"{where}.direction: {v.direction!r} is not one of {list(DIRECTIONS)}")
    if not isinstance(v.metric, str) or "/" not in v.metric:
        raise err(f"{where}.metric: expected a metric key like reward/outcome_mean_sampled "
                  f"(docs/metrics.md), got {v.metric!r}")
    if (not isinstance(v.compare, list) or not v.compare
            or not all(isinstance(p, list) and len(p) == 2 for p in v.compare)):
        raise err(f"{where}.compare: expected a list of [treatment, baseline] arm pairs, "
                  f"got {v.compare!r}")
    for pair in v.compare:
        for arm in pair:
            if arm not in arms:
                raise err(f"{where}.compare: {arm!r} is not an arm; arms: {list(arms)}")
        if pair[0] == pair[1]:
            raise err(f"{where}.compare: [{pair[0]}, {pair[1]}] compares an arm with itself")
    for key in ("boundary", "min_effect"):
        value = getattr(v, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise err(f"{where}.{key}: expected a number, got {value!r}")
    if isinstance(v.window, bool) or not isinstance(v.window, int) or v.window < 1:
        raise err(f"{where}.window: expected a positive integer, got {v.window!r}")
    if isinstance(v.bootstrap, bool) or not isinstance(v.bootstrap, int) or v.bootstrap < 100:
        raise err(f"{where}.bootstrap: expected an integer >= 100, got {v.bootstrap!r}")
    if not (v.threshold == "baseline-final"
            or (isinstance(v.threshold, int | float) and not isinstance(v.threshold, bool))):
        raise err(f"{where}.threshold: expected a number or 'baseline-final', "
                  f"got {v.threshold!r}")
    if v.statistic == "noise" and (v.rule != "difference" or v.metric.startswith("eval/")):
        raise err(f"{where}.statistic: 'noise' needs rule difference and a per-step metric")
    if v.rule == "steps-ratio" and v.direction != "greater":
        raise err(f"{where}.direction: steps-ratio is baseline steps / treatment steps; the "
                  f"claim that the treatment is faster is direction 'greater'")
    return v


def _prepare(raw: Any, err) -> list[Prepare]:
    import shlex

    if raw is None:
        return []
    if not isinstance(raw, list):
        raise err(f"prepare: expected a list of {{creates: PATH, run: COMMAND}}, got {raw!r}")
    steps = []
    for i, item in enumerate(raw):
        where = f"prepare[{i}]"
        if not isinstance(item, dict) or set(item) != {"creates", "run"}:
            raise err(f"{where}: expected a mapping with exactly the keys creates and run, "
                      f"got {item!r}")
        creates, run = item["creates"], item["run"]
        if not isinstance(creates, str) or not creates.strip():
            raise err(f"{where}.creates: expected a path, got {creates!r}")
        if isinstance(run, str):
            run = shlex.split(run)
        if (not isinstance(run, list) or not run
                or not all(isinstance(a, str) for a in run)):
            raise err(f"{where}.run: expected a primekit command line, got {item['run']!r}")
        if run[0] == "primekit":
            run = run[1:]
        if not run or run[0] not in PREPARE_COMMANDS:
            raise err(f"{where}.run: the command must be one of {list(PREPARE_COMMANDS)}, got "
                      f"{' '.join(run)!r}")
        steps.append(Prepare(creates=creates.strip(), run=run))
    return steps


def _grid(raw: Any, arms: dict[str, list[str]], err) -> Grid:
    if not isinstance(raw, dict):
        raise err(f"map: expected a mapping with x, y and metrics, got {raw!r}")
    valid = {f.name for f in dataclasses.fields(Grid)}
    unknown = sorted(set(raw) - valid)
    if unknown:
        raise err(f"map.{unknown[0]}: unknown key; valid: {sorted(valid)}")
    for key in ("x", "y", "metrics"):
        if key not in raw:
            raise err(f"map: missing key {key!r}")
    grid = Grid(**raw)
    for key in ("x", "y"):
        value = getattr(grid, key)
        if not isinstance(value, str) or "." not in value:
            raise err(f"map.{key}: expected a section.field the arms override, got {value!r}")
    if grid.x == grid.y:
        raise err(f"map: x and y are the same field {grid.x!r}")
    if (not isinstance(grid.metrics, list) or not grid.metrics
            or not all(isinstance(m, str) and "/" in m for m in grid.metrics)):
        raise err(f"map.metrics: expected a list of metric keys like eval/pass@1_greedy, "
                  f"got {grid.metrics!r}")
    if grid.baseline is not None and grid.baseline not in arms:
        raise err(f"map.baseline: {grid.baseline!r} is not an arm; arms: {list(arms)}")
    cells = grid.cells(arms)
    if len(cells) < 2:
        raise err(f"map: fewer than two arms set both {grid.x} and {grid.y}")
    seen: dict[tuple[str, str], str] = {}
    for arm, xy in cells.items():
        key = (repr(xy[0]), repr(xy[1]))
        if key in seen:
            raise err(f"map: arms {seen[key]!r} and {arm!r} are the same cell {grid.x}="
                      f"{xy[0]!r}, {grid.y}={xy[1]!r}")
        seen[key] = arm
    return grid


def _names(key: str, named: list[str]) -> bool:
    """Whether override `key` (section.field) is what an error names: the field, or its section
    (an unknown section is named alone)."""
    return key in named or key.split(".", 1)[0] in named


def _check_runs(spec: Spec, err) -> None:
    """Build each task x arm config once (seeds and run directories cannot make one invalid); an
    error is attributed to the layer that sets the field it names (the arm's, then the task's,
    then the common overrides)."""
    base = spec.base_path()
    for task, task_ovr in spec.tasks.items():
        if spec.sft is not None:
            try:
                load_config(base, spec.sft_overrides(Path("exp"), task))
            except ConfigError as e:
                raise err(f"sft (task {task}): {e}") from None
        for arm in spec.arms:
            arm_ovr = spec.arm_overrides(arm, task)
            try:
                load_config(base, [*spec.overrides, *task_ovr, *arm_ovr])
            except ConfigError as e:
                named = str(e).split(":", 1)[0].split("/")  # "prm.beta" or "filter.lo/filter.hi"
                where = f"task {task}, arm {arm}"
                for layer, ovr in ((f"arms.{arm}", arm_ovr), (f"tasks.{task}", task_ovr),
                                   ("overrides", spec.overrides)):
                    if any(_names(o.split("=", 1)[0].strip(), named) for o in ovr):
                        where = layer
                        break
                raise err(f"{where}: {e}") from None
