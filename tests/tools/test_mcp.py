"""Tools from real MCP servers: tests/tools/mcp_server.py (the mcp SDK's MCPServer) as a child over stdio,
and as a streamable HTTP server on 127.0.0.1.

Against both: the tools are listed with their schemas, calls go through the toolbox's one call path, and a
tool that raises, one that hangs past the timeout and a server killed mid-call each become an ``Error:``
result while the loop goes on to its answer. Closing leaves no child process (checked by PID) and no file
descriptor behind. The run on the embedded model is in test_mcp_end_to_end.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatcodec import InputError, Toolbox, ToolServerError

SERVER = Path(__file__).with_name("mcp_server.py")
STDIO = [sys.executable, str(SERVER)]
TOOLS = ["echo", "add", "fail", "hang", "die", "pid", "header", "grow"]
#: generous: a child that imports the mcp SDK takes seconds on a loaded machine
TIMEOUT = 120.0


def call(name: str, arguments: dict[str, Any] | str = "{}", call_id: str = "c") -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HTTPServer:
    """mcp_server.py over streamable HTTP on 127.0.0.1, as a process of its own."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process = subprocess.Popen(
            [*STDIO, "--http", str(self.port), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "the MCP test server exited while starting"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"the MCP test server did not listen on {self.port} within {TIMEOUT:g} s")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(30)


@pytest.fixture(scope="module")
def http_server() -> Iterator[HTTPServer]:
    server = HTTPServer("--name=http")
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["stdio", "http"])
def box(request: pytest.FixtureRequest) -> Iterator[Toolbox]:
    """A toolbox with the test server's tools, over each transport (closed at the end)."""
    toolbox = Toolbox(timeout=TIMEOUT)
    if request.param == "stdio":
        toolbox.add_mcp([*STDIO, "--name=stdio"], name="stdio")
    else:
        toolbox.add_mcp(url=request.getfixturevalue("http_server").url, name="http")
    yield toolbox
    toolbox.close()


def alive(pid: int) -> bool:
    """Whether a process with this id exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def gone(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Scripted:
    """An OpenAI-shaped client whose replies are given in advance; it keeps every request."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.chat = self
        self.completions = self

    def create(self, **request: Any) -> dict[str, Any]:
        self.requests.append(json.loads(json.dumps(request)))
        return {"choices": [{"message": {"role": "assistant", **self.replies.pop(0)}}]}


def calls(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"content": None, "tool_calls": list(entries)}


# --------------------------------------------------------------------------------------------------
# Listing and calling


def test_the_tools_are_listed_with_their_schemas(box: Toolbox) -> None:
    assert [tool["function"]["name"] for tool in box.tools] == TOOLS
    echo = box.tools[0]["function"]
    assert echo["description"] == "Echo the text back."
    assert echo["parameters"]["properties"]["text"]["type"] == "string"
    assert echo["parameters"]["required"] == ["text"]
    assert box.functions[1]["parameters"]["required"] == ["a", "b"]


def test_calls_give_structured_content_as_json(box: Toolbox) -> None:
    label = "stdio" if any(s.url is None for s in box._servers) else "http"
    assert box.call(call("echo", {"text": "hi"})) == {
        "role": "tool",
        "tool_call_id": "c",
        "content": json.dumps({"result": f"{label}: hi"}),
    }
    assert json.loads(box.call(call("add", {"a": 2, "b": 40}))["content"]) == {"sum": 42}


def test_arguments_are_validated_before_the_server_sees_them(box: Toolbox) -> None:
    [bad] = box.call_many([call("add", {"a": "two", "b": 1})])
    assert bad.message["content"] == "Error: invalid arguments for add: at ['a']: 'two' is not of type 'integer'."
    assert bad.exception is None


def test_a_tool_that_raises_is_an_error_result(box: Toolbox) -> None:
    assert box.call(call("fail", {"reason": "no"}))["content"] == "Error: fail failed: Error executing tool fail."


