"""Reference generation: prompt rows -> frames [T,16] -> 24 kHz PCM, with the official loop semantics.

The plain, readable twin of the engine's executors (reference section 6):

    prefill(rows) -> h_0, logits_0;  c_0^0 = draw(logits_0)
    for k = 0, 1, ...:  c_k^1..15 = code_predictor(h_k, c_k^0)            # frame k is emitted
                        e_k = sum_g E_g(c_k^g) + text_k                    # text_k: trailing[k], then PAD
                        h_{k+1}, logits = talker(e_k);  c_{k+1}^0 = draw(logits);  stop on EOS

Stopping. Real checkpoints stop when codebook 0 is EOS (never within the first 2 tokens); the token
that stops is never emitted. Runaway guard: without EOS after `runaway_frame_cap(T)` = 64 + 8*T
frames for T text tokens (8 frames = 640 ms per token, about twice the slowest normal speech; the
engine's scheduler applies the same rule) the request fails with `RunawayError` instead of talking
forever. Random-weight models (presets, dummy
loads) never sample EOS (it is noise there); they stop after the length model's
`length_model_frames(chars)` = ceil(12.5 * chars / 14) frames, i.e. 14 characters per second of audio.
An explicit `max_frames` caps any request quietly at that many frames (the official
`max_new_tokens=N` emits N-1 frames: N-1 here equals it).

Batching. `generate_batch` runs several requests through one slot KV cache (rows at different
lengths, masked), drawing each token from counters of its own request (`sampling.draw`), so every
request's frames equal those of `generate_codes` on it alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from engine.ipc.messages import Sampling
from engine.model import sampling as sampler
from engine.model.host_copy import device_ids
from engine.model.kv_cache import TalkerKVCache
from engine.model.prompt_cache import PromptHeadCache
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.rng import seed_tensor
from engine.request import FRAMES_PER_SECOND, length_model_frames, runaway_frame_cap
from engine.text.prompt import Prefill, PromptRow, build_prefill


class RunawayError(RuntimeError):
    """The model did not end the utterance within the frame cap derived from the text length."""


# ---------------------------------------------------------------- prompt embeddings


def embed_prefill(model: Qwen3TTS, prefill: Prefill, cache: PromptHeadCache | None = None) -> Tensor:
    """Prefill rows -> [L, hidden] in the model dtype: P(text id) + C(codec id), absent terms omitted. With
    `cache`, the rows before the prompt's first text token come from it (computed on a miss): bitwise the same."""
    rows = prefill.rows
    head = _head_rows(model, rows) if cache is not None else 0
    if not head:
        return _embed_rows(model, rows, split_role=True)
    assert cache is not None
    key = tuple((row.text_id, row.codec_id) for row in rows[:head])
    opening = cache.get(key)
    if opening is None:
        opening = _embed_rows(model, rows[:head], split_role=True)
        cache.put(key, opening)
    if head == len(rows):
        return opening.clone()
    # The rest starts at a run of its own in the whole prompt's grouping, never at the role ids: no role split.
    return torch.cat([opening, _embed_rows(model, rows[head:], split_role=False)])


def _head_rows(model: Qwen3TTS, rows: Sequence[PromptRow]) -> int:
    """How many opening rows do not depend on the prompt's text: up to its first text id outside the role ids'
    run and the special ids (0 when it opens with instruction ids, which are text)."""
    p = model.config.prompt_ids
    ids = [row.text_id for row in rows]
    if ids[:3] != [p.im_start, p.assistant, p.newline]:
        return 0
    runs = _runs(ids, {p.tts_bos, p.tts_eos, p.tts_pad}, split_role=True)
    if runs[0] != [0, 1, 2]:
        return 0  # the role ids are not a projection of their own here: no head to cut off
    return runs[1][0] if len(runs) > 1 else len(rows)


def _embed_rows(model: Qwen3TTS, rows: Sequence[PromptRow], *, split_role: bool) -> Tensor:
    text = _project_text(model, [row.text_id for row in rows], split_role=split_role)
    codec_ids = [row.codec_id for row in rows]
    device = model.device
    present = [i for i, cid in enumerate(codec_ids) if cid is not None]
    codec = model.talker.embed_codec(device_ids([codec_ids[i] for i in present], device))
    codec_rows: dict[int, Tensor] = dict(zip(present, codec, strict=True))
    embedded = []
    for i, t in enumerate(text):
        c = codec_rows.get(i)
        assert t is not None or c is not None, f"prefill row {i} has neither a text nor a codec id"
        embedded.append(c if t is None else t if c is None else t + c)
    return torch.stack(embedded)


