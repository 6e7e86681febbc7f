"""``chatcodec tools``: tool schemas from Python functions, MCP servers' tools, and the function-calling loop.

chatcodec tools schema examples/temperature.py:get_current_temperature
chatcodec tools run examples/temperature.py --url http://127.0.0.1:8000/v1 --prompt "How warm is it in Paris?"
chatcodec tools run examples/temperature.py --prompt "How warm is it in Paris?"    # the embedded model, no server
chatcodec tools run --mcp "python examples/temperature_mcp.py serve" --prompt "How warm is it in Paris?"
chatcodec tools list --mcp-config mcp.json examples/temperature.py

Functions are named as ``FILE.py:NAME[,NAME...]`` or ``package.module:NAME``; a file or module alone
means the functions listed in its ``TOOLS``, or else every public function it defines. MCP servers come
from ``--mcp COMMAND`` (stdio), ``--mcp-url URL`` (streamable HTTP) and ``--mcp-config FILE``
(``{"mcpServers": {...}}``, Qwen-Agent's and Claude Desktop's shape), as many as wanted, beside functions.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from ..exceptions import ChatcodecError, InputError, LoadError
from ..tools import Round, Toolbox, tool_schema
from . import common

__all__ = ["configure", "load_functions", "run"]

#: max_tokens of each round unless --max-tokens says otherwise: a small model that loops stops here (532 s and
#: 19.7 KB of repeated text without a cap)
ROUND_MAX_TOKENS = 512


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Tool schemas from Python functions, and the function-calling loop against a model."
    actions = parser.add_subparsers(
        title="actions", metavar="ACTION", dest="action", parser_class=common.ArgumentParser
    )

    schema = actions.add_parser("schema", help="print the OpenAI tool schema of Python functions")
    schema.description = (
        "Print the tool schema of each function, as transformers' get_json_schema builds it (pydantic models as"
        " parameter types become their JSON schema): one tool dict for one function, else a list."
    )
    schema.add_argument("functions", metavar="FUNCTIONS", help="FILE.py[:NAME,...] or package.module[:NAME,...]")
    schema.add_argument(
        "--legacy", action="store_true", help="print the legacy 'functions' form (name, description, parameters)"
    )

    listing = actions.add_parser("list", help="print the tools of MCP servers and Python functions, with schemas")
    listing.description = (
        "Start the MCP servers, list their tools and print every tool as the model gets it: the OpenAI tools"
        " list (names prefixed with the server's label only where two tools clash), or --legacy's functions."
    )
    listing.add_argument(
        "functions", nargs="?", metavar="FUNCTIONS", help="FILE.py[:NAME,...] or package.module[:NAME,...]"
    )
    listing.add_argument(
        "--legacy", action="store_true", help="print the legacy 'functions' form (name, description, parameters)"
    )
    _add_mcp_options(listing)

    loop = actions.add_parser("run", help="run the function-calling loop against a server or the embedded model")
    loop.description = (
        "Ask a model, run the tool calls it makes with the given functions and MCP servers' tools, feed the"
        " results back, until it answers; print the transcript. The model is an OpenAI-compatible server"
        " (--url), or without --url a GGUF model in this process (the embedded SmolLM2-135M-Instruct unless"
        " --model names one): the server's own pipeline, without HTTP. A tool's failure, timeout or a server"
        " that exits is an 'Error: ...' result the model reads."
    )
    loop.add_argument(
        "functions",
        nargs="?",
        metavar="FUNCTIONS",
        help="FILE.py[:NAME,...] or package.module[:NAME,...] (may be left out with --mcp, --mcp-url or --mcp-config)",
    )
    loop.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help="JSON file with a list of messages or a request body with 'messages'; - for stdin (or use --prompt)",
    )
    _add_mcp_options(loop)
    loop.add_argument("--prompt", "-p", metavar="TEXT", help="the user's message, instead of FILE")
    loop.add_argument(
        "--url", metavar="URL", help="the server's OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1)"
    )
    loop.add_argument(
        "--model",
        "-m",
        metavar="NAME|PATH.gguf",
        help="with --url, the model name to send (default: the server's first); without, a GGUF file to run"
        " in this process (default: the embedded SmolLM2-135M-Instruct)",
    )
    loop.add_argument("--api-key", metavar="KEY", help="the API key (default: $OPENAI_API_KEY, else none)")
    common.add_engine_option(loop)
    loop.add_argument(
        "--style", choices=["tools", "functions"], default="tools", help="tools=[...] or Qwen-Agent's functions=[...]"
    )
    loop.add_argument(
        "--tool-choice", metavar="CHOICE", help="auto, none, required or a function's name (first round only)"
    )
    loop.add_argument(
        "--keep-tool-choice", action="store_true", help="send --tool-choice in every round, not only the first"
    )
    loop.add_argument(
        "--no-parallel-tool-calls",
        action="store_true",
        help="ask for at most one call a round (parallel_tool_calls: false)",
    )
    loop.add_argument("--max-rounds", type=int, default=8, metavar="N", help="at most N requests (default: 8)")
    loop.add_argument("--call-timeout", type=float, default=30.0, metavar="SECONDS", help="per tool call (default: 30)")
    loop.add_argument(
        "--max-tokens",
        type=common.positive_int,
        default=ROUND_MAX_TOKENS,
        metavar="N",
        help=f"max_tokens of each request (default: {ROUND_MAX_TOKENS}, so that a looping model stops)",
    )
    loop.add_argument("--temperature", type=float, metavar="T", help="temperature of each request")
    loop.add_argument("--seed", type=int, metavar="N", help="seed of each request")
    common.add_output_options(
        loop,
        json_help="print the whole transcript as JSON (the default)",
        show_help="print the conversation for a person to read",
    )


def _add_mcp_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("MCP servers")
    group.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="COMMAND",
        help='an MCP server to run as a child over stdio, e.g. "python server.py" (split as a shell does; repeatable)',
    )
    group.add_argument(
        "--mcp-url",
        action="append",
        default=[],
        metavar="URL",
        help="a streamable HTTP MCP server, e.g. http://127.0.0.1:8765/mcp (repeatable)",
    )
    group.add_argument(
        "--mcp-header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="an HTTP header for every --mcp-url server, e.g. 'Authorization: Bearer TOKEN' (repeatable)",
    )
    group.add_argument(
        "--mcp-config",
        metavar="FILE",
        help='a JSON file {"mcpServers": {label: {"command", "args", "env", "cwd"} or {"url", "headers"}}}',
    )


def run(args: argparse.Namespace, stdout: IO[str] | None = None) -> int:
    out = stdout or sys.stdout
    if args.action == "schema":
        functions = load_functions(args.functions)
        schemas = [tool_schema(function) for function in functions]
        value: Any = [schema["function"] for schema in schemas] if args.legacy else schemas
        if len(functions) == 1 and ":" in args.functions:
            value = value[0]
        out.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")
        return 0
    if args.action == "run":
        return _run_loop(args, out)
    if args.action == "list":
        with _toolbox(args, timeout=None) as toolbox:
            value = toolbox.functions if args.legacy else toolbox.tools
        out.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")
        return 0
    raise InputError(
        "Say what to do: chatcodec tools schema ..., chatcodec tools list ... or chatcodec tools run ... (see --help)"
    )


def _has_mcp(args: argparse.Namespace) -> bool:
    return bool(args.mcp or args.mcp_url or args.mcp_config)


def _toolbox(args: argparse.Namespace, timeout: float | None) -> Toolbox:
    """The Python functions and the MCP servers the arguments name, in one toolbox (its servers started)."""
    if not args.functions and not _has_mcp(args):
        raise InputError("Name the tools: FUNCTIONS (FILE.py[:NAME,...]), --mcp, --mcp-url or --mcp-config")
    headers = {}
    for header in args.mcp_header:
        name, colon, value = header.partition(":")
        if not colon or not name.strip():
            raise InputError(f"--mcp-header takes NAME:VALUE, not {header!r}")
        headers[name.strip()] = value.strip()
    if headers and not args.mcp_url:
        raise InputError("--mcp-header is sent to --mcp-url servers; give one")
    functions = load_functions(args.functions) if args.functions else []
    count = len(args.mcp) + len(args.mcp_url) + (1 if args.mcp_config else 0)
    if count:
        print(f"chatcodec: starting {'the MCP server' if count == 1 else 'the MCP servers'} ...", file=sys.stderr)
    toolbox = Toolbox.from_mcp_config(args.mcp_config, functions, timeout=timeout) if args.mcp_config else None
    toolbox = toolbox or Toolbox(functions, timeout=timeout)
    try:
        for command in args.mcp:
            toolbox.add_mcp(command)
        for url in args.mcp_url:
            toolbox.add_mcp(url=url, headers=headers or None)
    except BaseException:
        toolbox.close()
        raise
    if count:
        remote = [tool["function"]["name"] for tool in toolbox.tools][len(functions) :]
        print(f"chatcodec: {len(remote)} tools from MCP: {', '.join(remote) or 'none'}", file=sys.stderr)
    return toolbox


# --- the loop ------------------------------------------------------------------------------------------


def _run_loop(args: argparse.Namespace, out: IO[str]) -> int:
    if args.max_rounds < 1:
        raise InputError(f"--max-rounds must be at least 1, not {args.max_rounds}")
    if args.call_timeout <= 0:
        raise InputError(f"--call-timeout must be a positive number of seconds, not {args.call_timeout}")
    if _has_mcp(args) and args.file is None and args.functions and _is_conversation(args.functions):
        args.file, args.functions = args.functions, None  # `tools run --mcp CMD chat.json`
    messages = _messages(args)
    with _toolbox(args, timeout=args.call_timeout) as toolbox:
        return _run_with(args, out, messages, toolbox)


def _run_with(args: argparse.Namespace, out: IO[str], messages: list[dict[str, Any]], toolbox: Toolbox) -> int:
    """The loop and its transcript, while the toolbox (and its MCP servers) is open."""
    client, model = _server(args) if args.url is not None else _embedded(args)
    params: dict[str, Any] = {
        key: value
        for key, value in (("max_tokens", args.max_tokens), ("temperature", args.temperature), ("seed", args.seed))
        if value is not None
    }
    if args.no_parallel_tool_calls:
        params["parallel_tool_calls"] = False
    common.flush_notes()
    # said when the loop ends (or in brackets after its error), once the rounds have shown what they did
    common.note(f"each round asked for at most {args.max_tokens} tokens (--max-tokens N to change it)")
    transcript = toolbox.run(
        client,
        messages,
        model=model,
        max_rounds=args.max_rounds,
        style=args.style,
        tool_choice=args.tool_choice,
        reset_tool_choice=not args.keep_tool_choice,
        on_round=_progress,
        **params,
    )
    if args.show:
        out.write(show_transcript(transcript) + "\n")
    else:
        out.write(json.dumps(transcript, ensure_ascii=False, indent=2) + "\n")
    return 0


def _is_conversation(spec: str) -> bool:
    """A FILE argument in the FUNCTIONS place: stdin, or a JSON file."""
    return spec == "-" or spec.lower().endswith(".json")


def _messages(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.prompt is not None and args.file is not None:
        raise InputError("Give the conversation as FILE or as --prompt TEXT, not both")
    if args.prompt is not None:
        return [{"role": "user", "content": args.prompt}]
    return common.read_request(args.file or "-").messages


def _embedded(args: argparse.Namespace) -> tuple[Any, str]:
    """The local loop: a GGUF model (by default SmolLM2-135M-Instruct) in this process, no server."""
    from ..backends import LlamaBackend, default_model_path
    from ..tools import LocalClient

    path = Path(args.model).expanduser() if args.model else default_model_path()
    if not path.is_file():
        raise LoadError(f"No model file at {path}.")
    print("chatcodec: loading the model ...", file=sys.stderr, flush=True)
    backend = LlamaBackend(args.model, engine=args.engine)
    return LocalClient(backend), backend.info.id


def _server(args: argparse.Namespace) -> tuple[Any, str]:
    """An openai client for ``--url`` whose errors become one line, and the model name to send."""
    import openai

    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or "none"
    client = _GuardedClient(openai.OpenAI(base_url=args.url, api_key=api_key, max_retries=0), args.url)
    if args.model:
        return client, str(args.model)
    models = client.call(lambda c: c.models.list())
    names = [model.id for model in models.data]
    if not names:
        raise ChatcodecError(f"The server at {args.url} lists no models; name one with --model")
    common.note(f"asking model {names[0]!r}, the first the server lists (choose with --model)")
    return client, names[0]


class _GuardedClient:
    """An openai client whose connection and status errors are ChatcodecErrors that name the server."""

    def __init__(self, client: Any, url: str) -> None:
        self._client = client
        self._url = url
        self.chat = self
        self.completions = self

    def create(self, **request: Any) -> Any:
        return self.call(lambda c: c.chat.completions.create(**request))

    def call(self, action: Callable[[Any], Any]) -> Any:
        import openai

        try:
            return action(self._client)
        except openai.APIConnectionError as exc:
            raise ChatcodecError(f"Cannot reach the server at {self._url}: {exc.__cause__ or exc}") from None
        except openai.APIStatusError as exc:
            raise ChatcodecError(f"The server at {self._url} answered {exc.status_code}: {_error_text(exc)}") from None


def _error_text(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        detail = body.get("error", body)
        if isinstance(detail, dict) and isinstance(detail.get("message"), str):
            return str(detail["message"])
    return str(getattr(exc, "message", exc))


def _progress(finished: Round) -> None:
    """One line per round on stderr: the calls and how they went."""
    if not finished.results:
        print(f"chatcodec: round {finished.index + 1}: the model answered", file=sys.stderr)
        return
    calls = ", ".join(
        f"{r.name}({_short(r.arguments)})" + (f" -> {r.error}" if r.error else "") for r in finished.results
    )
    print(f"chatcodec: round {finished.index + 1}: {calls}", file=sys.stderr)


def _short(arguments: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(arguments, ensure_ascii=False) if not isinstance(arguments, str) else arguments
    except (TypeError, ValueError, RecursionError):  # what the model wrote, however deep or odd
        text = f"<{type(arguments).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show_transcript(transcript: list[dict[str, Any]]) -> str:
    """The conversation for a person: one block per message, calls and results marked."""
    blocks = []
    for message in transcript:
        role = message.get("role", "?")
        lines = []
        if message.get("reasoning_content"):
            lines.append(f"[{role} reasoning] {message['reasoning_content']}")
        if message.get("content"):
            who = f"{role} {message['name']}" if role == "function" else role
            lines.append(f"[{who}] {message['content']}")
        for call in message.get("tool_calls") or []:
            lines.append(f"[{role} calls] {call['function']['name']}({call['function']['arguments']})")
        if message.get("function_call"):
            call = message["function_call"]
            lines.append(f"[{role} calls] {call['name']}({call['arguments']})")
        blocks.append("\n".join(lines) or f"[{role}]")
    return "\n".join(blocks)


# --- finding the functions -------------------------------------------------------------------------------


def load_functions(spec: str) -> list[Callable[..., Any]]:
    """The functions ``FILE.py[:NAME,...]`` or ``package.module[:NAME,...]`` names, in that order."""
    where, _, names = spec.partition(":") if not _is_windows_drive(spec) else (spec, "", "")
    if not where:
        raise InputError(f"{spec!r} names no file or module: use FILE.py:NAME or package.module:NAME")
    module = _load_module(where)
    if names:
        wanted = [name.strip() for name in names.split(",") if name.strip()]
        if not wanted:
            raise InputError(f"{spec!r} names no function after the colon")
        return [_function(module, where, name) for name in wanted]
    listed = getattr(module, "TOOLS", None)
    if listed is not None:
        if not isinstance(listed, (list, tuple)) or not all(callable(f) for f in listed):
            raise InputError(f"TOOLS in {where} must be a list of functions")
        return list(listed)
    found: list[Callable[..., Any]] = [
        value
        for name, value in vars(module).items()
        if inspect.isfunction(value) and not name.startswith("_") and value.__module__ == module.__name__
    ]
    if not found:
        raise InputError(f"{where} defines no public function (name some with {where}:NAME)")
    return found


def _is_windows_drive(spec: str) -> bool:
    return len(spec) > 2 and spec[1] == ":" and spec[0].isalpha() and spec[2] in "\\/" and spec.count(":") == 1


def _load_module(where: str) -> ModuleType:
    path = Path(where)
    if where.endswith(".py") or path.exists():
        if not path.is_file():
            raise InputError(f"Python file {where} does not exist")
        name = "_chatcodec_tools_" + re.sub(r"\W", "_", path.stem)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise InputError(f"{where} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pydantic look their module up while the file runs
        sys.path.insert(0, str(path.resolve().parent))  # so that the file can import its neighbours
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ChatcodecError(f"Running {where} failed: {type(exc).__name__}: {exc}") from None
        finally:
            sys.path.remove(str(path.resolve().parent))
        return module
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        raise InputError(f"No Python file or module {where!r} ({exc})") from None
    except Exception as exc:
        raise ChatcodecError(f"Importing {where} failed: {type(exc).__name__}: {exc}") from None


def _function(module: ModuleType, where: str, name: str) -> Callable[..., Any]:
    value = getattr(module, name, None)
    if value is None:
        public = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise InputError(f"{where} has no function {name!r} (its functions: {', '.join(public) or 'none'})")
    if not callable(value):
        raise InputError(f"{name} in {where} is a {type(value).__name__}, not a function")
    return typing.cast("Callable[..., Any]", value)
