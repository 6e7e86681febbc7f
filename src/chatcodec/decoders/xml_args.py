"""XML-style calls: one tag per argument, raw values typed from the tool schema.

Qwen3-Coder and Nemotron 3 (``<function=f><parameter=k>v</parameter>``), Seed-OSS, GLM 4.5+
(``<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value>``), MiniMax-M2 (``<invoke name="f">``)
and DeepSeek's DSML. Values are raw text, not XML: ``&&`` and ``a < b`` are kept as written, and a
closing tag counts only when what follows it continues the call (another argument, the end of the
function, or the end of the text), so a value may contain ``</tool_call>`` or even ``</parameter>``.

Arguments are written as JSON while they arrive: ``{"k": `` once the key is known, string values
streamed with JSON escaping (surrounding whitespace trimmed), other types once their value is closed.
A call is announced at its first argument (or its end, for calls without arguments), so a stray
``<function=x>`` in prose never becomes a call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import Sink, hold_trailing_space
from .machine import KeyedArgsMachine, MarkerSet, Options, ThinkSpec, markers, skip_space
from .values import ArgsWriter, could_be_json, typed_value

__all__ = ["XmlMachine", "XmlSpec"]

TAG_LIMIT = 256
_TAG_STOP = re.compile(r"[<>\n]")


@dataclass(frozen=True, slots=True)
class XmlSpec:
    """The tags of one XML-style format.

    Tag prefixes that end in ``=`` hold the name right after them (``<function=f>``); others carry
    attributes (``<invoke name="f">``). ``call_open=None`` means the name follows the block opener
    directly, up to a newline or the first argument (GLM).
    """

    block_open: tuple[str, ...]
    block_close: tuple[str, ...]
    call_open: str | None
    call_close: str | None
    param_open: str
    param_close: str
    #: GLM: the key is closed by this tag and the value opened by ``value_open``
    key_close: str | None = None
    value_open: str | None = None
    #: Qwen3-Coder models sometimes drop the ``<tool_call>`` opener
    bare_call: bool = False
    many_calls: bool = False
    #: a learned format: the name is the text from ``call_open`` up to this marker
    name_close: str | None = None


def parse_attrs(text: str) -> dict[str, str]:
    """``name="f" string="true"`` -> ``{"name": "f", "string": "true"}`` (a linear scan, no regex)."""
    attrs: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0:
            break
        key = text[i:eq].strip()
        j = eq + 1
        if j < n and text[j] in "\"'":
            end = text.find(text[j], j + 1)
            if end < 0:
                break
            attrs[key] = text[j + 1 : end]
            i = end + 1
        else:
            end = j
            while end < n and not text[end].isspace():
                end += 1
            attrs[key] = text[j:end]
            i = end
    return attrs


class _Value:
    """One argument value: trimmed, typed, and written as soon as it is certain."""

    __slots__ = ("_digits", "_first", "_gap", "_parts", "_word", "_ws", "kind", "mode", "writer")

    def __init__(self, writer: ArgsWriter, kind: str | None) -> None:
        self.writer = writer
        self.kind = kind
        # string: stream it; parsed: hold until closed; open: no schema, undecided until it cannot be JSON
        self.mode = "string" if kind == "string" else "parsed" if kind is not None else "open"
        self._parts: list[str] = []
        self._ws: list[str] = []
        self._first = ""
        self._word = ""
        self._gap = False
        self._digits = True

    def feed(self, text: str) -> None:
        if not self._first:
            text = text.lstrip()
            if not text:
                return
            self._first = text[0]
        if self.mode == "string":
            self._stream(text)
            return
        self._parts.append(text)
        if self.mode == "open" and not self._still_json(text):
            self.mode = "string"
            held = "".join(self._parts)
            self._parts.clear()
            self._stream(held)

    def _still_json(self, text: str) -> bool:
        if self._first in '{["':
            return True
        if self._first in "-0123456789":
            self._digits = self._digits and all(c in "0123456789+-.eE" or c.isspace() for c in text)
            return self._digits
        # true / false / null, with nothing but whitespace after the word
        for c in text:
            if c.isspace():
                self._gap = bool(self._word)
            elif self._gap or len(self._word) >= 5:
                return False
            else:
                self._word += c
        return could_be_json(self._word)

    def _stream(self, text: str) -> None:
        body = hold_trailing_space(text, self._ws)
        if body:
            self.writer.string(body)

    def close(self) -> None:
        if self.mode == "string":
            self.writer.end_string()
        else:
            self.writer.value(typed_value("".join(self._parts).strip(), self.kind))


class XmlMachine(KeyedArgsMachine):
    """The state machine for every :class:`XmlSpec` format."""

    def __init__(self, out: Sink, opts: Options, spec: XmlSpec, think: ThinkSpec | None = None) -> None:
        super().__init__(out, opts, think)
        self.spec = spec
        opens = [*spec.block_open, *([spec.call_open] if spec.bare_call and spec.call_open else [])]
        self._openers = self.body_markers(opens)
        self._block_close = MarkerSet(spec.block_close)
        self._call_open = MarkerSet([spec.call_open] if spec.call_open else [])
        in_call = [spec.param_open, *([spec.call_close] if spec.call_close else spec.block_close)]
        self._in_call = MarkerSet(in_call)
        self._name_end = MarkerSet(["\n", spec.param_open, *spec.block_close]) if spec.call_open is None else None
        self._key_end = MarkerSet(
            [
                spec.key_close or ">",
                spec.param_open,
                spec.param_close,
                *([spec.value_open] if spec.value_open else []),
            ]
        )
        enders = [spec.param_close, spec.param_open, *([spec.call_close] if spec.call_close else [])]
        self._enders = MarkerSet(enders)
        after_param = (spec.param_open, *([spec.call_close] if spec.call_close else ()), *spec.block_close)
        self._follow = {spec.param_close: MarkerSet(after_param)}
        if spec.call_close and spec.call_open:
            self._follow[spec.call_close] = MarkerSet((*spec.block_close, spec.call_open))
        self._text: list[str] = []
        self._calls = 0
        self._in_block = False
        self._value: _Value | None = None

    # -- content and blocks --------------------------------------------------------------------

    def s_body(self, final: bool) -> bool:
        pos = self.pos
        i, marker = self._openers.find(self.buf, pos, final)
        self.emit(i)
        if marker is None:
            return i > pos
        if self.think_opens(marker):
            return True
        self._calls = 0
        if marker in self.spec.block_open:
            self.hold(i + len(marker))
            self._in_block = True
            self.state = self.s_block
        else:  # a bare <function= without its <tool_call>
            self._in_block = False
            self._start_call(i + len(marker))
        return True

    def s_block(self, final: bool) -> bool:
        """Inside a call block, between calls."""
        spec, buf, pos = self.spec, self.buf, self.pos
        i = skip_space(buf, pos)
        self.hold(i)
        if i >= len(buf):
            if final:
                self._end_block(clean=False)
                return True
            return i > pos
        if spec.call_open is None:
            if self._calls:
                return self._close_block(i, final) or i > pos
            self._text = []
            self.state = self.s_line_name
            return True
        if self._calls == 0 or spec.many_calls:
            marker, undecided = self._call_open.match(buf, i, final)
            if undecided:
                return i > pos
            if marker is not None:
                self._start_call(i + len(marker))
                return True
        return self._close_block(i, final) or i > pos

    def _close_block(self, i: int, final: bool) -> bool:
        marker, undecided = self._block_close.match(self.buf, i, final)
        if undecided:
            return False
        if marker is not None:
            self.hold(i + len(marker))
        self._end_block(clean=marker is not None)
        return True

    def _end_block(self, clean: bool) -> None:
        if self._calls and clean:
            self.markup_held()
        else:
            self.fallback()
        self.state = self.s_body

    # -- the call's name -----------------------------------------------------------------------

    def _start_call(self, j: int) -> None:
        self.hold(j)
        self._text = []
        self.state = self.s_tag_name

    def _read_tag(self, final: bool) -> str | None:
        """Read up to the next ``>``: the tag's text; None while incomplete; "" if it is not a tag.

        A tag is one line without ``<`` and at most TAG_LIMIT long; it fails exactly at the first
        character that breaks that, whatever the chunking.
        """
        buf, pos = self.buf, self.pos
        limit = pos + TAG_LIMIT - sum(map(len, self._text))
        found = _TAG_STOP.search(buf, pos, limit + 1)
        end = found.start() if found else min(len(buf), limit + 1)
        self._text.append(buf[pos:end])
        self.hold(end)
        if found is not None and found.group() == ">":
            self.hold(end + 1)
            return "".join(self._text)
        if found is not None or final or end > limit:
            return ""
        return None

    def _read_name(self, final: bool) -> str | None:
        """Up to ``name_close`` (consumed): the text; None while incomplete; "" if it is not a name."""
        assert self.spec.name_close is not None
        buf, pos = self.buf, self.pos
        limit = pos + TAG_LIMIT - sum(map(len, self._text))
        i, marker = markers(self.spec.name_close).find(buf, pos, final, limit + 1)
        self._text.append(buf[pos:i])
        self.hold(i)
        if marker is not None:
            self.hold(i + len(marker))
            return "".join(self._text)
        return "" if final or i > limit else None

    def s_tag_name(self, final: bool) -> bool:
        """``<function=NAME>`` or ``<invoke name="NAME">``: the name; the call is not announced yet."""
        pos = self.pos
        if self.spec.name_close is not None:
            name = self._read_name(final)
            if name is None:
                return self.pos > pos
        else:
            tag = self._read_tag(final)
            if tag is None:
                return self.pos > pos
            assert self.spec.call_open is not None
            name = tag.strip() if self.spec.call_open.endswith("=") else parse_attrs(tag).get("name", "")
        name = name.strip().strip("\"'")
        if not name or any(c.isspace() for c in name):
            self._give_up()
            return True
        self._name = name
        self._writer = None
        self.state = self.s_call
        return True

    def s_line_name(self, final: bool) -> bool:
        """GLM: the name runs from the block opener to a newline or the first argument."""
        assert self._name_end is not None
        buf, pos = self.buf, self.pos
        limit = pos + TAG_LIMIT - sum(map(len, self._text))
        i, marker = self._name_end.find(buf, pos, final, limit + 1)
        if i > limit:
            i, marker = limit + 1, None
        self._text.append(buf[pos:i])
        self.hold(i)
        if marker is None and not final and i <= limit:
            return i > pos
        name = "".join(self._text).strip()
        if not name or sum(map(len, self._text)) > TAG_LIMIT or any(c.isspace() for c in name):
            self._give_up()
            return True
        self._name = name
        self._writer = None
        self.state = self.s_call
        return True

    def _give_up(self) -> None:
        if self._calls:
            self._end_block(clean=False)
        else:
            self.fallback()
            self.state = self.s_body

    # -- arguments -----------------------------------------------------------------------------

    def s_call(self, final: bool) -> bool:
        """Between arguments: the next one, or the end of the call."""
        spec, buf, pos = self.spec, self.buf, self.pos
        i = skip_space(buf, pos)
        self.hold(i)
        if i >= len(buf):
            if final:
                self._finish_call(None, clean=False)
                return True
            return i > pos
        marker, undecided = self._in_call.match(buf, i, final)
        if undecided:
            return i > pos
        if marker == spec.param_open:
            if not self._commit():
                return True
            self.hold(i + len(marker))
            self._text = []
            self.state = self.s_key
        elif marker is not None:  # the end of the call
            if self._writer is None and not self._commit():
                return True
            self.hold(i + len(marker))
            self._finish_call(None, clean=True)
        elif self._writer is None:
            self._give_up()
        else:  # text that is not part of the call: it ends here, the text is content
            self._finish_call(None, clean=False)
        return True

    def s_key(self, final: bool) -> bool:
        """The argument's name: ``k>``, ``name="k" ...>`` or ``k</arg_key>``."""
        spec, buf, pos = self.spec, self.buf, self.pos
        cap = pos + TAG_LIMIT - sum(map(len, self._text))
        i, marker = self._key_end.find(buf, pos, final, cap + 1)
        if marker is None and not final and i <= cap:
            self._text.append(buf[pos:i])
            self.hold(i)
            return i > pos
        if marker != (spec.key_close or ">") or i > cap:
            return self._skip_param(final)
        self._text.append(buf[pos:i])
        self.hold(i + len(marker))
        text = "".join(self._text)
        attrs = parse_attrs(text) if not spec.param_open.endswith("=") and spec.key_close is None else {}
        key = (attrs.get("name", "") if attrs else text).strip().strip("\"'")
        if not key:
            return self._skip_param(final)
        kind = self.opts.param_type(self._name, key)
        if "string" in attrs:
            kind = "string" if attrs["string"].lower() == "true" else "json"
        assert self._writer is not None
        self._writer.key(key)
        self._value = _Value(self._writer, kind)
        self.state = self.s_value_open if spec.value_open else self.s_value
        return True

    def _skip_param(self, final: bool) -> bool:
        self.state = self.s_skip_param
        return True

    def s_skip_param(self, final: bool) -> bool:
        """A malformed argument tag: skip to its closing tag, keeping the text in the call's raw."""
        pos = self.pos
        i, marker = markers(self.spec.param_close).find(self.buf, pos, final)
        self.hold(i + len(marker or ""))
        if marker is not None or final:
            self.state = self.s_call
            return True
        return i > pos

    def s_value_open(self, final: bool) -> bool:
        """GLM: ``<arg_value>`` after the key."""
        spec, buf, pos = self.spec, self.buf, self.pos
        assert spec.value_open is not None
        i = skip_space(buf, pos)
        self.hold(i)
        if len(buf) - i < len(spec.value_open) and spec.value_open.startswith(buf[i:]) and not final:
            return i > pos
        if buf.startswith(spec.value_open, i):
            self.hold(i + len(spec.value_open))
        self.state = self.s_value
        return True

    def s_value(self, final: bool) -> bool:
        """The raw value, up to a closing tag that the following text confirms."""
        value, buf, pos = self._value, self.buf, self.pos
        assert value is not None
        i, marker = self.stream_until(self._enders, final, value.feed)
        if marker is None:
            if final:
                self._finish_call("the output ended inside an argument value", clean=False)
                return True
            return i > pos
        if marker == self.spec.param_open:  # the previous value was never closed
            self._close_value()
            return True
        end = i + len(marker)
        found = self.marker_after_space(self._follow[marker], final, end)
        if found is None:
            return i > pos
        j, follow = found
        if follow is not None or j >= len(buf) or j - end >= self.LOOKAHEAD:
            self._close_value()
            if marker == self.spec.param_close:
                self.hold(end)
            return True
        value.feed(marker)  # not a real closing tag: part of the value
        self.hold(end)
        return True

    def _close_value(self) -> None:
        assert self._value is not None
        self._value.close()
        self._value = None
        self.state = self.s_call

    def _finish_call(self, error: str | None, *, clean: bool) -> None:
        if self._writer is None:
            self._give_up()
            return
        if error is None:
            self._writer.close()
        self.end_call(error)
        self._writer = None
        self._calls += 1
        if not self._in_block:
            self.state = self.s_after_bare
        elif not clean or error is not None:
            self._in_block = False
            self.state = self.s_body
        elif self.spec.call_open is None:  # GLM: the block's closing tag ended the call
            self.state = self.s_body
        else:
            self.state = self.s_block

    def s_after_bare(self, final: bool) -> bool:
        """After a call written without its block opener: a lone closing block tag is markup."""
        if not self.markup_after_space(self._block_close, final):
            return False
        self.state = self.s_body
        return True