def embed_trailing(model: Qwen3TTS, prefill: Prefill) -> tuple[Tensor, Tensor]:
    """-> (trailing text rows [n, hidden] fed one per decode step, the PAD row [hidden] fed after them)."""
    pad_id = model.config.prompt_ids.tts_pad
    rows = _project_text(model, [*prefill.trailing, pad_id], split_role=False)
    pad = rows[-1]
    assert pad is not None
    return (torch.stack(rows[:-1]) if prefill.trailing else pad.new_zeros(0, pad.shape[-1])), pad


def _project_text(model: Qwen3TTS, ids: list[int | None], *, split_role: bool) -> list[Tensor | None]:
    """P(id) per row, grouping rows into the GEMMs the official code uses so bf16 rows round identically.

    Official groups: [tts_bos, tts_eos, tts_pad] in one call; every maximal run of other ids in one
    call (instruct ids, the 3 role ids, x_1, x_1..x_T or x_2..x_T), except that the run of text-only
    rows at the start of a prefill is instruct + role, projected as two calls.
    """
    p = model.config.prompt_ids
    talker, device = model.talker, model.device
    specials = (p.tts_bos, p.tts_eos, p.tts_pad)
    special_rows: dict[int, Tensor] = {}
    if any(i in specials for i in ids):  # projected in a call of their own, so only when some row needs one
        special_rows = dict(zip(specials, talker.embed_text(device_ids(specials, device)), strict=True))
    out: list[Tensor | None] = [special_rows.get(i) if i is not None else None for i in ids]
    for run in _runs(ids, specials, split_role=split_role):
        projected = talker.embed_text(device_ids([ids[i] for i in run], device))
        for i, row in zip(run, projected, strict=True):
            out[i] = row
    return out


def _runs(ids: list[int | None], specials: object, *, split_role: bool) -> list[list[int]]:
    runs: list[list[int]] = []
    for i, token in enumerate(ids):
        if token is None or token in specials:  # type: ignore[operator]
            continue
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    if split_role and runs and runs[0][0] == 0 and len(runs[0]) > 3:
        runs[0:1] = [runs[0][:-3], runs[0][-3:]]  # instruct ids, then <|im_start|> assistant \n
    return runs


# ---------------------------------------------------------------- one batch of model steps


def _talker_prefill(model: Qwen3TTS, cache: TalkerKVCache, slots: list[int], embeds: list[Tensor]):
    """Right-padded batched prefill -> (last hidden [B,H], fp32 logits of the last row [B,V])."""
    lengths = [e.shape[0] for e in embeds]
    x = torch.nn.utils.rnn.pad_sequence(embeds, batch_first=True)  # [B,Lmax,H], zero rows after each prompt
    batch = cache.prefill_batch(slots, lengths)
    hidden = model.talker(x, cache, batch)  # [B,Lmax,H]
    cache.advance(slots, lengths)
    logits = model.talker.logits(hidden)  # the official head runs over every prefill row
    last = torch.tensor(lengths, device=x.device) - 1
    rows = torch.arange(len(slots), device=x.device)
    return hidden[rows, last], logits[rows, last]


def _talker_decode(
    model: Qwen3TTS, cache: TalkerKVCache, slots: list[int], x: Tensor
) -> tuple[Tensor, Tensor]:
    """x [B,1,H] -> (hidden [B,H], fp32 logits [B,V])."""
    hidden = model.talker(x, cache, cache.decode_batch(slots))[:, 0]
    cache.advance(slots, [1] * len(slots))
    return hidden, model.talker.logits(hidden)


def _predict_codes(
    model: Qwen3TTS, hidden: Tensor, code0: Tensor, choose: Callable[[int, Tensor], Tensor]
) -> Tensor:
    """Code predictor over one frame for B rows: hidden [B,H], code0 [B] -> codes of groups 1..15 [B,15].

    `choose(group, logits [B,V])` returns the group's codes [B] (a draw, or teacher forcing).
    """
    predictor = model.code_predictor
    cache = predictor.new_cache(hidden.shape[0])
    x = torch.stack((hidden, model.talker.embed_codec(code0)), dim=1)  # [B,2,H]
    logits = predictor.logits(1, predictor(x, cache, start=0))[:, -1]  # head over both rows, as official
    codes = [choose(1, logits)]
    for group in range(2, predictor.config.num_code_groups):
        x = predictor.embed_code(group - 1, codes[-1])[:, None]  # [B,1,H]
        logits = predictor.logits(group, predictor(x, cache, start=group))[:, 0]
        codes.append(choose(group, logits))
    return torch.stack(codes, dim=1)


