"""Stretches of ASCII text encoded from a cache of their pieces, for byte-level BPE tokenizers.

A byte-level BPE tokenizer (Qwen2/3, Llama 3) splits text with its pre-tokenizer's regex and encodes each piece
on its own: a piece's ids do not depend on the text around it. So the ids of a stretch of ASCII text are its
pieces' ids one after the other. The pieces are found here with the tokenizer's regex written for ASCII (one
C pass), and each piece not seen before is encoded once, by the tokenizer's own BPE model: what the tokenizer
does with the piece once its pre-tokenizer has split it out and its ByteLevel step has written each byte as a
character (that writing is read from the pre-tokenizer, character by character, and the model's ids of the
probes' pieces are checked against the tokenizer's when a :class:`Pieces` is made).

The regex for ASCII is the tokenizer's with its Unicode classes spelled out for ASCII (``\\p{L}`` the letters,
``\\p{N}`` the digits, ``\\s`` the six ASCII spaces). It is used only when it splits a set of probe texts (every
ASCII character alone, between letters and after a space, and seeded mixtures of the characters the regex
treats apart) exactly where the tokenizer's own pre-tokenizer does; and a piece is kept only when it splits
again into itself, so that encoding it alone is encoding it as the tokenizer did in the stretch.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Callable
from itertools import chain
from typing import Any

__all__ = ["Pieces", "pieces_for"]

#: the ASCII characters ``\s`` matches in the tokenizers library's regex engine (Unicode White_Space)
_SPACES = "\\t\\n\\x0b\\x0c\\r "
#: Unicode classes and escapes of the tokenizers' split regexes, for ASCII text: inside a class, and alone
_IN_CLASS = {"\\p{L}": "A-Za-z", "\\p{N}": "0-9", "\\s": _SPACES}
_ALONE = {"\\p{L}": "[A-Za-z]", "\\p{N}": "[0-9]", "\\s": f"[{_SPACES}]", "\\S": f"[^{_SPACES}]"}
_ESCAPE = re.compile(r"\\p\{[LN]\}|\\[sS]|\\[rn]|\\.|\[|\]")
#: pieces kept (their ids); the cache is emptied when it holds more
LIMIT = 100_000


class Pieces:
    """The pieces of ASCII stretches and their ids, for one tokenizer (the ASCII joiner of a Vocabulary).

    ``table`` maps each ASCII character to the one its ByteLevel step writes for it (as ``str.translate``
    takes it): a piece, so translated, is what the tokenizer hands its BPE model for that piece.
    """

    def __init__(self, tokenizer: Any, split: re.Pattern[str], table: dict[int, str]) -> None:
        self.tokenizer = tokenizer
        self.split = split
        self.findall = split.findall
        self.table = table
        self._tokenize = tokenizer.model.tokenize
        self.ids: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int] | None:
        """The ids of an ASCII ``text``, or None when one of its pieces would not split into itself alone."""
        pieces = self.findall(text)
        if sum(map(len, pieces)) != len(text):  # a character no alternative matches (none in these regexes)
            return None
        known = self.ids
        if len(known) > LIMIT:
            known = self.ids = {}  # a new table: a call in another thread goes on with the one it holds
        try:
            return list(chain.from_iterable(map(known.__getitem__, pieces)))  # every piece known: one C pass
        except KeyError:
            pass
        if not self._learn([piece for piece in dict.fromkeys(pieces) if piece not in known], known):
            return None
        return list(chain.from_iterable(map(known.__getitem__, pieces)))

    def _learn(self, pieces: list[str], known: dict[str, list[int]]) -> bool:
        """Encode new pieces, each by the tokenizer's BPE model alone (what the tokenizer does with a piece once
        its pre-tokenizer has split it out and written its bytes); False if one does not split into itself."""
        match = self.split.match
        tokenize, table = self._tokenize, self.table
        for piece in pieces:
            found = match(piece)
            if found is None or found.end() != len(piece):
                return False
            known[piece] = [token.id for token in tokenize(piece.translate(table))]
        return True


def ascii_split(pattern: str) -> re.Pattern[str] | None:
    """The tokenizers split ``pattern`` for ASCII text, or None if it uses what this does not translate."""
    if "[:" in pattern:
        return None  # a POSIX class, which Python's regex reads as characters
    out: list[str] = []
    depth = 0
    at = 0
    for found in _ESCAPE.finditer(pattern):
        out.append(pattern[at : found.start()])
        token = found.group()
        at = found.end()
        if token == "[":
            depth += 1
            out.append(token)
        elif token == "]":
            depth -= 1
            out.append(token)
        elif token in ("\\r", "\\n"):
            out.append(token)
        elif token in _IN_CLASS or token in _ALONE:
            table = _IN_CLASS if depth else _ALONE
            if token not in table:
                return None  # \S in a class
            out.append(table[token])
        elif token[1] in "pPdDwWbBhHxuU0123456789kgAZzG":
            return None  # another class or escape: not spelled out here
        else:
            out.append(token)  # an escaped character
    out.append(pattern[at:])
    if depth:
        return None
    try:
        return re.compile("".join(out), re.ASCII)
    except re.error:
        return None


@functools.cache
def _probes() -> tuple[str, ...]:
    chars = [chr(c) for c in range(128)]
    probes = [*chars, *(f"a{c}b" for c in chars), *(f" {c}x" for c in chars), *(c * 3 for c in chars)]
    tricky = "aZq09 \t\n\r\x0b\x0c'sStTlLdDmMvVrReE.,!?-_#()[]{}<>\"\\/\x00\x1c\x1f\x7f"
    rng = random.Random(14)
    probes += ["".join(rng.choices(tricky, k=rng.randint(1, 16))) for _ in range(3000)]
    probes += ["it's", "IT'S", "we'll", "they'RE", "  \n\n  x", "1234567", "a  b", "\r\n", " ?!\n", "''s", "x'", "'"]
    return tuple(probes)


#: what each pre-tokenizer (its state, as JSON) was found to be, once per process: its split regex for ASCII
#: and its ByteLevel table, or None (splitting the probes takes some 25 ms)
_FOUND: dict[Any, tuple[re.Pattern[str], dict[int, str]] | None] = {}
_UNKNOWN: Any = object()


def pieces_for(tokenizer: Any, encode: Callable[..., Any]) -> Pieces | None:
    """A :class:`Pieces` for ``tokenizer`` (without normalizer or added tokens; ``encode`` calls it), or None
    when its text is not split by one regex and then encoded by byte-level BPE piece by piece, the regex for
    ASCII does not split the probes as the tokenizer does, or the model's ids of a probe's piece alone are
    not the tokenizer's."""
    model = tokenizer.model
    pre = tokenizer.pre_tokenizer
    if type(model).__name__ != "BPE" or model.dropout or pre is None:
        return None
    state = pre.__getstate__()
    found = _FOUND.get(state, _UNKNOWN)
    if found is _UNKNOWN:
        if len(_FOUND) >= 64:
            _FOUND.clear()
        found = _FOUND[state] = _split_and_table(pre, json.loads(state))
    if found is None:
        return None
    compiled, table = found
    pieces = Pieces(tokenizer, compiled, table)
    checked: dict[str, list[int]] = {}
    for probe in _probes()[:_CHECKED_PROBES]:
        for piece in compiled.findall(probe):
            if piece in checked or not pieces._learn([piece], checked):
                continue
            if checked[piece] != encode(tokenizer, piece).ids:
                return None
    return pieces


