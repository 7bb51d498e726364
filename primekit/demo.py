"""`primekit demo`: the embedded default end to end on a CPU.

Build the tiny model, SFT it on the arithmetic demonstrations, SFT a second one (another seed)
for the implicit PRM and its reference to start from, evaluate the policy's SFT model, run PRIME
from it, evaluate again, and print a summary table. Nothing is downloaded. `--prm-init policy`
starts the PRM from the policy's own SFT model instead, as PRIME prescribes (PRM_INITS says why
that is not the default here).

The demo owns its `--run-dir` (a lock, `run_dir/.lock`, refuses a second demo there) and
replaces the outputs of an earlier demo in it; a directory that holds anything else is refused.
SIGINT/SIGTERM stop it at once before the RL phase (nothing there to resume: run it again) and
gracefully in it (a checkpoint, and the `primekit train ... --resume` line that continues it).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import time
from pathlib import Path

from primekit.config import CONFIG_DIR, ConfigError, load_config
from primekit.logging import console, print_table

# What a demo writes in its run directory (each SFT's logs and initial model sit beside its
# output), and the hidden files of locks and atomic writes that start with "." and these names.
# "tiny-init" is where demos before 2026-12-05 wrote the initial model ("sft-tiny-init" since).
OUTPUTS = ("sft", "sft-logs", "sft-tiny-init", "sft-prm", "sft-prm-logs", "sft-prm-tiny-init",
           "tiny-init", "prime", "summary.json")

# Where the implicit PRM and its reference start (`primekit demo --prm-init`).
#   "separate" (the default): an SFT model of seed sft.seed + 1, trained by the demo beside the
#     policy's. Chosen by the PRM's own accuracy on tuning seeds no claim uses (the
#     prm-init-tuning spec, 160 steps from SFT models of the tiny config's settings; seeds
#     100-102): mean pairwise accuracy over the last 40 steps 0.855 [0.828, 0.881], against
#     0.684 [0.653, 0.716] from the policy's own SFT model, and greedy accuracy not told apart
#     (-0.020 [-0.053, +0.013]); docs/experiments/prm-init-tuning.md.
#   "policy": the policy's SFT model, as PRIME prescribes. At this size that PRM co-adapts with
#     the policy it shares its start with (docs/experiments/prm-settings.md).
PRM_INITS = ("separate", "policy")


def demo_overrides(run_dir: Path, overrides: list[str] | None = None,
                   prm_init: str = "separate") -> list[str]:
    """The demo's settings on top of configs/tiny.yaml: its paths under run_dir, then the
    user's overrides (a user's model.prm or model.ref wins over --prm-init's)."""
    if prm_init not in PRM_INITS:
        raise ConfigError(f"demo --prm-init: expected one of {', '.join(PRM_INITS)}, "
                          f"got {prm_init!r}")
    sft_dir, rl_dir = run_dir / "sft", run_dir / "prime"
    own = [f"sft.out_dir={sft_dir}", f"model.policy={sft_dir}", f"train.run_dir={rl_dir}"]
    if prm_init == "separate":
        own += [f"model.prm={prm_sft_dir(run_dir)}", f"model.ref={prm_sft_dir(run_dir)}"]
    return [*own, *(overrides or [])]


def prm_sft_dir(run_dir: Path) -> Path:
    """The SFT model the demo trains for the PRM (--prm-init separate)."""
    return run_dir / "sft-prm"


def prm_sft_config(cfg, run_dir: Path):
    """The `primekit sft` config of the PRM's SFT model: the policy's, with seed sft.seed + 1
    and its own output; None when neither the PRM nor the reference starts from it
    (--prm-init policy, or a model.prm and model.ref of the user's)."""
    out = str(prm_sft_dir(run_dir))
    if out not in (cfg.model.prm, cfg.model.ref):
        return None
    return dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, seed=cfg.sft.seed + 1,
                                                            out_dir=out))


def _own(name: str) -> bool:
    return name in OUTPUTS or name == ".lock" or any(
        name.startswith(f".{own}.") for own in OUTPUTS)


def claim_run_dir(run_dir: Path) -> None:
    """Empty the outputs of an earlier demo in run_dir (its lock files stay); refuse a directory
    that holds anything a demo does not write."""
    if not run_dir.is_dir():
        return
    entries = sorted(run_dir.iterdir())
    foreign = [p.name for p in entries if not _own(p.name)]
    if foreign:
        raise ConfigError(f"demo --run-dir: {str(run_dir)!r} holds files a demo does not write "
                          f"({', '.join(foreign[:4])}); give a new or empty --run-dir")
    old = [p for p in entries if not p.name.endswith(".lock")]
    if old:
        console.print(f"demo: replacing the earlier demo in {run_dir}", markup=False,
                      highlight=False, soft_wrap=True)
    for p in old:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


