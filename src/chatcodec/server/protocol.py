"""The OpenAI chat-completions request, read and checked field by field.

Every problem is an :class:`~chatcodec.server.errors.APIError` (400) whose ``param`` names the field,
as ``messages[2].role`` or ``tools[0].function.parameters``. Legacy function calling (``functions``,
``function_call`` and role ``"function"`` messages, the Qwen-Agent style) is turned into tools and
tool calls here, so the rest of the server sees one form.

>>> req = parse_chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})
>>> req.max_tokens, req.tool_choice, req.stream
(5, 'none', False)
>>> try:
...     parse_chat({"messages": [{"role": "robot", "content": "Hi"}]})
... except APIError as exc:
...     print(exc.status, exc.param)
400 messages[0].role
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..exceptions import SchemaError
from ..refs import check_schema
from .errors import APIError

__all__ = ["EFFORTS", "ChatRequest", "CompletionRequest", "ResponseFormat", "parse_chat", "parse_completion"]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
#: names chat_template_kwargs may not set: the request's own fields, and the encoder's options
_RESERVED = frozenset(
    {
        "messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template",
        "polyfill", "now", "content_special_tokens", "add_special_tokens", "return_assistant_tokens_mask",
    }
)  # fmt: skip
ToolChoice = Literal["auto", "none", "required"] | str  # a str other than the three is a function name


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """``response_format``: ``"json_object"`` (any JSON object) or ``"json_schema"`` with its schema."""

    type: Literal["json_object", "json_schema"]
    schema: Mapping[str, Any] | None = None
    name: str = ""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    #: "auto", "none", "required", or the name of the one function to call
    tool_choice: str = "auto"
    #: the caller used the legacy ``functions`` form: answer with ``function_call``
    legacy: bool = False
    parallel_tool_calls: bool = True
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    #: the name the caller's dialect gives ``max_tokens`` (its errors name that field)
    max_tokens_field: str = "max_tokens"
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: how hard the model should think: none, minimal, low, medium or high (None: the template's default)
    reasoning_effort: str | None = None
    #: a budget of reasoning tokens (Anthropic's thinking.budget_tokens; 0: thinking off)
    thinking_budget: int | None = None
    #: the name the caller's dialect gives the reasoning effort (its errors name that field)
    reasoning_field: str = "reasoning_effort"
    model: str | None = None
    #: vLLM's fields: the answer also gives the prompt's token ids and the generated ones, or the prompt's text
    return_token_ids: bool = False
    return_prompt_text: bool = False


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    prompt: str | list[int]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = 16
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    model: str | None = None
    #: vLLM's field: each choice also gives the prompt's token ids and the generated ones
    return_token_ids: bool = False


def _fail(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


def _type_name(value: Any) -> str:
    return (
        "null"
        if value is None
        else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
            type(value), "number" if isinstance(value, int | float) else type(value).__name__
        )
    )


def _object(body: Any, param: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _fail(param, f"{param} must be a JSON object, not {_type_name(body)}.")
    return body


def _opt_int(body: Mapping[str, Any], key: str, *, low: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(key, f"{key} must be an integer, not {_type_name(value)}.")
    if low is not None and value < low:
        raise _fail(key, f"{key} must be at least {low}, not {value}.")
    return value


def _opt_number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise _fail(key, f"{key} must be a number, not {_type_name(value)}.")
    if not low <= value <= high:
        raise _fail(key, f"{key} must be between {low:g} and {high:g}, not {value:g}.")
    return float(value)


def _opt_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _fail(key, f"{key} must be true or false, not {_type_name(value)}.")
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _fail("stop", "stop must be a string or a list of strings.")
    if len(value) > 16:
        raise _fail("stop", f"stop takes at most 16 strings, not {len(value)}.")
    return tuple(s for s in value if s)


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    options = _object(options, "stream_options")
    if not stream:
        raise _fail("stream_options", "stream_options is only allowed when stream is true.")
    value = options.get("include_usage", False)
    if not isinstance(value, bool):
        raise _fail("stream_options.include_usage", "stream_options.include_usage must be true or false.")
    return value


def _check_n(body: Mapping[str, Any]) -> None:
    n = _opt_int(body, "n", low=1)
    if n is not None and n != 1:
        raise _fail("n", f"n must be 1: this server makes one choice per request, not {n}.")
    if body.get("logprobs") not in (None, False):
        raise _fail("logprobs", "logprobs are not supported by this server.")


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields chat and raw completions share, checked."""
    return {
        "temperature": _opt_number(body, "temperature", 0.0, 2.0),
        "top_p": _opt_number(body, "top_p", 0.0, 1.0),
        "stop": _stop(body),
        "seed": _opt_int(body, "seed"),
    }


