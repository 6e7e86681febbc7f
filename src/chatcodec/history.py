"""What a codec remembers of the conversations it encoded, so that the next turn costs its new text.

Serving and agent loops encode the whole history at every request: the same messages, plus one or two new
ones. A :class:`History` keeps, for each recent conversation, what :meth:`chatcodec.Codec.encode` made of it:
a copy of each message as it was (to know the caller did not change it since), the message with its marks
swapped (:mod:`chatcodec.injection`), and the tokenized prompt. The next encode of that conversation swaps
marks in its new messages only, and tokenizes only from where its prompt stops agreeing with the old one
(:meth:`chatcodec.vocab.Tokenized.resume_point`).

Correctness never rests on the memory: a message is reused only if it equals the copy kept, and tokens
only up to a point the new prompt text (rendered in full every time) provably agrees with. A template that
rewrites history (Qwen3 drops the reasoning of earlier turns) simply resumes earlier. An encode that asks for
the assistant mask also keeps what the mask's marked render, anchors, turns and bits were
(:class:`chatcodec.masks.MaskMemory`), for the next one to go on from.

The memory is bounded in entries and in (estimated) bytes, least recently used first out, and safe to
share between threads.
"""

from __future__ import annotations

import json
import marshal
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from .exceptions import InputError
from .resuming import Record
from .vocab import Tokenized

if TYPE_CHECKING:
    from .masks import MaskMemory

__all__ = ["Entry", "History", "copy_of", "keys"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=True, allow_nan=True)
#: at most this many conversations share a first message (a common system prompt) in one slot
_PER_KEY = 8


class Entry:
    """One remembered encode: a copy of each message as it was, which of them held no mark, and the tokens.

    The first encode of a conversation keeps its tokens only (``copies`` is None): most conversations are
    never seen again, and the tokens are reused by text, not by message. The second one, which shows the
    conversation growing, also keeps the copies.
    """

    __slots__ = (
        "__weakref__", "copies", "key", "loose", "marked", "mask", "policy", "record", "seen", "size", "swapped",
        "swapped_chars", "table", "tokens",
    )  # fmt: skip

    def __init__(
        self,
        key: Hashable,
        policy: str,
        copies: list[Any] | None,
        marked: list[int],
        table: dict[str, str],
        tokens: Tokenized,
        size: int,
        swapped: dict[int, tuple[str, Any]] | None = None,
    ) -> None:
        self.key = key
        self.policy = policy
        #: a copy of every message as it was (or None: not kept)
        self.copies = copies
        #: the indices of the messages that held a mark (or a stand-in), in order: the others held none, and
        #: equal text holds none either
        self.marked = marked
        #: the stand-ins of the marks the conversation held
        self.table = table
        #: message index -> (its JSON text, what it became with its marks swapped)
        self.swapped = swapped or {}
        #: the characters of the JSON texts in ``swapped`` (part of ``size``)
        self.swapped_chars = 0
        self.tokens = tokens
        self.size = size
        #: the messages the template saw (copies, marks swapped, normalized) and the record of that render
        #: (chatcodec.resuming), from which the next render of this conversation can resume
        self.seen: list[Any] | None = None
        self.record: Record | None = None
        #: (index, marshal form) of the copies that hold more than text: ``==`` does not tell ``1`` from
        #: ``True`` or ``1.0``, nor one order of a nested object's keys from another
        self.loose: list[tuple[int, bytes]] = []
        #: what the assistant mask of this encode left for the next one (:class:`chatcodec.masks.MaskMemory`),
        #: set once by :meth:`History.keep_mask`
        self.mask: MaskMemory | None = None

    def keep_render(self, seen: list[Any], record: Record, base: Entry | None, trusted: int) -> None:
        """Keep the messages a render saw and its record, for the next encode to resume from; the copies
        up to ``trusted`` are ``base``'s, whose strict forms are known."""
        assert self.copies is not None
        if base is None:
            loose, trusted = [], 0
        elif not base.loose or base.loose[-1][0] < trusted:
            loose = list(base.loose)
        else:
            loose = [pair for pair in base.loose if pair[0] < trusted]
        for index in range(trusted, len(self.copies)):
            copy = self.copies[index]
            if type(copy) is not dict or not _text_only(copy):
                try:
                    loose.append((index, marshal.dumps(copy, 2)))
                except ValueError:
                    return
        self.seen, self.record, self.loose = seen, record, loose

    def trusted(self, messages: Sequence[Any], agreeing: int) -> int:
        """How many of the ``agreeing`` leading messages equal their copies strictly (types and key order in
        nested values too): those a render may take as the ones it saw (:mod:`chatcodec.resuming`)."""
        if self.seen is None:
            return 0
        agreeing = min(agreeing, len(self.seen))
        for index, form in self.loose:
            if index >= agreeing:
                break
            try:
                if marshal.dumps(messages[index], 2) != form:
                    return index
            except ValueError:
                return index
        return agreeing

    def agreeing(self, messages: Sequence[Any]) -> int:
        """How many leading messages equal the copies kept (compared in C, not walked in Python)."""
        copies = self.copies
        if copies is None:
            return 0
        count = min(len(messages), len(copies))
        if count == len(copies) and type(messages) is list:  # the usual growth: compared without copying
            if messages[:count] == copies if count < len(messages) else messages == copies:
                return count
        elif list(messages[:count]) == copies[:count]:
            return count
        low, high = 0, count - 1  # messages[:low] agree, messages[:high + 1] do not
        while low < high:
            middle = (low + high + 1) // 2
            if list(messages[low:middle]) == copies[low:middle]:
                low = middle
            else:
                high = middle - 1
        return low


