"""JSON bodies read and written in pieces, so that a worker thread handling megabytes never holds the event loop.

``json.loads`` and ``json.dumps`` are single C calls that keep the GIL from start to end: 8 MiB of token ids
(4 million numbers) takes half a second either way, and for that long the event loop (``/health``, every
stream) cannot run, even though the work is on another thread. Long lists of integers, which are what makes
``/tokenize`` answers and ``/detokenize`` requests big, are therefore done a slice at a time: between slices the
thread lets the loop have the GIL. Everything else goes through ``json`` as before, and the results are the
same: :func:`loads` gives what ``json.loads`` gives (a body it cannot take apart is left to ``json.loads``
whole, errors included), and :func:`dumps` writes what ``json.dumps(content, ensure_ascii=False,
separators=(",", ":"))`` writes, lone surrogates escaped (:func:`~chatcodec.server.errors.json_bytes`). Long
strings (``/detokenize``'s answer) are written a slice at a time too.

>>> loads(b'{"tokens": [1, 2, 3]}')
{'tokens': [1, 2, 3]}
>>> dumps({"tokens": [1, 2, 3], "count": 3})
b'{"tokens":[1,2,3],"count":3}'
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from .errors import APIError, json_bytes

__all__ = ["dumps", "loads", "parse"]

#: how many characters of a list of numbers are parsed at once, and how many items are written at once
_SLICE = 1 << 16
#: characters of a long string written at once
_TEXT_SLICE = 1 << 18
#: lists of integers this long (in characters) are parsed slice by slice
_LONG = 1 << 18
#: the start of a list of numbers worth parsing apart, and what ends one
_RUN = 4096
_RUN_START = re.compile(rb"\[[0-9,\s-]{%d}" % _RUN)
_OTHER = re.compile(rb"[^0-9,\s-]")


def loads(data: bytes | bytearray) -> Any:
    """The JSON value of ``data``, as ``json.loads`` reads it; long lists of integers are parsed in slices."""
    if len(data) < _LONG:
        return json.loads(data)
    lists: list[list[int]] = []
    pieces: list[bytes] = []
    mark = f"\u0000chatcodec-{secrets.token_hex(8)}-"  # stands for a list parsed apart: no body can guess it
    at = 0
    for start, end in _number_runs(data):
        parsed = _ints(bytes(data[start + 1 : end]))
        if parsed is None:
            continue
        pieces += (bytes(data[at:start]), json.dumps(f"{mark}{len(lists)}").encode())
        lists.append(parsed)
        at = end + 1
    if not lists:
        return json.loads(data)
    pieces.append(bytes(data[at:]))
    value = json.loads(b"".join(pieces))
    return _put_back(value, mark, lists)


def parse(data: bytes | bytearray) -> Any:
    """A request body's JSON value (:func:`loads`), or a 400 that says why it is not JSON."""
    try:
        return loads(data)
    except (ValueError, RecursionError) as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}", param="body") from None


def _number_runs(data: bytes | bytearray) -> list[tuple[int, int]]:
    """Where ``[`` and ``]`` enclose at least :data:`_LONG` characters of digits, commas, minus signs and spaces,
    found a window at a time (one regex over megabytes would hold the GIL too)."""
    runs = []
    size = len(data)
    pos = 0
    while pos < size:
        found = _RUN_START.search(data, pos, min(size, pos + _SLICE + _RUN))
        if found is None:
            pos += _SLICE
            continue
        start, end = found.start(), found.end()
        while True:
            other = _OTHER.search(data, end, end + _SLICE)
            if other is not None:
                end = other.start()
                break
            end = min(size, end + _SLICE)
            if end == size:
                break
        if end < size and data[end] == ord("]") and end - start > _LONG:
            runs.append((start, end))
        pos = end
    return runs


def _ints(text: bytes) -> list[int] | None:
    """The integers of ``1, 2, 3`` (a list's inside), a slice at a time; None if it is not exactly that."""
    out: list[int] = []
    at = 0
    while True:
        cut = text.find(b",", at + _SLICE)
        piece = text[at:] if cut < 0 else text[at:cut]
        if not piece.strip():
            return None  # an empty item: not JSON
        try:
            out += json.loads(b"[" + piece + b"]")
        except ValueError:
            return None
        if cut < 0:
            return out
        at = cut + 1


def _put_back(value: Any, mark: str, lists: list[list[int]]) -> Any:
    """``value`` with each ``mark`` string replaced by the list it stands for."""

    def swap(item: Any) -> Any:
        if isinstance(item, str) and item.startswith(mark):
            return lists[int(item[len(mark) :])]
        return item

    value = swap(value)
    todo = [value]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                node[key] = swap(item)
                if isinstance(item, (dict, list)):
                    todo.append(item)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                node[index] = swap(item)
                if isinstance(item, (dict, list)):
                    todo.append(item)
    return value


def dumps(content: dict[str, Any]) -> bytes:
    """``content`` (an answer object) as compact JSON; its long lists are written a slice at a time."""
    parts = []
    for key, value in content.items():
        if isinstance(value, list) and len(value) > _SLICE:
            slices = [json_bytes(value[i : i + _SLICE])[1:-1] for i in range(0, len(value), _SLICE)]
            encoded = b"[" + b",".join(slices) + b"]"
        elif isinstance(value, str) and len(value) > _TEXT_SLICE:  # each character is escaped on its own
            slices = [json_bytes(value[i : i + _TEXT_SLICE])[1:-1] for i in range(0, len(value), _TEXT_SLICE)]
            encoded = b'"' + b"".join(slices) + b'"'
        else:
            encoded = json_bytes(value)
        parts.append(json_bytes(key) + b":" + encoded)
    return b"{" + b",".join(parts) + b"}"