def _model(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _fail("model", f"model must be a string, not {_type_name(model)}.")
    return model


# --- chat ---------------------------------------------------------------------------------------------


def parse_chat(body: Any) -> ChatRequest:
    """Read a ``/v1/chat/completions`` body; raise :class:`APIError` naming the first bad field."""
    body = _object(body, "body")
    _check_n(body)
    tools, legacy = _tools(body)
    names = [t["function"]["name"] for t in tools] if tools else []
    messages = _messages(body.get("messages"))
    choice = _tool_choice(body, names, legacy)
    stream = _opt_bool(body, "stream", False)
    max_tokens = _opt_int(body, "max_completion_tokens", low=1)
    field = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, field = _opt_int(body, "max_tokens", low=1), "max_tokens"
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        kwargs = _object(kwargs, "chat_template_kwargs")
        reserved = _RESERVED & set(kwargs)
        if reserved:
            key = sorted(reserved)[0]
            raise _fail(
                f"chat_template_kwargs.{key}", f"chat_template_kwargs may not set {key}; use the request field."
            )
    return ChatRequest(
        messages=messages,
        tools=tools or None,
        tool_choice=choice,
        legacy=legacy,
        parallel_tool_calls=_opt_bool(body, "parallel_tool_calls", not legacy),
        stream=stream,
        include_usage=_stream_options(body, stream),
        max_tokens=max_tokens,
        max_tokens_field=field,
        **_sampling(body),
        response_format=_response_format(body.get("response_format")),
        chat_template_kwargs=dict(kwargs or {}),
        reasoning_effort=_effort(body),
        model=_model(body),
        return_token_ids=_opt_bool(body, "return_token_ids", False),
        return_prompt_text=_opt_bool(body, "return_prompt_text", False),
    )


#: the reasoning efforts a request may ask for, least first (OpenAI's scale)
EFFORTS = ("none", "minimal", "low", "medium", "high")


def _effort(body: Mapping[str, Any]) -> str | None:
    value = body.get("reasoning_effort")
    if value is None:
        return None
    if value not in EFFORTS:
        raise _fail("reasoning_effort", f"reasoning_effort must be one of {', '.join(EFFORTS)}, not {value!r}.")
    return str(value)


def _messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise _fail("messages", "messages is required: a list of chat messages.")
    if not isinstance(value, list):
        raise _fail("messages", f"messages must be a list of message objects, not {_type_name(value)}.")
    if not value:
        raise _fail("messages", "messages must hold at least one message.")
    out: list[dict[str, Any]] = []
    pending: dict[str, list[str]] = {}  # legacy function calls waiting for their result: name -> ids
    for i, raw in enumerate(value):
        where = f"messages[{i}]"
        msg = dict(_object(raw, where))
        role = msg.get("role")
        if not isinstance(role, str):
            raise _fail(f"{where}.role", f"{where}.role must be a string, not {_type_name(role)}.")
        if role not in ROLES:
            raise _fail(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}, not {role!r}.")
        msg["content"] = _content(msg.get("content"), f"{where}.content", role)
        if role == "developer":
            msg["role"] = "system"
        elif role == "assistant":
            _assistant(msg, where, i, pending)
        elif role in ("tool", "function"):
            _tool_result(msg, where, pending)
        elif msg["content"] is None:
            raise _fail(f"{where}.content", f"{where}.content is required for a {role} message.")
        if "name" in msg and not isinstance(msg["name"], str):
            raise _fail(f"{where}.name", f"{where}.name must be a string.")
        out.append(msg)
    return out


def _content(value: Any, where: str, role: str) -> Any:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _fail(where, f"{where} must be a string or a list of content parts, not {_type_name(value)}.")
    for j, part in enumerate(value):
        part = _object(part, f"{where}[{j}]")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _fail(f"{where}[{j}].text", f"{where}[{j}].text must be a string.")
        elif kind in ("image_url", "input_audio", "file", "image", "audio", "video"):
            raise _fail(f"{where}[{j}].type", f"{where}[{j}] is a {kind} part; this server reads text only.")
        else:
            raise _fail(f"{where}[{j}].type", f"{where}[{j}].type must be 'text', not {kind!r}.")
    return value


def _assistant(msg: dict[str, Any], where: str, index: int, pending: dict[str, list[str]]) -> None:
    legacy = msg.pop("function_call", None)
    calls = msg.get("tool_calls")
    if legacy is not None:
        legacy = _object(legacy, f"{where}.function_call")
        calls = [*(calls or []), {"id": f"call_{index}_legacy", "type": "function", "function": legacy}]
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _fail(f"{where}.tool_calls", f"{where}.tool_calls must be a list, not {_type_name(calls)}.")
    fixed = []
    for j, call in enumerate(calls):
        cw = f"{where}.tool_calls[{j}]"
        call = dict(_object(call, cw))
        fn = dict(_object(call.get("function"), f"{cw}.function"))
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _fail(f"{cw}.function.name", f"{cw}.function.name must be a non-empty string.")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise _fail(f"{cw}.function.arguments", f"{cw}.function.arguments is not valid JSON.") from None
        elif not isinstance(args, dict):
            raise _fail(f"{cw}.function.arguments", f"{cw}.function.arguments must be a JSON string or object.")
        fn["arguments"] = args
        call["function"] = fn
        call.setdefault("type", "function")
        call_id = call.get("id")
        if call_id is None:
            call["id"] = call_id = f"call_{index}_{j}"
        elif not isinstance(call_id, str):
            raise _fail(f"{cw}.id", f"{cw}.id must be a string.")
        pending.setdefault(fn["name"], []).append(call_id)
        fixed.append(call)
    msg["tool_calls"] = fixed


def _tool_result(msg: dict[str, Any], where: str, pending: dict[str, list[str]]) -> None:
    if msg["content"] is None:
        raise _fail(f"{where}.content", f"{where}.content is required for a {msg['role']} message.")
    if msg["role"] == "function":  # Qwen-Agent's legacy result: named, matched to the call by name
        name = msg.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"{where}.name", f"{where}.name is required for a function message: the function's name.")
        ids = pending.get(name)
        msg["role"] = "tool"
        msg["tool_call_id"] = ids.pop(0) if ids else f"call_{name}"
        return
    call_id = msg.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise _fail(f"{where}.tool_call_id", f"{where}.tool_call_id must be a string.")
    for ids in pending.values():
        if call_id in ids:
            ids.remove(call_id)
            if "name" not in msg:
                msg["name"] = next(n for n, v in pending.items() if v is ids)
            break


