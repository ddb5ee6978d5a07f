"""Streaming encoders: the engine's 24 kHz PCM16 chunks in, bytes of one output format out.

An `OutputFormat` names a codec, an output sample rate and (for lossy codecs) a bitrate; every
endpoint that lets a client choose its audio builds one (OpenAI `response_format`, ElevenLabs
`output_format`, Cartesia `output_format`, the native `session.update`) and gets a
`StreamEncoder` from `make_encoder`. Every encoder is stateful across chunks: `start()` gives the
header bytes (may be empty), `audio(pcm)` the bytes that became ready, `finish()` the tail, and
`samples_out` counts samples at the output rate.

- raw codecs (`pcm_s16le`, `pcm_f32le`, `mulaw`, `alaw`) and `wav` (a streaming header, then s16le)
  go through the soxr resampler (gateway/resample.py) and numpy;
- `opus` is Ogg Opus from libopus (gateway/audio.py), decoded at 48 kHz whatever the input rate;
- `mp3`, `aac` (ADTS) and `flac` come from PyAV, whose wheel brings the codecs (no system ffmpeg).
  PyAV is imported on first use only: benchmark runs that never ask for these formats never load it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gateway.audio import OggOpusMuxer, OpusPacketizer, wav_header
from gateway.g711 import alaw_encode, mulaw_encode
from gateway.resample import ENGINE_RATE, OUTPUT_RATES, Resampler

RAW_CODECS = ("pcm_s16le", "pcm_f32le", "mulaw", "alaw")
AV_CODECS = {
    "mp3": ("libmp3lame", "mp3", "s16p"),
    "aac": ("aac", "adts", "fltp"),
    "flac": ("flac", "flac", "s16"),
}
CODECS = (*RAW_CODECS, "wav", "opus", *AV_CODECS)
MEDIA_TYPES = {
    "pcm_s16le": "audio/pcm",
    "pcm_f32le": "audio/pcm",
    "mulaw": "audio/basic",
    "alaw": "audio/x-alaw-basic",
    "wav": "audio/wav",
    "opus": "audio/ogg",
    "mp3": "audio/mpeg",
    "aac": "audio/aac",
    "flac": "audio/flac",
}
DEFAULT_BITRATES = {"mp3": 64000, "aac": 64000, "opus": 32000}


class FormatUnavailable(RuntimeError):
    """The server cannot produce this format (a library failed to load); a clear error, never a crash."""


@dataclass(frozen=True, slots=True)
class OutputFormat:
    codec: str
    sample_rate: int = ENGINE_RATE
    bitrate: int | None = None

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"unknown codec {self.codec!r}")
        if self.sample_rate not in OUTPUT_RATES:
            raise ValueError(f"unsupported sample rate {self.sample_rate}")

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.codec]

    @property
    def bytes_per_sample(self) -> int | None:
        """For raw codecs (bytes <-> samples is a fixed ratio); None for containers and lossy codecs."""
        return {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}.get(self.codec)


class StreamEncoder(Protocol):
    samples_out: int

    def start(self) -> bytes: ...

    def audio(self, pcm: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


def make_encoder(fmt: OutputFormat) -> StreamEncoder:
    """The encoder for `fmt`; raises FormatUnavailable when its library cannot be loaded here."""
    if fmt.codec in RAW_CODECS or fmt.codec == "wav":
        return RawEncoder(fmt)
    if fmt.codec == "opus":
        return OggOpusEncoder(fmt)
    return AvEncoder(fmt)


class RawEncoder:
    """Headerless samples (or WAV: a streaming header, then s16le) at the output rate."""

    def __init__(self, fmt: OutputFormat) -> None:
        self.fmt = fmt
        self.samples_out = 0
        self._resampler = Resampler(fmt.sample_rate)

    def start(self) -> bytes:
        return wav_header(self.fmt.sample_rate) if self.fmt.codec == "wav" else b""

    def audio(self, pcm: bytes) -> bytes:
        return self._encode(self._resampler.process(pcm))

    def finish(self) -> bytes:
        return self._encode(self._resampler.process(b"", last=True))

    def _encode(self, samples: np.ndarray) -> bytes:
        self.samples_out += len(samples)
        codec = self.fmt.codec
        if codec == "mulaw":
            return mulaw_encode(samples)
        if codec == "alaw":
            return alaw_encode(samples)
        if codec == "pcm_f32le":
            return (samples.astype("<f4") / 32768.0).astype("<f4").tobytes()
        return samples.astype("<i2").tobytes()


class OggOpusEncoder:
    """Ogg Opus, one page per chunk so a streamed response can flush it (gateway/audio.py)."""

    def __init__(self, fmt: OutputFormat) -> None:
        from gateway.audio import OpusUnavailable

        try:
            self._opus = OpusPacketizer(bitrate=fmt.bitrate or DEFAULT_BITRATES["opus"])
        except OpusUnavailable as exc:
            raise FormatUnavailable(str(exc)) from None
        self._ogg = OggOpusMuxer(self._opus.pre_skip)
        self.samples_out = 0  # at the 24 kHz input rate (decoders output 48 kHz, twice as many)

    def start(self) -> bytes:
        return self._ogg.start()

    def audio(self, pcm: bytes) -> bytes:
        self.samples_out += len(pcm) // 2
        return self._ogg.pages(self._opus.encode(pcm))

    def finish(self) -> bytes:
        return self._ogg.pages(self._opus.finish(), last=True, total_samples=self._opus.samples_in)


class _Sink:
    """The file object PyAV's muxer writes into; `take()` hands over what was written so far."""

    def __init__(self) -> None:
        self._buffer = io.BytesIO()

    def write(self, data: Any) -> int:
        return self._buffer.write(data)

    def take(self) -> bytes:
        data = self._buffer.getvalue()
        self._buffer = io.BytesIO()
        return data


