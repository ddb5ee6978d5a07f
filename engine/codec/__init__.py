"""The 12 Hz speech-tokenizer decoder ("codec"): codes [B, 16, T] -> 24 kHz audio, whole or streamed.

Modules: `config` (shape, torch-free), `state_layout` (per-stream state, torch-free), `layers` / `quantizer` /
`model` (the decoder), `weights` (official checkpoint loading, random weights), `stream` (state pool and
batched incremental decode), `chunking` (chunk-size policies, torch-free), `silence` (leading-silence
trimming, numpy). Empty of imports on purpose: torch-free parts stay importable without torch.
"""
