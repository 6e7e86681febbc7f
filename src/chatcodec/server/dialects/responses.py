"""OpenAI's Responses API (``POST /v1/responses``), as the ``openai`` SDK's ``client.responses`` sends it.

:func:`parse_responses` turns the request into the internal :class:`~chatcodec.server.protocol.ChatRequest`:
``instructions`` become the system message, ``input`` items become chat messages (a ``function_call`` an
assistant tool call, a ``function_call_output`` a tool message, a ``reasoning`` item the next assistant turn's
reasoning), and ``previous_response_id`` puts the stored conversation first. :func:`response_object` and
:class:`EventStream` turn the answer back: ``output`` items (``reasoning``, ``message``, ``function_call``),
``status`` and ``usage``, whole or as the typed event stream with its ``sequence_number``.

>>> req = parse_responses({"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 5})
>>> req.chat.messages, req.chat.max_tokens, req.chat.max_tokens_field
([{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}], 5, 'max_output_tokens')
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...decoders import Delta
from ..chat import Outcome
from ..errors import APIError
from ..hosted import HostedCall, HostedTools
from ..protocol import ChatRequest, _check_schema, _type_name, parse_chat
from ..store import Stored

__all__ = [
    "EventStream",
    "MCPTool",
    "ResponsesRequest",
    "conversation",
    "input_items",
    "items_page",
    "parse_responses",
    "response_object",
]

#: the request's fields: those read, and those accepted with the one value this server honours
_KNOWN = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "max_output_tokens",
        "temperature",
        "top_p",
        "metadata",
        "store",
        "stream",
        "previous_response_id",
        "user",
        "truncation",
        "include",
        "service_tier",
        "top_logprobs",
        "stream_options",
        "prompt_cache_key",
        "safety_identifier",
        "background",
        "seed",
    }
)
_ROLES = ("user", "assistant", "system", "developer")


def _fail(param: str, message: str, status: int = 400) -> APIError:
    return APIError(status, message, param=param)


@dataclass(slots=True)
class ResponsesRequest:
    """A Responses request read: the internal request, the conversation it continues and adds (what a stored
    response keeps, without ``instructions``, which do not carry over), and the fields the answer echoes."""

    chat: ChatRequest
    history: list[dict[str, Any]]
    echo: dict[str, Any] = field(default_factory=dict)
    store: bool = True
    previous_response_id: str | None = None
    #: the request's ``{"type": "mcp"}`` tools, which the server runs itself
    mcp: list[MCPTool] = field(default_factory=list)
    #: the input items with their ids, those of the responses it continues first (``GET .../input_items``)
    items: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class MCPTool:
    """A request's ``{"type": "mcp"}`` tool: the label of one of the server's MCP servers, and the tools of it the
    model may call (the name it sees each under, to the tool as its server lists it)."""

    server_label: str
    tools: dict[str, dict[str, Any]]


def parse_responses(
    body: Any, load: Callable[[str], Stored | None] | None = None, hosted: HostedTools | None = None
) -> ResponsesRequest:
    """Read a ``/v1/responses`` body; ``load`` finds a stored response for ``previous_response_id`` (a 404 when it
    gives None; without ``load`` the request may not continue one); ``hosted`` are the MCP servers that ``mcp``
    tools may name (without them, none may). Raises :class:`APIError` naming the field."""
    if not isinstance(body, dict):
        raise _fail("body", f"The request body must be a JSON object, not {_type_name(body)}.")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise _fail(unknown[0], f"Unknown field {unknown[0]!r}: this server's /v1/responses does not take it.")
    _only(body, "truncation", ("disabled", "auto"))
    _only(body, "background", (False,))
    if body.get("top_logprobs") not in (None, 0):
        raise _fail("top_logprobs", "top_logprobs is not supported by this server.")
    include = body.get("include")
    if include is not None and not isinstance(include, list):
        raise _fail("include", f"include must be a list, not {_type_name(include)}.")
    metadata = _metadata(body.get("metadata"))
    previous = body.get("previous_response_id")
    history: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    if previous is not None:
        if not isinstance(previous, str) or not previous:
            raise _fail("previous_response_id", "previous_response_id must be a response id (a string).")
        stored = load(previous) if load is not None else None
        if stored is None:
            raise _fail("previous_response_id", f"No stored response has the id {previous!r}.", 404)
        history = list(stored.messages)
        items = [*stored.items, *stored.response.get("output", ())]
    history += _input(body.get("input"))
    items += input_items(body["input"])
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _fail("instructions", f"instructions must be a string, not {_type_name(instructions)}.")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + history
    tools, mcp = _tools(body.get("tools"), hosted)
    chat: dict[str, Any] = {"messages": messages}
    for key in ("temperature", "top_p", "stream", "parallel_tool_calls", "seed", "model"):
        if key in body:
            chat[key] = body[key]
    if tools:
        chat["tools"] = tools
    if "tool_choice" in body:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text_format = _text(body.get("text"))
    if text_format is not None:
        chat["response_format"] = text_format
    reasoning = body.get("reasoning")
    if reasoning is not None:
        reasoning = _object(reasoning, "reasoning")
        effort = reasoning.get("effort")
        if effort is not None:
            chat["reasoning_effort"] = effort
    if "max_output_tokens" in body:
        limit = body["max_output_tokens"]
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise _fail("max_output_tokens", f"max_output_tokens must be a positive integer, not {limit!r}.")
        chat["max_tokens"] = limit
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise _fail("store", f"store must be true or false, not {_type_name(store)}.")
    try:
        req = parse_chat(chat)
    except APIError as exc:
        raise _renamed(exc) from None
    req = _replace(req, max_tokens_field="max_output_tokens", reasoning_field="reasoning.effort")
    echo = {
        "instructions": instructions,
        "metadata": metadata,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": req.temperature if req.temperature is not None else 1.0,
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "max_output_tokens": req.max_tokens,
        "text": {"format": body.get("text", {}).get("format") or {"type": "text"}},
        "reasoning": {"effort": (reasoning or {}).get("effort"), "summary": (reasoning or {}).get("summary")},
        "truncation": body.get("truncation", "disabled"),
        "user": body.get("user"),
        "store": store,
        "previous_response_id": previous,
    }
    return ResponsesRequest(req, history, echo, store, previous, mcp, items)


def _replace(req: ChatRequest, **changes: Any) -> ChatRequest:
    import dataclasses

    return dataclasses.replace(req, **changes)


def _renamed(exc: APIError) -> APIError:
    """A chat-completions error about a field this dialect names otherwise, in this dialect's names."""
    param = exc.param or ""
    names = {
        "max_tokens": "max_output_tokens",
        "response_format": "text.format",
        "messages": "input",
        "reasoning_effort": "reasoning.effort",
    }
    for old, new in names.items():
        if param == old or param.startswith(old + ".") or param.startswith(old + "["):
            fixed = new + param[len(old) :]
            return APIError(exc.status, exc.message.replace(old, new, 1), param=fixed, kind=exc.kind)
    if param.startswith("tools[") and ".function." in param:
        fixed = param.replace(".function.", ".", 1)
        return APIError(exc.status, exc.message.replace(".function.", ".", 1), param=fixed, kind=exc.kind)
    return exc


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, f"{where} must be a JSON object, not {_type_name(value)}.")
    return value


