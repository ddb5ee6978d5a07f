"""Open-loop load generator for realtime TTS servers: Poisson arrivals, audible TTFA, playback underruns.

Entry point: `python -m loadtest run|sweep|plot|fake-server|selfbench` (see `loadtest/cli.py`).
Works against any OpenAI-compatible `POST /v1/audio/speech` server (raw PCM) and against Vivace's
native WebSocket protocol `vivace.speech.v1`. Methodology: docs/benchmarks.md.
"""
