"""The prompt-head cache: a request's prefill rows embed bitwise as without it, and its opening rows (role ids,
special rows over codec rows) are computed once per speaker and language."""

from __future__ import annotations

import pytest
import torch

from engine.model.generate import embed_prefill
from engine.model.prompt_cache import PromptHeadCache
from engine.model.weights import load_model
from engine.text.prompt import build_prefill, build_voice_design_prefill

TEXTS = ["Hello there, my friend.", "A second, longer sentence that is not the first one at all.", "Hi."]


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def model(request):  # type: ignore[no-untyped-def]
    return load_model("tiny", device="cpu", dtype=request.param)


def _ids(model, text: str) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    return tuple(model.tokenizer.target_ids(text))


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_cached_prompt_heads_embed_every_prefill_bitwise_as_without_the_cache(model, streaming: bool):
    cache = PromptHeadCache()
    for speaker in ("ryan", "vivian"):
        for language in ("english", "chinese"):
            for text in TEXTS:
                prefill = build_prefill(model.config.prompt_ids, speaker=speaker, language=language,
                                        text_ids=_ids(model, text), instruct_ids=(), streaming=streaming)
                assert torch.equal(embed_prefill(model, prefill, cache), embed_prefill(model, prefill))
    assert len(cache) == 4  # one head per speaker and language
    assert cache.misses == 4 and cache.hits == 4 * (len(TEXTS) - 1)


def test_a_prompt_that_opens_with_instruction_ids_is_embedded_whole(model):
    cache = PromptHeadCache()
    instruct = _ids(model, "Speak slowly and warmly.")
    prefill = build_prefill(model.config.prompt_ids, speaker="ryan", language="english", text_ids=_ids(model, TEXTS[0]),
                            instruct_ids=instruct, streaming=True)
    assert torch.equal(embed_prefill(model, prefill, cache), embed_prefill(model, prefill))
    design = build_voice_design_prefill(model.config.prompt_ids, language="english", text_ids=_ids(model, TEXTS[1]),
                                        instruct_ids=instruct, streaming=False)
    assert torch.equal(embed_prefill(model, design, cache), embed_prefill(model, design))
    assert len(cache) == 0


def test_the_cache_keeps_its_most_recently_used_heads():
    cache = PromptHeadCache(max_entries=2)
    a, b, c = ((("a",),), (("b",),), (("c",),))
    for key in (a, b):
        cache.put(key, torch.zeros(1))  # type: ignore[arg-type]
    assert cache.get(a) is not None  # a is now the most recent
    cache.put(c, torch.zeros(1))  # type: ignore[arg-type]
    assert cache.get(b) is None and cache.get(a) is not None and cache.get(c) is not None
