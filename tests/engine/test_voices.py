"""A Base model served in x-vector mode: a Submit naming a saved voice gets exactly the frames and PCM of
the reference voice loop (`embed_voice_prefill` + `generate_voice_codes`) with that voice's stored
x-vector, alone or batched with other voices; what cannot be served is refused with the reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.codec.silence import LeadingSilenceTrimmer, SilenceConfig
from engine.executors.codec import to_int16
from engine.executors.voices import VoiceBank
from engine.ipc.messages import DoneReason, Error, Layout, Sampling, Submit
from engine.model.generate import decode_codes
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.voices import embed_voice_prefill, generate_voice_codes
from engine.request import WorkKind, length_model_frames
from engine.text.prompt import build_xvector_prefill
from engine.voice_store import VoiceStore, compute_voice
from tests.engine.helpers import LINK, SENTENCES, make_loop, run_to_completion, text_ids

GREEDY = Sampling(greedy=True, subtalker_greedy=True)
RATE = 24000


def _reference_pcm(seed: int, seconds: float = 1.5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * (120 + 40 * seed) * t) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


@pytest.fixture(scope="module")
def store(base_model: Qwen3TTS, tmp_path_factory: pytest.TempPathFactory) -> VoiceStore:
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    for i, name in enumerate(("alloy", "nova")):
        voice = compute_voice(base_model, _reference_pcm(i), RATE)
        store.save(name, model_id="tiny-base", audio=b"RIFF....", audio_ext="wav", voice=voice)
    return store


def _bank(model: Qwen3TTS, store: VoiceStore | None, model_id: str = "tiny-base") -> VoiceBank:
    return VoiceBank(store, model_id=model_id, hidden=model.config.talker.hidden_size, device=model.device,
                     dtype=model.dtype)


def _submit(model: Qwen3TTS, request_id: int, text: str, voice: str, **kw: object) -> Submit:
    return Submit(request_id=request_id, speaker="", language="english", text_ids=text_ids(model, text),
                  text_chars=len(text), text_ended=True, voice=voice, **kw)  # type: ignore[arg-type]


def _voice_reference(model: Qwen3TTS, msg: Submit, speaker: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """The request alone through the reference voice loop -> (frames, the int16 PCM the engine must publish)."""
    prefill = build_xvector_prefill(model.config.prompt_ids, language=msg.language, text_ids=msg.text_ids,
                                    streaming=msg.layout is Layout.STREAMING)
    rows, trailing, pad = embed_voice_prefill(model, prefill, speaker)
    codes = generate_voice_codes(model, rows, trailing, pad, msg.sampling, msg.seed,
                                 max_frames=length_model_frames(msg.text_chars))
    trimmer = LeadingSilenceTrimmer(SilenceConfig())
    pcm = trimmer.push(decode_codes(model, codes))
    return codes, to_int16(np.concatenate([pcm, trimmer.finish()]))


def test_saved_voice_requests_equal_the_reference_voice_loop_alone_and_batched(base_model: Qwen3TTS,
                                                                                 store: VoiceStore) -> None:
    loop = make_loop(base_model, voices=_bank(base_model, store))
    msgs = [_submit(base_model, 1, SENTENCES[0], "alloy", sampling=GREEDY),
            _submit(base_model, 2, SENTENCES[1], "nova", sampling=GREEDY, layout=Layout.NON_STREAMING),
            _submit(base_model, 3, SENTENCES[2], "nova", seed=5)]
    results, frames = run_to_completion(loop, msgs)
    assert loop.lifetime_max_batch[WorkKind.TALKER_DECODE] > 1
    speakers = {name: store.tensors(name)[1] for name in ("alloy", "nova")}
    assert not torch.equal(speakers["alloy"], speakers["nova"])
    for msg in msgs:
        codes, pcm = _voice_reference(base_model, msg, speakers[msg.voice])
        result = results[msg.request_id]
        assert result.error is None and result.done.reason is DoneReason.COMPLETED
        assert torch.equal(frames[msg.request_id], codes), f"request {msg.request_id}: frames differ"
        assert len(result.samples) == len(pcm)
        assert np.abs(result.samples.astype(np.int32) - pcm).max() <= 1
    # The voice matters: the sampled request with the other voice gives other frames.
    other, _ = _voice_reference(base_model, msgs[2], speakers["alloy"])
    assert not torch.equal(frames[3], other)


def test_a_voice_saved_again_under_its_name_is_read_again(base_model: Qwen3TTS, tmp_path) -> None:
    store = VoiceStore(tmp_path)
    store.save("echo", model_id="tiny-base", audio=b"x", audio_ext="wav",
               voice=compute_voice(base_model, _reference_pcm(0), RATE))
    bank = _bank(base_model, store)
    first = bank.resolve("echo")
    assert bank.resolve("echo") is first  # cached while the save is the same
    store.delete("echo")
    store.save("echo", model_id="tiny-base", audio=b"x", audio_ext="wav",
               voice=compute_voice(base_model, _reference_pcm(3), RATE))
    assert not torch.equal(bank.resolve("echo").embedding, first.embedding)


def test_what_a_base_model_cannot_serve_is_refused_with_the_reason(base_model: Qwen3TTS, store: VoiceStore,
                                                                   tiny_model: Qwen3TTS, tmp_path) -> None:
    loop = make_loop(base_model, voices=_bank(base_model, store), kv_slots=2, max_batch=2)
    good = _submit(base_model, 1, "Hello.", "alloy")
    cases = {
        "no saved voice 'shimmer'": dataclasses.replace(good, request_id=2, voice="shimmer"),
        "speaks with a saved voice": dataclasses.replace(good, request_id=3, voice="", speaker="ryan"),
        "no built-in speakers": dataclasses.replace(good, request_id=4, speaker="ryan"),
        "must match": dataclasses.replace(good, request_id=5, voice="../alloy"),
    }
    for fragment, msg in cases.items():
        loop.handle(LINK, msg, loop.clock())
        errors = [r for _, r in loop.take_replies() if isinstance(r, Error)]
        assert len(errors) == 1 and errors[0].code == "bad_request" and fragment in errors[0].message, (fragment, errors)
    other_model = make_loop(base_model, voices=_bank(base_model, store, model_id="1.7b-base"), kv_slots=2, max_batch=2)
    other_model.handle(LINK, good, other_model.clock())
    errors = [r for _, r in other_model.take_replies() if isinstance(r, Error)]
    assert errors and "computed by model 'tiny-base'" in errors[0].message
    custom = make_loop(tiny_model, kv_slots=2, max_batch=2)
    custom.handle(LINK, dataclasses.replace(good, speaker="ryan"), custom.clock())
    errors = [r for _, r in custom.take_replies() if isinstance(r, Error)]
    assert errors and "saved voices need a Base model" in errors[0].message


async def test_the_engine_process_serves_a_base_preset_with_saved_voices(base_model: Qwen3TTS, store: VoiceStore) -> None:
    # `python -m engine --model tiny-base --voices-dir DIR`: Ready lists no built-in speakers, a request naming
    # a saved voice streams the reference voice loop's PCM, one naming none is refused.
    import asyncio
    import os
    import uuid

    from engine.ipc.client import EngineLink
    from engine.ipc.messages import Ready
    from engine.ipc.process import engine_command, spawn_engine, stop_engine, wait_for_socket
    from tests.engine.test_engine_process import REPO, Client

    path = f"@vivace-voice-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    proc = spawn_engine(engine_command("engine", "--model", "tiny-base", "--device", "cpu", "--kv-slots", "4",
                                       "--max-batch", "4", "--voices-dir", str(store.root)),
                        path, env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    try:
        wait_for_socket(path, timeout_s=120, proc=proc)
        link = await EngineLink.connect(path)
        readies: list[Ready] = []
        link.on_engine_message(lambda m: readies.append(m) if isinstance(m, Ready) else None)
        await asyncio.wait_for(link.ready.wait(), 10)
        client = Client(link)
        assert readies and readies[0].speakers == () and readies[0].model_id == "tiny-base"
        msg = _submit(base_model, 1, SENTENCES[3], "nova", seed=9)
        received, refused = await asyncio.wait_for(asyncio.gather(
            client.run(msg), client.run(dataclasses.replace(msg, request_id=2, voice=""))), 60)
        assert received.error is None and received.done.reason is DoneReason.COMPLETED
        _, pcm = _voice_reference(base_model, msg, store.tensors("nova")[1])
        assert len(received.pcm) == len(pcm) and np.abs(received.pcm.astype(np.int32) - pcm).max() <= 1
        assert refused.error is not None and "saved voice" in refused.error.message
        await client.link.close()
    finally:
        stop_engine(proc, timeout_s=10)
