"""Fixtures for the inspect tests: corpus templates with their special tokens, the real tokenizers."""

from __future__ import annotations

from chatcodec import ChatTemplate

from ..conftest import SHARED, manifest, require_shared, template_source

QWEN3_TOKENIZER = SHARED / "tokenizers" / "qwen3"
LLAMA31_TOKENIZER = SHARED / "tokenizers" / "llama3_1"


def corpus_template(name: str) -> ChatTemplate:
    """A corpus template with the special tokens the goldens were rendered with."""
    require_shared()
    return ChatTemplate(template_source(name), special_tokens=manifest()[name]["special_tokens"], name=name)
