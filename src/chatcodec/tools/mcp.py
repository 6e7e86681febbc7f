"""Tools from MCP servers: one session per server, opened once, listed, called, closed.

A :class:`MCPServer` holds the session with one Model Context Protocol server (a child process over
stdio, or a streamable HTTP endpoint) through the official ``mcp`` SDK (the ``tools`` extra). Sessions
live on one event loop in a daemon thread of their own (an :class:`MCPThread`), so that the sync and
the async APIs of :class:`~chatcodec.Toolbox` reach them alike: a call is submitted to that loop and
awaited from the caller's, and a call that times out is cancelled there.

What a server gives back becomes a result or a :class:`ToolFailure`, never a crash of the caller:

- a result's ``structuredContent`` is the value (written as JSON by the toolbox), else its text
  blocks joined by newlines (other blocks are named in brackets: ``[image: image/png]``);
- ``isError`` results, protocol errors and a server that went away are a :class:`ToolFailure`;
- a server whose connection closed is restarted once, before the next call to it; after that its
  calls report that it exited.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import shlex
import subprocess
import sys
import threading
import typing
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..exceptions import ChatcodecError, InputError, ToolServerError

__all__ = ["MCPServer", "MCPThread", "ToolFailure", "ToolServerError", "server_configs"]

T = TypeVar("T")

#: seconds to wait for a server to start and list its tools
OPEN_TIMEOUT = 60.0
#: seconds to wait for a session to close (the SDK closes stdin, waits, then kills the process tree)
CLOSE_TIMEOUT = 15.0
#: how often a server that exited is started again before its calls only report it
RESTARTS = 1


class ToolFailure(Exception):
    """A remote tool call that did not give a value: the tool's own error, or its server's."""


def _sdk() -> Any:
    try:
        import mcp
    except ImportError:
        raise ChatcodecError(
            "Tools from MCP servers need the mcp SDK; install it with: pip install 'chatcodec[tools]'"
        ) from None
    return mcp


class MCPThread:
    """An event loop on a daemon thread, where the sessions of one toolbox live."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="chatcodec-mcp", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the sessions' loop; its Future can be awaited from any other loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run ``coroutine`` there and wait for it from this thread."""
        future = self.submit(coroutine)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        """Stop the loop and wait for its thread (the sessions are closed before)."""
        if self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CLOSE_TIMEOUT)


