"""Anthropic's Messages API (``POST /v1/messages`` and ``/v1/messages/count_tokens``), as the ``anthropic`` SDK
sends it.

:func:`parse_messages` turns the request into the internal :class:`~chatcodec.server.protocol.ChatRequest`:
``system`` becomes the system message, ``tool_use`` blocks assistant tool calls, each ``tool_result`` a tool
message (an ``is_error`` one says so in its text), ``thinking`` blocks the assistant turn's reasoning, and
``tool_choice`` ``any`` is chat's ``required``. :func:`message_object` and :class:`EventStream` turn the answer
back into ``content`` blocks with ``stop_reason`` and ``usage``, whole or as the event stream. Errors have
Anthropic's shape (:func:`error_body`).

>>> req = parse_messages({"model": "m", "max_tokens": 9, "system": "Be brief.",
...                       "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})
>>> req.messages, req.max_tokens
([{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}], 9)
>>> error_body(APIError(404, "No such model."))
{'type': 'error', 'error': {'type': 'not_found_error', 'message': 'No such model.'}}
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Mapping
from typing import Any

from ...decoders import Delta
from ..chat import Outcome
from ..errors import APIError
from ..protocol import ChatRequest, _check_schema, _type_name, parse_chat

__all__ = ["EventStream", "error_body", "message_object", "parse_messages"]

_KNOWN = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "thinking",
        "stream",
        "metadata",
        "service_tier",
    }
)
#: Anthropic's error types by status
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
}


def error_body(exc: APIError) -> dict[str, Any]:
    """``exc`` in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": _TYPES.get(exc.status, "api_error"), "message": exc.message}}


def _fail(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, f"{where}: must be an object, not {_type_name(value)}.")
    return value


def _texts(value: Any, where: str) -> str:
    """A string, or a list of ``text`` blocks, as one string."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _fail(where, f"{where}: must be a string or a list of text blocks, not {_type_name(value)}.")
    out = []
    for j, block in enumerate(value):
        block = _object(block, f"{where}.{j}")
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise _fail(f"{where}.{j}", f"{where}.{j}: must be a text block with a string text.")
        out.append(block["text"])
    return "".join(out)


def parse_messages(body: Any, *, counting: bool = False) -> ChatRequest:
    """Read a ``/v1/messages`` body (``counting``: a ``count_tokens`` one, which has no ``max_tokens``); raise
    :class:`APIError` naming the first bad field, in Anthropic's dotted paths (``messages.0.content.1``)."""
    if not isinstance(body, dict):
        raise _fail("body", f"The request body must be a JSON object, not {_type_name(body)}.")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise _fail(unknown[0], f"{unknown[0]}: Extra inputs are not permitted.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _fail("model", "model: Field required (the model's name).")
    max_tokens = body.get("max_tokens")
    if not counting:
        if max_tokens is None:
            raise _fail("max_tokens", "max_tokens: Field required.")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _fail("max_tokens", f"max_tokens: must be a positive integer, not {max_tokens!r}.")
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _texts(body["system"], "system")})
    messages += _messages(body.get("messages"))
    tools = _tools(body.get("tools"))
    chat: dict[str, Any] = {"messages": messages, "model": body["model"]}
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        chat.update(_tool_choice(choice, bool(tools)))
    for key in ("temperature", "top_p", "stream"):
        if key in body:
            chat[key] = body[key]
    if not counting:
        chat["max_tokens"] = max_tokens
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature > 1:
        raise _fail("temperature", f"temperature: must be between 0 and 1, not {temperature}.")
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _fail("stop_sequences", "stop_sequences: must be a list of strings.")
        chat["stop"] = stops
    thinking = body.get("thinking")
    reasoning: dict[str, Any] = {}
    if thinking is not None:
        thinking = _object(thinking, "thinking")
        kind = thinking.get("type")
        if kind == "enabled":
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024:
                raise _fail("thinking.budget_tokens", "thinking.budget_tokens: must be an integer of at least 1024.")
            if isinstance(max_tokens, int) and budget >= max_tokens:
                raise _fail("thinking.budget_tokens", "thinking.budget_tokens: must be less than max_tokens.")
            reasoning = {"reasoning_effort": _effort(budget), "thinking_budget": budget}
        elif kind != "disabled":
            raise _fail("thinking.type", f"thinking.type: must be 'enabled' or 'disabled', not {kind!r}.")
        else:
            reasoning = {"reasoning_effort": "none", "thinking_budget": 0}
    metadata = body.get("metadata")
    if metadata is not None:
        _object(metadata, "metadata")
    try:
        req = parse_chat(chat)
    except APIError as exc:
        raise _renamed(exc) from None
    return dataclasses.replace(req, max_tokens_field="max_tokens", reasoning_field="thinking", **reasoning)


