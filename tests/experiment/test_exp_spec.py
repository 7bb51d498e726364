"""Spec validation: every mistake is one line naming the spec file and the key; --list shows every
packaged spec; the runs a spec expands into."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from primekit.cli import main
from primekit.experiment.spec import SpecError, load_spec, packaged_specs, resolve_spec

GOOD = {
    "name": "demo-exp", "claim": "PRIME beats RLOO", "base": "tiny",
    "overrides": {"train.steps": 4},
    "tasks": {"arith": {"data.task_family": "arithmetic"},
              "chains": {"data.task_family": "chains", "rollout.max_new_tokens": 96}},
    "arms": {"prime": {}, "rloo": ["algorithm.reward_mode=outcome"]},
    "seeds": 3,
    "verdict": {"metric": "eval/pass@1_greedy", "compare": [["prime", "rloo"]]},
}


def write(tmp_path: Path, **changes) -> Path:
    spec = {**GOOD, **changes}
    spec = {k: v for k, v in spec.items() if v is not None}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_good_spec_expands_into_tasks_x_seeds_x_arms(tmp_path):
    spec = load_spec(write(tmp_path))
    assert spec.seeds == [0, 1, 2]
    runs = spec.runs(tmp_path / "exp")
    assert len(runs) == 2 * 3 * 2
    r = runs[7]  # task-major, then seed, then arm: chains, seed 0, rloo
    assert (r.task, r.seed, r.arm) == ("chains", 0, "rloo")
    assert r.run_dir == tmp_path / "exp" / "runs" / "chains--rloo--s0"
    # base <- common <- task <- arm <- seed <- run dir
    assert r.overrides == ["train.steps=4", "data.task_family=chains", "rollout.max_new_tokens=96",
                           "algorithm.reward_mode=outcome", "train.seed=0",
                           f"train.run_dir={r.run_dir}"]
    cfg = r.config(spec)
    assert (cfg.train.steps, cfg.data.task_family, cfg.algorithm.reward_mode,
            cfg.rollout.max_new_tokens) == (4, "chains", "outcome", 96)


@pytest.mark.parametrize("changes, message", [
    ({"armz": {}}, "unknown key 'armz'; valid: ["),
    ({"seeds": None}, "missing key 'seeds'"),
    ({"arms": {"prime": {"prm.betta": 0.1}, "rloo": {}}},
     "arms.prime: prm.betta: unknown field 'betta'"),
    ({"arms": {"prime": {"prm.beta": -1}, "rloo": {}}},
     "arms.prime: prm.beta: Input should be greater than 0, got -1"),
    ({"arms": {"prime": {"beta": 0.1}, "rloo": {}}},
     "arms.prime: override key 'beta' is not section.field"),
    ({"tasks": {"arith": {"data.task_family": "sudoku"}}}, "tasks.arith: data.task_family:"),
    ({"overrides": {"train.stepz": 3}}, "overrides: train.stepz: unknown field"),
    ({"arms": {"prime": {}}}, "arms: expected a mapping of at least two arm names"),
    ({"seeds": [0, 0, 1]}, "seeds: expected a positive count or a list of distinct integers"),
    ({"verdict": {"metric": "eval/pass@1_greedy", "compare": [["prime", "ppo"]]}},
     "verdict.compare: 'ppo' is not an arm; arms: ['prime', 'rloo']"),
    ({"verdict": {"metric": "eval/pass@1_greedy", "compare": [["prime", "rloo"]], "rul": "x"}},
     "verdict.rul: unknown key"),
    ({"verdict": [{"metric": "eval/pass@1_greedy", "compare": [["prime", "rloo"]]},
                  {"metric": "eval/pass@1_greedy", "compare": [["prime", "rloo"]],
                   "rule": "ratio"}]},
     "verdict[1].rule: 'ratio' is not one of ['steps-ratio', 'difference', 'equivalence']"),
    ({"base": "tinyy"}, "base: --config: 'tinyy' is neither a file nor a packaged config"),
    ({"prepare": {"creates": "x"}}, "prepare: expected a list"),
    ({"prepare": [{"creates": "m", "run": "sft", "extra": 1}]},
     "prepare[0]: expected a mapping with exactly the keys creates and run"),
    ({"prepare": [{"creates": "m", "run": "rm -rf m"}]},
     "prepare[0].run: the command must be one of ['sft', 'train', 'train-prm', 'train-orm']"),
    ({"prepare": [{"creates": "", "run": "sft"}]}, "prepare[0].creates: expected a path"),
    ({"arms": {"prime": {"prm.beta": {"arith": 0.1}}, "rloo": {}}},
     "arms.prime.prm.beta: a value per task family needs exactly the task families "
     "['arith', 'chains'] as keys, got ['arith']"),
    ({"arms": {"prime": {"prm.beta": {"arith": 0.1, "chains": -1}}, "rloo": {}}},
     "arms.prime: prm.beta: Input should be greater than 0, got -1"),
    ({"map": {"x": "prm.lr", "y": "prm.beta"}}, "map: missing key 'metrics'"),
    ({"map": {"x": "prm.lr", "y": "prm.beta", "metrics": ["eval/pass@1_greedy"]}},
     "map: fewer than two arms set both prm.lr and prm.beta"),
    ({"map": {"x": "lr", "y": "prm.beta", "metrics": ["m/x"]}}, "map.x: expected a section.field"),
    ({"map": {"x": "prm.lr", "y": "prm.beta", "metrics": ["acc"]}}, "map.metrics: expected a list"),
    ({"map": {"x": "prm.lr", "y": "prm.beta", "metrics": ["m/x"], "baseline": "ppo"}},
     "map.baseline: 'ppo' is not an arm"),
    ({"arms": {"p": {"prm.lr": 0.001, "prm.beta": 0.1},
               "q": {"prm.lr": 0.001, "prm.beta": 0.1, "prm.weight_decay": 0.01}},
      "verdict": {"metric": "m/x", "compare": [["p", "q"]]},
      "map": {"x": "prm.lr", "y": "prm.beta", "metrics": ["m/x"]}},
     "map: arms 'p' and 'q' are the same cell prm.lr=0.001, prm.beta=0.1"),
    # Mistakes that used to pass silently (a new user's walkthrough, 2026-12-08):
    ({"arms": {"prime": {}, "rloo": None}},
     "arms.rloo: no overrides given (write {} for the base config as it is)"),
    ({"arms": {"prime": {"train.seed": 7}, "rloo": {"algorithm.reward_mode": "outcome"}}},
     "arms.prime.train.seed: set by the experiment for each run (from the spec's seeds)"),
    ({"overrides": {"model.prm": "runs/{taskk}/prm"}},
     "overrides.model.prm: unknown placeholder {taskk} in 'runs/{taskk}/prm'; the only one is "
     "{task}"),
    ({"tasks": {}}, "tasks: expected a mapping of task family names to overrides, got {}"),
    ({"arms": {"prime": {}, "rloo": {}}},
     "arms.rloo: the same overrides as arm 'prime'; the two arms would train the same runs"),
    ({"verdict": {"metric": "eval/pass@1_greedy", "compare": [["prime", "prime"]]}},
     "verdict.compare: [prime, prime] compares an arm with itself"),
    ({"overrides": {"train.steps": True}},
     "overrides: train.steps: expected int, got True (true and false are for switches)"),
    ({"overrides": {"train.steps": 4, "nosection.x": 1}},
     "overrides: nosection: unknown section 'nosection'"),
    ({"tasks": {"arith": {"nosection.x": 1}, "chains": {}}},
     "tasks.arith: nosection: unknown section 'nosection'"),
])
def test_spec_errors_are_one_line_naming_the_key(tmp_path, changes, message):
    path = write(tmp_path, **changes)
    with pytest.raises(SpecError) as e:
        load_spec(path)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: ")
    assert message in text


@pytest.mark.parametrize("text, line, key", [
    # the second `prime` would silently replace the first: RLOO against RLOO, labelled PRIME
    ("arms:\n  prime: {algorithm.reward_mode: prime}\n  rloo: {algorithm.reward_mode: outcome}\n"
     "  prime: {algorithm.reward_mode: outcome}\n", 4, "prime"),
    ("overrides: {train.steps: 2, train.steps: 3}\n", 1, "train.steps"),
])
def test_a_key_given_twice_is_refused_with_its_line(tmp_path, text, line, key):
    good = {k: v for k, v in GOOD.items() if k not in ("arms", "overrides")}
    if "arms" not in text:
        good["arms"] = GOOD["arms"]
    path = tmp_path / "spec.yaml"
    path.write_text(text + yaml.safe_dump(good))
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert str(e.value) == f"{path}: not valid YAML at line {line}: key {key!r} given twice"


def test_an_arm_value_per_task_family_lands_only_in_that_family(tmp_path):
    # the threshold of Clip chosen per task family's PRM; the arm's other field stays common
    arms = {"prime": {}, "rloo": {"explicit.transform": "clip",
                                  "explicit.eta": {"arith": 0.8, "chains": 0.48}}}
    spec = load_spec(write(tmp_path, arms=arms))
    assert spec.arms["rloo"] == ["explicit.transform=clip"]
    assert spec.arm_tasks == {"rloo": {"arith": ["explicit.eta=0.8"],
                                       "chains": ["explicit.eta=0.48"]}}
    runs = {r.run_id: r for r in spec.runs(tmp_path / "exp")}
    assert runs["arith--rloo--s1"].config(spec).explicit.eta == 0.8
    assert runs["chains--rloo--s1"].config(spec).explicit.eta == 0.48
    # the arm without per-task values gets exactly the common overrides (so shared runs match)
    assert runs["chains--prime--s0"].overrides[:3] == [
        "train.steps=4", "data.task_family=chains", "rollout.max_new_tokens=96"]
    assert not any("eta" in o for o in runs["chains--prime--s0"].overrides)


def test_combination_error_is_attributed_to_the_arm(tmp_path):
    # Each layer is valid alone; the arm's frozen PRM needs model.prm, which nothing sets.
    path = write(tmp_path, arms={"frozen": {"prm.update": "frozen"}, "rloo": {}},
                 verdict={"metric": "prm/acc_pairwise", "compare": [["frozen", "rloo"]]})
    with pytest.raises(SpecError, match=r"spec.yaml: arms.frozen: prm.update: a frozen PRM"):
        load_spec(path)


def test_cli_spec_error_exits_2_with_one_line(tmp_path, capsys):
    path = write(tmp_path, arms={"prime": {"prm.betta": 0.1}, "rloo": {}})
    assert main(["experiment", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("primekit: configuration error: ") and "arms.prime: prm.betta" in err
    assert main(["experiment", str(write(tmp_path)), "--max-runs", "-1"]) == 2  # was: all but 1
    assert "--max-runs: expected at least 0, got -1" in capsys.readouterr().err
    assert main(["experiment", "no-such-spec"]) == 2
    assert "neither a spec file nor a packaged spec" in capsys.readouterr().err
    good = write(tmp_path)
    assert main(["experiment", str(good), "--report-only", "--out", str(tmp_path / "none")]) == 2
    assert "--report-only: " in capsys.readouterr().err
    assert main(["experiment", str(good), "--parallel", "0"]) == 2
    assert "--parallel: expected at least 1, got 0" in capsys.readouterr().err
    assert main(["experiment"]) == 2
    assert "give a spec" in capsys.readouterr().err
    assert main(["experiment", str(good), str(good), "--out", str(tmp_path / "x")]) == 2
    assert "--out: one experiment directory per spec" in capsys.readouterr().err


# Packaged specs that choose settings rather than test a claim of the papers.
TUNING_SPECS = ("prm-settings", "prm-init-tuning", "rgym-policy-warmup", "gao-ppo-tuning")
# Packaged specs that add seeds to one task family of a two-family claim (spec -> that claim).
MORE_SEEDS_SPECS = {"demo-prime-vs-rloo-6-seeds": "demo-prime-vs-rloo",
                    "demo-prime-vs-rloo-6-seeds-chains": "demo-prime-vs-rloo",
                    "online-vs-frozen-prm-6-seeds": "online-vs-frozen-prm",
                    "demo-online-vs-frozen-prm-6-seeds": "demo-online-vs-frozen-prm"}
# Packaged specs that ask a two-family claim on one more family (spec -> that claim, and the
# common overrides it may change: settings chosen for that family on tuning seeds).
MORE_FAMILIES_SPECS = {"demo-prime-vs-rloo-rgym": ("demo-prime-vs-rloo", ()),
                       "demo-prime-vs-rloo-rgym-lr3e-5": ("demo-prime-vs-rloo", ("policy.lr",))}


def test_list_with_specs_shows_those(tmp_path, capsys):
    # `primekit experiment my.yaml --list` used to ignore the file and list the packaged specs
    path = write(tmp_path)
    assert main(["experiment", str(path), "prm-init", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["demo-exp", "prm-init"]
    assert lines[0].endswith("(2 arms x 3 seeds x 2 tasks = 12 runs)")


def test_list_shows_every_packaged_spec_and_each_validates(capsys):
    names = packaged_specs()
    assert main(["experiment", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":", 1)[0] for line in lines] == names
    # Counts in words, singular where one: prm-init-tuning is 2 arms x 3 seeds on one family.
    (tuning,) = [line for line in lines if line.startswith("prm-init-tuning:")]
    assert tuning.endswith("(2 arms x 3 seeds x 1 task = 6 runs)"), tuning
    for name in names:
        spec = load_spec(name)  # every run's config builds
        assert len(spec.seeds) >= 3, name
        # A claim runs on two task families; a tuning spec (settings chosen for one config, on
        # seeds no claim uses) may run on one, and so may a spec adding seeds to one family of
        # a claim, with that claim's runs for that family (the same config per seed), and so
        # may a spec asking a claim on a further family, with that claim's arms and verdicts.
        assert len(spec.tasks) >= 2 or name in TUNING_SPECS or name in MORE_SEEDS_SPECS \
            or name in MORE_FAMILIES_SPECS, name
        if name in MORE_FAMILIES_SPECS:
            claim_name, changed = MORE_FAMILIES_SPECS[name]
            claim = load_spec(claim_name)
            assert not set(spec.tasks) & set(claim.tasks), name
            assert set(spec.arms) == set(claim.arms) and spec.seeds == claim.seeds, name
            assert spec.verdicts == claim.verdicts and spec.claim.startswith(claim.claim), name
            kept = [o for o in spec.overrides if o.split("=", 1)[0] not in changed]
            assert kept == claim.overrides and spec.paper == claim.paper, name
            assert {o.split("=", 1)[0] for o in spec.overrides if o not in kept} == set(changed), name
        if name in MORE_SEEDS_SPECS:
            claim = load_spec(MORE_SEEDS_SPECS[name])
            assert set(claim.seeds) < set(spec.seeds), name
            for run in spec.runs(Path("x")):
                if run.seed in claim.seeds:
                    (same,) = [r for r in claim.runs(Path("x")) if (r.task, r.arm, r.seed) == (
                        run.task, run.arm, run.seed)]
                    assert same.config(claim).to_dict() == run.config(spec).to_dict(), run
        assert spec.paper and spec.budget, name
    for name in TUNING_SPECS:  # their seeds are none of the claims' seeds
        claim_seeds = {s for n in names if n not in TUNING_SPECS for s in load_spec(n).seeds}
        assert not set(load_spec(name).seeds) & claim_seeds, name


@pytest.mark.parametrize("name, source", [("online-vs-frozen-prm", "prime-vs-rloo"),
                                          ("demo-online-vs-frozen-prm", "demo-prime-vs-rloo")])
def test_online_vs_frozen_prepares_exactly_the_prime_run_it_starts_from(name, source):
    # The trained PRM online-vs-frozen-prm starts from is prime-vs-rloo's PRIME seed-0 run (the
    # demo variant: demo-prime-vs-rloo's); its prepare step trains that run with the same config,
    # so the source experiment later finds it finished.
    import json

    from primekit.config import load_config, resolve_config
    from primekit.experiment.runner import same_run

    ovf, pvr = load_spec(name), load_spec(source)
    made = [p for p in ovf.prepare if p.run[0] == "train"]
    assert len(made) == 2
    for step, task in zip(made, ["arithmetic", "chains"]):
        cfg = load_config(resolve_config(step.run[2]), step.run[3:])
        (run,) = [r for r in pvr.runs(Path(f"runs/experiments/{source}"))
                  if (r.task, r.arm, r.seed) == (task, "prime", 0)]
        assert same_run(json.loads(json.dumps(run.config(pvr).to_dict())), cfg)
        assert Path(str(cfg.train.run_dir)) == run.run_dir
        assert step.creates == f"{run.run_dir}/final/prm"
        online = [r for r in ovf.runs(Path("x")) if (r.task, r.arm) == (task, "online-trained")]
        assert f"model.prm={step.creates}" in online[0].overrides  # the arm reads what it makes


def test_gao_clip_delta_eta_trains_only_its_clip_arms():
    # Clip's threshold is set per task family's PRM in the clip arms only; sr, sr-pr and delta are
    # gao-clip-delta's runs, found as shared (same config up to where a run lives).
    import json

    from primekit.experiment.records import same_run

    eta = load_spec("gao-clip-delta-eta")
    gao = load_spec("gao-clip-delta")
    base = {r.run_id: r for r in gao.runs(Path("exp/gao-clip-delta"))}
    for r in eta.runs(Path("exp/gao-clip-delta-eta")):
        cfg = r.config(eta)
        saved = json.loads(json.dumps(base[r.run_id].config(gao).to_dict()))
        assert same_run(saved, cfg) == (r.arm in ("sr", "sr-pr", "delta")), r.run_id
        if r.arm.startswith("clip"):
            assert cfg.explicit.eta == {"arithmetic": 0.80, "chains": 0.48}[r.task]


def test_oracle_credit_trains_only_its_oracle_arm():
    # oracle-credit's prime and rloo arms are demo-prime-vs-rloo's runs (the same config per task
    # and seed, found as shared or restored from records); its oracle arm differs from the rloo
    # arm in the dense reward alone.
    import json

    from primekit.experiment.records import same_run

    spec, source = load_spec("oracle-credit"), load_spec("demo-prime-vs-rloo")
    assert spec.seeds == source.seeds and spec.tasks == source.tasks
    base = {r.run_id: r for r in source.runs(Path("exp/demo-prime-vs-rloo"))}
    for r in spec.runs(Path("exp/oracle-credit")):
        cfg = r.config(spec)
        if r.arm == "oracle":
            assert r.run_id not in base
            rloo = base[r.run_id.replace("--oracle--", "--rloo--")].config(source).to_dict()
            mine = cfg.to_dict()
            changed = {(section, key) for section in mine for key in mine[section]
                       if mine[section][key] != rloo[section][key]}
            assert changed == {("algorithm", "reward_mode"), ("explicit", "transform"),
                               ("train", "run_dir")}, r.run_id
            assert (cfg.algorithm.reward_mode, cfg.explicit.transform) == ("oracle-prm", "delta")
        else:
            saved = json.loads(json.dumps(base[r.run_id].config(source).to_dict()))
            assert same_run(saved, cfg), r.run_id


def test_packed_layout_trains_both_arms_itself():
    # packed-layout compares how passes are executed: its arms' layout fields are part of the run
    # (Spec.strict), and `share: false` keeps prime-vs-rloo's padded PRIME runs (same config,
    # older primekit) out of it. Its arms are otherwise prime-vs-rloo's PRIME arm exactly.
    import dataclasses

    from primekit.experiment.runner import spec_record

    spec = load_spec("packed-layout")
    assert spec.share is False
    assert spec.strict == ("policy.max_tokens_per_micro_batch", "prm.max_tokens_per_micro_batch")
    records = Path(__file__).resolve().parents[2] / "docs" / "experiments" / "records"
    assert (records / "prime-vs-rloo").is_dir()
    sharing = dataclasses.replace(spec, share=True)
    for r in spec.runs(Path("runs/experiments/packed-layout")):
        held = spec_record(spec, r.config(spec), None, records)
        assert held is None or held.parent.name == "packed-layout", r.run_id
        other = spec_record(sharing, r.config(sharing), None, records)
        if r.arm == "packed":  # never a padded run's record
            assert other is None or other.parent.name == "packed-layout", r.run_id
        else:  # the same run as prime-vs-rloo's, were sharing allowed
            assert other is not None, r.run_id
            if other.parent.name == "prime-vs-rloo":
                assert other.name == f"{r.task}--prime--s{r.seed}.jsonl.gz"
    # ... and prime-vs-rloo, whose PRIME runs are packed-layout's up to the layout, restores its
    # own records first (its report rebuilt from records reads the runs it recorded).
    pvr = load_spec("prime-vs-rloo")
    for r in pvr.runs(Path("runs/experiments/prime-vs-rloo")):
        held = spec_record(pvr, r.config(pvr), None, records)
        assert held == records / "prime-vs-rloo" / f"{r.run_id}.jsonl.gz", r.run_id


def test_share_key_must_be_a_boolean(tmp_path):
    text = yaml.safe_load(resolve_spec("packed-layout").read_text())
    text["share"] = "no"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(text))
    with pytest.raises(SpecError, match="share: expected true or false, got 'no'"):
        load_spec(path, check_runs=False)


def test_demo_hacking_remedies_implicit_changes_only_where_the_models_start():
    # The demo variant asks hacking-remedies-implicit's question with the demo's PRM: the same
    # arms, seeds, verdicts and settings; only the policy, PRM and reference models differ (those
    # of demo-prime-vs-rloo's PRIME arm).
    demo, first = load_spec("demo-hacking-remedies-implicit"), load_spec("hacking-remedies-implicit")
    assert (demo.arms, demo.seeds, demo.verdicts, demo.overrides, demo.paper) == (
        first.arms, first.seeds, first.verdicts, first.overrides, first.paper)
    prime = {r.task: r for r in load_spec("demo-prime-vs-rloo").runs(Path("x")) if r.arm == "prime"}
    models = ("model.policy", "model.prm", "model.ref")
    for a, b in zip(demo.runs(Path("x")), first.runs(Path("x")), strict=True):
        assert (a.task, a.arm, a.seed) == (b.task, b.arm, b.seed)
        ca, cb = a.config(demo).to_dict(), b.config(first).to_dict()
        for cfg in (ca, cb):
            del cfg["train"]["run_dir"]
        cp = prime[a.task].config(load_spec("demo-prime-vs-rloo")).to_dict()
        for key in models:
            sec, field = key.split(".")
            assert ca[sec][field] == cp[sec][field] != cb[sec][field], (a.run_id, key)
            ca[sec][field] = cb[sec][field]
        assert ca == cb, a.run_id