class MCPServer:
    """One MCP server: how to reach it, its session while open, and the tools it lists.

    Give ``command`` (the program and its arguments, a list or a shell-like string) with optional
    ``env`` (added to a minimal default environment, as the SDK does) and ``cwd``, or ``url`` (a
    streamable HTTP endpoint) with optional ``headers``. ``label`` names the server in results and in
    the prefix of tool names that clash.
    """

    def __init__(
        self,
        label: str,
        *,
        command: str | Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise InputError("An MCP server needs a command (stdio) or a url (streamable HTTP), not both or neither.")
        argv: list[str] = []
        if command is not None:
            argv = shlex.split(command) if isinstance(command, str) else list(command)
            if not argv or not all(isinstance(part, str) and part for part in argv):
                raise InputError(f"The MCP server command must be a program and its arguments, not {command!r}.")
        if url is not None and (not isinstance(url, str) or not re.match(r"^https?://", url)):
            raise InputError(f"The MCP server url must be an http:// or https:// address, not {url!r}.")
        for what, mapping in (("env", env), ("headers", headers)):
            if mapping is not None and (
                not isinstance(mapping, Mapping)
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items())
            ):
                raise InputError(f"The MCP server's {what} must map strings to strings, not {mapping!r}.")
        self.label = label
        self.command = argv
        self.env = dict(env) if env is not None else None
        self.cwd = os.fspath(cwd) if cwd is not None else None
        self.url = url
        self.headers = dict(headers) if headers is not None else None
        #: the tools as listed: name, description, input schema (plain dicts)
        self.tools: list[dict[str, Any]] = []
        #: set when the server said its tool list changed (``notifications/tools/list_changed``)
        self.changed = threading.Event()
        self.restarts = 0
        self._client: Any = None
        self._holder: asyncio.Task[None] | None = None
        self._stopping: asyncio.Event | None = None
        self._exited: str | None = None  # why the connection closed, once it has
        self._restarting: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        where = self.url if self.url is not None else shlex.join(self.command)
        return f"MCPServer({self.label!r}, {where!r})"

    @property
    def where(self) -> str:
        """The command line or the URL, for messages."""
        return self.url if self.url is not None else shlex.join(self.command)

    # --- on the sessions' loop ----------------------------------------------------------------------

    def _transport(self, http: Any) -> Any:
        mcp = _sdk()
        if self.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.url, http_client=http)
        from mcp.client.stdio import stdio_client

        parameters = mcp.StdioServerParameters(
            command=self.command[0], args=self.command[1:], env=self.env, cwd=self.cwd
        )
        return stdio_client(parameters, errlog=_errlog())

    def _http_client(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The HTTP client of a streamable HTTP session (with the headers); closed with the session, as the
        SDK leaves a client it is given open."""
        if self.url is None:
            return contextlib.nullcontext()
        from mcp.shared._httpx_utils import create_mcp_http_client

        return typing.cast("contextlib.AbstractAsyncContextManager[Any]", create_mcp_http_client(headers=self.headers))

    async def _on_message(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self.changed.set()

    async def _hold(self, started: asyncio.Future[None]) -> None:
        """Open the session, list the tools, and keep the session until asked to stop (one task does both,
        as the SDK's context managers want)."""
        mcp = _sdk()
        try:
            async with self._http_client() as http:
                client = mcp.Client(self._transport(http), mode="legacy", message_handler=self._on_message, cache=None)
                async with client:
                    self._client = client
                    self._exited = None
                    self.tools = await self._list(client)
                    started.set_result(None)
                    assert self._stopping is not None
                    await self._stopping.wait()
        except BaseException as exc:  # the opener is told; a closing session's own errors are not wanted
            if not started.done():
                started.set_exception(exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self._client = None

    async def _list(self, client: Any) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang the toolbox
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                tools.append(
                    {"name": tool.name, "description": tool.description or "", "parameters": dict(tool.input_schema)}
                )
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    async def start(self) -> None:
        """Open the session and list the tools (raises :class:`ToolServerError` when it cannot)."""
        self._stopping = asyncio.Event()
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._holder = asyncio.create_task(self._hold(started), name=f"chatcodec-mcp-{self.label}")
        try:
            await asyncio.wait_for(asyncio.shield(started), OPEN_TIMEOUT)
        except asyncio.TimeoutError:
            await self.stop()
            raise ToolServerError(
                f"The MCP server {self.label!r} ({self.where}) did not list its tools within {OPEN_TIMEOUT:g} seconds."
            ) from None
        except Exception as exc:
            await self.stop()
            raise ToolServerError(
                f"The MCP server {self.label!r} ({self.where}) could not be started: {_reason(exc)}"
            ) from None

    async def stop(self) -> None:
        """Close the session (a child process is stopped: stdin closed, then terminated, then killed)."""
        holder, self._holder = self._holder, None
        if holder is None:
            return
        if self._stopping is not None:
            self._stopping.set()
        try:
            await asyncio.wait_for(asyncio.shield(holder), CLOSE_TIMEOUT)
        except BaseException:  # it would not close in time, or closing raised: cancel what is left
            holder.cancel()
            with contextlib.suppress(BaseException):
                await holder

    async def refresh(self) -> bool:
        """List the tools again if the server said they changed; whether they did."""
        if not self.changed.is_set() or self._client is None:
            return False
        self.changed.clear()
        try:
            tools = await self._list(self._client)
        except Exception:  # the next call reports the server's state
            return False
        changed = tools != self.tools
        self.tools = tools
        return changed

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call tool ``name``: its value (structured content, or the text), or a :class:`ToolFailure`."""
        if self._exited is not None or self._client is None:
            await self._restart()
        client = self._client
        mcp = _sdk()
        try:
            result = await client.call_tool(name, arguments)
        except mcp.MCPError as exc:
            if exc.code != -32000:  # CONNECTION_CLOSED: anything else is the server's answer
                raise ToolFailure(f"the MCP server {self.label!r} answered with an error: {_reason(exc)}") from None
            self._exited = _reason(exc)
        except Exception as exc:  # the transport: a refused connection, a broken pipe, a bad message
            self._exited = _reason(exc)
        else:
            return _value(result)
        again = "; it is started again before the next call" if self.restarts < RESTARTS else ""
        raise ToolFailure(f"the MCP server {self.label!r} exited during the call ({self._exited}){again}")

    async def _restart(self) -> None:
        """Start the server again, once; concurrent calls wait for the same restart, and a call that times
        out while it runs does not stop it (shielded)."""
        if self._restarting is None:
            if self.restarts >= RESTARTS:
                raise ToolFailure(
                    f"the MCP server {self.label!r} exited ({self._exited or 'closed'}) and was restarted"
                    f" {self.restarts} time{'s' if self.restarts != 1 else ''} already"
                )
            self.restarts += 1

            async def restart() -> None:
                await self.stop()
                await self.start()

            self._restarting = asyncio.ensure_future(restart())
        restarting = self._restarting
        try:
            await asyncio.shield(restarting)
        except ToolServerError as exc:
            self._exited = "it could not be restarted"
            raise ToolFailure(str(exc).rstrip(".")) from None
        finally:
            if restarting.done() and self._restarting is restarting:
                self._restarting = None


def _errlog() -> Any:
    """Where a child's stderr goes: ours, or the process's own when ours is not a file (captured output,
    a notebook), else nowhere."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None and stream.fileno() >= 0:
                return stream
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
            continue
    return subprocess.DEVNULL


def _reason(exc: BaseException) -> str:
    """One line for an exception, also for a group of them (anyio raises ExceptionGroups)."""
    while isinstance(getattr(exc, "exceptions", None), tuple) and exc.exceptions:  # type: ignore[attr-defined]
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = str(exc).strip().split("\n", 1)[0][:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _value(result: Any) -> Any:
    """A CallToolResult as the toolbox writes it: structured content, or the text blocks joined."""
    parts = []
    for block in result.content or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource: {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        else:
            parts.append(f"[{kind}: {getattr(block, 'mime_type', None) or 'data'}]")
    text = "\n".join(parts)
    if result.is_error:
        raise ToolFailure(text or "the tool reported an error and gave no text")
    if result.structured_content is not None:
        return result.structured_content
    return text


# --------------------------------------------------------------------------------------------------
# Configuration files


def server_configs(config: Any) -> list[MCPServer]:
    """The servers of a ``{"mcpServers": {name: {...}}}`` configuration (Qwen-Agent's and Claude Desktop's).

    ``config`` is the dict or the path of a JSON file that holds it. Each entry has ``command`` (with
    ``args``, ``env``, ``cwd``) for a child process over stdio, or ``url`` (with ``headers``) for
    streamable HTTP. ``type`` may say ``stdio``, ``streamable-http`` (also ``streamableHttp`` or
    ``http``); ``sse`` is refused, as its transport is deprecated. An entry with ``"disabled": true`` is
    skipped; other keys (Qwen-Agent's ``tools``, a ``description``) are ignored.
    """
    import json

    source = "The MCP configuration"
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        source = str(path)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"Cannot read the MCP configuration {path}: {exc.strerror or exc}") from None
        except (ValueError, RecursionError) as exc:
            raise InputError(f"The MCP configuration {path} is not valid JSON: {exc}") from None
    if not isinstance(config, Mapping) or not isinstance(config.get("mcpServers"), Mapping):
        shape = '{"mcpServers": {name: {"command": ...} or {"url": ...}}}'
        raise InputError(f"{source} must be an object of the shape {shape}.")
    servers = []
    for name, entry in config["mcpServers"].items():
        where = f"{source}: mcpServers[{name!r}]"
        if not isinstance(entry, Mapping):
            raise InputError(f"{where} must be an object with a command or a url.")
        if entry.get("disabled") is True:
            continue
        kind = str(entry.get("type") or entry.get("transport") or "").lower().replace("_", "-")
        if kind == "sse":
            raise InputError(f"{where} uses the SSE transport, which is deprecated: give its streamable HTTP url.")
        if kind not in ("", "stdio", "local", "streamable-http", "streamablehttp", "http"):
            raise InputError(f"{where} has type {entry.get('type')!r}: use stdio or streamable-http.")
        command = entry.get("command")
        args = entry.get("args", [])
        if command is not None and (
            not isinstance(command, str) or not isinstance(args, list) or not all(isinstance(a, str) for a in args)
        ):
            raise InputError(f"{where} needs command as a string and args as a list of strings.")
        try:
            servers.append(
                MCPServer(
                    str(name),
                    command=[command, *args] if command is not None else None,
                    env=entry.get("env"),
                    cwd=entry.get("cwd"),
                    url=entry.get("url"),
                    headers=entry.get("headers"),
                )
            )
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
    return servers


def default_label(command: Sequence[str] | None, url: str | None) -> str:
    """A server's label when none is given: the script or program name, or the URL's host."""
    if url is not None:
        host = re.sub(r"^https?://", "", url).split("/", 1)[0].split("@")[-1]
        return host.split(":")[0] or "mcp"
    assert command is not None
    parts = [part for part in command if not part.startswith("-")]
    script = next((part for part in parts[1:] if part.endswith((".py", ".js", ".ts"))), None)
    chosen = script or (parts[-1] if Path(parts[0]).name.startswith(("python", "node", "uvx", "npx")) else parts[0])
    return Path(chosen).stem or "mcp"
