"""Formats whose arguments are JSON: a call object in tags, a list after a marker, or a name header.

One machine covers them all, configured by :class:`JsonSpec`: which markers open a block in content,
what each block holds (:class:`Block`), and which wrappers are markup. The shapes:

- ``object``: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (Hermes and its wrappers,
  Granite 20B, Phi-4-mini via llama.cpp, bare Llama 3 JSON);
- ``list``: ``[TOOL_CALLS][{...}, {...}]``, ``<|tool_call|>[...]``, ``functools[...]`` ...;
- ``named``: a header then JSON arguments (``<function=f>{...}</function>``, ``[TOOL_CALLS]f[ARGS]{...}``);
- ``section``: named calls between per-call markers inside a section (DeepSeek, Kimi K2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .base import Sink, parse_arguments
from .jsonstream import CallKeys, CallList, CallObject, HeaderParser, NamedCall
from .machine import MachineBase, MarkerSet, Options, ThinkSpec, markers, skip_space
from .pycalls import PyCallList
from .values import ArgsWriter, valid_name

__all__ = [
    "Block",
    "JsonMachine",
    "JsonSpec",
    "deepseek_header",
    "fenced",
    "function_tag_header",
    "kimi_header",
    "mistral_header",
]

BlockKind = Literal["object", "list", "any_list", "auto", "named", "section", "mistral", "python_tag"]
FENCE = "```"
#: the blocks whose body may sit in a code fence right after the opener
_FENCEABLE = frozenset({"object", "list", "any_list", "auto", "mistral", "python_tag"})


@dataclass(frozen=True, slots=True)
class Block:
    """What follows an opening marker in content."""

    kind: BlockKind
    #: markers accepted (and consumed) after the body; the first one ends the block
    close: tuple[str, ...] = ()
    keys: CallKeys = field(default_factory=CallKeys)
    header: HeaderParser | None = None
    #: ``<tool_call>CALL_ID\n{...}``: a call id on the opener's line
    id_line: bool = False
    #: other openers of the format may follow (Hermes wrappers: code fences, ``<response>`` ...)
    nested: bool = False
    call_open: tuple[str, ...] = ()
    call_close: tuple[str, ...] = ()
    #: DeepSeek R1 distills sometimes drop the per-call marker inside a section
    call_open_optional: bool = False
    #: tolerated between the arguments and the call's end marker (DeepSeek V3's code fence)
    args_suffix: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class JsonSpec:
    """A JSON-family format: its openers and the content wrappers that are only markup."""

    openers: Mapping[str, Block]
    strip: tuple[str, ...] = ()
    #: Ollama's bare-JSON rule: after a JSON object that is not a call, stop looking for calls
    give_up_after_non_call: bool = False
    #: Qwen-Agent: ``<code>...</code>`` after the call object fills ``arguments.code``
    code_block: bool = False


class JsonMachine(MachineBase):
    """The state machine for every :class:`JsonSpec` format.

    Its states (the ``s_*`` methods), and where each one goes:

    - ``s_body``: content, up to an opener of the spec (a ``strip`` wrapper is markup) -> ``s_fence`` if the
      block may sit in a code fence, else the block's first state (``_dispatch``): ``s_list`` for a list of
      calls, ``s_named`` for a named call, ``s_section`` for a section of calls, else ``s_lead``;
    - ``s_fence``: an optional ```` ```json ```` after the opener -> the block's first state;
    - ``s_lead``: what the body starts with -> ``s_object`` (``{``), ``s_list`` (``[``, or a Python call list),
      ``s_named`` (Mistral's name before its arguments), ``s_code`` (Llama 3.1's raw code); a nested opener or
      a call id on the opener's line is taken here;
    - ``s_object`` -> ``s_trail``, or ``s_deferred`` when Qwen-Agent's ``<code>...</code>`` may follow ->
      ``s_code_block`` (that code fills ``arguments.code``) or ``s_trail``;
    - ``s_named``, ``s_code``, ``s_code_block`` -> ``s_trail``: the call's closing markers, then the call ends
      -> ``s_section`` inside a section, else ``s_body`` (text that ends inside a code block ends the call there);
    - ``s_list`` -> ``s_block_end`` (the list's closing markers, markup) -> ``s_body``;
    - ``s_section``: a call's opener -> ``s_named``, the section's end -> ``s_body``.

    A block that turns out not to be a call gives up (``_give_up``): what it held becomes content again, and
    the machine goes back to ``s_body``, or inside a section to ``s_skip``, which keeps the malformed call as
    content up to its end marker -> ``s_section``. What the states share: ``_block`` (the opener's
    :class:`Block`), ``_closers`` (markers still to take after the body), ``_stops`` (markers that end a call
    whose JSON never closed), ``_sub`` (the parser of the call being read), ``_writer`` and ``_code_end`` (code
    bodies), ``_line_id`` (a call id before the object), ``_in_section`` and ``_count`` (calls in it so far),
    ``_closed`` (the call took a closing marker), ``_gave_up`` (Ollama's rule: no calls after a non-call).
    """

    def __init__(self, out: Sink, opts: Options, spec: JsonSpec, think: ThinkSpec | None = None) -> None:
        super().__init__(out, opts, think)
        self.spec = spec
        self._markers = self.body_markers([*spec.openers, *spec.strip])
        self._block = Block("object")
        self._closers: list[str] = []
        self._stops = MarkerSet(())
        self._sub: CallObject | CallList | PyCallList | NamedCall | None = None
        self._writer: ArgsWriter | None = None
        self._code_end = MarkerSet(())
        self._line_id: str | None = None
        self._in_section = False
        self._closed = False
        self._count = 0
        self._gave_up = False

    # -- content -------------------------------------------------------------------------------

    def s_body(self, final: bool) -> bool:
        pos = self.pos
        if self._gave_up:
            self.emit(len(self.buf))
            return False
        i, marker = self._markers.find(self.buf, pos, final)
        self.emit(i)
        if marker is None:
            return i > pos
        if self.think_opens(marker):
            return True
        if marker in self.spec.strip:
            self.markup(i + len(marker))
            return True
        self._open(marker)
        return True

    def _open(self, marker: str) -> None:
        block = self.spec.openers[marker]
        if marker not in ("{", "["):  # a bare bracket is the body's own first character
            self.hold(self.pos + len(marker))
        self._block = block
        self._closers = list(block.close)
        self._line_id = None
        # Outside JSON strings, these end a call whose JSON never closed. A bare bracket opener is
        # JSON itself, so it cannot be one.
        opener = () if marker in ("{", "[") else (marker,)
        self._stops = MarkerSet((*opener, *block.close, *block.call_open, *block.call_close))
        if block.kind in _FENCEABLE and marker not in ("{", "[") and not marker.startswith(FENCE):
            self.state = self.s_fence
        else:
            self._dispatch()

    def _dispatch(self) -> None:
        """Go to the state that reads what the block holds."""
        block = self._block
        if block.kind == "list":
            self._sub = CallList(block.keys, self._stops)
            self.state = self.s_list
        elif block.kind == "named":
            self._start_named()
        elif block.kind == "section":
            self._in_section, self._count = True, 0
            self.state = self.s_section
        else:
            self.state = self.s_lead

    def s_fence(self, final: bool) -> bool:
        """A code fence right after the opener (```` ```json ````): markup, closed by ```` ``` ````."""
        buf, pos = self.buf, self.pos
        i = skip_space(buf, pos, self.LOOKAHEAD)
        if i >= len(buf) and not final and i - pos < self.LOOKAHEAD:
            return False
        if buf.startswith(FENCE, i):
            j = i + len(FENCE)
            while j < len(buf) and buf[j].isalpha() and j - i < 16:
                j += 1
            if j >= len(buf) and not final:
                return False
            self.hold(j)
            self._closers.insert(0, FENCE)
            self._stops = MarkerSet((*self._stops.markers, FENCE))
        elif len(buf) - i < len(FENCE) and FENCE.startswith(buf[i:]) and not final:
            return False
        self._dispatch()
        return True

    def _start_named(self) -> None:
        assert self._block.header is not None
        self._sub = NamedCall(self._block.header, self._stops)
        self.state = self.s_named

    def _resume(self) -> None:
        self.state = self.s_section if self._in_section else self.s_body

    def _give_up(self) -> None:
        """The block was not a call after all: what it held becomes content."""
        self.fallback()
        if self._in_section:
            self.state = self.s_skip
        else:
            self._gave_up = self.spec.give_up_after_non_call
            self.state = self.s_body

    # -- what follows an opener ----------------------------------------------------------------

    def s_lead(self, final: bool) -> bool:
        buf, pos, block = self.buf, self.pos, self._block
        i = skip_space(buf, pos)
        self.hold(i)
        if i >= len(buf):
            if final:
                self._give_up()
                return True
            return i > pos
        c = buf[i]
        if c == "{":
            self._sub = CallObject(block.keys, self._stops, defer=self.spec.code_block)
            self._sub.id = self._line_id
            self.state = self.s_object
            return True
        if c == "[" and block.kind in ("auto", "mistral"):
            self._sub = CallList(block.keys, self._stops)
            self.state = self.s_list
            return True
        if c == "[" and block.kind == "any_list":  # LFM2: a JSON list or a Python call list
            j = skip_space(buf, i + 1, self.LOOKAHEAD)
            if j >= len(buf) and not final:
                return i > pos
            python = j < len(buf) and buf[j] not in "{]"
            self._sub = PyCallList(True, self._stops) if python else CallList(block.keys, self._stops)
            self.state = self.s_list
            return True
        if block.nested:
            marker, undecided = self._markers.match(buf, i, final)
            if undecided:
                return i > pos
            opened = self.spec.openers.get(marker) if marker else None
            if opened is not None and opened.kind == "object" and marker not in self._stops.markers:
                self.hold(i + len(marker or ""))
                self._closers = [*opened.close, *self._closers]
                return True
        if block.id_line and self._line_id is None and c not in "<`":
            return self._id_line(final) or i > pos
        if block.kind == "mistral" and block.header is not None:
            self._start_named()
            return True
        if block.kind == "python_tag":
            builtin = _builtin_call(buf, i, final)
            if builtin is None:
                return i > pos
            if builtin:  # Llama 3.1 built-in tools: brave_search.call(query="...")
                self._sub = PyCallList(False, self._stops, name_suffix=".call")
                self.state = self.s_list
            else:  # raw code: the code interpreter
                tools = self.opts.tools
                code_tool = "code_interpreter" in (tools or ()) and "python" not in (tools or ())
                self._start_code("code_interpreter" if code_tool else "python")
            return True
        self._give_up()
        return True

    def _id_line(self, final: bool) -> bool:
        """``<tool_call>CALL_ID\\n{``: read the id, which must be followed by whitespace and ``{``."""
        buf, i = self.buf, self.pos
        end = i
        while end < len(buf) and end - i <= 128 and not buf[end].isspace() and buf[end] not in '{}<>"':
            end += 1
        k = skip_space(buf, end, 64)
        if k >= len(buf) and not final and end - i <= 128:
            return False
        if end in (i, k) or end - i > 128 or k >= len(buf) or buf[k] != "{":
            self._give_up()
            return True
        self._line_id = buf[i:end]
        self.hold(k)
        return True

    # -- call objects and lists ----------------------------------------------------------------

    def s_object(self, final: bool) -> bool:
        obj = self._sub
        assert isinstance(obj, CallObject)
        moved = obj.step(self, final)
        if not obj.done:
            return moved
        if obj.failed or (obj.defer and obj.name is None):
            self._give_up()
        elif obj.defer:
            self.state = self.s_deferred
        else:
            self._to_trail()
        return True

    def s_list(self, final: bool) -> bool:
        lst = self._sub
        assert isinstance(lst, CallList | PyCallList)
        moved = lst.step(self, final)
        if not lst.done:
            return moved
        if lst.count == 0 or not lst.clean:
            self._give_up()
            return True
        # Brackets and commas held since the last call are the list's own markup.
        self.markup_held()
        self.state = self.s_block_end
        return True

    def s_named(self, final: bool) -> bool:
        sub = self._sub
        assert isinstance(sub, NamedCall)
        moved = sub.step(self, final)
        if not sub.done:
            return moved
        if sub.failed:
            self._give_up()
        else:
            self._closers = [*self._block.args_suffix, *self._block.call_close, *self._closers]
            self._to_trail()
        return True

    def _to_trail(self) -> None:
        self._closed = False
        self.state = self.s_trail

    def s_trail(self, final: bool) -> bool:
        """After a call's arguments: take its closing markers (and a stray brace), then end it."""
        found = self.marker_after_space(markers(*self._closers), final)
        if found is None:
            return False
        i, marker = found
        if marker is not None:
            self.hold(i + len(marker))
            self._closers.remove(marker)
            self._closed = True
            return True
        if i < len(self.buf) and self.buf[i] in "}]" and not self._closed:
            self.hold(i + 1)  # a stray closing bracket some models add
            return True
        sub = self._sub
        error = sub.error if isinstance(sub, CallObject | NamedCall) else None
        self.end_call(error)
        self._count += 1
        self._resume()
        return True

    def s_block_end(self, final: bool) -> bool:
        """After a list: its closing markers, if any (a fence, then the block's own), are markup."""
        found = self.marker_after_space(markers(*self._closers), final)
        if found is None:
            return False
        i, marker = found
        if marker is None:
            self.state = self.s_body
        else:
            self.markup(i + len(marker))
            self._closers.remove(marker)
        return True

    # -- sections (DeepSeek, Kimi K2) ----------------------------------------------------------

    def s_section(self, final: bool) -> bool:
        buf, pos, block = self.buf, self.pos, self._block
        i = skip_space(buf, pos)
        self.hold(i)
        if i >= len(buf) and not final:
            return i > pos
        marker, undecided = markers(*block.call_open, *block.close).match(buf, i, final)
        if undecided:
            return i > pos
        if marker in block.call_open:
            self.hold(i + len(marker or ""))
            self._closers = []
            self._start_named()
        elif marker is not None:
            self._end_section()
            self.markup(i + len(marker))
        elif block.call_open_optional and i < len(buf):
            self._closers = []
            self._start_named()
        else:
            self._end_section()
        return True

    def _end_section(self) -> None:
        if self._count:
            self.markup_held()
        else:
            self.fallback()
        self._in_section = False
        self.state = self.s_body

    def s_skip(self, final: bool) -> bool:
        """A malformed call inside a section: it stays content up to its end marker."""
        block, pos = self._block, self.pos
        i, marker = markers(*block.call_close, *block.close).find(self.buf, pos, final)
        if marker in block.call_close:
            self.emit(i + len(marker or ""))
            self.state = self.s_section
            return True
        self.emit(i)
        if marker is not None or final:
            self.state = self.s_section
            return True
        return i > pos

    # -- code bodies -----------------------------------------------------------------------

    def _start_code(self, name: str) -> None:
        if not self.commit(name):
            self._give_up()
            return
        self._writer = ArgsWriter(self.out.args)
        self._writer.key("code")
        self._code_end = MarkerSet(self._closers)  # a fence first, if the code sits in one
        self.state = self.s_code

    def _read_code(self, final: bool) -> str | None:
        """Stream raw code into the open ``code`` argument, up to ``_code_end``.

        None while the code goes on. Once it ends, the arguments are closed and the result is the
        end marker (consumed), or "" when the text ended first.
        """
        assert self._writer is not None
        i, marker = self.stream_until(self._code_end, final, self._writer.string)
        if marker is None and not final:
            return None
        if marker is not None:
            self.hold(i + len(marker))
        self._writer.end_string()
        self._writer.close()
        return marker or ""

    def s_code(self, final: bool) -> bool:
        """Raw code as the ``code`` argument, until the block's end marker or the end of text."""
        pos = self.pos
        end = self._read_code(final)
        if end is None:
            return self.pos > pos
        if end in self._closers:
            self._closers.remove(end)
        self._sub = None
        self._to_trail()  # the block's other closing markers, then the end of the call
        self._closed = True
        return True

    def s_deferred(self, final: bool) -> bool:
        """Qwen-Agent: a call object whose ``code`` argument may follow in ``<code>...</code>``."""
        obj = self._sub
        assert isinstance(obj, CallObject) and obj.name is not None
        buf = self.buf
        i = skip_space(buf, self.pos, self.LOOKAHEAD)
        code = "<code>"
        if len(buf) - i < len(code) and code.startswith(buf[i:]) and not final:
            return False
        if not self.commit(obj.name, obj.id):
            self._give_up()
            return True
        self._to_trail()
        if not buf.startswith(code, i):
            self.out.args(obj.args if obj.args is not None else "{}")
            return True
        self.hold(i + len(code))
        writer = self._writer = ArgsWriter(self.out.args)
        fields = _object_or_empty(obj.args)
        for key, value in fields.items():
            if key != "code":
                writer.key(key)
                writer.value(json.dumps(value, ensure_ascii=False))
        writer.key("code")
        self._code_end = MarkerSet(("</code>",))
        self.state = self.s_code_block
        return True

    def s_code_block(self, final: bool) -> bool:
        pos = self.pos
        end = self._read_code(final)
        if end is None:
            return self.pos > pos
        if end:
            self._to_trail()
        else:
            self.end_call("the output ended inside the code block")
            self._resume()
        return True


