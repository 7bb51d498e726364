#!/usr/bin/env bash
# The browser tests (tests/viz/test_browser.py): headless Chromium from Debian's `chromium`
# package, driven by playwright from PyPI (playwright's own browser download is not used).
# Installs what is missing into the active Python environment, then runs `pytest -m browser`.
# Where Chromium cannot be installed (no apt-get, not root) the tests skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && [ -z "${PRIMEKIT_CHROMIUM:-}" ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "== installing chromium (apt-get)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "== cannot install chromium here (needs apt-get as root): the browser tests will skip"
    fi
fi
echo "== installing playwright (the version pyproject.toml's [browser] extra asks for)"
python -m pip install -q 'playwright>=1.40'
echo "== browser tests"
python -m pytest -m browser -q -rs tests/viz/test_browser.py tests/viz/test_browser_sim.py
