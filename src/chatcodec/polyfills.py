"""Polyfills: documented rewrites that let any conversation render through any template.

``ChatTemplate.render(..., polyfill="auto")`` rewrites the conversation, before the template sees it,
into forms the template supports (its :class:`~chatcodec.Capabilities`), and renders exactly as
usual after that. ``polyfill=False`` (the default) rewrites nothing. A set of names applies exactly
those rewrites, whatever the template supports. ``ChatTemplate.render_with_report`` says which
rewrites changed the conversation.

The rewrites, in the order they run (:data:`POLYFILLS` holds the same text):

``legacy_function_calls``
    OpenAI's legacy ``function_call`` becomes ``tool_calls`` (ids ``call00001``, ...: nine letters and
    digits, which Mistral templates require), an assistant turn that only adds calls joins the
    assistant turn before it (Qwen-Agent writes parallel calls as one message each), and role
    ``function`` becomes role ``tool`` with the id of the call it answers. "auto": whenever present.
``content_parts_to_text``
    A list of ``{"type": "text"}`` parts becomes its texts joined by newlines. Other parts (images)
    cannot be written as text and raise :class:`~chatcodec.InputError`. "auto": without ``content_parts``.
``null_content``
    A message without content (``content: null``, which is dropped before rendering) gets ``""``.
    "auto": with ``requires_non_null_content``.
``arguments_to_object`` / ``arguments_to_string``
    Tool-call arguments given as a JSON string are parsed into an object, or an object is written as
    a JSON string. "auto": with ``requires_object_arguments`` / ``requires_string_arguments``.
``short_call_ids``
    Call ids that are not nine letters and digits are replaced, in the call and in its result, by
    nine hexadecimal digits of their SHA-256 (the same id always gives the same one, so a growing
    conversation keeps its prefix). "auto": with ``requires_short_call_ids``.
``split_parallel_calls``
    An assistant turn with several calls becomes one turn per call, each followed by its result.
    "auto": templates that render calls but not ``parallel_tool_calls`` (Llama 3.1).
``tool_results_as_user``
    A tool result becomes a user turn, ``{"tool_response": {"name", "id", "content"}}`` in JSON, naming
    the tool (from the message, or from the call it answers). "auto": without ``tool_responses``.
``tool_calls_as_json``
    An assistant turn's calls are written into its content as the JSON of the ``generic`` output
    format: ``{"tool_calls": [{"name", "arguments", "id"}]}``, with ``"response"`` holding any text.
    "auto": templates that lack ``tools`` or ``tool_calls`` (they then take the generic protocol).
``tools_in_system``
    The tool definitions go into the system text, with instructions to call them by answering
    ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` (what the ``generic`` decoder reads),
    and the template gets no ``tools``. "auto": as ``tool_calls_as_json``.
``documents_in_system``
    Documents go into the system text, and the template gets no ``documents``. "auto": without
    ``documents``.
``later_system_to_user``
    A system message after the first turn becomes a user message. "auto": templates with ``system``
    but not ``multiple_system``.
``system_to_user``
    A system message's text goes at the start of the next user message (or becomes a user message
    where none follows). "auto": without ``system``.
``merge_consecutive``
    Consecutive user (or assistant) messages merge into one, their texts joined by a blank line and
    their calls kept. "auto": with ``requires_alternation``.

>>> from chatcodec import ChatTemplate
>>> chat = ChatTemplate(
...     "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
...     "{% endif %}<{{ m.role }}>{{ m.content }}\\n{% endfor %}")
>>> chat.capabilities.system, chat.capabilities.error("system")
(False, 'System role not supported')
>>> chat.render_with_report([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
('<user>Be brief.\\n\\nHi\\n', ('system_to_user',))
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal

from .capabilities import Capabilities
from .exceptions import InputError

__all__ = ["POLYFILLS", "Polyfill", "apply", "select", "uses_generic_tools"]

#: what ``polyfill=`` takes: False (none), "auto" (what the template lacks), or a collection of names
Polyfill = bool | Literal["auto"] | Collection[str] | None

POLYFILLS: dict[str, str] = {
    "legacy_function_calls": "function_call and role function become tool_calls and role tool",
    "content_parts_to_text": "lists of text parts become text",
    "null_content": "a message without content gets an empty string",
    "arguments_to_object": "tool-call arguments given as a JSON string become an object",
    "arguments_to_string": "tool-call arguments given as an object become a JSON string",
    "short_call_ids": "tool-call ids become nine letters and digits",
    "split_parallel_calls": "a turn with several tool calls becomes one turn per call, each with its result",
    "tool_results_as_user": "tool results become user turns naming the tool",
    "tool_calls_as_json": "tool calls are written into the assistant's content as generic-format JSON",
    "tools_in_system": "tool definitions and generic-format instructions go into the system text",
    "documents_in_system": "documents go into the system text",
    "later_system_to_user": "system messages after the first turn become user messages",
    "system_to_user": "system text goes into the next user message",
    "merge_consecutive": "consecutive messages of one role are merged",
}

#: how the system text tells the model to call tools, in the shape the ``generic`` decoder reads
TOOL_INSTRUCTIONS = (
    "You can call the following tools. To call one or more of them, reply with only a JSON object of the form "
    '{"tool_calls": [{"name": "<tool name>", "arguments": {<argument name>: <value>, ...}}]}. '
    "Otherwise, reply normally. The results come back as "
    '{"tool_response": {"name": "<tool name>", "id": "<call id>", "content": "<result>"}}.'
)


def uses_generic_tools(caps: Capabilities) -> bool:
    """Whether "auto" gives this template the generic tool protocol: it cannot render both tools and calls."""
    return not (caps.tools and caps.tool_calls)


def _auto(caps: Capabilities) -> frozenset[str]:
    generic = uses_generic_tools(caps)
    wanted = {
        "legacy_function_calls": True,
        "content_parts_to_text": not caps.content_parts,
        "null_content": caps.requires_non_null_content,
        "arguments_to_object": caps.requires_object_arguments,
        "arguments_to_string": caps.requires_string_arguments,
        "short_call_ids": caps.requires_short_call_ids,
        "split_parallel_calls": not generic and not caps.parallel_tool_calls,
        "tool_calls_as_json": generic,
        "tool_results_as_user": not caps.tool_responses,
        "tools_in_system": generic,
        "documents_in_system": not caps.documents,
        "later_system_to_user": caps.system and not caps.multiple_system,
        "system_to_user": not caps.system,
        "merge_consecutive": caps.requires_alternation,
    }
    return frozenset(name for name, on in wanted.items() if on)


def select(polyfill: Polyfill, capabilities: Callable[[], Capabilities]) -> frozenset[str]:
    """The names of the rewrites ``polyfill`` asks for (``capabilities`` is only called for "auto")."""
    if polyfill is None or polyfill is False:
        return frozenset()
    if polyfill == "auto" or polyfill is True:
        return _auto(capabilities())
    if isinstance(polyfill, str) or not isinstance(polyfill, Collection):
        raise InputError(f'polyfill must be False, "auto" or a set of rewrite names, not {polyfill!r}.')
    unknown = sorted(set(polyfill) - set(POLYFILLS))
    if unknown:
        raise InputError(f"Unknown polyfill {', '.join(map(repr, unknown))}; the rewrites are {', '.join(POLYFILLS)}.")
    return frozenset(polyfill)


def apply(
    names: Collection[str],
    messages: list[dict[str, Any]],
    tools: list[Any] | None,
    documents: list[Any] | None,
) -> tuple[list[dict[str, Any]], list[Any] | None, list[Any] | None, tuple[str, ...]]:
    """Run the rewrites ``names`` in their order; also return the names of those that changed something.

    ``messages`` are plain message dicts (as :mod:`chatcodec.render` prepares them); they are not
    changed: rewritten messages are new dicts.
    """
    applied = []
    chat = list(messages)
    for name in POLYFILLS:
        if name not in names:
            continue
        if name == "tools_in_system":
            changed = tools is not None
            if changed:
                chat = _into_system(chat, _tools_text(tools or []))
                tools = None
        elif name == "documents_in_system":
            changed = documents is not None
            if changed:
                chat = _into_system(chat, _documents_text(documents or []))
                documents = None
        else:
            rewritten = _REWRITES[name](chat)
            changed = rewritten != chat
            chat = rewritten
        if changed:
            applied.append(name)
    return chat, tools, documents, tuple(applied)


# -- the rewrites -----------------------------------------------------------------------------------------


def _legacy_function_calls(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (name, id) of calls still waiting for their result
    count = 0
    for message in chat:
        role = message.get("role")
        call = message.get("function_call")
        if role == "assistant" and isinstance(call, Mapping):
            count += 1
            call_id = f"call{count:05d}"
            unanswered.append((str(call.get("name")), call_id))
            new = {k: v for k, v in message.items() if k != "function_call"}
            new["tool_calls"] = [*new.get("tool_calls", []), {"id": call_id, "type": "function", "function": call}]
            previous = out[-1] if out else None
            if previous is not None and previous.get("role") == "assistant" and not _text(new.get("content")):
                out[-1] = {**previous, "tool_calls": [*previous.get("tool_calls", []), *new["tool_calls"]]}
            else:
                out.append(new)
        elif role == "function":
            name = message.get("name")
            match = next((i for i, (n, _) in enumerate(unanswered) if n == name), 0 if unanswered else None)
            new = {**message, "role": "tool"}
            if match is not None:
                new.setdefault("tool_call_id", unanswered.pop(match)[1])
            out.append(new)
        else:
            out.append(message)
    return out


def _content_parts_to_text(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for index, message in enumerate(chat):
        content = message.get("content")
        if isinstance(content, (list, tuple)):
            message = {**message, "content": _join_parts(content, index)}
        out.append(message)
    return out


def _join_parts(parts: Any, index: int) -> str:
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise InputError(
                f"Message {index} has a {kind!r} content part; this template renders text only, so the part"
                " cannot be polyfilled. Remove it, or use a template that accepts it."
            )
    return "\n".join(texts)


def _null_content(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [message if message.get("content") is not None else {**message, "content": ""} for message in chat]


def _arguments_to_object(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def convert(arguments: Any, where: str) -> Any:
        if not isinstance(arguments, str):
            return arguments
        try:
            value = json.loads(arguments)
        except ValueError:
            raise InputError(f"The arguments of {where} are not JSON: {arguments[:80]!r}.") from None
        if not isinstance(value, dict):
            raise InputError(f"The arguments of {where} are JSON but not an object: {arguments[:80]!r}.")
        return value

    return _map_arguments(chat, convert)


def _arguments_to_string(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def convert(arguments: Any, where: str) -> Any:
        return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)

    return _map_arguments(chat, convert)


def _map_arguments(chat: list[dict[str, Any]], convert: Callable[[Any, str], Any]) -> list[dict[str, Any]]:
    out = []
    for index, message in enumerate(chat):
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            new_calls = []
            for number, call in enumerate(calls):
                function = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(function, Mapping) and "arguments" in function:
                    where = f"tool call {number} of message {index}"
                    function = {**function, "arguments": convert(function["arguments"], where)}
                    call = {**call, "function": function}
                new_calls.append(call)
            message = {**message, "tool_calls": new_calls}
        out.append(message)
    return out


def _short_id(call_id: Any) -> Any:
    if not isinstance(call_id, str) or (len(call_id) == 9 and call_id.isascii() and call_id.isalnum()):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _short_call_ids(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in chat:
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            calls = [{**c, "id": _short_id(c.get("id"))} if isinstance(c, Mapping) and "id" in c else c for c in calls]
            message = {**message, "tool_calls": calls}
        if "tool_call_id" in message:
            message = {**message, "tool_call_id": _short_id(message["tool_call_id"])}
        out.append(message)
    return out


def _split_parallel_calls(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    index = 0
    while index < len(chat):
        message = chat[index]
        calls = message.get("tool_calls")
        index += 1
        if message.get("role") != "assistant" or not isinstance(calls, list) or len(calls) < 2:
            out.append(message)
            continue
        results = []
        while index < len(chat) and chat[index].get("role") == "tool":
            results.append(chat[index])
            index += 1
        for number, call in enumerate(calls):
            turn = {**message, "tool_calls": [call]}
            if number:  # the text and reasoning stay with the first call
                turn = {k: v for k, v in turn.items() if k not in ("reasoning_content", "thinking", "reasoning")}
                turn["content"] = ""
            out.append(turn)
            call_id = call.get("id") if isinstance(call, Mapping) else None
            answer = next((r for r in results if call_id is not None and r.get("tool_call_id") == call_id), None)
            if answer is None and results and number < len(results) and results[number].get("tool_call_id") is None:
                answer = results[number]
            if answer is not None:
                results.remove(answer)
                out.append(answer)
        out.extend(results)  # results that answer no call stay, in their order
    return out


def _call_json(call: Any) -> dict[str, Any]:
    function = call.get("function", call) if isinstance(call, Mapping) else {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # else kept as the string the model wrote
            arguments = json.loads(arguments)
    entry = {"name": function.get("name"), "arguments": arguments}
    if isinstance(call, Mapping) and call.get("id") is not None:
        entry["id"] = call["id"]
    return entry


def _tool_calls_as_json(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in chat:
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list) and calls:
            envelope: dict[str, Any] = {}
            text = _text(message.get("content"))
            if text:
                envelope["response"] = text
            envelope["tool_calls"] = [_call_json(call) for call in calls]
            message = {k: v for k, v in message.items() if k != "tool_calls"}
            message["content"] = json.dumps(envelope, ensure_ascii=False)
        out.append(message)
    return out


def _tool_results_as_user(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names: dict[Any, Any] = {}
    out = []
    for message in chat:
        for call in message.get("tool_calls") or ():
            if isinstance(call, Mapping):
                names[call.get("id")] = (call.get("function") or {}).get("name")
        if message.get("role") == "tool":
            response: dict[str, Any] = {"name": message.get("name") or names.get(message.get("tool_call_id"))}
            if message.get("tool_call_id") is not None:
                response["id"] = message["tool_call_id"]
            response["content"] = _text(message.get("content"))
            message = {"role": "user", "content": json.dumps({"tool_response": response}, ensure_ascii=False)}
        out.append(message)
    return out


def _later_system_to_user(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**message, "role": "user"} if index and message.get("role") == "system" else message
        for index, message in enumerate(chat)
    ]


def _system_to_user(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[Any] = []  # system texts waiting for the next user message
    for message in chat:
        if message.get("role") == "system":
            pending.append(message.get("content"))
            continue
        if pending and message.get("role") == "user":
            message = {**message, "content": _join([*pending, message.get("content")])}
            pending = []
        elif pending:
            out.append({"role": "user", "content": _join(pending)})
            pending = []
        out.append(message)
    if pending:
        out.append({"role": "user", "content": _join(pending)})
    return out


def _merge_consecutive(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in chat:
        previous = out[-1] if out else None
        role = message.get("role")
        if previous is None or role not in ("user", "assistant", "system") or previous.get("role") != role:
            out.append(message)
            continue
        merged = {**previous, **message, "content": _join([previous.get("content"), message.get("content")])}
        calls = [*(previous.get("tool_calls") or []), *(message.get("tool_calls") or [])]
        if calls:
            merged["tool_calls"] = calls
        out[-1] = merged
    return out


_REWRITES: dict[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "legacy_function_calls": _legacy_function_calls,
    "content_parts_to_text": _content_parts_to_text,
    "null_content": _null_content,
    "arguments_to_object": _arguments_to_object,
    "arguments_to_string": _arguments_to_string,
    "short_call_ids": _short_call_ids,
    "split_parallel_calls": _split_parallel_calls,
    "tool_calls_as_json": _tool_calls_as_json,
    "tool_results_as_user": _tool_results_as_user,
    "later_system_to_user": _later_system_to_user,
    "system_to_user": _system_to_user,
    "merge_consecutive": _merge_consecutive,
}


# -- text helpers ---------------------------------------------------------------------------------------


def _text(content: Any) -> str:
    """A message content as text (parts joined), "" for none."""
    if content is None:
        return ""
    if isinstance(content, (list, tuple)):
        return "\n".join(
            p if isinstance(p, str) else str(p.get("text", "")) for p in content if isinstance(p, (str, Mapping))
        )
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _join(contents: list[Any]) -> Any:
    """Contents joined by a blank line; parts stay parts where one of them is a list."""
    present = [c for c in contents if c is not None and c != "" and c != []]
    if any(isinstance(c, (list, tuple)) for c in present):
        parts: list[Any] = []
        for c in present:
            parts.extend(c if isinstance(c, (list, tuple)) else [{"type": "text", "text": c}])
        return parts
    return "\n\n".join(_text(c) for c in present)


def _into_system(chat: list[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """``block`` appended to the leading system message's text (one is added where there is none)."""
    if chat and chat[0].get("role") == "system":
        return [{**chat[0], "content": _join([chat[0].get("content"), block])}, *chat[1:]]
    return [{"role": "system", "content": block}, *chat]


def _tools_text(tools: list[Any]) -> str:
    lines = [TOOL_INSTRUCTIONS, ""]
    lines += [json.dumps(tool, ensure_ascii=False) for tool in tools]
    return "\n".join(lines)


def _documents_text(documents: list[Any]) -> str:
    lines = ["Use the following documents to answer."]
    for number, document in enumerate(documents, 1):
        title = document.get("title") if isinstance(document, Mapping) else None
        text = document.get("text", "") if isinstance(document, Mapping) else document
        lines.append(f"\nDocument {number}" + (f": {title}" if title else "") + f"\n{_text(text)}")
    return "\n".join(lines)