def test_a_tool_that_hangs_past_the_timeout_is_an_error_and_the_session_goes_on(box: Toolbox) -> None:
    box.timeout = 2.0
    try:
        started = time.monotonic()
        [hung, quick] = box.call_many([call("hang", {"seconds": 60}, "h"), call("add", {"a": 1, "b": 1}, "q")])
        assert time.monotonic() - started < 30
    finally:
        box.timeout = TIMEOUT
    assert hung.message["content"] == "Error: hang did not finish within 2 seconds."
    assert json.loads(quick.message["content"]) == {"sum": 2}  # the calls of a round run concurrently
    assert json.loads(box.call(call("add", {"a": 3, "b": 4}))["content"]) == {"sum": 7}


def test_the_loop_runs_mcp_tools_and_python_functions_together(box: Toolbox) -> None:
    """Round 1 calls a raising, a hanging and a working MCP tool; their results reach round 2's request."""

    def local(x: int) -> int:
        """A Python function beside the MCP tools.

        Args:
            x: A number.
        """
        return x * 10

    both = Toolbox([local], timeout=3.0)
    both._servers, both._thread = box._servers, box._thread  # share the open sessions for this test
    both._rebuild()
    try:
        client = Scripted(
            calls(call("fail", {"reason": "x"}, "1"), call("hang", {"seconds": 60}, "2"), call("local", {"x": 4}, "3")),
            {"content": "done"},
        )
        transcript = both.run(client, [{"role": "user", "content": "go"}], model="m")
    finally:
        both._servers, both._thread = [], None
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    assert [m["content"] for m in transcript[2:5]] == [
        "Error: fail failed: Error executing tool fail.",
        "Error: hang did not finish within 3 seconds.",
        "40",
    ]
    assert client.requests[1]["messages"][2:5] == transcript[2:5]
    assert transcript[-1]["content"] == "done"
    assert [t["function"]["name"] for t in client.requests[0]["tools"]] == ["local", *TOOLS]


# --------------------------------------------------------------------------------------------------
# A server that dies, and the end of a session


def test_a_stdio_server_killed_mid_call_is_an_error_then_restarted_once() -> None:
    with Toolbox(timeout=TIMEOUT) as box:
        box.add_mcp(STDIO, name="victim")
        first = int(json.loads(box.call(call("pid"))["content"])["result"])
        client = Scripted(calls(call("die", {}, "d")), {"content": "it died"})
        transcript = box.run(client, [{"role": "user", "content": "die"}], model="m")
        assert transcript[2]["content"] == (
            "Error: die failed: the MCP server 'victim' exited during the call (MCPError: Connection closed);"
            " it is started again before the next call."
        )
        assert transcript[-1] == {"role": "assistant", "content": "it died"}
        assert gone(first)
        second = int(json.loads(box.call(call("pid"))["content"])["result"])  # the one restart
        assert second != first and alive(second)
        assert "exited during the call" in box.call(call("die"))["content"]
        assert box.call(call("pid"))["content"] == (
            "Error: pid failed: the MCP server 'victim' exited (MCPError: Connection closed) and was restarted"
            " 1 time already."
        )
    assert gone(second)


def test_an_http_server_killed_mid_call_is_an_error() -> None:
    server = HTTPServer("--name=doomed")
    try:
        with Toolbox(timeout=TIMEOUT) as box:
            box.add_mcp(url=server.url, name="doomed")
            client = Scripted(calls(call("die", {}, "d")), {"content": "it died"})
            transcript = box.run(client, [{"role": "user", "content": "die"}], model="m")
            assert transcript[2]["content"].startswith(
                "Error: die failed: the MCP server 'doomed' exited during the call ("
            )
            assert transcript[-1] == {"role": "assistant", "content": "it died"}
            assert server.process.wait(30) == 3  # the tool's os._exit(3)
            # the restart finds nobody listening: reported, not raised
            assert box.call(call("pid"))["content"].startswith("Error: pid failed: The MCP server 'doomed'")
    finally:
        server.stop()