def _frame_input(model: Qwen3TTS, frame: Tensor, text: Tensor) -> Tensor:
    """frame [B,16], text rows [B,H] -> next talker input [B,1,H]: one 16-way sum, then the text row."""
    parts = [model.talker.embed_codec(frame[:, 0])]
    parts += [model.code_predictor.embed_code(g, frame[:, g]) for g in range(1, frame.shape[1])]
    return torch.stack(parts, dim=1).sum(1, keepdim=True) + text[:, None]


def _text_rows(trailing: list[tuple[Tensor, Tensor]], rows: list[int], steps: list[int]) -> Tensor:
    """Text row of each request's decode step: trailing[step] while it lasts, then PAD. -> [B,H]"""
    out = []
    for r, step in zip(rows, steps, strict=True):
        text, pad = trailing[r]
        out.append(text[step] if step < text.shape[0] else pad)
    return torch.stack(out)


# ---------------------------------------------------------------- teacher forcing (parity)


@torch.inference_mode()
def teacher_forced_probs(
    model: Qwen3TTS, prefill: Prefill, codes: Tensor, sampling: Sampling, step_count: int | None = None
) -> tuple[Tensor, Tensor]:
    """Processed distributions along a fixed history of frames `codes` [T,16] (only the first
    `step_count` frames when given).

    -> (talker [T+1, vocab]: before each codebook-0 draw k = 0..T, after penalty over codes[:k,0],
        EOS and control masks, temperature, top-k and softmax (one-hot argmax for greedy);
        code predictor [T, 15, 2048]: before each draw of groups 1..15 of frame k), all fp32.
    """
    frames = codes.shape[0] if step_count is None else step_count
    device = model.device
    codes = codes[:frames].to(device=device, dtype=torch.int64)
    embeds = embed_prefill(model, prefill)
    trailing = [embed_trailing(model, prefill)]
    cache = model.talker.new_cache(1, embeds.shape[0] + frames + 1)
    talker_rows = sampler.RowSettings.talker([sampling], device)
    predictor_rows = sampler.RowSettings.code_predictor([sampling], device)
    state = _TalkerState.new(model, 1, [sampling], device)

    hidden, logits = _talker_prefill(model, cache, [0], [embeds])
    talker_probs = [sampler.processed_probs(state.scores(logits, [0]), talker_rows)]
    predictor_probs = []
    for k in range(frames):
        frame = codes[k : k + 1]  # [1,16]
        group_probs: list[Tensor] = []
        _predict_codes(model, hidden, frame[:, 0], _teacher(frame, predictor_rows, group_probs))
        predictor_probs.append(torch.cat(group_probs))  # [15, 2048]
        state.record([0], frame[:, 0])
        hidden, logits = _talker_decode(
            model, cache, [0], _frame_input(model, frame, _text_rows(trailing, [0], [k]))
        )
        talker_probs.append(sampler.processed_probs(state.scores(logits, [0]), talker_rows))
    c = model.config.code_predictor
    empty = torch.zeros(0, c.num_code_groups - 1, c.vocab_size, device=device)
    return torch.cat(talker_probs), torch.stack(predictor_probs) if predictor_probs else empty


def _teacher(
    frame: Tensor, settings: sampler.RowSettings, out: list[Tensor]
) -> Callable[[int, Tensor], Tensor]:
    """A `choose` for `_predict_codes` that records each group's distribution and feeds the given code."""

    def choose(group: int, logits: Tensor) -> Tensor:
        out.append(sampler.processed_probs(logits, settings))
        return frame[:, group]

    return choose


