r"""OpenAI-style errors: every failure becomes a status and a body that names what went wrong.

>>> APIError(400, "messages must not be empty", param="messages").body()
{'error': {'message': 'messages must not be empty', 'type': 'invalid_request_error', 'param': 'messages', 'code': 400}}

The body is always JSON, even when the message repeats text from the request that UTF-8 cannot hold (a lone
surrogate in a tool name): such characters are written as JSON escapes.

>>> json_bytes({"name": "\ud800"})
b'{"name":"\\ud800"}'
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["APIError", "json_bytes"]

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    500: "internal_error",
    502: "backend_error",
    503: "backend_error",
    504: "backend_timeout",
}


class APIError(Exception):
    """A request that ends in an error answer (``status``) with an OpenAI error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def json_bytes(content: Any) -> bytes:
    """``content`` as compact JSON in UTF-8; characters UTF-8 cannot encode (lone surrogates) become ``\\uXXXX``
    escapes, so the bytes are always valid UTF-8 and valid JSON."""
    text = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")
