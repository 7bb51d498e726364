"""Every script in benchmarks/ runs at its smallest settings and prints what it measured.

Each test starts one script as `python benchmarks/NAME.py ...` from the repository root, on the
session's random-init tiny model (`tiny_model_dir`) where the script takes a model, and asserts
its exit status and a line of its real output (a timing, a table row), so that a benchmark
broken by a change elsewhere is caught. Run dirs and temporary files go under pytest's tmp_path
(TMPDIR too, for the scripts' own `tempfile` dirs), never into the repository. Scripts whose
optional dependency is missing here (TRL for vs_trl.py, vLLM for weight_sync.py) are checked on
the path they take without it: they say they are skipped and exit 0.

Slow: `.ci/run` runs these with `python -m pytest -m slow` (the whole file takes about a minute
on 2 cores).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"

# The demo's trainer config made small: no online filter (a random model solves nothing, so the
# filter would keep no group), 2 prompts x 4 samples per step, 16 new tokens.
SMALL_STEP = ["filter.enabled=false", "train.prompts_per_step=2", "rollout.max_new_tokens=16"]
NUMBER = r"[\d.,]+"


def run_benchmark(name: str, *args: object, tmp_path: Path, timeout: float = 300) -> str:
    """`python benchmarks/<name>.py args...` from the repository root; its stdout, after
    asserting exit status 0."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "200"}  # rich tables: no wrapping
    proc = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), *map(str, args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (f"benchmarks/{name}.py exited {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc.stdout


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (its `from common import ...` resolved), to test a
    function of it directly."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def assert_line(pattern: str, out: str) -> None:
    assert re.search(pattern, out, re.MULTILINE), f"no line matching {pattern!r} in:\n{out}"


TESTED = {"demo_packing", "idle_core", "op_profile", "optimizer_step", "packing", "padding_cost",
          "rollout", "scaling", "sft_step", "step_time", "verifiers", "vs_trl", "weight_sync"}


def test_every_benchmark_has_a_test():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - {"common"}
    assert scripts == TESTED, "add a test here for each script in benchmarks/"


def test_demo_packing(tmp_path):
    # Two seeds of a demo made small, each packed and padded: four demos, then the tables.
    small = ["sft.steps=4", "sft.threads=1", "train.steps=2", "train.threads=1",
             "data.num_train=64", "data.num_eval=4", "eval.num_problems=4", "eval.k=1",
             "train.prompts_per_step=2", "rollout.max_new_tokens=8", "filter.enabled=false",
             "train.report_to=[]"]
    out = run_benchmark("demo_packing", "--seeds", 0, 1, "--out", tmp_path / "d", *small,
                        tmp_path=tmp_path)
    for seed in (0, 1):
        for side in ("padded", "packed"):
            assert_line(rf"^\| {seed} {side} \| {NUMBER} \| {NUMBER} \| {NUMBER}% / {NUMBER}% \| ",
                        out)
        assert_line(rf"^\| {seed}: saved \| \*\*-?{NUMBER}%\*\* \| padding priced at "
                    rf"\*\*-?{NUMBER}%\*\*", out)
    # The seeds' order alternates: seed 0 packed first, seed 1 padded first.
    assert out.index("seed 0 packed: primekit demo") < out.index("seed 0 padded: primekit demo")
    assert out.index("seed 1 padded: primekit demo") < out.index("seed 1 packed: primekit demo")
    for name in ("wall time saved", "padding's priced share", "saved - priced share",
                 "SFTs and RL passes: time saved", "SFTs and RL passes: saved - priced share"):
        assert_line(rf"^{name}: mean [+-]{NUMBER}% \(95% t-interval [+-]{NUMBER} to "
                    rf"[+-]{NUMBER}, n 2\)$", out)
    # Finished demos are not run again: a second run prints the same tables, running nothing.
    again = run_benchmark("demo_packing", "--seeds", 0, 1, "--out", tmp_path / "d", *small,
                          tmp_path=tmp_path)
    assert "done already" in again and "primekit demo --run-dir" not in again
    assert again.split("| seed, side")[1] == out.split("| seed, side")[1]


def test_idle_core(tiny_model_dir, tmp_path):
    out = run_benchmark("idle_core", "--policy", tiny_model_dir, "--prompts", 2, "--rounds", 2,
                        "--run-dir", tmp_path / "run", *SMALL_STEP, tmp_path=tmp_path)
    assert_line(rf"^rollout \(2 prompts x 4\): {NUMBER} s on 2 threads, {NUMBER} s on 1", out)
    assert_line(rf"^PRM forward \+ backward \(8 rows\): {NUMBER} s on 2 threads", out)
    assert_line(rf"^one after the other on 2 threads: {NUMBER} s; side by side on 1 thread "
                rf"each: {NUMBER} s \(saves", out)


def test_op_profile(tiny_model_dir, tmp_path):
    out = run_benchmark("op_profile", "--policy", tiny_model_dir, "--tokens", 8, "--calls", 1,
                        "--attention", tmp_path=tmp_path)
    for name in ("update", "rollout"):
        assert_line(rf"^{name}: {NUMBER} s per call \(profiled\), {NUMBER} GFLOP", out)
        assert_line(rf"^  {name} +{NUMBER} s, floor {NUMBER} s", out)
    assert_line(rf"^  weight products +{NUMBER} s +{NUMBER}%", out)
    assert_line(r"^ +\d+ positions: baddbmm \+ bmm \(ships\) \d+, products \+ sum \d+, SDPA \d+",
                out)


def test_packing(tiny_model_dir, tmp_path):
    out = run_benchmark("packing", "--rows", 8, "--rounds", 1, "--model", tiny_model_dir,
                        "--profile", tmp_path=tmp_path)
    assert_line(r"^8 rows \(micro-batches of 8\), \d+ tokens, 1\.1 M parameters, float32, "
                r"1 thread\(s\), forward \+ backward, seconds", out)
    assert_line(r"^layout +padding +n +median +min +max +vs padded +build ms$", out)
    row = rf" +{NUMBER}% +1 +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}x +{NUMBER}$"
    for layout in ("padded-rows", "sorted-512", "packed-chosen", "packed-one-row",
                   "packed-segments"):
        assert_line(rf"^{layout}{row}", out)
        assert_line(rf"^{layout} +{NUMBER}x +{NUMBER} +{NUMBER} +{NUMBER}$", out)  # --profile
    assert_line(r"^packed-segments +0\.\d+x ", out)  # fewer columns than padded rows
    # The long-batch options (the paper's regime, scaled down): micro-batches of 4 rows, the
    # budgets given, bf16; packed-one-row and packed-chosen-1024 left out at these lengths.
    out = run_benchmark("packing", "--rows", 8, "--micro-rows", 4, "--prompt-max", 100,
                        "--response-max", 128, "--budgets", 1024, "--packed-budget", 1024,
                        "--dtype", "bfloat16", "--rounds", 1, "--model", tiny_model_dir,
                        tmp_path=tmp_path)
    assert_line(r"^8 rows \(micro-batches of 4\), \d+ tokens, .* bfloat16, ", out)
    for layout in ("padded-rows", "sorted-1024", "packed-chosen"):
        assert_line(rf"^{layout}{row}", out)
    assert "packed-one-row" not in out and "sorted-512" not in out


def test_segment_attention_scores_packed_rows_as_sdpa_does(tiny_model_dir):
    # packing.py's per-sequence attention (packed-segments) against transformers' SDPA over the
    # block-diagonal mask: the same log-probs and gradients on one packed micro-batch.
    packing = load_benchmark("packing")
    from transformers import AutoModelForCausalLM

    from primekit.models.logprobs import micro_batch_logprobs
    from primekit.rollout.batching import Layout, iter_layout

    packing.register_segment_attention()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    (mb,) = iter_layout(packing.demo_like_batch(12), Layout(12, 4, 4096, True))
    assert mb.input_ids.shape[0] < 12  # several sequences share a row
    out = {}
    for impl in ("sdpa", packing.SEGMENTS):
        model.config._attn_implementation = impl
        model.zero_grad(set_to_none=True)
        lp, _ = micro_batch_logprobs(model, mb)
        lp.sum().backward()
        out[impl] = lp.detach(), [p.grad.clone() for p in model.parameters()]
    (lp_a, g_a), (lp_b, g_b) = out.values()
    # float32, summed in another order (per sequence, not over the masked row): rounding only.
    torch.testing.assert_close(lp_b, lp_a, rtol=0, atol=1e-5)
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_segment_index_by_hand():
    packing = load_benchmark("packing")
    # Two rows of 4: sequences [0 1 2] and a padding column [0]; [0 1] and [0 1].
    gather, back, S, L = packing.segment_index(torch.tensor([[0, 1, 2, 0], [0, 1, 0, 1]]))
    assert (S, L) == (4, 3)
    # Sequence starts 0, 3, 4, 6; slots past an end repeat its last column (3 -> 3, 3; 5 -> 5).
    assert gather.tolist() == [0, 1, 2, 3, 3, 3, 4, 5, 5, 6, 7, 7]
    # Column i sits at sequence s, offset j: s*3 + j.
    assert back.tolist() == [0, 1, 2, 3, 6, 7, 9, 10]


def test_optimizer_step(tiny_model_dir, tmp_path):
    out = run_benchmark("optimizer_step", "--policy", tiny_model_dir, "--steps", 3, "--warmup", 1,
                        "--threads", 1, tmp_path=tmp_path)
    assert_line(r"^guarded optimiser step of .* \(1\.08M parameters in \d+ tensors, float32, cpu, "
                r"1 thread\(s\)\); shipped AdamW fused: True$", out)
    for side in ("shipped", "before"):
        assert_line(rf"^{side} +3 +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}$", out)
    assert_line(rf"^shipped / before: {NUMBER}x \(medians\)$", out)
    # The same update rule on both sides: after 4 steps of lr 1e-4 the weights differ by
    # rounding only (each step moves a weight by about 1e-4).
    m = re.search(r"^largest weight difference between the sides after 4 steps: (\S+)$", out,
                  re.MULTILINE)
    assert m and float(m[1]) < 1e-6, out


def test_padding_cost(tiny_model_dir, tmp_path):
    out = run_benchmark("padding_cost", "--policy", tiny_model_dir, "--rounds", 1, "--batches", 1,
                        "--threads", 1, "sft.batch_size=8", *SMALL_STEP, "--extra", 0, 4, 8,
                        tmp_path=tmp_path)
    for name, rows in (("sft-step", 8), ("rl-passes", 8)):
        columns = []
        for k in (0, 4, 8):
            m = re.search(rf"^ +0 +{k} +(\d+) +{NUMBER} +{NUMBER} +{NUMBER}$",
                          out.split(f"\n{name}:")[1], re.MULTILINE)
            assert m, out
            columns.append(int(m[1]))
        # k padding columns in each of the rows of every micro-batch, for every pass over them:
        # the columns grow by the same step from k = 0 to 4 and from 4 to 8.
        assert columns[1] - columns[0] == columns[2] - columns[1] > 0
        assert (columns[1] - columns[0]) % (4 * rows) == 0
        # One round of timings: on a busy machine the slope may come out negative.
        assert_line(rf"^{name}: marginal share -?{NUMBER}% \(median over 1 batch\(es\), ", out)
    for name in ("sft", "rl"):
        assert_line(rf"^{name}: (a padding column costs (at least|less than) its proportional "
                    rf"share|no marginal cost measured \(slope <= 0)", out)


def test_padding_cost_widen_adds_masked_columns_and_keeps_the_log_probs(tiny_model_dir):
    from primekit.models.hf import load_model
    from primekit.models.logprobs import micro_batch_logprobs
    from primekit.rollout.base import RolloutBatch
    from primekit.rollout.batching import iter_micro_batches

    widen = load_benchmark("padding_cost").widen
    # Two rows: prompts of 3 and 2 tokens (left-padded), responses of 2 and 3 (right-padded).
    batch = RolloutBatch(
        prompt_ids=torch.tensor([[5, 6, 7], [0, 8, 9]]),
        prompt_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]),
        response_ids=torch.tensor([[10, 11, 0], [12, 13, 14]]),
        response_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]), sampling_logprobs=torch.zeros(2, 3),
        finished=torch.tensor([True, True]), responses=["a", "b"])
    mb = next(iter_micro_batches(batch, 2))
    wide = widen(mb, 5)
    assert wide.input_ids.shape == (2, 6 + 5) and wide.tokens_computed == mb.tokens_computed + 10
    assert wide.attention_mask[:, :5].sum() == 0  # the new columns are masked out
    assert torch.equal(wide.input_ids[:, 5:], mb.input_ids)
    model = load_model(tiny_model_dir, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        a, _ = micro_batch_logprobs(model, mb)
        b, _ = micro_batch_logprobs(model, wide)
    # Positions come from the mask, so left padding changes no valid token's log-prob.
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_sft_step(tiny_model_dir, tmp_path):
    out = run_benchmark("sft_step", "--model", tiny_model_dir, "--steps", 2, "--warmup", 0,
                        "--threads", 1, "sft.batch_size=8", tmp_path=tmp_path)
    assert_line(r"^SFT steps of tiny \(8 demonstrations each\), 1 thread\(s\), packed budget 4096", out)
    rows = {}
    for name in ("padded", "packed"):
        m = re.search(rf"^{name} +({NUMBER})% +2 +{NUMBER} +{NUMBER} +{NUMBER} +({NUMBER})$", out,
                      re.MULTILINE)
        assert m, out
        rows[name] = float(m[1]), float(m[2])
    assert rows["packed"][0] < rows["padded"][0]  # packing removes padding
    # Two steps from one model: the same loss in both layouts, up to float rounding.
    assert abs(rows["packed"][1] - rows["padded"][1]) < 1e-4
    assert_line(rf"^packed / padded step time: {NUMBER}x \(medians\)$", out)


def test_rollout(tiny_model_dir, tmp_path):
    # The HF parts, and vLLM where it can be imported (an optional dependency: the vLLM tier's
    # venv, .ci/vllm.sh, runs this test too).
    vllm = importlib.util.find_spec("vllm") is not None
    engines = "hf,hf-model,generate" + (",vllm" if vllm else "")
    out = run_benchmark("rollout", "--policy", tiny_model_dir, "--engines", engines,
                        "--batch", 4, "--k", 2, "--max-new-tokens", 8, "--repeats", 1,
                        "--threads", 1, tmp_path=tmp_path, timeout=600)
    assert "rollout throughput: 4 sequences, max 8 new tokens" in out, out
    assert "HF engine, decode=model: decode steps through model forward" in out, out
    # The table is 120 columns wide: "primekit HF engine, decode=model" wraps after the comma.
    for engine in ("primekit HF engine", "primekit HF engine,", "transformers generate",
                   *(["vllm (primekit engine)"] if vllm else [])):
        assert_line(rf"^│ {re.escape(engine)} +│ +{NUMBER} │", out)
    if vllm:
        assert_line(rf"^vLLM weight sync: {NUMBER} ms mean of \d+", out)


def test_scaling(tiny_model_dir, tmp_path):
    out = run_benchmark("scaling", "--policy", tiny_model_dir, "--steps", 1,
                        "train.prompts_per_step=2", "rollout.max_new_tokens=16",
                        tmp_path=tmp_path)
    assert "2 ranks (1 thread each) ..." in out, out
    assert_line(rf"^│ step_s +│ +{NUMBER} │ +{NUMBER} │", out)
    assert_line(rf"^│ policy params +│ +{NUMBER} MiB │ +{NUMBER} MiB │ +{NUMBER} │", out)


@pytest.mark.parametrize("against, label", [
    ([], "PRIME / RLOO"),
    (["--against", "rollout.hf_decode=model"], "as given / with rollout.hf_decode=model"),
], ids=["prime-vs-rloo", "against"])
def test_step_time(tiny_model_dir, tmp_path, against, label):
    out = run_benchmark("step_time", "--policy", tiny_model_dir, "--steps", 1, "--warmup", 0,
                        "--run-dir", tmp_path / "run", *SMALL_STEP, "train.threads=1",
                        *against, tmp_path=tmp_path)
    assert "seconds per step (mean of 1, after 0 warm-up)" in out, out
    assert_line(rf"^│ policy_update +│ +{NUMBER} │ +{NUMBER} │", out)
    assert_line(rf"^{re.escape(label)} step time: {NUMBER}x", out)
    assert_line(rf"^per-step {re.escape(label)} ratio: n=1, median {NUMBER}", out)


@pytest.mark.parametrize("part, pattern", [
    ("math", rf"^math: 20 verdicts in {NUMBER} s = \d+/s with \d+ workers"),
    ("code", rf"^code: 164 HumanEval canonical solutions in {NUMBER} s = {NUMBER}/s"),
    ("mixed", rf"^mixed: 64 math \+ 16 code in one batch: {NUMBER} s = {NUMBER}/s"),
], ids=["math", "code", "mixed"])
def test_verifiers(tmp_path, part, pattern):
    out = run_benchmark("verifiers", "--n-math", 20, "--parts", part, tmp_path=tmp_path)
    assert_line(pattern, out)


def test_vs_trl(tiny_model_dir, tmp_path):
    if importlib.util.find_spec("trl") is None:  # TRL is not a dependency: the skip path
        out = run_benchmark("vs_trl", "--policy", tiny_model_dir, tmp_path=tmp_path)
        assert_line(r"^skipped: TRL cannot be imported here", out)
        return
    out = run_benchmark("vs_trl", "--policy", tiny_model_dir, "--repeats", 1, tmp_path=tmp_path)
    assert_line(rf"^primekit: median {NUMBER} s", out)
    assert_line(rf"^primekit / TRL step time: {NUMBER}x", out)


def test_weight_sync(tiny_model_dir, tmp_path):
    if importlib.util.find_spec("vllm") is None:  # vLLM is optional: the skip path
        out = run_benchmark("weight_sync", "--policy", tiny_model_dir, tmp_path=tmp_path)
        assert_line(r"^skipped: vLLM cannot be imported here", out)
        return
    out = run_benchmark("weight_sync", "--policy", tiny_model_dir, "--syncs", 1,
                        tmp_path=tmp_path)
    assert_line(rf"^ +shared: median +{NUMBER} ms", out)
    assert_line(rf"^shared / file median: {NUMBER}x", out)
