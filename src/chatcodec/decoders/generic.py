"""Whole-output JSON envelopes and recipient lines: llama.cpp's generic format and Functionary v3.2.

Generic (templates with no tool syntax of their own, output constrained by a grammar):
``{"tool_calls": [{"name", "arguments", "id"}]}``, ``{"tool_call": {...}}`` or ``{"response": "..."}``,
where the response string is decoded and streamed as content.

Functionary v3.2: each message starts with its recipient on a line of its own: ``all`` for the user,
a tool name for a call (JSON arguments, or raw code for ``python``); ``>>>`` starts the next one.
"""

from __future__ import annotations

from .base import Sink
from .jsonstream import CallKeys, CallList, CallObject, JsonString, JsonValue
from .machine import MachineBase, MarkerSet, Options, ThinkSpec, skip_space
from .values import ArgsWriter, valid_name

__all__ = ["FunctionaryMachine", "GenericMachine"]


class GenericMachine(MachineBase):
    """``{"tool_calls": [...]}`` / ``{"tool_call": {...}}`` / ``{"response": "..."}``, else plain text."""

    def __init__(self, out: Sink, opts: Options, think: ThinkSpec | None = None) -> None:
        super().__init__(out, opts, think)
        self._key: list[str] = []
        self._sub: JsonString | CallObject | CallList | None = None
        self._made = False  # the envelope produced content or calls: its syntax is markup
        self._thinks = self.body_markers(())

    def s_body(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        i = skip_space(buf, pos)
        self.hold(i)  # held with the envelope that may follow; content if none does
        if i >= len(buf) and not final:
            return i > pos
        if i < len(buf) and buf[i] == "{":
            self.hold(i + 1)
            self.state = self.s_key
        else:
            self.fallback()
            self.state = self.s_text
        return True

    def s_text(self, final: bool) -> bool:
        pos = self.pos
        i, marker = self._thinks.find(self.buf, pos, final)
        self.emit(i)
        if marker is not None and self.think_opens(marker):
            return True
        return i > pos

    def _not_generic(self) -> None:
        if self._made:
            self.markup_held()
        else:
            self.fallback()
        self.state = self.s_text

    def s_key(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        i = skip_space(buf, pos)
        self.hold(i)
        if i >= len(buf):
            if final:
                self._not_generic()
            return final or i > pos
        if buf[i] != '"':
            if buf[i] == "}":
                self.hold(i + 1)
            self._not_generic()
            return True
        self._key = []
        self._sub = JsonString(self._key.append, 64)
        self.state = self.s_key_text
        return True

    def s_key_text(self, final: bool) -> bool:
        sub = self._sub
        assert isinstance(sub, JsonString)
        moved = sub.step(self, final)
        if not sub.done:
            return moved
        self.state = self.s_colon
        return True

    def s_colon(self, final: bool) -> bool:
        sub = self._sub
        assert isinstance(sub, JsonString)
        key = "".join(self._key)
        pos = self.pos
        i = skip_space(self.buf, pos)
        self.hold(i)
        if i >= len(self.buf) and not final:
            return i > pos
        if sub.bad or i >= len(self.buf) or self.buf[i] != ":" or key not in ("response", "tool_call", "tool_calls"):
            self._not_generic()
            return True
        self.hold(i + 1)
        j = skip_space(self.buf, self.pos)
        self.hold(j)
        if key == "response":
            # Decoded into content as it arrives; the envelope's own text becomes markup below.
            self._sub = JsonString(lambda text: self.out.content(text, traced=False))
        elif key == "tool_call":
            self._sub = CallObject(CallKeys())
        else:
            self._sub = CallList(CallKeys())
        self.state = self.s_value
        return True

    def s_value(self, final: bool) -> bool:
        sub = self._sub
        assert sub is not None
        moved = sub.step(self, final)
        if not sub.done:
            return moved
        if isinstance(sub, JsonString):
            if sub.bad:
                self._not_generic()
                return True
            self._made = True
            self.markup_held()
        elif isinstance(sub, CallObject):
            if sub.failed:
                self._not_generic()
                return True
            self.end_call(sub.error)
            self._made = True
        elif sub.count == 0:
            self._not_generic()
            return True
        else:
            self._made = True
        self.state = self.s_after
        return True

    def s_after(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        i = skip_space(buf, pos)
        self.hold(i)
        if i >= len(buf):
            if final:
                self._not_generic()
            return final or i > pos
        if buf[i] == ",":
            self.hold(i + 1)
            self.state = self.s_key
        else:
            if buf[i] == "}":
                self.hold(i + 1)
            self._not_generic()
        return True


class FunctionaryMachine(MachineBase):
    """Functionary v3.2: ``all\\ntext``, ``name\\n{json}``, ``python\\ncode``; ``>>>`` between messages."""

    SEP = ">>>"

    def __init__(self, out: Sink, opts: Options, think: ThinkSpec | None = None) -> None:
        super().__init__(out, opts, think)
        self._sep = MarkerSet((self.SEP,))
        self._name = ""
        self._args: JsonValue | None = None
        self._writer: ArgsWriter | None = None

    def s_body(self, final: bool) -> bool:
        """A recipient line."""
        buf, pos = self.buf, self.pos
        nl = buf.find("\n", pos, pos + 130)
        if nl < 0:
            if not final and len(buf) - pos < 130:
                return False
            self.state = self.s_all
            return True
        recipient = buf[pos:nl].strip().removeprefix(self.SEP).strip()
        if recipient == "all":
            self.markup(nl + 1)
            self.state = self.s_all
        elif valid_name(recipient):
            self.hold(nl + 1)
            self._name = recipient
            self.state = self.s_call
        else:
            self.state = self.s_all
        return True

    def s_all(self, final: bool) -> bool:
        pos = self.pos
        i, marker = self._sep.find(self.buf, pos, final)
        self.emit(i)
        if marker is None:
            return i > pos
        self.markup(i + len(marker))
        self.state = self.s_body
        return True

    def s_call(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        i = skip_space(buf, pos)
        self.hold(i)
        if i >= len(buf) and not final:
            return i > pos
        if i < len(buf) and buf[i] == "{" and self.commit(self._name):
            self._args = JsonValue(self.out.args, self._sep, python=True)
            self.state = self.s_json
        elif self._name == "python" and self.commit(self._name):
            self._writer = ArgsWriter(self.out.args)
            self._writer.key("code")
            self.state = self.s_code
        else:
            self.fallback()
            self.state = self.s_all
        return True

    def s_json(self, final: bool) -> bool:
        args = self._args
        assert args is not None
        moved = args.step(self, final)
        if not args.done:
            return moved
        self.end_call("the arguments were cut off" if args.truncated or args.stopped else None)
        self.state = self.s_all
        return True

    def s_code(self, final: bool) -> bool:
        writer, pos = self._writer, self.pos
        assert writer is not None
        i, marker = self.stream_until(self._sep, final, writer.string)
        if marker is None and not final:
            return i > pos
        writer.end_string()
        writer.close()
        self.end_call()
        self.state = self.s_all
        return True
