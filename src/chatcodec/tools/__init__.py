"""Tools for the function-calling loop: Python functions and MCP servers behind one call path.

:func:`tool_schema` turns a Python function into the OpenAI tool dict. A :class:`Toolbox` holds
functions and the tools of MCP servers, runs the calls a model makes and feeds the results back
(:meth:`Toolbox.run`); :class:`LocalClient` answers the loop's requests in this process.

- ``toolbox.py``: the Toolbox, its call path and the loop; Python functions as tools;
- ``mcp.py``: sessions with MCP servers (the ``mcp`` SDK), their listing, calls and configuration files.
"""

from __future__ import annotations

from ..exceptions import ToolServerError
from .mcp import ToolFailure
from .toolbox import LocalClient, Round, Toolbox, ToolResult, tool_schema

__all__ = ["LocalClient", "Round", "ToolFailure", "ToolResult", "ToolServerError", "Toolbox", "tool_schema"]
