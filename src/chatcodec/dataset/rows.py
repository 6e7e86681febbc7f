"""Dataset rows in their three common shapes, turned into one conversation each.

A row is a mapping (a JSON object, a Parquet row). Three shapes are understood:

* **OpenAI**: ``messages`` (a list of ``{"role", "content", ...}``), with optional ``tools``,
  ``documents`` and ``chat_template_kwargs`` (template variables for this row, such as
  ``{"enable_thinking": false}``);
* **ShareGPT**: ``conversations`` (a list of ``{"from", "value"}``), with optional ``system`` and
  ``tools`` (a list, or a JSON string as LLaMA-Factory writes it). Speakers map by :data:`SHAREGPT_ROLES`;
  a ``function_call`` turn holds ``{"name", "arguments"}`` as JSON and becomes an assistant tool call;
* **prompt/completion**: ``prompt`` and ``completion``, each a string (a user and an assistant turn) or
  a list of messages (TRL's conversational form).

A row's ``id`` (a string or an integer) names it in the output and the rejects file; without one, the
reader names it by file and line. Anything else in the row is ignored.

A message's ``content`` is a string, a list of parts (objects such as ``{"type": "text", "text": ...}``) or
null, as in the OpenAI schema; anything else (a number, a bare object) is a ``bad_row``, not a value left to
the template to stringify. A row nested deeper than :data:`MAX_DEPTH` levels, or holding a lone surrogate
(``"\\ud800"``, which no UTF-8 file or tokenizer can hold) anywhere, is a ``bad_row`` too.

>>> to_conversation({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}).messages
[{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello'}]
>>> to_conversation({"prompt": "2+2?", "completion": "4"}).messages
[{'role': 'user', 'content': '2+2?'}, {'role': 'assistant', 'content': '4'}]
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_DEPTH", "ROLES", "SHAREGPT_ROLES", "Conversation", "RowError", "check_row", "to_conversation"]

#: ShareGPT speaker names and the OpenAI roles they become
SHAREGPT_ROLES: dict[str, str] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}

#: the deepest a row may nest (objects and lists), far beyond any real conversation with its tool schemas
MAX_DEPTH = 100

#: the roles a message may have in OpenAI form
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function", "ipython"})


class RowError(ValueError):
    """The row is not a conversation chatcodec can read: missing fields, bad roles, wrong types."""


@dataclass
class Conversation:
    """What :meth:`chatcodec.Codec.encode` takes, read from one row."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None = None
    documents: list[Any] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


def to_conversation(row: Mapping[str, Any]) -> Conversation:
    """Read ``row`` in whichever of the three shapes it has; raises :class:`RowError` if none fits."""
    if not isinstance(row, Mapping):
        raise RowError(f"a row must be a JSON object, not {_kind(row)}")
    check_row(row)
    if row.get("messages") is not None:
        messages = _openai_messages(row["messages"], "messages")
    elif row.get("conversations") is not None:
        messages = _sharegpt_messages(row["conversations"])
        if isinstance(row.get("system"), str) and row["system"] and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": row["system"]})
    elif row.get("prompt") is not None or row.get("completion") is not None:
        messages = _side(row.get("prompt"), "prompt", "user") + _side(row.get("completion"), "completion", "assistant")
    else:
        present = ", ".join(sorted(map(str, row))) or "nothing"
        raise RowError(f"the row has none of messages, conversations or prompt/completion (it has {present})")
    kwargs = row.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise RowError(f"chat_template_kwargs must be an object, not {_kind(kwargs)}")
    return Conversation(
        messages,
        _list_or_json(row.get("tools"), "tools"),
        _list_or_json(row.get("documents"), "documents"),
        {k: v for k, v in (kwargs or {}).items() if v is not None},
    )