def _only(body: Mapping[str, Any], key: str, allowed: tuple[Any, ...]) -> None:
    if body.get(key) is not None and body[key] not in allowed:
        raise _fail(key, f"{key} must be {' or '.join(map(repr, allowed))} here, not {body[key]!r}.")


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    value = _object(value, "metadata")
    if len(value) > 16:
        raise _fail("metadata", f"metadata takes at most 16 keys, not {len(value)}.")
    for key, item in value.items():
        if len(key) > 64 or not isinstance(item, str) or len(item) > 512:
            raise _fail(f"metadata.{key}", "metadata maps keys of up to 64 characters to strings of up to 512.")
    return dict(value)


def _text_of(content: Any, where: str) -> str:
    """The text of a message's ``content``: a string, or parts of ``input_text`` / ``output_text``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(where, f"{where} must be a string or a list of content parts, not {_type_name(content)}.")
    texts = []
    for j, part in enumerate(content):
        part = _object(part, f"{where}[{j}]")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "refusal"):
            text = part.get("text", part.get("refusal"))
            if not isinstance(text, str):
                raise _fail(f"{where}[{j}].text", f"{where}[{j}].text must be a string.")
            texts.append(text)
        elif kind in ("input_image", "input_file", "input_audio"):
            raise _fail(f"{where}[{j}].type", f"{where}[{j}] is an {kind} part; this server reads text only.")
        else:
            raise _fail(f"{where}[{j}].type", f"{where}[{j}].type must be input_text or output_text, not {kind!r}.")
    return "".join(texts)


def _input(value: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages: consecutive calls (and the reasoning before them) make one assistant turn."""
    if value is None:
        raise _fail("input", "input is required: a string or a list of input items.")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise _fail("input", f"input must be a string or a list of items, not {_type_name(value)}.")
    out: list[dict[str, Any]] = []
    reasoning: str | None = None

    def assistant() -> dict[str, Any]:
        """The assistant turn being built (the last message, when it is one that can take more)."""
        nonlocal reasoning
        if out and out[-1]["role"] == "assistant" and "_open" in out[-1]:
            turn = out[-1]
        else:
            turn = {"role": "assistant", "content": None, "_open": True}
            out.append(turn)
        if reasoning is not None:
            turn["reasoning_content"] = reasoning
            reasoning = None
        return turn

    for i, raw in enumerate(value):
        where = f"input[{i}]"
        item = _object(raw, where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _fail(f"{where}.role", f"{where}.role must be one of {', '.join(_ROLES)}, not {role!r}.")
            if "content" not in item:
                raise _fail(f"{where}.content", f"{where}.content is required for a message.")
            text = _text_of(item["content"], f"{where}.content")
            if role == "assistant":
                turn = assistant()
                turn["content"] = (turn["content"] or "") + text
            else:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str) or (key != "arguments" and not item[key]):
                    raise _fail(f"{where}.{key}", f"{where}.{key} must be a string for a function_call.")
            try:
                arguments = json.loads(item["arguments"]) if item["arguments"].strip() else {}
            except ValueError:
                raise _fail(f"{where}.arguments", f"{where}.arguments is not valid JSON.") from None
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": arguments},
            }
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _fail(f"{where}.call_id", f"{where}.call_id must be the call's id (a string).")
            output = item.get("output")
            output = _text_of(output, f"{where}.output")
            message: dict[str, Any] = {"role": "tool", "tool_call_id": item["call_id"], "content": output}
            name = _call_name(out, item["call_id"])
            if name is not None:
                message["name"] = name
            out.append(message)
        elif kind == "reasoning":
            parts = [*(item.get("content") or []), *(item.get("summary") or [])]
            texts = [p.get("text") for p in parts if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts):
                raise _fail(f"{where}.summary", f"{where}'s summary and content parts must hold text.")
            reasoning = "".join(t for t in texts if isinstance(t, str))
        else:
            raise _fail(
                f"{where}.type",
                f"{where}.type must be message, function_call, function_call_output or reasoning, not {kind!r}.",
            )
    for message in out:
        message.pop("_open", None)
    if not out:
        raise _fail("input", "input must hold at least one item.")
    return out


