"""Wire encoding: every record round-trips exactly over random values, and anything malformed is a
WireError (never another exception, never a silently wrong record)."""

from __future__ import annotations

import random
import string
import struct
from collections.abc import Callable
from dataclasses import replace

import pytest

from engine.ipc.messages import (
    AppendText,
    Audio,
    Cancel,
    Deadline,
    Done,
    DoneReason,
    EndText,
    Error,
    Flush,
    Heartbeat,
    Layout,
    Ready,
    Sampling,
    Shutdown,
    Submit,
)
from engine.ipc.wire import WireError, decode, encode, encode_parts

U32, U64 = 2**32 - 1, 2**64 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
_ALPHABET = string.ascii_letters + string.digits + " _-äöü你好こんにちは😀\n"


def _text(rng: random.Random, longest: int = 40) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, longest)))


def _ids(rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.choice((0, 1, 151643, U32, rng.randint(0, U32))) for _ in range(rng.randint(0, 300)))


def _float(rng: random.Random) -> float:
    return rng.choice((0.0, 1.0, 0.9, 1.05, -2.5, 1e-300, 1e300, rng.uniform(-10, 10)))


def _int(rng: random.Random, low: int, high: int) -> int:
    return rng.choice((low, high, rng.randint(low, high)))


def _submit(rng: random.Random) -> Submit:
    return Submit(
        request_id=_int(rng, 0, U64), speaker=_text(rng), language=_text(rng), text_ids=_ids(rng),
        text_chars=_int(rng, 0, U32), text_ended=rng.random() < 0.5, instruct_ids=_ids(rng),
        layout=rng.choice(list(Layout)), seed=_int(rng, 0, U64),
        sampling=Sampling(
            greedy=rng.random() < 0.5, temperature=_float(rng), top_k=_int(rng, -(2**31), 2**31 - 1),
            repetition_penalty=_float(rng), subtalker_greedy=rng.random() < 0.5,
            subtalker_temperature=_float(rng), subtalker_top_k=_int(rng, -(2**31), 2**31 - 1),
        ),
        deadline_ns=_int(rng, I64_MIN, I64_MAX), arrival_ns=_int(rng, I64_MIN, I64_MAX),
        max_lead_ms=_int(rng, 0, U32), voice=rng.choice(("", _text(rng, 40))),
    )  # fmt: skip


def _audio(rng: random.Random) -> Audio:
    return Audio(
        request_id=_int(rng, 0, U64), start_sample=_int(rng, I64_MIN, I64_MAX),
        pcm=rng.randbytes(2 * rng.randint(0, 4000)), first=rng.random() < 0.5,
    )  # fmt: skip


def _ready(rng: random.Random) -> Ready:
    return Ready(
        model_id=_text(rng), random_weights=rng.random() < 0.5, sample_rate=_int(rng, 0, U32),
        speakers=tuple(_text(rng, 10) for _ in range(rng.randint(0, 12))),
        languages=tuple(_text(rng, 10) for _ in range(rng.randint(0, 12))), device=_text(rng),
        max_batch=_int(rng, 0, U32), gpu_uuid=rng.choice(("", "GPU-" + _text(rng, 36))),
        model_type=rng.choice(("", "custom_voice", "base", "voice_design", _text(rng, 20))),
        takes_instructions=rng.random() < 0.5,
    )  # fmt: skip


def _heartbeat(rng: random.Random) -> Heartbeat:
    stats = {_text(rng, 12): (_float(rng), _float(rng)) for _ in range(rng.randint(0, 6))}
    return Heartbeat(_int(rng, I64_MIN, I64_MAX), _int(rng, 0, U32), _int(rng, 0, U32), stats)


