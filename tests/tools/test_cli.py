"""chatcodec tools schema / run: exact output, one clear line and exit code 2 for every mistake.

``tools run`` is driven against a scripted OpenAI-style server on 127.0.0.1 (a thread of this process,
answering a bounded number of requests); the runs against chatcodec serve and its embedded model are in
test_end_to_end.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from chatcodec import tool_schema

from ..cli.test_render import run
from .conftest import EXAMPLE

Script = Callable[[dict[str, Any]], dict[str, Any]]


def test_schema_of_one_function(roundtrip: dict[str, Any]) -> None:
    code, stdout, stderr = run(["tools", "schema", f"{EXAMPLE}:get_current_temperature"])
    assert (code, stderr) == (0, "")
    assert json.loads(stdout) == roundtrip["tools"][0]
    assert stdout.decode() == json.dumps(roundtrip["tools"][0], indent=2) + "\n"


def test_schema_of_a_module_and_legacy_form(roundtrip: dict[str, Any]) -> None:
    code, stdout, _ = run(["tools", "schema", str(EXAMPLE)])  # the file's TOOLS
    assert code == 0 and json.loads(stdout) == roundtrip["tools"]
    code, stdout, _ = run(["tools", "schema", f"{EXAMPLE}:get_temperature_date,get_current_temperature", "--legacy"])
    assert code == 0
    assert json.loads(stdout) == [roundtrip["tools"][1]["function"], roundtrip["tools"][0]["function"]]


def test_schema_of_an_importable_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mytools.py").write_text(
        "from pydantic import BaseModel\n\n"
        "class Box(BaseModel):\n    width: int\n    height: int\n\n"
        "def area(box: Box) -> int:\n"
        '    """Area of a box.\n\n    Args:\n        box: The box.\n    """\n'
        "    return box.width * box.height\n\n"
        "def _private(): pass\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, stdout, stderr = run(["tools", "schema", "mytools"])
    assert (code, stderr) == (0, "")
    import mytools  # type: ignore[import-not-found]

    assert json.loads(stdout) == [tool_schema(mytools.area)]
    assert json.loads(stdout)[0]["function"]["parameters"]["properties"]["box"]["required"] == ["width", "height"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tools"], "Say what to do: chatcodec tools schema ..., chatcodec tools list ... or chatcodec tools run ..."),
        (["tools", "schema", "no/such/file.py"], "Python file no/such/file.py does not exist"),
        (["tools", "schema", "no_such_module_xyz"], "No Python file or module 'no_such_module_xyz'"),
        (["tools", "schema", f"{EXAMPLE}:nope"], "has no function 'nope' (its functions: get_current_temperature,"),
        (["tools", "schema", f"{EXAMPLE}:QUESTION"], "QUESTION in"),
        (["tools", "schema", f"{EXAMPLE}:main"], "Cannot make a tool schema for main: it has no docstring"),
        (["tools", "schema", "json:dumps"], "Cannot make a tool schema for dumps: parameters 'obj', 'skipkeys'"),
        (["tools", "run", str(EXAMPLE), "--prompt", "hi", "--model", "no/such.gguf"], "No model file at no/such.gguf"),
        (
            ["tools", "run", str(EXAMPLE), "-p", "hi", "--url", "http://127.0.0.1:9/v1", "-m", "x"],
            "Cannot reach the server at http://127.0.0.1:9/v1",
        ),
        (["tools", "run", str(EXAMPLE), "-p", "hi", "--max-rounds", "0"], "--max-rounds must be at least 1"),
        (
            [
                "tools",
                "run",
                str(EXAMPLE),
                "-p",
                "hi",
                "--tool-choice",
                "nope",
                "--url",
                "http://127.0.0.1:9/v1",
                "-m",
                "x",
            ],
            "tool_choice 'nope' is neither",
        ),
    ],
)
def test_mistakes_are_one_line(argv: list[str], message: str) -> None:
    code, stdout, stderr = run(argv)
    assert code == 2 and stdout == b""
    assert stderr.startswith("chatcodec: error: ") and stderr.count("\n") == 1
    assert message in stderr


def test_a_file_that_fails_to_import(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no config')\n", encoding="utf-8")
    code, _, stderr = run(["tools", "schema", str(broken)])
    assert code == 2
    assert stderr == f"chatcodec: error: Running {broken} failed: RuntimeError: no config\n"


# --------------------------------------------------------------------------------------------------
# tools run against a scripted server


@pytest.fixture
def server() -> Iterator[Server]:
    scripted = Server()
    thread = threading.Thread(target=scripted.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield scripted
    scripted.httpd.shutdown()
    scripted.httpd.server_close()
    thread.join(5)


class Server:
    """A scripted OpenAI-style server on 127.0.0.1: /v1/models and /v1/chat/completions, 20 requests at most."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: Script = lambda body: {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.reply(
                    200, {"object": "list", "data": [{"id": "scripted-model", "object": "model", "owned_by": "me"}]}
                )

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                if len(owner.requests) > 20:
                    self.reply(429, {"error": {"message": "too many requests in one test"}})
                    return
                self.reply(200, owner.script(body))

            def reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted-model",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
    }