#: the id prefix of each input item type, as OpenAI's ids begin
_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A valid ``input`` (:func:`_input` read it) as the items ``GET .../input_items`` lists: each with its type,
    an ``id`` (the client's, or a new one) and a ``status``, a message's text as content parts."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    out = []
    for raw in value:
        item = {"type": "message", **raw}
        item.setdefault("id", new_id(_ITEM_PREFIX.get(item["type"], "item")))
        item.setdefault("status", "completed")
        if item["type"] == "message" and isinstance(item["content"], str):
            kind = "output_text" if item["role"] == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        out.append(item)
    return out


def items_page(items: list[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """A page of a stored response's input items in OpenAI's list shape, as ``query`` asks (``limit`` 1 to 100,
    default 20; ``order`` ``desc``, the default, or ``asc``; ``after`` an item id of the list).

    >>> page = items_page([{"id": "a"}, {"id": "b"}, {"id": "c"}], {"limit": "1", "after": "c"})
    >>> [i["id"] for i in page["data"]], page["first_id"], page["has_more"]
    (['b'], 'b', True)
    """
    unknown = sorted(set(query) - {"limit", "order", "after", "include", "include[]"})
    if unknown:
        raise _fail(unknown[0], f"Unknown query parameter {unknown[0]!r}: input_items takes limit, order and after.")
    limit = query.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise _fail("limit", f"limit must be an integer from 1 to 100, not {limit!r}.")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise _fail("order", f"order must be 'asc' or 'desc', not {order!r}.")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise _fail("after", f"after must be the id of one of the response's input items, not {after!r}.")
        start = ids.index(after) + 1
    data = ordered[start : start + int(limit)]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + len(data) < len(ordered),
    }


def _call_name(messages: list[dict[str, Any]], call_id: str) -> str | None:
    for message in reversed(messages):
        for call in message.get("tool_calls", ()):
            if call["id"] == call_id:
                name: str = call["function"]["name"]
                return name
    return None


def _tools(value: Any, hosted: HostedTools | None) -> tuple[list[dict[str, Any]], list[MCPTool]]:
    """The function tools (with those of the ``mcp`` tools' servers), and the ``mcp`` tools."""
    if value is None:
        return [], []
    if not isinstance(value, list):
        raise _fail("tools", f"tools must be a list, not {_type_name(value)}.")
    out: list[dict[str, Any]] = []
    mcp: list[MCPTool] = []
    for i, raw in enumerate(value):
        where = f"tools[{i}]"
        tool = _object(raw, where)
        if tool.get("type") == "mcp":
            mcp.append(_mcp_tool(tool, where, hosted))
            continue
        if tool.get("type") != "function":
            raise _fail(
                f"{where}.type", f"{where}.type must be 'function' or 'mcp' (this server runs no other hosted tools)."
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        if "parameters" in fn:
            _check_schema(fn["parameters"], f"{where}.parameters")
        out.append({"type": "function", "function": fn})
    labels = [m.server_label for m in mcp]
    twice = next((label for label in labels if labels.count(label) > 1), None)
    if twice is not None:
        raise _fail("tools", f"tools names the MCP server {twice!r} twice: give it once, with all its allowed_tools.")
    functions = {tool["function"].get("name") for tool in out}
    for m in mcp:
        clash = next((name for name in m.tools if name in functions), None)
        if clash is not None:
            raise _fail(
                "tools", f"tools has a function named {clash!r}, as a tool of the MCP server {m.server_label!r}."
            )
        out += [{"type": "function", "function": {**listed, "name": name}} for name, listed in m.tools.items()]
    return out, mcp


#: the fields of an ``mcp`` tool this server reads (it runs only the MCP servers it was started with)
_MCP_FIELDS = frozenset({"type", "server_label", "allowed_tools", "require_approval", "server_description"})


def _mcp_tool(tool: dict[str, Any], where: str, hosted: HostedTools | None) -> MCPTool:
    """An ``mcp`` tool, checked against the server's MCP servers (``chatcodec serve --mcp-config``)."""
    label = tool.get("server_label")
    if not isinstance(label, str) or not label:
        raise _fail(f"{where}.server_label", f"{where}.server_label must name one of this server's MCP servers.")
    servers = hosted.servers if hosted is not None else {}
    if label not in servers:
        known = ", ".join(map(repr, servers)) or "none: start it with --mcp-config FILE"
        raise _fail(
            f"{where}.server_label", f"{where}.server_label {label!r} is not an MCP server of this server ({known})."
        )
    unknown = sorted(set(tool) - _MCP_FIELDS)
    if unknown:
        raise _fail(
            f"{where}.{unknown[0]}",
            f"{where}.{unknown[0]} is not taken: this server runs the MCP servers it was started with, as configured.",
        )
    approval = tool.get("require_approval", "never")
    if approval != "never":
        raise _fail(
            f"{where}.require_approval",
            f"{where}.require_approval must be 'never': this server does not support approvals, not {approval!r}.",
        )
    allowed = tool.get("allowed_tools")
    if isinstance(allowed, dict):
        if set(allowed) - {"tool_names"}:
            raise _fail(f"{where}.allowed_tools", f"{where}.allowed_tools takes a list of names or tool_names only.")
        allowed = allowed.get("tool_names")
    if allowed is not None and (not isinstance(allowed, list) or not all(isinstance(n, str) for n in allowed)):
        raise _fail(f"{where}.allowed_tools", f"{where}.allowed_tools must be a list of tool names.")
    assert hosted is not None
    own = [listed["name"] for listed in servers[label].values()]
    missing = [name for name in allowed or () if name not in own]
    if missing:
        raise _fail(
            f"{where}.allowed_tools",
            f"{where}.allowed_tools names {missing[0]!r}, which the MCP server {label!r} does not have"
            f" (its tools: {', '.join(own) or 'none'}).",
        )
    return MCPTool(label, hosted.chosen(label, allowed))


def _tool_choice(value: Any) -> Any:
    if isinstance(value, str) or value is None:
        return value
    value = _object(value, "tool_choice")
    if value.get("type") != "function":
        raise _fail("tool_choice.type", f"tool_choice.type must be 'function', not {value.get('type')!r}.")
    return {"type": "function", "function": {"name": value.get("name")}}


def _text(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    value = _object(value, "text")
    unknown = sorted(set(value) - {"format", "verbosity"})
    if unknown:
        raise _fail(f"text.{unknown[0]}", f"Unknown field text.{unknown[0]}.")
    fmt = value.get("format")
    if fmt is None:
        return None
    fmt = _object(fmt, "text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", ""), "schema": fmt.get("schema")}}
    if kind in ("text", "json_object"):
        return {"type": kind}
    raise _fail("text.format.type", f"text.format.type must be text, json_object or json_schema, not {kind!r}.")


# --- the answer ---------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _usage(outcome: Outcome | None) -> dict[str, Any] | None:
    if outcome is None:
        return None
    return {
        "input_tokens": outcome.prompt_tokens,
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": outcome.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }


def _shell(req: ResponsesRequest, rid: str, created: int, model: str, status: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "usage": None,
        **req.echo,
    }


def _reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id or new_id("rs"),
        "summary": [{"type": "summary_text", "text": text}],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def _message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id or new_id("msg"), "status": status, "role": "assistant", "content": [part]}


def _call_item(call: Mapping[str, Any], item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id or new_id("fc"),
        "call_id": call["id"],
        "name": call["name"],
        "arguments": call["arguments"],
        "status": status,
    }


def _mcp_call_item(call: HostedCall, item_id: str) -> dict[str, Any]:
    """An ``mcp_call`` item: ``in_progress`` while it runs, then ``completed`` with its output or ``failed`` with the
    error (as the tool's execution error, whose content is the reason in text)."""
    status = "in_progress" if call.status == "calling" else call.status
    error = None
    if call.error is not None:
        error = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": call.error}]}
    return {
        "type": "mcp_call",
        "id": item_id,
        "server_label": call.label,
        "name": call.name,
        "arguments": call.arguments,
        "output": call.output,
        "error": error,
        "status": status,
        "approval_request_id": None,
    }


def _listed(listed: Mapping[str, Any]) -> dict[str, Any]:
    """A tool of an ``mcp_list_tools`` item, from the tool as its server lists it."""
    return {
        "name": listed["name"],
        "description": listed.get("description") or None,
        "input_schema": listed.get("parameters") or {"type": "object"},
        "annotations": None,
    }


def _finished(response: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    if outcome.finish == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        response["status"] = "completed"
    response["usage"] = _usage(outcome)
    return response


def response_object(req: ResponsesRequest, outcome: Outcome, rid: str, created: int, model: str) -> dict[str, Any]:
    """The whole answer (``object: "response"``)."""
    response = _shell(req, rid, created, model, "completed")
    if outcome.reasoning:
        response["output"].append(_reasoning_item(outcome.reasoning))
    if outcome.content:
        response["output"].append(_message_item(outcome.content))
    response["output"] += [_call_item(call) for call in outcome.calls]
    return _finished(response, outcome)


def conversation(req: ResponsesRequest, outcome: Outcome) -> list[dict[str, Any]]:
    """The conversation after this answer, as chat messages: what a stored response keeps."""
    return [*req.history, outcome.message()]


class EventStream:
    """The answer as the Responses API's typed server-sent events, each with its ``sequence_number``: feed it the
    service's deltas (:meth:`feed`), then its :class:`Outcome` (:meth:`finish`, which gives the closing events
    and keeps the whole response in :attr:`response`)."""

    def __init__(self, req: ResponsesRequest, rid: str, model: str) -> None:
        self.response = _shell(req, rid, int(time.time()), model, "in_progress")
        self._seq = 0
        self._open: dict[str, Any] | None = None  # the output item being streamed
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}  # decoder index -> its streamed item
        self._hosted: dict[str, int] = {}  # a running hosted call's id -> its item's output index

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    def start(self) -> list[bytes]:
        """``response.created`` and ``response.in_progress``."""
        return [
            self._event("response.created", response=self.response),
            self._event("response.in_progress", response=self.response),
        ]

    def _index(self) -> int:
        return len(self.response["output"])

    def _close(self) -> list[bytes]:
        """The closing events of the item being streamed, which joins the response's output."""
        item, self._open = self._open, None
        if item is None:
            return []
        index, text = self._index(), "".join(self._text)
        self._text = []
        out: list[bytes] = []
        if item["type"] == "message":
            done = _message_item(text, item["id"])
            part = done["content"][0]
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
                )
            )
        elif item["type"] == "reasoning":
            done = _reasoning_item(text, item["id"])
            out.append(
                self._event(
                    "response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=text
                )
            )
        else:
            done = {**item, "arguments": text, "status": "completed"}
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=text,
                )
            )
            item["arguments"] = text
        out.append(self._event("response.output_item.done", output_index=index, item=done))
        self.response["output"].append(done)
        return out

    def _begin(self, item: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._open = item
        index = self._index()
        out.append(self._event("response.output_item.added", output_index=index, item=item))
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(
                self._event(
                    "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part
                )
            )
        return out

    def feed(self, delta: Delta) -> list[bytes]:
        """The events for one of the service's deltas."""
        out: list[bytes] = []
        tc = delta.tool_call
        if tc is not None:
            if tc.name is not None:
                item = _call_item({"id": tc.id, "name": tc.name, "arguments": ""}, status="in_progress")
                self._calls[tc.index] = item
                out += self._begin(item)
            if not tc.arguments:
                return out
            streamed = self._open
            if streamed is None or streamed is not self._calls.get(tc.index):
                return out  # a call's arguments after another item began: no decoder interleaves them
            self._text.append(tc.arguments)
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=streamed["id"],
                    output_index=self._index(),
                    delta=tc.arguments,
                )
            )
            return out
        if delta.reasoning_content is not None:
            if not delta.reasoning_content:
                return out
            if self._open is None or self._open["type"] != "reasoning":
                out += self._begin({"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []})
            self._text.append(delta.reasoning_content)
            out.append(
                self._event(
                    "response.reasoning_text.delta",
                    item_id=self._open["id"],  # type: ignore[index]
                    output_index=self._index(),
                    content_index=0,
                    delta=delta.reasoning_content,
                )
            )
            return out
        if not delta.content:
            return out
        if self._open is None or self._open["type"] != "message":
            out += self._begin(
                {"type": "message", "id": new_id("msg"), "status": "in_progress", "role": "assistant", "content": []}
            )
        self._text.append(delta.content)
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=self._open["id"],  # type: ignore[index]
                output_index=self._index(),
                content_index=0,
                delta=delta.content,
                logprobs=[],
            )
        )
        return out

    def listed(self, mcp: Sequence[MCPTool]) -> list[bytes]:
        """An ``mcp_list_tools`` item for each ``mcp`` tool of the request: the tools its server lists that the
        request allows (the sessions listed them when the server started)."""
        out = self._close()
        for tool in mcp:
            item: dict[str, Any] = {"type": "mcp_list_tools", "id": new_id("mcpl"), "server_label": tool.server_label}
            item.update(tools=[], error=None)
            index = self._index()
            out.append(self._event("response.output_item.added", output_index=index, item=item))
            out.append(self._event("response.mcp_list_tools.in_progress", item_id=item["id"], output_index=index))
            item = {**item, "tools": [_listed(listed) for listed in tool.tools.values()]}
            out.append(self._event("response.mcp_list_tools.completed", item_id=item["id"], output_index=index))
            out.append(self._event("response.output_item.done", output_index=index, item=item))
            self.response["output"].append(item)
        return out

    def hosted(self, call: HostedCall) -> list[bytes]:
        """The events of a hosted call: its ``mcp_call`` item added (its arguments whole) and in progress while it
        runs; then completed or failed, and done with its output or error."""
        if call.status == "calling":
            out = self._close()
            index = self._index()
            item = _mcp_call_item(call, new_id("mcp"))
            self._hosted[call.id] = index
            self.response["output"].append(item)
            out.append(self._event("response.output_item.added", output_index=index, item=item))
            out.append(self._event("response.mcp_call.in_progress", item_id=item["id"], output_index=index))
            arguments = {"item_id": item["id"], "output_index": index, "arguments": call.arguments}
            out.append(self._event("response.mcp_call_arguments.done", **arguments))
            return out
        index = self._hosted.pop(call.id)
        item = self.response["output"][index] = _mcp_call_item(call, self.response["output"][index]["id"])
        kind = "response.mcp_call.completed" if call.status == "completed" else "response.mcp_call.failed"
        return [
            self._event(kind, item_id=item["id"], output_index=index),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def finish(self, outcome: Outcome) -> list[bytes]:
        """The last item's closing events and ``response.completed`` (or ``response.incomplete``). Calls that
        turned out invalid (cut off, against the schema) stay out of the final response's output."""
        out = self._close()
        valid = {call["id"] for call in outcome.calls}
        self.response["output"] = [
            item for item in self.response["output"] if item["type"] != "function_call" or item["call_id"] in valid
        ]
        _finished(self.response, outcome)
        return [*out]

    def closing(self) -> bytes:
        """``response.completed`` or ``response.incomplete``, after :meth:`finish` (and after the store kept it)."""
        kind = "response.completed" if self.response["status"] == "completed" else "response.incomplete"
        return self._event(kind, response=self.response)

    def error(self, exc: APIError) -> bytes:
        """The ``error`` event of a stream that failed after it began."""
        return self._event("error", code=str(exc.status), message=exc.message, param=exc.param)