def test_after_close_no_child_process_is_left() -> None:
    box = Toolbox(timeout=TIMEOUT)
    box.add_mcp(STDIO, name="a")
    box.add_mcp(STDIO, name="b")
    pids = [int(json.loads(box.call(call(f"{label}-pid"))["content"])["result"]) for label in "ab"]
    assert all(alive(pid) for pid in pids) and pids[0] != pids[1]
    assert box._thread is not None
    thread = box._thread._thread
    box.close()
    assert all(gone(pid) for pid in pids)
    assert len(box) == 0 and box.tools == []
    assert not thread.is_alive()
    box.close()  # idempotent


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_and_close_cycles_leak_no_file_descriptors(http_server: HTTPServer) -> None:
    """100 cycles over HTTP (connecting is cheap), and a few over stdio (each starts a Python child)."""

    def cycle_http() -> None:
        with Toolbox(timeout=TIMEOUT) as box:
            box.add_mcp(url=http_server.url, name="http")
            assert len(box) == len(TOOLS)

    def cycle_stdio() -> int:
        with Toolbox(timeout=TIMEOUT) as box:
            box.add_mcp(STDIO)
            return int(json.loads(box.call(call("pid"))["content"])["result"])

    cycle_http()  # the first cycle opens what stays open (the SDK's lazily imported modules, say)
    cycle_stdio()
    threads = threading.active_count()
    before = open_fds()
    for _ in range(100):
        cycle_http()
    pids = [cycle_stdio() for _ in range(3)]
    assert open_fds() == before
    assert threading.active_count() == threads
    assert not any(alive(pid) for pid in pids)


# --------------------------------------------------------------------------------------------------
# Configuration


def qwen_agent_example(http_url: str) -> dict[str, Any]:
    """Qwen-Agent's documented example (its function-calling README: time and fetch through uvx), with the
    servers replaced by the local test server: time over stdio, fetch over streamable HTTP."""
    return {
        "mcpServers": {
            "time": {"command": sys.executable, "args": [str(SERVER), "--name=time", "--local-timezone=Asia/Shanghai"]},
            "fetch": {"type": "streamable-http", "url": http_url},
        }
    }


def test_from_mcp_config_takes_qwen_agents_example(http_server: HTTPServer, tmp_path: Path) -> None:
    """Both servers have the same tools, so each name is prefixed with its server's label."""
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(qwen_agent_example(http_server.url)), encoding="utf-8")
    with Toolbox.from_mcp_config(path) as box:
        names = [tool["function"]["name"] for tool in box.tools]
        assert names == [f"time-{name}" for name in TOOLS] + [f"fetch-{name}" for name in TOOLS]
        assert json.loads(box.call(call("time-echo", {"text": "now"}))["content"]) == {"result": "time: now"}
        assert json.loads(box.call(call("fetch-echo", {"text": "page"}))["content"]) == {"result": "http: page"}


