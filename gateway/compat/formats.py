"""Vendor output-format names onto `OutputFormat` (gateway/encoders.py): ElevenLabs strings, Cartesia objects.

ElevenLabs: `pcm_<rate>` (8000 ... 48000), `ulaw_8000`, `alaw_8000`, `mp3_<rate>_<kbps>` and
`opus_48000_<kbps>` as its SDK lists them. Cartesia: `{"container": "raw" | "wav" | "mp3",
"encoding": "pcm_s16le" | "pcm_f32le" | "pcm_mulaw" | "pcm_alaw", "sample_rate": n, "bit_rate": n}`.
Anything else raises `FormatError` with a message naming what is supported.
"""

from __future__ import annotations

from typing import Any

from gateway.encoders import OutputFormat
from gateway.resample import OUTPUT_RATES

ELEVENLABS_MP3 = {
    "mp3_22050_32",
    "mp3_24000_48",
    "mp3_44100_32",
    "mp3_44100_64",
    "mp3_44100_96",
    "mp3_44100_128",
    "mp3_44100_192",
}
ELEVENLABS_OPUS_KBPS = (32, 64, 96, 128, 192)
ELEVENLABS_DEFAULT = "mp3_44100_128"
CARTESIA_ENCODINGS = {
    "pcm_s16le": "pcm_s16le",
    "pcm_f32le": "pcm_f32le",
    "pcm_mulaw": "mulaw",
    "pcm_alaw": "alaw",
}


class FormatError(ValueError):
    pass


def elevenlabs_formats() -> list[str]:
    """Every `output_format` value accepted, for error messages and docs."""
    return [
        *(f"pcm_{rate}" for rate in OUTPUT_RATES),
        "ulaw_8000",
        "alaw_8000",
        *sorted(ELEVENLABS_MP3),
        *(f"opus_48000_{kbps}" for kbps in ELEVENLABS_OPUS_KBPS),
    ]


def elevenlabs_format(name: str | None) -> OutputFormat:
    name = name or ELEVENLABS_DEFAULT
    if name in elevenlabs_formats():
        codec, rate, *kbps = name.split("_")
        bitrate = int(kbps[0]) * 1000 if kbps else None
        if codec == "pcm":
            return OutputFormat("pcm_s16le", int(rate))
        if codec in ("ulaw", "alaw"):
            return OutputFormat("mulaw" if codec == "ulaw" else "alaw", 8000)
        if codec == "opus":
            return OutputFormat("opus", 24000, bitrate)  # Ogg Opus decodes at 48 kHz whatever it was fed
        return OutputFormat("mp3", int(rate), bitrate)
    raise FormatError(
        f"unsupported output_format {name[:64]!r}; supported: {', '.join(elevenlabs_formats())}"
    )


def cartesia_format(spec: Any) -> OutputFormat:
    if not isinstance(spec, dict):
        raise FormatError('output_format must be an object like {"container": "raw", "encoding": ...}')
    container = spec.get("container", "raw")
    encoding = spec.get("encoding", "pcm_s16le")
    rate = spec.get("sample_rate", 24000)
    if isinstance(rate, bool) or not isinstance(rate, int) or rate not in OUTPUT_RATES:
        raise FormatError(f"output_format.sample_rate must be one of {', '.join(map(str, OUTPUT_RATES))}")
    if container == "raw":
        if not isinstance(encoding, str) or encoding not in CARTESIA_ENCODINGS:  # may be any JSON value
            raise FormatError(f"output_format.encoding must be one of {', '.join(CARTESIA_ENCODINGS)}")
        return OutputFormat(CARTESIA_ENCODINGS[encoding], rate)
    if container == "wav":
        if encoding != "pcm_s16le":
            raise FormatError("the wav container carries pcm_s16le only here")
        return OutputFormat("wav", rate)
    if container == "mp3":
        bit_rate = spec.get("bit_rate", 128000)
        if isinstance(bit_rate, bool) or not isinstance(bit_rate, int) or not 8000 <= bit_rate <= 320000:
            raise FormatError("output_format.bit_rate must be an integer between 8000 and 320000")
        return OutputFormat("mp3", rate, bit_rate)
    raise FormatError("output_format.container must be raw, wav or mp3")
