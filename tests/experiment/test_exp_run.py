"""`primekit experiment` end to end on the tiny model: 2 arms x 2 seeds x 2 steps, killed between
runs, resumed without redoing the finished runs, an interrupted run continued with --resume, and
the report with its plots."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from primekit.cli import main
from primekit.experiment.report import write_report
from primekit.experiment.runner import FINISHED, RESUME, progress, run_experiment, run_state
from primekit.experiment.spec import SpecError, load_spec

SMALL = {
    "train.steps": 2, "train.prompts_per_step": 4, "train.save_every": 0, "train.threads": 1,
    "train.report_to": [], "rollout.max_new_tokens": 16, "filter.enabled": False,
    "prm.mini_batch_size": 16, "prm.micro_batch_size": 16, "policy.mini_batch_size": 8,
    "policy.micro_batch_size": 8, "eval.num_problems": 4, "eval.k": 2, "data.num_train": 100,
    "data.num_eval": 4,
}


def write_spec(path: Path, model: Path, **extra) -> Path:
    spec = {
        "name": "tiny-exp", "claim": "PRIME beats RLOO (test)", "paper": "PRIME Fig. 3",
        "base": "tiny", "overrides": {**SMALL, "model.policy": str(model)},
        "arms": {"prime": {"algorithm.reward_mode": "prime"},
                 "rloo": {"algorithm.reward_mode": "outcome"}},
        "seeds": [0, 1],
        "verdict": {"rule": "difference", "metric": "reward/outcome_mean_sampled",
                    "compare": [["prime", "rloo"]], "window": 2},
        "budget": "2 steps x 4 prompts", **extra,
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class Kill(Exception):
    pass


def test_experiment_runs_resumes_and_reports(tiny_model_dir, tmp_path):
    spec = load_spec(write_spec(tmp_path / "spec.yaml", tiny_model_dir))
    out = tmp_path / "exp"
    runs = spec.runs(out)
    assert [r.run_id for r in runs] == ["default--prime--s0", "default--rloo--s0",
                                        "default--prime--s1", "default--rloo--s1"]
    launches = []

    def kill_at_third(launch):
        launches.append((launch.name, launch.how))
        if len(launches) == 3:
            raise Kill  # the experiment process dies between its second and third run

    with pytest.raises(Kill):
        run_experiment(spec, out, in_process=main, on_launch=kill_at_third)
    assert launches == [("default--prime--s0", "fresh"), ("default--rloo--s0", "fresh"),
                        ("default--prime--s1", "fresh")]
    assert [run_state(r.run_dir, r.config(spec)) for r in runs[:2]] == [FINISHED, FINISHED]
    mtimes = {r.run_id: (r.run_dir / "metrics.jsonl").stat().st_mtime_ns for r in runs[:2]}
    # A report of a piece says so in its headline, not only in the runs line below it.
    text = write_report(spec, out, plots=False).read_text()
    assert "**Verdict from 2 of 4 runs (the rest not finished): inconclusive at this budget.**" \
        in text
    # The third run is interrupted after its first step: a checkpoint at step 1 of 2.
    third = runs[2]
    assert main(["train", "--config", "tiny", *third.overrides, "train.steps=1"]) == 0
    assert run_state(third.run_dir, third.config(spec)) == RESUME

    launches.clear()
    result = run_experiment(spec, out, in_process=main, on_launch=lambda x: launches.append(
        (x.name, x.how)))
    assert launches == [("default--prime--s1", "resume"), ("default--rloo--s1", "fresh")]
    assert result == {r.run_id: FINISHED for r in runs}
    assert {r.run_id: (r.run_dir / "metrics.jsonl").stat().st_mtime_ns
            for r in runs[:2]} == mtimes  # finished runs were not touched
    steps = [json.loads(x)["step"] for x in (third.run_dir / "metrics.jsonl").read_text().split(
        "\n") if x and "reward/outcome_mean_sampled" in x]
    assert steps == [1, 2]  # one line per step: the resumed run continued at step 2

    launches.clear()  # a third call finds nothing to do
    run_experiment(spec, out, in_process=main, on_launch=lambda x: launches.append(x.name))
    assert launches == []
    attempts = [json.loads(x) for x in (out / "attempts.jsonl").read_text().splitlines()]
    assert [a["rc"] for a in attempts] == [0, 0, 0, 0]
    assert all(a["machine"].endswith(" cores") for a in attempts)  # where each attempt ran

    report = write_report(spec, out)
    text = report.read_text()
    assert "**Verdict: inconclusive at this budget.**" in text
    assert "only 2 finished seed(s) in an arm (need 3)" in text
    assert "Runs finished: 4 of 4" in text
    assert f"; on {attempts[0]['machine']}" in text
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    for name in ("train_reward.png", "train_reward_wall.png", "eval_greedy.png",
                 "prm_abs.png", "response_len.png"):
        assert name in plots
        assert f"plots/{name}" in text
    assert (out / "plots" / "train_reward.png").read_bytes()[:4] == b"\x89PNG"
    # The final-metrics table has both arms with n = 2 seeds.
    assert "| prime | 2 |" in text and "| rloo | 2 |" in text
    # ... and the verdict metric run by run: each seed's mean over its (2) last steps
    per_seed = []
    for seed in (0, 1):
        rows = [json.loads(x) for x in (out / "runs" / f"default--rloo--s{seed}" /
                                        "metrics.jsonl").read_text().splitlines()]
        vals = [r["reward/outcome_mean_sampled"] for r in rows if "reward/outcome_mean_sampled" in r]
        per_seed.append(f"s{seed} {sum(vals[-2:]) / len(vals[-2:]):.3f}")
    assert "### Per seed: `reward/outcome_mean_sampled`" in text
    assert f"| rloo | {' · '.join(per_seed)} |" in text

    # An edited spec does not silently reuse runs trained with the old config.
    edited = load_spec(write_spec(tmp_path / "edited.yaml", tiny_model_dir,
                                  arms={"prime": {"prm.beta": 0.1},
                                        "rloo": {"algorithm.reward_mode": "outcome"}}))
    with pytest.raises(SpecError, match=r"run default--prime--s0: .* was trained with another "
                                        r"config .*prm.beta 0.05 -> 0.1"):
        run_experiment(edited, out, in_process=main)
    # ... nor runs evaluated otherwise: the report would state settings they never ran with
    edited = load_spec(write_spec(tmp_path / "edited.yaml", tiny_model_dir, overrides={
        **SMALL, "model.policy": str(tiny_model_dir), "eval.num_problems": 3}))
    with pytest.raises(SpecError, match=r"run default--prime--s0: .* was trained with another "
                                        r"config .*eval.num_problems 4 -> 3"):
        run_experiment(edited, out, in_process=main)
    # A verdict metric no run logs, close to one they do (a typo), stops the experiment with a
    # suggestion before it trains anything more for a verdict that cannot be computed.
    edited = load_spec(write_spec(tmp_path / "edited.yaml", tiny_model_dir, verdict={
        "rule": "difference", "metric": "reward/outcome_mean_sampld",
        "compare": [["prime", "rloo"]], "window": 2}))
    with pytest.raises(SpecError, match=r"verdict metric 'reward/outcome_mean_sampld': run "
                                        r"default--prime--s0 logs no such metric; did you mean "
                                        r"'reward/outcome_mean_sampled'\?"):
        run_experiment(edited, out, in_process=main)


def test_cli_experiment_with_sft_per_task_family(tmp_path):
    # Two task families, each with its own SFT model (spec key sft) that its runs start from.
    spec = write_spec(tmp_path / "one.yaml", Path("unused"), seeds=[0],
                      tasks={"arith": {"data.task_family": "arithmetic"},
                             "chains": {"data.task_family": "chains"}},
                      sft={"sft.steps": 2, "sft.batch_size": 8, "sft.warmup_steps": 0,
                           "sft.threads": 1})
    spec_text = yaml.safe_load(spec.read_text())
    spec_text["overrides"]["train.steps"] = 1
    spec.write_text(yaml.safe_dump(spec_text))
    out = tmp_path / "exp"
    assert main(["experiment", str(spec), "--out", str(out), "--in-process", "--no-plots"]) == 0
    assert (out / "report.md").is_file() and (out / "spec.yaml").is_file()
    assert sorted(p.name for p in (out / "runs").iterdir()) == [
        "arith--prime--s0", "arith--rloo--s0", "chains--prime--s0", "chains--rloo--s0"]
    for task in ("arith", "chains"):
        assert (out / "sft" / task / "config.json").is_file()
    run = json.loads((out / "runs" / "chains--rloo--s0" / "metrics.jsonl").read_text()
                     .splitlines()[0])
    assert run["step"] == 1
    state = json.loads((out / "runs" / "chains--rloo--s0" / "checkpoints" / "step_000001" /
                        "trainer_state.json").read_text())
    assert state["config"]["model"]["policy"] == str(out / "sft" / "chains")
    assert state["config"]["data"]["task_family"] == "chains"
    attempts = [json.loads(x)["run"] for x in (out / "attempts.jsonl").read_text().splitlines()]
    assert attempts[:2] == ["sft-arith", "sft-chains"]
    text = (out / "report.md").read_text()
    assert "| arith | prime vs rloo |" in text and "| chains | prime vs rloo |" in text


def test_a_missing_model_path_is_refused_before_any_run_starts(tiny_model_dir, tmp_path):
    # A walkthrough's spec named a chains SFT model it had not made: the arithmetic runs trained,
    # then every chains run failed one by one. The paths are checked once the prepare steps ran.
    missing = tmp_path / "runs" / "chains" / "sft"
    spec = load_spec(write_spec(tmp_path / "spec.yaml", tiny_model_dir, tasks={
        "arithmetic": {}, "chains": {"model.policy": str(missing)}}))
    launches = []
    with pytest.raises(SpecError, match=f"run chains--prime--s0: model.policy: model directory "
                       f"'{missing}' does not exist \\(nothing was started"):
        run_experiment(spec, tmp_path / "exp", in_process=main, on_launch=launches.append)
    assert launches == []


def test_a_missing_relative_model_path_is_refused_in_one_request(tiny_model_dir, tmp_path,
                                                                   monkeypatch):
    # `my_runs/sft` (one slash, not there) reads as a hub id: each run used to retry the hub for
    # 50 s, then fail, one after another. Now one request (offline here) refuses it at once.
    import huggingface_hub

    asked = []

    def model_info(name, timeout=None):
        asked.append(name)
        raise ConnectionError("offline")

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    spec = load_spec(write_spec(tmp_path / "spec.yaml", tiny_model_dir, arms={
        "prime": {"model.prm": "my_runs/sft"}, "rloo": {"algorithm.reward_mode": "outcome"}}))
    launches = []
    with pytest.raises(SpecError, match="run default--prime--s0: model.prm: 'my_runs/sft' is no "
                       "local directory and no cached hub model, and the hub cannot confirm it "
                       "\\(ConnectionError\\); check the path, or download the model first "
                       "\\(nothing was started"):
        run_experiment(spec, tmp_path / "exp", in_process=main, on_launch=launches.append)
    assert launches == [] and asked == ["my_runs/sft"]


@pytest.mark.slow
def test_subprocess_runs_side_by_side(tiny_model_dir, tmp_path):
    # The default launcher: each run a `primekit train` subprocess, here two at once with one
    # thread each (2 cores // --parallel 2).
    import subprocess
    import sys

    spec = write_spec(tmp_path / "spec.yaml", tiny_model_dir, seeds=[0])
    out = tmp_path / "exp"
    done = subprocess.run([sys.executable, "-c", "import sys; from primekit.cli import main; "
                           "sys.exit(main())", "experiment", str(spec), "--out", str(out),
                           "--parallel", "2", "--no-plots"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    attempts = [json.loads(x) for x in (out / "attempts.jsonl").read_text().splitlines()]
    assert sorted((a["run"], a["rc"]) for a in attempts) == [("default--prime--s0", 0),
                                                            ("default--rloo--s0", 0)]
    log = (out / "logs" / "default--prime--s0.log").read_text()
    assert "train.threads=" in log.splitlines()[1]  # the header names the launched command
    assert (out / "report.md").is_file()


def test_runs_shared_between_experiments(tiny_model_dir, tmp_path):
    # Experiment `a` trains prime and rloo; experiment `b` has the same prime run (a different
    # checkpoint cadence and thread count do not make it another run) and a new arm: only the new
    # arm is trained, prime is a link to a's run. Raising b's train.steps copies the link before
    # continuing it, so a's run never changes; --no-share trains everything.
    exps = tmp_path / "exps"
    spec_a = load_spec(write_spec(tmp_path / "a.yaml", tiny_model_dir, seeds=[0]))
    run_experiment(spec_a, exps / "a", in_process=main)
    a_prime = exps / "a" / "runs" / "default--prime--s0"
    a_metrics = (a_prime / "metrics.jsonl").read_bytes()

    def spec_b(**over):
        path = write_spec(tmp_path / "b.yaml", tiny_model_dir, seeds=[0],
                          arms={"prime": {"algorithm.reward_mode": "prime",
                                          "train.save_every": 1},
                                "beta": {"prm.beta": 0.1}},
                          verdict={"rule": "difference", "metric": "reward/outcome_mean_sampled",
                                   "compare": [["beta", "prime"]]})
        text = yaml.safe_load(path.read_text())
        text["overrides"].update(over)
        path.write_text(yaml.safe_dump(text))
        return load_spec(path)

    launches = []
    result = run_experiment(spec_b(), exps / "b", in_process=main,
                            on_launch=lambda x: launches.append(x.name))
    assert launches == ["default--beta--s0"]
    assert result == {"default--prime--s0": FINISHED, "default--beta--s0": FINISHED}
    assert progress(spec_b(), exps / "b") == (2, 2)
    b_prime = exps / "b" / "runs" / "default--prime--s0"
    assert b_prime.is_symlink() and b_prime.resolve() == a_prime.resolve()
    shared = [json.loads(x) for x in (exps / "b" / "attempts.jsonl").read_text().splitlines()
              if '"shared"' in x]
    assert [(s["run"], s["rc"]) for s in shared] == [("default--prime--s0", 0)]
    text = write_report(spec_b(), exps / "b", plots=False).read_text()
    assert "Runs finished: 2 of 2" in text
    assert "1 run(s) not trained here but linked to the same run" in text and ": a" in text
    # a's own runs are never links to b's (b's beta run differs from everything in a).
    run_experiment(spec_a, exps / "a", in_process=main, on_launch=lambda x: launches.append(1))
    assert launches == ["default--beta--s0"]

    # b continues to 3 steps: its prime run becomes a copy, resumed; a's run is untouched.
    launches.clear()
    run_experiment(spec_b(**{"train.steps": 3}), exps / "b", in_process=main,
                   on_launch=lambda x: launches.append((x.name, x.how)))
    assert sorted(launches) == [("default--beta--s0", "resume"), ("default--prime--s0", "resume")]
    assert not b_prime.is_symlink()
    assert (a_prime / "metrics.jsonl").read_bytes() == a_metrics
    assert not (exps / "b" / "runs" / "default--prime--s0.copying").exists()

    # A run that does not log a metric the spec's verdicts read of it (trained before the metric
    # existed) is not linked: here a verdict on a key no run logs. (max_runs=0: link what can be
    # linked, start nothing.)
    path = write_spec(tmp_path / "d.yaml", tiny_model_dir, seeds=[0],
                      verdict={"rule": "difference", "metric": "reward/never_logged",
                               "compare": [["prime", "rloo"]]})
    run_experiment(load_spec(path), exps / "d", in_process=main, max_runs=0)
    assert not any(p.is_symlink() for p in (exps / "d" / "runs").glob("*"))
    run_experiment(spec_a, exps / "e", in_process=main, max_runs=0)  # the same spec: linked
    assert all(p.is_symlink() for p in (exps / "e" / "runs").glob("*"))
    assert len(list((exps / "e" / "runs").glob("*"))) == 2

    # --no-share: a third experiment links nothing.
    run_experiment(spec_a, exps / "c", in_process=main, share=False, max_runs=0)
    assert not (exps / "c" / "runs").exists() or not any(
        p.is_symlink() for p in (exps / "c" / "runs").glob("*"))

    # An arm that sets how a pass is executed (the layout: NOT_THE_RUN) makes it the run for its
    # spec: a's prime run (the tiny config's layout) is linked to the arm with that layout only.
    layout = {"algorithm.reward_mode": "prime", "policy.max_tokens_per_micro_batch": 0}
    path = write_spec(tmp_path / "f.yaml", tiny_model_dir, seeds=[0],
                      arms={"padded": layout,
                            "packed": {**layout, "policy.max_tokens_per_micro_batch": 4096}},
                      verdict={"rule": "equivalence", "metric": "reward/outcome_mean_sampled",
                               "compare": [["packed", "padded"]]})
    assert load_spec(path).strict == ("policy.max_tokens_per_micro_batch",)
    run_experiment(load_spec(path), exps / "f", in_process=main, max_runs=0)
    tiny_layout = spec_a.runs(exps / "a")[0].config(spec_a).policy.max_tokens_per_micro_batch
    assert tiny_layout in (0, 4096)
    assert sorted(p.name for p in (exps / "f" / "runs").glob("*") if p.is_symlink()) == [
        "default--padded--s0" if tiny_layout == 0 else "default--packed--s0"]
    # `share: false` in the spec: as --no-share, nothing linked.
    text = yaml.safe_load(path.read_text())
    text["share"] = False
    path.write_text(yaml.safe_dump(text))
    run_experiment(load_spec(path), exps / "g", in_process=main, max_runs=0)
    assert not (exps / "g" / "runs").exists() or not any(
        p.is_symlink() for p in (exps / "g" / "runs").glob("*"))


def test_own_records_come_before_a_run_finished_beside(tiny_model_dir, tmp_path):
    # A report rebuilt from records reads the runs its spec recorded, even where another
    # experiment beside it has since finished the same config (packed-layout's packed PRIME runs
    # are prime-vs-rloo's PRIME arm today; prime-vs-rloo recorded padded ones). Here experiment
    # `a` trains and records both runs, then its metrics are changed in place (standing in for
    # other runs of the same config): `b` beside it restores the records, not links to `a`.
    exps, records = tmp_path / "exps", tmp_path / "records"
    spec = load_spec(write_spec(tmp_path / "a.yaml", tiny_model_dir, seeds=[0]))
    run_experiment(spec, exps / "a", in_process=main, records=records)
    recorded = {}
    for run in (exps / "a" / "runs").iterdir():
        path = run / "metrics.jsonl"
        recorded[run.name] = path.read_text()
        rows = [json.loads(x) for x in recorded[run.name].splitlines()]
        for row in rows:
            if "reward/outcome_mean_sampled" in row:
                row["reward/outcome_mean_sampled"] = 0.125  # not what was recorded
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    launches = []
    run_experiment(spec, exps / "b", in_process=main, records=records,
                   on_launch=lambda x: launches.append(x.name))
    assert launches == []
    for name, text in recorded.items():
        run = exps / "b" / "runs" / name
        assert not run.is_symlink() and (run / "record.json").is_file()
        assert (run / "metrics.jsonl").read_text() == text
    # Without records the run beside is the same run, and is linked.
    run_experiment(spec, exps / "c", in_process=main, max_runs=0)
    assert sorted(p.name for p in (exps / "c" / "runs").iterdir() if p.is_symlink()) == sorted(
        recorded)

    # A run directory where nothing was trained but a model was put (a spec's `prepare` step
    # restores online-vs-frozen-prm's trained PRM into `final/prm` of prime-vs-rloo's PRIME run of
    # seed 0): the record is restored beside the model, which is kept, not trained again
    # (with --overwrite, deleting the model another spec starts from).
    name = sorted(recorded)[0]
    model = exps / "d" / "runs" / name / "final" / "prm" / "model.safetensors"
    model.parent.mkdir(parents=True)
    model.write_text("a prepared model")
    launches.clear()
    run_experiment(spec, exps / "d", in_process=main, records=records,
                   on_launch=lambda x: launches.append(x.name))
    assert launches == []
    assert (model.parents[2] / "metrics.jsonl").read_text() == recorded[name]
    assert model.read_text() == "a prepared model"


def test_same_run_across_primekit_versions():
    # A stored config is the run asked for when every field agrees up to where and how it ran; a
    # field added to primekit since (absent from the stored config) only at its default.
    import copy

    from primekit.config import load_config, resolve_config
    from primekit.experiment.runner import same_run

    tiny = resolve_config("tiny")
    cfg = load_config(tiny, ["train.steps=100", "train.seed=1"])
    saved = json.loads(json.dumps(cfg.to_dict()))
    assert same_run(saved, cfg)
    moved = load_config(tiny, ["train.steps=100", "train.seed=1", "train.run_dir=elsewhere",
                                 "train.threads=1", "train.save_every=7"])
    assert same_run(saved, moved)  # where and how it ran are not the run
    padded = load_config(tiny, ["train.steps=100", "train.seed=1",
                                "policy.max_tokens_per_micro_batch=0",
                                "prm.max_tokens_per_micro_batch=0", "prm.packing=sorted"])
    assert cfg.policy.max_tokens_per_micro_batch > 0  # tiny packs; padded rows are the same run
    assert same_run(json.loads(json.dumps(padded.to_dict())), cfg)
    # ... unless a spec's arms vary the layout (Spec.strict): then it is the run; threads are not.
    strict = ("policy.max_tokens_per_micro_batch", "prm.max_tokens_per_micro_batch")
    assert not same_run(json.loads(json.dumps(padded.to_dict())), cfg, strict)
    assert same_run(saved, moved, strict)
    assert not same_run(saved, load_config(tiny, ["train.steps=100", "train.seed=2"]))
    # The SFT settings are not the RL run's (it starts from a fingerprinted SFT model): a record
    # made when tiny.yaml trained its SFT models for 1000 steps at 3e-3 is today's run.
    former_sft = load_config(tiny, ["train.steps=100", "train.seed=1", "sft.steps=1000",
                                    "sft.lr=3e-3", "sft.seed=5"])
    assert cfg.sft.steps == 600 and cfg.sft.lr == 1e-3
    assert same_run(json.loads(json.dumps(former_sft.to_dict())), cfg)
    older = copy.deepcopy(saved)
    del older["algorithm"]["credit"]  # a run from before algorithm.credit existed
    assert cfg.algorithm.credit == "sum"  # the default: what that run did
    assert same_run(older, cfg)
    assert not same_run(older, load_config(tiny, ["train.steps=100", "train.seed=1",
                                                    "algorithm.credit=min"]))
    gone = copy.deepcopy(saved)
    gone["algorithm"]["retired_switch"] = True  # a field primekit no longer has
    assert not same_run(gone, cfg)


def test_prepare_makes_what_the_runs_need_once(tmp_path, monkeypatch):
    # A spec whose runs read a model nobody has trained yet: its `prepare` step trains it (a
    # 2-step SFT), once; the second call finds it and starts nothing.
    monkeypatch.chdir(tmp_path)  # prepare paths are relative to where primekit runs
    path = write_spec(tmp_path / "spec.yaml", Path("models/sft"), seeds=[0],
                      prepare=[{"creates": "models/sft",
                                "run": "primekit sft --config tiny sft.steps=2 sft.batch_size=8 "
                                       "sft.warmup_steps=0 sft.threads=1 data.num_train=100 "
                                       "sft.out_dir=models/sft"}])
    text = yaml.safe_load(path.read_text())
    text["overrides"]["train.steps"] = 1
    path.write_text(yaml.safe_dump(text))
    spec = load_spec(path)
    assert spec.prepare[0].run[:3] == ["sft", "--config", "tiny"]  # "primekit" dropped
    launches = []
    result = run_experiment(spec, tmp_path / "exp", in_process=main,
                            on_launch=lambda x: launches.append((x.name, x.how)))
    assert launches == [("prepare-0", "prepare"), ("default--prime--s0", "fresh"),
                        ("default--rloo--s0", "fresh")]
    assert set(result.values()) == {FINISHED}
    assert (tmp_path / "models" / "sft" / "config.json").is_file()
    assert (tmp_path / "exp" / "logs" / "prepare-0.log").is_file()
    launches.clear()
    run_experiment(spec, tmp_path / "exp", in_process=main, on_launch=launches.append)
    assert launches == []


def test_cli_runs_several_specs_in_turn(tiny_model_dir, tmp_path, monkeypatch, capsys):
    # `primekit experiment A B`: A's runs train, B (the same runs under another name) links
    # them; each gets its report. --report-only over a spec with no runs says so and goes on.
    monkeypatch.chdir(tmp_path)
    paths = []
    for name in ("exp-a", "exp-b"):
        path = write_spec(tmp_path / f"{name}.yaml", tiny_model_dir, name=name, seeds=[0])
        text = yaml.safe_load(path.read_text())
        text["overrides"]["train.steps"] = 1
        path.write_text(yaml.safe_dump(text))
        paths.append(str(path))
    assert main(["experiment", *paths, "--in-process", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "report: runs/experiments/exp-a/report.md" in out
    assert "report: runs/experiments/exp-b/report.md" in out
    b_runs = tmp_path / "runs" / "experiments" / "exp-b" / "runs"
    assert sorted(p.name for p in b_runs.iterdir() if p.is_symlink()) == [
        "default--prime--s0", "default--rloo--s0"]
    other = write_spec(tmp_path / "exp-c.yaml", tiny_model_dir, name="exp-c", seeds=[0])
    assert main(["experiment", paths[0], str(other), "--report-only", "--no-plots"]) == 0
    assert "exp-c: no runs in runs/experiments/exp-c yet; no report" in capsys.readouterr().out


def test_run_records_carry_an_experiment_to_another_machine(tmp_path, monkeypatch, capsys):
    # With --records, the first machine trains the spec's prepare model (a 2-step SFT) and both
    # runs, and keeps the model and one record per run (config, input fingerprints, metrics). On
    # a second machine (here: the runs and the model deleted) the same call restores the model and
    # both runs and trains nothing; the report's tables are the same. A record counts only for
    # runs from bit-identical input files, and a restored run is not continued past its steps.
    from primekit.experiment.records import read_header

    monkeypatch.chdir(tmp_path)
    path = write_spec(tmp_path / "spec.yaml", Path("models/sft"), seeds=[0],
                      prepare=[{"creates": "models/sft",
                                "run": "sft --config tiny sft.steps=2 sft.batch_size=8 "
                                       "sft.warmup_steps=0 sft.threads=1 data.num_train=100 "
                                       "sft.out_dir=models/sft"}])
    spec = load_spec(path)
    records = tmp_path / "records"
    launches, seen = [], []

    def on_launch(x):
        launches.append(x.name)
        seen.append(sorted(p.name for p in records.rglob("*.jsonl.gz")))

    run_experiment(spec, tmp_path / "m1", in_process=main, records=records, on_launch=on_launch)
    assert launches == ["prepare-0", "default--prime--s0", "default--rloo--s0"]
    # Each run is recorded as soon as it finishes (a session cut short keeps what finished).
    assert seen == [[], [], ["default--prime--s0.jsonl.gz"]]
    files = sorted(p.relative_to(records).as_posix() for p in records.rglob("*.jsonl.gz"))
    assert files == ["tiny-exp/default--prime--s0.jsonl.gz", "tiny-exp/default--rloo--s0.jsonl.gz"]
    assert (records / "models" / "models--sft" / "model.safetensors").is_file()
    head = read_header(records / files[0])
    assert head["steps"] == 2 and head["config"]["train"]["seed"] == 0
    assert head["config"]["algorithm"]["reward_mode"] == "prime"
    assert "model.safetensors" in head["inputs"]["model.policy"]
    assert head["machine"].endswith(" cores")
    recorded = {f: (records / f).read_bytes() for f in files}

    def tables(out):  # the verdict and final-metrics rows, not the bookkeeping
        return [x for x in write_report(spec, out, plots=False).read_text().splitlines()
                if x.startswith("|")]

    before = tables(tmp_path / "m1")
    shutil.rmtree(tmp_path / "m1")
    shutil.rmtree(tmp_path / "models")
    launches.clear()
    result = run_experiment(spec, tmp_path / "m2", in_process=main, records=records,
                            on_launch=lambda x: launches.append(x.name))
    assert launches == []  # neither the model nor a run trained again
    assert set(result.values()) == {FINISHED}
    prime = tmp_path / "m2" / "runs" / "default--prime--s0"
    assert (prime / "record.json").is_file() and not (prime / "checkpoints").exists()
    assert tables(tmp_path / "m2") == before
    assert "2 run(s) restored from run records" in (tmp_path / "m2" / "report.md").read_text()
    assert {f: (records / f).read_bytes() for f in files} == recorded  # not written again

    # Other input files (the model changed by a byte): no record matches, and the kept copy is
    # said to differ. max_runs=0 restores what it can and starts nothing.
    gen = tmp_path / "models" / "sft" / "generation_config.json"
    gen.write_text(gen.read_text() + " ")
    capsys.readouterr()
    run_experiment(spec, tmp_path / "m3", in_process=main, records=records, max_runs=0)
    assert "models/sft differs from its copy" in capsys.readouterr().out
    # (`--list --records` counts by config and steps alone: the record is still there.)
    from primekit.experiment.records import find_record
    first = spec.runs(tmp_path / "m3")[0]
    assert find_record(first.config(spec), None, records).name == "default--prime--s0.jsonl.gz"
    assert not (tmp_path / "m3" / "runs").exists() or not any(
        (p / "record.json").exists() for p in (tmp_path / "m3" / "runs").iterdir())

    # More steps than the record: the restored runs are dropped (to be trained from the start).
    text = yaml.safe_load(path.read_text())
    text["overrides"]["train.steps"] = 3
    path.write_text(yaml.safe_dump(text))
    run_experiment(load_spec(path), tmp_path / "m2", in_process=main, records=records,
                   max_runs=0)
    assert not prime.exists()
