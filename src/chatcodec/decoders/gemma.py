"""FunctionGemma and Gemma 4: ``call:f{key:value,...}`` with strings between escape markers.

FunctionGemma writes ``<start_function_call>call:f{k:<escape>text<escape>,n:25}<end_function_call>``;
Gemma 4 the same grammar as ``<|tool_call>call:f{k:<|"|>text<|"|>}<tool_call|>``. Keys are bare,
strings sit between two escape markers, other values are bare tokens or nested ``{...}``/``[...]``.
String arguments stream as they arrive; other values are converted to JSON once complete.
"""

from __future__ import annotations

import json

from .base import Sink
from .machine import KeyedArgsMachine, MarkerSet, Options, ThinkSpec, markers, skip_space
from .values import typed_value

__all__ = ["ESC", "GemmaMachine"]

NAME_LIMIT = 256
_dumps = json.JSONEncoder(ensure_ascii=False).encode

ESC = "<escape>"


class GemmaMachine(KeyedArgsMachine):
    """FunctionGemma: ``<start_function_call>call:f{k:<escape>text<escape>,n:25}<end_function_call>``.

    Gemma 4 writes the same grammar with other markers: ``<|tool_call>call:f{k:<|"|>text<|"|>}<tool_call|>``.
    """

    OPEN, CLOSE = "<start_function_call>", "<end_function_call>"

    def __init__(
        self,
        out: Sink,
        opts: Options,
        think: ThinkSpec | None = None,
        *,
        markers: tuple[str, str, str] = (OPEN, CLOSE, ESC),
        response: tuple[str, ...] = (),
    ) -> None:
        super().__init__(out, opts, think)
        self._open_tag, self._close_tag, self._esc_tag = markers
        self._response = response
        self._open = self.body_markers((self._open_tag,))
        self._esc = MarkerSet((self._esc_tag,))
        self._parts: list[str] = []
        self._depth = 0
        self._in_esc = False

    def s_body(self, final: bool) -> bool:
        pos = self.pos
        i, marker = self._open.find(self.buf, pos, final)
        self.emit(i)
        if marker is None:
            return i > pos
        if self.think_opens(marker):
            return True
        self.hold(i + len(marker))
        self.state = self.s_name
        return True

    def _give_up(self) -> None:
        if self.out.calling:
            self.end_call("the call is malformed")
        self.fallback()
        self.state = self.s_body

    def s_name(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        brace = buf.find("{", pos, pos + NAME_LIMIT + 8)
        if brace < 0:
            if not final and len(buf) - pos <= NAME_LIMIT + 8:
                return False
            self._give_up()
            return True
        head = buf[pos:brace].strip()
        name = head.removeprefix("call:").strip()
        if not head.startswith("call:") or not name or any(c.isspace() or c in "<>" for c in name):
            self._give_up()
            return True
        self.hold(brace + 1)
        self._name, self._writer = name, None
        self.state = self.s_args
        return True

    def s_args(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        i = skip_space(buf, pos)
        self.hold(i)
        if i >= len(buf):
            if final:
                self._give_up()
                return True
            return i > pos
        c = buf[i]
        if c == ",":
            self.hold(i + 1)
            return True
        if c == "}":
            if not self._commit():
                return True
            self.hold(i + 1)
            assert self._writer is not None
            self._writer.close()
            self.state = self.s_end
            return True
        colon = buf.find(":", i, i + NAME_LIMIT)
        if colon < 0:
            if not final and len(buf) - i < NAME_LIMIT:
                return i > pos
            self._give_up()
            return True
        key = buf[i:colon].strip()
        if not key or any(ch in '{}<>,"' or ch.isspace() for ch in key):
            self._give_up()
            return True
        if not self._commit():
            return True
        self.hold(colon + 1)
        assert self._writer is not None
        self._writer.key(key)
        self._parts, self._depth, self._in_esc = [], 0, False
        self.state = self.s_value
        return True

    def s_value(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        writer = self._writer
        assert writer is not None
        if not self._parts and self._depth == 0 and not self._in_esc:
            i = skip_space(buf, pos)
            self.hold(i)
            marker, undecided = self._esc.match(buf, i, final)
            if undecided or i >= len(buf):
                if final:
                    self._give_up()
                    return True
                return i > pos
            if marker is not None:  # a top-level string: stream it
                self.hold(i + len(self._esc_tag))
                self.state = self.s_string
                return True
        return self._scan_value(final)

    def s_string(self, final: bool) -> bool:
        assert self._writer is not None
        pos = self.pos
        i, marker = self.stream_until(self._esc, final, self._writer.string)
        if marker is None:
            if final:
                self.end_call("the output ended inside an argument value")
                self.state = self.s_body
                return True
            return i > pos
        self.hold(i + len(self._esc_tag))
        self._writer.end_string()
        self.state = self.s_args
        return True

    def _scan_value(self, final: bool) -> bool:
        """A number, literal, or nested ``{...}``/``[...]``: held until its ``,`` or ``}``."""
        buf, pos, esc = self.buf, self.pos, self._esc_tag
        i, n = pos, len(buf)
        end = -1
        while i < n:
            if self._in_esc:
                j = buf.find(esc, i)
                if j < 0:
                    i = max(i, n - len(esc) + 1)
                    break
                self._in_esc, i = False, j + len(esc)
                continue
            if buf.startswith(esc, i):
                self._in_esc, i = True, i + len(esc)
                continue
            c = buf[i]
            if c in "{[":
                self._depth += 1
            elif c in "]}" and self._depth:
                self._depth -= 1
            elif c in ",}" and not self._depth:
                end = i
                break
            elif c == esc[0] and n - i < len(esc) and esc.startswith(buf[i:]) and not final:
                break
            i += 1
        stop = end if end >= 0 else i
        self._parts.append(buf[pos:stop])
        self.hold(stop)
        if end < 0:
            if final:
                self._give_up()
                return True
            return stop > pos
        assert self._writer is not None
        self._writer.value(gemma_json("".join(self._parts), esc))
        self.state = self.s_args
        return True

    def s_end(self, final: bool) -> bool:
        found = self.marker_after_space(markers(self._close_tag), final)
        if found is None:
            return False
        i, marker = found
        if marker is not None:
            self.hold(i + len(marker))
        self.end_call()
        self.state = self.s_response if self._response else self.s_body
        return True

    def s_response(self, final: bool) -> bool:
        """Gemma 4 ends a call turn by opening the tool response (``<|tool_response>``): markup."""
        if not self.markup_after_space(markers(*self._response), final):
            return False
        self.state = self.s_body
        return True


def gemma_json(text: str, esc: str = ESC) -> str:
    """JSON for a FunctionGemma value: ``{k:v}``, ``[a,b]``, ``<escape>s<escape>``, or a bare token.

    One pass that writes JSON text with an explicit stack, so nesting depth costs no recursion; a
    closing bracket of either kind closes the innermost container, and what is missing at the end
    is closed.

    >>> gemma_json("{a:[1,<escape>x, y<escape>],b:true}")
    '{"a": [1, "x, y"], "b": true}'
    """
    s = text.strip()
    n = len(s)
    out: list[str] = []
    closers: list[str] = []  # the closing bracket of each open container, innermost last
    fresh: list[bool] = []  # per open container: nothing written in it yet
    want_key: list[bool] = []  # per open container: an object waiting for its next key
    i = 0
    while True:
        i = skip_space(s, i)
        if i >= n or (not closers and out):
            break
        if closers:
            c = s[i]
            if c in "}]":
                out.append(closers.pop())
                fresh.pop()
                want_key.pop()
                i += 1
                continue
            if c == ",":
                i += 1
                continue
            if want_key[-1]:
                colon = s.find(":", i)
                if colon < 0:
                    break
                out.append(("" if fresh[-1] else ", ") + _dumps(s[i:colon].strip().replace(esc, "")) + ": ")
                fresh[-1] = want_key[-1] = False
                i = colon + 1
                continue
            if closers[-1] == "]":
                out.append("" if fresh[-1] else ", ")
                fresh[-1] = False
            else:
                want_key[-1] = True
        if s.startswith(esc, i):
            end = s.find(esc, i + len(esc))
            end = n if end < 0 else end
            out.append(_dumps(s[i + len(esc) : end]))
            i = end + len(esc)
        elif s[i] in "{[":
            out.append(s[i])
            closers.append("}" if s[i] == "{" else "]")
            fresh.append(True)
            want_key.append(s[i] == "{")
            i += 1
        else:
            end = i
            while end < n and s[end] not in ",}]":
                end += 1
            out.append(typed_value(s[i:end].strip(), None))
            i = end
    if closers and closers[-1] == "}" and not want_key[-1] and not fresh[-1] and out[-1].endswith(": "):
        out.append("null")  # a key whose value never came
    out.extend(reversed(closers))
    return "".join(out) or '""'
