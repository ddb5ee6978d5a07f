"""The README's first minutes, checked: the server it starts gets ready, answers one request, exits cleanly.

    python .ci/newcomer_smoke.py -- python -m gateway --model tiny --device cpu

One promise: starts the given server command (with VIVACE_PORT set to a free port), and exits 0 only if
`/ready` answers 200 within --ready-within seconds, one `POST /v1/audio/speech` returns a WAV of the
length the tiny model's length model gives, and SIGTERM makes the server exit with status 0 within
--exit-within seconds. Standard library only: it runs in a venv that has just the README's install.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

TEXT = "Hello there, newcomer."
SAMPLES_PER_FRAME = 1920  # 80 ms at 24 kHz
WAV_HEADER_BYTES = 44


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


def wait_ready(base: str, server: subprocess.Popen[bytes], within_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if server.poll() is not None:
            raise SystemExit(f"FAIL: the server exited with status {server.returncode} before it was ready")
        if get_status(base + "/ready") == 200:
            return time.monotonic() - started
        time.sleep(0.25)
    raise SystemExit(f"FAIL: /ready did not answer 200 within {within_s:.0f} s")


def one_request(base: str) -> int:
    body = json.dumps({"model": "tts-1", "voice": "ryan", "input": TEXT, "response_format": "wav"}).encode()
    request = urllib.request.Request(
        base + "/v1/audio/speech", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        audio = response.read()
        kind = response.headers.get("content-type", "")
    frames = math.ceil(12.5 * len(TEXT) / 14)  # the random-weight length model (README)
    want = WAV_HEADER_BYTES + 2 * frames * SAMPLES_PER_FRAME
    if not audio.startswith(b"RIFF") or "wav" not in kind or len(audio) != want:
        raise SystemExit(f"FAIL: got {len(audio)} bytes of {kind!r}, want a {want}-byte WAV")
    return len(audio)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready-within", type=float, default=300.0)
    parser.add_argument("--exit-within", type=float, default=60.0)
    parser.add_argument("--log", default="newcomer-server.log", help="where the server's output goes")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the server command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(args.log, "wb") as log:
        server = subprocess.Popen(
            command, env=os.environ | {"VIVACE_PORT": str(port)}, stdout=log, stderr=log
        )
    try:
        ready_s = wait_ready(base, server, args.ready_within)
        print(f"newcomer: /ready 200 after {ready_s:.1f} s")
        print(f"newcomer: POST /v1/audio/speech answered {one_request(base)} bytes of WAV")
        server.send_signal(signal.SIGTERM)
        status = server.wait(args.exit_within)
    except subprocess.TimeoutExpired:
        raise SystemExit(
            f"FAIL: the server did not exit within {args.exit_within:.0f} s of SIGTERM"
        ) from None
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if status != 0:
        raise SystemExit(f"FAIL: the server exited with status {status} after SIGTERM")
    print("newcomer: SIGTERM -> clean exit (status 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
