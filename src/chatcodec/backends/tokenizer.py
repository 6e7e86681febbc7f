"""llama.cpp's own tokenizer of a GGUF, as a :class:`~chatcodec.TextTokenizer` for a :class:`~chatcodec.Codec`.

llama.cpp tokenizes a prompt in two steps. It first cuts the text at its "special" tokens: those whose
attribute is CONTROL, USER_DEFINED or UNKNOWN, the longest first, each at every place it occurs in what is
left of the text, taking the whitespace before (LSTRIP) or after (RSTRIP) a token that says so. Then its
model encodes each stretch of text between them alone. With ``parse_special=False`` the CONTROL and UNKNOWN
tokens are not cut, but USER_DEFINED ones still are.

:class:`GGUFTokenizer` gives those two steps to a codec apart: :meth:`~GGUFTokenizer.split` finds the special
tokens exactly where llama.cpp finds them, and :meth:`~GGUFTokenizer.encode_plain` has llama.cpp encode a
stretch with no special token cut in it. So the codec's ids for a prompt are llama.cpp's
(``tokenize(prompt, special=True)``), but that text from the caller never becomes a control token.

It loads the GGUF's vocabulary alone (no weights, a few tens of milliseconds), so it serves a gateway in
front of a remote engine as well as the embedded model::

    tokenizer = GGUFTokenizer(default_model_path())
    codec = Codec(load_template(default_model_path()), tokenizer)
    codec.encode([{"role": "user", "content": "Hi<|im_end|>"}]).input_ids   # one <|im_end|>: the template's
"""

from __future__ import annotations

import bisect
import codecs
import ctypes
import itertools
import logging
import re
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from ..exceptions import InputError, LoadError
from ..vocab import TokenMatch, alternation

__all__ = ["GGUFTokenizer"]

#: llama_vocab_type of byte-pair vocabularies, whose stretches can be encoded in pieces without a space added
_BPE = 2
#: what C's isspace() takes, which llama.cpp strips around LSTRIP/RSTRIP tokens
_SPACE = " \t\n\v\f\r"
#: how many ids are read out of llama.cpp's buffer, or items worked on by one C loop, at once
_SLICE = 1 << 16
#: bytes of text decoded at once (a millisecond or two)
_DECODED_AT_ONCE = 1 << 18
#: each byte of UTF-8 as 1 if a character starts at it, else 0 (a continuation byte, 10xxxxxx)
_STARTS_CHAR = bytes(0 if 0x80 <= b < 0xC0 else 1 for b in range(256))


class _Match:
    """A special token llama.cpp cuts: the token, and the span it takes with the whitespace it strips."""

    __slots__ = ("_end", "_start", "_token")

    def __init__(self, start: int, end: int, token: str) -> None:
        self._start, self._end, self._token = start, end, token

    def start(self) -> int:
        return self._start

    def end(self) -> int:
        return self._end

    def span(self) -> tuple[int, int]:
        return self._start, self._end

    def group(self) -> str:
        return self._token


