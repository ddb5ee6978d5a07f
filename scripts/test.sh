#!/usr/bin/env bash
# Install everything the test suite needs (Python packages, the official-implementation oracle
# venv, Debian's chromium and libopus when running as root) and run it. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  ldconfig -p | grep -q libopus.so.0 || missing+=(libopus0)
  command -v chromium >/dev/null || missing+=(chromium)
  if [ ${#missing[@]} -gt 0 ]; then
    (apt-get install -y --no-install-recommends "${missing[@]}" || { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }) >/dev/null
  fi
fi

# torch first, pinned here only: the CPU wheel on this platform; package metadata stays unpinned.
$PY -c 'import torch' 2>/dev/null || $PY -m pip install -q torch==2.13.0
$PY -m pip install -q -e '.[test,loadtest]'
bash tools/oracle/setup.sh

exec $PY -m pytest "$@"