class History:
    """A bounded, thread-safe memory of recent encodes, one slot per first message (or first two).

    ``entries`` bounds how many encodes are kept and ``max_bytes`` their estimated size (prompt text, ids,
    runs and message copies); the least recently used go first. ``History(entries=0)`` remembers nothing.

    >>> History(entries=4, max_bytes=1 << 20)
    <History 0 of 4 entries, 0 of 1048576 bytes>
    """

    def __init__(self, entries: int = 256, max_bytes: int = 64 << 20) -> None:
        if not isinstance(entries, int) or isinstance(entries, bool) or entries < 0:
            raise InputError(f"History(entries=...) takes a count of 0 or more, not {entries!r}.")
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise InputError(f"History(max_bytes=...) takes a size of 0 or more, not {max_bytes!r}.")
        self.entries = entries
        self.max_bytes = max_bytes
        self._slots: OrderedDict[Hashable, list[Entry]] = OrderedDict()
        self._count = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<History {self._count} of {self.entries} entries, {self._bytes} of {self.max_bytes} bytes>"

    def __len__(self) -> int:
        return self._count

    @property
    def size(self) -> int:
        """The estimated bytes of what is remembered."""
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._slots.clear()
            self._count = self._bytes = 0

    def find(self, policy: str, messages: Sequence[Any], slots: Sequence[Hashable]) -> tuple[Entry, int] | None:
        """The remembered encode (with the same policy) that shares the most leading messages, and how many;
        ``slots`` are the :func:`keys` of the messages."""
        if not self.entries or not messages:
            return None
        best: tuple[Entry, int] | None = None
        for key in slots:
            with self._lock:
                slot = self._slots.get(key)
                if slot is None:
                    continue
                self._slots.move_to_end(key)
                candidates = list(slot)
            for entry in reversed(candidates):  # the most recent first
                if entry.policy != policy:
                    continue
                agreeing = entry.agreeing(messages)
                if best is None or agreeing > best[1]:
                    best = (entry, agreeing)
            if best is not None:
                return best
        return None

    def remember(self, entry: Entry, replacing: Entry | None = None) -> None:
        """Keep ``entry``; ``replacing`` is the encode it extends, which it makes useless (its tokens' lists
        went on in ``entry``'s: dropped even when ``entry`` is too large to keep)."""
        if not self.entries:
            return
        with self._lock:
            if replacing is not None:
                self._drop(replacing)
            if entry.size > self.max_bytes:
                return
            slot = self._slots.setdefault(entry.key, [])
            self._slots.move_to_end(entry.key)
            slot.append(entry)
            self._count += 1
            self._bytes += entry.size
            if len(slot) > _PER_KEY:
                self._drop(slot[0])
            self._shrink()

    def keeper(self, entry: Entry) -> Callable[[MaskMemory], None]:
        """:meth:`keep_mask` for ``entry``, holding it weakly: an encoding whose mask is read late does not keep
        an entry the history has let go (it would not be kept then either)."""
        held = weakref.ref(entry)

        def keep(memory: MaskMemory) -> None:
            entry = held()
            if entry is not None:
                self.keep_mask(entry, memory)

        return keep

    def keep_mask(self, entry: Entry, memory: MaskMemory) -> None:
        """Keep what ``entry``'s assistant mask left for the next encode, counted in the bytes (the mask is
        worked out after the encode is remembered); nothing if the entry is gone or it would not fit."""
        with self._lock:
            slot = self._slots.get(entry.key)
            if entry.mask is not None or slot is None or entry not in slot or entry.size + memory.size > self.max_bytes:
                return
            entry.mask = memory
            entry.size += memory.size
            self._bytes += memory.size
            self._shrink()

    def _shrink(self) -> None:
        """Drop the least recently used entries until both bounds hold (the caller holds the lock)."""
        while (self._count > self.entries or self._bytes > self.max_bytes) and self._slots:
            oldest = next(iter(self._slots.values()))
            self._drop(oldest[0])

    def _drop(self, entry: Entry) -> None:
        slot = self._slots.get(entry.key)
        if slot is None or entry not in slot:
            return
        slot.remove(entry)
        self._count -= 1
        self._bytes -= entry.size
        if not slot:
            del self._slots[entry.key]


def keys(messages: Sequence[Any]) -> list[Hashable]:
    """Where a conversation is looked for: its first two messages, then its first alone (its first turn was
    remembered before the second message existed). None of them if those are not plain JSON."""
    first = _key(messages[0])
    if first is None:
        return []
    if len(messages) < 2:
        return [first]
    second = _key(messages[1])
    return [(first, second), first] if second is not None else [first]


def _key(message: Any) -> Hashable | None:
    """A message's role and text (hashed by Python, not serialized), or its JSON text."""
    if type(message) is dict:
        content = message.get("content")
        if type(content) is str and type(message.get("role")) is str:
            return (message["role"], content)
    try:
        return _ENCODER.encode(message)
    except (TypeError, ValueError, RecursionError):
        return None


_FLAT = frozenset({str, int, float, bool, type(None)})


def _text_only(message: dict[Any, Any]) -> bool:
    for value in message.values():  # noqa: SIM110 - a loop is faster than all() over a generator
        if type(value) is not str:
            return False
    return True


def copy_of(value: Any) -> tuple[Any, int] | None:
    """A deep copy of plain JSON data, and about how many characters it holds; None for anything else.

    A dict of text and numbers (most messages) is copied as it is: its values cannot change in place.
    """
    if type(value) is dict:
        size = 0
        for key, item in value.items():
            kind = type(item)
            if type(key) is not str or kind not in _FLAT:
                break
            size += len(key) + (len(item) if kind is str else 8)
        else:
            return dict(value), size
    try:
        text = _ENCODER.encode(value)
        return json.loads(text), len(text)
    except (TypeError, ValueError, RecursionError):
        return None
