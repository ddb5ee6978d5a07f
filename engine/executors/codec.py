"""Codec executor: decode a chunk of frames for a batch of streams into int16 PCM ready to publish.

Each request owns one `CodecStatePool` slot from `open` to `close`. A chunk gathers the rows' frames
[B,16,N] from the code buffer on the device (each row from its own first frame), runs
`decode_incremental` (a fresh slot decodes its first audio in full; later chunks continue from the cached
state, equal to a full decode within float tolerance), then, on the host: drops the model's silent first
frame where that applies, trims leading silence (RMS onset, `engine.codec.silence`), releases what the
trimmer held back on the last chunk, and converts to int16 little-endian.

    codes [C,F,16] --gather--> [B,16,N] --decode_incremental--> wav [B, N*1920] fp32 --pinned--> int16 per row

`launch` queues all of it on the current CUDA stream and returns the host part as a function to run once the
stream has passed it (the engine loop waits on an event, never on the device).

Fast path (`graph_shapes` given): the same call runs on `CodecGraphs` over `FastCodecDecoder` (fused
SnakeBeta and codebook kernels; one CUDA graph per (batch, frames) shape, eager at the same shapes off
CUDA). Its pool has `RESERVED_SLOTS` more rows than streams for the runner's scratch row, which the pool
keeps out of its `slots` / `free_slots` count. `capture()` must run before the first `open`.

First chunks (`first_chunk_shapes` given, with the fast path): newcomers' first-chunk plans run on the generation
stream while the codec stream runs other plans, so they replay a second, small `CodecGraphs` (its own static
buffers, capture memory pool and scratch row) over the same state pool; the two never touch the same stream's
row at once (a request has one chunk in flight at a time), so they may run concurrently.

Primed streams (in-context voice cloning): `open(..., prime=(key, ref_codes))` starts the stream where a decode
of the voice's K reference frames left it (state and position K), so its audio continues the reference
exactly as the official decode of [ref_codes; codes] with the reference part cut off. The reference is
decoded once per `key` (a saved voice's save), on the plain decoder in chunks of `PRIME_CHUNK_FRAMES`, and
its state row is copied into every later stream of that voice; `launch` expects positions first_frames + K.

Precision (`bf16`, `tf32`, `fp32`) applies on both paths: the decoder must already be in its dtype
(`codec_dtype`), and the TF32 switches are set around every call (they only matter on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine.codec.model import CodecDecoder
from engine.codec.silence import SAMPLES_PER_FRAME, LeadingSilenceTrimmer, SilenceConfig
from engine.codec.stream import CodecStatePool, decode_incremental
from engine.fast.codec_fast import PRECISION_DTYPES, PRECISIONS, FastCodecDecoder, precision_flags
from engine.fast.codec_graphs import RESERVED_SLOTS, CodecGraphs
from engine.model.host_copy import device_ids


def codec_dtype(precision: str) -> torch.dtype:
    """The dtype to load the codec in for `precision`."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown codec precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return PRECISION_DTYPES[precision][0]


PRIME_CHUNK_FRAMES = 64  # frames per decode when priming a voice's state (bounds the activations' memory)


def fast_codec_decoder(decoder: CodecDecoder, precision: str, kernels: str, layout: str) -> FastCodecDecoder:
    """The `FastCodecDecoder` the engine's `--codec-kernels` and `--codec-layout` ask for: "ops" (its PyTorch
    twins), "fused" (fused attention) or "fused-convs" (also the conv-and-SnakeBeta kernels); "ncl" or
    "channels-last" activations."""
    return FastCodecDecoder(decoder, precision, fused_attention=kernels != "ops",
                            channels_last=layout == "channels-last", triton_convs=kernels == "fused-convs")


@dataclass(slots=True)
class _Stream:
    pool_slot: int
    trimmer: LeadingSilenceTrimmer
    skip_first_frame: bool
    offset: int = 0  # reference frames decoded into the state before the first generated frame