def _tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    tools, functions = body.get("tools"), body.get("functions")
    if tools is not None and functions is not None:
        raise _fail("functions", "Give tools or the legacy functions, not both.")
    legacy = functions is not None
    key = "functions" if legacy else "tools"
    value = functions if legacy else tools
    if value is None:
        return [], False
    if not isinstance(value, list):
        raise _fail(key, f"{key} must be a list, not {_type_name(value)}.")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, raw in enumerate(value):
        where = f"{key}[{i}]"
        item = _object(raw, where)
        if legacy:
            fn = item
            fw = where
        else:
            if item.get("type", "function") != "function":
                raise _fail(f"{where}.type", f"{where}.type must be 'function', not {item.get('type')!r}.")
            fn = _object(item.get("function"), f"{where}.function")
            fw = f"{where}.function"
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"{fw}.name", f"{fw}.name must be a non-empty string.")
        if name in seen:
            raise _fail(f"{fw}.name", f"{fw}.name {name!r} is given twice.")
        seen.add(name)
        params = fn.get("parameters")
        if params is not None:
            _check_schema(params, f"{fw}.parameters")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise _fail(f"{fw}.description", f"{fw}.description must be a string.")
        # the template renders the tool as the caller wrote it (its keys, in their order), as vLLM does
        out.append({"type": "function", "function": fn} if legacy else item)
    return out, legacy


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise _fail(where, f"{where} must be a JSON schema object, not {_type_name(schema)}.")
    try:  # references within the schema only (nothing is ever fetched), its shape and its size: one linear walk
        check_schema(schema, where=where)
    except SchemaError as exc:
        raise _fail(where, str(exc)) from None