class _TalkerState:
    """Per-row inputs of the talker processors: ids seen so far, count, penalty, whether EOS is banned."""

    def __init__(
        self, model: Qwen3TTS, seen: Tensor, generated: Tensor, penalty: Tensor, eos_never: Tensor
    ) -> None:
        self.config = model.config.talker
        self.seen, self.generated, self.penalty, self.eos_never = seen, generated, penalty, eos_never

    @staticmethod
    def new(model: Qwen3TTS, rows: int, samplings: Sequence[Sampling], device: torch.device) -> _TalkerState:
        vocab = model.config.talker.vocab_size
        penalty = torch.tensor(
            [[s.repetition_penalty] for s in samplings], dtype=torch.float32, device=device
        )
        eos_never = torch.full((rows,), model.config.random_weights, dtype=torch.bool, device=device)
        seen = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
        return _TalkerState(
            model, seen, torch.zeros(rows, dtype=torch.int64, device=device), penalty, eos_never
        )

    def scores(self, logits: Tensor, rows: list[int]) -> Tensor:
        c = self.config
        return sampler.talker_scores(
            logits, self.seen[rows], self.generated[rows], self.penalty[rows], c.codec_eos_id, c.num_codes,
            self.eos_never[rows],
        )  # fmt: skip

    def record(self, rows: list[int], tokens: Tensor) -> None:
        index = torch.tensor(rows, device=tokens.device)
        self.seen[index, tokens] = True
        self.generated[index] += 1


# ---------------------------------------------------------------- generation


def generate_codes(
    model: Qwen3TTS,
    prefill: Prefill,
    sampling: Sampling,
    seed: int,
    max_frames: int | None = None,
    text_chars: int | None = None,
) -> Tensor:
    """One request -> frames [T,16] int64 on the model's device (see the module docstring for stopping)."""
    return generate_batch(
        model, [prefill], [sampling], [seed], max_frames=max_frames, text_chars=[text_chars]
    )[0]


@torch.inference_mode()
def generate_batch(
    model: Qwen3TTS,
    prefills: Sequence[Prefill],
    samplings: Sequence[Sampling],
    seeds: Sequence[int],
    *,
    max_frames: int | None = None,
    text_chars: Sequence[int | None] | None = None,
) -> list[Tensor]:
    """Several requests through one slot KV cache; request i's frames equal generate_codes on it alone."""
    count = len(prefills)
    if not (count == len(samplings) == len(seeds)) or count == 0:
        raise ValueError(
            "generate_batch needs one sampling and one seed per prefill, and at least one prefill"
        )
    chars = list(text_chars) if text_chars is not None else [None] * count
    limits = [_frame_limit(model, p, c, max_frames) for p, c in zip(prefills, chars, strict=True)]
    device = model.device
    embeds = [embed_prefill(model, p) for p in prefills]
    trailing = [embed_trailing(model, p) for p in prefills]
    cache = model.talker.new_cache(count, max(e.shape[0] for e in embeds) + max(lim for lim, _ in limits) + 2)
    run = _Run(model, samplings, seeds, device)

    slots = list(range(count))
    hidden, logits = _talker_prefill(model, cache, slots, embeds)
    code0 = run.draw_code0(logits, slots)
    frames: list[list[Tensor]] = [[] for _ in range(count)]
    active = slots
    while active:
        eos = model.config.talker.codec_eos_id
        active = [r for r, c in zip(active, code0.tolist(), strict=True) if c != eos]  # EOS ends, unemitted
        if not active:
            break
        index = torch.tensor([slots.index(r) for r in active], device=device)
        hidden, code0 = hidden[index], code0[index]
        frame = torch.cat((code0[:, None], run.predict(hidden, code0, active, frames)), dim=1)  # [A,16]
        for i, r in enumerate(active):
            frames[r].append(frame[i])
        keep = [i for i, r in enumerate(active) if len(frames[r]) < limits[r][0] or not limits[r][1]]
        step_rows = [active[i] for i in keep]
        if not step_rows:
            break
        steps = [len(frames[r]) - 1 for r in step_rows]  # frame k is fed together with text row k
        x = _frame_input(model, frame[keep], _text_rows(trailing, step_rows, steps))
        hidden, logits = _talker_decode(model, cache, step_rows, x)
        code0 = run.draw_code0(logits, step_rows)
        _check_runaway(model, step_rows, code0, frames, limits)
        slots, active = step_rows, step_rows
    width = model.config.talker.num_code_groups
    return [torch.stack(f) if f else torch.zeros(0, width, dtype=torch.int64, device=device) for f in frames]


def _frame_limit(
    model: Qwen3TTS, prefill: Prefill, chars: int | None, max_frames: int | None
) -> tuple[int, bool]:
    """-> (frame limit, whether reaching it simply ends the request) for one request."""
    if max_frames is not None and max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    if model.config.random_weights:
        if chars is None or chars < 1:
            raise ValueError("random-weight models need text_chars >= 1: their length is ceil(12.5*chars/14)")
        target = length_model_frames(chars)
        return (target if max_frames is None else min(target, max_frames)), True
    if max_frames is not None:
        return max_frames, True
    return runaway_frame_cap(_text_token_count(model, prefill)), False