def check_row(row: Any) -> None:
    """Refuse a row nested deeper than :data:`MAX_DEPTH` or holding a lone surrogate, naming where.

    Iterative, so a row of any depth is refused without recursing into it.
    """
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(row, 0, ())]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and (found := _LONE_SURROGATE.search(value)):
                raise RowError(
                    f"{_path(path)} holds a lone surrogate (\\u{ord(found.group()):04x}), which is not a character"
                )
            continue
        if not isinstance(value, (Mapping, list)):
            continue
        if depth >= MAX_DEPTH:
            raise RowError(f"{_path(path)} nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, Mapping):
            for key, item in value.items():
                if isinstance(key, str) and not key.isascii() and _LONE_SURROGATE.search(key):
                    raise RowError(f"{_path(path)} has a key holding a lone surrogate, which is not a character")
                stack.append((item, depth + 1, (*path, key)))
        else:
            stack.extend((item, depth + 1, (*path, index)) for index, item in enumerate(value))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _path(path: tuple[Any, ...]) -> str:
    """``("messages", 0, "content")`` -> ``messages[0].content``; the whole row is ``the row``."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).lstrip(".")
    return text or "the row"


def _openai_messages(value: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(value, list) and not value:
        raise RowError(f"{where} is an empty list; a conversation needs at least one message")
    if not isinstance(value, list):
        raise RowError(f"{where} must be a non-empty list of messages, not {_kind(value)}")
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise RowError(f"{where}[{index}] must be an object with a role, not {_kind(message)}")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            allowed = ", ".join(sorted(ROLES))
            raise RowError(f"{where}[{index}] has role {role!r}; a role is one of {allowed}")
        _check_content(message.get("content"), f"{where}[{index}].content")
        # Parquet gives every message every field of the column, null where a message had none: a null is
        # dropped so the template sees the field as missing (content stays: null content is meaningful)
        messages.append({k: v for k, v in message.items() if v is not None or k == "content"})
    return messages


def _check_content(content: Any, where: str) -> None:
    """Content as the OpenAI message schema has it: a string, a list of parts (objects), or null."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise RowError(f"{where} must be a string, a list of parts or null, not {_kind(content)}")
    for index, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise RowError(f"{where}[{index}] must be a part (an object such as {{type, text}}), not {_kind(part)}")


def _sharegpt_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, list) and not value:
        raise RowError("conversations is an empty list; a conversation needs at least one turn")
    if not isinstance(value, list):
        raise RowError(f"conversations must be a non-empty list of turns, not {_kind(value)}")
    messages: list[dict[str, Any]] = []
    for index, turn in enumerate(value):
        if not isinstance(turn, Mapping):
            raise RowError(f"conversations[{index}] must be an object with from and value, not {_kind(turn)}")
        speaker, text = turn.get("from"), turn.get("value")
        role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            known = ", ".join(SHAREGPT_ROLES)
            raise RowError(f"conversations[{index}] is from {speaker!r}; a ShareGPT speaker is one of {known}")
        if not isinstance(text, str):
            raise RowError(f"conversations[{index}].value must be a string, not {_kind(text)}")
        if speaker == "function_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": [_tool_call(text, index)]})
        else:
            messages.append({"role": role, "content": text})
    return messages


def _tool_call(text: str, index: int) -> dict[str, Any]:
    try:
        call = json.loads(text)
    except ValueError:
        call = None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise RowError(f'conversations[{index}] is a function_call whose value is not JSON {{"name", "arguments"}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return {"type": "function", "function": {"name": call["name"], "arguments": arguments}}


def _side(value: Any, where: str, role: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return _openai_messages(value, where)
    raise RowError(f"{where} must be a string or a list of messages, not {_kind(value)}")


def _list_or_json(value: Any, where: str) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(f"{where} is a string that is not JSON ({exc})") from None
    if not isinstance(value, list):
        raise RowError(f"{where} must be a list, not {_kind(value)}")
    return value or None


def _kind(value: Any) -> str:
    """What a JSON value is, in words: ``null``, ``a number``, ``an object``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"
