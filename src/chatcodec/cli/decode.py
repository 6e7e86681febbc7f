"""``chatcodec decode``: a completion on stdin into an OpenAI assistant message, or into streaming deltas.

printf '<tool_call>{"name": "f", "arguments": {}}</tool_call>' | chatcodec decode --format hermes
some-model | chatcodec decode --template qwen3 --stream
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
import warnings
from collections.abc import Iterator
from typing import IO, Any

from ..decoders import AssistantMessage, Decoder, decoder, decoder_for
from ..decoders.catalog import ALIASES, REASONING_PARSERS
from ..decoders.registry import REASONING_FORMATS, formats, get_format
from ..exceptions import DecodeError, DecodeWarning, InputError
from . import common

__all__ = ["configure", "run", "show_message"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read a model completion from stdin and print the OpenAI assistant message as JSON, or with --stream"
        " one JSON delta per line as the text arrives. Choose the format with --format, or let --template (or"
        " --tokenizer) detect it from a chat template, and whether its prompt opens a think block."
    )
    parser.add_argument(
        "--format",
        "--tool-call-parser",
        "-f",
        metavar="NAME",
        help="output format (see --list-formats); vLLM --tool-call-parser and llama.cpp format names work too",
    )
    parser.add_argument(
        "--reasoning-parser",
        metavar="NAME",
        help="a vLLM --reasoning-parser name: its think tags and start state replace the format's",
    )
    common.add_template_options(parser, default_note="to detect the format from; instead of --format")
    parser.add_argument("--list-formats", action="store_true", help="print the formats and exit")
    parser.add_argument("--stream", action="store_true", help="print OpenAI streaming deltas as JSON lines")
    parser.add_argument(
        "--chunk-size", type=common.positive_int, metavar="N", help="with --stream, feed stdin N bytes at a time"
    )
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
    common.add_variable_options(parser)
    parser.add_argument("--tag", help="the tool-call tag, for Ollama's template-tag formats")
    common.add_output_options(
        parser,
        json_help="print the message as JSON (the default)",
        show_help="print the message for a person: reasoning, content and each tool call",
    )
    common.add_limit_options(parser)


def run(args: argparse.Namespace, stdin: IO[bytes] | None = None, stdout: IO[str] | None = None) -> int:
    """The ``decode`` command; ``stdin`` and ``stdout`` default to the process's."""
    out = stdout or sys.stdout
    if args.list_formats:
        width = max(map(len, formats()))
        for name in formats():
            out.write(f"{name:<{width}}  {get_format(name).summary}\n")
        out.write("\nalso accepted (vLLM --tool-call-parser and llama.cpp names):\n")
        for alias, name in sorted(ALIASES.items()):
            out.write(f"  {alias!r} -> {name}\n")
        out.write(f"\n--reasoning-parser (vLLM names): {', '.join(sorted(REASONING_PARSERS))}\n")
        return 0
    if args.chunk_size is not None and not args.stream:
        raise DecodeError("--chunk-size feeds the stream: it needs --stream.")
    chosen = _decoder(args)
    data = stdin or sys.stdin.buffer
    if args.stream:
        stream = chosen.stream()
        for chunk in _chunks(data, args.chunk_size):
            _print_deltas(out, stream.feed(chunk))
        _print_deltas(out, stream.finish())
        _warn(stream.message)
        return 0
    message = chosen.decode(b"".join(_chunks(data, None)).decode("utf-8"))
    if args.show:
        out.write(show_message(message) + "\n")
    else:
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
    tools = common.tools_from(args)
    if tools is not None:
        options["tools"] = tools
    if args.format and (args.template or args.tokenizer):
        raise DecodeError("Give --format or --template/--tokenizer, not both: the template picks the format.")
    variables = common.variables_from(args)
    if args.format:
        if variables:
            raise DecodeError("--var and --vars are the template's variables: they need --template, not --format.")
        return decoder(args.format, reasoning_parser=args.reasoning_parser, **options)
    if args.reasoning_parser is not None:
        raise DecodeError("--reasoning-parser goes with --format (a tool-call format); a template has its own tags.")
    if args.template or args.tokenizer:
        template = common.template_from(args)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DecodeWarning)
            chosen = decoder_for(template, chat_template_kwargs=variables or None, **options)
        for warning in caught:
            print(f"chatcodec: warning: {warning.message}", file=sys.stderr)
        return chosen
    raise DecodeError("Say which format to decode: --format NAME, or --template NAME|PATH to detect it.")


def _chunks(data: IO[bytes], size: int | None) -> Iterator[bytes]:
    """Stdin as it arrives (or in ``size``-byte pieces), never waiting for more than is there.

    Checked on the way: it must be UTF-8 text (a completion is text; binary input is an error, not U+FFFD),
    and at most ``--max-input`` bytes in all.
    """
    read = getattr(data, "read1", data.read)
    check = codecs.getincrementaldecoder("utf-8")()
    seen, limit = 0, common.input_limit()
    while True:
        block = read(65536)
        pending = len(check.getstate()[0])  # the start of a character the last block ended inside
        try:
            check.decode(block, final=not block)
        except UnicodeDecodeError as exc:
            raise InputError(
                f"stdin is not UTF-8 text (byte {seen - pending + exc.start}): decode reads a completion as text"
            ) from None
        if not block:
            return
        seen += len(block)
        if seen > limit:
            raise InputError(f"stdin is over {limit:,} bytes, the input limit; raise it with --max-input SIZE")
        if size is None:
            yield block
        else:
            for k in range(0, len(block), size):
                yield block[k : k + size]


def _print_deltas(out: IO[str], deltas: list[Any]) -> None:
    for delta in deltas:
        out.write(json.dumps(delta.to_openai(), ensure_ascii=False) + "\n")
    out.flush()


def show_message(message: AssistantMessage) -> str:
    """The message for a person to read: reasoning, content, then each tool call with its arguments."""
    lines = []
    if message.reasoning_content:
        lines += ["reasoning:", message.reasoning_content, ""]
    if message.content:
        lines += ["content:", message.content, ""]
    for call in sorted((*message.tool_calls, *message.invalid_tool_calls), key=lambda c: c.index):
        if call.error is None:
            lines += [f"tool call {call.index}: {call.name}", json.dumps(call.arguments, ensure_ascii=False, indent=2)]
        else:
            lines += [f"tool call {call.index}: {call.name} (invalid: {call.error})", call.raw]
        lines.append("")
    return "\n".join(lines).rstrip("\n") or "(empty message)"


def _warn(message: AssistantMessage) -> None:
    for call in message.invalid_tool_calls:
        print(f"chatcodec: warning: tool call {call.index} ({call.name}) is invalid: {call.error}", file=sys.stderr)