def _split_and_table(pre: Any, spec: dict[str, Any]) -> tuple[re.Pattern[str], dict[int, str]] | None:
    """The regex for ASCII of a pre-tokenizer that splits with one regex and then writes bytes as characters
    (ByteLevel), and what it writes for each ASCII character; None for any other, or when the regex for ASCII
    does not split every probe as the pre-tokenizer does."""
    steps = (spec.get("pretokenizers") or []) if spec.get("type") == "Sequence" else [spec]
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space") or byte_level.get("use_regex"):
        return None
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    pattern = (split.get("pattern") or {}).get("Regex")
    compiled = ascii_split(pattern) if isinstance(pattern, str) else None
    if compiled is None:
        return None
    for probe in _probes():
        theirs = [span for _, span in pre.pre_tokenize_str(probe)]
        ours = [m.span() for m in compiled.finditer(probe)]
        if ours != theirs:
            return None
    table = {}  # each ASCII character as the ByteLevel step writes it (a character alone is a piece alone)
    for code in range(128):
        written = pre.pre_tokenize_str(chr(code))
        if len(written) != 1 or len(written[0][0]) != 1:
            return None
        table[code] = written[0][0]
    return compiled, table


#: the probes whose pieces are encoded both ways when a Pieces is made: every ASCII character alone, between
#: letters, after a space, three times (about 600 pieces, a few milliseconds)
_CHECKED_PROBES = 4 * 128
