"""OpenAI-style errors: every failure becomes a status and a body that names what went wrong.

>>> APIError(400, "messages must not be empty", param="messages").body()
{'error': {'message': 'messages must not be empty', 'type': 'invalid_request_error', 'param': 'messages', 'code': 400}}
"""

from __future__ import annotations

from typing import Any

__all__ = ["APIError"]

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
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