def _text_token_count(model: Qwen3TTS, prefill: Prefill) -> int:
    """T of x_1..x_T: text rows that also carry a codec id, plus trailing ids, specials excluded."""
    p = model.config.prompt_ids
    specials = {p.tts_pad, p.tts_bos, p.tts_eos}
    in_rows = sum(1 for r in prefill.rows if r.codec_id is not None and r.text_id not in specials | {None})
    return in_rows + sum(1 for t in prefill.trailing if t not in specials)


def _check_runaway(
    model: Qwen3TTS,
    rows: list[int],
    code0: Tensor,
    frames: list[list[Tensor]],
    limits: list[tuple[int, bool]],
) -> None:
    eos = model.config.talker.codec_eos_id
    for r, c in zip(rows, code0.tolist(), strict=True):
        cap, quiet = limits[r]
        if not quiet and len(frames[r]) >= cap and c != eos:
            raise RunawayError(
                f"no end of speech after {cap} frames ({cap / FRAMES_PER_SECOND:.1f} s); the runaway guard "
                f"allows 64 + 8 frames per text token"
            )


class _Run:
    """Sampling state of one generate_batch call, indexed by request number."""

    def __init__(
        self, model: Qwen3TTS, samplings: Sequence[Sampling], seeds: Sequence[int], device: torch.device
    ):
        self.model = model
        self.talker_rows = sampler.RowSettings.talker(list(samplings), device)
        self.predictor_rows = sampler.RowSettings.code_predictor(list(samplings), device)
        self.seeds = seed_tensor(list(seeds), device)
        self.state = _TalkerState.new(model, len(samplings), samplings, device)
        self.frame_counts = torch.zeros(len(samplings), dtype=torch.int64, device=device)

    def draw_code0(self, logits: Tensor, rows: list[int]) -> Tensor:
        index = torch.tensor(rows, device=logits.device)
        probs = sampler.processed_probs(self.state.scores(logits, rows), self.talker_rows.take(index))
        tokens = sampler.draw(probs, self.seeds[index], self.frame_counts[index], group=0)
        self.state.record(rows, tokens)
        return tokens

    def predict(self, hidden: Tensor, code0: Tensor, rows: list[int], frames: list[list[Tensor]]) -> Tensor:
        index = torch.tensor(rows, device=hidden.device)
        settings, seeds = self.predictor_rows.take(index), self.seeds[index]
        frame_numbers = torch.tensor([len(frames[r]) for r in rows], device=hidden.device)

        def choose(group: int, logits: Tensor) -> Tensor:
            return sampler.draw(sampler.processed_probs(logits, settings), seeds, frame_numbers, group)

        codes = _predict_codes(self.model, hidden, code0, choose)
        self.frame_counts[index] = frame_numbers + 1  # the next talker draw belongs to the next frame
        return codes


# ---------------------------------------------------------------- text to audio


def decode_codes(model: Qwen3TTS, codes: Tensor) -> np.ndarray:
    """frames [T,16] -> float32 PCM [T*1920] at 24 kHz through the codec's full decode."""
    assert model.codec is not None, "this model was loaded without a codec"
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.float32)
    device = next(model.codec.parameters()).device
    with torch.inference_mode():
        wav = model.codec.decode(codes.T[None].to(device=device, dtype=torch.int64))  # [1, T*1920]
    return wav[0].to(torch.float32).cpu().numpy()


def synthesize(
    model: Qwen3TTS,
    text: str,
    *,
    speaker: str = "ryan",
    language: str = "english",
    instruct: str = "",
    streaming: bool = True,
    sampling: Sampling = Sampling(),  # noqa: B008 - frozen dataclass, safe as a default
    seed: int = 0,
) -> np.ndarray:
    """Text -> float32 PCM at 24 kHz (mono) with the reference generation loop."""
    if not text.strip():
        raise ValueError("text is empty")
    if instruct and not model.config.supports_instruct:
        raise ValueError(f"the {model.config.model_size} model does not take instructions")
    assert model.tokenizer is not None, "this model was loaded without a tokenizer"
    tokenizer = model.tokenizer
    prefill = build_prefill(
        model.config.prompt_ids,
        speaker=speaker,
        language=language,
        text_ids=tokenizer.target_ids(text),
        instruct_ids=tokenizer.instruct_ids(instruct) if instruct else (),
        streaming=streaming,
    )
    codes = generate_codes(model, prefill, sampling, seed, text_chars=len(text))
    return decode_codes(model, codes)