def test_names_are_prefixed_only_where_they_clash(http_server: HTTPServer) -> None:
    def echo(text: str) -> str:
        """A Python echo, which keeps its name.

        Args:
            text: The text.
        """
        return text

    with Toolbox([echo], timeout=TIMEOUT) as box:
        added = box.add_mcp(url=http_server.url, name="web.site")
        assert added == ["web_site-echo", *TOOLS[1:]]  # '.' is not allowed in a tool name
        assert box.call(call("echo", {"text": "x"}))["content"] == "x"
        assert json.loads(box.call(call("web_site-echo", {"text": "y"}))["content"]) == {"result": "http: y"}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"servers": {}}, 'must be an object of the shape {"mcpServers"'),
        ({"mcpServers": {"a": "python x.py"}}, "mcpServers['a'] must be an object with a command or a url"),
        ({"mcpServers": {"a": {"args": []}}}, "needs a command (stdio) or a url (streamable HTTP)"),
        ({"mcpServers": {"a": {"command": "x", "args": "y"}}}, "needs command as a string and args as a list"),
        ({"mcpServers": {"a": {"url": "ftp://x"}}}, "must be an http:// or https:// address"),
        ({"mcpServers": {"a": {"url": "http://x", "type": "sse"}}}, "uses the SSE transport, which is deprecated"),
        ({"mcpServers": {"a": {"command": "x", "env": {"A": 1}}}}, "env must map strings to strings"),
    ],
)
def test_bad_configurations_are_one_line_input_errors(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=None) as caught:
        Toolbox.from_mcp_config(config)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_server_that_cannot_start_leaves_nothing_running(tmp_path: Path) -> None:
    config = {
        "mcpServers": {
            "ok": {"command": sys.executable, "args": [str(SERVER), "--name=not-left-behind"]},
            "missing": {"command": str(tmp_path / "no-such-program")},
        }
    }
    threads = threading.active_count()
    with pytest.raises(ToolServerError, match=r"The MCP server 'missing' \(.*no-such-program\) could not be started"):
        Toolbox.from_mcp_config(config)
    assert threading.active_count() == threads
    assert not [p for p in _children() if "not-left-behind" in p]
    disabled = {"mcpServers": {"off": {"command": "nothing", "disabled": True}}}
    assert len(Toolbox.from_mcp_config(disabled)) == 0


def _children() -> list[str]:
    """The command lines of this process's live children."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            cmdline = (status.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"\nPPid:\t{os.getpid()}\n" in text and "\nState:\tZ" not in text:
            found.append(cmdline)
    return found


def test_a_changed_tool_list_is_listed_again_between_rounds() -> None:
    with Toolbox(timeout=TIMEOUT) as box:
        box.add_mcp(STDIO, name="growing")
        client = Scripted(calls(call("grow", {}, "g")), calls(call("extra", {}, "e")), {"content": "ok"})
        transcript = box.run(client, [{"role": "user", "content": "grow"}], model="m")
        assert [t["function"]["name"] for t in client.requests[0]["tools"]] == TOOLS
        assert [t["function"]["name"] for t in client.requests[1]["tools"]] == [*TOOLS, "extra"]
        assert [m["content"] for m in transcript if m["role"] == "tool"] == [
            '{"result": "grown"}',
            '{"result": "extra"}',
        ]


def test_headers_go_with_every_http_request(http_server: HTTPServer) -> None:
    with Toolbox(timeout=TIMEOUT) as box:
        box.add_mcp(url=http_server.url, headers={"X-Chatcodec-Test": "tea"})
        for _ in range(2):
            assert box.call(call("header", {"name": "X-Chatcodec-Test"}))["content"] == '{"result": "tea"}'


def test_the_async_api_with_async_with(http_server: HTTPServer) -> None:
    class AsyncScripted(Scripted):
        async def create(self, **request: Any) -> dict[str, Any]:  # type: ignore[override]
            return super().create(**request)

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with Toolbox(timeout=TIMEOUT) as box:
            box.add_mcp(url=http_server.url, name="http")
            client = AsyncScripted(calls(call("add", {"a": 1, "b": 2}, "a")), {"content": "3"})
            transcript = await box.arun(client, [{"role": "user", "content": "add"}], model="m")
            direct = await box.acall(call("echo", {"text": "x"}))
            return transcript, [direct]

    transcript, [direct] = asyncio.run(main())
    assert transcript[2] == {"role": "tool", "tool_call_id": "a", "content": '{"sum": 3}'}
    assert transcript[-1]["content"] == "3"
    assert direct["content"] == '{"result": "http: x"}'


def test_a_toolbox_left_open_is_closed_at_exit() -> None:
    program = (
        "import json, sys\n"
        "from chatcodec import Toolbox\n"
        "box = Toolbox(timeout=120)\n"
        f"box.add_mcp({STDIO!r})\n"
        "answer = box.call({'id': 'p', 'function': {'name': 'pid', 'arguments': '{}'}})\n"
        "print(json.loads(answer['content'])['result'])\n"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert done.returncode == 0, done.stderr
    assert gone(int(done.stdout.strip()))
