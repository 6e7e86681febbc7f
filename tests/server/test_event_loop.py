"""The server's event loop stays free while a request is planned: rendering and encoding a long conversation
(seconds, for megabytes of text) runs on a worker thread, so other requests and streams go on meanwhile.

In process, over httpx's ASGI transport, with a backend that answers at once: the render of one marked
request waits until the test has had an answer from ``/health``. On the event loop, that render would hold
the loop, and ``/health`` would answer only after it. The embedded model's own tokenizer (``/tokenize`` of a
prompt) is held the same way.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx
import pytest

from chatcodec import ChatTemplate, load_template
from chatcodec.backends import Chunk, Generation, ModelInfo
from chatcodec.server.app import create_app

#: the content of the message whose render waits for the test
MARK = "render me once /health has answered"
#: a prompt long enough for the embedded model to tokenize it on a worker thread
LONG = "Hello world. " * 1000


class AnsweringBackend:
    """A backend that answers every prompt with one word (the server's planning is under test, not generation)."""

    info = ModelInfo("answering", context_length=4096)

    async def generate(self, request: Generation) -> AsyncGenerator[Chunk, None]:
        yield Chunk("Hello", "stop", prompt_tokens=len(request.prompt), completion_tokens=1)

    async def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return [ord(c) for c in text]

    async def detokenize(self, ids: Sequence[int]) -> str:
        return "".join(map(chr, ids))

    async def aclose(self) -> None:
        pass


async def started(events: list[str], task: asyncio.Task[Any]) -> None:
    """Back once the held work has started (``events`` has its first entry) or ``task`` has ended; at most 10 s."""
    for _ in range(1000):
        if events or task.done():
            return
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "answering", "messages": [{"role": "user", "content": MARK}]}),
        ("/tokenize", {"messages": [{"role": "user", "content": MARK}]}),
    ],
)
def test_health_answers_while_a_request_is_rendered(
    path: str, body: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    release = threading.Event()
    render = ChatTemplate.render

    def waiting_render(self: ChatTemplate, messages: Any, **options: Any) -> str:
        if messages and messages[0].get("content") == MARK:
            events.append("render started")
            release.wait(10)  # on the event loop, this waits out the 10 s: /health cannot answer meanwhile
            events.append("render done")
        return render(self, messages, **options)

    monkeypatch.setattr(ChatTemplate, "render", waiting_render)
    app = create_app(AnsweringBackend(), load_template("chatml"))

    async def requests() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            planned = asyncio.create_task(client.post(path, json=body))
            await started(events, planned)
            health = await client.get("/health")
            events.append(f"/health {health.status_code}")
            release.set()
            return await planned

    answer = asyncio.run(requests())
    assert events == ["render started", "/health 200", "render done"]
    assert answer.status_code == 200, answer.text


def test_the_embedded_model_tokenizes_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``/tokenize`` of a prompt (no messages) goes to the backend's own tokenizer: the embedded model's runs on
    a worker thread too, for a long text (a short one is quicker on the loop than a thread's hop)."""
    from chatcodec.backends import LlamaBackend
    from chatcodec.backends.tokenizer import GGUFTokenizer

    backend = LlamaBackend(n_threads=1)
    events: list[str] = []
    release = threading.Event()
    tokenize = GGUFTokenizer.tokenize

    def waiting_tokenize(self: GGUFTokenizer, text: str, *, special: bool) -> list[int]:
        events.append("tokenize started")
        release.wait(10)
        events.append("tokenize done")
        return tokenize(self, text, special=special)

    monkeypatch.setattr(GGUFTokenizer, "tokenize", waiting_tokenize)

    async def calls() -> tuple[list[int], str]:
        try:
            tokenizing = asyncio.create_task(backend.tokenize(LONG))
            await started(events, tokenizing)
            events.append("the loop ran")
            release.set()
            ids = await tokenizing
            return ids, await backend.detokenize(ids)
        finally:
            await backend.aclose()

    ids, text = asyncio.run(calls())
    assert events == ["tokenize started", "the loop ran", "tokenize done"]
    assert text == LONG and len(ids) >= 3000
