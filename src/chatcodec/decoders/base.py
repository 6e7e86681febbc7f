"""What a decoder returns, and the sink its state machines write into.

A decoder turns model text into an :class:`AssistantMessage` (``decode``) or into OpenAI-style
:class:`Delta` objects as the text arrives (``stream``). Both paths run the same state machine, so they
cannot disagree: ``decode(text)`` is ``feed(text)`` then ``finish()``.

The sink enforces the streaming contract by construction. Deltas only append: content and reasoning
grow, a tool call is announced once with its name (and the model's id when that came first), and its
arguments only grow. Every character a machine consumes is routed to exactly one place: content,
reasoning, a tool call's ``raw`` text, or markup (tags and the whitespace around them). With
``trace=True`` the stream keeps that routing as a list of :class:`Span` objects, which is how the tests
check that nothing is ever lost.
"""

from __future__ import annotations

import codecs
import itertools
import json
import random
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..exceptions import DecodeError

__all__ = ["AssistantMessage", "DecodeStream", "Delta", "Span", "ToolCall", "ToolCallDelta"]

SpanKind = Literal["content", "reasoning", "markup", "call"]
IdStyle = Literal["openai", "mistral"]

_json_decoder = json.JSONDecoder()


def parse_arguments(text: str) -> tuple[Any, bool]:
    """Parse argument text as JSON: ``(value, True)``, or ``(text, False)`` when it is not JSON."""
    try:
        return _json_decoder.decode(text), True
    except (ValueError, RecursionError):
        return text, False


def hold_trailing_space(text: str, pending: list[str]) -> str:
    """``text`` without its trailing whitespace, which waits in ``pending`` until more text follows.

    Whitespace that was waiting goes back in front; "" when ``text`` is only whitespace.
    """
    body = text.rstrip()
    if not body:
        pending.append(text)
        return ""
    tail = text[len(body) :]
    if pending:
        body = "".join(pending) + body
        pending.clear()
    if tail:
        pending.append(tail)
    return body


_ALNUM = string.ascii_letters + string.digits
#: the base-62 digits of every number under 62**2, the lower digit first
_ALNUM_PAIRS = [low + high for high in _ALNUM for low in _ALNUM]
_SIX = 62**6


