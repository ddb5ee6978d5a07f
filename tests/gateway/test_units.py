"""Pure pieces of the gateway, tested with explicit inputs and times: text streaming, clocks, protocol
parsing and framing, limits, settings, audio containers, metrics."""

from __future__ import annotations

import random
import struct

import numpy as np
import opuslib
import pytest
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE

from engine.text import TextTokenizer
from engine.text.tokenizer import MISTRAL_FIX_SPLIT_REGEX, QWEN2_SPLIT_REGEX
from gateway import protocol as p
from gateway.audio import OPUS_PACKET_SAMPLES, OggOpusMuxer, OpusPacketizer, ogg_crc, wav_header
from gateway.clock import NS_PER_MS, ClockOffset, PlaybackClock
from gateway.context import Context
from gateway.limits import Limits, TokenBucket
from gateway.metrics import GatewayMetrics
from gateway.settings import parse_settings
from gateway.textstream import TextStream
from gateway.voices import Voice

CORPUS = [
    "Hello, world! It's a fine day; isn't it? I'll say: 42 apples, 7 pears...",
    "iPhone users   type\nnew lines\r\n and tabs\tfast. Ünïcödé, naïve café, e\u0301cole",
    "你好，世界。こんにちは、世界！ Mixed 中文 and English, 2024-05-01.",
    "Quotes \"like this\" and 'that', (parens) [brackets] {braces} #hash @at $5.00 50% a&b",
]


def byte_level_bpe(split_regex: str) -> Tokenizer:
    """A small Qwen2-style byte-level BPE (same pre-tokenizer shape), trained on the corpus."""
    tokenizer = Tokenizer(BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    return tokenizer


class _Encoder:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)


@pytest.mark.parametrize("regex", [QWEN2_SPLIT_REGEX, MISTRAL_FIX_SPLIT_REGEX], ids=["qwen2", "mistral_fix"])
def test_streamed_pieces_tokenize_exactly_like_the_whole_text(regex: str) -> None:
    encoder = _Encoder(byte_level_bpe(regex))
    rng = random.Random(5)
    for text in CORPUS:
        for _ in range(40):
            cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
            chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            stream = TextStream(encoder)
            pieces = [stream.append(chunk) for chunk in chunks] + [stream.flush()]
            ids = [i for piece in pieces if piece is not None for i in piece.ids]
            assert ids == encoder.encode(text), chunks
            assert sum(piece.chars for piece in pieces if piece is not None) == len(text)


def test_the_last_word_is_held_back_until_more_text_or_a_flush() -> None:
    stream = TextStream(TextTokenizer.fallback())
    assert stream.append("Hello") is None
    assert stream.append(" wor") is not None and stream.pending == " wor"
    assert stream.append("ld ") is not None and stream.pending == " "
    flushed = stream.flush()
    assert flushed is not None and flushed.chars == 1 and stream.pending == ""


def test_reserved_token_strings_are_refused_even_across_appends() -> None:
    tokenizer = TextTokenizer.fallback()
    stream = TextStream(tokenizer, tokenizer.special_strings)
    stream.append("fine text <|im_")
    with pytest.raises(ValueError, match="reserved"):
        stream.append("end|> more")


def test_leading_line_breaks_are_dropped_from_the_text() -> None:
    stream = TextStream(TextTokenizer.fallback())
    stream.append("\n\nHi")
    piece = stream.flush()
    assert piece is not None and piece.chars == 2


def test_server_playback_model_starts_at_first_audio_sent() -> None:
    clock = PlaybackClock(network_margin_ns=0)
    assert clock.deadline_ns(0) is None
    clock.on_audio_sent(24000, now_ns=1_000 * NS_PER_MS)  # 1 s of audio at t = 1 s
    clock.on_audio_sent(12000, now_ns=1_200 * NS_PER_MS)
    assert clock.deadline_ns(1_300 * NS_PER_MS) == 2_500 * NS_PER_MS


def test_reports_move_the_deadline_and_the_network_margin_comes_off() -> None:
    clock = PlaybackClock(network_margin_ns=10 * NS_PER_MS)
    clock.on_audio_sent(48000, now_ns=0)  # 2 s sent at t = 0
    clock.on_report(
        played_samples=12000, report_ns=1_000 * NS_PER_MS
    )  # the client started late: 0.5 s played at 1 s
    assert clock.deadline_ns(1_000 * NS_PER_MS) == (1_000 + 1_500 - 10) * NS_PER_MS
    clock.on_report(played_samples=6000, report_ns=900 * NS_PER_MS)  # stale: ignored
    assert clock.played_samples == 12000
    clock.on_report(played_samples=0, report_ns=2_000 * NS_PER_MS)  # going backwards: ignored
    assert clock.report_ns == 1_000 * NS_PER_MS


