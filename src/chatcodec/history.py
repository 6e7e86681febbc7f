"""What a codec remembers of the conversations it encoded, so that the next turn costs its new text.

Serving and agent loops encode the whole history at every request: the same messages, plus one or two new
ones. A :class:`History` keeps, for each recent conversation, what :meth:`chatcodec.Codec.encode` made of it:
a copy of each message as it was (to know the caller did not change it since), the message with its marks
swapped (:mod:`chatcodec.injection`), and the tokenized prompt. The next encode of that conversation swaps
marks in its new messages only, and tokenizes only from where its prompt stops agreeing with the old one
(:meth:`chatcodec.vocab.Tokenized.resume_point`).

Correctness never rests on the memory: a message is reused only if it equals the copy kept, and tokens
only up to a point the new prompt text (rendered in full every time) provably agrees with. A template that
rewrites history (Qwen3 drops the reasoning of earlier turns) simply resumes earlier.

The memory is bounded in entries and in (estimated) bytes, least recently used first out, and safe to
share between threads.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .exceptions import InputError
from .vocab import Tokenized

__all__ = ["Entry", "History", "copy_of", "keys"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=True, allow_nan=True)
#: at most this many conversations share a first message (a common system prompt) in one slot
_PER_KEY = 8


class Entry:
    """One remembered encode: a copy of each message as it was, which of them held no mark, and the tokens."""

    __slots__ = ("copies", "documents", "key", "marked", "policy", "size", "swapped", "table", "tokens", "tools")

    def __init__(
        self,
        key: str,
        policy: str,
        copies: list[Any],
        marked: list[int],
        tools: tuple[Any, bool] | None,
        documents: tuple[Any, bool] | None,
        table: dict[str, str],
        tokens: Tokenized,
        size: int,
        swapped: dict[int, tuple[str, Any]] | None = None,
    ) -> None:
        self.key = key
        self.policy = policy
        #: a deep copy of every message (None where it is not plain JSON, which ends what can be reused)
        self.copies = copies
        #: the indices of the messages that held a mark (or a stand-in), in order: the others held none, and
        #: equal text holds none either
        self.marked = marked
        #: (copy, held no mark) of the tools and of the documents, or None
        self.tools = tools
        self.documents = documents
        #: the stand-ins of the marks the conversation held
        self.table = table
        #: message index -> (its JSON text, what it became with its marks swapped)
        self.swapped = swapped or {}
        self.tokens = tokens
        self.size = size

    def agreeing(self, messages: Sequence[Any]) -> int:
        """How many leading messages equal the copies kept (compared in C, not walked in Python)."""
        copies = self.copies
        count = min(len(messages), len(copies))
        if list(messages[:count]) == copies[:count]:
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
        self._slots: OrderedDict[str, list[Entry]] = OrderedDict()
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

    def find(self, policy: str, messages: Sequence[Any]) -> tuple[Entry, int] | None:
        """The remembered encode (with the same policy) that shares the most leading messages, and how many."""
        if not self.entries or not messages:
            return None
        best: tuple[Entry, int] | None = None
        for key in keys(messages):
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
                if agreeing and (best is None or agreeing > best[1]):
                    best = (entry, agreeing)
            if best is not None:
                return best
        return None

    def remember(self, entry: Entry, replacing: Entry | None = None) -> None:
        """Keep ``entry``; ``replacing`` is the encode it extends, which it makes useless."""
        if not self.entries or entry.size > self.max_bytes:
            return
        with self._lock:
            if replacing is not None:
                self._drop(replacing)
            slot = self._slots.setdefault(entry.key, [])
            self._slots.move_to_end(entry.key)
            slot.append(entry)
            self._count += 1
            self._bytes += entry.size
            if len(slot) > _PER_KEY:
                self._drop(slot[0])
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


def keys(messages: Sequence[Any]) -> list[str]:
    """Where a conversation is looked for: its first two messages, then its first alone (its first turn was
    remembered before the second message existed)."""
    keys = []
    for count in (2, 1):
        if len(messages) >= count:
            key = fingerprint(messages[:count])
            if key is not None and key not in keys:
                keys.append(key)
    return keys


def fingerprint(messages: Sequence[Any]) -> str | None:
    """The JSON text of plain JSON messages, or None for anything else."""
    try:
        return _ENCODER.encode(list(messages))
    except (TypeError, ValueError, RecursionError):
        return None


def copy_of(value: Any) -> tuple[Any, int] | None:
    """A deep copy of plain JSON data, and its size in characters; None for anything else."""
    try:
        text = _ENCODER.encode(value)
        return json.loads(text), len(text)
    except (TypeError, ValueError, RecursionError):
        return None
