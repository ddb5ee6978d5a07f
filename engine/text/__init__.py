"""Text side of the prompt (torch-free): tokenization and the CustomVoice prompt layout.

The gateway imports this package; it must never import torch.
"""

from engine.text.prompt import Prefill, PromptIds, PromptRow, build_prefill, languages, speakers
from engine.text.tokenizer import TextTokenizer

__all__ = ["Prefill", "PromptIds", "PromptRow", "TextTokenizer", "build_prefill", "languages", "speakers"]