# What a PRIME run directory may hold, in the order the closing line names them.
RUN_OUTPUTS = ("checkpoints", "final", "metrics.jsonl", "samples.jsonl", "tensorboard")


def run_outputs(rl_dir: Path) -> str:
    """The closing line about the PRIME run: only what it wrote (TensorBoard events only when
    the tensorboard package was there to write them)."""
    def wrote(name: str) -> bool:
        path = rl_dir / name
        if path.is_dir():
            return any(path.rglob("events.out.tfevents*" if name == "tensorboard" else "*"))
        return path.is_file()

    names = [n for n in RUN_OUTPUTS if wrote(n)]
    line = f"PRIME run ({', '.join(names) or 'nothing written'}): {rl_dir}"
    if "tensorboard" not in names:
        line += ("\nno TensorBoard events (tensorboard is not installed or train.report_to "
                 "leaves it out: pip install 'primekit[tensorboard]'); the metrics are in "
                 "metrics.jsonl, and `primekit dashboard " + str(rl_dir) + "` draws them")
    return line


def run_demo(run_dir: Path, overrides: list[str] | None = None,
             prm_init: str = "separate") -> dict:
    """The demo, owning run_dir (see the module docstring); returns the summary."""
    from primekit.trainer import rundir, signals

    argv = demo_overrides(run_dir, overrides, prm_init)
    cfg = load_config(CONFIG_DIR / "tiny.yaml", argv)  # a bad override fails before anything
    from primekit.validate import check_output_inputs

    check_output_inputs("sft", cfg)  # its data files and models before an earlier demo is emptied
    with rundir.lock(run_dir, "demo --run-dir"), signals.stop_at_once():
        claim_run_dir(run_dir)
        return _run(run_dir, cfg, argv, overrides, prm_init)


def _run(run_dir: Path, cfg, argv: list[str], overrides: list[str] | None,
         prm_init: str) -> dict:
    from primekit.trainer import signals

    flag = [] if prm_init == "separate" else ["--prm-init", prm_init]
    again = shlex.join(["primekit", "demo", "--run-dir", str(run_dir), *flag, *(overrides or [])])
    phase = ["during the SFT phase (nothing to resume)"]  # set as the demo goes on
    try:
        return _phases(run_dir, cfg, phase)
    except signals.Interrupted as e:
        e.note = f"{phase[0]}; start the demo again with: {again}"
        raise
    except (signals.Stopped, signals.Abandoned) as stop:  # in the RL phase
        from primekit.trainer import checkpoint as ckpt

        resumable = ckpt.latest_checkpoint(run_dir / "prime") is not None
        stop.command = (shlex.join(["primekit", "train", "--config", "tiny", *argv, "--resume"])
                        if resumable else again)
        raise


