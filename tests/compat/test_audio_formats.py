"""Every output format decodes to the samples it was given, at the rate it was asked for."""

from __future__ import annotations

import io
import subprocess
import sys

import av
import numpy as np
import pytest

from gateway.compat.formats import FormatError, cartesia_format, elevenlabs_format, elevenlabs_formats
from gateway.encoders import OutputFormat, make_encoder
from gateway.g711 import alaw_encode, mulaw_encode
from gateway.resample import OUTPUT_RATES, Resampler
from tests.gateway.helpers import REPO

RATE = 24000


def tone(seconds: float = 1.0, hz: float = 440.0) -> bytes:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * hz * t) * 8000).astype("<i2").tobytes()


def encode_in_chunks(fmt: OutputFormat, pcm: bytes, chunk_bytes: int) -> bytes:
    encoder = make_encoder(fmt)
    parts = [encoder.start()]
    parts += [encoder.audio(pcm[i : i + chunk_bytes]) for i in range(0, len(pcm), chunk_bytes)]
    parts.append(encoder.finish())
    return b"".join(parts)


def decode(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    samples = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
    return samples, frames[0].sample_rate


@pytest.mark.parametrize("rate", OUTPUT_RATES)
def test_streaming_resampler_matches_one_shot_conversion(rate: int) -> None:
    pcm = tone(1.3)
    whole = Resampler(rate)
    one_shot = np.concatenate([whole.process(pcm), whole.process(b"", last=True)])
    chunked = Resampler(rate)
    # Uneven chunk sizes, including ones smaller than the filter, as engine chunks are.
    sizes = [3840, 17, 7680, 2, 15360, 999]
    pieces, offset, i = [], 0, 0
    while offset < len(pcm):
        size = sizes[i % len(sizes)] * 2
        pieces.append(chunked.process(pcm[offset : offset + size]))
        offset += size
        i += 1
    pieces.append(chunked.process(b"", last=True))
    # The filter state carries across chunks: the same samples however the stream is cut.
    assert np.array_equal(np.concatenate(pieces), one_shot)
    assert abs(len(one_shot) - round(1.3 * rate)) <= 1


@pytest.mark.parametrize(
    ("fmt", "decoded_rate"),
    [
        (OutputFormat("mp3", 22050, 32000), 22050),
        (OutputFormat("mp3", 44100, 128000), 44100),
        (OutputFormat("aac", 24000), 24000),
        (OutputFormat("flac", 16000), 16000),
        (OutputFormat("wav", 8000), 8000),
        (OutputFormat("opus", 24000), 48000),
    ],
)
def test_container_formats_stream_and_decode_at_their_rate(fmt: OutputFormat, decoded_rate: int) -> None:
    pcm = tone(1.0)
    data = encode_in_chunks(fmt, pcm, 3840)
    samples, rate = decode(data)
    assert rate == decoded_rate
    # Lossy codecs add priming and padding of at most a few frames; never lose audio.
    assert decoded_rate <= len(samples) <= decoded_rate * 1.12
    spectrum = np.abs(np.fft.rfft(samples[: decoded_rate // 2].astype(float)))
    assert abs(np.argmax(spectrum) * 2 - 440) <= 4  # the tone survived (bins are 2 Hz wide)


def test_mp3_bytes_come_out_while_streaming_not_only_at_the_end() -> None:
    encoder = make_encoder(OutputFormat("mp3", 22050, 32000))
    encoder.start()
    pcm = tone(1.0)
    produced = [len(encoder.audio(pcm[i : i + 3840])) for i in range(0, len(pcm), 3840)]
    assert sum(1 for n in produced if n > 0) >= len(produced) // 2


@pytest.mark.parametrize(("codec", "rate", "width"), [("pcm_s16le", 16000, 2), ("pcm_f32le", 44100, 4)])
def test_raw_pcm_has_the_requested_rate_and_width(codec: str, rate: int, width: int) -> None:
    data = encode_in_chunks(OutputFormat(codec, rate), tone(1.0), 4000)
    assert abs(len(data) // width - rate) <= 1
    if codec == "pcm_f32le":
        assert np.abs(np.frombuffer(data, "<f4")).max() == pytest.approx(8000 / 32768, rel=0.02)


@pytest.mark.parametrize(("encode", "codec"), [(mulaw_encode, "pcm_mulaw"), (alaw_encode, "pcm_alaw")])
def test_g711_round_trips_within_its_quantisation_step(encode, codec: str) -> None:  # type: ignore[no-untyped-def]
    x = np.arange(-32768, 32768, 7, dtype=np.int32).astype(np.int16)
    decoder = av.CodecContext.create(codec, "r")
    decoder.sample_rate, decoder.layout = 8000, "mono"
    decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in decoder.decode(av.Packet(encode(x)))])
    error = np.abs(decoded.astype(np.int32) - x.astype(np.int32))
    assert len(decoded) == len(x)
    assert np.all(error <= np.abs(x.astype(np.int32)) // 16 + 40)  # 4-bit mantissa: ~1/32 of the value
    assert np.array_equal(np.sign(decoded[np.abs(x) > 64]), np.sign(x[np.abs(x) > 64]))


def test_vendor_format_names_map_to_codecs_rates_and_bitrates() -> None:
    assert elevenlabs_format("pcm_32000") == OutputFormat("pcm_s16le", 32000)
    assert elevenlabs_format("ulaw_8000") == OutputFormat("mulaw", 8000)
    assert elevenlabs_format("mp3_22050_32") == OutputFormat("mp3", 22050, 32000)
    assert elevenlabs_format("opus_48000_64").codec == "opus"
    assert elevenlabs_format(None).codec == "mp3"
    assert len(elevenlabs_formats()) == 7 + 2 + 7 + 5
    for bad in ("pcm_11025", "wav_44100", "mp3_48000_320", ""):
        with pytest.raises(FormatError):
            elevenlabs_format(bad or "nope")
    assert cartesia_format(
        {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 44100}
    ) == OutputFormat("pcm_f32le", 44100)
    assert cartesia_format({"container": "raw", "encoding": "pcm_alaw", "sample_rate": 8000}).codec == "alaw"
    assert cartesia_format({"container": "mp3", "sample_rate": 44100, "bit_rate": 64000}).bitrate == 64000
    for bad in ({"container": "ogg"}, {"encoding": "pcm_s24le"}, {"sample_rate": 11025}, "raw"):
        with pytest.raises(FormatError):
            cartesia_format(bad)


def test_the_gateway_loads_pyav_only_when_a_format_needs_it() -> None:
    probe = (
        "import sys, gateway.app, gateway.encoders as e; before = 'av' in sys.modules; "
        "e.make_encoder(e.OutputFormat('wav', 16000)); mid = 'av' in sys.modules; "
        "e.make_encoder(e.OutputFormat('mp3', 22050)); print(before, mid, 'av' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "True"]
