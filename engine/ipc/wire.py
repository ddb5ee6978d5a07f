"""Byte encoding of the gateway <-> engine records: `decode(encode(msg)) == msg` for every record.

Compact and fast on the hot path: a fixed struct per record kind, strings as utf-8, tuples of token ids
as packed u32 arrays, and an Audio record's PCM appended raw (never pickled). `encode_parts` returns the
pieces without joining them so a ring can gather-copy PCM straight into shared memory: PCM is copied
once on the way in (into the ring) and once on the way out (`decode` copies it out of the ring), and
`decode` never returns a view into the buffer it was given.

Every record starts with a 2-byte head; all integers are little-endian, nothing is padded:

    offset 0   u8  kind     tag below; inbound tags < 64, outbound tags >= 64
    offset 1   u8  flags    booleans of the record, bit 0 first
    offset 2   ... body     the kind's fixed struct, then its variable parts in field order

    str     = u32 byte length, utf-8 bytes
    ids     = u32 count, count x u32        (token ids; each must fit in u32)
    strs    = u32 count, count x str

    kind  record       flags                                       fixed struct                 then
    1     Submit       0 text_ended 1 greedy 2 subtalker_greedy    Q request_id I text_chars    str speaker
                       3 has voice                                 B layout Q seed              str language
                                                                   q deadline_ns q arrival_ns   ids text_ids
                                                                   d temperature i top_k        ids instruct_ids
                                                                                                [str voice]
                                                                   d repetition_penalty
                                                                   d subtalker_temperature
                                                                   i subtalker_top_k
                                                                   I max_lead_ms
    2     AppendText   -                                           Q request_id I text_chars    ids text_ids
    3     Flush        -                                           Q request_id
    4     EndText      -                                           Q request_id
    5     Cancel       -                                           Q request_id
    6     Deadline     0 has samples                               Q request_id q deadline_ns   [Q samples]
    7     Shutdown     -                                           I grace_ms
    64    Ready        0 random_weights 1 has gpu_uuid             I sample_rate I max_batch    str model_id
                       2 has model_type 3 refuses instructions                                  str device
                                                                                                strs speakers
                                                                                                strs languages
                                                                                                [str gpu_uuid]
                                                                                                [str model_type]
    65    Heartbeat    -                                           q time_ns I active_requests  per stat: str name,
                                                                   I queued_requests I n_stats  d value0 d value1
    66    Audio        0 first                                     Q request_id q start_sample  pcm bytes
                                                                   I pcm byte length
    67    Done         -                                           Q request_id B reason
                                                                   Q samples Q frames
    68    Error        -                                           Q request_id                 str code
                                                                                                str message

Optional fields added after a layout was first used come last, each announced by a flag bit, and are
left out (bit clear) when empty: a record without them is byte-identical to the older layout, and a
record from an older peer decodes with the field's default. `[str gpu_uuid]`, `[str model_type]`, `[str voice]`
and `[Q samples]` above are.

A record's length is known from its container (a ring record), so nothing stores it; `decode` checks
that the body uses exactly the bytes given. Anything malformed raises `WireError`, never a bare
struct/unicode error. Floats travel as f64, so they round-trip exactly.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable

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
    Inbound,
    Layout,
    Outbound,
    Ready,
    Sampling,
    Shutdown,
    Submit,
)

Buffer = bytes | bytearray | memoryview


class WireError(ValueError):
    """A record cannot be encoded (a field out of range) or a buffer is not a valid record."""


KIND_SUBMIT = 1
KIND_APPEND_TEXT = 2
KIND_FLUSH = 3
KIND_END_TEXT = 4
KIND_CANCEL = 5
KIND_DEADLINE = 6
KIND_SHUTDOWN = 7
KIND_READY = 64
KIND_HEARTBEAT = 65
KIND_AUDIO = 66
KIND_DONE = 67
KIND_ERROR = 68

_HEAD = struct.Struct("<BB")
_SUBMIT = struct.Struct("<QIBQqqdiddiI")
_APPEND = struct.Struct("<QI")
_ID = struct.Struct("<Q")
_DEADLINE = struct.Struct("<Qq")
_SHUTDOWN = struct.Struct("<I")
_READY = struct.Struct("<II")
_HEARTBEAT = struct.Struct("<qIII")
_STAT = struct.Struct("<dd")
_AUDIO = struct.Struct("<QqI")
_DONE = struct.Struct("<QBQQ")
_U32 = struct.Struct("<I")

if (
    array("I").itemsize != 4
):  # pragma: no cover - every Linux/macOS/Windows ABI we target has 4-byte unsigned int
    raise ImportError("engine.ipc.wire needs a 4-byte array('I')")
_SWAP = sys.byteorder != "little"


# ---------------------------------------------------------------- encoding


def _str(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _U32.pack(len(raw)) + raw


def _strs(values: tuple[str, ...]) -> bytes:
    return _U32.pack(len(values)) + b"".join(_str(v) for v in values)


def _ids(values: tuple[int, ...]) -> bytes:
    try:
        packed = array("I", values)
    except (OverflowError, TypeError) as exc:
        raise WireError(f"token ids must be ints in [0, 2**32): {exc}") from None
    if _SWAP:  # pragma: no cover - big-endian hosts
        packed.byteswap()
    return _U32.pack(len(packed)) + packed.tobytes()


def _pcm_view(pcm: object) -> memoryview:
    try:
        view = memoryview(pcm).cast("B")  # type: ignore[arg-type]
    except TypeError as exc:
        raise WireError(f"Audio.pcm must be a contiguous bytes-like object: {exc}") from None
    if len(view) % 2:
        raise WireError(f"Audio.pcm holds int16 samples, so its byte length must be even (got {len(view)})")
    return view


def encode_parts(msg: Inbound | Outbound) -> tuple[Buffer, ...]:
    """The record as pieces to be copied back to back (an Audio record's PCM is its own piece, uncopied)."""
    try:
        if type(msg) is Audio:
            pcm = _pcm_view(msg.pcm)
            head = _HEAD.pack(KIND_AUDIO, 1 if msg.first else 0) + _AUDIO.pack(
                msg.request_id, msg.start_sample, len(pcm)
            )
            return (head, pcm)
        return (_encode_fixed(msg),)
    except struct.error as exc:
        raise WireError(f"cannot encode {type(msg).__name__}: {exc}") from None
    except UnicodeEncodeError as exc:
        raise WireError(f"cannot encode {type(msg).__name__}: {exc}") from None


def encode(msg: Inbound | Outbound) -> bytes:
    """The record as one bytes object."""
    return b"".join(encode_parts(msg))


def encoded_size(parts: tuple[Buffer, ...]) -> int:
    return sum(len(p) for p in parts)


def _encode_fixed(msg: Inbound | Outbound) -> bytes:
    kind = type(msg)
    if kind is Done:
        return _HEAD.pack(KIND_DONE, 0) + _DONE.pack(msg.request_id, int(msg.reason), msg.samples, msg.frames)
    if kind is AppendText:
        return (
            _HEAD.pack(KIND_APPEND_TEXT, 0)
            + _APPEND.pack(msg.request_id, msg.text_chars)
            + _ids(msg.text_ids)
        )
    if kind is Deadline:
        head = _DEADLINE.pack(msg.request_id, msg.deadline_ns)
        if msg.samples is None:
            return _HEAD.pack(KIND_DEADLINE, 0) + head
        return _HEAD.pack(KIND_DEADLINE, 1) + head + _ID.pack(msg.samples)
    if kind is Flush:
        return _HEAD.pack(KIND_FLUSH, 0) + _ID.pack(msg.request_id)
    if kind is EndText:
        return _HEAD.pack(KIND_END_TEXT, 0) + _ID.pack(msg.request_id)
    if kind is Cancel:
        return _HEAD.pack(KIND_CANCEL, 0) + _ID.pack(msg.request_id)
    if kind is Submit:
        s = msg.sampling
        flags = (msg.text_ended and 1) | (s.greedy and 2) | (s.subtalker_greedy and 4) | (8 if msg.voice else 0)
        fixed = _SUBMIT.pack(
            msg.request_id, msg.text_chars, int(msg.layout), msg.seed, msg.deadline_ns, msg.arrival_ns,
            s.temperature, s.top_k, s.repetition_penalty, s.subtalker_temperature, s.subtalker_top_k,
            msg.max_lead_ms,
        )  # fmt: skip
        return b"".join(
            (_HEAD.pack(KIND_SUBMIT, flags), fixed, _str(msg.speaker), _str(msg.language),
             _ids(msg.text_ids), _ids(msg.instruct_ids), _str(msg.voice) if msg.voice else b"")
        )  # fmt: skip
    if kind is Error:
        return _HEAD.pack(KIND_ERROR, 0) + _ID.pack(msg.request_id) + _str(msg.code) + _str(msg.message)
    if kind is Heartbeat:
        stats = b"".join(_str(name) + _STAT.pack(*pair) for name, pair in msg.step_stats.items())
        return (
            _HEAD.pack(KIND_HEARTBEAT, 0)
            + _HEARTBEAT.pack(msg.time_ns, msg.active_requests, msg.queued_requests, len(msg.step_stats))
            + stats
        )
    if kind is Ready:
        flags = (1 if msg.random_weights else 0) | (2 if msg.gpu_uuid else 0) | (4 if msg.model_type else 0) \
            | (0 if msg.takes_instructions else 8)
        return b"".join(
            (_HEAD.pack(KIND_READY, flags), _READY.pack(msg.sample_rate, msg.max_batch),
             _str(msg.model_id), _str(msg.device), _strs(msg.speakers), _strs(msg.languages),
             _str(msg.gpu_uuid) if msg.gpu_uuid else b"", _str(msg.model_type) if msg.model_type else b"")
        )  # fmt: skip
    if kind is Shutdown:
        return _HEAD.pack(KIND_SHUTDOWN, 0) + _SHUTDOWN.pack(msg.grace_ms)
    raise WireError(f"not a wire record: {type(msg).__name__}")


# ---------------------------------------------------------------- decoding


class _Reader:
    """Cursor over one record's bytes; every read is bounds-checked."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def fixed(self, layout: struct.Struct) -> tuple:
        end = self.pos + layout.size
        if end > len(self.buf):
            raise WireError(f"record truncated: needs {end} bytes, has {len(self.buf)}")
        values = layout.unpack_from(self.buf, self.pos)
        self.pos = end
        return values

    def raw(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.buf):
            raise WireError(f"record truncated: needs {end} bytes, has {len(self.buf)}")
        view = self.buf[self.pos : end]
        self.pos = end
        return view

    def str(self) -> str:
        (n,) = self.fixed(_U32)
        try:
            return str(self.raw(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"invalid utf-8 in record: {exc}") from None

    def strs(self) -> tuple[str, ...]:
        (n,) = self.fixed(_U32)
        if n > len(self.buf):  # each str needs >= 4 bytes; refuse absurd counts before looping
            raise WireError(f"string count {n} exceeds record size")
        return tuple(self.str() for _ in range(n))

    def ids(self) -> tuple[int, ...]:
        (n,) = self.fixed(_U32)
        values = array("I")
        values.frombytes(self.raw(4 * n))
        if _SWAP:  # pragma: no cover - big-endian hosts
            values.byteswap()
        return tuple(values)


def _enum(kind: type[Layout] | type[DoneReason], value: int) -> Layout | DoneReason:
    try:
        return kind(value)
    except ValueError:
        raise WireError(f"invalid {kind.__name__} value {value}") from None


def _submit(r: _Reader, flags: int) -> Submit:
    (rid, chars, layout, seed, deadline, arrival, temp, top_k, rep, sub_temp, sub_top_k, lead) = r.fixed(_SUBMIT)
    speaker, language = r.str(), r.str()
    text_ids, instruct_ids = r.ids(), r.ids()
    voice = r.str() if flags & 8 else ""
    sampling = Sampling(
        greedy=bool(flags & 2), temperature=temp, top_k=top_k, repetition_penalty=rep,
        subtalker_greedy=bool(flags & 4), subtalker_temperature=sub_temp, subtalker_top_k=sub_top_k,
    )  # fmt: skip
    return Submit(
        request_id=rid, speaker=speaker, language=language, text_ids=text_ids, text_chars=chars,
        text_ended=bool(flags & 1), instruct_ids=instruct_ids, layout=_enum(Layout, layout), seed=seed,
        sampling=sampling, deadline_ns=deadline, arrival_ns=arrival, max_lead_ms=lead, voice=voice,
    )  # fmt: skip


def _append(r: _Reader, flags: int) -> AppendText:
    rid, chars = r.fixed(_APPEND)
    return AppendText(request_id=rid, text_ids=r.ids(), text_chars=chars)


def _ready(r: _Reader, flags: int) -> Ready:
    rate, max_batch = r.fixed(_READY)
    model_id, device = r.str(), r.str()
    speakers, languages = r.strs(), r.strs()
    gpu_uuid = r.str() if flags & 2 else ""
    model_type = r.str() if flags & 4 else ""
    return Ready(
        model_id=model_id, random_weights=bool(flags & 1), sample_rate=rate, speakers=speakers,
        languages=languages, device=device, max_batch=max_batch, gpu_uuid=gpu_uuid, model_type=model_type,
        takes_instructions=not flags & 8,
    )  # fmt: skip


def _heartbeat(r: _Reader, flags: int) -> Heartbeat:
    time_ns, active, queued, n = r.fixed(_HEARTBEAT)
    if n > len(r.buf):
        raise WireError(f"stat count {n} exceeds record size")
    stats = {}
    for _ in range(n):
        name = r.str()
        stats[name] = r.fixed(_STAT)
    return Heartbeat(time_ns=time_ns, active_requests=active, queued_requests=queued, step_stats=stats)


def _audio(r: _Reader, flags: int) -> Audio:
    rid, start, n = r.fixed(_AUDIO)
    return Audio(request_id=rid, start_sample=start, pcm=bytes(r.raw(n)), first=bool(flags & 1))


def _done(r: _Reader, flags: int) -> Done:
    rid, reason, samples, frames = r.fixed(_DONE)
    return Done(request_id=rid, reason=_enum(DoneReason, reason), samples=samples, frames=frames)


def _error(r: _Reader, flags: int) -> Error:
    (rid,) = r.fixed(_ID)
    return Error(request_id=rid, code=r.str(), message=r.str())


def _one_id(record: type[Flush] | type[EndText] | type[Cancel]) -> Callable[[_Reader, int], Inbound]:
    def decode_id(r: _Reader, flags: int) -> Inbound:
        (rid,) = r.fixed(_ID)
        return record(request_id=rid)

    return decode_id


def _deadline(r: _Reader, flags: int) -> Deadline:
    rid, deadline = r.fixed(_DEADLINE)
    samples = r.fixed(_ID)[0] if flags & 1 else None
    return Deadline(request_id=rid, deadline_ns=deadline, samples=samples)


def _shutdown(r: _Reader, flags: int) -> Shutdown:
    (grace,) = r.fixed(_SHUTDOWN)
    return Shutdown(grace_ms=grace)


_DECODERS: dict[int, Callable[[_Reader, int], Inbound | Outbound]] = {
    KIND_SUBMIT: _submit,
    KIND_APPEND_TEXT: _append,
    KIND_FLUSH: _one_id(Flush),
    KIND_END_TEXT: _one_id(EndText),
    KIND_CANCEL: _one_id(Cancel),
    KIND_DEADLINE: _deadline,
    KIND_SHUTDOWN: _shutdown,
    KIND_READY: _ready,
    KIND_HEARTBEAT: _heartbeat,
    KIND_AUDIO: _audio,
    KIND_DONE: _done,
    KIND_ERROR: _error,
}


def decode(buf: Buffer) -> Inbound | Outbound:
    """One record from exactly the bytes of `buf`; the result holds copies, never views into `buf`."""
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) or buf.format != "B" else buf
    if len(view) < _HEAD.size:
        raise WireError(f"record truncated: {len(view)} bytes")
    kind, flags = _HEAD.unpack_from(view, 0)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise WireError(f"unknown record kind {kind}")
    reader = _Reader(view, _HEAD.size)
    msg = decoder(reader, flags)
    if reader.pos != len(view):
        raise WireError(f"{type(msg).__name__} record has {len(view) - reader.pos} trailing bytes")
    return msg


def is_inbound(msg: object) -> bool:
    return type(msg) in (Submit, AppendText, Flush, EndText, Cancel, Deadline, Shutdown)


def is_outbound(msg: object) -> bool:
    return type(msg) in (Ready, Heartbeat, Audio, Done, Error)
