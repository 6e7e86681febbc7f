"""Python call syntax, shared by the formats that use it: ``f(a='x', b=[1, 2]), g()``.

:class:`PyCallList` reads a list of Python calls (bracketed, or bare) from a machine's buffer and
writes each call's keyword arguments as JSON: a string argument streams as it arrives; any other
literal is converted once it is complete (``None`` -> ``null``, tuples -> lists). A call is announced
at its first keyword (or at ``)`` when it has none), so a bracketed aside in prose stays content.
Used by the pythonic formats, LFM2's Python form and Llama 3.1's built-in tools.
"""

from __future__ import annotations

import json
import re

from .jsonstream import decode_quoted
from .machine import MachineBase, MarkerSet, skip_space
from .values import ArgsWriter, py_literal_json, py_unescape

__all__ = ["NAME_LIMIT", "PyCallList"]

_PY_STRUCT = re.compile(r"[\"'()\[\]{},]")
_PY_IN = {"'": re.compile(r"['\\]"), '"': re.compile(r'["\\]')}
_IDENT_END = re.compile(r"[^\w.\-]")
NAME_LIMIT = 256
_dumps = json.JSONEncoder(ensure_ascii=False).encode


def _ident_and_next(buf: str, i: int, final: bool) -> tuple[str, int] | None:
    """The identifier at ``i`` (letters, digits, ``_.-``) and the index of what follows it.

    ``(name, index after the name and up to 64 whitespace characters)``, or None while more text
    could still change either.
    """
    found = _IDENT_END.search(buf, i, i + NAME_LIMIT + 1)
    if found is None:
        if not final and len(buf) - i <= NAME_LIMIT:
            return None
        end = min(len(buf), i + NAME_LIMIT + 1)
    else:
        end = found.start()
    j = skip_space(buf, end, 64)
    if j >= len(buf) and not final:
        return None
    return buf[i:end], j


_OPEN, _CALL, _NAME, _ARGS, _KEY, _VALUE, _STRING, _AFTER_ARG, _AFTER_CALL = range(9)


