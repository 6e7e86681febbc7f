"""Incremental JSON: a structural scanner, a string decoder, and tool-call sub-parsers built on them.

The scanner never decodes what it streams. It tracks only what it must (inside a string or not, a
pending escape, the bracket depth) and passes the model's bytes through verbatim, so streamed
arguments equal the final arguments byte for byte. Validity is checked once, when the call ends, by
the C JSON parser. Each sub-parser has ``step(machine, final) -> bool`` and a ``done`` flag; it
consumes from ``machine.buf`` at ``machine.pos`` and routes what it consumed through
``machine.hold`` (held while the call is uncommitted, the call's raw text after).

A structural scanner treats a format's end markers (``stops``) as the end of a call even when the
JSON is unbalanced, but only outside strings, so a JSON string may contain ``</tool_call>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from .machine import MachineBase, MarkerSet, skip_space
from .values import py_unescape

__all__ = [
    "CallKeys",
    "CallList",
    "CallObject",
    "HeaderParser",
    "JsonString",
    "JsonValue",
    "NamedCall",
    "decode_quoted",
]

_IN_STRING = re.compile(r'["\\]')
_PY_IN_SINGLE = re.compile(r"['\\]")
_WORD = re.compile(r"\w+")
_PY_WORDS = {"True": "true", "False": "false", "None": "null"}
#: what may open a string: JSON's double quote, or a Python single quote
QUOTES = "\"'"
_dumps = json.JSONEncoder(ensure_ascii=False).encode
_SCALAR_END = re.compile(r"[^\w.+-]")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")

Emit = Callable[[str], None]


def _take(m: MachineBase, j: int) -> str:
    """Consume ``buf[pos:j]`` into the current call construct and return it."""
    text = m.buf[m.pos : j]
    m.hold(j)
    return text


class _Scanner:
    """How :class:`JsonValue` and :class:`JsonString` start and end.

    Whitespace before the value is held with it; text that ends before the value is complete leaves
    it ``truncated``.
    """

    __slots__ = ("done", "started", "truncated")

    done: bool
    started: bool
    truncated: bool

    def _skip_lead(self, m: MachineBase) -> int:
        """Until the value has started, hold the whitespace before it; where scanning goes on."""
        if not self.started:
            m.hold(skip_space(m.buf, m.pos))
        return m.pos

    def _eof(self, final: bool) -> bool:
        """At the end of the text an unfinished value is truncated: True when that happens now."""
        if final and not self.done:
            self.done = self.truncated = True
            return True
        return False


class JsonValue(_Scanner):
    """Scan one JSON value (object, array, string or scalar) and pass its text to ``emit``.

    With ``python``, Python literal syntax is turned into JSON on the way: single-quoted strings
    become JSON strings, ``True``/``False``/``None`` become ``true``/``false``/``null``. Text that is
    already JSON passes through byte for byte, as without it. (Templates that print arguments with
    Python's ``repr`` teach models to answer ``{'city': 'Paris'}``.)

    After ``done``: ``stopped`` if a stop marker cut the value, ``truncated`` if the text ended first.
    """

    __slots__ = (
        "_outside",
        "_parts",
        "_stops",
        "depth",
        "emit",
        "esc",
        "in_str",
        "python",
        "quote",
        "scalar",
        "stopped",
    )

    def __init__(self, emit: Emit | None = None, stops: MarkerSet | None = None, *, python: bool = False) -> None:
        self.emit = emit
        self.python = python
        self._stops = stops if stops is not None and stops.markers else None
        chars = '"{}[]' + ("'TFN" if python else "")
        if self._stops:
            chars += "".join(m[0] for m in self._stops.markers)
        self._outside = _outside_pattern(chars)
        self.depth = 0
        self.quote = '"'
        self.in_str = self.esc = self.scalar = self.started = False
        self.done = self.stopped = self.truncated = False
        self._parts: list[str] = []  # converted output of the current step, when Python syntax came

    def step(self, m: MachineBase, final: bool) -> bool:
        if self.done or (m.pos >= len(m.buf) and not final):
            return False
        buf = m.buf
        n = len(buf)
        start = mark = i = self._skip_lead(m)
        if not self.started:
            if i >= n:
                return self._eof(final)
            self.started = True
            c = buf[i]
            if c in "{[":
                self.depth, i = 1, i + 1
            elif c == '"':
                self.in_str, i = True, i + 1
            elif c == "'" and self.python:
                self._parts.append('"')
                self.in_str, self.quote, i = True, "'", i + 1
                mark = i
            else:
                self.scalar = True
        if self.scalar:
            found = _SCALAR_END.search(buf, i)
            i = found.start() if found else n
            if found or final:
                self.done = True
        else:
            i, mark = self._scan(buf, i, final, mark)
        if i > start:
            text = _take(m, i)
            if self._parts:
                self._parts.append(buf[mark:i])
                text = "".join(self._parts)
                self._parts.clear()
            if self.emit is not None and text:
                self.emit(text)
        if m.pos >= n and self._eof(final):
            return True
        return i > start or self.done

    def _scan(self, buf: str, i: int, final: bool, mark: int) -> tuple[int, int]:
        """Scan from ``i``: ``(index reached, start of the text not yet copied to _parts)``."""
        n = len(buf)
        while i < n:
            if self.esc:
                self.esc, i = False, i + 1
            elif self.in_str and self.quote == "'":
                i, mark, closed = self._py_string(buf, i, final, mark)
                if not closed:
                    return i, mark
                if self.depth == 0:
                    self.done = True
                    return i, mark
            elif self.in_str:
                found = _IN_STRING.search(buf, i)
                if found is None:
                    return n, mark
                j = found.start()
                if buf[j] == "\\":
                    if j + 1 < n:
                        i = j + 2
                    else:
                        self.esc, i = True, n
                else:
                    self.in_str, i = False, j + 1
                    if self.depth == 0:
                        self.done = True
                        return i, mark
            else:
                found = self._outside.search(buf, i)
                if found is None:
                    return n, mark
                j = found.start()
                c = buf[j]
                if self._stops is not None:
                    marker, undecided = self._stops.match(buf, j, final)
                    if marker is not None:
                        self.done = self.stopped = True
                        return j, mark
                    if undecided:
                        return j, mark
                if c == '"':
                    self.in_str = True
                elif c in "{[":
                    self.depth += 1
                elif c in "}]":
                    self.depth -= 1
                    if self.depth == 0:
                        self.done = True
                        return j + 1, mark
                elif c == "'" and self.python:
                    self._parts += (buf[mark:j], '"')
                    self.in_str, self.quote, mark = True, "'", j + 1
                elif c in "TFN" and self.python and (j == 0 or not buf[j - 1].isalnum()):
                    word = _WORD.match(buf, j)
                    k = word.end() if word else j + 1
                    if k >= n and not final and k - j < 5:
                        return j, mark  # True, False or None may still be arriving
                    literal = _PY_WORDS.get(buf[j:k])
                    if literal is not None:
                        self._parts += (buf[mark:j], literal)
                        mark = k
                    i = k
                    continue
                i = j + 1
        return n, mark

    def _py_string(self, buf: str, i: int, final: bool, mark: int) -> tuple[int, int, bool]:
        """Inside a single-quoted string: write it as JSON up to its end (closed) or the end of ``buf``."""
        parts = self._parts
        if mark < i:
            parts.append(buf[mark:i])
        n = len(buf)
        while i < n:
            found = _PY_IN_SINGLE.search(buf, i)
            j = found.start() if found else n
            if j > i:
                parts.append(_dumps(buf[i:j])[1:-1])
            if j >= n:
                return n, n, False
            if buf[j] == "'":
                parts.append('"')
                self.in_str, self.quote = False, '"'
                return j + 1, j + 1, True
            decoded = py_unescape(buf, j, final)
            if decoded is None:
                return j, j, False  # an escape still arriving
            parts.append(_dumps(decoded[0])[1:-1])
            i = decoded[1]
        return n, n, False


_OUTSIDE_CACHE: dict[str, re.Pattern[str]] = {}


def _outside_pattern(chars: str) -> re.Pattern[str]:
    key = "".join(sorted(set(chars)))
    pattern = _OUTSIDE_CACHE.get(key)
    if pattern is None:
        pattern = _OUTSIDE_CACHE[key] = re.compile("[" + re.escape(key) + "]")
    return pattern


def decode_escape(buf: str, j: int, final: bool) -> tuple[str, int] | None:
    """Decode the JSON escape at ``buf[j]`` (a backslash): ``(text, next index)``, None if incomplete.

    Unknown escapes and broken ``\\u`` sequences are kept verbatim; a lone surrogate becomes U+FFFD.
    """
    n = len(buf)
    if j + 1 >= n:
        return (buf[j:], n) if final else None
    c = buf[j + 1]
    if c != "u":
        return _ESCAPES.get(c, buf[j : j + 2]), j + 2
    if j + 6 > n:
        return (buf[j:], n) if final else None
    digits = buf[j + 2 : j + 6]
    if not all(d in _HEX for d in digits):
        return buf[j : j + 2], j + 2
    code = int(digits, 16)
    if 0xD800 <= code < 0xDC00:
        low = buf[j + 6 : j + 12]
        if len(low) < 6 and not final and "\\u".startswith(low[:2]) and all(d in _HEX for d in low[2:]):
            return None
        if len(low) == 6 and low.startswith("\\u") and all(d in _HEX for d in low[2:]):
            second = int(low[2:], 16)
            if 0xDC00 <= second < 0xE000:
                return chr(0x10000 + ((code - 0xD800) << 10) + (second - 0xDC00)), j + 12
        return "\ufffd", j + 6
    if 0xDC00 <= code < 0xE000:
        return "\ufffd", j + 6
    return chr(code), j + 6


Unescape = Callable[[str, int, bool], "tuple[str, int] | None"]


def decode_quoted(
    buf: str, i: int, end: int, stops: re.Pattern[str], unescape: Unescape, final: bool
) -> tuple[str, int, bool]:
    """Decode the text of a quoted string from ``buf[i:end]``: ``(text, index reached, closed)``.

    ``stops`` finds the closing quote or a backslash; ``unescape`` decodes the escape at a backslash,
    or returns None when it is incomplete, which ends the text early. ``closed``: the closing quote
    was reached (the index is past it).
    """
    parts: list[str] = []
    while i < end:
        found = stops.search(buf, i, end)
        j = found.start() if found else end
        if j > i:
            parts.append(buf[i:j])
            i = j
        if j >= end:
            break
        if buf[j] != "\\":
            return "".join(parts), j + 1, True
        decoded = unescape(buf, j, final)
        if decoded is None:
            break
        parts.append(decoded[0])
        i = decoded[1]
    return "".join(parts), i, False


class JsonString(_Scanner):
    """Decode one JSON string as it arrives and pass the decoded text to ``emit``.

    A single-quoted Python string is read too (its escapes are Python's). With ``limit``, the raw
    string may be at most that long (for names and ids); longer is ``bad``.
    """

    __slots__ = ("_size", "_stops", "_unescape", "bad", "emit", "limit")

    def __init__(self, emit: Emit, limit: int | None = None) -> None:
        self.emit = emit
        self.limit = limit
        self._size = 0
        self._stops = _IN_STRING
        self._unescape: Unescape = decode_escape
        self.started = self.done = self.bad = self.truncated = False

    def step(self, m: MachineBase, final: bool) -> bool:
        if self.done:
            return False
        buf = m.buf
        n = len(buf)
        start = i = self._skip_lead(m)
        if not self.started:
            if i >= n:
                return self._eof(final)
            if buf[i] not in QUOTES:
                self.done = self.bad = True
                return True
            if buf[i] == "'":
                self._stops, self._unescape = _PY_IN_SINGLE, py_unescape
            self.started, i = True, i + 1
        if self.limit is not None:  # a capped string fails at a fixed length
            n = min(n, start + self.limit - self._size + 1)
        text, i, self.done = decode_quoted(buf, i, n, self._stops, self._unescape, final)
        self._size += i - start
        if self.limit is not None and self._size > self.limit:
            _take(m, i)
            self.done = self.bad = True
            return True
        if i > start:
            _take(m, i)
            if text:
                self.emit(text)
        if m.pos >= n and self._eof(final):
            return True
        return i > start or self.done


@dataclass(frozen=True, slots=True)
class CallKeys:
    """How a format spells a call object's fields."""

    name: tuple[str, ...] = ("name",)
    args: tuple[str, ...] = ("arguments", "parameters")
    ids: tuple[str, ...] = ("id",)
    #: other keys allowed before the call is known to be one
    tolerated: tuple[str, ...] = ("type",)
    #: Apertus: ``{"f": {...}}``, the only key is the name and its value the arguments
    name_as_key: bool = False
    #: bare JSON in prose: an object without arguments is not a call
    need_args: bool = False
    #: bare JSON in prose: the object must start with the name
    name_first: bool = False


_OPEN, _KEY_OR_END, _KEY, _COLON, _VALUE_START, _VALUE, _AFTER, _END = range(8)
NAME_LIMIT = 512


class CallObject:
    """Parse ``{"name": ..., "arguments": ...}`` and stream its arguments.

    The call is committed when its arguments begin and the name is known; the arguments then stream
    verbatim. If the arguments come first, the object is held until it closes (the slow path).
    After ``done``: ``failed`` means it was not a call (nothing committed; the owner falls back),
    otherwise the call is open on the sink and ``error`` says whether it is damaged. The owner ends it.
    """

    def __init__(self, keys: CallKeys, stops: MarkerSet | None = None, *, defer: bool = False) -> None:
        self.keys = keys
        self.stops = stops
        self.defer = defer
        self.state = _OPEN
        self.done = self.failed = False
        self.error: str | None = None
        self.name: str | None = None
        self.id: str | None = None
        self.args: str | None = None  # argument text captured on the slow path (or when deferred)
        self.args_done = False
        self._first = True
        self._role = ""
        self._parts: list[str] = []
        self._sub: JsonValue | JsonString | None = None

    def _fail(self, m: MachineBase, why: str) -> bool:
        self.done = True
        if m.out.calling:
            if not self.args_done:
                self.error = why
        else:
            self.failed = True
        return True

    def step(self, m: MachineBase, final: bool) -> bool:
        progress = False
        while not self.done:
            buf = m.buf
            if self.state in (_VALUE, _KEY):
                assert self._sub is not None
                moved = self._sub.step(m, final)
                progress = progress or moved
                if not self._sub.done:
                    return progress
                self._value_done(m) if self.state == _VALUE else self._key_done(m)
                continue
            i = skip_space(buf, m.pos)
            if i > m.pos:
                m.hold(i)
                progress = True
            if i >= len(buf):
                if final:
                    return self._eof(m) or progress
                return progress
            c = buf[i]
            if self.state == _OPEN:
                if c != "{":
                    return self._fail(m, "expected a JSON object")
                m.hold(i + 1)
                self.state = _KEY_OR_END
            elif self.state == _KEY_OR_END:
                if c == "}" and not self._first:
                    return self._fail(m, "a comma before the closing brace")
                if c == "}":
                    m.hold(i + 1)
                    self._close(m)
                elif c in QUOTES:
                    self._parts = []
                    self._sub = JsonString(self._parts.append, 256)
                    self.state = _KEY
                else:
                    return self._fail(m, "expected a key")
            elif self.state == _COLON:
                if c != ":":
                    return self._fail(m, "expected ':'")
                m.hold(i + 1)
                self.state = _VALUE_START
            elif self.state == _VALUE_START:
                if not self._start_value(m, c):
                    return True
            elif self.state == _AFTER:
                if c == ",":
                    m.hold(i + 1)
                    self.state = _KEY_OR_END
                elif c == "}":
                    m.hold(i + 1)
                    self._close(m)
                else:
                    return self._fail(m, "expected ',' or '}'")
            progress = True
        return True

    def _key_done(self, m: MachineBase) -> None:
        assert isinstance(self._sub, JsonString)
        if self._sub.bad or self._sub.truncated:
            self._fail(m, "a broken key")
            return
        key = "".join(self._parts)
        keys, first = self.keys, self._first
        self._first = False
        self.state = _COLON
        if keys.name_as_key:
            self._role = "named" if first else "skip"
            self.name = key if first else self.name
        elif key in keys.name:
            self._role = "name"
        elif key in keys.args:
            self._role = "skip" if self.args_done or self.args is not None else "args"
        elif key in keys.ids:
            self._role = "id"
        elif m.out.calling or key in keys.tolerated:
            self._role = "skip"
        else:
            self._fail(m, "an unknown key")
        if first and keys.name_first and self._role != "name":
            self._fail(m, "the object does not start with a name")

    def _start_value(self, m: MachineBase, c: str) -> bool:
        role = self._role
        self._parts = []
        if role in ("name", "id"):
            if c in QUOTES:
                self._sub = JsonString(self._parts.append, NAME_LIMIT)
            elif role == "id":
                self._sub = JsonValue(self._parts.append)
            else:
                self._fail(m, "the name is not a string")
                return False
        elif role in ("args", "named"):
            if self.name is not None and not self.defer:
                if not m.commit(self.name, self.id):
                    self._fail(m, "an undeclared tool name")
                    return False
                if c == '"':
                    self._sub = JsonString(m.out.args)
                else:
                    self._sub = JsonValue(m.out.args, self.stops, python=True)
            else:
                self._role = "captured"
                self._sub = JsonValue(self._parts.append, self.stops, python=True)
        else:
            self._sub = JsonValue(None, self.stops)
        self.state = _VALUE
        return True

    def _value_done(self, m: MachineBase) -> None:
        sub, role = self._sub, self._role
        assert sub is not None
        broken = isinstance(sub, JsonString) and sub.bad
        cut = sub.truncated or (isinstance(sub, JsonValue) and sub.stopped)
        self.state = _AFTER
        if role in ("args", "named"):
            self.args_done = not cut
            if cut:
                self._fail(m, "the arguments were cut off")
            return
        if broken or cut:
            self._fail(m, f"a broken {role} value")
            return
        value = "".join(self._parts)
        if role == "name":
            self.name = value
        elif role == "id" and not m.out.calling:
            # An id written after the arguments began comes too late: the stream has announced the
            # call with its id already, and a client must not see two. It stays in the call's raw text.
            self.id = value
        elif role == "captured":
            self.args = value

    def _close(self, m: MachineBase) -> None:
        self.done = True
        self.state = _END
        if m.out.calling or self.defer:
            return
        if self.name is None or (self.args is None and self.keys.need_args) or not m.commit(self.name, self.id):
            self.failed = True
        else:
            m.out.args(self.args if self.args is not None else "{}")
            self.args_done = True

    def _eof(self, m: MachineBase) -> bool:
        if m.out.calling:
            self.done = True
            if not self.args_done:
                self.error = "the output ended inside the tool call"
            return True
        if self.name is not None and self.args is not None:
            self._close(m)
        else:
            self.done = self.failed = True
        return True


class CallList:
    """Parse a JSON array of call objects; each call is committed and ended in turn.

    After ``done``: ``count`` calls were made. ``clean`` if the array closed properly; otherwise the
    text from the failure point on is left in the buffer (and what was held since the last call is
    for the owner to release).
    """

    def __init__(self, keys: CallKeys, stops: MarkerSet | None = None) -> None:
        self.keys = keys
        self.stops = stops
        self.state = _OPEN
        self.done = self.clean = False
        self.count = 0
        self._obj: CallObject | None = None

    def step(self, m: MachineBase, final: bool) -> bool:
        progress = False
        while not self.done:
            if self._obj is not None:
                moved = self._obj.step(m, final)
                progress = progress or moved
                if not self._obj.done:
                    return progress
                obj, self._obj = self._obj, None
                if obj.failed:
                    self.done = True
                    return True
                m.end_call(obj.error)
                self.count += 1
                self.state = _AFTER
                continue
            buf = m.buf
            i = skip_space(buf, m.pos)
            if i > m.pos:
                m.hold(i)
                progress = True
            if i >= len(buf):
                if final:
                    self.done = True
                return progress or final
            c = buf[i]
            if self.state == _OPEN:
                if c != "[":
                    self.done = True
                    return True
                m.hold(i + 1)
                self.state = _KEY_OR_END
            elif self.state == _KEY_OR_END:
                if c == "]" and self.count == 0:
                    m.hold(i + 1)
                    self.done = True
                elif c == "{":
                    self._obj = CallObject(self.keys, self.stops)
                else:
                    self.done = True
            elif self.state == _AFTER:
                if c == ",":
                    m.hold(i + 1)
                    self.state = _KEY_OR_END
                elif c == "{":  # the previous object lost its closing brace or comma: go on
                    self._obj = CallObject(self.keys, self.stops)
                else:
                    if c == "]":
                        m.hold(i + 1)
                        self.clean = True
                    self.done = True
            progress = True
        return True


HeaderParser = Callable[[str], "tuple[str, str | None] | None"]


class NamedCall:
    """A call written as a header (name, maybe an id) followed by JSON arguments.

    The header runs up to the first ``{``; ``parse`` turns it into ``(name, id)`` or None. A stop
    marker before any ``{`` ends a call without arguments, which then gets ``{}``. After ``done``:
    ``failed`` if it was not a call, else the call is open and ``error`` tells if it is damaged.
    """

    HEADER_LIMIT = 512

    def __init__(self, parse: HeaderParser, stops: MarkerSet | None = None) -> None:
        self.parse = parse
        self.stops = stops
        self.done = self.failed = False
        self.error: str | None = None
        self._header: list[str] = []
        self._size = 0
        self._args: JsonValue | None = None

    def step(self, m: MachineBase, final: bool) -> bool:
        if self._args is not None:
            moved = self._args.step(m, final)
            if self._args.done:
                self.done = True
                if self._args.truncated or self._args.stopped:
                    self.error = "the arguments were cut off"
            return moved or self.done
        buf, pos = m.buf, m.pos
        limit = pos + self.HEADER_LIMIT - self._size  # the header fails at a fixed length
        brace = buf.find("{", pos, limit + 1)
        end = brace if brace >= 0 else min(len(buf), limit + 1)
        stop_at, marker = self.stops.find(buf, pos, final, end) if self.stops else (len(buf), None)
        if stop_at < end:
            end = stop_at
        else:
            marker = None
        if end > pos:
            self._header.append(buf[pos:end])
            self._size += end - pos
            m.hold(end)
        if end > limit:
            self.done = self.failed = True
            return True
        if end == brace or marker is not None:
            header = self.parse("".join(self._header))
            if header is None or not m.commit(*header):
                self.done = self.failed = True
                return True
            if end == brace:
                self._args = JsonValue(m.out.args, self.stops, python=True)
            else:  # an explicit end right after the header: a call without arguments
                m.out.args("{}")
                self.done = True
            return True
        if final and end >= len(buf):  # the text ended inside the header: not a call
            self.done = self.failed = True
            return True
        return end > pos