def _builtin_call(buf: str, i: int, final: bool) -> bool | None:
    """Whether ``buf[i:]`` starts a Llama 3.1 built-in tool call, ``NAME.call(``; None while undecided."""
    n, j = len(buf), i
    while j < n and (buf[j].isalnum() or buf[j] == "_") and j - i <= 64:
        j += 1
    if j == i or j - i > 64:
        return False
    call = ".call("
    if buf.startswith(call, j):
        return True
    if n - j < len(call) and call.startswith(buf[j:]) and not final:
        return None
    return False


def _object_or_empty(text: str | None) -> dict[str, object]:
    value, ok = parse_arguments(text or "{}")
    return value if ok and isinstance(value, dict) else {}


def fenced(spec: JsonSpec) -> JsonSpec:
    """``spec`` where a call may also sit in a bare ```` ```json ```` code block in the content.

    The block reads a call object, or a list of them, with the keys of the format's first opener.
    """
    if "```json" in spec.openers or not spec.openers:
        return spec
    keys = next(iter(spec.openers.values())).keys
    block = Block("auto", (FENCE,), keys=CallKeys(keys.name, keys.args, keys.ids, keys.tolerated, keys.name_as_key))
    return JsonSpec({**spec.openers, "```json": block}, spec.strip, spec.give_up_after_non_call, spec.code_block)


