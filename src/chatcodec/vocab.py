"""The tokenizer split in two: control tokens matched in the prompt, the model alone for the text between.

The tokenizers library splits its input at added tokens before anything else, then normalizes,
pre-tokenizes and encodes each stretch of text between them on its own. :class:`Vocabulary` does the
same split with a regex, so it can encode stretches that came from content without matching any added
token in them (the escapes of :mod:`chatcodec.tokens`), and remember the tokens of every stretch it saw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .exceptions import SpecialTokenError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["CACHE_SIZE", "Run", "Vocabulary", "alternation"]

#: what separates a stretch of text from "the start of the input" for tokenizers that treat the start specially
_SEPARATOR = "\U0010fffe"
#: how many stretches of text a vocabulary remembers the tokens of
CACHE_SIZE = 16384


class Run:
    """Consecutive tokens of the prompt: one control token, or one stretch of text encoded by the model.

    ``width`` is the text length of a control token, or -1 for tokens the prompt's text does not hold
    (added by ``add_special_tokens``); a stretch of text has its tokenizers ``Encoding``, read only when
    offsets are asked for, with ``skip`` separator tokens in front.
    """

    __slots__ = ("encoding", "ids", "skip", "start", "width")

    def __init__(self, start: int, ids: list[int], *, encoding: Any = None, skip: int = 0, width: int = 0) -> None:
        self.start = start
        self.ids = ids
        self.encoding = encoding
        self.skip = skip
        self.width = width

    def offsets(self) -> list[tuple[int, int]]:
        if self.encoding is None:
            if self.width < 0:
                return [(0, 0)] * len(self.ids)
            return [(self.start, self.start + self.width)]
        shift = self.start - (len(_SEPARATOR) if self.skip else 0)
        return [(s + shift, e + shift) for s, e in self.encoding.offsets[self.skip :]]


class Vocabulary:
    """The tokenizer, split in two: control tokens matched in the prompt, and the model for plain text.

    When every added token matches plainly (no ``lstrip``/``rstrip``/``single_word``, no normalization),
    the prompt is split at added tokens with a regex, exactly where the tokenizers library splits it, and
    each stretch of text between them is encoded by a copy of the tokenizer that has no added tokens.
    Stretches are cached. Other tokenizers encode the whole prompt at once (:meth:`_tokenize_whole`).
    """

    def __init__(self, tokenizer: Tokenizer, split_special_tokens: bool) -> None:
        from tokenizers import AddedToken, Tokenizer

        self.full = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        self.added: dict[str, int] = {token.content: index for index, token in added.items()}
        self.special: frozenset[str] = frozenset(token.content for token in added.values() if token.special)
        matched = [t for t in self.added if not (split_special_tokens and t in self.special)]
        plain_flags = all(
            not (t.lstrip or t.rstrip or t.single_word or (t.normalized and tokenizer.normalizer is not None))
            for t in added.values()
        )
        self.splitter = re.compile(alternation(matched)) if plain_flags else None
        spec = json.loads(tokenizer.to_str())
        spec["added_tokens"] = []
        self.plain = Tokenizer.from_str(json.dumps(spec))
        self.plain.add_special_tokens([AddedToken(_SEPARATOR, special=True, normalized=False)])
        self.separator_id = self.plain.token_to_id(_SEPARATOR)
        # a tokenizer that treats the start of the input specially (Metaspace prepend_scheme="first")
        # encodes each later stretch behind a separator, so the stretch is not at the start
        self.start_sensitive = _has_first_only_prefix(spec.get("pre_tokenizer"))
        self.split_special_tokens = split_special_tokens
        self._cache: dict[tuple[str, bool], tuple[list[int], Any, int]] = {}
        self._affixes: tuple[list[int], list[int]] | None = None

    def control_for(self, sources: str) -> set[str]:
        """Special tokens, and the added tokens the template text holds (not whitespace)."""
        return set(self.special) | {t for t in self.added if t in sources and not t.isspace()}

    def tokenize(self, rendered: str, escapes: dict[str, str]) -> tuple[list[Run], str, list[tuple[int, int]]]:
        """The runs of the prompt, its text with escapes restored, and the escaped character spans."""
        if self.splitter is None:
            return self._tokenize_whole(rendered, escapes)
        restore = re.compile("|".join(map(re.escape, escapes))) if escapes else None
        pieces: list[tuple[str, bool, int]] = []  # (text, is_control_token, start in the restored text)
        escaped: list[tuple[int, int]] = []
        position = at = 0
        for match in self.splitter.finditer(rendered):
            if match.start() > at:
                position = self._text_piece(rendered[at : match.start()], position, restore, escapes, pieces, escaped)
            pieces.append((match.group(), True, position))
            position += len(match.group())
            at = match.end()
        if at < len(rendered):
            self._text_piece(rendered[at:], position, restore, escapes, pieces, escaped)

        cache = self._cache
        keys = [(text, self.start_sensitive and start == 0) for text, control, start in pieces if not control]
        missing = list(dict.fromkeys(k for k in keys if k not in cache))
        if missing:
            self._encode_missing(missing)
        runs = []
        for text, control, start in pieces:
            if control:
                runs.append(Run(start, [self.added[text]], width=len(text)))
            else:
                ids, encoding, skip = cache[(text, self.start_sensitive and start == 0)]
                runs.append(Run(start, ids, encoding=encoding, skip=skip))
        return runs, "".join(text for text, _, _ in pieces), escaped

    def _text_piece(
        self,
        text: str,
        position: int,
        restore: re.Pattern[str] | None,
        escapes: dict[str, str],
        pieces: list[tuple[str, bool, int]],
        escaped: list[tuple[int, int]],
    ) -> int:
        if restore is not None and restore.search(text):
            parts = []
            cursor = 0
            for match in restore.finditer(text):
                parts.append(text[cursor : match.start()])
                start = position + sum(map(len, parts))
                original = escapes[match.group()]
                parts.append(original)
                escaped.append((start, start + len(original)))
                cursor = match.end()
            parts.append(text[cursor:])
            text = "".join(parts)
        pieces.append((text, False, position))
        return position + len(text)

    def _encode_missing(self, keys: list[tuple[str, bool]]) -> None:
        inputs = [text if first or not self.start_sensitive else _SEPARATOR + text for text, first in keys]
        if len(inputs) == 1:
            encodings = [self.plain.encode(inputs[0], add_special_tokens=False)]
        else:  # the tokenizers library spreads a batch over threads
            encodings = self.plain.encode_batch(inputs, add_special_tokens=False)
        if len(self._cache) + len(keys) > CACHE_SIZE:
            self._cache.clear()  # a rough bound: chats repeat their recent stretches, not old ones
        for key, encoding, text in zip(keys, encodings, inputs, strict=True):
            skip = 1 if text.startswith(_SEPARATOR) else 0
            self._cache[key] = (encoding.ids[skip:], encoding, skip)

    def _tokenize_whole(self, rendered: str, escapes: dict[str, str]) -> tuple[list[Run], str, list[tuple[int, int]]]:
        """For tokenizers whose added tokens strip whitespace or are normalized: one encode of the prompt.

        Escaped control tokens are then found among the tokens, and the stretch between the real control
        tokens around each is encoded again as plain text.
        """
        escaped: list[tuple[int, int]] = []
        text = rendered
        if escapes:
            restore = re.compile("|".join(map(re.escape, escapes)))
            parts, cursor, length = [], 0, 0
            for match in restore.finditer(rendered):
                parts.append(rendered[cursor : match.start()])
                length += match.start() - cursor
                parts.append(escapes[match.group()])
                escaped.append((length, length + len(parts[-1])))
                length += len(parts[-1])
                cursor = match.end()
            parts.append(rendered[cursor:])
            text = "".join(parts)
        whole = self.full.encode(text, add_special_tokens=False)
        if not escaped:
            return [Run(0, whole.ids, encoding=whole)], text, escaped
        ids, offsets = whole.ids, whole.offsets
        added_ids = set(self.added.values())
        runs: list[Run] = []
        cursor = 0
        for token, (start, end) in zip(ids, offsets, strict=True):
            if token not in added_ids or any(a < end and start < b for a, b in escaped):
                continue  # text, or an escaped token: both are encoded again below as plain text
            if start > cursor:
                runs.append(self._plain_run(text[cursor:start], cursor))
            runs.append(Run(start, [token], width=end - start))
            cursor = end
        if cursor < len(text):
            runs.append(self._plain_run(text[cursor:], cursor))
        return runs, text, escaped

    def _plain_run(self, text: str, start: int) -> Run:
        lead = _SEPARATOR if start and self.start_sensitive else ""
        encoding = self.plain.encode(lead + text, add_special_tokens=False)
        skip = 1 if lead else 0
        return Run(start, encoding.ids[skip:], encoding=encoding, skip=skip)

    def check_escapes(self, runs: list[Run], escaped: list[tuple[int, int]], control: frozenset[str]) -> None:
        """Escaped text must not come out as a control token even from the model's own merges."""
        control_ids = {self.added[t] for t in control if t in self.added}
        for run in runs:
            if run.encoding is None or not control_ids.intersection(run.ids):
                continue
            for token, (s, e) in zip(run.ids, run.offsets(), strict=True):
                if token in control_ids and any(a < e and s < b for a, b in escaped):
                    raise SpecialTokenError(
                        f"Cannot escape {self.full.id_to_token(token)!r}: the tokenizer produces it from plain text."
                    )

    def add_missing_special_tokens(self, runs: list[Run]) -> list[Run]:
        """Prepend and append what the post-processor adds (BOS, EOS), unless the prompt has it already."""
        if self._affixes is None:
            bare = self.full.encode("a", add_special_tokens=False).ids
            full = self.full.encode("a", add_special_tokens=True).ids
            at = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), 0)
            self._affixes = (full[:at], full[at + len(bare) :])
        prefix, suffix = self._affixes
        ids = [i for run in runs for i in run.ids]
        if prefix and ids[: len(prefix)] != prefix:
            runs = [Run(0, list(prefix), width=-1), *runs]
        if suffix and ids[-len(suffix) :] != suffix:
            runs = [*runs, Run(0, list(suffix), width=-1)]
        return runs


def alternation(words: Iterable[str]) -> str:
    """A regex matching any of ``words``, the longest at the leftmost place, as the tokenizers library does.

    The words are laid out as a trie (``<\\|(?:eot_id|start_header_id)\\|>``), which Python's regex engine
    scans far faster than a flat alternation of hundreds of tokens sharing a prefix.
    """
    trie: dict[str, Any] = {}
    for word in set(words):
        if word:
            node = trie
            for char in word:
                node = node.setdefault(char, {})
            node[""] = {}
    return _trie_pattern(trie) if trie else "(?!)"


def _trie_pattern(node: dict[str, Any]) -> str:
    branches = [re.escape(char) + _trie_pattern(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    if "" in node:  # a word ends here: try the longer ones first, then stop
        return f"(?:{body})?"
    return body


def _has_first_only_prefix(pre_tokenizer: Any) -> bool:
    """Whether a pre-tokenizer prepends its space marker to the start of the input only."""
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "Metaspace":
        return pre_tokenizer.get("prepend_scheme") == "first"
    return any(_has_first_only_prefix(p) for p in pre_tokenizer.get("pretokenizers") or [])
