"""A format as data (:class:`Format`), and the :class:`Decoder` that runs it with fixed options.

A format names a family machine and configures it: its markers, its reasoning tags, how its ids look.
The catalog (:mod:`.catalog`) lists the known ones; detection (:mod:`.detect`) may learn a new one
from a template. Either way a :class:`Decoder` runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .base import AssistantMessage, DecodeStream, Sink
from .machine import MachineBase, Options, StopFilter, ThinkSpec

if TYPE_CHECKING:
    from ..render import ChatTemplate

__all__ = ["Build", "Decoder", "Format", "IdStyle"]

Build = Callable[[Sink, Options, "ThinkSpec | None"], MachineBase]
#: how generated call ids look: ``call_`` plus 24 alphanumerics, or Mistral's exactly 9 alphanumerics
IdStyle = Literal["openai", "mistral"]


@dataclass(frozen=True, slots=True)
class Format:
    """One output format: how to build its machine, and its reasoning conventions."""

    name: str
    summary: str
    build: Build
    think: ThinkSpec | None = None
    #: the format's serving-stack parser assumes the prompt opened the think block
    forced_open: bool = False
    #: its templates open the think block in the prompt when ``enable_thinking`` is true
    opens_think: bool = False
    #: the literal markers of its tool-call syntax (reasoning tags are in ``think``)
    syntax: tuple[str, ...] = ()
    #: Ollama's template-derived formats: the ``tag`` option picks the marker
    uses_tag: bool = False
    #: detection preference: ties go to the lower rank; None: never chosen by detection (a variant,
    #: an alias, or a runtime heuristic), so a new format is detected only where it says so
    rank: int | None = None
    id_style: IdStyle = "openai"

    @property
    def markers(self) -> tuple[str, ...]:
        """Every literal marker of the format: tool-call syntax and reasoning tags."""
        think = self.think
        tags = (*think.start, *think.end, *(m for m, _ in think.implicit)) if think else ()
        return tuple(dict.fromkeys((*self.syntax, *tags)))


class Decoder:
    """Decodes one output format with fixed options; cheap to keep and reuse.

    >>> from chatcodec.decoders import decoder
    >>> d = decoder("hermes")
    >>> d.decode('Sure.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>').tool_calls[0].arguments
    {'x': 1}
    """

    __slots__ = ("format", "options", "template")

    def __init__(self, fmt: Format, options: Options, *, template: ChatTemplate | None = None) -> None:
        self.format = fmt
        self.options = options
        self.template = template

    @property
    def name(self) -> str:
        return self.format.name

    def stream(self, *, trace: bool = False) -> DecodeStream:
        """A fresh incremental decoder (see :class:`DecodeStream`)."""
        fmt, opts = self.format, self.options

        def make(sink: Sink) -> MachineBase | StopFilter:
            machine = fmt.build(sink, opts, fmt.think)
            return StopFilter(machine, opts.stops) if opts.stops else machine

        return DecodeStream(make, trace=trace, id_style=fmt.id_style)

    def decode(self, text: str | bytes) -> AssistantMessage:
        """Decode a whole completion: the same as feeding it to :meth:`stream` and finishing."""
        stream = self.stream()
        stream.feed(text)
        stream.finish()
        return stream.message

    def __repr__(self) -> str:
        o = self.options
        return (
            f"<Decoder {self.format.name!r} reasoning={'on' if o.extract_reasoning else 'off'}"
            f" forced_open={o.forced_open}>"
        )