GENERATORS: dict[type, Callable[[random.Random], object]] = {
    Submit: _submit,
    AppendText: lambda rng: AppendText(_int(rng, 0, U64), _ids(rng), _int(rng, 0, U32)),
    Flush: lambda rng: Flush(_int(rng, 0, U64)),
    EndText: lambda rng: EndText(_int(rng, 0, U64)),
    Cancel: lambda rng: Cancel(_int(rng, 0, U64)),
    Deadline: lambda rng: Deadline(
        _int(rng, 0, U64), _int(rng, I64_MIN, I64_MAX), rng.choice([None, _int(rng, 0, U64)])
    ),
    Shutdown: lambda rng: Shutdown(_int(rng, 0, U32)),
    Ready: _ready,
    Heartbeat: _heartbeat,
    Audio: _audio,
    Done: lambda rng: Done(
        _int(rng, 0, U64), rng.choice(list(DoneReason)), _int(rng, 0, U64), _int(rng, 0, U64)
    ),
    Error: lambda rng: Error(_int(rng, 0, U64), _text(rng), _text(rng, 2000)),
}


@pytest.mark.parametrize("record", list(GENERATORS), ids=lambda t: t.__name__)
def test_every_record_round_trips_exactly_over_random_values(record: type) -> None:
    rng = random.Random(record.__name__)
    for _ in range(300):
        msg = GENERATORS[record](rng)
        data = encode(msg)
        decoded = decode(data)
        assert type(decoded) is record
        assert decoded == msg
        assert decode(memoryview(data)) == msg
        assert b"".join(bytes(p) for p in encode_parts(msg)) == data


def test_defaults_round_trip_and_enums_come_back_as_enums() -> None:
    msg = Submit(7, "ryan", "english", (1, 2, 3), 11, True)
    decoded = decode(encode(msg))
    assert decoded == msg and decoded.sampling == Sampling()
    assert isinstance(decoded.layout, Layout)
    done = decode(encode(Done(7, DoneReason.CANCELLED, 1920, 1)))
    assert done.reason is DoneReason.CANCELLED


def test_a_ready_without_gpu_uuid_or_model_type_keeps_the_layout_from_before_the_fields_existed() -> None:
    """Version safety both ways: an engine on CPU sends what an older gateway reads, and an older
    engine's Ready (no flag bits 1 and 2, no trailing strings) decodes with gpu_uuid == model_type == ""."""

    def s(text: str) -> bytes:
        return struct.pack("<I", len(text.encode())) + text.encode()

    older = (bytes([64, 1]) + struct.pack("<II", 24000, 8) + s("m") + s("cpu")
             + struct.pack("<I", 1) + s("ryan") + struct.pack("<I", 1) + s("english"))  # fmt: skip
    ready = Ready("m", True, 24000, ("ryan",), ("english",), "cpu", 8)
    assert encode(ready) == older
    assert decode(older) == ready and decode(older).gpu_uuid == ""
    on_gpu = encode(replace(ready, device="cuda:0", gpu_uuid="GPU-5f1c"))
    assert on_gpu[1] == 0b11 and on_gpu.endswith(s("GPU-5f1c"))
    assert decode(on_gpu).gpu_uuid == "GPU-5f1c"
    assert decode(older).model_type == ""  # an older engine: the gateway infers the kind from its speakers
    designed = encode(replace(ready, speakers=(), model_type="voice_design"))
    assert designed[1] == 0b101 and designed.endswith(s("voice_design"))
    assert decode(designed).model_type == "voice_design"
    both = decode(encode(replace(ready, gpu_uuid="GPU-5f1c", model_type="base")))
    assert (both.gpu_uuid, both.model_type) == ("GPU-5f1c", "base")


def test_a_submit_without_voice_keeps_the_layout_from_before_the_field_existed() -> None:
    """Version safety both ways: a Submit naming no saved voice is byte-identical to the older layout (no
    flag bit 3, nothing after instruct_ids), and one naming a voice carries it last."""
    plain = Submit(7, "ryan", "english", (1, 2, 3), 11, True)
    older = encode(plain)
    assert older[1] & 8 == 0 and older.endswith(struct.pack("<I", 0))  # ends with the empty instruct_ids
    assert decode(older).voice == ""
    named = encode(replace(plain, speaker="", voice="alloy"))
    assert named[1] & 8 and named.endswith(struct.pack("<I", 5) + b"alloy")
    assert decode(named) == replace(plain, speaker="", voice="alloy")


