#!/usr/bin/env bash
# Download, into .whl/ at the repo root, the wheels the gateway and the load test need on the
# GPU machine and that its image lacks; print the line a device command must start with.
#
#   bash tools/device_wheels.sh            # then carry .whl in the device call
#
# Which packages: pyproject.toml's runtime dependencies plus the `loadtest` extra, with their
# transitive requirements, minus what the GPU image already holds (the package list in the
# device notes: torch, numpy, safetensors, tokenizers, huggingface-hub, httpx, httpcore, anyio,
# h11, click, idna, certifi, typing-extensions, matplotlib, nvidia-ml-py are all there). What is
# left: starlette, uvicorn, websockets, orjson, and for saved voices (`--clone-voices`)
# python-multipart (the gateway's multipart upload form), av (PyAV: `python -m engine.voice_tool`
# decodes the reference with it) and soxr (resampled output; needs numpy, which the image has). av's
# wheel is ~36 MB (34 MiB), nearly all of the ~35 MiB fetched, and everything a device call sends,
# .whl included, must fit the device's 64 MiB working-tree limit. av's wheel is tagged cp311-abi3
# and soxr's cp312-abi3, so the `--python-version 3.12` download below finds both. opuslib is not
# fetched: it ships as an sdist only and needs the system libopus, which that image lacks; the
# gateway starts without it and answers Opus requests with `opus_unavailable` (PCM and WAV, which
# the benchmark uses, are unaffected).
# Versions are the ones the CPU test suite runs with; override one with e.g. STARLETTE=1.10.0.
# One version of each package only: two stop the whole install there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=.whl

WHEELS=(
  "starlette==${STARLETTE:-1.10.0}"
  "uvicorn==${UVICORN:-0.54.0}"
  "websockets==${WEBSOCKETS:-17.4}"
  "orjson==${ORJSON:-3.13.0}"
  "python-multipart==${PYTHON_MULTIPART:-0.0.34}"
  "av==${AV:-18.1.0}"
  "soxr==${SOXR:-1.1.0}"
)

git check-ignore -q "$DEST/x.whl" || echo "/$DEST/" >>"$(git rev-parse --git-path info/exclude)"
mkdir -p "$DEST"
for spec in "${WHEELS[@]}"; do
  name=${spec%%==*}
  rm -f "$DEST/${name//-/_}"-*.whl  # keep one version of each (wheel names spell - as _)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "$spec"
done

echo "wheels in $DEST ($(du -sh "$DEST" | cut -f1)):"
ls -1 "$DEST"
echo "their requirements (all must be in the GPU image or in $DEST):"
for wheel in "$DEST"/*.whl; do
  unzip -p "$wheel" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | sed "s|^|  $(basename "$wheel"): |" || true
done
echo
echo "device command prefix (carry .whl):"
echo 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;'