def _av() -> Any:
    try:
        import av
    except ImportError as exc:
        raise FormatUnavailable(f"this format needs PyAV (pip install av): {exc}") from None
    return av


class AvEncoder:
    """mp3, aac (ADTS) or flac through PyAV's bundled FFmpeg; packets are flushed as they are muxed."""

    def __init__(self, fmt: OutputFormat) -> None:
        av = _av()
        codec_name, container_format, sample_format = AV_CODECS[fmt.codec]
        self.fmt = fmt
        self.samples_out = 0
        self._av = av
        self._sink = _Sink()
        self._resampler = Resampler(fmt.sample_rate)
        self._container = av.open(self._sink, "w", format=container_format, options={"flush_packets": "1"})
        self._stream = self._container.add_stream(codec_name, rate=fmt.sample_rate, layout="mono")
        codec = self._stream.codec_context
        codec.format = sample_format
        bitrate = fmt.bitrate or DEFAULT_BITRATES.get(fmt.codec)
        if bitrate:
            codec.bit_rate = bitrate
        codec.open()
        self._frame_size = codec.frame_size or 1024
        self._float = sample_format.startswith("flt")
        self._pending = np.zeros(0, dtype=np.int16)
        self._pts = 0
        self._finished = False

    def start(self) -> bytes:
        self._container.start_encoding()
        return self._sink.take()

    def audio(self, pcm: bytes) -> bytes:
        self._feed(self._resampler.process(pcm), last=False)
        return self._sink.take()

    def finish(self) -> bytes:
        if not self._finished:
            self._finished = True
            self._feed(self._resampler.process(b"", last=True), last=True)
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
        return self._sink.take()

    def _feed(self, samples: np.ndarray, *, last: bool) -> None:
        self.samples_out += len(samples)
        data = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        size = self._frame_size
        whole = len(data) - len(data) % size
        if last and whole < len(data):
            whole = len(data)  # every codec here accepts a short last frame
        for start in range(0, whole, size):
            self._encode_frame(data[start : start + size])
        self._pending = data[whole:].copy()

    def _encode_frame(self, block: np.ndarray) -> None:
        array = (block.astype(np.float32) / 32768.0) if self._float else block
        frame = self._av.AudioFrame.from_ndarray(
            array.reshape(1, -1), format=self._stream.codec_context.format.name, layout="mono"
        )
        frame.sample_rate = self.fmt.sample_rate
        frame.pts = self._pts
        self._pts += len(block)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
