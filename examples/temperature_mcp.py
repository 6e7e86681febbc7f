"""The temperature example with its two tools on an MCP server instead of Python functions.

This file is both sides. `serve` runs the MCP server (the mcp SDK's MCPServer, over stdio, or over
streamable HTTP with --http PORT) with examples/temperature.py's functions as its tools; without
`serve` it runs the loop, with that server as a child process, configured the way Qwen-Agent is:

    python examples/temperature_mcp.py --local         # no server: the embedded model in this process
    chatcodec serve &
    python examples/temperature_mcp.py                 # against chatcodec serve
    python examples/temperature_mcp.py serve --http 8765   # the MCP server alone, on 127.0.0.1:8765/mcp

The same loop from the command line:
`chatcodec tools run --mcp "python examples/temperature_mcp.py serve" -p "How warm is it in Paris?"`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # examples/temperature.py, beside this file

import temperature  # noqa: E402

#: Qwen-Agent's {"mcpServers": ...} shape, with this file's server as the one entry
CONFIG = {"mcpServers": {"temperature": {"command": sys.executable, "args": [str(Path(__file__).resolve()), "serve"]}}}


def serve(argv: list[str]) -> None:
    """Run the MCP server with the temperature functions as its tools."""
    from mcp.server.mcpserver import MCPServer

    from chatcodec import tool_schema

    parser = argparse.ArgumentParser(prog="temperature_mcp.py serve")
    parser.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP on 127.0.0.1:PORT/mcp, not stdio")
    args = parser.parse_args(argv)
    server = MCPServer("temperature", log_level="WARNING")
    for function in temperature.TOOLS:  # the description transformers would give, not the whole docstring
        server.add_tool(function, description=tool_schema(function)["function"]["description"])
    if args.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


def main() -> None:
    from chatcodec import Toolbox

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's OpenAI-compatible base URL")
    parser.add_argument("--model", help="the model name to send (default: the server's first)")
    parser.add_argument("--local", action="store_true", help="no server: run the embedded model in this process")
    args = parser.parse_args()

    if args.local:
        from chatcodec.tools import LocalClient

        client = LocalClient()
    else:
        import openai

        client = openai.OpenAI(base_url=args.url, api_key="none")
    model = args.model or ("local" if args.local else client.models.list().data[0].id)
    with Toolbox.from_mcp_config(CONFIG) as toolbox:
        transcript = toolbox.run(
            client,
            [{"role": "user", "content": temperature.QUESTION}],
            model=model,
            tool_choice=temperature.tool_choice("tools"),
            temperature=0,
            on_round=lambda r: print(f"round {r.index + 1}: {[(x.name, x.arguments) for x in r.results]}"),
        )
    print(json.dumps(transcript, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2:])
    else:
        main()
