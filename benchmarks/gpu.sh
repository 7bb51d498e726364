#!/usr/bin/env bash
# The GPU benchmark set of docs/performance.md ("On one H100"), in one short run on a machine
# with a CUDA device: PRIME against RLOO (packed, then padded rows), packed against padded rows
# for the tiny model and for a random-weight 0.5B-shape model at the paper's lengths, and our
# RLOO step against TRL's (skipped where TRL cannot be imported), the HF engine (eager and
# compiled decode) against generate, and the guarded optimiser step. About 3 minutes on one H100
# before the last three were added (not yet run there).
# Usage: bash benchmarks/gpu.sh SFT_DIR [OUT_DIR]   (SFT_DIR: the demo's SFT model)
# Run from an environment where primekit and a CUDA build of torch are installed.
set -uo pipefail
cd "$(dirname "$0")/.."
sft=${1:?usage: bash benchmarks/gpu.sh SFT_DIR [OUT_DIR]}
out=${2:-runs/bench-gpu}
mkdir -p "$out"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')" || exit 1
run() {  # run NAME COMMAND...: the command's output in $out/NAME.log, its tail on the screen
    local name=$1; shift
    echo "== $name"
    "$@" 2>&1 | grep -v -E "it/s\]|^step [0-9]" > "$out/$name.log"
    tail -n 25 "$out/$name.log"
}
steps=(--policy "$sft" --steps 10 --warmup 2 --run-dir "$out/step-time" train.device=cuda)
padded=(policy.max_tokens_per_micro_batch=0 prm.max_tokens_per_micro_batch=0)
run step_time python benchmarks/step_time.py "${steps[@]}"
run step_time_padded python benchmarks/step_time.py "${steps[@]}" "${padded[@]}"
run layouts_tiny python benchmarks/step_time.py "${steps[@]}" --against "${padded[@]}"
run packing_05b python benchmarks/packing.py --random-0.5b --rows 64 --micro-rows 8 \
    --prompt-max 200 --response-max 1024 --budgets 4096,8192 --packed-budget 8192 \
    --dtype bfloat16 --rounds 5
run vs_trl_eos python benchmarks/vs_trl.py --policy "$sft" --repeats 7
run vs_trl_eos_padded python benchmarks/vs_trl.py --policy "$sft" --repeats 7 "${padded[0]}"
run vs_trl_forced python benchmarks/vs_trl.py --policy "$sft" --repeats 5 --forced
# The HF engine against generate (target >= 1.5x; H200 at EOS 1.44x before the compiled step)
# and the compiled decode step (Triton compiles each attention span once: the warm-up calls).
run rollout_eos python benchmarks/rollout.py --policy "$sft" --engines hf,hf-compiled,generate \
    --repeats 7
run rollout_forced python benchmarks/rollout.py --policy "$sft" \
    --engines hf,hf-compiled,generate --repeats 7 --forced
run optimizer_step python benchmarks/optimizer_step.py --device auto
