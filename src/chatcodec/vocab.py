"""The tokenizer split in two: control tokens matched in the prompt, the model alone for the text between.

The tokenizers library splits its input at added tokens before anything else, then normalizes,
pre-tokenizes and encodes each stretch of text between them on its own. :class:`Vocabulary` does the
same split with a regex, so it can encode stretches that came from content without matching any added
token in them (the escapes of :mod:`chatcodec.tokens`), and remember the tokens of every stretch it saw.
"""

from __future__ import annotations

import bisect
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .exceptions import InputError, SpecialTokenError
from .pieces import Pieces, pieces_for

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "CACHE_SIZE",
    "Matching",
    "Run",
    "TextTokenizer",
    "TokenMatch",
    "Tokenized",
    "Vocabulary",
    "alternation",
    "common_prefix",
    "swap",
    "vocabulary",
]

#: what separates a stretch of text from "the start of the input" for tokenizers that treat the start specially
_SEPARATOR = "\U0010fffe"
#: how many stretches of text a vocabulary remembers the tokens of
CACHE_SIZE = 16384
#: about how many bytes the stretches a vocabulary remembers may take, all told (their text, ids and offsets),
#: and as much again for what a codec remembers of caller text: 64 MiB each. A stretch estimated at more than
#: an eighth of it is never remembered (a prompt of megabytes is not a stretch chats repeat), and when the next
#: ones would pass the bound, everything is forgotten at once (chats repeat their recent stretches, not old ones)
CACHE_BYTES = 64 << 20
#: the estimated bytes a remembered token takes: its id in a list, its offsets, its share of the encoding (measured
#: with tracemalloc on the embedded GGUF: an id's int and its list slots, 40 bytes; its offsets' tuple, int and
#: slot, about 105)
TOKEN_BYTES = 160
#: and a remembered stretch, besides its text and tokens
_ENTRY_BYTES = 256
#: how many new stretches are joined into one call of the tokenizer
_JOINED = 64


class TokenMatch(Protocol):
    """One added token found in text: what :meth:`TextTokenizer.split` yields (``re.Match`` is one)."""

    def start(self) -> int: ...

    def end(self) -> int: ...

    def span(self) -> tuple[int, int]: ...

    def group(self) -> str: ...


