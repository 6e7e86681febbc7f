"""The format table and :func:`decoder`: a format name plus options gives a :class:`Decoder`.

A format is data: a family machine, its markers, its reasoning tags and a few defaults. The names
are the ones used by ``shared/parse-vectors.jsonl`` (and so mostly by the serving stacks).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..exceptions import DecodeError
from .base import AssistantMessage, DecodeStream, Sink
from .machine import MachineBase, Options, ThinkSpec
from .values import main_type, schema_types

Build = Callable[[Sink, Options, "ThinkSpec | None"], MachineBase]

#: where reasoning goes: "auto" and "deepseek" into ``reasoning_content``, "none" left in ``content``
ReasoningFormat = Literal["none", "deepseek", "auto"]
REASONING_FORMATS: tuple[ReasoningFormat, ...] = get_args(ReasoningFormat)


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

    @property
    def markers(self) -> tuple[str, ...]:
        """Every literal marker of the format: tool-call syntax and reasoning tags."""
        think = self.think
        tags = (*think.start, *think.end, *(m for m, _ in think.implicit)) if think else ()
        return tuple(dict.fromkeys((*self.syntax, *tags)))


_FORMATS: dict[str, Format] = {}


def register(fmt: Format, *aliases: str) -> None:
    """Add a format (and alias names for it) to the table."""
    for name in (fmt.name, *aliases):
        _FORMATS[name] = fmt


def formats() -> list[str]:
    """Every format name :func:`decoder` accepts, sorted.

    >>> "hermes" in formats() and "gpt_oss" in formats()
    True
    """
    _load()
    return sorted(_FORMATS)


def get_format(name: str) -> Format:
    """The :class:`Format` named ``name``; :class:`DecodeError` with suggestions if unknown."""
    _load()
    try:
        return _FORMATS[name]
    except KeyError:
        close = difflib.get_close_matches(name, _FORMATS, n=3)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise DecodeError(
            f"Unknown output format {name!r}.{hint} Known formats: {', '.join(sorted(_FORMATS))}."
        ) from None


def _load() -> None:
    if not _FORMATS:
        from . import catalog as _  # noqa: F401  (registers every format)


class Decoder:
    """Decodes one output format with fixed options; cheap to keep and reuse.

    >>> d = decoder("hermes")
    >>> d.decode('Sure.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>').tool_calls[0].arguments
    {'x': 1}
    """

    __slots__ = ("_think", "format", "options", "template")

    def __init__(self, fmt: Format, options: Options, *, think: ThinkSpec | None, template: Any = None) -> None:
        self.format = fmt
        self.options = options
        self.template = template
        self._think = think

    @property
    def name(self) -> str:
        return self.format.name

    def stream(self, *, trace: bool = False) -> DecodeStream:
        """A fresh incremental decoder (see :class:`DecodeStream`)."""
        fmt, opts, think = self.format, self.options, self._think
        return DecodeStream(lambda sink: fmt.build(sink, opts, think), trace=trace)

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


_OPTION_NAMES = (
    "reasoning_format",
    "thinking_forced_open",
    "enable_thinking",
    "tools",
    "tools_schema",
    "template",
    "tag",
)


def decoder(
    format: str,
    *,
    reasoning_format: ReasoningFormat = "auto",
    thinking_forced_open: bool | None = None,
    enable_thinking: bool | None = None,
    tools: Iterable[Mapping[str, Any] | str] | None = None,
    tools_schema: Mapping[str, Any] | None = None,
    template: Any = None,
    tag: str | None = None,
) -> Decoder:
    """A decoder for the output format ``format`` (see :func:`formats`).

    - ``reasoning_format``: ``"auto"`` and ``"deepseek"`` move reasoning into ``reasoning_content``;
      ``"none"`` leaves it (tags included) in ``content``.
    - ``thinking_forced_open``: the prompt already opened the think block, so the output starts
      inside reasoning. By default it follows ``enable_thinking`` for formats whose templates open
      the block themselves, else the format's own default.
    - ``tools``: OpenAI tool dicts or bare names. When given, calls to other names are not calls, and
      the parameter schemas type the values of XML-style arguments.
    - ``tools_schema``: ``{parameter: type}`` hints for every tool (``"integer"``, a JSON schema, or
      ``"anyOf[integer,null]"``).
    - ``template``: the chat template the prompt came from. A :class:`~chatcodec.ChatTemplate` sets
      ``thinking_forced_open`` from its generation prompt (with ``enable_thinking``) when that is not
      given; a name is only recorded. :func:`decoder_for` also picks the format from the template.
    - ``tag``: the tool-call tag for Ollama's template-derived formats.

    >>> decoder("deepseek_v3_1", thinking_forced_open=True).decode("Hmm.</think>Hi!").reasoning_content
    'Hmm.'
    """
    fmt = get_format(format)
    if thinking_forced_open is None and template is not None and not isinstance(template, str):
        from .detect import template_think_state

        state = template_think_state(template, format, enable_thinking)
        if state is not None:
            thinking_forced_open = state == "open"
    if reasoning_format not in REASONING_FORMATS:
        raise DecodeError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, not {reasoning_format!r}.")
    if thinking_forced_open is None:
        thinking_forced_open = enable_thinking if fmt.opens_think and enable_thinking is not None else None
    if thinking_forced_open is None:
        thinking_forced_open = fmt.forced_open if enable_thinking is not False else False
    if tag is not None and not fmt.uses_tag:
        raise DecodeError(f"The tag option is for Ollama's template-tag formats, not {format!r}.")
    names, schemas = _read_tools(tools, tools_schema)
    opts = Options(
        extract_reasoning=reasoning_format != "none",
        forced_open=bool(thinking_forced_open) and fmt.think is not None,
        tools=names,
        schemas=schemas,
        tag=tag,
    )
    return Decoder(fmt, opts, think=fmt.think, template=template)


def _read_tools(
    tools: Iterable[Mapping[str, Any] | str] | None, hints: Mapping[str, Any] | None
) -> tuple[frozenset[str] | None, dict[str, dict[str, str]]]:
    schemas: dict[str, dict[str, str]] = {}
    names: set[str] | None = None
    if tools is not None:
        if isinstance(tools, str | bytes | Mapping):
            raise DecodeError("tools must be a list of OpenAI tool dicts or tool names.")
        names = set()
        for tool in tools:
            name, params = _read_tool(tool)
            names.add(name)
            if params:
                schemas[name] = params
    if hints is not None:
        if not isinstance(hints, Mapping):
            raise DecodeError("tools_schema must map parameter names to types.")
        flat: dict[str, str] = {}
        for param, kind in hints.items():
            found = main_type(_hint_types(kind))
            if found is not None:
                flat[str(param)] = found
        schemas[""] = flat
    return (frozenset(names) if names is not None else None), schemas


def _read_tool(tool: Mapping[str, Any] | str) -> tuple[str, dict[str, str]]:
    if isinstance(tool, str):
        return tool, {}
    if not isinstance(tool, Mapping):
        raise DecodeError(f"A tool must be an OpenAI tool dict or a name, not {type(tool).__name__}.")
    fn = tool.get("function", tool)
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str) or not name:
        raise DecodeError("Each tool dict needs a function name: {'type': 'function', 'function': {'name': ...}}.")
    params = fn.get("parameters") if isinstance(fn, Mapping) else None
    props = params.get("properties") if isinstance(params, Mapping) else None
    types: dict[str, str] = {}
    if isinstance(props, Mapping):
        for param, schema in props.items():
            found = main_type(schema_types(schema))
            if found is not None:
                types[str(param)] = found
    return name, types


def _hint_types(kind: Any) -> list[str]:
    """Types from a ``tools_schema`` hint: a type name, ``anyOf[a,b]``, or a JSON schema."""
    if isinstance(kind, str) and kind.startswith(("anyOf[", "oneOf[")) and kind.endswith("]"):
        return [part.strip() for part in kind[6:-1].split(",") if part.strip()]
    return schema_types(kind)
