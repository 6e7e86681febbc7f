"""The state-machine base every format family builds on.

A machine keeps the text it has not decided yet in ``buf`` from ``pos`` on. Each state method looks
at that text, consumes what it can decide, routes it (content, reasoning, markup, or the raw text of
a tool call) and returns whether it made progress. Only a short undecided tail stays in ``buf``: the
longest suffix that could still become a marker, or a bounded header. Bigger things (an argument
value, a whole JSON object on the slow path) are consumed into lists as they arrive, so each
``feed`` costs O(len(chunk)) and nothing is scanned twice.

Matching uses a character class for the markers' first characters plus ``str.startswith``: no
backtracking regular expression ever runs over model output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from .base import Sink
from .values import ArgsWriter

__all__ = [
    "KeyedArgsMachine",
    "MachineBase",
    "MarkerSet",
    "Options",
    "StopFilter",
    "ThinkSpec",
    "markers",
    "skip_space",
]

_NONSPACE = re.compile(r"\S")

State = Callable[[bool], bool]


def skip_space(s: str, i: int, limit: int | None = None) -> int:
    """Index of the first non-whitespace character at or after ``i`` (``len(s)`` if none).

    With ``limit``, look at most that many characters ahead (the result is then ``i + limit``
    when they are all whitespace).
    """
    end = len(s) if limit is None else min(len(s), i + limit)
    m = _NONSPACE.search(s, i, end)
    return m.start() if m else end


class MarkerSet:
    """A fixed set of literal markers, found left to right with minimal hold-back.

    >>> ms = MarkerSet(["<tool_call>", "<think>"])
    >>> ms.find("say <tool_call>{", 0, final=False)
    (4, '<tool_call>')
    >>> ms.find("say <tool_ca", 0, final=False)
    (4, None)
    >>> ms.find("say <b>", 0, final=False)
    (7, None)
    """

    __slots__ = ("_by_first", "_first", "_prefixes", "longest", "markers")

    def __init__(self, markers: Iterable[str]) -> None:
        # Longest first, so that a marker that is a prefix of another never shadows it.
        self.markers = tuple(sorted({m for m in markers if m}, key=len, reverse=True))
        self.longest = max((len(m) for m in self.markers), default=0)
        self._by_first: dict[str, tuple[str, ...]] = {}
        for m in self.markers:
            self._by_first[m[0]] = (*self._by_first.get(m[0], ()), m)
        chars = "".join(re.escape(c) for c in sorted(self._by_first))
        self._first = re.compile(f"[{chars}]") if chars else None
        self._prefixes = frozenset(m[:k] for m in self.markers for k in range(1, len(m)))

    def find(self, s: str, pos: int, final: bool, end: int | None = None) -> tuple[int, str | None]:
        """The earliest marker at or after ``pos``: ``(index, marker)``.

        Without a full match, ``(index, None)``: ``index`` is where the undecided tail starts (a
        proper prefix of a marker running to the end of ``s``), or ``len(s)``. With ``final`` there
        is no tail. With ``end``, only markers starting before ``end`` count, and ``(end, None)``
        means none does (a caller with a length limit never scans past it).
        """
        n = len(s)
        if end is None or end >= n:
            end = n
        if self._first is None:
            return end, None
        m = self._first.search(s, pos, end)
        while m is not None:
            i = m.start()
            for marker in self._by_first[s[i]]:
                if s.startswith(marker, i):
                    return i, marker
            if not final and end == n and n - i < self.longest and s[i:] in self._prefixes:
                return i, None
            m = self._first.search(s, i + 1, end)
        return end, None

    def match(self, s: str, i: int, final: bool) -> tuple[str | None, bool]:
        """The marker starting exactly at ``i``: ``(marker, False)``; ``(None, True)`` if undecided."""
        for marker in self._by_first.get(s[i], ()) if i < len(s) else ():
            if s.startswith(marker, i):
                return marker, False
        return None, (not final and len(s) - i < self.longest and s[i:] in self._prefixes)


@lru_cache(maxsize=256)
def markers(*items: str) -> MarkerSet:
    """A cached :class:`MarkerSet` (states that need a small set on the fly use this)."""
    return MarkerSet(items)


@dataclass(frozen=True, slots=True)
class ThinkSpec:
    """A format's reasoning tags.

    ``implicit`` lists markers that end reasoning without the end tag (the model opened a tool call
    inside its thinking), each with a marker that must follow it after optional whitespace, or None.
    """

    start: tuple[str, ...]
    end: tuple[str, ...]
    implicit: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True, slots=True)
class Options:
    """Decoder options after validation (see :func:`chatcodec.decoders.decoder`)."""

    extract_reasoning: bool = True
    forced_open: bool = False
    tools: frozenset[str] | None = None
    #: parameter types per tool name; the key ``""`` applies to every tool
    schemas: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    tag: str | None = None
    #: end-of-turn markers: at the very end of the text they are markup, not content
    stops: tuple[str, ...] = ()

    def param_type(self, tool: str, param: str) -> str | None:
        """The declared JSON-schema type of ``param`` of ``tool``, if any."""
        found = self.schemas.get(tool, {}).get(param)
        return found if found is not None else self.schemas.get("", {}).get(param)


class MachineBase:
    """Buffer handling, the reasoning prelude and the tool-call lifecycle shared by all families.

    Subclasses implement ``s_body`` (the content state after any reasoning block) and set
    ``self.state`` to their own state methods. A state method returns True when it consumed text or
    changed state, False when it must wait for more text. With ``final`` it must settle everything.
    """

    #: How far past a marker we look for the marker that must follow it (``ThinkSpec.implicit``).
    LOOKAHEAD = 64

    def __init__(self, out: Sink, opts: Options, think: ThinkSpec | None = None) -> None:
        self.out = out
        self.opts = opts
        self.buf = ""
        self.pos = 0
        self.held: list[str] = []
        self.think = think
        self.state: State = self.s_body
        if think is not None:
            self._think_ends = MarkerSet(think.end + tuple(m for m, _ in think.implicit))
            self._think_starts = MarkerSet(think.start)
            self._implicit = dict(think.implicit)
            self._lead: list[str] = []
            self.state = self.s_think_open if opts.forced_open else self.s_start

    # -- driving -------------------------------------------------------------------------------

    def feed(self, text: str) -> None:
        if self.pos:
            self.buf = self.buf[self.pos :] + text
            self.pos = 0
        else:
            self.buf += text
        while self.state(False):
            pass

    def finish(self) -> None:
        while self.state(True):
            pass
        # Safety net: every state settles at EOS, but nothing may be lost if one did not.
        if self.pos < len(self.buf):
            self.hold(len(self.buf))
        if self.out.calling:
            self.end_call("the output ended inside the tool call")
        self.fallback()
        self.state = self.s_done

    def s_done(self, final: bool) -> bool:
        if self.pos < len(self.buf):
            self.out.content(self.buf[self.pos :])
            self.pos = len(self.buf)
        return False

    def s_body(self, final: bool) -> bool:
        raise NotImplementedError

    # -- routing helpers -----------------------------------------------------------------------

    def emit(self, j: int) -> None:
        """Send ``buf[pos:j]`` to content."""
        if j > self.pos:
            self.out.content(self.buf[self.pos : j])
            self.pos = j

    def markup(self, j: int) -> None:
        """Consume ``buf[pos:j]`` as markup (tags and the whitespace around them)."""
        if j > self.pos:
            self.out.markup(self.buf[self.pos : j])
            self.pos = j

    def hold(self, j: int) -> None:
        """Consume ``buf[pos:j]`` into the current tool-call construct.

        While the call is not committed, the text is held: a later :meth:`fallback` turns it into
        content. Once committed, it is the call's raw text.
        """
        if j > self.pos:
            text = self.buf[self.pos : j]
            self.pos = j
            if self.out.calling:
                self.out.raw(text)
            else:
                self.held.append(text)

    def stream_until(self, ends: MarkerSet, final: bool, emit: Callable[[str], None]) -> tuple[int, str | None]:
        """Pass the text up to the next of ``ends`` to ``emit`` and :meth:`hold` it.

        For a raw value streamed into a call until its end marker. Returns ``ends.find``'s
        ``(index, marker)``; the marker itself is left unconsumed.
        """
        pos = self.pos
        i, marker = ends.find(self.buf, pos, final)
        if i > pos:
            emit(self.buf[pos:i])
            self.hold(i)
        return i, marker

    def marker_after_space(
        self, ends: MarkerSet, final: bool, start: int | None = None
    ) -> tuple[int, str | None] | None:
        """Which of ``ends``, if any, comes after the whitespace at ``start`` (``pos`` by default).

        At most LOOKAHEAD whitespace characters are looked past. ``(index after the whitespace,
        marker or None)``, or None while more text could still change the answer.
        """
        buf = self.buf
        start = self.pos if start is None else start
        i = skip_space(buf, start, self.LOOKAHEAD)
        if i >= len(buf) and not final and i - start < self.LOOKAHEAD:
            return None
        marker, undecided = ends.match(buf, i, final)
        return None if undecided else (i, marker)

    def markup_after_space(self, ends: MarkerSet, final: bool) -> bool:
        """Consume the whitespace and then one of ``ends`` as markup, when that marker follows.

        True when decided (whether or not a marker was there, as :meth:`marker_after_space` looks);
        False, consuming nothing, while more text could still decide.
        """
        found = self.marker_after_space(ends, final)
        if found is None:
            return False
        i, marker = found
        if marker is not None:
            self.markup(i + len(marker))
        return True

    def commit(self, name: str, call_id: str | None = None) -> bool:
        """Announce a tool call; False (nothing announced) if the name is empty or undeclared."""
        name = name.strip()
        if not name or (self.opts.tools is not None and name not in self.opts.tools):
            return False
        if self.out.calling:
            self.out.end_call()
        self.out.begin_call(name, call_id or None)
        if self.held:
            self.out.raw("".join(self.held))
            self.held.clear()
        return True

    def fallback(self) -> None:
        """Give up on an uncommitted construct: what it held becomes content."""
        if self.held:
            text = "".join(self.held)
            self.held.clear()
            self.out.content(text)

    def markup_held(self) -> None:
        """Keep an uncommitted construct as syntax: what it held becomes markup."""
        if self.held:
            self.out.markup("".join(self.held))
            self.held.clear()

    def end_call(self, error: str | None = None) -> None:
        self.out.end_call(error)

    # -- reasoning anywhere --------------------------------------------------------------------

    def body_markers(self, markers: Iterable[str]) -> MarkerSet:
        """The markers a body state looks for: its own, and the tags that open a think block."""
        return MarkerSet([*markers, *(self.think.start if self.think is not None else ())])

    def think_opens(self, marker: str | None) -> bool:
        """Whether ``marker`` (found by a body state, at ``pos``) opens a think block; if so, enter it.

        Reasoning may come more than once, between content and between calls (interleaved thinking):
        each block joins ``reasoning_content``.
        """
        if marker is None or self.think is None or marker not in self.think.start:
            return False
        self._think_tag(marker)
        self.pos += len(marker)
        self.state = self.s_think
        return True

    # -- reasoning prelude ---------------------------------------------------------------------

    def _think_text(self, text: str) -> None:
        if self.opts.extract_reasoning:
            self.out.reasoning(text)
        else:
            self.out.content(text)

    def _think_tag(self, text: str) -> None:
        if self.opts.extract_reasoning:
            self.out.markup(text)
        else:
            self.out.content(text)

    def _leading_tag(self, final: bool) -> tuple[bool, str | None]:
        """Take leading whitespace aside, then look for a start tag: ``(decided, tag or None)``."""
        buf, pos = self.buf, self.pos
        i = skip_space(buf, pos)
        if i > pos:
            self._lead.append(buf[pos:i])
            self.pos = i
        if i == len(buf) and not final:
            return False, None
        tag, undecided = self._think_starts.match(buf, i, final)
        return not undecided, tag

    def s_start(self, final: bool) -> bool:
        """Output start, outside reasoning: a think block may open after leading whitespace."""
        pos = self.pos
        decided, tag = self._leading_tag(final)
        if not decided:
            return self.pos > pos
        lead = "".join(self._lead)
        self._lead.clear()
        if tag is not None:
            self._think_tag(lead + tag)
            self.pos += len(tag)
            self.state = self.s_think
        else:
            self.out.content(lead)
            self.state = self.s_body
        return True

    def s_think_open(self, final: bool) -> bool:
        """Output start when the prompt already opened the think block.

        A model that writes the opening tag again gets it treated as markup (llama.cpp keeps it in
        the reasoning text; see the vector-test deviations).
        """
        pos = self.pos
        decided, tag = self._leading_tag(final)
        if not decided:
            return self.pos > pos
        self._think_text("".join(self._lead))
        self._lead.clear()
        if tag is not None:
            self._think_tag(tag)
            self.pos += len(tag)
        self.state = self.s_think
        return True

    def s_think(self, final: bool) -> bool:
        """Inside reasoning: stream it until an end tag or an implicit end."""
        assert self.think is not None
        buf, pos = self.buf, self.pos
        i, marker = self._think_ends.find(buf, pos, final)
        if i > pos:
            self._think_text(buf[pos:i])
            self.pos = i
        if marker is None:
            if final:
                self.state = self.s_body
                return True
            return i > pos
        if marker in self.think.end:
            self._think_tag(marker)
            self.pos = i + len(marker)
            self.state = self.s_body
            return True
        follow = self._implicit[marker]
        if follow is None:
            self.state = self.s_body
            return True
        j = skip_space(buf, i + len(marker), self.LOOKAHEAD)
        if buf.startswith(follow, j):
            self.state = self.s_body
            return True
        waiting = len(buf) - j < len(follow) and follow.startswith(buf[j:])
        if waiting and not final and j - i - len(marker) < self.LOOKAHEAD:
            return i > pos
        self._think_text(marker)
        self.pos = i + len(marker)
        return True


class StopFilter:
    """End-of-turn markers at the end of the text are markup: what a server returns with special
    tokens skipped (``Answer.<|im_end|>`` gives the content ``Answer.``).

    It sits in front of a machine. The trailing run of whitespace and stop markers is held back; when
    anything else follows, the run was part of the text after all and goes to the machine. At the end,
    the run from its first stop marker on is markup, and the machine never sees it. A stop marker in
    the middle of the text stays whatever the machine makes of it.
    """

    def __init__(self, machine: MachineBase, stops: Iterable[str]) -> None:
        self.machine = machine
        self._stops = MarkerSet(stops)
        first = "".join(re.escape(c) for c in sorted({m[0] for m in self._stops.markers}))
        self._candidate = re.compile(rf"[\s{first}]")
        self._run: list[str] = []  # the held run: whitespace and whole stop markers
        self._marked = -1  # where in the run the first stop marker is, or -1
        self._partial = ""  # a stop marker's first characters at the very end

    def feed(self, text: str) -> None:
        s = self._partial + text
        self._partial = ""
        out: list[str] = []
        i, n = 0, len(s)
        while i < n:
            if not self._run:
                found = self._candidate.search(s, i)
                j = found.start() if found else n
                if j > i:
                    out.append(s[i:j])
                    i = j
                    continue
            if s[i].isspace():
                j = skip_space(s, i)
                self._run.append(s[i:j])
                i = j
                continue
            marker, undecided = self._stops.match(s, i, final=False)
            if marker is not None:
                if self._marked < 0:
                    self._marked = len(self._run)
                self._run.append(marker)
                i += len(marker)
            elif undecided:
                self._partial = s[i:]
                break
            else:  # not the end of the text: the run was text
                out += self._run
                out.append(s[i])
                self._run.clear()
                self._marked = -1
                i += 1
        if out:
            self.machine.feed("".join(out))

    def finish(self) -> None:
        run, marked = self._run, self._marked
        if self._partial:  # the start of a marker that never came: text
            run, marked = [*run, self._partial], -1
        text = "".join(run if marked < 0 else run[:marked])
        if text:
            self.machine.feed(text)
        self.machine.finish()
        if marked >= 0:
            self.machine.out.markup("".join(run[marked:]))
        self._run, self._partial = [], ""


class KeyedArgsMachine(MachineBase):
    """A machine whose calls are a name, then arguments read one key at a time (Gemma, XML-style).

    The call is announced at its first argument, or at its end when it has none, so a stray opener
    in prose never becomes a call. Subclasses set ``_name`` (and reset ``_writer``) when they read a
    call's name, and say in ``_give_up`` what happens to a construct that is not a call.
    """

    def __init__(self, out: Sink, opts: Options, think: ThinkSpec | None = None) -> None:
        super().__init__(out, opts, think)
        self._name = ""
        self._writer: ArgsWriter | None = None

    def _give_up(self) -> None:
        raise NotImplementedError

    def _commit(self) -> bool:
        """Announce the call if that is not done yet; False (after giving up) if its name is refused."""
        if self._writer is None:
            if not self.commit(self._name):
                self._give_up()
                return False
            self._writer = ArgsWriter(self.out.args)
        return True
