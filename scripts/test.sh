#!/usr/bin/env bash
# Install everything the test suite needs (Python packages, the official-implementation oracle
# venv, Debian's chromium and libopus via apt when root or passwordless sudo) and run it. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo -n"
if command -v apt-get >/dev/null && { [ -z "$SUDO" ] || sudo -n true 2>/dev/null; }; then
  missing=()
  { ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | grep -q libopus.so.0 || missing+=(libopus0)
  command -v chromium >/dev/null || missing+=(chromium)
  if [ ${#missing[@]} -gt 0 ]; then
    ($SUDO apt-get install -y --no-install-recommends "${missing[@]}" \
      || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; }) >/dev/null
  fi
fi

# torch first, pinned here only: the CPU wheel on this platform; package metadata stays unpinned.
$PY -c 'import torch' 2>/dev/null || $PY -m pip install -q torch==2.13.0
$PY -m pip install -q -e '.[test,loadtest]'
bash tools/oracle/setup.sh
bash tests/compat/frameworks/setup.sh

exec $PY -m pytest "$@"
