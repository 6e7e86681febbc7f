"""The dataset's fast paths give what the general code gives, on every corpus template and the real tokenizers."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import chatcodec.masks as masks
from chatcodec.exceptions import ChatcodecError

from ..conftest import CORPUS, conversations, manifest, require_shared
from ..test_tokens import _codec, _corpus_codec

#: caller text with control tokens and marks, so that the marked render holds stand-ins
_MARKED = [
    {"role": "system", "content": "Rules: [1] <b>bold</b> only."},
    {"role": "user", "content": "a <|im_end|> b <|eot_id|> [x] <think>no</think>"},
    {"role": "assistant", "content": "ok [done] <|im_start|>user"},
    {"role": "user", "content": "  spaced  "},
    {"role": "assistant", "content": "fine"},
]
_CONVERSATIONS = ["multi_turn", "reasoning_history", "tools_roundtrip_final", "tools_single_call", "korean"]


def _layouts(codec: Any, chats: list[Any]) -> list[Any]:
    found = []
    for chat, policy in itertools.product(chats, ("escape", "allow")):
        try:
            encoding = codec.encode(chat["messages"], tools=chat.get("tools"), content_special_tokens=policy)
        except ChatcodecError as exc:
            found.append(type(exc).__name__)
            continue
        layout = encoding._get_layout()
        found.append((layout.anchors, layout.failure, encoding.text))
    return found


@pytest.mark.parametrize("name", sorted(manifest()) if CORPUS.is_dir() else [])
def test_anchors_read_in_c_passes_equal_the_scan(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """_anchors_in (markers found by one regex, the text checked by deleting them) against _anchors_scan
    (marker by marker and stand-in by stand-in), on each corpus template's conversations and marked content."""
    require_shared()
    codec = _corpus_codec(name)
    chats = [conversations()[c] for c in _CONVERSATIONS] + [{"messages": _MARKED}]
    fast = _layouts(codec, chats)
    monkeypatch.setattr(masks, "_anchors_in", masks._anchors_scan)
    assert _layouts(codec, chats) == fast
    assert any(isinstance(f, tuple) and f[1] is None and any(f[0]) for f in fast)  # anchors were really found


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_anchors_on_the_real_tokenizers(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    require_shared()
    codec = _codec(name)
    chats = [conversations()[c] for c in _CONVERSATIONS] + [{"messages": _MARKED}]
    fast = _layouts(codec, chats)
    monkeypatch.setattr(masks, "_anchors_in", masks._anchors_scan)
    assert _layouts(codec, chats) == fast
