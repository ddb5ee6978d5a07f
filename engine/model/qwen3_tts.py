"""Qwen3TTS: the three modules of one loaded model, plus its config and text tokenizer.

`talker` and `code_predictor` (and, in a Base checkpoint, `speaker_encoder`) hold the weights of
`model.safetensors`; `codec` is the speech-tokenizer
decoder from `engine.codec`. Checkpoint names are module names, except that the official file nests
the code predictor inside the talker (`talker.code_predictor.*`); `checkpoint_name` is that one rule.
Build it through `engine.model.weights.load_model`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from engine.model.code_predictor import CodePredictor
from engine.model.config import ModelConfig
from engine.model.speaker_encoder import SpeakerEncoder
from engine.model.talker import Talker

if TYPE_CHECKING:
    from engine.codec.encoder import CodecEncoder
    from engine.codec.model import CodecDecoder
    from engine.text.tokenizer import TextTokenizer

_PREDICTOR_PREFIX = "code_predictor."


def checkpoint_name(module_name: str) -> str:
    """Our parameter name -> its `model.safetensors` key."""
    if module_name.startswith(_PREDICTOR_PREFIX):
        return "talker." + module_name
    return module_name


class Qwen3TTS(nn.Module):
    def __init__(
        self, config: ModelConfig, codec: CodecDecoder | None, tokenizer: TextTokenizer | None
    ) -> None:
        super().__init__()
        self.config = config
        self.talker = Talker(config.talker)
        self.code_predictor = CodePredictor(config.code_predictor)
        self.speaker_encoder = SpeakerEncoder(config.speaker_encoder) if config.speaker_encoder else None
        self.codec = codec
        self.codec_encoder: CodecEncoder | None = (
            None  # Base only (speech_tokenizer encoder.*), set by the loader
        )
        self.tokenizer = tokenizer

    @property
    def device(self) -> torch.device:
        return self.talker.model.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.talker.model.norm.weight.dtype

    def checkpoint_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """(checkpoint key, parameter) for every tensor of `model.safetensors` (the codec has its own file)."""
        for name, tensor in self.talker.state_dict(prefix="talker.", keep_vars=True).items():
            yield name, tensor
        for name, tensor in self.code_predictor.state_dict(prefix=_PREDICTOR_PREFIX, keep_vars=True).items():
            yield checkpoint_name(name), tensor
        if self.speaker_encoder is not None:
            yield from self.speaker_encoder.state_dict(prefix="speaker_encoder.", keep_vars=True).items()