def test_a_report_before_playback_started_keeps_all_audio_ahead() -> None:
    clock = PlaybackClock(network_margin_ns=0)
    clock.on_audio_sent(24000, now_ns=0)
    clock.on_report(played_samples=0, report_ns=300 * NS_PER_MS)
    assert clock.deadline_ns(500 * NS_PER_MS) == 1_500 * NS_PER_MS


def _context(sample_rate: int = 24000) -> Context:
    return Context("c", 1, Voice(speaker="ryan"), "english", "", "pcm", TextStream(TextTokenizer.fallback()), 0,
                   sample_rate=sample_rate, clock=PlaybackClock(sample_rate=sample_rate))  # fmt: skip


@pytest.mark.parametrize("sample_rate", [24000, 48000])
def test_the_engine_is_told_a_deadline_with_the_audio_it_counts_and_again_only_when_the_listener_drifts(
    sample_rate: int,
) -> None:
    ctx, ms = _context(sample_rate), NS_PER_MS
    per_ms = sample_rate // 1000
    ctx.clock.on_audio_sent(160 * per_ms, now_ns=0)  # the first chunk
    assert ctx.deadline_due(0) == (150 * ms, 160 * 24)  # (its margin off), counted in the engine's 24 kHz samples
    for t in (100, 200, 300):  # chunks on time: the engine's reckoning (later by each chunk) holds, nothing to tell
        ctx.clock.on_audio_sent(320 * per_ms, now_ns=t * ms)
        assert ctx.deadline_due(t * ms) is None
    ctx.clock.on_report(played_samples=500 * per_ms, report_ns=600 * ms)  # playing 100 ms behind the model
    assert ctx.deadline_due(600 * ms) is None  # later, but within the 200 ms of drift the engine may be behind
    ctx.clock.on_report(played_samples=500 * per_ms, report_ns=900 * ms)  # stalled: 400 ms behind
    assert ctx.deadline_due(900 * ms) == ((900 + 1120 - 500 - 10) * ms, 1120 * 24)
    ctx.clock.on_report(played_samples=1000 * per_ms, report_ns=1_390 * ms)  # 10 ms ahead of that: earlier
    assert ctx.deadline_due(1_390 * ms) == ((1_390 + 120 - 10) * ms, 1120 * 24)


def test_clock_offset_takes_the_least_delayed_sample_and_never_maps_past_arrival() -> None:
    offset = ClockOffset()
    offset.observe(client_time_ms=100.0, arrival_ns=5_030 * NS_PER_MS)  # 30 ms in flight
    offset.observe(client_time_ms=200.0, arrival_ns=5_105 * NS_PER_MS)  # 5 ms in flight
    assert offset.offset_ms == pytest.approx(4_905.0)
    assert offset.to_server_ns(300.0, arrival_ns=5_250 * NS_PER_MS) == 5_205 * NS_PER_MS
    assert offset.to_server_ns(300.0, arrival_ns=5_100 * NS_PER_MS) == 5_100 * NS_PER_MS
    assert offset.to_server_ns(None, arrival_ns=7 * NS_PER_MS) == 7 * NS_PER_MS


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{", "invalid_json"),
        ("[]", "invalid_event"),
        ('{"type": 3}', "invalid_event"),
        ('{"type": "nope"}', "unknown_event_type"),
        ('{"type": "input_text.append", "context_id": "", "text": "x"}', "invalid_event"),
        ('{"type": "input_text.append", "context_id": "c"}', "invalid_event"),
        ('{"type": "playback.position", "context_id": "c", "played_samples": -1}', "invalid_event"),
        ('{"type": "playback.position", "context_id": "c", "played_samples": true}', "invalid_event"),
        ('{"type": "session.update", "audio": {"format": "flac"}}', "unsupported_format"),
        ('{"type": "ping", "id": [1]}', "invalid_event"),
    ],
)
def test_bad_client_events_name_their_error(frame: str, code: str) -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.parse_client_event(frame)
    assert info.value.code == code


def test_client_events_parse_into_typed_records() -> None:
    event = p.parse_client_event(
        '{"type": "playback.position", "context_id": "c", "played_samples": 10, "client_time_ms": 5, "event_id": "e"}'
    )
    assert event == p.PlaybackPosition("e", "c", 10, 5.0, None, None)
    assert p.parse_client_event(
        '{"type": "context.create", "context_id": "k", "audio": {"format": "opus"}}'
    ) == (p.ContextCreate(None, "k", None, None, None, "opus"))