class CodecExecutor:
    def __init__(self, decoder: CodecDecoder, codes: Tensor, streams: int, silence: SilenceConfig, *,
                 precision: str = "tf32", graph_shapes: tuple[Sequence[int], Sequence[int]] | None = None,
                 first_chunk_shapes: tuple[Sequence[int], Sequence[int]] | None = None,
                 ragged: bool = False, kernels: str = "fused", layout: str = "channels-last") -> None:  # fmt: skip
        """`graph_shapes` = (batch sizes, frame counts) selects the fast path; None the plain decode.
        `kernels` (fast path): "ops", "fused" (`FastCodecDecoder`'s fused attention and `CodecGraphs`' one-kernel
        state write-back), or "fused-convs" (also its `triton_convs`); `layout`: the vocoder's "ncl" or
        "channels-last" activations (`fast_codec_decoder`).
        `first_chunk_shapes` (fast path only): the shapes of the first-chunk runner `launch(first_chunks=True)`
        replays; None: first chunks replay the main runner. `ragged`: `launch` takes a frame count per row (the
        fast path's steps are then built for it)."""
        codec_dtype(precision)  # validates the name
        if decoder.dtype not in PRECISION_DTYPES[precision]:
            raise ValueError(f"codec precision {precision!r} needs the codec loaded in "
                             f"{PRECISION_DTYPES[precision][0]}, got {decoder.dtype}")  # fmt: skip
        self.decoder = decoder
        self.codes = codes  # [C,F,16] int64 on the talker's device
        self.precision = precision
        self.silence = silence
        self._streams: dict[int, _Stream] = {}
        self._primed: dict[str, tuple[Tensor, int]] = {}  # prime key -> (state row [state elements], K)
        self.ragged = ragged
        self.graphs: CodecGraphs | None = None
        self.first_graphs: CodecGraphs | None = None  # first-chunk plans (the generation stream's own runner)
        if graph_shapes is None:
            self.pool = CodecStatePool(decoder.config, streams, decoder.device, decoder.dtype)
        else:
            runners = 2 if first_chunk_shapes is not None else 1
            self.pool = CodecStatePool(decoder.config, streams + runners * RESERVED_SLOTS, decoder.device,
                                       decoder.dtype)
            fused = kernels != "ops"
            fast = fast_codec_decoder(decoder, precision, kernels, layout)
            # The codec lane's replays overlap the generation stream's graphs: a capture stream of its own gives its
            # GEMMs a cuBLAS workspace of their own (engine/fast/codec_graphs.py). The first-chunk runner replays on
            # the generation stream, one graph at a time with the talker's and code predictor's, like them.
            self.graphs = CodecGraphs(fast, self.pool, *graph_shapes, ragged=ragged, own_capture_stream=True,
                                      state_kernel=fused)  # fmt: skip
            if first_chunk_shapes is not None:
                self.first_graphs = CodecGraphs(fast, self.pool, *first_chunk_shapes, ragged=ragged,
                                                state_kernel=fused)  # fmt: skip
            assert self.pool.slots == streams, "CodecGraphs reserves its scratch row out of the stream count"

    def capture(self) -> None:
        """Build (on CUDA: capture) every fast-path step shape. Before the first request is opened."""
        if self.graphs is not None:
            assert not self._streams, "capture the codec graphs before any stream is open"
            self.graphs.capture()
            if self.first_graphs is not None:
                self.first_graphs.capture()

    def open(self, request_id: int, *, skip_first_frame: bool, prime: tuple[str, Tensor] | None = None) -> None:
        """Give a new request empty codec state (position 0: its first chunk is a full decode), or with
        `prime` = (key, reference codes [K,16]) the state after those K frames (decoded once per key)."""
        assert request_id not in self._streams, f"request {request_id} already has a codec stream"
        slot = self.pool.alloc()
        offset = 0
        if prime is not None:
            try:
                offset = self._prime(slot, *prime)
            except Exception:
                self.pool.free(slot)
                raise
        self._streams[request_id] = _Stream(slot, LeadingSilenceTrimmer(self.silence), skip_first_frame, offset)

    def _prime(self, slot: int, key: str, ref_codes: Tensor) -> int:
        """Put the state after decoding `ref_codes` [K,16] into the fresh `slot`; -> K."""
        cached = self._primed.get(key)
        if cached is None:
            codes = ref_codes.to(self.decoder.device, torch.int64).T[None]  # [1,16,K]
            with torch.inference_mode(), precision_flags(self.precision):
                for start in range(0, codes.shape[-1], PRIME_CHUNK_FRAMES):  # the audio is the reference's: unused
                    decode_incremental(self.decoder, self.pool, [slot], codes[..., start : start + PRIME_CHUNK_FRAMES],
                                       expected_positions=[start])  # fmt: skip
            cached = self._primed[key] = (self.pool.flat[slot].clone(), codes.shape[-1])
        else:
            self.pool.load(slot, *cached)
        return cached[1]

    def forget_prime(self, key: str) -> None:
        """Drop the primed state cached under `key` (its voice was saved again or removed)."""
        self._primed.pop(key, None)

    def close(self, request_id: int) -> None:
        """Free the request's codec state. Idempotent (cancel and failure paths may both call it)."""
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            self.pool.free(stream.pool_slot)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def launch(self, request_ids: list[int], code_slots: list[int], first_frames: list[int], frames: int,
               final: list[bool], row_frames: list[int] | None = None, *,
               first_chunks: bool = False) -> Callable[[], dict[int, np.ndarray]]:
        """Queue the decode on the current stream without waiting for the device: row indices go up through
        pinned memory, the PCM comes down into a pinned buffer by an asynchronous copy. -> `finish()`, which the
        caller runs once the stream has passed this point (an event), and which then does the host part
        (silent first frame, leading-silence trim, int16) and returns request id -> int16 samples.
        `row_frames` (a ragged executor): each row's own frame count, at most `frames`, the batch's shape.
        `first_chunks`: a first-chunk plan (replayed on the first-chunk runner, when there is one)."""
        if row_frames is not None and not self.ragged:
            raise ValueError("this codec executor decodes the same frames for every row; build it with ragged=True")
        streams = [self._streams[r] for r in request_ids]
        device = self.codes.device
        start = device_ids(first_frames, device)[:, None]  # [B,1]
        rows = device_ids(code_slots, device)[:, None]  # [B,1]
        # A ragged row's padding frames read whatever codes come next (never past the buffer): ids, not audio.
        at = (start + torch.arange(frames, device=device)).clamp(max=self.codes.shape[1] - 1)
        chunk = self.codes[rows, at]  # [B,N,16]
        slots = [s.pool_slot for s in streams]
        positions = [f + s.offset for f, s in zip(first_frames, streams, strict=True)]  # the pool counts primed frames
        graphs = self.first_graphs if first_chunks and self.first_graphs is not None else self.graphs
        if graphs is not None:  # FastCodecDecoder applies the precision's switches itself
            wav = graphs.decode(slots, chunk.transpose(1, 2), expected_positions=positions,
                                check_code_values=False, frames=row_frames)  # [B,N*1920]
        else:
            with precision_flags(self.precision):
                wav = decode_incremental(self.decoder, self.pool, slots, chunk.transpose(1, 2),
                                         expected_positions=positions, check_code_values=False,
                                         frames=row_frames)  # [B,N*1920]
        wav = wav.to(torch.float32)
        if device.type == "cuda":
            host = torch.empty(wav.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(wav, non_blocking=True)  # read only after the caller's event says the copy is done
        else:
            host = wav
        first = list(first_frames)
        real = [frames] * len(request_ids) if row_frames is None else list(row_frames)

        def finish() -> dict[int, np.ndarray]:
            pcm_rows = host.numpy()
            out: dict[int, np.ndarray] = {}
            for i, (request_id, stream) in enumerate(zip(request_ids, streams, strict=True)):
                pcm = pcm_rows[i, : real[i] * SAMPLES_PER_FRAME]
                if stream.skip_first_frame and first[i] == 0:
                    pcm = pcm[SAMPLES_PER_FRAME:]  # decoded (later frames need its context), never heard
                pcm = stream.trimmer.push(pcm)
                if final[i]:
                    pcm = np.concatenate([pcm, stream.trimmer.finish()])
                out[request_id] = to_int16(pcm)
            return out

        return finish


def to_int16(pcm: np.ndarray) -> np.ndarray:
    """float samples in [-1, 1] -> int16 little-endian (round to nearest, as `engine.synthesize.write_wav`)."""
    return np.clip(np.round(pcm * 32767.0), -32768, 32767).astype("<i2")
