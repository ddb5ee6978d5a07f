"""A Base model serves a voice saved with a transcript in in-context mode when the whole text is known at
Submit: its frames equal the reference voice loop's with `build_in_context_prefill` (transcript, text and
reference codes), and its audio equals the official `decode_in_context` of [reference; generated] with the
reference part cut off, alone and batched with an x-vector request. Streamed text with the same voice runs
in x-vector mode. The voice's tensors, transcript ids and primed codec state are computed once per save."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.codec.silence import SAMPLES_PER_FRAME, LeadingSilenceTrimmer, SilenceConfig
from engine.executors.codec import to_int16
from engine.executors.voices import VoiceBank
from engine.ipc.messages import Audio, Done, DoneReason, EndText, Error, Layout, Sampling, Submit
from engine.loop import EngineLoop
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.voices import decode_in_context, embed_voice_prefill, generate_voice_codes
from engine.request import WorkKind, length_model_frames
from engine.text.prompt import VoicePrefill, build_in_context_prefill
from engine.voice_store import VoiceStore, compute_voice
from tests.engine.helpers import LINK, make_loop, run_to_completion, text_ids
from tests.engine.test_voices import _reference_pcm, _voice_reference

GREEDY = Sampling(greedy=True, subtalker_greedy=True)
RATE = 24000
TRANSCRIPT = "Hello."
SHORT = "Hi."  # transcript + text shorter than the reference frames: the trailing text is tts_pad
LONG = "This much longer sentence keeps on going, word after word, past the reference frames."


@pytest.fixture(scope="module")
def store(base_model: Qwen3TTS, tmp_path_factory: pytest.TempPathFactory) -> VoiceStore:
    store = VoiceStore(tmp_path_factory.mktemp("icl-voices"))
    store.save("told", model_id="tiny-base", audio=b"RIFF....", audio_ext="wav", transcript=TRANSCRIPT,
               voice=compute_voice(base_model, _reference_pcm(1), RATE, transcript=TRANSCRIPT))
    store.save("plain", model_id="tiny-base", audio=b"RIFF....", audio_ext="wav",
               voice=compute_voice(base_model, _reference_pcm(2), RATE))
    return store


def _bank(model: Qwen3TTS, store: VoiceStore) -> VoiceBank:
    return VoiceBank(store, model_id="tiny-base", hidden=model.config.talker.hidden_size, device=model.device,
                     dtype=model.dtype, tokenizer=model.tokenizer)


def _submit(model: Qwen3TTS, request_id: int, text: str, voice: str, **kw: object) -> Submit:
    return Submit(request_id=request_id, speaker="", language="english", text_ids=text_ids(model, text),
                  text_chars=len(text), text_ended=True, voice=voice, **kw)  # type: ignore[arg-type]


def _in_context_prefill(model: Qwen3TTS, msg: Submit, ref_frames: int) -> VoicePrefill:
    assert model.tokenizer is not None
    return build_in_context_prefill(model.config.prompt_ids, language=msg.language, text_ids=msg.text_ids,
                                    ref_text_ids=model.tokenizer.reference_ids(TRANSCRIPT), ref_frames=ref_frames,
                                    streaming=msg.layout is Layout.STREAMING)  # fmt: skip


def _in_context_reference(model: Qwen3TTS, msg: Submit, store: VoiceStore) -> tuple[torch.Tensor, np.ndarray]:
    """The request alone through the reference voice loop in in-context mode, decoded the official way ->
    (frames, the int16 PCM the engine must publish: the cut audio through the same leading-silence trim)."""
    _, speaker, ref_codes = store.tensors(msg.voice)
    assert ref_codes is not None
    rows, trailing, pad = embed_voice_prefill(model, _in_context_prefill(model, msg, ref_codes.shape[0]), speaker,
                                              ref_codes)  # fmt: skip
    codes = generate_voice_codes(model, rows, trailing, pad, msg.sampling, msg.seed,
                                 max_frames=length_model_frames(msg.text_chars))
    official = decode_in_context(model, ref_codes, codes)
    # The official cut int(K / (K+T) * samples) can land one sample before K * 1920 (float rounding); the
    # engine streams from exactly K * 1920.
    extra = len(official) - codes.shape[0] * SAMPLES_PER_FRAME
    assert extra in (0, 1)
    trimmer = LeadingSilenceTrimmer(SilenceConfig())
    pcm = trimmer.push(official[extra:])
    return codes, to_int16(np.concatenate([pcm, trimmer.finish()]))


def test_in_context_requests_equal_the_reference_loop_and_the_official_cut_decode(base_model: Qwen3TTS,
                                                                                 store: VoiceStore) -> None:
    loop = make_loop(base_model, voices=_bank(base_model, store))
    msgs = [_submit(base_model, 1, SHORT, "told", sampling=GREEDY),
            _submit(base_model, 2, LONG, "told", seed=3),
            _submit(base_model, 3, LONG, "told", seed=4, layout=Layout.NON_STREAMING),
            _submit(base_model, 4, SHORT, "plain", seed=5)]
    ref_frames = store.info("told").ref_frames
    assert ref_frames is not None
    # Both streaming shapes occur: a trailing of tts_pad only, and one that still holds text and tts_eos.
    pad = base_model.config.prompt_ids.tts_pad
    assert _in_context_prefill(base_model, msgs[0], ref_frames).trailing == (pad,)
    assert len(_in_context_prefill(base_model, msgs[1], ref_frames).trailing) > 3
    results, frames = run_to_completion(loop, msgs)
    assert loop.lifetime_max_batch[WorkKind.TALKER_DECODE] > 1
    assert loop.lifetime_max_batch[WorkKind.CODEC_CHUNK] > 1
    for msg in msgs[:3]:
        codes, pcm = _in_context_reference(base_model, msg, store)
        result = results[msg.request_id]
        assert result.error is None and result.done.reason is DoneReason.COMPLETED
        assert torch.equal(frames[msg.request_id], codes), f"request {msg.request_id}: frames differ"
        assert len(result.samples) == len(pcm), f"request {msg.request_id}"
        assert np.abs(result.samples.astype(np.int32) - pcm).max() <= 1, f"request {msg.request_id}"
    # The voice without a transcript runs in x-vector mode beside them.
    codes, pcm = _voice_reference(base_model, msgs[3], store.tensors("plain")[1])
    assert torch.equal(frames[4], codes)
    assert len(results[4].samples) == len(pcm) and np.abs(results[4].samples.astype(np.int32) - pcm).max() <= 1


def _run_streamed(loop: EngineLoop, msg: Submit) -> tuple[list[Audio], Done | None, list[Error]]:
    """Submit with the text still open, end it, step until Done."""
    loop.handle(LINK, dataclasses.replace(msg, text_ended=False), loop.clock())
    state = loop.request_state(LINK, msg.request_id)
    assert state is not None and state.prompt_trailing is None  # x-vector mode: the text was not whole
    loop.handle(LINK, EndText(msg.request_id), loop.clock())
    audio, errors, done = [], [], None
    for _ in range(20_000):
        loop.step()
        for _, reply in loop.take_replies():
            if isinstance(reply, Audio):
                audio.append(reply)
            elif isinstance(reply, Error):
                errors.append(reply)
            elif isinstance(reply, Done):
                done = reply
        if done is not None:
            break
    return audio, done, errors


def test_streamed_text_with_a_transcribed_voice_runs_in_x_vector_mode(base_model: Qwen3TTS, store: VoiceStore) -> None:
    loop = make_loop(base_model, voices=_bank(base_model, store))
    msg = _submit(base_model, 1, SHORT, "told", seed=2)
    audio, done, errors = _run_streamed(loop, msg)
    assert not errors and done is not None and done.reason is DoneReason.COMPLETED
    codes, pcm = _voice_reference(base_model, msg, store.tensors("told")[1])
    assert done.frames == codes.shape[0]
    samples = np.frombuffer(b"".join(a.pcm for a in audio), "<i2").astype(np.int32)
    assert len(samples) == len(pcm) and np.abs(samples - pcm).max() <= 1


def test_a_voice_is_read_tokenized_and_primed_once_per_save(base_model: Qwen3TTS, store: VoiceStore,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    bank = _bank(base_model, store)
    loop = make_loop(base_model, voices=bank)
    reads, primes = [], []
    real_tensors, real_prime = store.tensors, loop.executors.codec._prime
    monkeypatch.setattr(store, "tensors", lambda name: reads.append(name) or real_tensors(name))

    def counting_prime(slot: int, key: str, ref_codes: torch.Tensor) -> int:
        primes.append(key in loop.executors.codec._primed)
        return real_prime(slot, key, ref_codes)

    monkeypatch.setattr(loop.executors.codec, "_prime", counting_prime)
    msgs = [_submit(base_model, i, SHORT, "told", seed=i) for i in (1, 2, 3)]
    results, _ = run_to_completion(loop, msgs[:2])
    more, _ = run_to_completion(loop, msgs[2:])
    assert reads == ["told"]  # one read of the tensor file for three requests
    assert primes == [False, True, True]  # the reference decoded for the first, copied for the others
    voice = bank.cached("told")
    assert voice.in_context and voice.ref_text_ids == tuple(base_model.tokenizer.reference_ids(TRANSCRIPT))
    # Same seed -> the same audio (within batching's rounding) whether the state was decoded or copied.
    again, _ = run_to_completion(loop, [dataclasses.replace(msgs[0], request_id=9)])
    assert len(again[9].samples) == len(results[1].samples)
    assert np.abs(again[9].samples.astype(np.int32) - results[1].samples).max() <= 1


def test_an_in_context_prompt_over_the_largest_prefill_bucket_is_refused(base_model: Qwen3TTS,
                                                                         store: VoiceStore) -> None:
    loop = make_loop(base_model, voices=_bank(base_model, store), prefill_token_buckets=(16, 32))
    msg = _submit(base_model, 1, LONG, "told", layout=Layout.NON_STREAMING)
    loop.handle(LINK, msg, loop.clock())
    errors = [r for _, r in loop.take_replies() if isinstance(r, Error)]
    assert len(errors) == 1 and errors[0].code == "bad_request" and "prefill tokens" in errors[0].message
    assert loop.executors.codec.open_streams == 0
