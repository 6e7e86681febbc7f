"""gpt-oss harmony: messages with a header (role, channel, recipient) and a body.

``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>commentary to=functions.f
<|constrain|>json<|message|>{...}<|call|>``. A body addressed to a recipient is a tool call whose
arguments are the body verbatim (JSON or not); otherwise the ``analysis`` channel is reasoning and
``commentary`` (a preamble) and ``final`` are content. The generation prompt usually ends with
``<|start|>assistant``, so the output may start with `` to=...`` or ``<|channel|>``.
"""

from __future__ import annotations

from .base import Sink
from .machine import MachineBase, MarkerSet, Options, ThinkSpec, markers, skip_space
from .values import valid_name

__all__ = ["CHANNEL", "CONSTRAIN", "ENDS", "MESSAGE", "START", "HarmonyMachine"]

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
HEADER_LIMIT = 512


def parse_header(text: str) -> tuple[str, str | None]:
    """``(channel, recipient)`` from a header such as ``assistant<|channel|>commentary to=functions.f``.

    >>> parse_header(" to=functions.f<|channel|>commentary <|constrain|>json")
    ('commentary', 'functions.f')
    """
    text = text.replace(START, " ").replace(CONSTRAIN, " ")
    role, _, channel_part = text.partition(CHANNEL)
    words = channel_part.split()
    channel = words[0] if words and not words[0].startswith("to=") else ""
    recipient = None
    for word in (*role.split(), *words):
        if word.startswith("to="):
            recipient = word[3:] or None
    return channel, recipient


class HarmonyMachine(MachineBase):
    """The state machine for harmony output."""

    def __init__(self, out: Sink, opts: Options, think: ThinkSpec | None = None) -> None:
        super().__init__(out, opts, None)
        self._header_start = MarkerSet((START, CHANNEL, "to=", "assistant"))
        self._reentry = MarkerSet((START, CHANNEL))
        self._body_end = MarkerSet((*ENDS, START))
        self._header: list[str] = []
        self._kind = "content"
        self._blank = True  # a call's body has been only whitespace so far
        self._verbatim = False  # reasoning_format="none": an analysis message stays as written

    def s_body(self, final: bool) -> bool:
        """The start of the output (and of the text after a message): a header, or plain text."""
        buf, pos = self.buf, self.pos
        i = skip_space(buf, pos)
        self.hold(i)  # held with the header that may follow; content if none does
        if i >= len(buf) and not final:
            return i > pos
        marker, undecided = self._header_start.match(buf, i, final)
        if undecided:
            return i > pos
        if marker is None:
            self.fallback()
            self.state = self.s_text
            return True
        self._header = []
        self.state = self.s_header
        return True

    def s_text(self, final: bool) -> bool:
        """Text outside any message: content, until a header starts again."""
        pos = self.pos
        i, marker = self._reentry.find(self.buf, pos, final)
        self.emit(i)
        if marker is None:
            return i > pos
        self._header = []
        self.state = self.s_header
        return True

    def s_header(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        size = sum(map(len, self._header))
        limit = pos + HEADER_LIMIT - size
        i, marker = markers(MESSAGE).find(buf, pos, final, limit + 1)
        end = min(i, limit)
        newline = buf.find("\n", pos, end)  # a header is one line: fail exactly there
        bad = newline >= 0
        if bad:
            end = newline
        self._header.append(buf[pos:end])
        self.hold(end)
        if bad or end >= limit or (marker is None and final):
            self.fallback()
            self.state = self.s_text
            return True
        if marker is None:
            return end > pos
        channel, recipient = parse_header("".join(self._header))
        self.hold(i + len(MESSAGE))
        if recipient is not None:
            name = recipient.removeprefix("functions.")
            if valid_name(name) and self.commit(name):
                self._kind, self._blank = "call", True
                self.state = self.s_message
                return True
            self.fallback()
            self._kind = "content"
        elif channel == "analysis" and self.opts.extract_reasoning:
            self._kind = "reasoning"
            self.markup_held()
        else:
            self._kind = "content"
            self._verbatim = channel == "analysis"
            if self._verbatim:
                self.fallback()
            else:
                self.markup_held()
        self.state = self.s_message
        return True

    def s_message(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        i, marker = self._body_end.find(buf, pos, final)
        if i > pos:
            text = buf[pos:i]
            if self._kind == "call":
                self.out.args(text)
                self._blank = self._blank and text.isspace()
                self.hold(i)
            elif self._kind == "reasoning":
                self.out.reasoning(text)
                self.pos = i
            else:
                self.emit(i)
        if marker is None and not final:
            return i > pos
        if marker is not None and marker != START:
            if self._kind == "call":
                self.hold(i + len(marker))
            elif self._verbatim:
                self.emit(i + len(marker))
            else:
                self.markup(i + len(marker))
        if self._kind == "call":
            if self._blank and marker is not None:
                self.out.args("{}")  # an empty body: a call without arguments
            self.end_call()
        self._kind, self._verbatim = "content", False
        self.state = self.s_body
        return True
