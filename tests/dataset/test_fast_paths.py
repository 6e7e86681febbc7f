"""The dataset's fast paths give what the general code gives, on every corpus template and the real tokenizers."""

from __future__ import annotations

import itertools
from pathlib import Path
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


# --- masks of ASCII prompts from byte widths -------------------------------------------------------------


def _edge_spans(length: int, ends: list[int], rng: Any) -> list[list[tuple[int, int]]]:
    """Random spans, spans on token edges and just off them, empty, adjacent, overlapping and whole."""
    edges = sorted({0, length, *ends})
    cases = [[], [(0, length)], [(0, 0)], [(length, length)]]
    for _ in range(40):
        cuts = sorted(rng.randrange(length + 1) for _ in range(2 * rng.randint(1, 4)))
        cases.append(list(zip(cuts[::2], cuts[1::2], strict=True)))
        on = sorted(rng.choice(edges) for _ in range(4))
        cases.append([(on[0], on[1]), (on[2], on[3])])
        off = sorted(min(length, max(0, rng.choice(edges) + rng.choice((-1, 1)))) for _ in range(2))
        cases.append([(off[0], off[1]), (off[1], off[1])])
        a, b, c = sorted(rng.randrange(length + 1) for _ in range(3))
        cases.append([(a, c), (b, c)])  # overlapping
        cases.append([(a, b), (b, c)])  # adjacent
    return cases


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_byte_width_masks_equal_the_offsets_masks(name: str) -> None:
    """On both real tokenizers: every ASCII prompt (corpus conversations, generated rows with tools, reasoning and
    control tokens in content, escaped or allowed) gets its mask from byte widths, equal to the overlap mask of
    the tokenizer's own offsets for every kind of span; other prompts are left to the offsets."""
    import random

    from chatcodec.masks import byte_width_mask, overlap_mask
    from chatcodec.tokens import load

    from ..conftest import SHARED
    from .test_parity import generated_rows

    require_shared()
    codec = load(SHARED / "tokenizers" / name)  # a fresh cache: stretches encoded alone, joined and cached
    rng = random.Random(3)
    chats = [(c["messages"], c.get("tools")) for c in conversations().values()]
    chats += [(row["messages"], row.get("tools")) for row in generated_rows(40)]
    chats.append((_MARKED, None))
    fast = slow = 0
    for (messages, tools), policy, add in itertools.product(chats, ("escape", "allow"), (False, True)):
        try:
            encoding = codec.encode(messages, tools=tools, content_special_tokens=policy, add_special_tokens=add)
        except ChatcodecError:
            continue
        offsets = list(encoding.offsets)
        encoding._offsets = None
        ends = [end for _, end in offsets]
        for spans in _edge_spans(len(encoding.text), ends, rng):
            got = byte_width_mask(encoding, spans)
            if got is None:
                slow += 1
                assert not encoding.text.isascii() or (add and len(offsets) > len(encoding._tokens.ids))
                continue
            fast += 1
            assert got == overlap_mask(offsets, spans), (messages, policy, spans)
    assert fast > 10_000 and slow > 1_000  # both kinds were really met


def test_byte_widths_only_for_tokenizers_whose_offsets_follow_bytes(tmp_path: Path) -> None:
    """A ByteLevel post-processor that trims offsets, an added prefix space, a normalizer that is not NFC, or a
    split that removes characters: the offsets are read instead."""
    import json

    from chatcodec.masks import byte_widths
    from chatcodec.tokens import load

    from ..conftest import SHARED

    require_shared()
    spec = json.loads((SHARED / "tokenizers" / "qwen3" / "tokenizer.json").read_text(encoding="utf-8"))
    config = (SHARED / "tokenizers" / "qwen3" / "tokenizer_config.json").read_text(encoding="utf-8")
    assert byte_widths(load(SHARED / "tokenizers" / "qwen3")._vocab) is not None

    def variant(label: str, change: Any) -> Any:
        changed = json.loads(json.dumps(spec))
        change(changed)
        folder = tmp_path / label
        folder.mkdir()
        (folder / "tokenizer.json").write_text(json.dumps(changed), encoding="utf-8")
        (folder / "tokenizer_config.json").write_text(config, encoding="utf-8")
        return load(folder)._vocab

    def trim(s: Any) -> None:
        s["post_processor"]["trim_offsets"] = True

    def prefix(s: Any) -> None:
        s["pre_tokenizer"]["pretokenizers"][-1]["add_prefix_space"] = True

    def lowercase(s: Any) -> None:
        s["normalizer"] = {"type": "Lowercase"}

    def removed(s: Any) -> None:
        s["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"

    for change in (trim, prefix, lowercase, removed):
        assert byte_widths(variant(change.__name__, change)) is None, change.__name__
