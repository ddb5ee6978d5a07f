"""Audio encodings the gateway emits: PCM16 as is, a streaming WAV header, Opus packets, Ogg pages.

The engine only ever produces int16 little-endian mono PCM at 24 kHz. Opus is optional at run
time: `opus_available()` says whether libopus could be loaded (opuslib + Debian's libopus0);
without it the server still starts and Opus requests get a clear `opus_unavailable` error.

Opus framing: 20 ms packets of 480 samples at 24 kHz (a 1920-sample codec frame is exactly four).
The encoder delays its output by `pre_skip` samples (its lookahead), so the tail is pushed out by
encoding silence until the packets cover samples + pre_skip; decoders drop the first `pre_skip`
decoded samples. Ogg pages (RFC 7845 / RFC 3533) are muxed here, one page per call, so streamed
HTTP responses can flush a page per engine chunk.
"""

from __future__ import annotations

import random
import struct
from functools import cache
from typing import Any

SAMPLE_RATE = 24000
OPUS_PACKET_SAMPLES = 480  # 20 ms at 24 kHz
OPUS_BITRATE = 32000
OPUS_COMPLEXITY = 5  # ecosystem.md 4.2: 'audio' at complexity 5 costs ~2 ms of CPU per audio second


class OpusUnavailable(RuntimeError):
    pass


def wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """RIFF/WAVE header for PCM16 mono of unknown length (sizes 0xFFFFFFFF, as streaming servers do)."""
    byte_rate = sample_rate * 2
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, byte_rate, 2, 16)
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
    )


@cache
def _opuslib() -> Any:
    try:
        import opuslib  # ctypes binding; loading fails here when libopus is missing

        opuslib.Encoder(SAMPLE_RATE, 1, "audio")
    except Exception as exc:  # ImportError, OSError from ctypes, or opuslib's own lookup error
        raise OpusUnavailable(
            f"Opus is not available on this server (libopus could not be loaded: {exc})"
        ) from exc
    return opuslib


def opus_available() -> bool:
    try:
        _opuslib()
    except OpusUnavailable:
        return False
    return True


class OpusPacketizer:
    """PCM16 bytes in, complete 20 ms Opus packets out; `finish()` pads and drains the tail."""

    def __init__(self, bitrate: int = OPUS_BITRATE, complexity: int = OPUS_COMPLEXITY) -> None:
        opuslib = _opuslib()
        self._encoder = opuslib.Encoder(SAMPLE_RATE, 1, "audio")
        self._encoder.bitrate = bitrate
        self._encoder.complexity = complexity
        self.pre_skip = int(self._encoder.lookahead)  # samples at 24 kHz
        self._pending = b""
        self.samples_in = 0
        self.packets_out = 0

    def encode(self, pcm: bytes) -> list[bytes]:
        self.samples_in += len(pcm) // 2
        data = self._pending + pcm
        packet_bytes = OPUS_PACKET_SAMPLES * 2
        whole = len(data) - len(data) % packet_bytes
        self._pending = data[whole:]
        return [self._encode_one(data[i : i + packet_bytes]) for i in range(0, whole, packet_bytes)]

    def finish(self) -> list[bytes]:
        """Pad with silence until decoded output covers every input sample past the lookahead."""
        packets: list[bytes] = []
        silence = bytes(OPUS_PACKET_SAMPLES * 2)
        if self._pending:
            packets.append(self._encode_one(self._pending + silence[len(self._pending) :]))
            self._pending = b""
        while self.packets_out * OPUS_PACKET_SAMPLES < self.samples_in + self.pre_skip:
            packets.append(self._encode_one(silence))
        return packets

    def _encode_one(self, frame: bytes) -> bytes:
        self.packets_out += 1
        return bytes(self._encoder.encode(frame, OPUS_PACKET_SAMPLES))


# ---------------------------------------------------------------- Ogg


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) if r & 0x80000000 else (r << 1)
        table.append(r & 0xFFFFFFFF)
    return table


_CRC_TABLE = _crc_table()


def ogg_crc(data: bytes) -> int:
    """Ogg's CRC-32: polynomial 0x04C11DB7, not reflected, initial value and final xor 0."""
    crc = 0
    table = _CRC_TABLE
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ table[(crc >> 24) ^ byte]
    return crc


class OggOpusMuxer:
    """Ogg Opus stream writer: `start()` gives the two header pages, `pages()` the audio pages."""

    def __init__(self, pre_skip: int, serial: int | None = None) -> None:
        self.serial = random.getrandbits(32) if serial is None else serial
        self.pre_skip_48k = pre_skip * 2  # OpusHead counts pre-skip at 48 kHz
        self._sequence = 0
        self._packets = 0

    def start(self) -> bytes:
        head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, self.pre_skip_48k, SAMPLE_RATE, 0, 0)
        vendor = b"vivace"
        tags = b"OpusTags" + struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", 0)
        return self._page([head], granule=0, header_type=0x02) + self._page([tags], granule=0, header_type=0)

    def pages(self, packets: list[bytes], *, last: bool = False, total_samples: int | None = None) -> bytes:
        """Pages holding `packets` (40 per page at most, so the lacing table always fits).

        On the last call pass `last=True` and the real sample count, so the end-of-stream granule
        position trims the padding that pushed the encoder's lookahead out.
        """
        out = bytearray()
        groups = [packets[i : i + 40] for i in range(0, len(packets), 40)] or ([[]] if last else [])
        for index, group in enumerate(groups):
            final = last and index == len(groups) - 1
            self._packets += len(group)
            granule = self._packets * OPUS_PACKET_SAMPLES * 2  # 48 kHz units, pre-skip included
            if final and total_samples is not None:
                granule = min(granule, self.pre_skip_48k + total_samples * 2)
            out += self._page(group, granule=granule, header_type=0x04 if final else 0)
        return bytes(out)

    def _page(self, packets: list[bytes], *, granule: int, header_type: int) -> bytes:
        lacing = bytearray()
        for packet in packets:
            lacing += b"\xff" * (len(packet) // 255) + bytes([len(packet) % 255])
        assert len(lacing) <= 255, "too many packets for one Ogg page"
        header = struct.pack(
            "<4sBBqIIIB", b"OggS", 0, header_type, granule, self.serial, self._sequence, 0, len(lacing)
        )
        self._sequence += 1
        page = bytearray(header + lacing + b"".join(packets))
        struct.pack_into("<I", page, 22, ogg_crc(bytes(page)))
        return bytes(page)
