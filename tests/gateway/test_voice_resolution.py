"""The one voice resolver every route uses (gateway/voices.py `ServedVoices`: built-in speakers, saved voices,
VoiceDesign descriptions), and the model kinds the gateway starts with (gateway/model_source.py): in-process,
no server. End to end over every route: tests/gateway/test_saved_voices.py, test_voice_design.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.model.presets import CHECKPOINT_PRESETS, PRESETS
from engine.voice_store import ComputedVoice, VoiceStore
from gateway.model_source import SERVED_MODEL_TYPES, ModelUnsupported, locate_model
from gateway.settings import parse_settings
from gateway.voices import OPENAI_VOICES, ServedVoices, UnknownName, Voice

BUILT_INS = ("aiden", "dylan", "eric", "ono_anna", "ryan", "serena", "sohee", "uncle_fu", "vivian")


def _save(store: VoiceStore, name: str, model_id: str = "tiny-base") -> None:
    voice = ComputedVoice(embedding=torch.zeros(64), ref_codes=None, duration_s=2.0, sample_rate=24000)
    store.save(name, model_id=model_id, audio=b"RIFF", audio_ext="wav", voice=voice)


def _code(call: object) -> str:
    with pytest.raises(UnknownName) as caught:
        call()  # type: ignore[operator]
    return caught.value.code


@pytest.fixture
def store(tmp_path: Path) -> VoiceStore:
    store = VoiceStore(tmp_path / "voices")
    for name in ("my-voice", "alloy"):
        _save(store, name)
    _save(store, "other-model", model_id="1.7b-base")
    return store


def test_custom_voice_models_keep_their_speakers_aliases_and_default_and_offer_no_saved_voices(
    store: VoiceStore,
) -> None:
    served = ServedVoices(BUILT_INS, "tiny", store)
    assert served.default() == Voice(speaker="ryan") and ServedVoices(("vivian",), "tiny", None).default() == Voice(
        speaker="vivian"
    )
    assert served.resolve(" Vivian ") == Voice(speaker="vivian")
    assert all(served.resolve(name) == Voice(speaker=speaker) for name, speaker in OPENAI_VOICES.items())
    assert served.openai_aliases() == OPENAI_VOICES and served.names() == list(BUILT_INS)
    assert served.saved_names() == [] and _code(lambda: served.resolve("my-voice")) == "unknown_voice"
    assert served.pick(None) == Voice(speaker="ryan") and served.pick(None, Voice(speaker="eric")).speaker == "eric"


def test_a_base_model_speaks_with_the_saved_voices_made_for_it(store: VoiceStore) -> None:
    served = ServedVoices((), "tiny-base", store)
    assert served.saved_only and served.names() == served.saved_names() == ["alloy", "my-voice"]
    assert served.resolve("My-Voice") == Voice(saved="my-voice") and Voice(saved="my-voice").name == "my-voice"
    assert served.resolve("alloy") == Voice(saved="alloy")  # an OpenAI name, saved: the saved voice wins
    assert served.openai_aliases() == {"alloy": "alloy"}
    with pytest.raises(UnknownName, match="saved for model '1.7b-base'"):
        served.resolve("other-model")
    with pytest.raises(UnknownName, match="saved voices: alloy, my-voice") as unknown:
        served.resolve("nova")  # an OpenAI name nobody saved: no built-in to fall back on
    assert unknown.value.code == "unknown_voice"
    assert _code(lambda: served.resolve("Not a name!")) == "unknown_voice"
    assert served.default() is None and _code(lambda: served.pick(None)) == "missing_voice"
    store.delete("my-voice")  # a session default chosen earlier is checked again when used
    assert _code(lambda: served.pick(None, Voice(saved="my-voice"))) == "unknown_voice"


def test_a_base_model_without_a_voices_dir_says_how_to_get_voices() -> None:
    served = ServedVoices((), "tiny-base", None)
    with pytest.raises(UnknownName, match="--voices-dir"):
        served.resolve("alloy")
    assert served.saved_names() == [] and served.openai_aliases() == {}


def test_a_voice_design_model_ignores_the_voice_and_needs_instructions_that_describe_one(store: VoiceStore) -> None:
    served = ServedVoices((), "tiny-voice-design", store, "voice_design")
    assert served.described and not served.saved_only and served.voice_kind == "described"
    assert served.names() == [] and served.saved_names() == [] and served.openai_aliases() == {}
    assert served.default() == Voice() and served.pick(None) == Voice() and Voice().name == ""
    assert served.pick("my-voice") == Voice() and served.resolve("nobody at all!") == Voice()  # ignored
    served.check_instructions("A warm, low female voice.")
    for missing in ("", "   "):
        with pytest.raises(UnknownName, match="send the description as instructions") as refused:
            served.check_instructions(missing)
        assert refused.value.code == "missing_instructions"
    with pytest.raises(UnknownName, match="ElevenLabs requests cannot carry a description") as compat:
        served.check_instructions("", protocol="ElevenLabs")
    assert compat.value.code == "missing_instructions" and "POST /v1/audio/speech" in str(compat.value)


def test_instructions_are_refused_for_a_base_model_and_optional_for_a_custom_voice_model(store: VoiceStore) -> None:
    base = ServedVoices((), "tiny-base", store, "base")
    base.check_instructions("")
    assert _code(lambda: base.check_instructions("Speak slowly.")) == "instructions_not_supported"
    custom = ServedVoices(BUILT_INS, "tiny", store, "custom_voice")
    custom.check_instructions("")
    custom.check_instructions("Speak slowly.")
    custom.check_instructions("", protocol="Cartesia")
    assert custom.voice_kind == "built_in" and base.voice_kind == "saved"


def test_an_engine_that_does_not_name_its_model_type_is_read_from_its_speakers(store: VoiceStore) -> None:
    assert ServedVoices(BUILT_INS, "tiny", store).model_type == "custom_voice"
    assert ServedVoices((), "tiny-base", store).model_type == "base"


def test_the_gateway_starts_with_every_engine_preset_and_refuses_kinds_the_engine_does_not_serve(
    tmp_path: Path,
) -> None:
    kinds = {preset: locate_model(parse_settings(["--model", preset], {})).model_type for preset in PRESETS}
    assert kinds == {"tiny": "custom_voice", "1.7b": "custom_voice", "0.6b": "custom_voice", "tiny-base": "base",
                     "1.7b-base": "base", "0.6b-base": "base", "tiny-voice-design": "voice_design",
                     "1.7b-voice-design": "voice_design"}  # fmt: skip
    assert locate_model(parse_settings(["--model", "Tiny-Base"], {})).model_type == "base"
    [design_id] = [hf for hf, preset in CHECKPOINT_PRESETS.items() if preset == "1.7b-voice-design"]
    settings = parse_settings(["--model", design_id, "--load-format", "dummy"], {})
    assert locate_model(settings).model_type == "voice_design"

    design = tmp_path / "design"
    design.mkdir()
    (design / "config.json").write_text(json.dumps(PRESETS["tiny-voice-design"]()[0]))
    assert locate_model(parse_settings(["--model", str(design)], {})).model_type == "voice_design"
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(PRESETS["tiny"]()[0] | {"tts_model_type": "voice_mixer"}))
    with pytest.raises(ModelUnsupported, match="voice_mixer") as refused:
        locate_model(parse_settings(["--model", str(other)], {}))
    assert "--voices-dir" in str(refused.value) and "tiny-voice-design" in str(refused.value)


def test_the_gateway_and_the_engine_serve_the_same_model_kinds() -> None:
    from engine.executors import SERVED_MODEL_TYPES as ENGINE_SERVES

    assert SERVED_MODEL_TYPES == ENGINE_SERVES


def test_a_model_that_takes_no_instructions_refuses_them_before_any_engine_sees_them() -> None:
    small = ServedVoices(BUILT_INS, "0.6b", None, "custom_voice", takes_instructions=False)
    assert _code(lambda: small.check_instructions("Speak slowly.")) == "instructions_not_supported"
    small.check_instructions("")  # none given: nothing to refuse
    ServedVoices(BUILT_INS, "1.7b", None, "custom_voice").check_instructions("Speak slowly.")  # the 1.7B takes them