class PyCallList:
    """A list of Python calls: ``[f(a=1), g()]``, or bare ``f(a=1), g()`` when not ``bracketed``.

    Same contract as :class:`~chatcodec.decoders.jsonstream.CallList`: ``done``, ``count``, ``clean``.
    """

    def __init__(self, bracketed: bool = True, stops: MarkerSet | None = None, *, name_suffix: str = "") -> None:
        self.bracketed = bracketed
        #: Llama 3.1 built-in tools call ``brave_search.call(...)``: the tool is ``brave_search``
        self.name_suffix = name_suffix
        self.stops = stops
        self.state = _OPEN if bracketed else _CALL
        self.done = self.clean = False
        self.count = 0
        self._name = ""
        self._writer: ArgsWriter | None = None
        self._quote = ""
        self._parts: list[str] = []
        self._depth = 0
        self._error: str | None = None

    def _stop(self, m: MachineBase, clean: bool = False) -> bool:
        if m.out.calling:
            m.end_call(self._error or "the call list is malformed")
            self.count += 1
        self.done, self.clean = True, clean
        return True

    def step(self, m: MachineBase, final: bool) -> bool:
        progress = False
        while not self.done:
            moved = self._step(m, final)
            if not moved:
                if final and not self.done:
                    self._error = "the output ended inside the call"
                    return self._stop(m, clean=self.state == _AFTER_CALL)
                return progress
            progress = True
        return True

    def _step(self, m: MachineBase, final: bool) -> bool:
        buf, state = m.buf, self.state
        if state == _STRING:
            return self._string(m, final)
        if state == _VALUE:
            return self._value(m, final)
        i = skip_space(buf, m.pos)
        moved = i > m.pos
        m.hold(i)
        if i >= len(buf):
            return moved
        c = buf[i]
        if state == _OPEN:
            if c != "[":
                return self._stop(m)
            m.hold(i + 1)
            self.state = _CALL
        elif state == _CALL:
            if c == "]" and self.bracketed and self.count:
                m.hold(i + 1)
                return self._stop(m, clean=True)
            if not (c.isalpha() or c == "_"):
                return self._stop(m)
            self.state = _NAME
        elif state == _NAME:
            found = _ident_and_next(buf, i, final)
            if found is None:
                return False
            name, j = found
            if j >= len(buf) or buf[j] != "(" or len(name) > NAME_LIMIT:
                return self._stop(m)
            m.hold(j + 1)
            if self.name_suffix and name.endswith(self.name_suffix):
                name = name[: -len(self.name_suffix)]
            self._name, self._writer = name, None
            self.state = _ARGS
        elif state == _ARGS:
            if c == ")":
                if not self._commit(m):
                    return self._stop(m)
                m.hold(i + 1)
                return self._end_call(m)
            found = _ident_and_next(buf, i, final)
            if found is None:
                return False
            key, j = found
            if not key or j >= len(buf) or buf[j] != "=" or not self._commit(m):
                self._error = "a positional or malformed argument"
                return self._stop(m)
            m.hold(j + 1)
            assert self._writer is not None
            self._writer.key(key)
            self.state = _KEY
        elif state == _KEY:
            if c in "'\"" and not buf.startswith(c * 3, i):
                m.hold(i + 1)
                self._quote = c
                self.state = _STRING
            else:
                self._parts, self._depth, self._quote = [], 0, ""
                self.state = _VALUE
        elif state == _AFTER_ARG:
            if c == ",":
                m.hold(i + 1)
                self.state = _ARGS
            elif c == ")":
                m.hold(i + 1)
                return self._end_call(m)
            else:
                self._error = "expected ',' or ')' after an argument"
                return self._stop(m)
        elif state == _AFTER_CALL:
            if c == ",":
                m.hold(i + 1)
                self.state = _CALL
            elif c == "]" and self.bracketed:
                m.hold(i + 1)
                return self._stop(m, clean=True)
            else:
                return self._stop(m, clean=not self.bracketed)
        return True

    def _commit(self, m: MachineBase) -> bool:
        if self._writer is None:
            if not m.commit(self._name):
                return False
            self._writer = ArgsWriter(m.out.args)
        return True

    def _end_call(self, m: MachineBase) -> bool:
        assert self._writer is not None
        self._writer.close()
        m.end_call(self._error)
        self._error = None
        self.count += 1
        self.state = _AFTER_CALL
        return True

    def _string(self, m: MachineBase, final: bool) -> bool:
        """A quoted string argument, decoded and streamed."""
        buf, start = m.buf, m.pos
        text, i, closed = decode_quoted(buf, start, len(buf), _PY_IN[self._quote], py_unescape, final)
        m.hold(i)
        assert self._writer is not None
        if text:
            self._writer.string(text)
        if closed:
            self._writer.end_string()
            self.state = _AFTER_ARG
        return i > start

    def _value(self, m: MachineBase, final: bool) -> bool:
        """Any other literal: held until it is complete, then converted to JSON."""
        buf, start = m.buf, m.pos
        n, i = len(buf), start
        end = -1
        while i < n:
            if self._quote:
                found = _PY_IN[self._quote].search(buf, i)
                if found is None:
                    i = n
                    break
                j = found.start()
                if buf[j] == "\\":
                    i = j + 2
                    if i > n:
                        i = j
                        break
                    continue
                self._quote, i = "", j + 1
                continue
            found = _PY_STRUCT.search(buf, i)
            if found is None:
                i = n
                break
            j, c = found.start(), found.group()
            if c in "'\"":
                self._quote = c
            elif c in "([{":
                self._depth += 1
            elif c in ")]}" and self._depth:
                self._depth -= 1
            elif c in ",)" and not self._depth:
                end = j
                break
            i = j + 1
        stop = end if end >= 0 else i
        self._parts.append(buf[start:stop])
        m.hold(stop)
        if end < 0 and not final:
            return stop > start
        text = "".join(self._parts).strip()
        converted = py_literal_json(text)
        if converted is None:
            if not text.replace("_", "a").replace(".", "a").isalnum():
                self._error = f"an argument that is not a Python literal: {text[:40]!r}"
            converted = _dumps(text)
        assert self._writer is not None
        self._writer.value(converted)
        self.state = _AFTER_ARG
        return True