# -- headers -----------------------------------------------------------------------------------

DS_SEP = "<｜tool▁sep｜>"
KIMI_ARGS = "<|tool_call_argument_begin|>"


def deepseek_header(text: str) -> tuple[str, str | None] | None:
    """``function<｜tool▁sep｜>NAME\\n```json\\n`` (V3) or ``NAME<｜tool▁sep｜>`` (V3.1)."""
    before, sep, after = text.partition(DS_SEP)
    if not sep:
        return None
    tail = after.strip()
    for fence in ("```json", "```"):
        if tail.endswith(fence):
            tail = tail[: -len(fence)].rstrip()
            break
    name = tail.splitlines()[0].strip() if tail else before.strip()
    return (name, None) if valid_name(name) else None


def kimi_header(text: str) -> tuple[str, str | None] | None:
    """``functions.NAME:IDX <|tool_call_argument_begin|>``: the id is kept, the name is read from it."""
    call_id, sep, rest = text.partition(KIMI_ARGS)
    call_id = call_id.strip()
    if not sep or rest.strip():
        return None
    name, colon, index = call_id.removeprefix("functions.").rpartition(":")
    if not colon or not index.isdigit() or not valid_name(name):
        return None
    return name, call_id


def mistral_header(text: str) -> tuple[str, str | None] | None:
    """``NAME[ARGS]``, ``NAME[CALL_ID]ID[ARGS]``, or ``NAME`` when decoded text dropped ``[ARGS]``."""
    text = text.strip()
    text = text.removesuffix("[ARGS]")
    name, sep, call_id = text.partition("[CALL_ID]")
    name = name.strip()
    if not valid_name(name):
        return None
    return name, (call_id.strip() or None) if sep else None


def function_tag_header(text: str) -> tuple[str, str | None] | None:
    """``NAME>`` after ``<function=``, or ``NAME">`` after ``<function name="``."""
    text = text.strip()
    if not text.endswith(">"):
        return None
    name = text[:-1].rstrip().removesuffix('"')
    return (name, None) if valid_name(name) else None
