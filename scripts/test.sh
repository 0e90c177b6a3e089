#!/usr/bin/env bash
# Set up a fresh machine and run the test suite (the README's second command).
# Installs the CPU build of torch from the local wheel cache, the package with its
# test extras, and Debian's Chromium for the web-chat browser test when apt is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test]'
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "chromium not installed; the browser test will be skipped"
fi
python -m pytest -q "$@"