def _effort(budget: int) -> str:
    """The reasoning effort a thinking budget stands for (the table in docs/guide/dialects.md)."""
    return "low" if budget < 4096 else "medium" if budget < 16384 else "high"


def _renamed(exc: APIError) -> APIError:
    param = exc.param or ""
    if param.startswith("tools[") and ".function.parameters" in param:
        fixed = param.replace(".function.parameters", ".input_schema", 1).replace("[", ".").replace("]", "")
        return APIError(exc.status, exc.message.replace(".function.parameters", ".input_schema", 1), param=fixed)
    if param == "stop":
        return APIError(exc.status, exc.message.replace("stop", "stop_sequences", 1), param="stop_sequences")
    return exc


def _messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise _fail("messages", "messages: Field required.")
    if not isinstance(value, list) or not value:
        raise _fail("messages", "messages: must be a non-empty list of messages.")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_use id -> the tool's name, for the results
    for i, raw in enumerate(value):
        where = f"messages.{i}"
        message = _object(raw, where)
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _fail(f"{where}.role", f"{where}.role: must be 'user' or 'assistant', not {role!r}.")
        content = message.get("content")
        if content is None:
            raise _fail(f"{where}.content", f"{where}.content: Field required.")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise _fail(f"{where}.content", f"{where}.content: must be a string or a list of blocks.")
        if role == "assistant":
            out.append(_assistant(content, f"{where}.content", names))
        else:
            out += _user(content, f"{where}.content", names)
    return out


