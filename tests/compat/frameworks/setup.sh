#!/usr/bin/env bash
# Create (or reuse) `.frameworks-venv/` at the repo root: the voice-agent frameworks and vendor SDKs
# that tests/compat/test_frameworks.py points at the gateway (Pipecat, LiveKit Agents plugins, the
# official ElevenLabs and Cartesia SDKs), pinned.
#
# Why a separate venv: these pin their own websockets/openai/aiohttp ranges, which must not move
# the project's. The venv sees the running interpreter's packages (tools/oracle/shared_venv.py, which
# also works when that interpreter is itself a venv, as in CI): numpy, torch (never a CUDA download),
# the test tools and the project; nothing here is installed into the interpreter itself.
# Idempotent: a stamp file records the requirement set; a matching stamp returns at once.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-python3}
VENV=.frameworks-venv
REQS=(
  "pipecat-ai==1.14.0"
  "livekit-agents==1.8.9"
  "livekit-plugins-elevenlabs==1.8.9"
  "livekit-plugins-cartesia==1.8.9"
  "livekit-plugins-openai==1.8.9"
  "elevenlabs==2.78.0"
  "cartesia[websockets]==4.2.0"
)
STAMP="$VENV/.vivace-frameworks-stamp"
WANT="$($PY -c 'import sys; print(sys.version.split()[0], sys.prefix)') ${REQS[*]}"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VENV/bin/python" -c 'import pipecat, livekit.agents' 2>/dev/null; then
  exit 0
fi
# Creates the venv if needed and (re)links the running interpreter's site-packages into it.
$PY tools/oracle/shared_venv.py "$VENV"
# Keep the interpreter's torch: a plain `torch` requirement would pull CUDA wheels.
TORCH=$($PY -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
CONSTRAINTS=$(mktemp)
[ -n "$TORCH" ] && echo "torch==$TORCH" > "$CONSTRAINTS"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$CONSTRAINTS" "${REQS[@]}"
rm -f "$CONSTRAINTS"
echo "$WANT" > "$STAMP"
