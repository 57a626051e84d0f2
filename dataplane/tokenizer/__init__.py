"""Tokenizer, chat template and incremental detokenisation (HF `tokenizers` + jinja2)."""

from __future__ import annotations

from dataplane.tokenizer.byte_level import ByteLevelDetokenizer
from dataplane.tokenizer.chat_template import ChatTemplateError, render_chat_template
from dataplane.tokenizer.detokenizer import IncrementalDetokenizer
from dataplane.tokenizer.tokenizer import Tokenizer, TokenizerLoadError

__all__ = [
    "ByteLevelDetokenizer",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerLoadError",
    "render_chat_template",
]
