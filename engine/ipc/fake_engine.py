"""A stand-in engine that speaks the real link protocol, for gateway tests and overhead benchmarks.

    python -m engine.ipc.fake_engine --socket PATH [--delay-ms N] [--ms-per-frame N] [--heartbeat-s S]
                                     [--gpu-uuid UUID] [--fail-start-on INDEX] [--model NAME]

It behaves on the wire like `python -m engine` with random weights: Ready at once to every link (naming
`--gpu-uuid` as its GPU, none by default, and the model kind of the gateway's `--model` preset: a Base or
VoiceDesign preset lists no speakers, anything else is a CustomVoice model), Heartbeat every
`--heartbeat-s` (1 s) whose step figures say that each request got a frame every `--ms-per-frame`
("talker_decode": (requests generating, ms); left out when no frame was generated since the last beat,
or frames take no time), and for each Submit a
quiet 220 Hz int16 tone whose length follows the random-weight length model, frames =
ceil(12.5 * chars / 14), 1920 samples (80 ms at 24 kHz) per frame. Until EndText arrives it only
generates the frames the text so far pays for (floor of the same formula), i.e. it waits for text
instead of inventing it. Frames appear `--delay-ms` after Submit and then one
every `--ms-per-frame` (0: instantly), and are published in chunks of 2 frames first, then 4; Flush
publishes whatever is generated, EndText lets it finish with the rest and Done(COMPLETED). Cancel
answers Done(CANCELLED); Deadline is accepted and ignored. A bad request gets Error(bad_request) then
Done(ERROR). Shutdown (or SIGTERM) refuses new Submits, lets running requests finish within
`grace_ms`, fails the rest with Error(shutdown) + Done(ERROR), says goodbye and exits 0.
`--fail-start-on INDEX` stands in for an engine that cannot start: the engine the gateway numbered INDEX
(environment `VIVACE_ENGINE_INDEX`) writes an error to stderr and exits 1 before listening.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import time
from array import array
from dataclasses import dataclass

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
    Outbound,
    Ready,
    Shutdown,
    Submit,
)
from engine.ipc.process import die_with_parent
from engine.ipc.server import EngineEndpoint

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
FRAMES_PER_SECOND = 12.5
CHARS_PER_SECOND = 14.0
FIRST_CHUNK_FRAMES = 2
CHUNK_FRAMES = 4
HEARTBEAT_S = 1.0
SPEAKERS = ("aiden", "dylan", "eric", "ono_anna", "ryan", "serena", "sohee", "uncle_fu", "vivian")
LANGUAGES = ("auto", "chinese", "english", "french", "german", "italian", "japanese", "korean", "portuguese",
             "russian", "spanish")  # fmt: skip

log = logging.getLogger("engine.fake")


def frames_for(chars: int, *, text_ended: bool) -> int:
    """Frames the random-weight length model allows for `chars` characters of text."""
    exact = FRAMES_PER_SECOND * chars / CHARS_PER_SECOND
    return math.ceil(exact) if text_ended else math.floor(exact)


def _tone_table() -> bytes:
    # One second holds exactly 220 periods of 220 Hz, so the table loops without a click.
    amplitude = 0.1 * 32767
    samples = array(
        "h", (round(amplitude * math.sin(2 * math.pi * 220 * i / SAMPLE_RATE)) for i in range(SAMPLE_RATE))
    )
    if sys.byteorder != "little":  # pragma: no cover
        samples.byteswap()
    return samples.tobytes() * 2


_TONE = _tone_table()


def tone_pcm(start_sample: int, samples: int) -> bytes:
    """int16 LE samples [start_sample, start_sample + samples) of the endless quiet 220 Hz tone."""
    out = bytearray()
    position = start_sample % SAMPLE_RATE
    while samples > 0:
        n = min(samples, SAMPLE_RATE)
        out += _TONE[2 * position : 2 * (position + n)]
        position = (position + n) % SAMPLE_RATE
        samples -= n
    return bytes(out)


@dataclass
class FakeRequest:
    link_id: int
    request_id: int
    chars: int
    text_ended: bool
    next_frame_ns: int
    generated: int = 0
    published: int = 0
    flush: bool = False

    def allowed(self) -> int:
        return frames_for(self.chars, text_ended=self.text_ended)


class FakeEngine:
    def __init__(
        self, endpoint: EngineEndpoint, *, delay_ms: float, ms_per_frame: float, heartbeat_s: float = HEARTBEAT_S,
        gpu_uuid: str = "", model_type: str = "custom_voice", takes_instructions: bool = True,
    ) -> None:  # fmt: skip
        self.endpoint = endpoint
        self.delay_ns = int(delay_ms * 1e6)
        self.frame_ns = int(ms_per_frame * 1e6)
        self.heartbeat_s = heartbeat_s
        self.gpu_uuid = gpu_uuid
        self.model_type = model_type
        self.takes_instructions = takes_instructions and model_type != "base"
        self.speakers = SPEAKERS if model_type == "custom_voice" else ()  # Base, VoiceDesign: none built in
        self.requests: dict[tuple[int, int], FakeRequest] = {}
        self.shutdown_at_ns: int | None = None
        self.next_heartbeat = time.monotonic() + heartbeat_s
        self.generating: set[tuple[int, int]] = set()  # requests that got a frame since the last heartbeat

    def run(self) -> None:
        while True:
            now_ns = time.monotonic_ns()
            if self.shutdown_at_ns is not None and (not self.requests or now_ns >= self.shutdown_at_ns):
                self._fail_all("shutdown", "the engine shut down before the request finished")
                return
            messages = self.endpoint.poll(self._timeout_s(now_ns))
            for link_id in self.endpoint.new_links():
                self.endpoint.send(link_id, self._ready())
            for link_id in self.endpoint.dead_links():
                self.requests = {k: r for k, r in self.requests.items() if r.link_id != link_id}
            for link_id, msg in messages:
                self._handle(link_id, msg)
            self._advance(time.monotonic_ns())
            if time.monotonic() >= self.next_heartbeat:
                self.next_heartbeat = time.monotonic() + self.heartbeat_s
                beat = Heartbeat(time.monotonic_ns(), len(self.requests), 0, self._step_stats())
                self.endpoint.send_many((link_id, beat) for link_id in self.endpoint.links())

    def _step_stats(self) -> dict[str, tuple[float, float]]:
        generating, self.generating = len(self.generating), set()
        if not generating or not self.frame_ns:
            return {}
        return {"talker_decode": (float(generating), self.frame_ns / 1e6)}

    def request_shutdown(self, grace_ms: int) -> None:
        deadline = time.monotonic_ns() + grace_ms * 1_000_000
        self.shutdown_at_ns = deadline if self.shutdown_at_ns is None else min(self.shutdown_at_ns, deadline)

    # ------------------------------------------------------------ requests

    def _handle(self, link_id: int, msg: Inbound) -> None:
        kind = type(msg)
        if kind is Shutdown:
            self.request_shutdown(msg.grace_ms)
            return
        key = (link_id, msg.request_id)
        request = self.requests.get(key)
        if kind is Submit:
            if self.shutdown_at_ns is not None:
                self._fail(link_id, msg.request_id, "shutting_down", "the engine is shutting down")
            elif request is not None:
                self._fail(link_id, msg.request_id, "bad_request", "request_id already in use on this link")
            else:
                start = time.monotonic_ns() + self.delay_ns + self.frame_ns
                self.requests[key] = FakeRequest(
                    link_id, msg.request_id, msg.text_chars, msg.text_ended, start
                )
            return
        if kind is Cancel:
            if request is not None:
                del self.requests[key]
                samples = request.published * SAMPLES_PER_FRAME
                self.endpoint.send(
                    link_id, Done(msg.request_id, DoneReason.CANCELLED, samples, request.generated)
                )
            return  # a cancel racing with Done is normal
        if kind is Deadline:
            return
        if request is None:
            self._fail(link_id, msg.request_id, "bad_request", f"{kind.__name__} for an unknown request")
            return
        if kind is AppendText:
            if request.text_ended:
                del self.requests[key]
                self._fail(link_id, msg.request_id, "bad_request", "AppendText after EndText")
                return
            if request.generated >= request.allowed():  # it was waiting for text: no catch-up burst
                request.next_frame_ns = max(request.next_frame_ns, time.monotonic_ns() + self.frame_ns)
            request.chars += msg.text_chars
        elif kind is EndText:
            request.text_ended = True
        elif kind is Flush:
            request.flush = True

    def _advance(self, now_ns: int) -> None:
        out: list[tuple[int, Outbound]] = []
        for key, request in list(self.requests.items()):
            allowed = request.allowed()
            before = request.generated
            while request.generated < allowed and request.next_frame_ns <= now_ns:
                request.generated += 1
                request.next_frame_ns += self.frame_ns
            if request.generated > before:
                self.generating.add(key)
            self._publish(request, out)
            if request.text_ended and request.published == allowed:
                del self.requests[key]
                samples = request.published * SAMPLES_PER_FRAME
                out.append(
                    (request.link_id, Done(request.request_id, DoneReason.COMPLETED, samples, allowed))
                )
        if out:
            self.endpoint.send_many(out)

    def _publish(self, request: FakeRequest, out: list[tuple[int, Outbound]]) -> None:
        finishing = request.text_ended and request.generated == request.allowed()
        while request.generated > request.published:
            size = FIRST_CHUNK_FRAMES if request.published == 0 else CHUNK_FRAMES
            pending = request.generated - request.published
            if pending < size and not (request.flush or finishing):
                break
            frames = min(size, pending)
            start = request.published * SAMPLES_PER_FRAME
            pcm = tone_pcm(start, frames * SAMPLES_PER_FRAME)
            out.append((request.link_id, Audio(request.request_id, start, pcm, first=request.published == 0)))
            request.published += frames
        request.flush = False

    def _fail(self, link_id: int, request_id: int, code: str, message: str) -> None:
        self.endpoint.send(link_id, Error(request_id, code, message))
        self.endpoint.send(link_id, Done(request_id, DoneReason.ERROR, 0, 0))

    def _fail_all(self, code: str, message: str) -> None:
        for request in list(self.requests.values()):
            self._fail(request.link_id, request.request_id, code, message)
        self.requests.clear()
        self.endpoint.flush()

    def _timeout_s(self, now_ns: int) -> float:
        wake = self.next_heartbeat - time.monotonic()
        for request in self.requests.values():
            if request.generated < request.allowed():
                wake = min(wake, (request.next_frame_ns - now_ns) / 1e9)
        if self.shutdown_at_ns is not None:
            wake = min(wake, (self.shutdown_at_ns - now_ns) / 1e9)
        return max(0.0, wake)

    def _ready(self) -> Ready:
        return Ready(model_id="fake-qwen3-tts", random_weights=True, sample_rate=SAMPLE_RATE, speakers=self.speakers,
                     languages=LANGUAGES, device="cuda" if self.gpu_uuid else "cpu", max_batch=64,
                     gpu_uuid=self.gpu_uuid, model_type=self.model_type,
                     takes_instructions=self.takes_instructions)  # fmt: skip


def _preset_config(model: str) -> dict:
    from engine.model.presets import PRESETS  # torch-free

    preset = PRESETS.get(model.lower())
    return preset()[0] if preset is not None else {}


def _model_type(model: str) -> str:
    """The `tts_model_type` of a preset (Base and VoiceDesign ones list no speakers, as the real engine);
    "custom_voice" for anything else."""
    return str(_preset_config(model).get("tts_model_type", "custom_voice"))


def _takes_instructions(model: str) -> bool:
    """False for the 0.6B presets, whose instructions the official wrapper drops (as the real engine says)."""
    return _preset_config(model).get("tts_model_size") != "0b6"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.ipc.fake_engine", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--socket", required=True, help='control socket path ("@name": abstract namespace)')
    parser.add_argument("--delay-ms", type=float, default=0.0, help="time from Submit to the first frame")
    parser.add_argument("--ms-per-frame", type=float, default=0.0, help="generation time per 80 ms frame")
    parser.add_argument("--heartbeat-s", type=float, default=HEARTBEAT_S, help="seconds between heartbeats")
    parser.add_argument(
        "--model",
        default="tiny",
        help="the gateway's --model: a Base or VoiceDesign preset (tiny-base, tiny-voice-design, ...) has no "
        "built-in speakers in Ready, Ready names its model_type, and a 0.6B preset takes no instructions",
    )
    parser.add_argument("--gpu-uuid", default="", help="the GPU UUID to report in Ready (default: none, CPU)")
    parser.add_argument(
        "--fail-start-on",
        type=int,
        action="append",
        default=[],
        metavar="INDEX",
        help="engine INDEX (VIVACE_ENGINE_INDEX) fails at start: error on stderr, exit 1",
    )
    args = parser.parse_args(argv)
    if args.delay_ms < 0 or args.ms_per_frame < 0:
        parser.error("--delay-ms and --ms-per-frame must be >= 0")
    if args.heartbeat_s <= 0:
        parser.error("--heartbeat-s must be > 0")
    index = os.environ.get("VIVACE_ENGINE_INDEX", "")
    if index.isdigit() and int(index) in args.fail_start_on:
        print(f"fake-engine: error: engine {index} cannot start (--fail-start-on {index})", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fake-engine %(levelname)s %(message)s")
    die_with_parent()
    # SIGTERM waits until its handler exists: the socket appears inside EngineEndpoint(), and a supervisor
    # that sees it may signal at once (the default action would kill the process with status -15).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    endpoint = EngineEndpoint(args.socket)
    engine = FakeEngine(endpoint, delay_ms=args.delay_ms, ms_per_frame=args.ms_per_frame,
                        heartbeat_s=args.heartbeat_s, gpu_uuid=args.gpu_uuid,
                        model_type=_model_type(args.model),
                        takes_instructions=_takes_instructions(args.model))  # fmt: skip

    def on_sigterm(signum: int, frame: object) -> None:
        engine.request_shutdown(5000)
        endpoint.wakeup()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    try:
        engine.run()
    finally:
        endpoint.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
