#!/usr/bin/env bash
# Create (or reuse) the oracle venv `.oracle-venv/` at the repo root: the official `qwen-tts`
# package, used ONLY as a test oracle by tests/parity (product code never imports it).
#
# Why a separate venv: qwen-tts pins transformers==4.57.3 (and older tokenizers / huggingface_hub)
# and declares torchaudio, gradio, onnxruntime, sox as dependencies. We install the package with
# --no-deps plus only what its model code imports. torchaudio is never installed (it would pull a
# CUDA torch); the oracle scripts stub it in-process (tools/oracle/stubs/). torch itself comes from
# the running interpreter's site-packages, so the venv costs no torch download: tools/oracle/shared_venv.py
# links them in, also when that interpreter is itself a venv (plain --system-site-packages would only
# show the base interpreter's packages, and pip would then pull a second torch into the oracle venv).
#
# Idempotent: a stamp file records the requirement set; a matching stamp returns at once.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
VENV=.oracle-venv
REQS=(
  "qwen-tts==0.1.1"
  "transformers==4.57.3"
  "accelerate==1.12.0"
  "einops"
  "librosa"
  "soundfile"
)
STAMP="$VENV/.vivace-oracle-stamp"
WANT="$($PY -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.__file__)') ${REQS[*]}"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
  && "$VENV/bin/python" -c 'from importlib.metadata import version; version("qwen-tts"); version("transformers")' 2>/dev/null; then
  exit 0
fi

# Creates the venv if needed and (re)links the running interpreter's site-packages into it.
$PY tools/oracle/shared_venv.py "$VENV"
# qwen-tts without its declared deps (torchaudio, gradio, onnxruntime, sox are not needed).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${REQS[0]}"
# What its model code needs; pip may shadow the global tokenizers / huggingface_hub inside the venv.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${REQS[@]:1}"
# Never let the oracle venv replace the interpreter's torch (a plain torch would pull CUDA wheels).
"$VENV/bin/python" - <<'PY'
import sys
import torch

site = [p for p in sys.path if p.startswith(sys.prefix) and p.endswith("site-packages")]
assert not any(torch.__file__.startswith(p) for p in site), f"torch was installed into the venv: {torch.__file__}"
PY
echo "$WANT" > "$STAMP"
echo "oracle venv ready: $VENV"
