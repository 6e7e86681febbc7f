"""The Toolbox: Python functions as tools, their schemas, their safe execution, and the function-calling loop.

:func:`tool_schema` turns a function into the OpenAI tool dict, with transformers' ``get_json_schema``
semantics (Google docstring, type hints; pydantic models as parameter types become their JSON schema).
A :class:`Toolbox` holds functions, runs the calls a model makes and feeds the results back:

>>> import chatcodec
>>> toolbox = chatcodec.Toolbox()
>>> @toolbox.tool
... def get_current_temperature(location: str, unit: str = "celsius") -> float:
...     '''Get current temperature at a location.
...
...     Args:
...         location: The location, as "City, State, Country".
...         unit: The unit of the temperature. (choices: ["celsius", "fahrenheit"])
...     '''
...     return 26.1 if unit == "celsius" else 79.0
>>> toolbox.tools[0]["function"]["parameters"]["properties"]["unit"]["enum"]
['celsius', 'fahrenheit']
>>> toolbox.call({"id": "call_1", "type": "function",
...               "function": {"name": "get_current_temperature", "arguments": '{"location": "Paris, France"}'}})
{'role': 'tool', 'tool_call_id': 'call_1', 'content': '26.1'}

A call that cannot run comes back as an error result for the model to read, never as an exception:

>>> toolbox.call({"id": "call_2", "function": {"name": "get_current_temperature", "arguments": {"unit": "kelvin"}}})
{'role': 'tool', 'tool_call_id': 'call_2', 'content': "Error: invalid arguments for get_current_temperature: \
'location' is a required property."}

:meth:`Toolbox.run` is the loop: ask the model, run its calls, append the results, until it answers.
Calls of one round run concurrently, each tool on a thread of its own; a coroutine function runs on
an event loop of that thread, so that one which blocks (``time.sleep`` in an ``async def``) still times
out and stalls no other call (objects bound to another event loop cannot be shared with it). A call that
overruns ``timeout`` is reported to the model as timed out: a coroutine is cancelled, the thread of a
synchronous function cannot be stopped and finishes in the background.

The call path is total: whatever a model writes or a tool does becomes a result. A call that is a string,
has no name or gives ``function`` as a string; arguments or results nested too deeply; a schema that
cannot be applied (an unresolvable ``$ref``); a tool that raises ``SystemExit``, ``CancelledError`` or
any other exception: each is an ``Error: ...`` result. A ``KeyboardInterrupt`` raised in a tool is
raised again, so that Ctrl-C still stops the program. NaN and the infinities in a result are written
as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, so the content is always valid JSON.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import datetime
import enum
import inspect
import json
import math
import os
import re
import shlex
import threading
import time
import typing
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from ..exceptions import BackendError, ChatcodecError, ConversationError, InputError, LoadError, SchemaError
from ..schema import JsonSchema, function_schema, parse_google_docstring, type_hint_schema
from .mcp import ToolFailure

if typing.TYPE_CHECKING:
    from ..backends.base import Chunk, Constraint
    from ..conversation import Conversation
    from .mcp import MCPServer, MCPThread

__all__ = ["LocalClient", "Round", "ToolResult", "Toolbox", "tool_schema"]

Message = dict[str, Any]
Style = Literal["tools", "functions"]
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: The names the OpenAI API accepts for functions.
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TOOL_CHOICES = ("auto", "none", "required")
_SUPPORTED_HINTS = (
    "int, float, str, bool, None, Any, an Enum, a Literal, a pydantic model, or list, tuple, dict and unions of them"
)


# --------------------------------------------------------------------------------------------------
# Schemas


def tool_schema(func: Callable[..., Any]) -> JsonSchema:
    """The OpenAI tool dict for ``func``, as transformers' ``get_json_schema(func)`` builds it.

    The docstring is Google style: a description, then an ``Args:`` block with one entry per
    parameter (a trailing ``(choices: [...])`` becomes the parameter's ``enum``), then optionally
    ``Returns:``. Every parameter needs a type hint. Where transformers succeeds the result is the same
    dict, key order included; a pydantic model as a parameter type (which transformers rejects)
    becomes the model's JSON schema, its ``$ref``\\ s inlined.

    An incomplete function raises :class:`~chatcodec.SchemaError` naming everything that is missing:

    >>> def search(query: str, limit):
    ...     '''Search the web.'''
    >>> tool_schema(search)
    Traceback (most recent call last):
        ...
    chatcodec.SchemaError: Cannot make a tool schema for search: parameter 'limit' has no type hint; \
the docstring has no Args: block to describe 'query', 'limit' (Google style: 'Args:', then 'name: description' \
on an indented line per parameter).
    """
    try:
        return function_schema(func, fallback=_model_schema)
    except (SchemaError, NameError) as exc:  # NameError: a string annotation that does not resolve
        problems = _schema_problems(func)
        if not problems:
            raise
        name = getattr(func, "__name__", "operation")
        raise SchemaError(f"Cannot make a tool schema for {name}: {'; '.join(problems)}.") from exc


def _is_model(cls: object) -> bool:
    """A pydantic (v2) model class, recognised without importing pydantic."""
    return (
        isinstance(cls, type) and callable(getattr(cls, "model_json_schema", None)) and hasattr(cls, "model_validate")
    )


def _model_schema(cls: type) -> JsonSchema | None:
    """The JSON schema of a pydantic model class with its ``$defs`` inlined; ``None`` for other classes."""
    if not _is_model(cls):
        return None
    schema = dict(typing.cast("Callable[[], JsonSchema]", cls.model_json_schema)())  # type: ignore[attr-defined]
    definitions = schema.pop("$defs", {})

    def inline(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [inline(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = ref[len("#/$defs/") :]
            if target in seen or target not in definitions:
                raise SchemaError(
                    f"The pydantic model {cls.__name__} refers to {target} recursively, which cannot be inlined"
                    " into a tool schema; write the tool's JSON schema by hand and pass it with schema=."
                )
            resolved = inline(definitions[target], (*seen, target))
            return {**resolved, **{k: inline(v, seen) for k, v in node.items() if k != "$ref"}}
        return {key: inline(value, seen) for key, value in node.items()}

    return typing.cast("JsonSchema", inline(schema, (cls.__name__,)))


def _schema_problems(func: Callable[..., Any]) -> list[str]:
    """Everything that keeps ``func`` from having a tool schema, one short sentence each."""
    problems: list[str] = []
    try:
        params = list(inspect.signature(func).parameters.values())
        hints = typing.get_type_hints(func)
    except (TypeError, ValueError, NameError) as exc:
        return [f"its type hints cannot be resolved ({exc}; a name in a string annotation must be importable)"]
    if params and params[0].name in ("self", "cls") and params[0].annotation is inspect.Parameter.empty:
        params = params[1:]
    names = [param.name for param in params]
    unhinted = [repr(name) for name in names if name not in hints]
    if unhinted:
        problems.append(
            f"parameter {unhinted[0]} has no type hint"
            if len(unhinted) == 1
            else f"parameters {', '.join(unhinted)} have no type hints"
        )
    for name in names:
        if name in hints:
            problem = _hint_problem(name, hints[name])
            if problem:
                problems.append(problem)

    doc = inspect.getdoc(func)
    described = names
    if not doc:
        problems.append(
            "it has no docstring (Google style: a description, then 'Args:' and 'name: description' per parameter)"
        )
        return problems
    _, arg_docs, _ = parse_google_docstring(doc.strip())
    missing = ", ".join(repr(name) for name in described if name not in arg_docs)
    if missing and not arg_docs:
        problems.append(
            f"the docstring has no Args: block to describe {missing} (Google style: 'Args:', then"
            " 'name: description' on an indented line per parameter)"
        )
    elif missing:
        problems.append(f"the docstring's Args: block has no description for {missing}")
    return problems


def _hint_problem(name: str, hint: object) -> str | None:
    """Why the type hint of parameter ``name`` has no JSON schema, or ``None`` if it has one."""
    try:
        type_hint_schema(hint, fallback=_model_schema)
    except SchemaError as exc:
        reason = re.sub(r"\s*\n\s*", " ", str(exc))  # one line, also for the Enum message's three
        if not reason.startswith(("Couldn't", "(\"Couldn't")):  # a specific reason: tuple, Enum, Literal, model
            return f"the type hint of '{name}' cannot be converted ({reason})"
        return (
            f"the type hint of '{name}' holds {_hint_name(_innermost_failure(hint))}, which a tool schema cannot"
            f" describe (use {_SUPPORTED_HINTS})"
        )
    return None


def _innermost_failure(hint: Any) -> Any:
    """The smallest part of a hint that cannot be converted (``set`` in ``list[set[int]] | None``)."""
    if typing.get_origin(hint) is not typing.Literal:
        for arg in typing.get_args(hint):
            if arg is ... or arg is type(None):
                continue
            try:
                type_hint_schema(arg, fallback=_model_schema)
            except SchemaError:
                return _innermost_failure(arg)
    return hint


def _hint_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__qualname__ if hint.__module__ == "builtins" else f"{hint.__module__}.{hint.__qualname__}"
    return str(hint).replace("typing.", "")


# --------------------------------------------------------------------------------------------------
# Results and rounds


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """One executed call: what the model asked for, the message that answers it, and what went wrong.

    ``arguments`` are the parsed arguments (or the text the model sent, when it is not JSON).
    ``error`` is ``None`` when the function ran and its result was written; otherwise it is the reason
    the model was told, and ``exception`` is the exception the function raised, if it did.
    """

    name: str
    arguments: Any
    message: Message
    error: str | None = None
    exception: BaseException | None = None
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Round:
    """One round of :meth:`Toolbox.run`: the model's message and the results of the calls it made.

    ``index`` counts from 0. ``messages`` are what the round appended to the transcript (the
    assistant message, or several in the legacy style, then the results). ``final`` is true for the
    last round.
    """

    index: int
    assistant: Message
    results: tuple[ToolResult, ...]
    messages: tuple[Message, ...]
    final: bool


# --------------------------------------------------------------------------------------------------
# The toolbox


@dataclasses.dataclass(frozen=True)
class _Tool:
    name: str
    function: Callable[..., Any]
    schema: JsonSchema  # the OpenAI tool dict
    validator: Any  # a jsonschema validator for the arguments
    hints: dict[str, Any]
    signature: inspect.Signature | None
    is_async: bool
    #: the MCP server that runs this tool (``function`` then returns a concurrent Future); None for Python
    server: Any = None
    #: the tool as that server lists it (``name``, ``description``, ``parameters``)
    listed: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class _Call:
    """A tool call in any of the shapes models and clients give it, read once."""

    id: str | None
    name: str
    arguments: Any  # a dict when the arguments parsed, else what arrived
    problem: str | None  # why the arguments cannot be used, if they cannot
    text: str = ""  # the arguments as the JSON text the transcript keeps
    unreadable: str | None = None  # why the call itself cannot be read (no name, not a call at all)


class Toolbox:
    """Tools a model can call, with their schemas; runs calls and the calling loop.

    The tools are Python functions (:meth:`add`) and the tools of MCP servers (:meth:`add_mcp`,
    :meth:`from_mcp_config`), behind one call path: validation against the schema, the timeout,
    concurrency within a round, and every failure as an ``Error: ...`` result.
    ``functions`` are added as with :meth:`add`. ``timeout`` bounds each call in seconds (``None``
    for no bound). Arguments are validated against the schema with jsonschema (the ``tools`` extra).
    A toolbox with MCP servers holds their sessions until :meth:`close` (or the end of a ``with`` or
    ``async with`` block).
    """

    def __init__(self, functions: Iterable[Callable[..., Any]] = (), *, timeout: float | None = 30.0) -> None:
        if timeout is not None and not timeout > 0:
            raise InputError(f"timeout must be a positive number of seconds or None, not {timeout!r}.")
        self.timeout = timeout
        self._tools: dict[str, _Tool] = {}  # every tool under the name the model sees
        self._functions: dict[str, _Tool] = {}  # the Python functions
        self._servers: list[MCPServer] = []
        self._thread: MCPThread | None = None
        for function in functions:
            self.add(function)

    def __repr__(self) -> str:
        return f"Toolbox([{', '.join(self._tools)}])"

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    # --- building ---------------------------------------------------------------------------------

    def add(
        self, function: Callable[..., Any], *, name: str | None = None, schema: Mapping[str, Any] | None = None
    ) -> None:
        """Add ``function`` as a tool.

        Its schema comes from :func:`tool_schema`, unless ``schema`` gives one: an OpenAI tool dict or
        just its ``function`` part (``name``, ``description``, ``parameters``). ``name`` renames the tool.
        """
        if not callable(function):
            raise InputError(f"A tool must be a function, not {type(function).__name__}.")
        tool = _tool_dict(function, schema)
        entry = tool["function"]
        if name is not None:
            entry["name"] = name
        tool_name = entry["name"]
        if not isinstance(tool_name, str) or not _NAME_RE.match(tool_name):
            raise SchemaError(
                f"The tool name {tool_name!r} is not one the OpenAI API accepts: use 1 to 64 letters, digits,"
                " '_' or '-' (pass name= to rename it)."
            )
        if tool_name in self._functions:
            raise SchemaError(f"This toolbox already has a tool named {tool_name!r}.")
        try:
            hints = typing.get_type_hints(function)
        except Exception:  # hints only convert arguments: a function whose hints do not resolve still runs
            hints = {}
        try:
            signature: inspect.Signature | None = inspect.signature(function)
        except (TypeError, ValueError):
            signature = None
        self._functions[tool_name] = _Tool(
            name=tool_name,
            function=function,
            schema=tool,
            validator=_validator(tool_name, entry.get("parameters", {"type": "object", "properties": {}})),
            hints=hints,
            signature=signature,
            is_async=_is_coroutine_function(function),
        )
        self._rebuild()

    def add_mcp(
        self,
        command: str | Sequence[str] | None = None,
        *,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
    ) -> list[str]:
        """Start an MCP server, list its tools and add them; the names the model sees them under.

        ``command`` (a list, or a string split as a shell would) runs the server as a child process
        over stdio, with ``env`` added to the SDK's minimal default environment and ``cwd``; ``url``
        reaches a streamable HTTP server instead, with ``headers`` on every request. ``name`` labels
        the server (by default the script's or program's name, or the URL's host).

        A tool keeps its own name unless another tool of this toolbox has it: then each MCP tool of
        that name is called ``LABEL-NAME`` (Python functions keep theirs). Characters the OpenAI API
        does not accept in a name become ``_``. Raises :class:`~chatcodec.tools.ToolServerError` when
        the server cannot be started or listed.
        """
        from .mcp import MCPServer, default_label

        try:
            argv = shlex.split(command) if isinstance(command, str) else command
        except ValueError as exc:  # an unclosed quote
            raise InputError(f"The MCP server command {command!r} cannot be split into arguments: {exc}.") from None
        server = MCPServer(name or default_label(argv, url), command=argv, env=env, cwd=cwd, url=url, headers=headers)
        before = set(self._tools)
        self._open([server])
        return [
            tool_name for tool_name, tool in self._tools.items() if tool.server is server or tool_name not in before
        ]

    @classmethod
    def from_mcp_config(
        cls,
        config: Mapping[str, Any] | str | os.PathLike[str],
        functions: Iterable[Callable[..., Any]] = (),
        *,
        timeout: float | None = 30.0,
    ) -> Toolbox:
        """A toolbox with the servers of an ``{"mcpServers": {label: {...}}}`` configuration.

        It is Qwen-Agent's and Claude Desktop's shape, as a dict or a JSON file: each entry has
        ``command``, ``args``, ``env`` and ``cwd``, or ``url`` and ``headers`` (``"type":
        "streamable-http"``). The servers start together; if one fails, none is left running.
        ``functions`` are added too.
        """
        from .mcp import server_configs

        toolbox = cls(functions, timeout=timeout)
        toolbox._open(server_configs(config))
        return toolbox

    def _open(self, servers: Sequence[MCPServer]) -> None:
        """Start ``servers`` together and add their tools; on any failure, stop them all and raise."""
        from .mcp import MCPThread

        labels = [server.label for server in self._servers]
        for server in servers:
            if server.label in labels:
                raise InputError(f"This toolbox already has an MCP server labelled {server.label!r}: pass name=.")
            labels.append(server.label)
        if not servers:
            return
        if self._thread is None:
            self._thread = MCPThread()
            _OPEN.add(self)

        async def start_all() -> list[BaseException]:
            outcomes = await asyncio.gather(*(server.start() for server in servers), return_exceptions=True)
            failed = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
            if failed:
                await asyncio.gather(*(server.stop() for server in servers), return_exceptions=True)
            return failed

        failed = self._thread.run(start_all(), None)
        if failed:
            if not self._servers:
                self.close()
            raise failed[0]
        self._servers.extend(servers)
        self._rebuild()

    def _rebuild(self) -> None:
        """Name every tool: Python functions as they are, MCP tools by their names unless they clash."""
        tools = dict(self._functions)
        entries = [(server, listed) for server in self._servers for listed in server.tools]
        plain = [_openai_name(listed["name"]) for _, listed in entries]
        counts = collections.Counter(plain)
        for (server, listed), name in zip(entries, plain, strict=True):
            if counts[name] > 1 or name in self._functions:
                name = _openai_name(f"{server.label}-{listed['name']}")
            unique, number = name, 2
            while unique in tools:
                suffix = f"_{number}"
                unique, number = name[: 64 - len(suffix)] + suffix, number + 1
            tools[unique] = _mcp_tool(unique, server, listed, self._submit)
        self._tools = tools

    def _submit(self, server: MCPServer, name: str, arguments: dict[str, Any]) -> concurrent.futures.Future[Any]:
        if self._thread is None:
            raise ToolFailure("the toolbox is closed")
        return self._thread.submit(server.call(name, arguments))

    def _refresh(self) -> None:
        """List again the tools of the servers that said their list changed (between rounds)."""
        if self._thread is None or not any(server.changed.is_set() for server in self._servers):
            return

        async def refresh_all() -> list[bool]:
            return list(await asyncio.gather(*(server.refresh() for server in self._servers)))

        if any(self._thread.run(refresh_all(), None)):
            self._rebuild()

    def close(self) -> None:
        """Close the MCP sessions (their child processes exit) and remove their tools. Idempotent."""
        _OPEN.discard(self)
        thread, self._thread = self._thread, None
        servers, self._servers = self._servers, []
        if thread is not None:

            async def stop_all() -> None:
                await asyncio.gather(*(server.stop() for server in servers), return_exceptions=True)

            with contextlib.suppress(Exception):
                thread.run(stop_all(), None)
            thread.stop()
        self._rebuild()

    async def aclose(self) -> None:
        """:meth:`close` for async code (the sessions close on their own thread)."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Toolbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @overload
    def tool(self, function: F, /) -> F: ...
    @overload
    def tool(self, *, name: str | None = None, schema: Mapping[str, Any] | None = None) -> Callable[[F], F]: ...

    def tool(
        self, function: F | None = None, *, name: str | None = None, schema: Mapping[str, Any] | None = None
    ) -> F | Callable[[F], F]:
        """A decorator that adds a function to this toolbox and returns it unchanged.

        Use it bare (``@toolbox.tool``) or with :meth:`add`'s options (``@toolbox.tool(name="lookup")``).
        """
        if function is not None:
            self.add(function)
            return function

        def decorate(function: F) -> F:
            self.add(function, name=name, schema=schema)
            return function

        return decorate

    # --- schemas ----------------------------------------------------------------------------------

    @property
    def tools(self) -> list[JsonSchema]:
        """The OpenAI ``tools`` list: ``[{"type": "function", "function": {...}}, ...]``."""
        return [json.loads(json.dumps(tool.schema)) for tool in self._tools.values()]

    @property
    def functions(self) -> list[JsonSchema]:
        """The legacy ``functions`` list (Qwen-Agent's form): ``[{"name", "description", "parameters"}, ...]``."""
        return [tool["function"] for tool in self.tools]

    @property
    def mcp_servers(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The MCP servers' tools by server label: the name the model sees each under, to the tool as its server
        lists it (``name``, ``description``, ``parameters``)."""
        servers: dict[str, dict[str, dict[str, Any]]] = {server.label: {} for server in self._servers}
        for name, tool in self._tools.items():
            if tool.server is not None and tool.listed is not None:
                servers[tool.server.label][name] = json.loads(json.dumps(tool.listed))
        return servers

    # --- calling ----------------------------------------------------------------------------------

    def call(self, tool_call: Any, *, style: Style | None = None) -> Message:
        """Run one tool call and return the result message for the model.

        ``tool_call`` is an OpenAI ``tool_calls`` entry (a dict or an SDK object), a legacy
        ``function_call`` (``{"name", "arguments"}``) or a decoded :class:`~chatcodec.ToolCall`;
        arguments may be a JSON string or a dict. The result is ``{"role": "tool", "tool_call_id",
        "content"}``, or ``{"role": "function", "name", "content"}`` in the legacy ``"functions"`` style,
        which is the default for a legacy ``function_call``. Results that are not strings are written as
        JSON. Anything that goes wrong is reported in the content, starting with ``Error:``.
        """
        return self.call_many([tool_call], style=style)[0].message

    async def acall(self, tool_call: Any, *, style: Style | None = None) -> Message:
        """:meth:`call` for async code."""
        return (await self.acall_many([tool_call], style=style))[0].message

    def call_many(self, tool_calls: Sequence[Any], *, style: Style | None = None) -> list[ToolResult]:
        """Run several tool calls concurrently; the results come back in the order of the calls."""
        return _run_sync(self.acall_many(tool_calls, style=style))

    async def acall_many(self, tool_calls: Sequence[Any], *, style: Style | None = None) -> list[ToolResult]:
        """:meth:`call_many` for async code."""
        if isinstance(tool_calls, (str, bytes, Mapping)):
            raise InputError(f"tool_calls must be a list of tool calls, not {type(tool_calls).__name__}.")
        calls = [(_read_call(raw, index), style or _style_of(raw)) for index, raw in enumerate(tool_calls)]
        return await self._execute_all(calls)

    async def _execute_all(self, calls: Sequence[tuple[_Call, Style]]) -> list[ToolResult]:
        return list(await asyncio.gather(*(self._execute(call, how) for call, how in calls)))

    async def _execute(self, call: _Call, style: Style) -> ToolResult:
        """Run one call; whatever the call or the tool holds, the outcome is a result (see :meth:`call`)."""
        started = time.perf_counter()
        exception: BaseException | None = None
        tool = self._tools.get(call.name) if call.unreadable is None else None
        kwargs: dict[str, Any] = {}
        if call.unreadable is not None:
            error: str | None = call.unreadable
        elif tool is None:
            known = ", ".join(self._tools) or "none"
            error = f"unknown function {call.name!r}; the functions are: {known}"
        else:
            error, kwargs = self._arguments(tool, call)
        content = ""
        if error is None and tool is not None:
            try:
                value = await self._invoke(tool, kwargs)
            except asyncio.TimeoutError:
                error = f"{tool.name} did not finish within {self.timeout:g} seconds"
            except ToolFailure as exc:  # an MCP tool's own error, or its server's
                error = f"{tool.name} failed: {exc}"
            except _Escaped as escaped:  # SystemExit, CancelledError, ... raised by the tool itself
                if isinstance(escaped.exception, KeyboardInterrupt):
                    raise escaped.exception from None
                exception = escaped.exception
                error = f"{tool.name} raised {type(exception).__name__}: {exception}"
            except Exception as exc:  # the model is told; the caller finds it in the result
                exception = exc
                error = f"{tool.name} raised {type(exc).__name__}: {exc}"
            else:
                try:
                    content = _result_text(value)
                except (TypeError, ValueError) as exc:
                    exception = exc
                    error = f"{tool.name} returned a {type(value).__name__}, which cannot be written as JSON ({exc})"
                except RecursionError as exc:
                    exception = exc
                    error = f"{tool.name} returned a {type(value).__name__} nested too deeply to write as JSON"
        if error is not None:
            content = f"Error: {error}."
        return ToolResult(
            name=call.name,
            arguments=call.arguments,
            message=_result_message(call, content, style),
            error=error,
            exception=exception,
            seconds=time.perf_counter() - started,
        )

    def _arguments(self, tool: _Tool, call: _Call) -> tuple[str | None, dict[str, Any]]:
        """The keyword arguments for the function, or why the call's arguments are not acceptable."""
        prefix = f"invalid arguments for {tool.name}: "
        if call.problem is not None:
            return prefix + call.problem, {}
        arguments: dict[str, Any] = call.arguments
        try:
            errors = sorted(tool.validator.iter_errors(arguments), key=lambda e: (list(e.absolute_path), e.message))
        except RecursionError:
            return prefix + "they are nested too deeply to check", {}
        except Exception as exc:  # a schema that cannot be applied: an unresolvable $ref, say
            reason = _first_line(str(getattr(exc, "message", None) or exc))[:300]
            return f"the parameters schema of {tool.name} cannot be used ({type(exc).__name__}: {reason})", {}
        if errors:
            best = errors[0]
            where = "".join(f"[{part!r}]" for part in best.absolute_path)
            return prefix + (f"at {where}: " if where else "") + best.message, {}
        if tool.server is not None:  # an MCP tool takes the arguments as they are
            return None, arguments
        if tool.signature is not None:
            try:
                tool.signature.bind(**arguments)
            except TypeError as exc:
                return prefix + str(exc), {}
        try:
            return None, {key: _convert(value, tool.hints.get(key, Any)) for key, value in arguments.items()}
        except (TypeError, ValueError) as exc:  # an Enum or pydantic model refused the value
            return prefix + _first_line(str(exc)), {}
        except RecursionError:
            return prefix + "they are nested too deeply to convert", {}

    async def _invoke(self, tool: _Tool, kwargs: dict[str, Any]) -> Any:
        async def invoke() -> Any:
            if tool.server is not None:
                return await _remote(tool.function(**kwargs))
            return await _in_thread(tool.function, kwargs)

        return await asyncio.wait_for(invoke(), self.timeout)

    # --- the loop ---------------------------------------------------------------------------------

    def run(
        self,
        client: Any,
        messages: Sequence[Any],
        *,
        model: str,
        max_rounds: int = 8,
        style: Style = "tools",
        tool_choice: Any = None,
        reset_tool_choice: bool = True,
        on_round: Callable[[Round], Any] | None = None,
        **params: Any,
    ) -> list[Message]:
        """Ask the model, run the calls it makes, append the results; repeat until it answers.

        ``client`` is an OpenAI-compatible client: anything with ``chat.completions.create(**request)``,
        such as ``openai.OpenAI`` or ``openai.AsyncOpenAI`` (an async client is driven on an event loop
        of its own). ``messages`` start the conversation; the whole transcript is returned, ending with
        the model's answer.

        - ``style="tools"`` sends ``tools=[...]`` and answers with role ``"tool"`` messages;
          ``style="functions"`` is Qwen-Agent's form: ``functions=[...]``, one ``function_call`` per
          assistant message and role ``"function"`` results.
        - ``tool_choice`` (``"auto"``, ``"none"``, ``"required"``, a tool's name or
          ``{"type": "function", "function": {"name": ...}}``) is sent in the first round. A forcing
          choice (``"required"`` or a name) then returns to ``"auto"`` so that the loop can end, unless
          ``reset_tool_choice=False``. ``tool_choice`` may also be a function of the round's index and
          the transcript so far that returns each round's choice (``None`` sends none).
        - At most ``max_rounds`` requests are made; the last one is sent with tool choice ``"none"``
          (unless it is also a first round with a forcing choice), so that the model answers. Calls it
          makes anyway are run, and the transcript then ends with their results.
        - ``on_round`` is called with a :class:`Round` after each round.
        - Other keyword arguments (``temperature``, ``max_tokens``, ``parallel_tool_calls``, ...) go
          into every request.
        """
        if _is_coroutine_function(_create_method(client)):
            return _run_sync(
                self.arun(
                    client,
                    messages,
                    model=model,
                    max_rounds=max_rounds,
                    style=style,
                    tool_choice=tool_choice,
                    reset_tool_choice=reset_tool_choice,
                    on_round=on_round,
                    **params,
                )
            )
        loop = _Loop(self, messages, model, max_rounds, style, tool_choice, reset_tool_choice, params)
        create = _create_method(client)
        while (request := loop.next_request()) is not None:
            reply = create(**request)
            if inspect.isawaitable(reply):  # an async client that did not look like one
                reply = _run_sync(_awaited(reply))
            calls = [(call, style) for call in loop.take_reply(reply)]
            results = _run_sync(self._execute_all(calls))
            self._refresh()
            finished = loop.add_results(results)
            if on_round is not None:
                on_round(finished)
        return loop.transcript

    async def arun(
        self,
        client: Any,
        messages: Sequence[Any],
        *,
        model: str,
        max_rounds: int = 8,
        style: Style = "tools",
        tool_choice: Any = None,
        reset_tool_choice: bool = True,
        on_round: Callable[[Round], Any] | None = None,
        **params: Any,
    ) -> list[Message]:
        """:meth:`run` for async code. A sync client's requests run on a worker thread; ``on_round`` may
        be a coroutine function."""
        loop = _Loop(self, messages, model, max_rounds, style, tool_choice, reset_tool_choice, params)
        create = _create_method(client)
        is_async = _is_coroutine_function(create)
        while (request := loop.next_request()) is not None:
            reply = create(**request) if is_async else await asyncio.to_thread(create, **request)
            if inspect.isawaitable(reply):
                reply = await reply
            results = await self._execute_all([(call, style) for call in loop.take_reply(reply)])
            if self._servers:
                await asyncio.to_thread(self._refresh)
            finished = loop.add_results(results)
            if on_round is not None:
                outcome = on_round(finished)
                if inspect.isawaitable(outcome):
                    await outcome
        return loop.transcript


class LocalClient:
    """An OpenAI-shaped client that answers in this process: no server, no HTTP.

    ``client.chat.completions.create(**request)`` runs the chat server's own pipeline on ``backend``
    (a :class:`chatcodec.backends.Backend`; by default the embedded SmolLM2 model): encode the chat to
    token ids with the model's chat template (polyfilled where it lacks tools), constrain generation for a
    forcing ``tool_choice``, generate, decode the calls in the template's own format, and answer with a
    ``chat.completion`` dict. So :meth:`Toolbox.run` runs the whole loop locally::

        transcript = toolbox.run(LocalClient(), messages, model="local", tool_choice="required")

    The prompt goes to the model as ids from a :class:`~chatcodec.Codec` over the backend's own
    ``tokenizer`` (the embedded model has llama.cpp's), so text from a message or a tool result never
    becomes a control token. ``template`` (a :class:`~chatcodec.ChatTemplate`, or a
    :class:`~chatcodec.Codec` to encode with) replaces the backend's own. A backend without a tokenizer,
    given no Codec, gets the rendered text. Needs the ``serve`` extra (llama-cpp-python for the embedded
    model).
    """

    def __init__(
        self,
        backend: Any = None,
        *,
        template: Any = None,
        model: str | None = None,
        polyfill: str | bool = "auto",
        tool_parser: str | None = None,
    ) -> None:
        from ..tokens import Codec

        try:
            from ..server.chat import ChatService

            if backend is None:
                from ..backends import LlamaBackend

                backend = LlamaBackend()
        except ModuleNotFoundError as exc:  # the serve extra is not installed (or only part of it)
            raise LoadError(
                f"LocalClient runs the chat server's pipeline in this process, which needs the serve extra"
                f" (no module {exc.name!r}); install it with: pip install 'chatcodec[serve]'"
            ) from None
        codec: Codec | None
        if isinstance(template, Codec):
            codec, chat_template = template, template.template
        elif template is None and isinstance(getattr(backend, "codec", None), Codec):
            codec = backend.codec  # the embedded model's: its template with llama.cpp's tokenizer
            chat_template = codec.template
        else:
            chat_template = template if template is not None else backend.template
            tokenizer = getattr(backend, "tokenizer", None)
            codec = Codec(chat_template, tokenizer) if tokenizer is not None else None
        self.backend = backend
        #: the Codec that turns each request's chat into the ids the backend gets (None: text)
        self.codec = codec
        self._service = ChatService(
            backend,
            chat_template,
            model=model or backend.info.id,
            polyfill=polyfill,
            tool_parser=tool_parser,
            codec=codec,
        )
        self.chat = _Namespace(completions=_Namespace(create=self._create))

    def __repr__(self) -> str:
        return f"LocalClient({self.backend.info.id!r})"

    async def _create(self, **request: Any) -> dict[str, Any]:
        from ..server.errors import APIError
        from ..server.protocol import parse_chat

        if request.get("stream"):
            raise InputError("LocalClient answers whole messages: leave stream out of the request.")
        try:
            plan = self._service.plan(parse_chat(request))
            return await self._service.complete(plan)
        except APIError as exc:
            raise InputError(f"The request cannot be answered: {exc.message}") from None

    async def complete(
        self,
        conversation: Conversation,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        tool_choice: str | None = None,
        parallel_tool_calls: bool = True,
    ) -> dict[str, Any]:
        """Generate the model's next turn of ``conversation`` token in, token out, and add it to the conversation.

        The model is given ``conversation.input_ids`` as they are (the conversation must await a completion:
        its last append had ``add_generation_prompt=True``) and the ids it samples go back verbatim with
        :meth:`~chatcodec.Conversation.add_completion`. The embedded engine keeps what it evaluated of the
        conversation's last turn, so it evaluates only the ids appended since then; ``usage`` says how many
        prompt ids were kept (``prompt_tokens_details.cached_tokens``). The answer is a ``chat.completion``
        dict: the message as the conversation holds it, the sampled ``token_ids``, the ``finish_reason``.

        Sampling is the model's own unless ``tool_choice`` (``"auto"``, ``"required"`` or a tool's name) asks
        for the server's constraint on the conversation's tools (``parallel_tool_calls=False``: one call at
        most). The conversation is made by this client's
        :attr:`codec` (``client.codec.conversation(...)``), whose ids are the engine's.
        """
        from ..backends.base import Generation
        from ..server.chat import _completion_id, _usage

        if self.codec is None or conversation.codec is not self.codec:
            raise InputError(
                "The conversation must be made by this client's codec (client.codec.conversation(...)),"
                " so that its ids are the engine's."
                if self.codec is not None
                else "This backend takes text: a conversation needs a backend with a tokenizer."
            )
        if not conversation.awaiting:
            raise ConversationError(
                "The conversation does not await a completion: append its next messages with"
                " add_generation_prompt=True first."
            )
        request = Generation(
            conversation.input_ids,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            constraint=None
            if tool_choice is None
            else _conversation_constraint(conversation, tool_choice, parallel=parallel_tool_calls),
        )
        sampled: list[int] = []
        last: Chunk | None = None
        async for chunk in self.backend.generate(request):
            if chunk.token_ids is None:
                raise BackendError("The backend does not report the ids it sampled, which a conversation keeps.")
            sampled += chunk.token_ids
            last = chunk
        message = conversation.add_completion(sampled)
        finish = "length" if last is not None and last.finish_reason == "length" else "stop"
        choice = {
            "index": 0,
            "message": conversation.messages[-1],
            "logprobs": None,
            "finish_reason": "tool_calls" if message.tool_calls and finish == "stop" else finish,
            "token_ids": sampled,
        }
        return {
            "id": _completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self._service.model,
            "choices": [choice],
            "usage": _usage(last),
        }

    async def aclose(self) -> None:
        """Free the backend (the embedded model's memory, a remote backend's connections)."""
        await self.backend.aclose()


def _conversation_constraint(conversation: Conversation, choice: str, *, parallel: bool) -> Constraint:
    """The server's constraint for ``tool_choice`` = ``choice`` on the conversation's tools, in its template's
    format (with its template variables: where the answer starts, inside reasoning or not)."""
    from ..decoders import decoder_for
    from ..server.constrain import learn_frame, thinking_for, tool_constraint

    options = conversation.options
    template = conversation.codec.template
    tools = [t for t in options.get("tools") or () if isinstance(t, Mapping) and "function" in t]
    names = [t["function"].get("name") for t in tools]
    if not isinstance(choice, str) or choice not in ("auto", "required", *names):
        raise InputError(f"tool_choice must be 'auto', 'required' or one of the conversation's tools {names}.")
    variables = {k: v for k, v in options.items() if k not in ("tools", "documents", "polyfill")}
    name = decoder_for(template, tools=tools, polyfill=options.get("polyfill", False)).name
    frame = None if name in ("generic", "content") else learn_frame(template, variables)
    enable = variables.get("enable_thinking")
    thinking = thinking_for(template, enable if isinstance(enable, bool) else None)
    constraint = tool_constraint(name, tools, choice, parallel=parallel, frame=frame, thinking=thinking)
    if constraint is None:
        raise InputError(
            f"Cannot constrain template {template.name or 'unnamed'!r} to tool_choice={choice!r}: it shows no"
            " tool-call format to constrain to."
        )
    return constraint


class _Namespace:
    """``client.chat.completions``: attributes and nothing else."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


class _Loop:
    """The state of one :meth:`Toolbox.run`: the transcript and which request comes next."""

    def __init__(
        self,
        toolbox: Toolbox,
        messages: Sequence[Any],
        model: str,
        max_rounds: int,
        style: Style,
        tool_choice: Any,
        reset_tool_choice: bool,
        params: dict[str, Any],
    ) -> None:
        if style not in ("tools", "functions"):
            raise InputError(f"style must be 'tools' or 'functions', not {style!r}.")
        if not isinstance(max_rounds, int) or max_rounds < 1:
            raise InputError(f"max_rounds must be a positive integer, not {max_rounds!r}.")
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise InputError(f"messages must be a list of message dicts, not {type(messages).__name__}.")
        if not toolbox._tools:
            raise InputError("This toolbox has no tools; add functions before running the loop.")
        for key in ("messages", "tools", "functions", "tool_choice", "function_call", "stream", "n"):
            if key in params:
                raise InputError(f"run() sets {key!r} itself; leave it out of the request parameters.")
        self.toolbox = toolbox
        self.transcript = [_plain_message(message, index) for index, message in enumerate(messages)]
        self.model = model
        self.max_rounds = max_rounds
        self.style = style
        self.policy: Callable[[int, list[Message]], Any] | None = tool_choice if callable(tool_choice) else None
        self.first_choice = None if self.policy is not None else _tool_choice(tool_choice, toolbox)
        self.reset = reset_tool_choice
        self.params = params
        self.round = 0
        self.done = False
        self._assistant: Message = {}
        self._appended: list[Message] = []

    def next_request(self) -> dict[str, Any] | None:
        if self.done:
            return None
        if self.policy is not None:
            choice = _tool_choice(self.policy(self.round, list(self.transcript)), self.toolbox)
        else:
            choice = self.first_choice
            if self.round > 0 and self.reset and _forcing(choice):
                choice = "auto"
        if self.round == self.max_rounds - 1 and not (self.round == 0 and _forcing(choice)):
            choice = "none"
        request: dict[str, Any] = {"model": self.model, "messages": self.transcript}
        if self.style == "tools":
            request["tools"] = self.toolbox.tools
            if choice is not None:
                request["tool_choice"] = choice
        else:
            request["functions"] = self.toolbox.functions
            if choice is not None:
                request["function_call"] = _legacy_choice(choice)
        return {**request, **self.params}

    def take_reply(self, reply: Any) -> list[_Call]:
        """Append the model's message(s) to the transcript; the calls to run."""
        message = _reply_message(reply)
        entries, calls = _calls_of(message, self.round)
        message.pop("tool_calls", None)
        message.pop("function_call", None)
        self._assistant = message
        if self.style == "functions" and entries:
            # Qwen-Agent's form: one assistant message per call, each with its function_call
            appended = []
            for index, entry in enumerate(entries):
                turn: Message = dict(message) if index == 0 else {"role": "assistant", "content": ""}
                turn["function_call"] = {"name": entry["function"]["name"], "arguments": entry["function"]["arguments"]}
                appended.append(turn)
        else:
            if entries:
                message["tool_calls"] = entries
            appended = [message]
        self.transcript.extend(appended)
        self._appended = appended
        return calls

    def add_results(self, results: list[ToolResult]) -> Round:
        self.transcript.extend(result.message for result in results)
        self.round += 1
        self.done = not results or self.round >= self.max_rounds
        finished = Round(
            index=self.round - 1,
            assistant=self._assistant,
            results=tuple(results),
            messages=(*self._appended, *(result.message for result in results)),
            final=self.done,
        )
        return finished


#: toolboxes with open MCP sessions: closed at exit, so that their servers stop as the protocol says
_OPEN: weakref.WeakSet[Toolbox] = weakref.WeakSet()


@atexit.register
def _close_open_toolboxes() -> None:
    for toolbox in list(_OPEN):
        toolbox.close()


def _openai_name(text: str) -> str:
    """A tool name the OpenAI API accepts: other characters as ``_``, at most 64."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:64] or "tool"


def _mcp_tool(
    name: str,
    server: MCPServer,
    listed: dict[str, Any],
    submit: Callable[[MCPServer, str, dict[str, Any]], concurrent.futures.Future[Any]],
) -> _Tool:
    """An MCP server's tool as a toolbox entry: its listed schema, calls sent to its session."""
    parameters = listed["parameters"] if isinstance(listed.get("parameters"), dict) else {"type": "object"}
    schema: JsonSchema = {
        "type": "function",
        "function": {"name": name, "description": listed.get("description") or "", "parameters": parameters},
    }
    try:
        validator = _validator(name, parameters)
    except (SchemaError, RecursionError, TypeError, ValueError) as exc:  # the server's: each call says why
        validator = _Unusable(exc)
    original = listed["name"]

    def call(**arguments: Any) -> concurrent.futures.Future[Any]:
        return submit(server, original, arguments)

    return _Tool(name, call, schema, validator, {}, None, is_async=True, server=server, listed=listed)


class _Unusable:
    """The validator of a schema jsonschema refuses: checking any arguments raises why."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def iter_errors(self, instance: Any) -> Iterable[Any]:
        raise self.error


# --------------------------------------------------------------------------------------------------
# Reading calls and replies


def _tool_dict(function: Callable[..., Any], schema: Mapping[str, Any] | None) -> JsonSchema:
    """The OpenAI tool dict for a function, from its signature or from a schema given by hand."""
    if schema is None:
        return tool_schema(function)
    given = json.loads(json.dumps(schema))  # a plain copy; also rejects values JSON cannot hold
    entry = given.get("function", given) if given.get("type") == "function" else given
    if not isinstance(entry, dict) or not isinstance(entry.get("parameters", {}), dict):
        raise SchemaError(
            "A tool schema must be {'type': 'function', 'function': {'name', 'description', 'parameters'}}."
        )
    entry.setdefault("name", getattr(function, "__name__", None))
    return {"type": "function", "function": entry}


def _validator(name: str, parameters: JsonSchema) -> Any:
    from ..refs import validator  # the one resolver: references within the schema only, nothing ever fetched

    try:
        return validator(_validation_schema(parameters), where=f"The parameters schema of {name}")
    except ImportError:  # pragma: no cover - the tools extra installs it
        raise ChatcodecError(
            "Toolbox validates arguments with jsonschema; install it with: pip install 'chatcodec[tools]'"
        ) from None


def _validation_schema(node: Any) -> Any:
    """The schema with OpenAPI's ``nullable: true`` (which get_json_schema writes) as JSON Schema's null."""
    if isinstance(node, list):
        return [_validation_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    schema = {key: _validation_schema(value) for key, value in node.items()}
    if schema.pop("nullable", None) is True:
        kind = schema.get("type")
        if isinstance(kind, str):
            schema["type"] = [kind, "null"]
        elif isinstance(kind, list) and "null" not in kind:
            schema["type"] = [*kind, "null"]
        if isinstance(schema.get("anyOf"), list):
            schema["anyOf"] = [*schema["anyOf"], {"type": "null"}]
        if isinstance(schema.get("enum"), list) and None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
    return schema


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        dumped = dump()
        return dumped if isinstance(dumped, Mapping) else None
    return None


def _style_of(raw: Any) -> Style:
    """``"functions"`` for a legacy ``function_call`` (a name and arguments, no id), else ``"tools"``."""
    mapping = _as_mapping(raw)
    if mapping is not None and "function" not in mapping and "id" not in mapping and "name" in mapping:
        return "functions"
    return "tools"


def _read_call(raw: Any, index: int) -> _Call:
    """Read one tool call, whatever the model wrote; what cannot be read is said in the _Call."""
    mapping = _as_mapping(raw)
    if mapping is None:
        return _Call(
            None,
            "",
            raw,
            None,
            raw if isinstance(raw, str) else "",
            f'tool call {index} is {_json_type(raw)}, not a tool call object ({{"name": ..., "arguments": {{...}}}})',
        )
    call_id = mapping.get("id")
    call_id = call_id if isinstance(call_id, str) else None
    function = mapping.get("function", mapping)
    if isinstance(function, str):  # "function": "get_weather"
        return _Call(
            call_id,
            "",
            None,
            None,
            "",
            f"tool call {index} gives its function as {_json_type(function)}, not an object",
        )
    function = _as_mapping(function) or mapping
    name = function.get("name")
    if not isinstance(name, str) or not name:
        return _Call(call_id, "", function.get("arguments"), None, "", f"tool call {index} has no function name")
    arguments = function.get("arguments", {})
    if mapping.get("error"):  # a decoded ToolCall the decoder could not read whole
        text = arguments if isinstance(arguments, str) else ""
        return _Call(call_id, name, arguments, f"the call was malformed ({mapping['error']})", text)
    if arguments is None or arguments == "":
        arguments = {}
    if isinstance(arguments, str):
        text = arguments
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return _Call(call_id, name, text, f"the arguments are not valid JSON ({exc})", text)
        except RecursionError:
            return _Call(call_id, name, text, "the arguments are nested too deeply to read", text)
    else:
        try:
            text = json.dumps(arguments, ensure_ascii=False)
        except RecursionError:
            return _Call(call_id, name, arguments, "the arguments are nested too deeply to read", "")
        except (TypeError, ValueError) as exc:
            return _Call(call_id, name, arguments, f"the arguments cannot be written as JSON ({exc})", "")
    if not isinstance(arguments, dict):
        return _Call(
            call_id, name, arguments, f"the arguments must be a JSON object, not {_json_type(arguments)}", text
        )
    return _Call(call_id, name, arguments, None, text)


def _result_message(call: _Call, content: str, style: Style) -> Message:
    if style == "functions":
        return {"role": "function", "name": call.name, "content": content}
    message: Message = {"role": "tool"}
    if call.id is not None:
        message["tool_call_id"] = call.id
    message["content"] = content
    return message


def _plain_message(message: Any, index: int) -> Message:
    mapping = _as_mapping(message)
    if mapping is None or not isinstance(mapping.get("role"), str):
        raise InputError(f"Message {index} is not a chat message with a role: {_first_line(repr(message))[:200]}")
    return dict(mapping)


def _reply_message(reply: Any) -> Message:
    """The assistant message of a chat completion (an SDK object or a dict), as a plain dict.

    Its calls are kept as they came (``_calls_of`` reads each one); everything else is copied as JSON,
    and a field that cannot be copied (nested too deeply, say) is left out.
    """
    mapping = _as_mapping(reply)
    choices = mapping.get("choices") if mapping is not None else None
    if not choices or not isinstance(choices, Sequence) or isinstance(choices, str):
        raise ChatcodecError(f"The model's reply has no choices: {_first_line(_safe_repr(reply))[:300]}")
    first = _as_mapping(choices[0]) or {}
    message = _as_mapping(first.get("message"))
    if message is None:
        raise ChatcodecError(f"The model's reply has no message: {_first_line(_safe_repr(reply))[:300]}")
    plain: Message = {}
    for key, value in dict(message).items():
        if value is None or not isinstance(key, str):
            continue
        if key in ("tool_calls", "function_call"):
            plain[key] = value
            continue
        try:
            plain[key] = json.loads(json.dumps(value, default=str))
        except (ValueError, RecursionError):
            continue
    plain["role"] = "assistant"
    plain.setdefault("content", None)
    return plain


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except RecursionError:
        return f"<a {type(value).__name__} nested too deeply to show>"


def _calls_of(message: Message, round_index: int) -> tuple[list[Message], list[_Call]]:
    """The message's calls as ``tool_calls`` entries (string arguments, an id each), and as read for running.

    Every entry the model wrote gets one, also one that cannot be read: its result then says why, under
    the entry's id, so that the transcript stays a valid conversation.
    """
    raw_calls = message.get("tool_calls") or []
    if isinstance(raw_calls, (str, bytes, Mapping)) or not isinstance(raw_calls, Sequence):
        raw_calls = [raw_calls]
    if not raw_calls and message.get("function_call"):
        raw_calls = [{"type": "function", "function": message["function_call"]}]
    entries: list[Message] = []
    calls: list[_Call] = []
    for index, raw in enumerate(raw_calls):
        call = _read_call(raw, index)
        call = dataclasses.replace(call, id=call.id or f"call_{round_index}_{index}")
        entries.append({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.text}})
        calls.append(call)
    return entries, calls


def _create_method(client: Any) -> Callable[..., Any]:
    create = getattr(getattr(getattr(client, "chat", None), "completions", None), "create", None)
    if not callable(create):
        raise InputError(
            f"The client must be OpenAI-compatible, with chat.completions.create() (openai.OpenAI, say);"
            f" got {type(client).__name__}."
        )
    return typing.cast("Callable[..., Any]", create)


def _tool_choice(choice: Any, toolbox: Toolbox) -> Any:
    """The first round's tool choice, checked; a bare tool name becomes the named form."""
    if choice is None or choice in _TOOL_CHOICES:
        return choice
    if isinstance(choice, str):
        if choice not in toolbox:
            raise InputError(f"tool_choice {choice!r} is neither auto, none, required nor a tool of this toolbox.")
        return {"type": "function", "function": {"name": choice}}
    name = (choice.get("function") or {}).get("name") if isinstance(choice, Mapping) else None
    if name not in toolbox:
        raise InputError(f"tool_choice {choice!r} does not name a tool of this toolbox.")
    return {"type": "function", "function": {"name": name}}


def _forcing(choice: Any) -> bool:
    return choice == "required" or isinstance(choice, Mapping)


def _legacy_choice(choice: Any) -> Any:
    """The legacy ``function_call`` for a tool choice: ``{"name": ...}`` for a named one."""
    if isinstance(choice, Mapping):
        return {"name": choice["function"]["name"]}
    if choice == "required":
        raise InputError(
            "The legacy functions style has no tool_choice 'required': its function_call takes auto, none or a"
            " function's name. Name the function, or use style='tools'."
        )
    return choice


# --------------------------------------------------------------------------------------------------
# Arguments in, results out


def _convert(value: Any, hint: Any) -> Any:
    """A JSON argument as the parameter's type asks: Enum members, pydantic models, tuples."""
    if value is None or hint is Any:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is None:
        if isinstance(hint, type):
            if issubclass(hint, enum.Enum) and not isinstance(value, hint):
                return hint(value)
            if _is_model(hint) and isinstance(value, dict):
                return hint.model_validate(value)  # type: ignore[attr-defined]
            if hint is tuple and isinstance(value, list):
                return tuple(value)
        return value
    if origin is typing.Union or origin is type(int | str):
        return _convert_union(value, [arg for arg in args if arg is not type(None)])
    if origin is list and args and isinstance(value, list):
        return [_convert(item, args[0]) for item in value]
    if origin is tuple and isinstance(value, list):
        if len(args) == len(value) and ... not in args:
            return tuple(_convert(item, arg) for item, arg in zip(value, args, strict=True))
        return tuple(value)
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return {key: _convert(item, args[1]) for key, item in value.items()}
    return value


def _convert_union(value: Any, members: list[Any]) -> Any:
    """The first member the value already is, else the first member that converts it."""
    for member in members:
        plain = isinstance(member, type) and not issubclass(member, enum.Enum) and not _is_model(member)
        if plain and isinstance(value, member) and not (member is int and isinstance(value, bool)):
            return value
    for member in members:
        try:
            converted = _convert(value, member)
        except (TypeError, ValueError):
            continue
        if converted is not value:
            return converted
    return value


def _result_text(value: Any) -> str:
    """A tool's return value as the result's content: a string as it is, anything else as JSON.

    NaN and the infinities, which JSON cannot hold, are written as the strings ``"NaN"``,
    ``"Infinity"`` and ``"-Infinity"`` (pydantic's ``ser_json_inf_nan="strings"``), so that the text is
    always valid JSON.
    """
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=_jsonable, allow_nan=False)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
    return json.dumps(
        _finite(value), ensure_ascii=False, default=lambda item: _finite(_jsonable(item)), allow_nan=False
    )


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (values and keys) written as its name."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {_finite(key): _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _jsonable(value: Any) -> Any:
    """``json.dumps``'s ``default``: pydantic models, dataclasses, enums, sets, dates."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), "null" if value is None else type(value).__name__)


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0]


# --------------------------------------------------------------------------------------------------
# Running sync and async code


def _is_coroutine_function(function: Any) -> bool:
    """A coroutine function, also behind ``functools.wraps`` decorators or as an object's ``__call__``."""
    candidates = [function, getattr(function, "__call__", None)]  # noqa: B004 - an object with an async __call__
    for candidate in candidates:
        if candidate is not None and inspect.iscoroutinefunction(inspect.unwrap(candidate)):
            return True
    return False


#: how long a timed-out coroutine tool is given to see its cancellation before the call is reported
_CANCEL_GRACE = 1.0


class _Escaped(Exception):
    """Carries what a tool raised that is not an Exception (SystemExit, CancelledError, ...) to its result."""

    def __init__(self, exception: BaseException) -> None:
        super().__init__(repr(exception))
        self.exception = exception


async def _in_thread(function: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run a tool on a daemon thread of its own; a coroutine it gives runs on an event loop of that thread.

    Not the loop's default executor: a timed-out call may never return, and neither the loop's
    shutdown nor the interpreter's exit should wait for it. Not the caller's event loop either, for
    coroutine tools: one that blocks (``time.sleep`` in an ``async def``) would stall every other call
    and its own timeout. On a timeout a coroutine is cancelled and given ``_CANCEL_GRACE`` seconds to
    finish; a synchronous function cannot be stopped and finishes in the background.
    """
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()
    lock = threading.Lock()
    state: dict[str, Any] = {"cancelled": False, "cancel": None}

    def deliver(result: Any, error: BaseException | None) -> None:
        if finished.done():
            return
        if error is not None:
            finished.set_exception(error)
        else:
            finished.set_result(result)

    async def drive(value: Any) -> Any:
        task = asyncio.current_task()
        worker_loop = asyncio.get_running_loop()
        with lock:
            if state["cancelled"] and task is not None:
                task.cancel()
            elif task is not None:
                state["cancel"] = lambda: worker_loop.call_soon_threadsafe(task.cancel)
        while inspect.isawaitable(value):  # also a sync wrapper around a coroutine function
            value = await value
        return value

    def work() -> None:
        result, error = None, None
        try:
            result = context.run(function, **kwargs)
            if inspect.isawaitable(result):
                result = context.run(asyncio.run, drive(result))
        except Exception as exc:  # handed to the waiting coroutine
            error = exc
        except BaseException as exc:  # SystemExit, CancelledError, ...: the call's result says so
            error = _Escaped(exc)
        with contextlib.suppress(RuntimeError):  # the loop closed while the call ran: nobody waits any more
            loop.call_soon_threadsafe(deliver, result, error)

    threading.Thread(target=work, name=f"chatcodec-tool-{getattr(function, '__name__', 'call')}", daemon=True).start()
    try:
        return await asyncio.shield(finished)
    except asyncio.CancelledError:
        with lock:
            state["cancelled"] = True
            cancel = state["cancel"]
        if cancel is not None:
            with contextlib.suppress(RuntimeError):  # the coroutine's loop already closed
                cancel()
            with contextlib.suppress(BaseException):  # a grace period: its outcome is not wanted any more
                await asyncio.wait_for(asyncio.shield(finished), _CANCEL_GRACE)
        raise


async def _remote(future: concurrent.futures.Future[Any]) -> Any:
    """Await a call running on another thread's loop (an MCP session's); a timeout cancels it there."""
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        cancelling = getattr(task, "cancelling", None)
        if future.cancelled() and callable(cancelling) and cancelling() == 0:  # not ours: the session's
            raise ToolFailure("the call was cancelled by its server's session") from exc
        raise


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # re-raised in the calling thread
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="chatcodec-tools-loop")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return typing.cast("T", outcome["value"])