def seed_script(body: dict[str, Any]) -> dict[str, Any]:
    if any(m["role"] in ("tool", "function") for m in body["messages"]):
        return completion({"content": "26.1°C now, 25.9°C tomorrow."})
    calls = [
        ("get_current_temperature", {"location": "San Francisco, CA, USA"}),
        ("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01"}),
    ]
    return completion(
        {
            "content": None,
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                for i, (n, a) in enumerate(calls)
            ],
        }
    )


def test_run_prints_the_transcript(server: Server, roundtrip: dict[str, Any]) -> None:
    server.script = seed_script
    question = roundtrip["messages"][0]["content"]
    code, stdout, stderr = run(
        [
            "tools",
            "run",
            str(EXAMPLE),
            "--url",
            server.url,
            "-p",
            question,
            "--tool-choice",
            "required",
            "--temperature",
            "0",
        ]
    )
    assert code == 0
    transcript = json.loads(stdout)
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m["content"] for m in transcript[2:4]] == [m["content"] for m in roundtrip["messages"][2:4]]
    assert stderr.splitlines() == [
        "chatcodec: note: asking model 'scripted-model', the first the server lists (choose with --model)",
        'chatcodec: round 1: get_current_temperature({"location": "San Francisco, CA, USA"}),'
        ' get_temperature_date({"location": "San Francisco, CA, USA", "date": "2024-10-01"})',
        "chatcodec: round 2: the model answered",
        "chatcodec: note: each round asked for at most 512 tokens (--max-tokens N to change it)",
    ]
    first, second = server.requests
    assert (first["model"], first["tool_choice"], first["temperature"]) == ("scripted-model", "required", 0)
    assert first["max_tokens"] == second["max_tokens"] == 512, "a bounded default per round"
    assert second["tool_choice"] == "auto"


def test_run_functions_style_from_a_file_with_show(server: Server, tmp_path: Path) -> None:
    server.script = seed_script
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "Weather?"}]}), encoding="utf-8")
    code, stdout, stderr = run(
        ["tools", "run", str(EXAMPLE), str(chat), "--url", server.url, "-m", "m", "--style", "functions", "--show"]
    )
    assert code == 0, stderr
    assert stdout.decode().splitlines() == [
        "[user] Weather?",
        '[assistant calls] get_current_temperature({"location": "San Francisco, CA, USA"})',
        '[assistant calls] get_temperature_date({"location": "San Francisco, CA, USA", "date": "2024-10-01"})',
        '[function get_current_temperature] {"temperature": 26.1, "location": "San Francisco, CA, USA",'
        ' "unit": "celsius"}',
        '[function get_temperature_date] {"temperature": 25.9, "location": "San Francisco, CA, USA",'
        ' "date": "2024-10-01", "unit": "celsius"}',
        "[assistant] 26.1°C now, 25.9°C tomorrow.",
    ]
    assert "functions" in server.requests[0] and server.requests[0]["model"] == "m"


def test_run_reports_server_errors(server: Server) -> None:
    def script(body: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("not reached")

    server.script = script
    server.requests.extend([{}] * 20)  # the next request goes over the server's budget: a 429 with a message
    code, stdout, stderr = run(["tools", "run", str(EXAMPLE), "-p", "hi", "--url", server.url, "-m", "m"])
    assert (code, stdout) == (2, b"")
    assert stderr == (
        f"chatcodec: error: The server at {server.url} answered 429: too many requests in one test"
        " [each round asked for at most 512 tokens (--max-tokens N to change it)]\n"
    )
