"""``chatcodec decode``: turn a completion on stdin into an OpenAI message, or into streaming deltas.

Wired into the ``chatcodec`` command by :func:`configure` (it adds the arguments and the handler to a
sub-parser); :func:`main` runs it on its own::

    printf '<tool_call>{"name": "f", "arguments": {}}</tool_call>' | chatcodec decode --format hermes
    some-model | chatcodec decode --template qwen3 --stream
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

from .. import cli as command
from ..exceptions import DecodeError
from .base import AssistantMessage
from .registry import REASONING_FORMATS, Decoder, decoder, formats, get_format

__all__ = ["HELP", "configure", "main"]

HELP = "decode a completion (stdin) into content, reasoning and tool calls; --stream prints deltas"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``decode``'s arguments and handler to ``parser`` (a sub-parser of ``chatcodec``)."""
    parser.description = (
        "Read a model completion from stdin and print the OpenAI assistant message as JSON, or with"
        " --stream one JSON delta per line as the text arrives. Choose the format with --format, or let"
        " --template detect it from a chat template (and whether its prompt opens a think block)."
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--format", "-f", metavar="NAME", help="output format (see --list-formats)")
    source.add_argument("--template", "-t", metavar="NAME|PATH", help="chat template to detect the format from")
    source.add_argument("--list-formats", action="store_true", help="print the formats and exit")
    parser.add_argument("--stream", action="store_true", help="print OpenAI streaming deltas as JSON lines")
    parser.add_argument("--chunk-size", type=int, metavar="N", help="with --stream, feed stdin N bytes at a time")
    parser.add_argument(
        "--reasoning-format",
        choices=REASONING_FORMATS,
        default="auto",
        help="none keeps reasoning (and its tags) in content (default: auto)",
    )
    parser.add_argument(
        "--thinking-forced-open",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the prompt already opened the think block (default: from the template or format)",
    )
    parser.add_argument(
        "--enable-thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the enable_thinking the prompt was rendered with",
    )
    parser.add_argument(
        "--tools",
        metavar="FILE",
        help="JSON tools list (or a request with 'tools'): names "
        "are checked and XML-style argument values typed by their schemas",
    )
    parser.add_argument("--tag", help="the tool-call tag, for Ollama's template-tag formats")
    parser.set_defaults(handler=run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``chatcodec decode`` on its own; every chatcodec error is one line on stderr and exit code 2."""
    return command.main(["decode", *(sys.argv[1:] if argv is None else argv)])


def run(args: argparse.Namespace, stdin: IO[bytes] | None = None, stdout: IO[str] | None = None) -> int:
    """The ``decode`` command: errors in what the user gave raise :class:`ChatcodecError`."""
    out = stdout or sys.stdout
    if args.list_formats:
        width = max(map(len, formats()))
        for name in formats():
            out.write(f"{name:<{width}}  {get_format(name).summary}\n")
        return 0
    chosen = _decoder(args)
    data = stdin or sys.stdin.buffer
    if args.stream:
        stream = chosen.stream()
        for chunk in _chunks(data, args.chunk_size):
            _print_deltas(out, stream.feed(chunk))
        _print_deltas(out, stream.finish())
        _warn(stream.message)
        return 0
    message = chosen.decode(data.read())
    out.write(json.dumps(message.to_openai(), ensure_ascii=False, indent=2) + "\n")
    _warn(message)
    return 0


def _decoder(args: argparse.Namespace) -> Decoder:
    options: dict[str, Any] = {
        "reasoning_format": args.reasoning_format,
        "thinking_forced_open": args.thinking_forced_open,
        "enable_thinking": args.enable_thinking,
        "tag": args.tag,
    }
    if args.tools:
        options["tools"] = _read_tools(args.tools)
    if args.format:
        return decoder(args.format, **options)
    if args.template:
        from ..templates import load_template
        from .detect import decoder_for

        return decoder_for(load_template(args.template), **options)
    raise DecodeError("Say which format to decode: --format NAME, or --template NAME|PATH to detect it.")


def _read_tools(path: str) -> list[Any]:
    data = command.read_json(path, "tools")
    tools = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(tools, list):
        raise DecodeError(f"The tools file {path!r} must hold a list of tools, or a request with 'tools'.")
    return tools


def _chunks(data: IO[bytes], size: int | None) -> Iterator[bytes]:
    """Stdin as it arrives (or in ``size``-byte pieces), never waiting for more than is there."""
    read = getattr(data, "read1", data.read)
    while True:
        block = read(65536)
        if not block:
            return
        if size is None or size <= 0:
            yield block
        else:
            for k in range(0, len(block), size):
                yield block[k : k + size]


def _print_deltas(out: IO[str], deltas: list[Any]) -> None:
    for delta in deltas:
        out.write(json.dumps(delta.to_openai(), ensure_ascii=False) + "\n")
    out.flush()


def _warn(message: AssistantMessage) -> None:
    for i, call in enumerate(message.tool_calls):
        if call.error:
            print(f"chatcodec: warning: tool call {i} ({call.name}): {call.error}", file=sys.stderr)
