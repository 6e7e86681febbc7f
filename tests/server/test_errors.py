"""Bad input gets the right status and a message naming the field, and the server keeps serving."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import httpx
import pytest

from .conftest import Server, chatcodec_serve

TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
}
USER = [{"role": "user", "content": "Hi"}]

#: (body, status, the field the error names, words its message holds)
BAD: list[tuple[Any, int, str | None, str]] = [
    (b"{not json", 400, "body", "not valid JSON"),
    (b"", 400, "body", "empty"),
    ([1, 2], 400, "body", "JSON object"),
    ({}, 400, "messages", "required"),
    ({"messages": "Hi"}, 400, "messages", "list"),
    ({"messages": []}, 400, "messages", "at least one"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, 400, "messages[0].role", "wizard"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "string"),
    ({"messages": [{"role": "user"}]}, 400, "messages[0].content", "required"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content[0].type",
        "text only",
    ),
    ({"messages": USER, "max_tokens": "ten"}, 400, "max_tokens", "integer"),
    ({"messages": USER, "max_tokens": 0}, 400, "max_tokens", "at least 1"),
    ({"messages": USER, "temperature": 9}, 400, "temperature", "between"),
    ({"messages": USER, "stream": "yes"}, 400, "stream", "true or false"),
    ({"messages": USER, "n": 2}, 400, "n", "n must be 1"),
    ({"messages": USER, "stop": [1]}, 400, "stop", "strings"),
    ({"messages": USER, "tools": {"f": 1}}, 400, "tools", "list"),
    ({"messages": USER, "tools": [{"type": "function", "function": {}}]}, 400, "tools[0].function.name", "name"),
    (
        {"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "thing"}}}]},
        400,
        "tools[0].function.parameters",
        "not a valid JSON schema",
    ),
    ({"messages": USER, "tools": [TOOL], "tool_choice": "always"}, 400, "tool_choice", "always"),
    (
        {"messages": USER, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        400,
        "tool_choice",
        "not among the tools",
    ),
    ({"messages": USER, "tool_choice": "required"}, 400, "tool_choice", "no tools"),
    ({"messages": USER, "response_format": {"type": "yaml"}}, 400, "response_format.type", "yaml"),
    (
        {
            "messages": USER,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}},
        },
        400,
        "response_format.json_schema.schema",
        "not a valid JSON schema",
    ),
    ({"messages": USER, "stream_options": {"include_usage": True}}, 400, "stream_options", "stream is true"),
    ({"messages": USER, "chat_template_kwargs": []}, 400, "chat_template_kwargs", "JSON object"),
    ({"messages": USER, "chat_template_kwargs": {"polyfill": False}}, 400, "chat_template_kwargs.polyfill", "may not"),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]},
        400,
        "messages[0].tool_calls[0].function.arguments",
        "not valid JSON",
    ),
]


@pytest.fixture
def server(qwen35_template: Server) -> Server:
    return qwen35_template


def post(server: Server, body: Any, path: str = "/v1/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, timeout=60)


def still_serving(server: Server) -> None:
    answer = post(server, {"messages": USER, "max_tokens": 2, "temperature": 0})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(("body", "status", "param", "words"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_request(server: Server, body: Any, status: int, param: str | None, words: str) -> None:
    answer = post(server, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error" and error["code"] == status


def test_server_answers_after_every_bad_request(server: Server) -> None:
    for body, *_ in BAD:
        post(server, body)
    still_serving(server)


def test_body_over_the_size_limit(server: Server) -> None:
    huge = {"messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]}
    answer = post(server, huge)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "body" and "limit" in answer.json()["error"]["message"]
    still_serving(server)


def test_template_error_carries_the_template_message(server: Server) -> None:
    # Qwen3.5's template refuses a chat without a user message (no polyfill helps there).
    alone = [{"role": "assistant", "content": "Hello."}]
    answer = post(server, {"messages": alone, "max_tokens": 2})
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert "No user query found in messages." in message
    still_serving(server)


def test_wrong_route_and_method(server: Server) -> None:
    assert httpx.get(server.url + "/v1/nothing", timeout=30).json()["error"]["code"] == 404
    assert httpx.get(server.url + "/v1/chat/completions", timeout=30).json()["error"]["code"] == 405
    assert post(server, {"prompt": 3}, "/v1/completions").json()["error"]["param"] == "prompt"
    assert post(server, {"tokens": ["a"]}, "/detokenize").json()["error"]["param"] == "tokens"
    assert post(server, {"tokens": [10**9]}, "/detokenize").status_code == 400
    still_serving(server)


def test_backend_down_is_502(tmp_path_factory: pytest.TempPathFactory) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gateway = chatcodec_serve(
        tmp_path_factory.mktemp("down"), "--backend", f"http://127.0.0.1:{port}", "--template", "qwen3", name="down"
    )
    try:
        for stream in (False, True):
            answer = post(gateway, {"messages": USER, "max_tokens": 2, "stream": stream})
            assert answer.status_code == 502, answer.text
            assert "backend" in answer.json()["error"]["message"]
    finally:
        gateway.stop()


class SilentBackend:
    """A TCP listener on 127.0.0.1 that accepts connections and never answers; stopped by the test."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.held.append(conn)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)
        for conn in self.held:
            conn.close()
        self.listener.close()


def test_backend_timeout_is_504(tmp_path_factory: pytest.TempPathFactory) -> None:
    silent = SilentBackend()
    gateway = chatcodec_serve(
        tmp_path_factory.mktemp("timeout"),
        "--backend", f"http://127.0.0.1:{silent.port}", "--template", "qwen3", "--backend-timeout", "1",
        name="timeout",
    )  # fmt: skip
    try:
        answer = post(gateway, {"messages": USER, "max_tokens": 2})
        assert answer.status_code == 504, answer.text
        assert "timed out" in answer.json()["error"]["message"]
        assert httpx.get(gateway.url + "/health", timeout=30).status_code == 200
    finally:
        gateway.stop()
        silent.stop()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["serve", "--tokenizer", "x.gguf"], "--tokenizer is for --backend"),
        (
            ["serve", "--backend", "http://127.0.0.1:9", "--template", "qwen3", "--tokenizer", "/nowhere"],
            "no tokenizer at",
        ),
        (["serve", "--backend", "http://127.0.0.1:9"], "--backend needs --template"),
        (["serve", "--backend", "ftp://x", "--template", "qwen3"], "must start with http"),
    ],
)
def test_serve_command_errors_are_one_line(argv: list[str], words: str) -> None:
    from ..cli.test_render import run

    code, stdout, stderr = run(argv)
    assert code == 2 and not stdout
    assert stderr.count("\n") == 1 and stderr.startswith("chatcodec: error:") and words in stderr, stderr
