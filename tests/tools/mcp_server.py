"""An MCP server for the tests, written with the mcp SDK's MCPServer (FastMCP in mcp 1.x).

Run as a child over stdio (``python mcp_server.py``) or over streamable HTTP on 127.0.0.1
(``python mcp_server.py --http PORT``). Its tools cover what the toolbox must survive: one that
raises, one that hangs, one that kills its own process mid-call; ``pid`` tells which process answers.
Other arguments (``--local-timezone=...``, as Qwen-Agent's example passes them) name the server.
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

args = sys.argv[1:]
port = int(args[args.index("--http") + 1]) if "--http" in args else None
label = next((arg.split("=", 1)[1] for arg in args if arg.startswith("--name=")), "test")
server = MCPServer(label, log_level="CRITICAL")  # a tool that raises is the test, not its traceback


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return f"{label}: {text}"


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers; the sum as structured content."""
    return {"sum": a + b}


@server.tool()
def fail(reason: str) -> str:
    """Raise an error with the reason."""
    raise ValueError(f"refused: {reason}")


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep for the given seconds."""
    await asyncio.sleep(seconds)
    return "woke up"


@server.tool()
def die() -> str:
    """Exit the server's process in the middle of the call."""
    os._exit(3)


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of a request header (over HTTP; empty over stdio)."""
    return (ctx.headers or {}).get(name.lower(), "")


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool named extra and tell the client that the list changed."""

    def extra() -> str:
        """A tool added while the server runs."""
        return "extra"

    server.add_tool(extra)
    await ctx.session.send_tool_list_changed()
    return "grown"


if __name__ == "__main__":
    if port is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)
