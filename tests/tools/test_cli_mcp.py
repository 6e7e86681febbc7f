"""``chatcodec tools list`` and ``tools run`` with MCP servers (--mcp, --mcp-url, --mcp-config), beside functions.

The MCP server is tests/tools/mcp_server.py (a real child, or streamable HTTP on 127.0.0.1); the model is
the scripted OpenAI-style server of test_cli.py, so the transcript is known exactly.
"""

from __future__ import annotations

import argparse
import json
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatcodec.cli import common
from chatcodec.cli.tools import configure

from ..cli.test_render import run
from .conftest import EXAMPLE
from .test_cli import Server, completion
from .test_mcp import STDIO, TOOLS, HTTPServer

COMMAND = shlex.join(STDIO)


@pytest.fixture
def model() -> Iterator[Server]:
    scripted = Server()
    thread = threading.Thread(target=scripted.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield scripted
    scripted.httpd.shutdown()
    scripted.httpd.server_close()
    thread.join(5)


@pytest.fixture(scope="module")
def http_server() -> Iterator[HTTPServer]:
    server = HTTPServer("--name=web")
    yield server
    server.stop()


def mcp_script(body: dict[str, Any]) -> dict[str, Any]:
    """Round 1 calls a working and a raising MCP tool; round 2 answers."""
    if any(m["role"] == "tool" for m in body["messages"]):
        return completion({"content": "Done."})
    calls = [("echo", {"text": "hi"}), ("fail", {"reason": "x"})]
    return completion(
        {
            "content": None,
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                for i, (n, a) in enumerate(calls)
            ],
        }
    )


def test_list_prints_the_mcp_tools_with_their_schemas() -> None:
    code, stdout, stderr = run(["tools", "list", "--mcp", COMMAND])
    assert code == 0, stderr
    tools = json.loads(stdout)
    assert [tool["function"]["name"] for tool in tools] == TOOLS
    assert tools[1]["function"]["parameters"]["required"] == ["a", "b"]
    assert stderr.splitlines() == [
        "chatcodec: starting the MCP server ...",
        f"chatcodec: {len(TOOLS)} tools from MCP: {', '.join(TOOLS)}",
    ]


def test_list_mixes_functions_and_an_http_server(http_server: HTTPServer) -> None:
    code, stdout, stderr = run(["tools", "list", str(EXAMPLE), "--mcp-url", http_server.url, "--legacy"])
    assert code == 0, stderr
    names = [function["name"] for function in json.loads(stdout)]
    assert names == ["get_current_temperature", "get_temperature_date", *TOOLS]


def test_run_with_mcp_prints_the_transcript(model: Server) -> None:
    model.script = mcp_script
    code, stdout, stderr = run(
        ["tools", "run", "--mcp", f"{COMMAND} --name=cli", "--url", model.url, "-m", "m", "-p", "hi"]
    )
    assert code == 0, stderr
    transcript = json.loads(stdout)
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m["content"] for m in transcript[2:4]] == [
        '{"result": "cli: hi"}',
        "Error: fail failed: Error executing tool fail.",
    ]
    assert stderr.splitlines() == [
        "chatcodec: starting the MCP server ...",
        f"chatcodec: {len(TOOLS)} tools from MCP: {', '.join(TOOLS)}",
        'chatcodec: round 1: echo({"text": "hi"}), fail({"reason": "x"}) -> fail failed: Error executing tool fail',
        "chatcodec: round 2: the model answered",
        "chatcodec: note: each round asked for at most 512 tokens (--max-tokens N to change it)",
    ]
    assert [tool["function"]["name"] for tool in model.requests[0]["tools"]] == TOOLS


def test_run_with_a_config_file_and_a_conversation_file(model: Server, tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"local": {"command": STDIO[0], "args": STDIO[1:]}}}), "utf-8")
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    model.script = mcp_script
    code, stdout, stderr = run(
        ["tools", "run", "--mcp-config", str(config), str(chat), "--url", model.url, "-m", "m", "--show"]
    )
    assert code == 0, stderr
    assert stdout.decode().splitlines() == [
        "[user] hi",
        '[assistant calls] echo({"text": "hi"})',
        '[assistant calls] fail({"reason": "x"})',
        '[tool] {"result": "test: hi"}',
        "[tool] Error: fail failed: Error executing tool fail.",
        "[assistant] Done.",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["tools", "run", "-p", "hi"],
            "Name the tools: FUNCTIONS (FILE.py[:NAME,...]), --mcp, --mcp-url or --mcp-config",
        ),
        (["tools", "list"], "Name the tools: FUNCTIONS"),
        (
            ["tools", "list", "--mcp", "/no/such/server"],
            "The MCP server 'server' (/no/such/server) could not be started",
        ),
        (["tools", "list", "--mcp", "'unclosed"], "No closing quotation"),
        (["tools", "list", "--mcp-url", "ftp://x"], "must be an http:// or https:// address"),
        (
            ["tools", "list", "--mcp-url", "http://127.0.0.1:9/mcp"],
            "The MCP server '127.0.0.1' (http://127.0.0.1:9/mcp)",
        ),
        (["tools", "list", "--mcp-config", "/no/such.json"], "Cannot read the MCP configuration /no/such.json"),
        (["tools", "list", "--mcp", COMMAND, "--mcp-header", "x"], "--mcp-header takes NAME:VALUE, not 'x'"),
        (["tools", "list", "--mcp", COMMAND, "--mcp-header", "A: b"], "--mcp-header is sent to --mcp-url servers"),
    ],
)
def test_mistakes_are_one_line(argv: list[str], message: str) -> None:
    code, stdout, stderr = run(argv)
    assert (code, stdout) == (2, b""), stderr
    last = stderr.splitlines()[-1]
    assert last.startswith("chatcodec: error: ") and message in last
    assert all(line.startswith("chatcodec: ") for line in stderr.splitlines())


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = common.ArgumentParser(prog="chatcodec tools")
    configure(parser)
    [actions] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions.choices)


@pytest.mark.parametrize("action", ["run", "list", "schema"])
def test_help_documents_every_flag(action: str) -> None:
    code, stdout, _ = run(["tools", action, "--help"])
    assert code == 0
    text = " ".join(stdout.decode().split())
    parser = subparsers()[action]
    for argument in parser._actions:
        assert argument.help and argument.help != argparse.SUPPRESS, argument
        for flag in argument.option_strings:
            assert flag in text, flag
    if action != "schema":
        for flag in ("--mcp", "--mcp-url", "--mcp-header", "--mcp-config"):
            assert flag in text
