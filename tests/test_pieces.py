"""ASCII stretches encoded from their pieces give the tokenizers library's own ids, on both real tokenizers."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

import chatcodec.pieces as pieces_module
from chatcodec import MaskError
from chatcodec.pieces import ascii_split, pieces_for
from chatcodec.tokens import load

from .conftest import SHARED, conversations, require_shared

TOKENIZERS = SHARED / "tokenizers"
ROOT = Path(__file__).resolve().parents[1]
#: what the split regexes treat apart: letters (and the contractions' ones), digits, the six spaces, marks,
#: control characters and DEL
TRICKY = "aZq09 \t\n\r\x0b\x0c'sStTlLdDmMvVrReE.,!?-_#()[]{}<>\"\\/\x00\x1c\x1f\x7f"


def _encode(tokenizer: Any, text: str) -> Any:
    return tokenizer.encode(text, add_special_tokens=False)


def _pieces(name: str) -> Any:
    vocab = load(TOKENIZERS / name)._vocab
    assert vocab is not None
    vocab._encode_pieces([("first use", False)], {})
    assert vocab._pieces is not None and vocab._pieces is not False
    return vocab._pieces


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _texts() -> list[str]:
    """ASCII texts: the corpus conversations' strings and tools as JSON, the README and the docs pages in
    pieces, every ASCII character in several places, and seeded mixtures of what the regexes treat apart."""
    texts = [s for conv in conversations().values() for s in _strings(conv) if s.isascii()]
    texts += [json.dumps(conv["tools"]) for conv in conversations().values() if conv.get("tools")]
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:  # the old README's text is there
        prose = page.read_text(encoding="utf-8")
        texts += [c for c in (prose[at : at + 700] for at in range(0, len(prose), 700)) if c.isascii()]
    chars = [chr(c) for c in range(128)]
    texts += [f"x{c}y {c}{c} z{c}" for c in chars]
    rng = random.Random(7)
    texts += ["".join(rng.choice(TRICKY) for _ in range(rng.randint(1, 60))) for _ in range(3000)]
    texts += ["it's IT'S we'll they'RE i'd", "1234567 12 1", "a  b   c\n\n\n  d\r\n e", "''s 'x '", "   "]
    return texts


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_pieces_give_the_tokenizers_ids(name: str) -> None:
    """Every text, encoded from its pieces (new ones learned as they come, then all known), has the ids the
    tokenizer gives it; the pieces were really used (none refused)."""
    require_shared()
    pieces = _pieces(name)
    tokenizer = pieces.tokenizer
    texts = _texts()
    expected = [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    assert [pieces.encode(text) for text in texts] == expected  # learning
    assert [pieces.encode(text) for text in texts] == expected  # known
    assert len(pieces.ids) > 1_000


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_a_full_table_starts_again(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the table of pieces outgrows its limit it is replaced, and the ids stay right."""
    require_shared()
    pieces = _pieces(name)
    monkeypatch.setattr(pieces_module, "LIMIT", 50)
    texts = _texts()[:400]
    tokenizer = pieces.tokenizer
    assert [pieces.encode(text) for text in texts] == [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    assert len(pieces.ids) < 400


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_encodings_with_and_without_pieces_are_the_same(name: str) -> None:
    """The same conversations through a codec that encodes ASCII stretches from pieces and one that does not:
    the same ids, offsets (read from the tokenizer when asked for) and masks."""
    from .dataset.test_parity import generated_rows

    require_shared()
    with_pieces, without = load(TOKENIZERS / name), load(TOKENIZERS / name)
    assert without._vocab is not None
    without._vocab._pieces = None
    chats = [(c["messages"], c.get("tools")) for c in conversations().values()]
    chats += [(row["messages"], row["tools"]) for row in generated_rows(30)]
    compared = 0
    for messages, tools in chats:
        for policy in ("escape", "allow"):
            try:
                ours = with_pieces.encode(messages, tools=tools, content_special_tokens=policy)
            except Exception as exc:  # the same failure both ways
                with pytest.raises(type(exc)):
                    without.encode(messages, tools=tools, content_special_tokens=policy)
                continue
            theirs = without.encode(messages, tools=tools, content_special_tokens=policy)
            assert ours.input_ids == theirs.input_ids and ours.text == theirs.text
            assert _mask(ours) == _mask(theirs)
            assert ours.offsets == theirs.offsets
            compared += 1
    assert compared > 100
    assert isinstance(with_pieces._vocab._pieces, pieces_module.Pieces) and len(with_pieces._vocab._pieces.ids) > 100


def _mask(encoding: Any) -> Any:
    try:
        return encoding.assistant_mask
    except MaskError as exc:
        return str(exc)


def test_split_patterns_for_ascii() -> None:
    """Unicode letters, digits and spaces are spelled out for ASCII; other classes and escapes are refused."""
    split = ascii_split(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|\s+(?!\S)|\s+")
    assert split is not None
    assert split.findall("It's 12345 ok  \n") == ["It", "'s", " ", "123", "45", " ok", "  \n"]
    for pattern in (r"\w+", r"\p{Lu}+", r"\d", r"[\S]", r"\bx", r"[a-z", r"[[:alpha:]]"):
        assert ascii_split(pattern) is None, pattern


def test_pieces_only_for_a_regex_split_then_byte_level(tmp_path: Path) -> None:
    """A split that removes what it matches, a ByteLevel step with its own regex or an added prefix space, a
    Metaspace tokenizer, or a regex whose ASCII form splits otherwise: no pieces."""
    require_shared()
    spec = json.loads((TOKENIZERS / "qwen3" / "tokenizer.json").read_text(encoding="utf-8"))
    spec["added_tokens"] = []

    def variant(change: Any) -> Any:
        changed = json.loads(json.dumps(spec))
        change(changed["pre_tokenizer"]["pretokenizers"])
        tokenizer = Tokenizer.from_str(json.dumps(changed))
        tokenizer.add_special_tokens(["\U0010fffe"])
        return pieces_for(tokenizer, _encode)

    assert variant(lambda steps: None) is not None  # the tokenizer itself
    assert variant(lambda steps: steps[0].update(behavior="Removed")) is None
    assert variant(lambda steps: steps[1].update(use_regex=True)) is None
    assert variant(lambda steps: steps[1].update(add_prefix_space=True)) is None
    assert variant(lambda steps: steps[0]["pattern"].update(Regex=r"\w+|\s+")) is None
    assert variant(lambda steps: steps[0]["pattern"].update(Regex=r"[\p{L}\p{N}]+|[^\p{L}\p{N}]+")) is not None
    # $ ends a line in the tokenizers' regex engine, the string in Python's: the probes split otherwise
    assert variant(lambda steps: steps[0]["pattern"].update(Regex=r"\p{L}+$|\p{L}|\s|[^\p{L}\s]")) is None
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    assert variant(lambda steps: steps.__setitem__(0, metaspace)) is None
