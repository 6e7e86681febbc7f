"""The format table, and a :class:`Decoder` from a format plus options (:func:`make_decoder`).

A format is data (:class:`~.format.Format`): a family machine, its markers, its reasoning tags and a
few defaults. The catalog (:mod:`.catalog`) holds the known ones; their names are the ones used by
``shared/parse-vectors.jsonl`` (and so mostly by the serving stacks).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

from ..exceptions import DecodeError
from .catalog import ALIASES, CATALOG, REASONING_PARSERS
from .format import Decoder, Format
from .machine import Options
from .prompt import as_template, end_markers, template_think_state
from .values import main_type, schema_types

__all__ = [
    "REASONING_FORMATS",
    "Decoder",
    "ReasoningFormat",
    "formats",
    "get_format",
    "make_decoder",
    "with_reasoning_parser",
]

#: where reasoning goes: "auto" and "deepseek" into ``reasoning_content``, "none" left in ``content``
ReasoningFormat = Literal["none", "deepseek", "auto"]
REASONING_FORMATS: tuple[ReasoningFormat, ...] = get_args(ReasoningFormat)


def formats() -> list[str]:
    """Every format name :func:`decoder` accepts, sorted.

    >>> "hermes" in formats() and "gpt_oss" in formats()
    True
    """
    return sorted(CATALOG)


def get_format(name: str) -> Format:
    """The :class:`Format` named ``name`` (a catalog name, a vLLM tool-call parser or a llama.cpp
    chat-format name); :class:`DecodeError` with suggestions if unknown."""
    if not isinstance(name, str):
        raise DecodeError(f"An output format is named by a string, not {type(name).__name__}.")
    found = CATALOG.get(ALIASES.get(name, name))
    if found is not None:
        return found
    if name in REASONING_PARSERS:
        hint = f" {name!r} is a vLLM reasoning parser: pass it as reasoning_parser={name!r} with a tool-call format."
    else:
        close = difflib.get_close_matches(name, [*CATALOG, *ALIASES], n=3)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise DecodeError(f"Unknown output format {name!r}.{hint} Known formats: {', '.join(sorted(CATALOG))}.")


def with_reasoning_parser(fmt: Format, name: str) -> Format:
    """``fmt`` with the reasoning tags and start state of vLLM's reasoning parser ``name``."""
    if not isinstance(name, str) or name not in REASONING_PARSERS:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise DecodeError(f"Unknown reasoning parser {name!r}. Known reasoning parsers: {known}.")
    parser = REASONING_PARSERS[name]
    return dataclasses.replace(fmt, think=parser.think, forced_open=parser.forced_open, opens_think=parser.opens_think)


def make_decoder(
    fmt: Format,
    *,
    reasoning_format: str = "auto",
    thinking_forced_open: bool | None = None,
    enable_thinking: bool | None = None,
    tools: Iterable[Mapping[str, Any] | str] | None = None,
    tools_schema: Mapping[str, Any] | None = None,
    template: Any = None,
    tag: str | None = None,
    stop_markers: Iterable[str] | None = None,
) -> Decoder:
    """:func:`~chatcodec.decoders.decoder` for a :class:`Format` object (from the catalog, or learned)."""
    if not isinstance(reasoning_format, str) or reasoning_format not in REASONING_FORMATS:
        raise DecodeError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, not {reasoning_format!r}.")
    for option, value in (("thinking_forced_open", thinking_forced_open), ("enable_thinking", enable_thinking)):
        if value is not None and not isinstance(value, bool):
            raise DecodeError(f"{option} must be True, False or None, not {value!r}.")
    if tag is not None and not isinstance(tag, str):
        raise DecodeError(f"tag must be a string, not {type(tag).__name__}.")
    chat = as_template(template) if template is not None else None
    stops = _read_stops(stop_markers) if stop_markers is not None else end_markers(chat) if chat is not None else ()
    if thinking_forced_open is None and chat is not None:
        state = template_think_state(chat, fmt.think, enable_thinking)
        if state is not None:
            thinking_forced_open = state == "open"
    if thinking_forced_open is None:
        thinking_forced_open = enable_thinking if fmt.opens_think and enable_thinking is not None else None
    if thinking_forced_open is None:
        thinking_forced_open = fmt.forced_open if enable_thinking is not False else False
    if tag is not None and not fmt.uses_tag:
        raise DecodeError(f"The tag option is for Ollama's template-tag formats, not {fmt.name!r}.")
    names, schemas = _read_tools(tools, tools_schema)
    opts = Options(
        extract_reasoning=reasoning_format != "none",
        forced_open=bool(thinking_forced_open) and fmt.think is not None,
        tools=names,
        schemas=schemas,
        tag=tag,
        stops=stops,
    )
    return Decoder(fmt, opts, template=chat)


def _read_stops(stops: Any) -> tuple[str, ...]:
    if isinstance(stops, str | bytes) or not isinstance(stops, Iterable):
        raise DecodeError("stop_markers must be a list of strings, such as ['<|im_end|>'].")
    found = tuple(stops)
    if not all(isinstance(stop, str) and stop for stop in found):
        raise DecodeError("stop_markers must be a list of non-empty strings, such as ['<|im_end|>'].")
    return found


def _read_tools(
    tools: Iterable[Mapping[str, Any] | str] | None, hints: Mapping[str, Any] | None
) -> tuple[frozenset[str] | None, dict[str, dict[str, str]]]:
    schemas: dict[str, dict[str, str]] = {}
    names: set[str] | None = None
    if tools is not None:
        if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Iterable):
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
