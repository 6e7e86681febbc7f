"""Vocabulary-only GGUF files written from a ``tokenizer.json``, for llama.cpp's tokenizer in the tests.

The one real GGUF here is SmolLM2's, whose special tokens are all CONTROL tokens that never overlap. These
files give llama.cpp the other cases on real vocabularies: Qwen3's (its ``<tool_call>`` and ``<think>`` are
USER_DEFINED tokens, which llama.cpp cuts even without ``parse_special``), and one whose model name says
"phi-3" (llama.cpp then strips the whitespace after every special token) with added tokens that overlap.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def write_vocab_gguf(
    path: Path,
    tokenizer_json: Path,
    *,
    name: str,
    pre: str,
    user_defined: Sequence[str] = (),
    control: Sequence[str] = (),
) -> Path:
    """A GGUF holding the vocabulary of ``tokenizer_json`` (a byte-level BPE) and no weights."""
    import gguf

    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab: dict[str, int] = spec["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    added = {t["id"]: t for t in spec["added_tokens"]}
    size = max(max(vocab.values()), max(added)) + 1
    tokens = [f"[UNUSED{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, index in vocab.items():
        tokens[index], types[index] = text, gguf.TokenType.NORMAL
    for index, token in added.items():
        tokens[index] = token["content"]
        types[index] = gguf.TokenType.CONTROL if token["special"] else gguf.TokenType.USER_DEFINED
    for texts, kind in ((user_defined, gguf.TokenType.USER_DEFINED), (control, gguf.TokenType.CONTROL)):
        for text in texts:
            tokens.append(text)
            types.append(kind)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name(name)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
