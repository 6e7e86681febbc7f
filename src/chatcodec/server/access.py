"""One line per request: method, path, status, tokens in and out, and time.

:class:`AccessLog` is ASGI middleware around the whole app; :class:`Metered` wraps the backend so that every
generation a request runs, whichever endpoint or dialect asked for it, adds its prompt and completion tokens
to that request's line (a context variable carries the count from the request to its generations). The lines
go to the ``chatcodec.access`` logger at INFO::

    chatcodec: POST /v1/chat/completions 200 in=31 out=12 0.412s
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from contextvars import ContextVar
from typing import Any

from ..backends import Backend, Chunk, Generation, ModelInfo

__all__ = ["AccessLog", "Metered"]

log = logging.getLogger("chatcodec.access")

#: the token counts of the request being served ([prompt, completion]), None outside a request
_tokens: ContextVar[list[int] | None] = ContextVar("chatcodec_request_tokens", default=None)

_ASGIApp = Any


class AccessLog:
    """ASGI middleware: after each HTTP request, one line on :data:`log` (see the module docstring)."""

    def __init__(self, app: _ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counts = [0, 0]
        reset = _tokens.set(counts)
        status = 0
        started = time.perf_counter()

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            _tokens.reset(reset)
            seconds = time.perf_counter() - started
            path = scope.get("path", "")
            line = f"{scope.get('method', '?')} {path} {status or '-'} in={counts[0]} out={counts[1]} {seconds:.3f}s"
            log.info("chatcodec: %s", line)


class Metered:
    """``backend``, whose generations count their tokens into the current request's access line.

    Every other attribute (``tokenizer``, ``warm``, ``stats``, ...) is the backend's own.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    @property
    def info(self) -> ModelInfo:
        return self.backend.info

    async def generate(self, request: Generation) -> AsyncGenerator[Chunk, None]:
        counts = _tokens.get()
        async with aclosing(self.backend.generate(request)) as chunks:
            async for chunk in chunks:
                if counts is not None and chunk.finish_reason is not None:
                    counts[0] += chunk.prompt_tokens or 0
                    counts[1] += chunk.completion_tokens or 0
                yield chunk

    async def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return await self.backend.tokenize(text, special=special)

    async def detokenize(self, ids: Sequence[int]) -> str:
        return await self.backend.detokenize(ids)

    async def aclose(self) -> None:
        await self.backend.aclose()