def _assistant(blocks: list[Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": None}
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, raw in enumerate(blocks):
        bw = f"{where}.{j}"
        block = _object(raw, bw)
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _fail(f"{bw}.text", f"{bw}.text: must be a string.")
            texts.append(block["text"])
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise _fail(f"{bw}.thinking", f"{bw}.thinking: must be a string.")
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted by another server: nothing this model can read
        elif kind == "tool_use":
            for key in ("id", "name"):
                if not isinstance(block.get(key), str) or not block[key]:
                    raise _fail(f"{bw}.{key}", f"{bw}.{key}: must be a non-empty string.")
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise _fail(f"{bw}.input", f"{bw}.input: must be an object.")
            names[block["id"]] = block["name"]
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        else:
            raise _fail(f"{bw}.type", f"{bw}.type: an assistant turn holds text, thinking and tool_use, not {kind!r}.")
    if texts:
        turn["content"] = "".join(texts)
    if thinking:
        turn["reasoning_content"] = "".join(thinking)
    if calls:
        turn["tool_calls"] = calls
    elif not texts:
        turn["content"] = ""
    return turn


def _user(blocks: list[Any], where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn's blocks: each tool result a tool message (first, as they answer the last calls), then the
    user's text, if any."""
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, raw in enumerate(blocks):
        bw = f"{where}.{j}"
        block = _object(raw, bw)
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _fail(f"{bw}.text", f"{bw}.text: must be a string.")
            texts.append(block["text"])
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise _fail(f"{bw}.tool_use_id", f"{bw}.tool_use_id: Field required.")
            text = _texts(block.get("content", ""), f"{bw}.content")
            is_error = block.get("is_error", False)
            if not isinstance(is_error, bool):
                raise _fail(f"{bw}.is_error", f"{bw}.is_error: must be true or false.")
            if is_error:
                text = f"Error: {text}"
            result = {"role": "tool", "tool_call_id": call_id, "content": text}
            if call_id in names:
                result["name"] = names[call_id]
            results.append(result)
        elif kind in ("image", "document", "audio"):
            raise _fail(f"{bw}.type", f"{bw}: is an {kind} block; this server reads text only.")
        else:
            raise _fail(f"{bw}.type", f"{bw}.type: a user turn holds text and tool_result, not {kind!r}.")
    out = results
    if texts or not results:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail("tools", f"tools: must be a list, not {_type_name(value)}.")
    out = []
    for i, raw in enumerate(value):
        where = f"tools.{i}"
        tool = _object(raw, where)
        if tool.get("type", "custom") != "custom":
            raise _fail(f"{where}.type", f"{where}.type: this server runs no server tools ({tool.get('type')!r}).")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _fail(f"{where}.name", f"{where}.name: Field required.")
        if "input_schema" not in tool:
            raise _fail(f"{where}.input_schema", f"{where}.input_schema: Field required.")
        _check_schema(tool["input_schema"], f"{where}.input_schema")
        fn = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(value: Any, has_tools: bool) -> dict[str, Any]:
    choice = _object(value, "tool_choice")
    kind = choice.get("type")
    out: dict[str, Any] = {}
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None:
        if not isinstance(disable, bool):
            raise _fail("tool_choice.disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use: a boolean.")
        out["parallel_tool_calls"] = not disable
    if kind == "auto":
        out["tool_choice"] = "auto" if has_tools else "none"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        raise _fail("tool_choice.type", f"tool_choice.type: must be auto, any, tool or none, not {kind!r}.")
    return out


# --- the answer ---------------------------------------------------------------------------------------

_STOPS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _stop(outcome: Outcome) -> dict[str, Any]:
    """``stop_reason`` and ``stop_sequence``: ``stop_sequence`` with the one met when a stop string ended the text."""
    if outcome.stop is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": outcome.stop}
    return {"stop_reason": _STOPS.get(outcome.finish, "end_turn"), "stop_sequence": None}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _arguments(call: Mapping[str, Any]) -> Any:
    return json.loads(call["arguments"]) if call["arguments"] else {}


def message_object(outcome: Outcome, model: str, mid: str | None = None) -> dict[str, Any]:
    """The whole answer (``type: "message"``)."""
    content: list[dict[str, Any]] = []
    if outcome.reasoning:
        content.append({"type": "thinking", "thinking": outcome.reasoning, "signature": ""})
    if outcome.content:
        content.append({"type": "text", "text": outcome.content})
    for call in outcome.calls:
        content.append({"type": "tool_use", "id": call["id"], "name": call["name"], "input": _arguments(call)})
    return {
        "id": mid or new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        **_stop(outcome),
        "usage": {"input_tokens": outcome.prompt_tokens, "output_tokens": outcome.completion_tokens},
    }


class EventStream:
    """The answer as the Messages API's server-sent events: :meth:`start` (``message_start``), :meth:`feed` for
    each of the service's deltas (``content_block_start``, ``content_block_delta`` with ``text_delta``,
    ``thinking_delta`` or ``input_json_delta``, ``content_block_stop``), then :meth:`finish` (``message_delta``
    with ``stop_reason`` and ``usage``, ``message_stop``)."""

    def __init__(self, model: str, input_tokens: int) -> None:
        self.mid = new_id("msg")
        self.model = model
        self.input_tokens = input_tokens
        self._index = -1
        self._open: str | None = None  # the kind of the block being streamed
        self._call: int | None = None  # its decoder index, for a tool_use block

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n".encode()

    def start(self) -> list[bytes]:
        message: dict[str, Any] = {
            "id": self.mid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [self._event("message_start", message=message)]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [self._event("content_block_stop", index=self._index)]

    def _begin(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._index += 1
        self._open = kind
        out.append(self._event("content_block_start", index=self._index, content_block=block))
        return out

    def feed(self, delta: Delta) -> list[bytes]:
        out: list[bytes] = []
        tc = delta.tool_call
        if tc is not None:
            if tc.name is not None:
                out += self._begin("tool_use", {"type": "tool_use", "id": tc.id, "name": tc.name, "input": {}})
                self._call = tc.index
            if tc.arguments and self._open == "tool_use" and self._call == tc.index:
                out.append(
                    self._event(
                        "content_block_delta",
                        index=self._index,
                        delta={"type": "input_json_delta", "partial_json": tc.arguments},
                    )
                )
            return out
        if delta.reasoning_content:
            if self._open != "thinking":
                out += self._begin("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(
                self._event(
                    "content_block_delta",
                    index=self._index,
                    delta={"type": "thinking_delta", "thinking": delta.reasoning_content},
                )
            )
            return out
        if delta.content:
            if self._open != "text":
                out += self._begin("text", {"type": "text", "text": ""})
            out.append(
                self._event(
                    "content_block_delta", index=self._index, delta={"type": "text_delta", "text": delta.content}
                )
            )
        return out

    def finish(self, outcome: Outcome) -> list[bytes]:
        out = self._close()
        delta = _stop(outcome)
        usage = {"input_tokens": outcome.prompt_tokens, "output_tokens": outcome.completion_tokens}
        out.append(self._event("message_delta", delta=delta, usage=usage))
        out.append(self._event("message_stop"))
        return out

    def error(self, exc: APIError) -> bytes:
        return self._event("error", error=error_body(exc)["error"])