def _phases(run_dir: Path, cfg, phase: list[str]) -> dict:
    from primekit.factory import build_rl_trainer
    from primekit.trainer import rundir, signals
    from primekit.trainer.eval import evaluate_checkpoint
    from primekit.trainer.sft import run_sft

    start = time.perf_counter()
    sft_dir, rl_dir = run_dir / "sft", run_dir / "prime"
    prm_cfg = prm_sft_config(cfg, run_dir)
    n = 3 if prm_cfg is None else 4
    console.rule(f"[bold]1/{n}  SFT of the tiny model (the policy)")
    with rundir.owned_output(sft_dir, "sft.out_dir"):
        sft = run_sft(cfg)
    prm_sft = None
    if prm_cfg is not None:
        console.rule(f"[bold]2/{n}  SFT of the PRM's initial model (seed {prm_cfg.sft.seed})")
        with rundir.owned_output(Path(prm_cfg.sft.out_dir), "sft.out_dir"):
            prm_sft = run_sft(prm_cfg)
    phase[0] = f"while evaluating the SFT model (the SFT model is in {sft_dir})"
    console.rule(f"[bold]{n - 1}/{n}  Evaluate the SFT model")
    sft_eval = evaluate_checkpoint(cfg, str(sft_dir))
    note = weak_sft_note(sft_eval["eval/pass@1_greedy"], cfg.sft.seed)
    if note:
        console.print(note, style="yellow", markup=False, highlight=False, soft_wrap=True)
    console.rule(f"[bold]{n}/{n}  PRIME: {cfg.train.steps} RL steps")
    t_rl = time.perf_counter()
    # The RL phase is `primekit train` on the demo's config: its own lock on prime/, and a
    # graceful stop that saves a checkpoint and says how to continue.
    with rundir.owned(cfg, resume=False, overwrite=False), signals.graceful_stop():
        trainer = build_rl_trainer(cfg)
        history = trainer.train()
    phase[0] = f"after its RL phase finished (the run is in {rl_dir}; no summary.json)"
    rl_wall = time.perf_counter() - t_rl
    rl_eval = history[-1]
    wall = time.perf_counter() - start
    k = cfg.eval.k

    def sampled(metrics: dict) -> dict:  # avg@k and pass@k exist for k > 1 only
        return {f"avg@{k}": metrics[f"eval/avg@{k}"],
                f"pass@{k}": metrics[f"eval/pass@{k}"]} if k > 1 else {}

    rows = [
        {"model": "SFT", "pass@1 (greedy)": sft_eval["eval/pass@1_greedy"], **sampled(sft_eval),
         "steps": cfg.sft.steps, "wall (s)": sft["sft/wall_s"]},
        {"model": "PRIME", "pass@1 (greedy)": rl_eval["eval/pass@1_greedy"], **sampled(rl_eval),
         "steps": cfg.train.steps, "wall (s)": rl_wall},
    ]
    if prm_sft is not None:  # not evaluated: the PRM is trained on, not sampled from
        rows.insert(1, {"model": f"PRM's SFT (seed {prm_cfg.sft.seed})",
                        "steps": prm_cfg.sft.steps, "wall (s)": prm_sft["sft/wall_s"]})
    print_table(f"primekit demo: {len(trainer.eval_problems)} held-out problems", rows)
    gain = rl_eval["eval/pass@1_greedy"] - sft_eval["eval/pass@1_greedy"]
    console.print(f"greedy pass@1 change: {100 * gain:+.1f} points; total wall time {wall:.0f} s")
    pairwise, span = second_half_pairwise(history[:-1])
    if pairwise is not None:
        console.print(f"PRM pairwise accuracy over steps {span}: {pairwise:.3f} (0.5 = chance)")
    update_padding = [m["throughput/update_padding"] for m in history[:-1]
                      if "throughput/update_padding" in m]
    rl_padding = sum(update_padding) / len(update_padding) if update_padding else None
    if rl_padding is not None:
        console.print(f"padding computed: {100 * sft['sft/padding']:.1f}% of the SFT forwards' "
                      f"columns, {100 * rl_padding:.1f}% of the policy update's "
                      "(docs/performance.md)")
    console.print(f"peak memory (RSS) of this process: {peak_rss_gib():.2f} GiB")
    prm_line = (f"\nthe PRM's initial SFT model: {prm_cfg.sft.out_dir}" if prm_cfg is not None
                else "")
    console.print(f"SFT model: {sft_dir}{prm_line}\n{run_outputs(rl_dir)}", markup=False,
                  highlight=False, soft_wrap=True)
    summary = {"sft": sft_eval, "prime": rl_eval, "wall_s": wall, "rl_wall_s": rl_wall,
               "sft_wall_s": sft["sft/wall_s"], "rl_steps": cfg.train.steps,
               "prm_from": cfg.model.prm or cfg.model.policy}
    if prm_sft is not None:
        summary["prm_sft_wall_s"] = prm_sft["sft/wall_s"]
        summary["prm_sft_padding"] = prm_sft["sft/padding"]
    summary["sft_padding"] = sft["sft/padding"]
    if rl_padding is not None:
        summary["update_padding"] = rl_padding
    if pairwise is not None:
        summary["prm_pairwise_second_half"] = pairwise
    summary["peak_rss_gib"] = peak_rss_gib()
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def second_half_pairwise(steps: list[dict]) -> tuple[float | None, str]:
    """The PRM's mean pairwise accuracy over the second half of the RL steps' metrics (steps
    without a pair, where every group's outcomes were equal, left out), and the steps it spans
    ("81-160"); None when no step had one (no PRM, or no pairs)."""
    late = steps[len(steps) // 2:]
    values = [m["prm/acc_pairwise"] for m in late if "prm/acc_pairwise" in m]
    if not values:
        return None, ""
    return sum(values) / len(values), f"{len(steps) - len(late) + 1}-{len(steps)}"


# Below this greedy accuracy a demo's SFT model has not learnt the task (the tiny config's SFT,
# tuning seeds 100-107: 0.60 to 0.82; with the settings before 2026-12-05, 0.11 to 0.90;
# docs/demo.md).
WEAK_SFT_GREEDY = 0.5


def weak_sft_note(greedy: float, seed: int) -> str | None:
    """What to tell the user when the SFT model came out weak; None when it did not."""
    if greedy >= WEAK_SFT_GREEDY:
        return None
    return (f"note: the SFT model solves {greedy:.1%} of the held-out problems greedily (the "
            f"tiny config's SFT settings gave 60-82% on the seeds measured; docs/demo.md): with "
            f"sft.seed={seed} it has not learnt the task within sft.steps. PRIME runs from it "
            f"all the same. For a stronger start use more sft.steps, another sft.seed, or an "
            f"sft.lr no higher than the tiny config's 1e-3 (3e-3 left some seeds near 10%).")


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, GiB (getrusage: KiB on Linux, bytes on macOS)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)
