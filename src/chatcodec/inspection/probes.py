"""The conversations inspect, lint and diff render: every role, tools and reasoning, in forms a template takes.

Texts are needles (lower-case words and a short hex tag) that no template contains, so where each one
lands in a render says what the template did with it. :func:`conversation` shapes a full conversation to
what the template's capabilities say it accepts (call arguments as an object or a JSON string, ``""`` or
``null`` content beside tool calls, nine-character call ids), so that a finding is about the template's
behaviour, not about a form it was never meant to take.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ..capabilities import Capabilities
from ..exceptions import ChatcodecError
from ..render import ChatTemplate

__all__ = ["NOW", "TOOLS", "Needles", "conversation", "render_or_error", "tool_call_turn"]

#: the clock every probe render is pinned to
NOW = datetime(2026, 3, 14, 9, 26, 53)


class Needles:
    """The probe texts."""

    SYSTEM = "inspect system text 1f2a"
    USER = ("inspect user text 3b4c", "inspect user text 5d6e", "inspect user text 7f8a", "inspect user text 9b0c")
    ANSWER = ("inspect answer text 2c3d", "inspect answer text 4e5f", "inspect answer text 6a7b")
    REASONING = ("inspect reasoning text 8c9d", "inspect reasoning text 0e1f", "inspect reasoning text 2a3b")
    RESULT = "inspect tool result 4c5d"
    TOOL = "inspect_lookup"
    ARG_KEY = "query"
    ARG_VALUE = "inspect argument 6e7f"
    CALL_ID = "k4m8p2r6t"  # nine letters and digits: Mistral templates take nothing else


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": Needles.TOOL,
            "description": "Look something up.",
            "parameters": {
                "type": "object",
                "properties": {Needles.ARG_KEY: {"type": "string", "description": "What to look up."}},
                "required": [Needles.ARG_KEY],
            },
        },
    }
]


def tool_call_turn(caps: Capabilities, reasoning: str | None = None) -> dict[str, Any]:
    """An assistant turn with one call, in the form ``caps`` says the template takes."""
    arguments: Any = {Needles.ARG_KEY: Needles.ARG_VALUE}
    if caps.requires_string_arguments:
        arguments = json.dumps(arguments)
    call = {"id": Needles.CALL_ID, "type": "function", "function": {"name": Needles.TOOL, "arguments": arguments}}
    turn: dict[str, Any] = {
        "role": "assistant",
        "content": "" if caps.requires_non_null_content else None,
        "tool_calls": [call],
    }
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    return turn


def tool_result() -> dict[str, Any]:
    return {"role": "tool", "content": Needles.RESULT, "tool_call_id": Needles.CALL_ID, "name": Needles.TOOL}


def conversation(caps: Capabilities, *, tools: bool = True) -> list[dict[str, Any]]:
    """A conversation with every turn the template accepts, ending with a user turn.

    System (if supported), user, assistant with reasoning, user, then (if the template renders tool
    calls and results, and ``tools``) a call turn with reasoning and its result, and an answer with
    reasoning; then a last user turn.
    """
    n = Needles
    messages: list[dict[str, Any]] = []
    if caps.system:
        messages.append({"role": "system", "content": n.SYSTEM})
    messages += [
        {"role": "user", "content": n.USER[0]},
        {"role": "assistant", "content": n.ANSWER[0], "reasoning_content": n.REASONING[0]},
        {"role": "user", "content": n.USER[1]},
    ]
    if tools and caps.tool_calls and caps.tool_responses:
        messages += [
            tool_call_turn(caps, n.REASONING[1]),
            tool_result(),
            {"role": "assistant", "content": n.ANSWER[1], "reasoning_content": n.REASONING[2]},
            {"role": "user", "content": n.USER[2]},
        ]
    else:
        messages += [
            {"role": "assistant", "content": n.ANSWER[1], "reasoning_content": n.REASONING[1]},
            {"role": "user", "content": n.USER[2]},
        ]
    return messages


def uses_tools(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def render_or_error(template: ChatTemplate, messages: list[dict[str, Any]], **options: Any) -> str | ChatcodecError:
    """Render with the probe clock (and the probe tools where the conversation calls one); the error if it raises."""
    options.setdefault("now", NOW)
    if uses_tools(messages):
        options.setdefault("tools", TOOLS)
    try:
        return template.render(messages, **options)
    except ChatcodecError as exc:
        return exc