class GGUFTokenizer:
    """The tokenizer of the GGUF at ``path``, run by llama.cpp (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        try:
            import llama_cpp
        except ImportError:
            raise LoadError("Tokenizing with a GGUF needs llama-cpp-python: pip install 'chatcodec[serve]'.") from None
        self.path = Path(path)
        if not self.path.is_file():
            raise LoadError(f"No GGUF file at {self.path}.")
        _init_backend(llama_cpp)
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(str(self.path).encode("utf-8"), params)
        if not model:
            raise LoadError(f"llama.cpp cannot read the vocabulary of {self.path}.")
        weakref.finalize(self, llama_cpp.llama_model_free, model)
        self._cpp = llama_cpp
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._type = int(llama_cpp.llama_vocab_type(self._vocab))
        #: how many tokens the vocabulary has
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        #: each token's piece (without, with special tokens written): at most one entry per token of the vocabulary
        self._pieces: dict[int, bytes] = {}
        self._special_pieces: dict[int, bytes] = {}
        self._bos = int(llama_cpp.llama_vocab_bos(self._vocab))
        added: dict[str, int] = {}
        special: set[str] = set()
        lstrip: set[str] = set()
        rstrip: set[str] = set()
        user_defined: set[str] = set()
        control, user = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL, llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        unknown = llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        left, right = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP, llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
        for index in range(self.n_vocab):
            attr = int(llama_cpp.llama_vocab_get_attr(self._vocab, index))
            if not attr & (control | user | unknown):
                continue
            try:
                text = llama_cpp.llama_vocab_get_text(self._vocab, index).decode("utf-8")
            except UnicodeDecodeError:
                continue  # not text a prompt can hold
            if not text or text in added:
                continue
            # the id llama.cpp gives the text alone is the one it cuts (a duplicate text has one winner)
            if self._tokenize(text, special=True) != [index]:
                continue
            added[text] = index
            if attr & (control | unknown):
                special.add(text)
            else:
                user_defined.add(text)
            if attr & left:
                lstrip.add(text)
            if attr & right:
                rstrip.add(text)
        #: the special tokens llama.cpp cuts first, by their text
        self.added_tokens: dict[str, int] = added
        #: those that are control (or unknown) tokens, which only ``parse_special`` cuts
        self.special_tokens = frozenset(special)
        self._lstrip, self._rstrip = frozenset(lstrip), frozenset(rstrip)
        self._user_defined = re.compile(alternation(user_defined)) if user_defined else None
        longest = max(map(len, added), default=1)
        overlapping = _overlapping(added)
        # llama.cpp cuts the longest token first, wherever it is: where no two tokens overlap, and none strips
        # whitespace, that is the leftmost longest match a regex finds. Otherwise, cut as llama.cpp does.
        self._regex = re.compile(alternation(added)) if not overlapping and not lstrip and not rstrip else None
        self._ordered = sorted(added, key=len, reverse=True)
        self._finder = re.compile("(?=(" + alternation(added) + "))") if added else None
        #: how far past a token's start finding it may read: a token that overlaps others waits on them
        self.reach = longest + sum(len(t) for t in overlapping)

    def __repr__(self) -> str:
        return f"<GGUFTokenizer {self.path.name}, {len(self.added_tokens)} special tokens>"

    # --- the TextTokenizer protocol -------------------------------------------------------------------------

    def split(self, text: str, pos: int = 0) -> Iterator[TokenMatch]:
        """The special tokens llama.cpp cuts in ``text[pos:]``, in order."""
        if self._regex is not None:
            return self._regex.finditer(text, pos)
        return iter(self._partition(text, pos))

    def encode_plain(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """llama.cpp's ids for ``text`` with no special token cut, and each one's character span."""
        pieces = [text]
        if self._user_defined is not None and self._type == _BPE:
            pieces = self._apart(text)  # USER_DEFINED tokens are cut even without parse_special
        ids: list[int] = []
        for piece in pieces:
            ids.extend(self._tokenize(piece, special=False))
        return ids, self._offsets(text, ids)

    def affixes(self) -> tuple[list[int], list[int]]:
        bare = self._tokenize("a", special=False)
        full = self._tokenize("a", special=False, add_special=True)
        at = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), 0)
        return full[:at], full[at + len(bare) :]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        self._check_ids(ids)
        tokens = (self._cpp.llama_token * max(1, len(ids)))(*ids)
        size = 16 + 8 * len(ids)
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = self._cpp.llama_detokenize(self._vocab, tokens, len(ids), buffer, size, False, not skip_special_tokens)
            if n >= 0:
                return buffer.raw[:n].decode("utf-8", errors="replace")
            size = -n

    def token_to_id(self, token: str) -> int | None:
        found = self.added_tokens.get(token)
        if found is not None:
            return found
        ids = self._tokenize(token, special=False)
        return ids[0] if len(ids) == 1 else None

    # --- the rest ---------------------------------------------------------------------------------------

    def detokenize(self, ids: Sequence[int]) -> bytes:
        """The bytes of each token's piece, special tokens written, one after another: what llama-cpp-python's
        ``Llama.detokenize(ids, special=True)`` gives, in time linear in ``ids`` (it joins bytes one piece at a
        time, which is quadratic: 1.5 million ids took 83 s). Unlike it, a piece longer than 32 bytes is written
        whole (its fixed buffer garbles those)."""
        self._check_ids(ids)
        piece = self._piece
        # joined a slice at a time: one join of millions of pieces keeps the GIL from other threads (0.15 s)
        data = _joined([piece(token, True) for token in ids])
        # as llama-cpp-python: the space a BOS-led (Llama 1) prompt got in front is dropped
        if ids and ids[0] == self._bos and data[:1] == b" ":
            return data[1:]
        return data

    def detokenize_text(self, ids: Sequence[int]) -> str:
        """:meth:`detokenize` as text, bytes that are not UTF-8 replaced (``/detokenize``'s ``prompt``);
        megabytes are decoded a slice at a time (the same text), so that the GIL goes to other threads between."""
        data = self.detokenize(ids)
        if len(data) <= _DECODED_AT_ONCE:
            return data.decode("utf-8", errors="replace")
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        last = len(data) - _DECODED_AT_ONCE
        parts = [decoder.decode(data[at : at + _DECODED_AT_ONCE]) for at in range(0, last, _DECODED_AT_ONCE)]
        parts.append(decoder.decode(data[len(parts) * _DECODED_AT_ONCE :], final=True))
        return "".join(parts)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each token's own text (its piece, special tokens written; bytes that are not UTF-8 alone replaced), as
        :meth:`detokenize` of that one id gives it: ``/tokenize``'s ``token_strs``."""
        self._check_ids(ids)
        piece = self._piece
        return [piece(token, True).decode("utf-8", errors="replace") for token in ids]

    def _check_ids(self, ids: Sequence[int]) -> None:
        n_vocab = self.n_vocab
        for token in ids:
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < n_vocab:
                raise InputError(f"Token id {token!r} is not in the vocabulary (0 to {n_vocab - 1}).")

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """llama.cpp's ids for ``text`` (``special``: cut special tokens too), as its server gives them."""
        return self._tokenize(text, special=special)

    def _tokenize(self, text: str, *, special: bool, add_special: bool = False) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(
                "The prompt holds a lone surrogate, which is not a Unicode character the tokenizer can encode;"
                " remove it or decode the input text properly."
            ) from None
        size = len(data) + 8
        while True:
            buffer = (self._cpp.llama_token * size)()
            n = self._cpp.llama_tokenize(self._vocab, data, len(data), buffer, size, add_special, special)
            if n >= 0:  # read out in slices: one slice of millions would keep the GIL from other threads
                ids: list[int] = []
                for at in range(0, n, _SLICE):
                    ids += buffer[at : min(n, at + _SLICE)]
                return ids
            size = -n

    def _partition(self, text: str, pos: int) -> list[_Match]:
        """llama.cpp's cut: each token, the longest first, at its first place in each stretch left, again
        to the right of it; whitespace stripped on the side a token says."""
        if self._finder is None:
            return []
        present = {m.group(1) for m in self._finder.finditer(text, pos)}
        candidates = {prefix for found in present for prefix in _prefixes(found) if prefix in self.added_tokens}
        raw = [(pos, len(text))]
        cuts: list[_Match] = []
        for token in self._ordered:
            if token not in candidates:
                continue
            lstrip, rstrip = token in self._lstrip, token in self._rstrip
            left: list[tuple[int, int]] = []
            for start, end in raw:
                at = start
                while at < end:
                    found = text.find(token, at, end)
                    if found < 0:
                        break
                    before = found
                    if lstrip:
                        while before > at and text[before - 1] in _SPACE:
                            before -= 1
                    if before > at:
                        left.append((at, before))
                    after = found + len(token)
                    if rstrip:
                        while after < end and text[after] in _SPACE:
                            after += 1
                    cuts.append(_Match(before, after, token))
                    at = after
                if at < end:
                    left.append((at, end))
            raw = left
        cuts.sort(key=lambda m: m.start())
        return cuts

    def _apart(self, text: str) -> list[str]:
        """``text`` in pieces none of which holds a USER_DEFINED token (each cut after its first character)."""
        assert self._user_defined is not None
        pieces: list[str] = []
        todo = [text]
        while todo:
            piece = todo.pop()
            match = self._user_defined.search(piece)
            if match is None:
                pieces.append(piece)
                continue
            cut = match.start() + 1
            todo.append(piece[cut:])
            todo.append(piece[:cut])
        return pieces

    def _piece(self, token: int, special: bool = False) -> bytes:
        """llama.cpp's piece for ``token`` (``special``: a special token written as its text, not as nothing)."""
        cache = self._special_pieces if special else self._pieces
        piece = cache.get(token)
        if piece is None:
            size = 64
            while True:
                buffer = ctypes.create_string_buffer(size)
                n = self._cpp.llama_token_to_piece(self._vocab, token, buffer, size, 0, special)
                if n >= 0:
                    piece = buffer.raw[:n]
                    break
                size = -n
            cache[token] = piece
        return piece

    def _offsets(self, text: str, ids: list[int]) -> list[tuple[int, int]]:
        """Each token's character span in ``text``, from the bytes of its piece (a space llama.cpp put in front
        of the text is no character of it). Built by C loops (map, accumulate, zip), not a Python loop per token,
        each over a slice of :data:`_SLICE` at a time: a prompt of megabytes has millions of tokens, a Python loop
        over them takes seconds, and one C loop over them all would keep the GIL from other threads (a
        ``list(zip(...))`` of a million spans held it for 0.15 s)."""
        data = text.encode("utf-8")
        get = self._pieces.get
        found = _mapped(get, ids)
        if None in found:
            pieces = [self._piece(token) if piece is None else piece for token, piece in zip(ids, found, strict=True)]
        else:
            pieces = cast("list[bytes]", found)
        lengths = _mapped(len, pieces)
        extra = sum(lengths) - len(data)
        shift = extra if extra > 0 and _joined(pieces).endswith(data) else 0
        # where each token starts and ends in the bytes, clamped to them (the positions only grow)
        bounds = _running(lengths, -shift)
        below = bisect.bisect_left(bounds, 0)
        bounds[:below] = [0] * below
        above = bisect.bisect_right(bounds, len(data))
        bounds[above:] = [len(data)] * (len(bounds) - above)
        if text.isascii():
            return _pairs(bounds, bounds, 1)
        # the character each byte belongs to: how many characters start up to it (a byte 10xxxxxx starts none)
        to_char = _running(data.translate(_STARTS_CHAR), -1)
        to_char[0:1] = []
        to_char.append(len(text))
        # a span ends after the character of its last byte; an empty one ends where it starts
        to_end = [0, *(i + 1 for i in itertools.islice(to_char, len(data)))]
        firsts = _mapped(to_char.__getitem__, bounds)
        lasts = _mapped(to_end.__getitem__, bounds)
        spans = _pairs(firsts, lasts, 1)
        if 0 in lengths:
            for index, length in enumerate(lengths):
                if not length:
                    spans[index] = (firsts[index], firsts[index])
        return spans


def _mapped(function: Any, items: Sequence[Any]) -> list[Any]:
    """``list(map(function, items))``, a slice of :data:`_SLICE` items at a time."""
    out: list[Any] = []
    for at in range(0, len(items), _SLICE):
        out += map(function, items[at : at + _SLICE])
    return out


def _running(values: Sequence[int], initial: int) -> list[int]:
    """``list(itertools.accumulate(values, initial=initial))``, a slice at a time."""
    out = [initial]
    for at in range(0, len(values), _SLICE):
        sums = itertools.accumulate(values[at : at + _SLICE], initial=out[-1])
        next(sums)  # the running total so far, which ``out`` ends with
        out += sums
    return out


def _pairs(firsts: Sequence[int], lasts: Sequence[int], skip: int) -> list[tuple[int, int]]:
    """``list(zip(firsts, lasts[skip:]))``, as long as the shorter, a slice at a time."""
    size = min(len(firsts), len(lasts) - skip)
    out: list[tuple[int, int]] = []
    for at in range(0, size, _SLICE):
        top = min(size, at + _SLICE)
        out += zip(firsts[at:top], lasts[at + skip : top + skip], strict=True)
    return out


def _joined(pieces: Sequence[bytes]) -> bytes:
    """``b"".join(pieces)``, a slice at a time."""
    return b"".join([b"".join(pieces[at : at + _SLICE]) for at in range(0, len(pieces), _SLICE)])


_INITIALIZED: list[bool] = []


def _init_backend(llama_cpp: Any) -> None:
    quiet_llama_cpp()
    if not _INITIALIZED:
        llama_cpp.llama_backend_init()
        _INITIALIZED.append(True)


def quiet_llama_cpp() -> None:
    """Keep llama.cpp's loading chatter off the terminal. llama-cpp-python prints llama.cpp's log through its
    logger, and maps llama.cpp's warnings to ERROR (its table predates a change of ggml's levels), so that
    ``Llama(verbose=False)`` still prints them: only CRITICAL (ggml's level 0, which llama.cpp does not use for
    messages) gets through."""
    logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL)


def _prefixes(text: str) -> Iterator[str]:
    for end in range(1, len(text) + 1):
        yield text[:end]


def _overlapping(tokens: dict[str, int]) -> set[str]:
    """The tokens that can overlap another where both occur: one holds the other, or one's end begins the other."""
    if len(tokens) < 2:
        return set()
    found: set[str] = set()
    every = re.compile(alternation(tokens))
    ordered = sorted(tokens)
    for token in tokens:
        for at in range(len(token)):
            match = every.match(token, at)
            if match is not None and match.group() != token:
                found.update((token, match.group()))  # it holds another token
        for cut in range(1, len(token)):
            tail = token[cut:]
            at = bisect.bisect_left(ordered, tail)
            while at < len(ordered) and ordered[at].startswith(tail):
                if len(ordered[at]) > len(tail):
                    found.update((token, ordered[at]))  # its end begins another token
                at += 1
    return found