@runtime_checkable
class TextTokenizer(Protocol):
    """A tokenizer from outside the tokenizers library, as a :class:`~chatcodec.Codec` uses it.

    Such a tokenizer works as the tokenizers library does: it finds its added tokens in the text first, and
    its model encodes each stretch of text between them alone. llama.cpp's tokenizer of a GGUF
    (:class:`chatcodec.backends.GGUFTokenizer`) is one. With it, a codec gives the same guarantee as with a
    ``tokenizers.Tokenizer``: control tokens only where the template wrote them.

    - ``added_tokens``: every token matched in text before the model runs, by its text;
      ``special_tokens``: those of them that are special (control tokens of the model);
    - ``split(text, pos)``: the added tokens in ``text`` from ``pos`` on, found exactly where the tokenizer
      finds them, in order (``re.Pattern.finditer`` for a tokenizer that takes the leftmost longest);
      ``reach``: how many characters past a token's start finding it may read (the longest added token, or
      more for a tokenizer whose matches depend on tokens that overlap them);
    - ``encode_plain(text)``: ids and character spans of text in which no added token is matched;
    - ``affixes()``: the ids the tokenizer adds before and after a text when asked to add special tokens;
    - ``decode(ids)`` and ``token_to_id(text)``.
    """

    @property
    def added_tokens(self) -> Mapping[str, int]: ...

    @property
    def special_tokens(self) -> frozenset[str]: ...

    @property
    def reach(self) -> int: ...

    def split(self, text: str, pos: int) -> Iterator[TokenMatch]: ...

    def encode_plain(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...

    def affixes(self) -> tuple[list[int], list[int]]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


def vocabulary(tokenizer: Tokenizer | TextTokenizer, split_special_tokens: bool) -> Vocabulary:
    """The :class:`Vocabulary` of a ``tokenizers.Tokenizer`` or of a :class:`TextTokenizer`."""
    if isinstance(tokenizer, TextTokenizer):
        return ExternalVocabulary(tokenizer)
    return Vocabulary(tokenizer, split_special_tokens)


class Run:
    """Consecutive tokens of the prompt: one control token, or one stretch of text encoded by the model.

    ``width`` is the text length of a control token, or -1 for tokens the prompt's text does not hold
    (added by ``add_special_tokens``); a stretch of text has its tokenizers ``Encoding``, read only when
    offsets are asked for (its tokens from index ``skip`` on, its text from character ``lead`` on: several
    stretches may share one encoding), or its ``spans`` given outright.
    """

    __slots__ = ("encoding", "ids", "lead", "skip", "spans", "start", "width")

    def __init__(  # the hot callers pass everything by position: a call with keywords costs three times as much
        self,
        start: int,
        ids: list[int],
        encoding: Any = None,
        skip: int = 0,
        lead: int = 0,
        width: int = 0,
        spans: list[tuple[int, int]] | None = None,
    ) -> None:
        self.start = start
        self.ids = ids
        self.encoding = encoding
        self.skip = skip
        self.lead = lead
        self.width = width
        self.spans = spans

    def offsets(self) -> list[tuple[int, int]]:
        if self.spans is not None:
            return self.spans
        if self.encoding is None:
            if self.width < 0:
                return [(0, 0)] * len(self.ids)
            return [(self.start, self.start + self.width)]
        shift = self.start - self.lead
        return [(s + shift, e + shift) for s, e in self.encoding.offsets[self.skip : self.skip + len(self.ids)]]

    @property
    def is_text(self) -> bool:
        return self.encoding is not None or self.spans is not None


class Matching:
    """What one codec matches in a prompt: its control tokens, the other added tokens (None if none), and
    what it remembers of stretches of caller text (see :meth:`Vocabulary.tokenize`)."""

    __slots__ = ("allowed", "control", "memo", "memo_bytes")

    def __init__(self, control: re.Pattern[str], allowed: re.Pattern[str] | None) -> None:
        self.control = control
        self.allowed = allowed
        self.memo: dict[tuple[str, bool, tuple[tuple[str, str], ...]], _Restored] = {}
        #: the estimated bytes of the memo (bounded by CACHE_BYTES)
        self.memo_bytes = 0


#: a stretch of caller text, restored: its pieces (text, is an added token, offset) and its escaped
#: control tokens, relative to its start
_Restored = tuple[tuple[tuple[str, bool, int], ...], tuple[tuple[int, int], ...]]


#: what a tokenization keeps of the one before (Vocabulary._resumed): where it goes on from, its runs and ids,
#: its stops with the runs and ids before each, its escaped spans
_Resumed = tuple[int, list[Run], list[int], list[int], list[int], list[int], list[tuple[int, int]]]

#: a place in the list of runs that the batch encode at the end of Vocabulary.tokenize fills
_PENDING = Run(0, [])


class Tokenized:
    """A tokenized prompt: its runs and ids, its restored text, its escaped spans, and where a later prompt
    that begins the same way can take over (the ends of its added tokens, the ``stops``).

    The tokenization of a prompt that extends this one (the next turn of the chat, which the codec's memory
    keeps instead of this one) may :meth:`take` its lists of ids and stops and go on in them, not in copies;
    a tokenization that reads them without taking them checks afterwards that nobody took them meanwhile.
    """

    __slots__ = ("_claim", "escaped", "ids", "rendered", "runs", "stop_ids", "stop_runs", "stops", "text")

    def __init__(
        self,
        rendered: str,
        runs: list[Run],
        text: str,
        escaped: list[tuple[int, int]],
        ids: list[int],
        stops: list[int] | None = None,
        stop_runs: list[int] | None = None,
        stop_ids: list[int] | None = None,
    ) -> None:
        self.rendered = rendered
        self.runs = runs
        self.text = text
        self.escaped = escaped
        self.ids = ids
        self.stops = stops or []
        self.stop_runs = stop_runs or []
        self.stop_ids = stop_ids or []
        self._claim = [True]  # emptied by the one call of take() that gets the lists

    def take(self) -> bool:
        """Claim the lists of ids and stops, to be cut and extended in place: True for one caller only (an
        atomic pop), after which the lists are no longer this tokenization's."""
        try:
            self._claim.pop()
        except IndexError:
            return False
        return True

    @property
    def taken(self) -> bool:
        """Whether :meth:`take` gave the lists away (what was read from them since may be wrong)."""
        return not self._claim

    def resume_point(self, rendered: str, longest: int) -> int | None:
        """The last stop a tokenization of ``rendered`` can start from, or None.

        The tokenizer splits text at added tokens first, scanning from left to right, and encodes each stretch
        between them alone. So up to the end of an added token, the two prompts give the same runs, provided
        no match attempted before that end could read where they differ: the end must lie at least ``longest``
        characters (the longest added token) before the first difference.
        """
        if not self.stops:
            return None
        common = common_prefix(rendered, self.rendered)
        kept = bisect.bisect_right(self.stops, common - longest + 1) - 1
        return kept if kept >= 0 else None


class Vocabulary:
    """The tokenizer, split in two: control tokens matched in the prompt, and the model for plain text.

    When every added token matches plainly (no ``lstrip``/``rstrip``/``single_word``, no normalization),
    the prompt is split at added tokens with a regex, exactly where the tokenizers library splits it, and
    each stretch of text between them is encoded by a copy of the tokenizer that has no added tokens.
    Stretches are cached. Other tokenizers encode the whole prompt at once (:meth:`_tokenize_whole`).

    Text that came from the caller arrives with its marks swapped for stand-ins (:mod:`chatcodec.injection`),
    so no added token is matched across them. ``restore`` puts them back; added tokens that are not control
    tokens are then matched in that text too, as the model expects, and control tokens found there are
    reported as escaped: they stay plain text.
    """

    def __init__(self, tokenizer: Tokenizer, split_special_tokens: bool) -> None:
        self.full = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        self.added: dict[str, int] = {token.content: index for index, token in added.items()}
        self.special: frozenset[str] = frozenset(token.content for token in added.values() if token.special)
        #: the added tokens the tokenizer matches in text (all, unless special ones are split)
        self.matched = frozenset(t for t in self.added if not (split_special_tokens and t in self.special))
        plain_flags = all(
            not (t.lstrip or t.rstrip or t.single_word or (t.normalized and tokenizer.normalizer is not None))
            for t in added.values()
        )
        #: the normalizer added tokens are matched after, if any (then control-token marks are found after it too)
        self.normalizer = tokenizer.normalizer if any(t.normalized for t in added.values()) else None
        pattern = alternation(self.matched)
        self.splitter: _Splitter | None = re.compile(pattern) if plain_flags else None
        #: the same regex with a group: its split gives the text and the tokens in one call
        self._split: Callable[[str], list[str]] | None = re.compile(f"({pattern})").split if plain_flags else None
        #: the longest added token: how far a match attempt reads ahead
        self.longest = max(map(len, self.matched), default=1)
        # a tokenizer that treats the start of the input specially (Metaspace prepend_scheme="first")
        # encodes each later stretch behind a separator, so the stretch is not at the start. The separator
        # is an added token of the plain tokenizer only, and its id is the first free one, which the real
        # tokenizer gives to one of its control tokens: text holding the separator character never goes
        # through the plain tokenizer (see tokenize), and other tokenizers get no separator at all.
        pre_tokenizer = tokenizer.pre_tokenizer
        self.start_sensitive = pre_tokenizer is not None and _has_first_only_prefix(
            json.loads(pre_tokenizer.__getstate__())
        )
        # several new stretches are encoded in one call, joined by the separator (the tokenizer encodes what
        # lies between added tokens alone): the joiner is the plain tokenizer with the separator in any case.
        # Text without the separator encodes alike with or without it, so other tokenizers build their plain
        # tokenizer only for text that holds it (see plain): one tokenizer built at load, not two
        self.joiner = _with_separator(_plain_copy(tokenizer))
        self._plain: Tokenizer | None = self.joiner if self.start_sensitive else None
        self._separator_id = self.joiner.token_to_id(_SEPARATOR)
        # NFC leaves ASCII as it is, characters and offsets: stretches of ASCII text skip the normalizer (made on
        # first use: the joiner without it)
        normalizer = tokenizer.normalizer
        self._nfc = normalizer is not None and json.loads(normalizer.__getstate__()) == {"type": "NFC"}
        self._ascii_joiner: Tokenizer | None = None
        #: ASCII stretches encoded from their pieces (:mod:`chatcodec.pieces`): made on first use, None if not
        #: for this tokenizer
        self._pieces: Pieces | bool | None = False
        self.split_special_tokens = split_special_tokens
        self._cache: dict[tuple[str, bool], tuple[list[int], Any, int, int]] = {}
        self._cache_bytes = 0
        self._affixes: tuple[list[int], list[int]] | None = None
        self._without: dict[frozenset[str], Tokenizer] = {}
        self._lock = threading.Lock()

    @property
    def plain(self) -> Tokenizer:
        """The tokenizer without added tokens (with only the separator, for a start-sensitive tokenizer)."""
        if self._plain is None:
            plain = _plain_copy(self.full)
            with self._lock:
                self._plain = plain
        return self._plain

    def control_for(self, sources: str) -> set[str]:
        """Special tokens, and the added tokens the template text holds (not whitespace)."""
        return set(self.special) | {t for t in self.added if t in sources and not t.isspace()}

    def normalize(self, text: str) -> str:
        """``text`` as the added tokens are matched against it (the tokenizer's normalizer)."""
        return text if self.normalizer is None else str(self.normalizer.normalize_str(text))

    def tokenize(
        self,
        rendered: str,
        restore: Mapping[str, str] | None,
        matching: Matching,
        *,
        dropped: frozenset[int] = frozenset(),
        previous: Tokenized | None = None,
        extends: bool = False,
    ) -> Tokenized:
        """The runs of the prompt, its text with stand-ins restored, and the spans of escaped control tokens.

        Control tokens starting at a position in ``dropped`` are treated as text. ``previous`` is the
        tokenization of an earlier prompt with the same stand-ins: its runs are kept up to the last added
        token that ends far enough before the first character where the two prompts differ that no match
        could reach it; only the rest is split and encoded (:meth:`Tokenized.resume_point`). ``extends`` says
        that nothing will read ``previous`` after this call (the memory replaces it with this one): its lists
        are then taken over (:meth:`Tokenized.take`) rather than copied.
        """
        if self.splitter is None or (self.start_sensitive and _SEPARATOR in rendered):
            return self._tokenize_whole(rendered, restore, matching.control, dropped)
        runs: list[Run] = []
        escaped: list[tuple[int, int]] = []
        ids: list[int] = []
        stops: list[int] = []  # where each added token ends in the prompt
        stop_runs: list[int] = []  # how many runs come before that point
        stop_ids: list[int] = []  # and how many ids
        #: runs still to encode: (index in runs, cache key, start), encoded in one batch at the end
        pending: list[tuple[int, tuple[str, bool], int]] = []
        stand_ins = tuple(restore) if restore else ()
        sensitive = self.start_sensitive
        cache = self._cache
        added = self.added
        at = kept_text = 0
        if previous is not None and not dropped:
            resumed = self._resumed(previous, rendered, extends)
            if resumed is not None:
                at, runs, ids, stops, stop_runs, stop_ids, escaped = resumed
                kept_text = at
        known_stops = len(stops)
        first_new = len(runs)
        parts = self._parts(rendered, at, dropped, escaped)  # text, token, text, token, ..., text
        last = len(parts) - 1
        for index in range(0, len(parts), 2):
            piece = parts[index]
            if piece:
                entry = cache.get((piece, sensitive and at == 0))
                if entry is not None:
                    runs.append(Run(at, entry[0], entry[1], entry[2], entry[3]))
                elif stand_ins and _holds_any(piece, stand_ins):
                    self._caller_text(piece, at, restore, matching, runs, pending, escaped)  # type: ignore[arg-type]
                else:
                    pending.append((len(runs), (piece, sensitive and at == 0), at))
                    runs.append(_PENDING)
                at += len(piece)
            if index < last:
                token = parts[index + 1]
                runs.append(Run(at, [added[token]], None, 0, 0, len(token)))
                at += len(token)
                stops.append(at)
                stop_runs.append(len(runs))
        if pending:
            fresh = self._encode_missing(list(dict.fromkeys(key for _, key, _ in pending)))
            for index, key, start in pending:
                run_ids, encoding, skip, lead = fresh[key]
                runs[index] = Run(start, run_ids, encoding, skip, lead)
        # the ids of the new runs, and how many precede each new stop
        counts = [len(ids)]  # ids before each new run, and after the last
        for run in runs[first_new:]:
            ids.extend(run.ids)
            counts.append(len(ids))
        stop_ids += [counts[stop_runs[i] - first_new] for i in range(known_stops, len(stop_runs))]
        if not restore:
            text = rendered
        elif kept_text:  # stand-ins swap one character for one: the text agrees as far as the prompt does
            text = previous.text[:kept_text] + swap(rendered[kept_text:], restore)  # type: ignore[union-attr]
        else:
            text = swap(rendered, restore)
        if len(escaped) > 1:
            escaped.sort()
        return Tokenized(rendered, runs, text, escaped, ids, stops, stop_runs, stop_ids)

    def _resumed(self, previous: Tokenized, rendered: str, extends: bool) -> _Resumed | None:
        """What a tokenization of ``rendered`` keeps of ``previous``: where it goes on from, and the runs, ids,
        stops (with the runs and ids before each) and escaped spans before that; None to start afresh.

        With ``extends``, the lists of ids and stops are taken over (:meth:`Tokenized.take`), cut back and gone
        on with in place; else they are copied, and not used if another call took them meanwhile (it may have
        cut them, or written over them)."""
        taking = extends and previous.take()
        if not taking and previous.taken:
            return None
        try:
            kept = previous.resume_point(rendered, self.longest)
            if kept is None:
                return None
            at = previous.stops[kept]
            runs = previous.runs[: previous.stop_runs[kept]]
            if taking:
                ids, stops, stop_runs, stop_ids = previous.ids, previous.stops, previous.stop_runs, previous.stop_ids
                del ids[stop_ids[kept] :], stops[kept + 1 :], stop_runs[kept + 1 :], stop_ids[kept + 1 :]
            else:
                ids = previous.ids[: previous.stop_ids[kept]]
                stops, stop_runs = previous.stops[: kept + 1], previous.stop_runs[: kept + 1]
                stop_ids = previous.stop_ids[: kept + 1]
        except IndexError:  # lists another call took and cut while this one read them
            return None
        if not taking and previous.taken:  # taken while this call read them: what it read may be wrong
            return None
        return at, runs, ids, stops, stop_runs, stop_ids, [span for span in previous.escaped if span[1] <= at]

    def _parts(self, rendered: str, at: int, dropped: frozenset[int], escaped: list[tuple[int, int]]) -> list[str]:
        """The prompt from ``at`` split at the added tokens it matches: text, token, text, ..., text (one C call
        for a regex splitter). A token starting in ``dropped`` stays in its text, its span added to ``escaped``."""
        if not dropped and self._split is not None:
            return self._split(rendered[at:] if at else rendered)
        parts: list[str] = []
        for match in self.splitter.finditer(rendered, at):  # type: ignore[union-attr]
            start = match.start()
            if start in dropped:
                escaped.append(match.span())
                continue
            parts += (rendered[at:start], match.group())
            at = match.end()
        parts.append(rendered[at:])
        return parts

    def _caller_text(
        self,
        text: str,
        start: int,
        restore: Mapping[str, str],
        matching: Matching,
        runs: list[Run],
        pending: list[tuple[int, tuple[str, bool], int]],
        escaped: list[tuple[int, int]],
    ) -> None:
        """A stretch of text between added tokens that holds caller text: restored, it stays text, but for the
        added tokens that are not control tokens; control tokens in it are reported as escaped."""
        first = self.start_sensitive and start == 0
        key = (text, first, tuple(sorted(restore.items())))
        known = matching.memo.get(key)
        if known is None:
            restored = swap(text, restore)
            found = tuple(m.span() for m in matching.control.finditer(restored))
            parts: list[tuple[str, bool, int]] = []
            at = 0
            if matching.allowed is not None:
                for match in matching.allowed.finditer(restored):
                    if match.start() > at:
                        parts.append((restored[at : match.start()], False, at))
                    parts.append((match.group(), True, match.start()))
                    at = match.end()
            if at < len(restored):
                parts.append((restored[at:], False, at))
            known = (tuple(parts), found)
            size = 3 * len(text) + _ENTRY_BYTES * (len(parts) + len(found) + 1)
            if size <= CACHE_BYTES // 8:  # the text, restored, and its pieces; a huge stretch is not kept
                if len(matching.memo) >= CACHE_SIZE or matching.memo_bytes + size > CACHE_BYTES:
                    matching.memo.clear()
                    matching.memo_bytes = 0
                matching.memo[key] = known
                matching.memo_bytes += size
        parts_known, found_known = known
        cache = self._cache
        for piece, is_token, offset in parts_known:
            if is_token:
                runs.append(Run(start + offset, [self.added[piece]], None, 0, 0, len(piece)))
                continue
            piece_key = (piece, self.start_sensitive and start + offset == 0)
            entry = cache.get(piece_key)
            if entry is not None:
                runs.append(Run(start + offset, entry[0], entry[1], entry[2], entry[3]))
            else:
                pending.append((len(runs), piece_key, start + offset))
                runs.append(_PENDING)
        for a, b in found_known:
            escaped.append((start + a, start + b))

    def _encode_missing(self, keys: list[tuple[str, bool]]) -> dict[tuple[str, bool], tuple[list[int], Any, int, int]]:
        """Encode stretches the cache lacks: (ids, encoding, first token, first character) for each."""
        fresh: dict[tuple[str, bool], tuple[list[int], Any, int, int]] = {}
        alone = [key for key in keys if _SEPARATOR in key[0]]  # only possible for tokenizers without a start rule
        joined = [key for key in keys if _SEPARATOR not in key[0]]
        if joined and not self.start_sensitive:
            joined = self._encode_pieces(joined, fresh)
        for key in alone:
            encoding = _encode(self.plain, key[0])
            fresh[key] = (encoding.ids, encoding, 0, 0)
        if len(joined) == 1 and not (self.start_sensitive and not joined[0][1]):
            encoding = _encode(self._joiner_for(joined), joined[0][0])  # no separator: the plain tokenizer's ids
            fresh[joined[0]] = (encoding.ids, encoding, 0, 0)
        elif joined:
            joined.sort(key=lambda key: not key[1])  # a stretch at the start of the prompt goes first
            for chunk in range(0, len(joined), _JOINED):
                self._encode_joined(joined[chunk : chunk + _JOINED], fresh)
        self._remember(fresh)
        return fresh

    def _remember(self, fresh: dict[tuple[str, bool], tuple[list[int], Any, int, int]]) -> None:
        """Keep new stretches in the cache, within :data:`CACHE_SIZE` entries and :data:`CACHE_BYTES`."""
        keep = {}
        size = 0
        for key, entry in fresh.items():
            entry_size = 2 * len(key[0]) + TOKEN_BYTES * len(entry[0]) + _ENTRY_BYTES
            if entry_size <= CACHE_BYTES // 8:
                keep[key] = entry
                size += entry_size
        if len(self._cache) + len(keep) > CACHE_SIZE or self._cache_bytes + size > CACHE_BYTES:
            self._cache.clear()  # a rough bound: chats repeat their recent stretches, not old ones
            self._cache_bytes = 0
        self._cache.update(keep)
        self._cache_bytes += size

    @property
    def cache_bytes(self) -> int:
        """The estimated bytes of the stretches remembered (at most :data:`CACHE_BYTES`)."""
        return self._cache_bytes

    def _encode_pieces(
        self, keys: list[tuple[str, bool]], fresh: dict[tuple[str, bool], tuple[list[int], Any, int, int]]
    ) -> list[tuple[str, bool]]:
        """Stretches of ASCII text encoded from their pieces, where the tokenizer allows it; the others are left."""
        pieces = self._pieces
        if pieces is False:
            tokenizer = self._joiner_for([("", False)])  # the joiner that ASCII text goes to
            pieces = None
            if tokenizer.normalizer is None:
                pieces = pieces_for(tokenizer, _encode)
            with self._lock:
                self._pieces = pieces
        if not isinstance(pieces, Pieces):
            return keys
        left = []
        for key in keys:
            text = key[0]
            ids = pieces.encode(text) if text.isascii() else None
            if ids is None:
                left.append(key)
            else:
                fresh[key] = (ids, _Pieced(pieces.tokenizer, text), 0, 0)
        return left

    def _joiner_for(self, keys: list[tuple[str, bool]]) -> Tokenizer:
        """The joiner, or for stretches all of ASCII under an NFC normalizer, the joiner without it."""
        if not self._nfc or not all(text.isascii() for text, _ in keys):
            return self.joiner
        if self._ascii_joiner is None:
            joiner = _plain_copy(self.full)
            joiner.normalizer = None
            _with_separator(joiner)
            if joiner.token_to_id(_SEPARATOR) != self._separator_id:
                self._nfc = False
                return self.joiner
            with self._lock:
                self._ascii_joiner = joiner
        return self._ascii_joiner

    def _encode_joined(
        self, keys: list[tuple[str, bool]], fresh: dict[tuple[str, bool], tuple[list[int], Any, int, int]]
    ) -> None:
        """Stretches encoded in one call, each behind a separator (but one at the start of the prompt)."""
        parts: list[str] = []
        leads = []
        position = 0
        for text, first in keys:
            if position or (self.start_sensitive and not first):
                parts.append(_SEPARATOR)
                position += len(_SEPARATOR)
            leads.append(position)
            parts.append(text)
            position += len(text)
        encoding = _encode(self._joiner_for(keys), "".join(parts))
        ids = encoding.ids
        shared = _Joined(encoding)
        separator = self._separator_id
        at = 0
        for index, key in enumerate(keys):
            if leads[index] and ids[at : at + 1] == [separator]:
                at += 1
            try:
                end = ids.index(separator, at)
            except ValueError:
                end = len(ids)
            fresh[key] = (ids[at:end], shared, at, leads[index])
            at = end

    def _tokenize_whole(
        self,
        rendered: str,
        restore: Mapping[str, str] | None,
        control: re.Pattern[str],
        dropped: frozenset[int],
    ) -> Tokenized:
        """For tokenizers whose added tokens strip whitespace or are normalized: one encode of the prompt.

        Control tokens that hold a restored caller character, or start in ``dropped``, are then taken out:
        the text between the added tokens around each is encoded again by the tokenizer without its
        control tokens.
        """
        text = swap(rendered, restore) if restore else rendered
        whole = _encode(self.full, text)
        caller: list[int] = []
        if restore:
            stand_ins = re.compile("[" + "".join(map(re.escape, restore)) + "]")
            caller = [m.start() for m in stand_ins.finditer(rendered)]
        if not caller and not dropped:
            return Tokenized(rendered, [Run(0, whole.ids, encoding=whole)], text, [], list(whole.ids))
        control_ids = {self.added[t] for t in self.added if control.fullmatch(t)}
        added_ids = set(self.added.values())
        ids, offsets = whole.ids, whole.offsets
        bad = [
            i
            for i, (token, (start, end)) in enumerate(zip(ids, offsets, strict=True))
            if token in control_ids and (start in dropped or _holds(caller, start, end))
        ]
        if not bad:
            return Tokenized(rendered, [Run(0, whole.ids, encoding=whole)], text, [], list(whole.ids))
        # each bad token and the text around it, up to the added tokens that stay, is encoded again
        regions: list[list[int]] = []  # [first token, last token] index ranges
        bad_set = set(bad)
        for i in bad:
            if regions and regions[-1][1] >= i:
                continue
            first = i
            while first > 0 and not (ids[first - 1] in added_ids and first - 1 not in bad_set):
                first -= 1
            last = i
            while last + 1 < len(ids) and not (ids[last + 1] in added_ids and last + 1 not in bad_set):
                last += 1
            regions.append([first, last])
        without = self._without_control(frozenset(t for t in self.added if self.added[t] in control_ids))
        runs: list[Run] = []
        cursor = 0
        for first, last in regions:
            if first > cursor:
                runs.append(Run(offsets[cursor][0], ids[cursor:first], spans=offsets[cursor:first]))
            begin = offsets[first - 1][1] if first else 0
            end = offsets[last + 1][0] if last + 1 < len(ids) else len(text)
            runs.append(self._run_without(without, text[begin:end], begin))
            cursor = last + 1
        if cursor < len(ids):
            runs.append(Run(offsets[cursor][0], ids[cursor:], spans=offsets[cursor:]))
        return Tokenized(rendered, runs, text, [offsets[i] for i in bad], [i for run in runs for i in run.ids])

    def _without_control(self, control: frozenset[str]) -> Tokenizer:
        """The tokenizer with every added token but ``control`` (and the separator, if it needs one)."""
        tokenizer = self._without.get(control)
        if tokenizer is None:
            from tokenizers import Tokenizer

            spec = json.loads(self.full.to_str())
            spec["added_tokens"] = [t for t in spec.get("added_tokens") or [] if t.get("content") not in control]
            tokenizer = Tokenizer.from_str(json.dumps(spec))
            if self.start_sensitive:
                _with_separator(tokenizer)
            with self._lock:
                self._without[control] = tokenizer
        return tokenizer

    def _run_without(self, tokenizer: Tokenizer, text: str, start: int) -> Run:
        lead = _SEPARATOR if start and self.start_sensitive else ""
        if self.start_sensitive and _SEPARATOR in text:
            raise InputError(
                "Content that holds a control token also holds U+10FFFE, a Unicode noncharacter this tokenizer"
                " cannot encode next to escaped text; remove the character."
            )
        encoding = _encode(tokenizer, lead + text)
        skip = 1 if lead else 0
        return Run(start, encoding.ids[skip:], encoding=encoding, skip=skip, lead=len(lead))

    def check_escapes(self, runs: list[Run], escaped: list[tuple[int, int]], control: frozenset[str]) -> None:
        """Escaped text must not come out as a control token even from the model's own merges."""
        control_ids = {self.added[t] for t in control if t in self.added}
        for run in runs:
            if not run.is_text or not control_ids.intersection(run.ids):
                continue
            for token, (s, e) in zip(run.ids, run.offsets(), strict=True):
                if token in control_ids and any(a < e and s < b for a, b in escaped):
                    raise SpecialTokenError(
                        f"Cannot escape {self._token_text(token)!r}: the tokenizer produces it from plain text."
                    )

    def _token_text(self, token: int) -> str | None:
        return self.full.id_to_token(token)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``, as the tokenizer decodes it."""
        return self.full.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _find_affixes(self) -> tuple[list[int], list[int]]:
        bare = self.full.encode("a", add_special_tokens=False).ids
        full = self.full.encode("a", add_special_tokens=True).ids
        at = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), 0)
        return full[:at], full[at + len(bare) :]

    def add_missing_special_tokens(self, runs: list[Run]) -> list[Run]:
        """Prepend and append what the post-processor adds (BOS, EOS), unless the prompt has it already."""
        if self._affixes is None:
            self._affixes = self._find_affixes()
        prefix, suffix = self._affixes
        ids = [i for run in runs for i in run.ids]
        if prefix and ids[: len(prefix)] != prefix:
            runs = [Run(0, list(prefix), width=-1), *runs]
        if suffix and ids[-len(suffix) :] != suffix:
            runs = [*runs, Run(0, list(suffix), width=-1)]
        return runs


class _Splitter(Protocol):
    def finditer(self, string: str, pos: int) -> Iterator[TokenMatch]: ...


class _Split:
    """A :class:`TextTokenizer`'s own way of finding its added tokens, as a splitter."""

    __slots__ = ("_split",)

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._split = tokenizer.split

    def finditer(self, string: str, pos: int = 0) -> Iterator[TokenMatch]:
        return self._split(string, pos)


class _Joined:
    """The encoding of stretches joined in one call, which their runs share (cached, across prompts too): its
    offsets are read once, as each read of a tokenizers ``Encoding.offsets`` builds the whole list again."""

    __slots__ = ("_encoding", "_offsets")

    def __init__(self, encoding: Any) -> None:
        self._encoding = encoding
        self._offsets: list[tuple[int, int]] | None = None

    @property
    def offsets(self) -> list[tuple[int, int]]:
        if self._offsets is None:
            self._offsets = self._encoding.offsets
            self._encoding = None  # only the offsets are read from it: the encoding itself can go
        return self._offsets


class _Pieced:
    """A stretch encoded from its pieces: its offsets are the tokenizer's, read the first time they are asked for
    (an ASCII prompt's mask needs none)."""

    __slots__ = ("_offsets", "_text", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, text: str) -> None:
        self._tokenizer: Tokenizer | None = tokenizer
        self._text = text
        self._offsets: list[tuple[int, int]] | None = None

    @property
    def offsets(self) -> list[tuple[int, int]]:
        if self._offsets is None:
            self._offsets = _encode(self._tokenizer, self._text).offsets  # type: ignore[arg-type]
            self._tokenizer = None
        return self._offsets


class _Spans:
    """The offsets of a stretch a :class:`TextTokenizer` encoded, read by :meth:`Run.offsets`."""

    __slots__ = ("offsets",)

    def __init__(self, offsets: list[tuple[int, int]]) -> None:
        self.offsets = offsets


class ExternalVocabulary(Vocabulary):
    """A :class:`Vocabulary` over a :class:`TextTokenizer`: the prompt is split where the tokenizer splits it,
    and each stretch of text is encoded by the tokenizer with no added token matched in it."""

    def __init__(self, tokenizer: TextTokenizer) -> None:  # the tokenizers library is never needed
        self.full = tokenizer  # type: ignore[assignment]
        self.text_tokenizer = tokenizer
        self.added = dict(tokenizer.added_tokens)
        self.special = frozenset(tokenizer.special_tokens)
        self.matched = frozenset(self.added)
        self.normalizer = None
        self.splitter = _Split(tokenizer)
        self._split = None
        self.longest = max(tokenizer.reach, 1)
        self.start_sensitive = False
        self.split_special_tokens = False
        self._names = {index: text for text, index in self.added.items()}
        self._cache = {}
        self._cache_bytes = 0
        self._affixes = None
        self._without = {}
        self._lock = threading.Lock()

    def _encode_missing(self, keys: list[tuple[str, bool]]) -> dict[tuple[str, bool], tuple[list[int], Any, int, int]]:
        fresh: dict[tuple[str, bool], tuple[list[int], Any, int, int]] = {}
        for key in keys:
            ids, spans = self.text_tokenizer.encode_plain(key[0])
            fresh[key] = (ids, _Spans(spans), 0, 0)
        self._remember(fresh)
        return fresh

    def _token_text(self, token: int) -> str | None:
        return self._names.get(token)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.text_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def _find_affixes(self) -> tuple[list[int], list[int]]:
        prefix, suffix = self.text_tokenizer.affixes()
        return list(prefix), list(suffix)


def common_prefix(a: str, b: str, limit: int | None = None) -> int:
    """How many characters ``a`` and ``b`` share from their start (at most ``limit``): a binary search of
    C-speed comparisons.

    >>> common_prefix("<|im_start|>user", "<|im_start|>assistant")
    12
    """
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    high = len(short) if limit is None else min(len(short), limit)
    if long.startswith(short if high == len(short) else short[:high]):  # the usual: no copy of the text
        return high
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if long.startswith(short[low:middle], low):
            low = middle
        else:
            high = middle - 1
    return low


def swap(text: str, mapping: Mapping[str, str]) -> str:
    """``text`` with each character that ``mapping`` has replaced by its value (a few ``str.replace`` calls,
    far faster than ``str.translate`` for characters outside Latin-1)."""
    for old, new in mapping.items():
        if old in text:
            text = text.replace(old, new)
    return text


def _holds_any(text: str, chars: tuple[str, ...]) -> bool:
    for char in chars:  # noqa: SIM110 - a loop is faster than any() over a generator
        if char in text:
            return True
    return False


def _holds(positions: list[int], start: int, end: int) -> bool:
    """Whether a sorted list of positions has one in ``[start, end)``."""
    at = bisect.bisect_left(positions, start)
    return at < len(positions) and positions[at] < end


def _encode(tokenizer: Tokenizer, text: str) -> Any:
    try:
        return tokenizer.encode(text, add_special_tokens=False)
    except Exception as exc:  # the Rust side raises TypeError for text Python can hold and UTF-8 cannot
        raise _unencodable(text, exc) from None


def _unencodable(text: str, exc: Exception) -> InputError:
    bad = next((i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF), None)
    if bad is not None:
        return InputError(
            f"The prompt holds a lone surrogate, U+{ord(text[bad]):04X}, which is not a Unicode character"
            " the tokenizer can encode; remove it or decode the input text properly."
        )
    return InputError(f"The tokenizer cannot encode the prompt: {exc}.")


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


def _plain_copy(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer without its added tokens, truncation and padding (stretches are encoded whole): a new
    tokenizer over the same model, normalizer, pre-tokenizer, post-processor and decoder, shared, not parsed
    again from tokenizer.json (a second or so for a large vocabulary)."""
    from tokenizers import Tokenizer

    copy = Tokenizer(tokenizer.model)
    copy.normalizer = tokenizer.normalizer
    copy.pre_tokenizer = tokenizer.pre_tokenizer
    copy.post_processor = tokenizer.post_processor
    copy.decoder = tokenizer.decoder
    return copy


def _with_separator(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` with the separator that joins stretches added as a special token (see Vocabulary)."""
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken(_SEPARATOR, special=True, normalized=False)])
    return tokenizer


def _has_first_only_prefix(pre_tokenizer: Any) -> bool:
    """Whether a pre-tokenizer prepends its space marker to the start of the input only."""
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "Metaspace":
        return pre_tokenizer.get("prepend_scheme") == "first"
    return any(_has_first_only_prefix(p) for p in pre_tokenizer.get("pretokenizers") or [])