def test_a_deadline_without_samples_keeps_the_layout_from_before_the_field_existed() -> None:
    """Version safety both ways: a Deadline that counts no audio is the older record to the byte (no flag bit 0,
    request id and deadline only), and one that does carries the count last."""
    older = bytes([6, 0]) + struct.pack("<Qq", 7, 123_456_789)
    assert encode(Deadline(7, 123_456_789)) == older
    assert decode(older) == Deadline(7, 123_456_789) and decode(older).samples is None
    counted = encode(Deadline(7, 123_456_789, 48_000))
    assert counted == bytes([6, 1]) + struct.pack("<QqQ", 7, 123_456_789, 48_000)
    assert decode(counted).samples == 48_000


def test_audio_pcm_is_its_own_part_and_decoded_as_an_independent_copy() -> None:
    pcm = bytearray(b"\x01\x02" * 960)
    parts = encode_parts(Audio(3, 1920, pcm))
    assert len(parts) == 2 and parts[1].obj is pcm  # not copied by encoding: the ring copies it once
    buffer = bytearray(encode(Audio(3, 1920, bytes(pcm))))
    decoded = decode(memoryview(buffer))
    buffer[-1] ^= 0xFF  # the ring slot is reused after decode: the record must not alias it
    assert decoded.pcm == bytes(pcm) and isinstance(decoded.pcm, bytes)


def test_every_truncation_of_every_record_is_a_wire_error() -> None:
    rng = random.Random(3)
    for make in GENERATORS.values():
        data = encode(make(rng))
        for cut in range(len(data)):
            with pytest.raises(WireError):
                decode(data[:cut])


def test_trailing_bytes_and_unknown_kinds_are_wire_errors() -> None:
    with pytest.raises(WireError, match="trailing"):
        decode(encode(Cancel(1)) + b"\0")
    with pytest.raises(WireError, match="unknown record kind"):
        decode(b"\x63\x00" + b"\0" * 8)
    with pytest.raises(WireError, match="DoneReason"):
        decode(encode(Done(1, DoneReason.COMPLETED, 0, 0))[:10] + b"\x09" + b"\0" * 16)


def test_random_garbage_only_ever_raises_wire_error() -> None:
    rng = random.Random(99)
    kinds = [1, 2, 3, 4, 5, 6, 7, 64, 65, 66, 67, 68]
    decoded = 0
    for _ in range(5000):
        data = bytes([rng.choice(kinds), rng.randint(0, 255)]) + rng.randbytes(rng.randint(0, 64))
        try:
            decode(data)
            decoded += 1
        except WireError:
            pass
    assert decoded > 0  # some garbage happens to be valid; the point is nothing else escapes


@pytest.mark.parametrize(
    "msg",
    [
        Cancel(-1),
        Cancel(2**64),
        AppendText(1, (2**32,), 1),
        AppendText(1, (-1,), 1),
        Audio(1, 0, b"\x00\x01\x02"),
        Error(1, "code", "\ud800"),
        Shutdown(-5),
    ],
    ids=[
        "negative-id",
        "id-over-u64",
        "token-over-u32",
        "negative-token",
        "odd-pcm",
        "surrogate",
        "negative-grace",
    ],
)
def test_values_that_do_not_fit_the_layout_are_refused_with_wire_error(msg: object) -> None:
    with pytest.raises(WireError):
        encode(msg)


def test_non_records_are_refused() -> None:
    with pytest.raises(WireError, match="not a wire record"):
        encode("hello")  # type: ignore[arg-type]
