"""Which constraint a chat request gets, in the output syntax its decoder reads.

- ``tool_choice`` ``"required"`` or a named function: a call (or several, with parallel calls), with
  arguments valid for the tool's schema;
- ``response_format``: one JSON value for the schema, or any JSON object;
- ``tool_choice`` ``"auto"``: free text or calls; for the generic format that is the JSON envelope
  ``{"response": "..."}`` or a call, for formats with markers, text without the call marker followed
  by calls;
- otherwise nothing.

A reasoning model may think before it answers: where the generation prompt leaves a think block open
(Qwen3.5), the constraint starts with the rest of that thought and its closing tag; where the template writes
think blocks but the prompt opens none (Qwen3), the answer may start with one (:class:`Thinking`).

See :mod:`chatcodec.server.grammar` for the grammar itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends import Constraint
from ..capabilities import THINK_TAGS
from ..exceptions import ChatcodecError
from ..render import ChatTemplate
from .grammar import GrammarBuilder, gbnf_literal
from .protocol import ResponseFormat

__all__ = [
    "Frame",
    "Thinking",
    "learn_frame",
    "response_constraint",
    "text_constraint",
    "thinking_for",
    "tool_constraint",
]

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


@dataclass(frozen=True, slots=True)
class Thinking:
    """How an answer may begin with reasoning: with ``opened``, the generation prompt opened a think block that
    the answer must close (``end``) first; otherwise the answer may open one (``start`` ... ``end``) first."""

    start: str
    end: str
    opened: bool

    def prefix(self, g: GrammarBuilder) -> str:
        """The grammar of the reasoning before the answer."""
        thought = g.text_without(self.end)
        after = g.rule("after-thought", "[ \\t\\n]{0,8}")
        if self.opened:
            return f"{thought} {gbnf_literal(self.end)} {after}"
        return f"( {gbnf_literal(self.start)} {thought} {gbnf_literal(self.end)} {after} )?"


def thinking_for(template: ChatTemplate, enable_thinking: bool | None) -> Thinking | None:
    """Whether answers with ``template`` may start with reasoning (see :class:`Thinking`), or None."""
    caps = template.capabilities
    state = caps.think_state_for(enable_thinking)
    start, end = caps.think_tags or THINK_TAGS[0]
    if state == "open":
        return Thinking(start, end, opened=True)
    if state == "none" and caps.think_tags is not None:
        return Thinking(start, end, opened=False)
    return None


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
    thinking: Thinking | None = None,
) -> Constraint | None:
    """The constraint for ``tool_choice`` = ``choice`` ("auto", "required" or a function name)."""
    chosen = [t for t in tools if choice in ("auto", "required") or t["function"]["name"] == choice]
    allow_text = choice == "auto"
    if choice not in ("auto", "required"):
        parallel = False
    if format_name == "generic":
        return _generic(chosen, parallel=parallel, allow_text=allow_text, thinking=thinking)
    if frame is None or (allow_text and not frame.marker):
        return None
    if thinking is None and frame.think:
        thinking = Thinking(*THINK_TAGS[0], opened=False)
    return _framed(frame, chosen, parallel=parallel, allow_text=allow_text, thinking=thinking)


def _call_rules(g: GrammarBuilder, tools: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, Mapping[str, Any]]]:
    out = []
    for i, tool in enumerate(tools):
        name, params = _tool_parts(tool)
        args = g.schema(params, f"tool{i}-args", root=params)
        out.append((name, args, params))
    return out


def _generic(
    tools: Sequence[Mapping[str, Any]], *, parallel: bool, allow_text: bool, thinking: Thinking | None
) -> Constraint:
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
    if thinking is not None:
        root = f"{thinking.prefix(g)} ( {root} )"
        schema = None
    return Constraint(g.build(root), schema, what)


#: an answer in the generic protocol: text that does not open a JSON object (which would be a call). Its first
#: character is neither "{" nor any white space the decoder skips before one (``\\s``, Python's ``str.isspace``):
#: "\\x0b{...}" would otherwise be a call under tool_choice "none"
_PLAIN_TEXT = (
    "[^{\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000] [^\\x00]*"
)


def text_constraint(thinking: Thinking | None = None) -> Constraint:
    """``tool_choice`` "none" in the generic protocol: a plain answer, never the JSON of a call."""
    if thinking is None:
        return Constraint(f"root ::= {_PLAIN_TEXT}\n", None, "an answer without tool calls")
    g = GrammarBuilder()
    answer = g.rule("answer", _PLAIN_TEXT)
    return Constraint(g.build(f"{thinking.prefix(g)} {answer}"), None, "an answer without tool calls")


def _framed(
    frame: Frame,
    tools: Sequence[Mapping[str, Any]],
    *,
    parallel: bool,
    allow_text: bool,
    thinking: Thinking | None,
) -> Constraint:
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
    what = "a call to " + " or ".join(t["function"]["name"] for t in tools)
    if allow_text:
        # free text (a thought too: it holds no call marker) then calls, if any
        free = g.text_without(frame.marker)
        calls_rule = g.rule("calls", body)
        if thinking is not None and thinking.opened:
            body = f"{thinking.prefix(g)} {free} ( {calls_rule} )?"
        else:
            body = f"{free} ( {calls_rule} )?"
        return Constraint(g.build(body), None, "text or " + what)
    if thinking is not None:
        body = f"{thinking.prefix(g)} {body}"
    return Constraint(g.build(body), None, what)


def response_constraint(fmt: ResponseFormat, thinking: Thinking | None = None) -> Constraint:
    """One JSON value for ``response_format``, after the reasoning ``thinking`` allows."""
    g = GrammarBuilder()
    if fmt.type == "json_object" or fmt.schema is None:
        rule, schema, what = g.primitive("object"), {"type": "object"}, "a JSON object"
    else:
        rule = g.schema(fmt.schema, "answer", root=fmt.schema)
        schema, what = dict(fmt.schema), f"JSON for the schema {fmt.name or ''}".rstrip()
    if thinking is None:
        return Constraint(g.build(rule), schema, what)
    return Constraint(g.build(f"{thinking.prefix(g)} {rule}"), None, what)