class _CallIds:
    """Call ids unique within the process and unpredictable across processes: ``lead``, a random prefix
    of ``prefix_width`` base-62 digits, then 12 base-62 digits of a counter passed through a random
    bijection of ``[0, 62**12)``.

    The bijection maps the counter's high and low six digits each by an affine map modulo ``62**6`` (a
    factor coprime to 62), so no two ids of a process are equal until ``62**12`` have been made, and
    nothing is kept per id. Ids are made a batch at a time (the high digits are shared by a batch), and
    taking one is a ``list.pop``: one id per tool call of every decode, so its cost shows in decode speed.
    Two threads that both find the batch empty each take a batch of their own (the counter hands out
    whole batches), so no id is given twice; a batch one of them drops is never reused.
    """

    BATCH = 248  # divides 62**6 (8 * 31), so a batch never spans two values of the high digits

    def __init__(self, lead: str = "", prefix_width: int = 0) -> None:
        rng = random.SystemRandom()
        self._factors = [self._factor(rng), self._factor(rng)]
        self._offsets = [rng.randrange(_SIX), rng.randrange(_SIX)]
        self._prefix = lead + "".join(rng.choice(_ALNUM) for _ in range(prefix_width))
        self._batches = itertools.count()
        self._ready: list[str] = []

    @staticmethod
    def _factor(rng: random.SystemRandom) -> int:
        while True:
            factor = rng.randrange(1, _SIX)
            if factor % 2 and factor % 31:
                return factor

    def number(self, k: int) -> int:
        """The 12-digit number the ``k``-th id writes (a bijection of ``[0, 62**12)``)."""
        hi, lo = divmod(k, _SIX)
        (f_hi, f_lo), (o_hi, o_lo) = self._factors, self._offsets
        return (hi * f_hi + o_hi) % _SIX * _SIX + (lo * f_lo + o_lo) % _SIX

    def _batch(self) -> list[str]:
        """The next batch of ids, the first last (taken with ``pop``)."""
        first = next(self._batches) * self.BATCH
        high = self.number(first) // _SIX
        pair = _ALNUM_PAIRS
        head = self._prefix + "".join(_digits(high))
        f, o = self._factors[1], self._offsets[1]
        lows = [(k * f + o) % _SIX for k in range(first % _SIX + self.BATCH - 1, first % _SIX - 1, -1)]
        return [head + pair[lo % 3844] + pair[lo // 3844 % 3844] + pair[lo // 14776336] for lo in lows]

    def __call__(self) -> str:
        try:
            return self._ready.pop()
        except IndexError:
            self._ready = ready = self._batch()
            return ready.pop()


def _digits(n: int, width: int = 6) -> list[str]:
    """``n``'s ``width`` lowest base-62 digits, the lowest first."""
    digits = []
    for _ in range(width):
        n, d = divmod(n, 62)
        digits.append(_ALNUM[d])
    return digits


_OPENAI_IDS = _CallIds("call_", prefix_width=12)
#: a fresh OpenAI-style call id (``new_call_id()``, without choosing the style)
next_call_id: Callable[[], str] = _OPENAI_IDS


class _MistralIds:
    """Mistral's 9-digit ids: a counter through an affine map modulo ``62**9``, written in base 62."""

    def __init__(self) -> None:
        rng = random.SystemRandom()
        self._modulus = 62**9
        factor = rng.randrange(1, self._modulus)
        while factor % 2 == 0 or factor % 31 == 0:
            factor = rng.randrange(1, self._modulus)
        self._factor, self._offset = factor, rng.randrange(self._modulus)
        self._counter = itertools.count()

    def __call__(self) -> str:
        return "".join(_digits((next(self._counter) * self._factor + self._offset) % self._modulus, 9))


_MISTRAL_IDS = _MistralIds()


def new_call_id(style: IdStyle = "openai") -> str:
    """A fresh tool-call id, unique in this process: ``call_`` and 24 alphanumerics, or Mistral's 9.

    >>> len(new_call_id()), new_call_id().startswith("call_"), len(new_call_id("mistral"))
    (29, True, 9)
    """
    return _MISTRAL_IDS() if style == "mistral" else _OPENAI_IDS()


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call decoded from model output.

    ``arguments`` is the parsed JSON value; for an invalid call (``error`` set), the argument text
    itself when it is not JSON. ``arguments_json`` is exactly the text the stream sent as argument
    deltas: JSON for every valid call. ``id`` is the model's own id when it wrote one before the
    arguments (Kimi's ``functions.f:0``, Mistral's ``[CALL_ID]``), else a fresh one made when the
    call was announced: the id a stream sends is the id the message keeps (a whole read, which
    announces nothing, makes it when it is first read). ``raw`` is the source text of the call, so
    nothing the model wrote is lost even when ``error`` says the call was cut off or malformed.
    ``index`` is the call's place in the stream (its ``ToolCallDelta.index``).
    """

    name: str
    arguments: Any
    arguments_json: str
    id: str = ""
    raw: str = ""
    error: str | None = None
    index: int = 0

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", new_call_id())

    def __getattr__(self, name: str) -> Any:
        # reached only for a slot never set: the id of a call built without one (CALL_SLOTS), made when first read
        if name != "id":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return _late_id(self)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry.

        An invalid call (``error`` set) is written as an ``invalid_tool_calls`` entry instead, in the
        shape LangChain's messages use: its name, id, argument text, source text and the error.
        """
        if self.error is not None:
            return {
                "index": self.index,
                "id": self.id,
                "name": self.name,
                "arguments": self.arguments_json,
                "raw": self.raw,
                "error": self.error,
            }
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    """The decoded assistant turn: visible content, reasoning and tool calls.

    ``tool_calls`` holds the valid calls, whose arguments are JSON. A call the model began but got
    wrong (cut off, unreadable arguments) is in ``invalid_tool_calls``, where an OpenAI client cannot
    take it for a call to run, with its text kept.

    >>> msg = AssistantMessage(content="Hi", tool_calls=())
    >>> msg.to_openai()
    {'role': 'assistant', 'content': 'Hi'}
    """

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    invalid_tool_calls: tuple[ToolCall, ...] = ()

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat-completions assistant message, with arguments as JSON strings.

        Invalid calls, if any, are listed under ``invalid_tool_calls`` (see :meth:`ToolCall.to_openai`).
        """
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        if self.invalid_tool_calls:
            out["invalid_tool_calls"] = [call.to_openai() for call in self.invalid_tool_calls]
        return out


# Decoders' hot paths build results from every field at once, past the dataclasses' __init__ (which sets each
# field of a frozen class through object.__setattr__ and runs ToolCall's id check): they make the object with
# object.__new__ and set each slot directly, with its setter here, by field name. A call whose "id" slot is left
# unset gets its fresh id when it is first read (ToolCall.__getattr__): a whole decode then spends nothing on ids
# nobody reads, and the id, once read, stays.
CALL_SLOTS: dict[str, Callable[[ToolCall, Any], None]] = {
    name: ToolCall.__dict__[name].__set__ for name in ToolCall.__dataclass_fields__
}
MESSAGE_SLOTS: dict[str, Callable[[AssistantMessage, Any], None]] = {
    name: AssistantMessage.__dict__[name].__set__ for name in AssistantMessage.__dataclass_fields__
}


_ID_SLOT = ToolCall.__dict__["id"]
_ID_LOCK = threading.Lock()


def _late_id(call: ToolCall) -> str:
    """The id of a call built without one (:data:`CALL_SLOTS`): made once, under a lock, so that two threads that
    read it first at once read the same id.

    >>> call = object.__new__(ToolCall)
    >>> call.id.startswith("call_") and call.id == call.id
    True
    """
    with _ID_LOCK:
        try:
            made: str = _ID_SLOT.__get__(call, ToolCall)
        except AttributeError:
            made = next_call_id()
            _ID_SLOT.__set__(call, made)
        return made


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of tool call ``index``: its header (``name`` and ``id``), more argument text, or,
    at the very end of a stream, the news that the call turned out invalid (``error``)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Delta:
    """One streaming delta; exactly one of the three fields is set.

    >>> Delta(content="Hel").to_openai()
    {'content': 'Hel'}
    """

    content: str | None = None
    reasoning_content: str | None = None
    tool_call: ToolCallDelta | None = None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI streaming ``delta`` dict.

        The first delta of a call carries its ``id``, ``type`` and ``name``; later ones more
        ``arguments``. The last deltas of a stream name each announced call that turned out invalid:
        ``{"invalid_tool_calls": [{"index", "id", "error"}]}``, so a client drops it.

        >>> Delta(tool_call=ToolCallDelta(1, "call_x", error="the arguments were cut off")).to_openai()
        {'invalid_tool_calls': [{'index': 1, 'id': 'call_x', 'error': 'the arguments were cut off'}]}
        """
        if self.tool_call is None:
            if self.reasoning_content is not None:
                return {"reasoning_content": self.reasoning_content}
            return {"content": self.content}
        tc = self.tool_call
        if tc.error is not None:
            return {"invalid_tool_calls": [{"index": tc.index, "id": tc.id, "error": tc.error}]}
        entry: dict[str, Any] = {"index": tc.index}
        if tc.name is not None:
            entry["id"] = tc.id
            entry["type"] = "function"
            entry["function"] = {"name": tc.name, "arguments": tc.arguments}
        else:
            entry["function"] = {"arguments": tc.arguments}
        return {"tool_calls": [entry]}


@dataclass(frozen=True, slots=True)
class Span:
    """Where a piece of input text went (kept only with ``stream(trace=True)``)."""

    kind: SpanKind
    text: str
    index: int | None = None


@dataclass(slots=True)
class _Call:
    index: int
    name: str
    id: str
    args: list[str] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    error: str | None = None


class Sink:
    """Collects what a machine routes, applies the whitespace policy and batches deltas.

    Whitespace policy, the same for ``decode`` and ``stream``:
    - content is the model's text verbatim, except that content made only of whitespace is ``None``
      (so whitespace is held back until the first visible character arrives);
    - reasoning is stripped at both ends (the newlines around think tags are template formatting),
      so trailing whitespace is held back until more reasoning text follows.
    """

    __slots__ = (
        "_calls",
        "_content",
        "_content_ws",
        "_id_style",
        "_open",
        "_out",
        "_reasoning",
        "_reasoning_ws",
        "trace",
    )

    def __init__(self, trace: bool = False, id_style: IdStyle = "openai") -> None:
        self._id_style: IdStyle = id_style
        self._content: list[str] = []
        self._content_ws: list[str] = []
        self._reasoning: list[str] = []
        self._reasoning_ws: list[str] = []
        self._calls: list[_Call] = []
        self._open: _Call | None = None
        # Pending deltas of the current feed: [kind, index, parts]; merged while a kind repeats.
        self._out: list[list[Any]] = []
        self.trace: list[Span] | None = [] if trace else None

    # -- routing -------------------------------------------------------------------------------

    def content(self, text: str, *, traced: bool = True) -> None:
        """Route content; ``traced=False`` for text decoded from source already traced as markup."""
        if not text:
            return
        if self.trace is not None and traced:
            self.trace.append(Span("content", text))
        if not self._content:
            if text.isspace():
                self._content_ws.append(text)
                return
            if self._content_ws:
                text = "".join(self._content_ws) + text
                self._content_ws.clear()
        self._content.append(text)
        self._push("c", -1, text)

    def reasoning(self, text: str) -> None:
        if not text:
            return
        if self.trace is not None:
            self.trace.append(Span("reasoning", text))
        if not self._reasoning:
            text = text.lstrip()
            if not text:
                return
        body = hold_trailing_space(text, self._reasoning_ws)
        if not body:
            return
        self._reasoning.append(body)
        self._push("r", -1, body)

    def markup(self, text: str) -> None:
        if text and self.trace is not None:
            self.trace.append(Span("markup", text))

    # -- tool calls ----------------------------------------------------------------------------

    @property
    def calling(self) -> bool:
        return self._open is not None

    def begin_call(self, name: str, call_id: str | None) -> None:
        call = _Call(len(self._calls), name, call_id or new_call_id(self._id_style))
        self._calls.append(call)
        self._open = call
        self._out.append(["h", call.index, [], name, call.id])

    def args(self, text: str) -> None:
        call = self._open
        if call is None or not text:
            return
        call.args.append(text)
        self._push("a", call.index, text)

    def raw(self, text: str) -> None:
        call = self._open
        if call is None or not text:
            return
        call.raw.append(text)
        if self.trace is not None:
            self.trace.append(Span("call", text, call.index))

    def end_call(self, error: str | None = None) -> None:
        """Close the open call; it is invalid if ``error`` says so, or if its arguments are not JSON."""
        call = self._open
        if call is None:
            return
        self._open = None
        if error is None and not parse_arguments("".join(call.args))[1]:
            error = "the arguments are not valid JSON"
        call.error = error

    # -- output --------------------------------------------------------------------------------

    def _push(self, kind: str, index: int, text: str) -> None:
        out = self._out
        # Argument text right after its call's header joins the header delta.
        if out and out[-1][1] == index and (out[-1][0] == kind or (kind == "a" and out[-1][0] == "h")):
            out[-1][2].append(text)
        else:
            out.append([kind, index, [text], None, None])

    def close(self) -> None:
        """The end of the text: name every invalid call in the last deltas."""
        for call in self._calls:
            if call.error is not None:
                self._out.append(["x", call.index, [], call.error, call.id])

    def take(self) -> list[Delta]:
        """The deltas produced since the last call, merged per field."""
        if not self._out:
            return []
        deltas: list[Delta] = []
        for kind, index, parts, name, call_id in self._out:
            text = "".join(parts)
            if kind == "c":
                deltas.append(Delta(content=text))
            elif kind == "r":
                deltas.append(Delta(reasoning_content=text))
            elif kind == "x":
                deltas.append(Delta(tool_call=ToolCallDelta(index, call_id, error=name)))
            else:
                deltas.append(Delta(tool_call=ToolCallDelta(index, call_id, name, text)))
        self._out.clear()
        return deltas

    def message(self) -> AssistantMessage:
        """Everything emitted so far, as a message (arguments still streaming stay text until JSON)."""
        valid: list[ToolCall] = []
        invalid: list[ToolCall] = []
        for call in self._calls:
            text = "".join(call.args)
            value, _ = parse_arguments(text)
            made = ToolCall(call.name, value, text, call.id, "".join(call.raw), call.error, call.index)
            (valid if call.error is None else invalid).append(made)
        content, reasoning = "".join(self._content) or None, "".join(self._reasoning) or None
        return AssistantMessage(content, reasoning, tuple(valid), tuple(invalid))


class Machine(Protocol):
    """What a format's state machine offers the stream: text in, then the end of the text."""

    def feed(self, text: str) -> None: ...

    def finish(self) -> None: ...


class DecodeStream:
    """Incremental decoding of one completion; made by :meth:`Decoder.stream`.

    >>> from chatcodec.decoders import decoder
    >>> stream = decoder("hermes").stream()
    >>> [d.to_openai() for d in stream.feed("Hi <tool_")]
    [{'content': 'Hi '}]
    >>> deltas = stream.feed('call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    >>> [(d.tool_call.name, d.tool_call.arguments) for d in deltas]
    [('f', '{"x": 1}')]
    >>> stream.finish()
    []
    """

    __slots__ = ("_finished", "_machine", "_sink", "_utf8")

    def __init__(
        self, make_machine: Callable[[Sink], Machine], *, trace: bool = False, id_style: IdStyle = "openai"
    ) -> None:
        self._sink = Sink(trace, id_style)
        self._machine = make_machine(self._sink)
        self._utf8: codecs.IncrementalDecoder | None = None
        self._finished = False

    def feed(self, chunk: str | bytes) -> list[Delta]:
        """Add model text (str, or UTF-8 bytes that may split characters); return the new deltas."""
        if self._finished:
            raise DecodeError("This stream has finished; start another one with decoder.stream().")
        if isinstance(chunk, bytes | bytearray):
            if self._utf8 is None:
                self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
            chunk = self._utf8.decode(chunk)
        elif not isinstance(chunk, str):
            raise DecodeError(f"feed() takes model output as str or UTF-8 bytes, not {type(chunk).__name__}.")
        if chunk:
            self._machine.feed(chunk)
        return self._sink.take()

    def finish(self) -> list[Delta]:
        """Mark the end of the text: settle held-back text and open calls; return the last deltas."""
        if self._finished:
            return []
        if self._utf8 is not None:
            tail = self._utf8.decode(b"", final=True)
            if tail:
                self._machine.feed(tail)
        self._finished = True
        self._machine.finish()
        self._sink.close()
        return self._sink.take()

    @property
    def message(self) -> AssistantMessage:
        """The message made of every delta emitted so far."""
        return self._sink.message()

    @property
    def trace(self) -> list[Span]:
        """Where each piece of input went, in input order (empty unless ``trace=True``)."""
        return list(self._sink.trace or ())
