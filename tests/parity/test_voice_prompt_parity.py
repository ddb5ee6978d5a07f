"""Prompt-row parity for voice requests: x-vector and in-context (Base), instruction-only (VoiceDesign).

For each variant (mode x language {english, auto, Chinese} x {streaming, non-streaming}, in-context with a
text shorter and one longer than the reference codes), our prompt builder + embedding must give exactly
the official `inputs_embeds` and `trailing_text_hidden` captured at `talker.generate`, for fp32 and bf16
loads. The speaker embedding and reference codes fed in are the official ones (their own parity is
asserted in test_voice_speaker_parity.py / test_voice_codes_parity.py).
"""

from __future__ import annotations

import pytest
import torch

from engine.model.generate import embed_prefill, embed_trailing
from engine.model.voices import embed_voice_prefill
from engine.text.prompt import build_in_context_prefill, build_voice_design_prefill, build_xvector_prefill

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


VARIANTS = 26  # tools/oracle/voices.py: 6 x-vector, 12 in-context, 8 VoiceDesign


def _ours(reference, voices, v: dict, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    _, ref = voices
    if v["mode"] == "design":
        model = reference.voice_model("ckpt-design", dtype)
        prefill = build_voice_design_prefill(
            model.config.prompt_ids, language=v["language"], text_ids=v["text_ids"],
            instruct_ids=v.get("instruct_ids", ()), streaming=v["streaming"],
        )  # fmt: skip
        trailing, _ = embed_trailing(model, prefill)
        return embed_prefill(model, prefill), trailing
    model = reference.voice_model("ckpt-base", dtype)
    ids = model.config.prompt_ids
    codes = ref[f"{v['audio']}.codes"]
    if v["mode"] == "xvector":
        prefill = build_xvector_prefill(
            ids, language=v["language"], text_ids=v["text_ids"], streaming=v["streaming"]
        )
    else:
        prefill = build_in_context_prefill(
            ids, language=v["language"], text_ids=v["text_ids"], ref_text_ids=v["ref_ids"],
            ref_frames=codes.shape[0], streaming=v["streaming"],
        )  # fmt: skip
    rows, trailing, _ = embed_voice_prefill(model, prefill, ref[f"{v['audio']}.spk"], codes)
    return rows, trailing


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("variant", range(VARIANTS))
def test_voice_prompt_rows_and_trailing_text_are_bit_identical_to_the_official(
    reference, voices, variant: int, dtype: str
) -> None:
    meta, ref = voices
    assert len(meta["prefill"]) == VARIANTS
    v = meta["prefill"][variant]
    rows, trailing = _ours(reference, voices, v, DTYPES[dtype])
    theirs_rows = ref[f"prefill.{variant}.{dtype}.rows"]
    theirs_trailing = ref[f"prefill.{variant}.{dtype}.trailing"]
    assert rows.shape == theirs_rows.shape, (v, rows.shape, theirs_rows.shape)
    assert torch.equal(rows.float(), theirs_rows), (
        f"max |diff| {float((rows.float() - theirs_rows).abs().max())}"
    )
    assert trailing.shape == theirs_trailing.shape
    assert torch.equal(trailing.float(), theirs_trailing)


def test_in_context_variants_cover_both_streaming_branches(voices) -> None:
    """A text longer than the reference codes leaves text in the trailing queue; a shorter one pads."""
    meta, ref = voices
    icl = [v for v in meta["prefill"] if v["mode"] == "icl" and v["streaming"]]
    lengths = {
        len(v["ref_ids"]) + len(v["text_ids"]) + 1 > ref[f"{v['audio']}.codes"].shape[0] + 1 for v in icl
    }
    assert lengths == {True, False}
