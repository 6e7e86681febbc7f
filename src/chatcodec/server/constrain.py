"""Which constraint a chat request gets, in the output syntax its decoder reads.

- ``tool_choice`` ``"required"`` or a named function: a call (or several, with parallel calls), with
  arguments valid for the tool's schema;
- ``response_format``: one JSON value for the schema, or any JSON object;
- ``tool_choice`` ``"auto"``: free text or calls; for the generic format that is the JSON envelope
  ``{"response": "..."}`` or a call, for formats with markers, text without the call marker followed
  by calls;
- otherwise nothing.

See :mod:`chatcodec.server.grammar` for the grammar itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends import Constraint
from ..exceptions import ChatcodecError
from ..render import ChatTemplate
from .grammar import GrammarBuilder, gbnf_literal
from .protocol import ResponseFormat

__all__ = ["Frame", "learn_frame", "response_constraint", "text_constraint", "tool_constraint"]

_PROBE_NAME = "get_weather"
_PROBE_ARGS = {"city": "Paris"}
_PROBE_ID = "a1b2c3d4e"
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": _PROBE_NAME,
            "description": "Get the current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@dataclass(frozen=True, slots=True)
class Frame:
    """A tool call as the template writes it: ``prefix`` NAME ``middle`` ARGUMENTS ``suffix``.

    ``id_in`` says where the template wrote a call id (``"prefix"`` or ``"middle"``, split at ``id_at``).
    """

    prefix: str
    middle: str
    suffix: str
    id_in: str = ""
    id_at: int = 0
    #: the template writes a ``<think>...</think>`` block before calls: the model may think first
    think: bool = False

    @property
    def marker(self) -> str:
        """The literal text that opens a call (empty when calls start with bare JSON)."""
        head = self.prefix.strip().split("\n")[0]
        return head.split("{")[0].strip()


def learn_frame(template: ChatTemplate, render_kwargs: Mapping[str, Any] | None = None) -> Frame | None:
    """How ``template`` writes one call after its generation prompt, or None when that cannot be seen."""
    kwargs = dict(render_kwargs or {})
    user = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": _PROBE_ID, "type": "function", "function": {"name": _PROBE_NAME, "arguments": _PROBE_ARGS}}
        ],
    }
    try:
        prompt = template.render(user, tools=_PROBE_TOOLS, add_generation_prompt=True, **kwargs)
        full = template.render([*user, call], tools=_PROBE_TOOLS, **kwargs)
    except ChatcodecError:
        return None
    if not full.startswith(prompt):
        return None
    turn = full[len(prompt) :]
    eos = template.special_tokens.get("eos_token")
    if eos and eos in turn:
        turn = turn[: turn.rindex(eos)]
    turn = turn.rstrip()
    at = turn.find(_PROBE_NAME)
    if at < 0:
        return None
    args_at = -1
    args_text = ""
    for text in (json.dumps(_PROBE_ARGS), json.dumps(_PROBE_ARGS, separators=(",", ":"))):
        args_at = turn.find(text, at)
        if args_at >= 0:
            args_text = text
            break
    if args_at < 0:
        return None
    prefix, middle = turn[:at], turn[at + len(_PROBE_NAME) : args_at]
    think = ""
    if "</think>" in prefix:  # an empty think block the template writes before calls in history
        cut = prefix.index("</think>") + len("</think>")
        think, prefix = prefix[:cut], prefix[cut:].lstrip()
    suffix = turn[args_at + len(args_text) :]
    if _PROBE_ID in suffix:
        return None
    for where, text in (("prefix", prefix), ("middle", middle)):
        if _PROBE_ID in text:
            cut = text.index(_PROBE_ID)
            text = text[:cut] + text[cut + len(_PROBE_ID) :]
            if where == "prefix":
                return Frame(text, middle, suffix, "prefix", cut, think=bool(think))
            return Frame(prefix, text, suffix, "middle", cut, think=bool(think))
    return Frame(prefix, middle, suffix, think=bool(think))


def _tool_parts(tool: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    fn = tool["function"]
    return fn["name"], fn.get("parameters") or {"type": "object"}


def tool_constraint(
    format_name: str,
    tools: Sequence[Mapping[str, Any]],
    choice: str,
    *,
    parallel: bool,
    frame: Frame | None,
) -> Constraint | None:
    """The constraint for ``tool_choice`` = ``choice`` ("auto", "required" or a function name)."""
    chosen = [t for t in tools if choice in ("auto", "required") or t["function"]["name"] == choice]
    allow_text = choice == "auto"
    if choice not in ("auto", "required"):
        parallel = False
    if format_name == "generic":
        return _generic(chosen, parallel=parallel, allow_text=allow_text)
    if frame is None or (allow_text and not frame.marker):
        return None
    return _framed(frame, chosen, parallel=parallel, allow_text=allow_text)


def _call_rules(g: GrammarBuilder, tools: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, Mapping[str, Any]]]:
    out = []
    for i, tool in enumerate(tools):
        name, params = _tool_parts(tool)
        args = g.schema(params, f"tool{i}-args", root=params)
        out.append((name, args, params))
    return out


def _generic(tools: Sequence[Mapping[str, Any]], *, parallel: bool, allow_text: bool) -> Constraint:
    g = GrammarBuilder()
    ws = g.primitive("ws")
    calls = []
    schemas = []
    for name, args, params in _call_rules(g, tools):
        body = (
            f'"{{" {ws} "\\"name\\"" {ws} ":" {ws} {gbnf_literal(json.dumps(name, ensure_ascii=False))} {ws} "," {ws}'
            f' "\\"arguments\\"" {ws} ":" {ws} {args} {ws} "}}"'
        )
        calls.append(g.rule("call", body))
        schemas.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
            }
        )
    call = g.rule("any-call", " | ".join(calls))
    call_schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    more = f' ( {ws} "," {ws} {call} )*' if parallel else ""
    root = f'"{{" {ws} "\\"tool_calls\\"" {ws} ":" {ws} "[" {ws} {call}{more} {ws} "]" {ws} "}}"'
    calls_schema: dict[str, Any] = {"type": "array", "items": call_schema, "minItems": 1}
    if not parallel:
        calls_schema["maxItems"] = 1
    schema: dict[str, Any] | None = {
        "type": "object",
        "properties": {"tool_calls": calls_schema},
        "required": ["tool_calls"],
    }
    what = "a call to " + " or ".join(t["function"]["name"] for t in tools)
    if allow_text:
        # "Otherwise, reply normally": an answer is text that does not open a JSON object.
        answer = g.rule("answer", _PLAIN_TEXT)
        root = f"{g.rule('calls', root)} | {answer}"
        schema = None
        what = "an answer or " + what
    return Constraint(g.build(root), schema, what)


#: an answer in the generic protocol: text that does not open a JSON object (which would be a call)
_PLAIN_TEXT = "[^{ \\t\\n\\r] [^\\x00]*"


def text_constraint() -> Constraint:
    """``tool_choice`` "none" in the generic protocol: a plain answer, never the JSON of a call."""
    return Constraint(f"root ::= {_PLAIN_TEXT}\n", None, "an answer without tool calls")


def _framed(frame: Frame, tools: Sequence[Mapping[str, Any]], *, parallel: bool, allow_text: bool) -> Constraint | None:
    g = GrammarBuilder()
    ws = g.primitive("ws")
    ident = g.rule("call-id", "[a-zA-Z0-9]{9}")
    calls = []
    for name, args, _ in _call_rules(g, tools):
        prefix, middle = gbnf_literal(frame.prefix), gbnf_literal(frame.middle)
        if frame.id_in == "prefix":
            prefix = f"{gbnf_literal(frame.prefix[: frame.id_at])} {ident} {gbnf_literal(frame.prefix[frame.id_at :])}"
        elif frame.id_in == "middle":
            middle = f"{gbnf_literal(frame.middle[: frame.id_at])} {ident} {gbnf_literal(frame.middle[frame.id_at :])}"
        parts = [prefix, gbnf_literal(name), middle, args, gbnf_literal(frame.suffix)]
        calls.append(g.rule("call", " ".join(p for p in parts if p != '""')))
    call = g.rule("any-call", " | ".join(calls))
    body = f"{call} ( {ws} {call} )*" if parallel else call
    if frame.think and not allow_text:
        thought = _text_without(g, "</think>")
        body = f'( "<think>" {thought} "</think>" {ws} )? {body}'
    what = "a call to " + " or ".join(t["function"]["name"] for t in tools)
    if allow_text:
        if frame.marker[0] in frame.marker[1:]:
            return None  # text without such a marker needs a full matcher; leave auto unconstrained
        free = _text_without(g, frame.marker)
        calls_rule = g.rule("calls", body)
        return Constraint(g.build(f"{free} ( {calls_rule} )?"), None, "text or " + what)
    return Constraint(g.build(body), None, what)


def _text_without(g: GrammarBuilder, marker: str) -> str:
    """A rule for any text that never contains ``marker``, whose first character occurs only once in it.

    State ``i`` has matched the first ``i`` characters of the marker; the marker's first character
    goes back to state 1, any other mismatch to state 0, and state ``len(marker)`` is never reached.
    """
    names = [f"free{i}" for i in range(len(marker))]
    first = marker[0]
    for i, ch in enumerate(marker):
        forward = f" | {gbnf_literal(ch)} {names[i + 1]}" if i + 1 < len(marker) else ""
        if i == 0:
            body = f"| {_not_chars(first)} {names[0]}{forward}"
        else:
            body = f"| {gbnf_literal(first)} {names[1]} | {_not_chars(ch + first)} {names[0]}{forward}"
        g.reserve(names[i], body)
    return names[0]


def _not_chars(chars: str) -> str:
    special = {"\\": "\\\\", "]": "\\]", "^": "\\^", "-": "\\-", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return "[^" + "".join(special.get(ch, ch) for ch in dict.fromkeys(chars)) + "]"


def response_constraint(fmt: ResponseFormat) -> Constraint:
    """One JSON value for ``response_format``."""
    g = GrammarBuilder()
    if fmt.type == "json_object" or fmt.schema is None:
        return Constraint(g.build(g.primitive("object")), {"type": "object"}, "a JSON object")
    rule = g.schema(fmt.schema, "answer", root=fmt.schema)
    return Constraint(g.build(rule), dict(fmt.schema), f"JSON for the schema {fmt.name or ''}".rstrip())
