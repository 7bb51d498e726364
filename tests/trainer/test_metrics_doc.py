"""docs/metrics.md lists every metric the RL trainer logs, and no timing/, prm/ or eval/ key that it
no longer logs: one step of each main variant (and one evaluation) on the tiny model."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from primekit.factory import build_rl_trainer
from primekit.verifiers.base import Verdict

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

# A metric key as written in the doc: namespace/name, lower case; `@k` stands for any integer k.
KEY = re.compile(r"[a-z_]+(?:/[a-z0-9_@]+)+")
# Documented keys that must each be produced by some variant below (so removed keys cannot linger).
CHECKED_BOTH_WAYS = ("timing/", "prm/", "eval/")


class ParityVerifier:
    """Correct when the response length is even: outcomes differ within groups, so the pairwise
    metrics and the outcome-only estimators are defined."""

    def verify(self, response, problem):
        return Verdict.correct() if len(response) % 2 == 0 else Verdict.incorrect()

    def verify_batch(self, responses, problems):
        return [self.verify(r, p) for r, p in zip(responses, problems)]


class AllCorrectVerifier(ParityVerifier):
    """Every response correct: the evaluation logs the keys about correct responses
    (eval/trace_error_greedy), whatever the tiny policy's greedy lengths."""

    def verify(self, response, problem):
        return Verdict.correct()


def documented_keys() -> set[str]:
    spans = re.findall(r"`([^`\n]+)`", DOC.read_text(encoding="utf-8"))
    return {s for s in spans if KEY.fullmatch(s)}


def generic(key: str) -> str:
    """eval/avg@4 -> eval/avg@k: the doc documents k-dependent keys by their pattern."""
    return re.sub(r"@\d+$", "@k", key)


def variants(sft_dir: Path, rm_dir: Path) -> dict[str, tuple[str, ...]]:
    return {
        "prime": (),
        "outcome": ("algorithm.reward_mode=outcome",),
        "grpo-dpo-double": ("algorithm.estimator=grpo", "prm.loss=dpo", "prm.forward=double"),
        "ppo-kl": ("algorithm.estimator=ppo", "algorithm.kl_coef=0.1"),
        "rloo-kl": ("algorithm.kl_coef=0.1",),  # the KL in the loss: policy/kl
        "prime-value": ("algorithm.estimator=prime-value",),
        "frozen-prm": ("prm.update=frozen", f"model.prm={sft_dir}"),
        # A frozen explicit RM: the SFT model with a fresh scalar head, saved as train-orm saves.
        "explicit-orm": ("algorithm.reward_mode=explicit-orm", f"explicit.model_path={rm_dir}"),
        "explicit-prm": ("algorithm.reward_mode=explicit-prm", f"explicit.model_path={rm_dir}"),
    }


def test_metrics_doc_matches_the_logged_keys(rl_config, sft_model_dir, tmp_path):
    from primekit.models.hf import load_tokenizer, save_model
    from primekit.reward_models.heads import init_reward_model

    start = time.perf_counter()
    rm_dir = tmp_path / "rm"
    save_model(init_reward_model(sft_model_dir, seed=1), load_tokenizer(sft_model_dir), rm_dir)
    produced: dict[str, set[str]] = {}  # key -> variants that logged it
    for name, extra in variants(sft_model_dir, rm_dir).items():
        trainer = build_rl_trainer(rl_config(*extra), verifier=ParityVerifier())
        metrics = trainer.train_step()
        assert metrics.get("train/skipped") == 0.0, f"{name}: the step made no update"
        if name == "prime":
            trainer.verifier = AllCorrectVerifier()
            metrics = {**metrics, **trainer.evaluate()}
        for key in metrics:
            produced.setdefault(key, set()).add(name)
    docs = documented_keys()

    missing = sorted(f"{k} ({', '.join(sorted(v))})" for k, v in produced.items()
                     if k not in docs and generic(k) not in docs)
    assert not missing, f"logged but not in docs/metrics.md: {missing}"

    logged = {generic(k) for k in produced} | set(produced)
    stale = sorted(k for k in docs if k.startswith(CHECKED_BOTH_WAYS) and generic(k) not in logged)
    assert not stale, f"in docs/metrics.md but logged by no variant: {stale}"
    print(f"{len(produced)} keys from {len(variants(sft_model_dir, rm_dir))} variants in "
          f"{time.perf_counter() - start:.1f} s")


def test_metrics_doc_lists_exactly_the_sft_keys(sft_model_dir):
    # The session-scoped SFT run (30 steps: lines at steps 0 and 25 and the last, 29) logs into
    # `<out_dir>-logs/metrics.jsonl`; its sft/ keys and the doc's are the same set.
    log = sft_model_dir.parent / (sft_model_dir.name + "-logs") / "metrics.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 25, 29]
    logged = {k for r in rows for k in r if k.startswith("sft/")}
    documented = {k for k in documented_keys() if k.startswith("sft/")}
    assert logged == documented, (logged - documented, documented - logged)
