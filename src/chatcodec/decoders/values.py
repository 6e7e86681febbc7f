"""Values that are not JSON text yet: schema typing, Python literals, and an incremental JSON writer.

XML-style and Python-style formats write argument values as raw text. Those values are typed here
(from the tool schema when there is one) and written out as JSON through :class:`ArgsWriter`, which
streams ``{"key": "value...`` as soon as each piece is certain.
"""

from __future__ import annotations

import ast
import json
import unicodedata
from collections.abc import Mapping
from typing import Any

from .base import parse_arguments

__all__ = [
    "ArgsWriter",
    "could_be_json",
    "main_type",
    "py_literal_json",
    "py_unescape",
    "schema_types",
    "typed_value",
    "valid_name",
]

_dumps = json.JSONEncoder(ensure_ascii=False).encode
_strict_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode

#: JSON-schema types whose value text is parsed as JSON rather than kept as a string
PARSED_TYPES = frozenset({"integer", "number", "float", "boolean", "object", "array", "null", "int", "bool"})
_PY_LITERALS = {"None": "null", "True": "true", "False": "false"}


def valid_name(name: str) -> bool:
    """A plausible tool name: non-empty, no whitespace, no markup or quote characters."""
    return 0 < len(name) <= 256 and not any(c.isspace() or c in "<>{}[]\"'`" for c in name)


def schema_types(schema: Any) -> list[str]:
    """The JSON-schema types a parameter schema allows, in order (``anyOf``/``oneOf``/type lists).

    Any value is accepted: what is not a schema allows no type. Nesting is walked without
    recursion, and a schema that contains itself is walked once.

    >>> schema_types({"anyOf": [{"type": "integer"}, {"type": "null"}]})
    ['integer', 'null']
    """
    found: list[str] = []
    seen: set[int] = set()
    todo = [schema]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            found.append(item)
            continue
        if not isinstance(item, Mapping) or id(item) in seen:
            continue
        seen.add(id(item))
        kind = item.get("type")
        if isinstance(kind, str):
            found.append(kind)
        elif isinstance(kind, list | tuple):
            found.extend(k for k in kind if isinstance(k, str))
        else:
            options: list[Any] = []
            for key in ("anyOf", "oneOf"):
                listed = item.get(key)
                if isinstance(listed, list | tuple):
                    options.extend(listed)
            if options:
                todo.extend(reversed(options))
            elif isinstance(item.get("enum"), list | tuple) and all(isinstance(v, str) for v in item["enum"]):
                found.append("string")
    return found


def main_type(types: list[str]) -> str | None:
    """The type a raw value is read as: the first that is not ``null`` (vLLM's rule for anyOf)."""
    for kind in types:
        if kind != "null":
            return kind
    return types[0] if types else None


def typed_value(text: str, kind: str | None) -> str:
    """JSON text for a raw argument value, typed by the schema type ``kind`` (None: unknown).

    Strings stay strings. Declared non-string types are parsed as JSON, with Python's ``None``,
    ``True`` and ``False`` accepted; text that does not parse stays a string. Without a schema, text
    that is valid JSON is taken as JSON and anything else is a string.

    >>> typed_value("42", "integer"), typed_value("42", "string"), typed_value("None", "integer")
    ('42', '"42"', 'null')
    >>> typed_value("{'unit': 'C', 'round': True}", "object")
    '{"unit": "C", "round": true}'

    """
    if kind == "string":
        return _dumps(text)
    if kind is not None:
        literal = _PY_LITERALS.get(text)
        if literal is not None:
            return literal
    value, ok = parse_arguments(text)
    if ok:
        try:
            return _strict_dumps(value)
        except (ValueError, RecursionError):  # NaN or Infinity, or too deep: not JSON, keep the text
            pass
    elif text[:1] in ("{", "[") and kind in (None, "object", "array"):
        converted = py_literal_json(text)  # a Python dict or list, as some templates print them
        if converted is not None:
            return converted
    return _dumps(text)


def could_be_json(text: str) -> bool:
    """Whether ``text`` (leading whitespace stripped) may still turn out to be a JSON scalar or value."""
    if not text:
        return True
    c = text[0]
    if c in '{["':
        return True
    if c in "-0123456789":
        return all(ch in "0123456789+-.eE" for ch in text)
    word = text.rstrip()
    return any(lit.startswith(word) for lit in ("true", "false", "null"))


class ArgsWriter:
    """Writes a JSON arguments object to a sink piece by piece, keys and values in order.

    >>> out = []
    >>> w = ArgsWriter(out.append)
    >>> w.key("city"); w.string("Par"); w.string("is"); w.end_string(); w.key("n"); w.value("3"); w.close()
    >>> "".join(out)
    '{"city": "Paris", "n": 3}'
    """

    __slots__ = ("_count", "_emit", "_in_string", "closed", "opened")

    def __init__(self, emit: Any) -> None:
        self._emit = emit
        self._count = 0
        self._in_string = False
        self.opened = self.closed = False

    def _open(self) -> None:
        if not self.opened:
            self.opened = True
            self._emit("{")

    def key(self, name: str) -> None:
        self._open()
        self._emit((", " if self._count else "") + _dumps(name) + ": ")
        self._count += 1

    def string(self, text: str) -> None:
        if not self._in_string:
            self._in_string = True
            self._emit('"')
        if text:
            self._emit(_dumps(text)[1:-1])

    def end_string(self) -> None:
        if not self._in_string:
            self._emit('"')
        self._emit('"')
        self._in_string = False

    def value(self, json_text: str) -> None:
        self._emit(json_text)

    def close(self) -> None:
        self._open()
        if not self.closed:
            self.closed = True
            self._emit("}")


# -- Python literals ---------------------------------------------------------------------------

_PY_SIMPLE = {
    "\\": "\\",
    "'": "'",
    '"': '"',
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\n": "",
}
_HEX_WIDTH = {"x": 2, "u": 4, "U": 8}


def py_unescape(text: str, i: int, final: bool) -> tuple[str, int] | None:
    """Decode the Python string escape at ``text[i]`` (a backslash); None if it is incomplete."""
    n = len(text)
    if i + 1 >= n:
        return (text[i:], n) if final else None
    c = text[i + 1]
    if c in _PY_SIMPLE:
        return _PY_SIMPLE[c], i + 2
    if c in _HEX_WIDTH:
        end = i + 2 + _HEX_WIDTH[c]
        if end > n:
            return (text[i:], n) if final else None
        try:
            return chr(int(text[i + 2 : end], 16)), end
        except ValueError:
            return text[i : i + 2], i + 2
    if c in "01234567":
        end = i + 2
        while end < min(n, i + 4) and text[end] in "01234567":
            end += 1
        if end < i + 4 and end == n and not final:
            return None
        return chr(int(text[i + 1 : end], 8)), end
    if c == "N":
        close = text.find("}", i)
        if close < 0:
            return (text[i:], n) if final or n - i > 100 else None
        try:
            return unicodedata.lookup(text[i + 3 : close]), close + 1
        except KeyError:
            return text[i : close + 1], close + 1
    return text[i : i + 2], i + 2


def py_literal_json(text: str) -> str | None:
    """JSON text for a Python literal (``{'a': [1, None]}``), or None when it is not one."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    try:
        return _strict_dumps(_jsonable(value))
    except (TypeError, ValueError, RecursionError):
        return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | complex):
        raise TypeError("not JSON")
    return value
