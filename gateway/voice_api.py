"""Saved-voice endpoints: `POST /v1/audio/voices`, `GET` and `DELETE /v1/audio/voices/{name}`.

One promise: with `--voices-dir`, an upload (multipart: `name`, `audio` or `file`, optional `transcript`)
becomes a saved voice in that store, which every engine reads at Submit, or a clear error; `GET` reads its
index entry and `DELETE` removes it; every call needs the API key when one is set. The gateway never
imports torch: it checks what it can cheaply (name, built-ins, an existing name, size), then runs
`python -m engine.voice_tool` (decode, speaker encoder and, with a transcript, codec encoder, on the CPU)
as a short-lived subprocess under a deadline, one upload at a time, and reads its one JSON line. Reading
and deleting use `engine.voice_store` directly (no torch, no numpy).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.voice_store import VoiceInfo, VoiceLimits, VoiceStore, VoiceStoreError, check_name
from gateway.engines import EngineUnavailable
from gateway.http_common import HttpError, check_api_key, error_response, gateway_state
from gateway.settings import REPO_ROOT
from gateway.state import GatewayState

FORM_OVERHEAD_BYTES = 64 * 1024
UPLOAD_LIMIT_BYTES = VoiceLimits.max_audio_bytes + FORM_OVERHEAD_BYTES  # the body limit of the POST
STATUS = {"bad_name": 400, "reserved": 400, "bad_audio": 400, "too_long": 400, "too_short": 400,
          "wrong_model": 400, "exists": 409, "not_found": 404, "too_large": 413, "too_many": 507, "full": 507,
          "corrupt": 500, "internal": 500}  # fmt: skip
_EXTENSION = re.compile(r"\.([A-Za-z0-9]{1,8})$")
_upload_lock = asyncio.Lock()


def _store(state: GatewayState) -> VoiceStore:
    if not state.settings.voices_dir:
        raise HttpError(404, "voices_disabled", "saved voices are off on this server (start it with --voices-dir)")
    return VoiceStore(state.settings.voices_dir)


def _refused(error: VoiceStoreError) -> HttpError:
    return HttpError(STATUS.get(error.code, 400), f"voice_{error.code}", str(error), param="name")


def voice_json(info: VoiceInfo) -> dict[str, Any]:
    return {"object": "voice", "name": info.name, "model_id": info.model_id, "duration_s": info.duration_s,
            "sample_rate": info.sample_rate, "audio_bytes": info.audio_bytes, "transcript": info.transcript,
            "in_context": info.ref_frames is not None, "created_at": info.created_at}  # fmt: skip


async def create(request: Request) -> Response:
    state = gateway_state(request)
    try:
        check_api_key(request, state)
        store = _store(state)
        try:
            form = await request.form(max_files=1, max_fields=4)
        except Exception as error:  # python-multipart's parse errors, a body that is not multipart
            raise HttpError(400, "invalid_form", f"expected multipart/form-data with name and audio: {error}") from None
        try:
            name, transcript = form.get("name"), form.get("transcript")
            audio = form.get("audio") or form.get("file")
            if not isinstance(name, str) or not name:
                raise HttpError(400, "missing_field", "the form needs a `name`", param="name")
            if not isinstance(audio, UploadFile):
                raise HttpError(400, "missing_field", "the form needs the reference audio file as `audio`", param="audio")
            if transcript is not None and not isinstance(transcript, str):
                raise HttpError(400, "invalid_value", "`transcript` must be text", param="transcript")
            info = await _save(state, store, name, audio, (transcript or "").strip() or None)
        finally:
            await form.close()
    except HttpError as error:
        return error_response(error, state)
    except VoiceStoreError as error:
        return error_response(_refused(error), state)
    except EngineUnavailable as exc:
        return error_response(HttpError(503, exc.code, str(exc)), state)
    return JSONResponse(voice_json(info), status_code=201)


async def _save(state: GatewayState, store: VoiceStore, name: str, audio: UploadFile,
                transcript: str | None) -> VoiceInfo:  # fmt: skip
    served = state.voices()
    if not served.saved_only:  # refused here, before the upload is read and a torch process is started
        raise VoiceStoreError("wrong_model", f"{state.settings.model} is not a Base model: only Base checkpoints "
                                             "clone voices from a reference recording")  # fmt: skip
    reserved = tuple(served.speakers)
    check_name(name, reserved)
    if (store.root / name).exists():
        raise VoiceStoreError("exists", f"a voice named {name!r} exists; delete it first")
    limits = store.limits
    match = _EXTENSION.search(audio.filename or "")
    suffix = f".{match.group(1).lower()}" if match else ".bin"
    settings = state.settings
    async with _upload_lock:
        with tempfile.TemporaryDirectory(prefix="vivace-voice-") as tmp:
            path = Path(tmp) / f"reference{suffix}"
            size = 0
            with open(path, "wb") as out:
                while chunk := await audio.read(1 << 16):
                    size += len(chunk)
                    if size > limits.max_audio_bytes:
                        raise VoiceStoreError("too_large", f"reference audio is over the limit of "
                                                           f"{limits.max_audio_bytes} bytes")  # fmt: skip
                    out.write(chunk)
            argv = [sys.executable, "-m", "engine.voice_tool", "--model", settings.model,
                    "--load-format", settings.load_format, "--voices-dir", str(store.root),
                    "--reserved", ",".join(reserved), *(["--transcript", transcript] if transcript else []),
                    "--", name, str(path)]  # fmt: skip
            result = await _run_tool(argv, settings.voice_timeout_s)
    if not result.get("ok"):
        raise VoiceStoreError(str(result.get("code", "internal")), str(result.get("message", "voice tool failed")))
    return VoiceInfo(**result["voice"])


async def _run_tool(argv: list[str], timeout_s: float) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(*argv, cwd=REPO_ROOT, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # fmt: skip
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise HttpError(504, "voice_timeout", f"computing the voice took longer than {timeout_s:.0f} s") from None
    lines = stdout.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = stderr.decode(errors="replace")[-500:]
        raise HttpError(500, "voice_internal", f"the voice tool failed (status {proc.returncode}): {tail}") from None


async def read(request: Request) -> Response:
    state = gateway_state(request)
    try:
        check_api_key(request, state)
        info = _store(state).info(request.path_params["name"])
    except HttpError as error:
        return error_response(error, state)
    except VoiceStoreError as error:
        return error_response(_refused(error), state)
    return JSONResponse(voice_json(info))


async def delete(request: Request) -> Response:
    state = gateway_state(request)
    name = request.path_params["name"]
    try:
        check_api_key(request, state)
        store = _store(state)
        await asyncio.to_thread(store.delete, name)
    except HttpError as error:
        return error_response(error, state)
    except VoiceStoreError as error:
        return error_response(_refused(error), state)
    return JSONResponse({"object": "voice.deleted", "name": name, "deleted": True})


async def one_voice(request: Request) -> Response:
    return await (delete if request.method == "DELETE" else read)(request)