def _tool_choice(body: Mapping[str, Any], names: list[str], legacy: bool) -> str:
    key = "function_call" if legacy or ("function_call" in body and "tool_choice" not in body) else "tool_choice"
    value = body.get(key)
    if value is None:
        return "auto" if names else "none"
    if isinstance(value, str):
        if value not in ("auto", "none", "required") or (legacy and value == "required"):
            allowed = "auto, none" if legacy else "auto, none, required"
            raise _fail(key, f"{key} must be {allowed} or a named function, not {value!r}.")
        if value != "none" and not names:
            raise _fail(key, f"{key} is {value!r}, but the request has no tools.")
        return value
    value = _object(value, key)
    fn = value if legacy or key == "function_call" else value.get("function")
    if not legacy and key == "tool_choice" and value.get("type", "function") != "function":
        raise _fail(f"{key}.type", f"{key}.type must be 'function'.")
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str) or not name:
        raise _fail(f"{key}.function.name" if key == "tool_choice" else f"{key}.name", f"{key} names no function.")
    if name not in names:
        known = ", ".join(names) or "none"
        raise _fail(key, f"{key} names the function {name!r}, which is not among the tools ({known}).")
    return name


def _response_format(value: Any) -> ResponseFormat | None:
    if value is None:
        return None
    value = _object(value, "response_format")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind != "json_schema":
        raise _fail(
            "response_format.type", f"response_format.type must be text, json_object or json_schema, not {kind!r}."
        )
    spec = _object(value.get("json_schema"), "response_format.json_schema")
    schema = spec.get("schema")
    if schema is None:
        schema = {}
    _check_schema(schema, "response_format.json_schema.schema")
    name = spec.get("name", "")
    return ResponseFormat("json_schema", schema, name if isinstance(name, str) else "")


# --- raw completions ----------------------------------------------------------------------------------


def parse_completion(body: Any) -> CompletionRequest:
    """Read a ``/v1/completions`` body (one prompt: a string or token ids)."""
    body = _object(body, "body")
    _check_n(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise _fail("prompt", "prompt must be a string or a list of token ids.")
    elif not isinstance(prompt, str) or not prompt:
        raise _fail("prompt", "prompt must be a non-empty string or a list of token ids.")
    stream = _opt_bool(body, "stream", False)
    max_tokens = _opt_int(body, "max_tokens", low=1) if "max_tokens" in body else 16
    return CompletionRequest(
        prompt=prompt,
        stream=stream,
        include_usage=_stream_options(body, stream),
        max_tokens=max_tokens,
        **_sampling(body),
        model=_model(body),
        return_token_ids=_opt_bool(body, "return_token_ids", False),
    )
