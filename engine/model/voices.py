"""Voice requests of Base checkpoints: prompt rows -> talker inputs -> frames -> in-context waveform.

One promise: for a `VoicePrefill` (engine.text.prompt: x-vector or in-context mode) plus the speaker
embedding and reference codes, `embed_voice_prefill` returns the rows and trailing text rows the official
`Qwen3TTSForConditionalGeneration.generate` feeds the talker (same projection-call grouping, so bf16
rows round as the official ones); `generate_voice_codes` runs the official loop from them (the engine's
reference loop of `engine.model.generate`, batch 1); `decode_in_context` decodes reference + generated
codes together and cuts the reference part off at the official sample index
`int(ref / (ref + generated) * samples)` (float arithmetic, as official).

VoiceDesign requests need nothing here: `build_voice_design_prefill` gives a CustomVoice `Prefill`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from engine.ipc.messages import Sampling
from engine.model.generate import (
    _frame_input,
    _project_text,
    _Run,
    _talker_decode,
    _talker_prefill,
)
from engine.model.host_copy import device_ids
from engine.model.qwen3_tts import Qwen3TTS
from engine.text.prompt import VoicePrefill


def embed_voice_prefill(
    model: Qwen3TTS, prefill: VoicePrefill, speaker: Tensor, ref_codes: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """-> (prefill rows [L,H], trailing text rows [n,H], the PAD row [H]) in the model dtype.

    `speaker` [H] is the x-vector (`speaker_embedding`), `ref_codes` [K,16] the reference frames
    (`CodecEncoder.encode`), needed when a row names a reference frame."""
    device, dtype = model.device, model.dtype
    pad_id = model.config.prompt_ids.tts_pad
    row_ids = [row.text_id for row in prefill.rows]
    trailing_ids: list[int | None] = [*prefill.trailing, pad_id]
    if prefill.joint_text:  # in-context: transcript + text (rows and trailing) are one projection call
        projected = _project_text(model, row_ids + trailing_ids, split_role=True)
        text_rows, trailing_rows = projected[: len(row_ids)], projected[len(row_ids) :]
    else:
        text_rows = _project_text(model, row_ids, split_role=True)
        trailing_rows = _project_text(model, trailing_ids, split_role=False)

    frames = None
    if any(row.ref_frame is not None for row in prefill.rows):
        if ref_codes is None:
            raise ValueError("this prompt has reference-frame rows: pass ref_codes [K,16]")
        frames = _frame_sums(model, ref_codes.to(device=device, dtype=torch.int64))  # [K,H]
    codec_ids = [row.codec_id for row in prefill.rows]
    present = [i for i, cid in enumerate(codec_ids) if cid is not None]
    looked_up = model.talker.embed_codec(device_ids([codec_ids[i] for i in present], device))
    codec_rows: dict[int, Tensor] = dict(zip(present, looked_up, strict=True))
    xvector = speaker.to(device=device, dtype=dtype)

    rows = []
    for i, (row, text) in enumerate(zip(prefill.rows, text_rows, strict=True)):
        codec = codec_rows.get(i)
        if row.speaker:
            codec = xvector
        elif row.ref_frame is not None:
            assert frames is not None
            codec = frames[row.ref_frame]
        assert text is not None or codec is not None, f"voice prefill row {i} has no term"
        rows.append(codec if text is None else text if codec is None else text + codec)
    pad = trailing_rows[-1]
    assert pad is not None
    trailing = [t for t in trailing_rows[:-1] if t is not None]
    return torch.stack(rows), (torch.stack(trailing) if trailing else pad.new_zeros(0, pad.shape[-1])), pad


def _frame_sums(model: Qwen3TTS, codes: Tensor) -> Tensor:
    """codes [K,16] -> [K,H]: the 16 code embeddings of each frame summed in one reduction (official)."""
    parts = [model.talker.embed_codec(codes[:, 0])]
    parts += [model.code_predictor.embed_code(g, codes[:, g]) for g in range(1, codes.shape[1])]
    return torch.stack(parts, dim=1).sum(1)


@torch.inference_mode()
def generate_voice_codes(
    model: Qwen3TTS,
    rows: Tensor,
    trailing: Tensor,
    pad: Tensor,
    sampling: Sampling,
    seed: int,
    max_frames: int,
) -> Tensor:
    """Talker inputs (from `embed_voice_prefill`) -> frames [T,16] int64; stops on EOS (never emitted) or
    after `max_frames` frames (an official `max_new_tokens=N` run equals `max_frames=N-1`)."""
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    device = model.device
    cache = model.talker.new_cache(1, rows.shape[0] + max_frames + 2)
    run = _Run(model, [sampling], [seed], device)
    hidden, logits = _talker_prefill(model, cache, [0], [rows])
    code0 = run.draw_code0(logits, [0])
    frames: list[Tensor] = []
    eos = model.config.talker.codec_eos_id
    while int(code0[0]) != eos:
        frame = torch.cat((code0[:, None], run.predict(hidden, code0, [0], [frames])), dim=1)  # [1,16]
        frames.append(frame[0])
        if len(frames) >= max_frames:
            break
        step = len(frames) - 1
        text = trailing[step] if step < trailing.shape[0] else pad
        hidden, logits = _talker_decode(model, cache, [0], _frame_input(model, frame, text[None]))
        code0 = run.draw_code0(logits, [0])
    width = model.config.talker.num_code_groups
    return torch.stack(frames) if frames else torch.zeros(0, width, dtype=torch.int64, device=device)


def decode_in_context(model: Qwen3TTS, ref_codes: Tensor, codes: Tensor) -> np.ndarray:
    """Official in-context audio: decode [ref_codes; codes] with the official 300/25 chunking, then drop
    the first `int(K / (K + T) * samples)` samples. -> float32 PCM at 24 kHz."""
    assert model.codec is not None, "this model was loaded without a codec"
    joined = torch.cat((ref_codes.to(codes.device, torch.int64), codes.to(torch.int64)), dim=0)  # [K+T,16]
    codec_device = next(model.codec.parameters()).device
    with torch.inference_mode():
        wav = model.codec.decode_official(joined.T[None].to(codec_device))[0].to(torch.float32).cpu().numpy()
    cut = int(ref_codes.shape[0] / max(joined.shape[0], 1) * wav.shape[0])
    return wav[cut:]