def test_audio_frame_header_layout() -> None:
    frame = p.audio_frame(
        p.FLAG_FIRST | p.FLAG_LAST, stream=513, sequence=7, start_sample=1920, payload=b"\x01\x02"
    )
    assert frame[:12] == struct.pack("<BBHII", 1, 3, 513, 7, 1920) and frame[12:] == b"\x01\x02"
    assert p.parse_audio_frame(frame) == (3, 513, 7, 1920, b"\x01\x02")


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate_per_s=10, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.05) is False and bucket.take(0.1) is True


def test_limits_and_settings_come_from_flags_and_environment() -> None:
    settings = parse_settings(
        ["--limit", "max_contexts=3", "--engines", "2"],
        {"VIVACE_PORT": "9001", "VIVACE_API_KEY": "k", "VIVACE_LIMIT": "idle_timeout_s=5,appends_per_second=7.5",
         "VIVACE_ALLOWED_ORIGINS": "https://a.example/, https://b.example", "VIVACE_MAX_LEAD_MS": "1500"},
    )  # fmt: skip
    assert settings.port == 9001 and settings.api_key == "k" and settings.engines == 2
    assert settings.max_lead_ms == 1500
    assert settings.limits == Limits(max_contexts=3, idle_timeout_s=5.0, appends_per_second=7.5)
    assert settings.allowed_origins == ("https://a.example", "https://b.example")
    assert settings.engine_command("py")[:3] == ["py", "-m", "engine"]
    with pytest.raises(SystemExit):
        parse_settings(["--max-lead-ms", "50"], {})  # too little lead to pace by
    with pytest.raises(ValueError, match="unknown limit"):
        Limits.parse_overrides(["max_bananas=3"])
    with pytest.raises(ValueError, match="positive"):
        Limits.parse_overrides(["max_contexts=0"])


def test_wav_header_announces_streaming_pcm16_mono_24k() -> None:
    header = wav_header()
    assert len(header) == 44 and header[:4] == b"RIFF" and header[36:40] == b"data"
    assert struct.unpack_from("<HHIIHH", header, 20) == (1, 1, 24000, 48000, 2, 16)


def test_opus_packets_cover_every_sample_and_decode_back() -> None:
    t = np.arange(30000) / 24000
    pcm = (np.sin(2 * np.pi * 300 * t) * 6000).astype("<i2").tobytes()
    opus = OpusPacketizer()
    packets = opus.encode(pcm[:5000]) + opus.encode(pcm[5000:]) + opus.finish()
    assert (
        len(packets) * OPUS_PACKET_SAMPLES >= 30000 + opus.pre_skip > (len(packets) - 1) * OPUS_PACKET_SAMPLES
    )
    decoder = opuslib.Decoder(24000, 1)
    decoded = np.frombuffer(b"".join(decoder.decode(x, 480) for x in packets), "<i2")[opus.pre_skip :][:30000]
    assert np.corrcoef(decoded, np.frombuffer(pcm, "<i2"))[0, 1] > 0.99


def test_ogg_pages_carry_crc_granule_and_end_of_stream() -> None:
    muxer = OggOpusMuxer(pre_skip=156, serial=1)
    head = muxer.start()
    assert head[:4] == b"OggS" and head[5] == 0x02  # beginning of stream
    pages = muxer.pages([b"\x01" * 300] * 45, last=True, total_samples=20000)  # 45 packets: two pages
    second = pages.index(b"OggS", 4)
    assert pages[5] == 0 and pages[second + 5] == 0x04
    assert struct.unpack_from("<q", pages, 6)[0] == 40 * 960
    assert struct.unpack_from("<q", pages, second + 6)[0] == 312 + 20000 * 2  # trimmed to the real audio
    page = bytearray(pages[:second])
    crc = struct.unpack_from("<I", page, 22)[0]
    page[22:26] = b"\0\0\0\0"
    assert ogg_crc(bytes(page)) == crc and crc != 0


def test_metrics_render_in_prometheus_text_format() -> None:
    metrics = GatewayMetrics()
    metrics.errors_total.inc('we"ird')
    metrics.ttfa_seconds.observe(0.03, "ws")
    text = metrics.render()
    assert '# TYPE vivace_errors_total counter\nvivace_errors_total{code="we\\"ird"} 1.0' in text
    assert 'vivace_ttfa_seconds_bucket{endpoint="ws",le="0.02"} 0.0' in text
    assert 'vivace_ttfa_seconds_bucket{endpoint="ws",le="0.04"} 1.0' in text
    assert 'vivace_ttfa_seconds_count{endpoint="ws"} 1.0' in text
    assert "_created" not in text  # created-series off

