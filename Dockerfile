# syntax=docker/dockerfile:1
# Vivace: the gateway and its engine processes (one per GPU) in one image.
#
#   GPU (default):  docker build -t vivace:gpu .
#   CPU (tiny model, laptops):
#     docker build -t vivace:cpu --build-arg BASE_IMAGE=ubuntu:24.04 \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu --build-arg EXTRAS= .
#
# The CUDA base matches the torch build installed below: torch 2.13.0's Linux x86-64 wheel on PyPI is
# built for CUDA 13.0 (it requires cuda-toolkit 13.0.x), so the host driver must support CUDA 13.0
# (NVIDIA driver >= 580). compose.yaml passes the same arguments; see docs/deploy.md.
ARG BASE_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

# ---------------------------------------------------------------- build: a virtualenv with the deps
FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
ARG EXTRAS=gpu
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/vivace/bin:$PATH
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/vivace \
 && pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY engine engine
COPY gateway gateway
COPY loadtest loadtest
# Editable install: the code stays in /app, where the gateway also finds web/ (it serves /app/web).
RUN pip install --no-cache-dir -e ".${EXTRAS:+[$EXTRAS]}"

# ---------------------------------------------------------------- runtime: no compilers, no pip cache
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/vivace/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/vivace \
    HF_HOME=/models \
    TRITON_CACHE_DIR=/models/triton \
    VIVACE_HOST=0.0.0.0 \
    VIVACE_PORT=8000
# libopus0 for Opus output (opuslib loads it at run time); nothing else beyond Python.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libopus0 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --home-dir /home/vivace --uid 10001 --user-group vivace \
 && mkdir -p /models \
 && chown vivace:vivace /models
COPY --from=build /opt/vivace /opt/vivace
COPY --from=build /app /app
COPY web /app/web
WORKDIR /app
USER 10001:10001
# Model weights (the Hugging Face cache, HF_HOME=/models) and compiled Triton kernels live on a volume.
VOLUME ["/models"]
EXPOSE 8000
# /ready answers 200 once the engine has loaded, captured its graphs and warmed up; a first run that
# downloads the weights needs far longer than this default start period (compose.yaml sets its own).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30m --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('VIVACE_PORT', '8000'), timeout=3)"]
# Settings come from VIVACE_* environment variables (see `python -m gateway --help`).
ENTRYPOINT ["python", "-m", "gateway"]
