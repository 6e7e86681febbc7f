"""``chatcodec tokenize``: a chat's token ids, or its tokens, assistant mask and per-message counts."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from ..tokens import Encoding
from . import common

__all__ = ["configure", "run", "show_encoding"]

_STYLE = {
    "even": "\x1b[48;5;236m",
    "odd": "\x1b[48;5;239m",
    "masked": "\x1b[1;32m",
    "escaped": "\x1b[4m",
    "dim": "\x1b[2m",
    "reset": "\x1b[0m",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Render a chat (a list of messages or an OpenAI request body) with a model's template and tokenize it"
        " with its tokenizer. Prints the ids, one line, space-separated."
    )
    common.add_request_input(parser)
    common.add_template_options(parser, default_note="default: the template beside --tokenizer")
    common.add_variable_options(parser)
    common.add_render_options(parser)
    parser.add_argument(
        "--content-special-tokens",
        choices=["escape", "reject", "allow"],
        default="escape",
        help="what a control token inside content becomes (default: escape, i.e. plain text)",
    )
    parser.add_argument("--no-reasoning", action="store_true", help="leave reasoning out of the mask")
    common.add_output_options(
        parser,
        json_help="print ids, the assistant mask and per-message token counts as JSON",
        show_help="show the tokens, the assistant mask and per-message counts",
    )
    common.add_limit_options(parser)


def run(args: argparse.Namespace) -> int:
    request = common.read_request(args.file)
    variables = common.variables_from(args, request)
    options = common.render_options_from(args, request)
    codec = common.codec_from(args)
    encoding = codec.encode(
        request.messages, content_special_tokens=args.content_special_tokens, **options, **variables
    )
    reasoning = not args.no_reasoning
    if args.json:
        mask = encoding.mask(reasoning=reasoning)
        out: dict[str, Any] = {
            "input_ids": encoding.input_ids,
            "assistant_mask": mask,
            "message_token_counts": encoding.message_token_counts,
        }
        print(json.dumps(out))
    elif args.show:
        roles = [m["role"] for m in request.messages]
        print(show_encoding(encoding, roles, color=common.color_wanted(), reasoning=reasoning))
    else:
        print(" ".join(map(str, encoding.input_ids)))
    return 0


def show_encoding(encoding: Encoding, roles: Sequence[str], *, color: bool, reasoning: bool = True) -> str:
    """Tokens for a person to read: boundaries, masked tokens, escaped text, then counts per message.

    With colour, tokens alternate two backgrounds and masked ones are green; without, tokens are
    separated by ``|`` and masked ones wrapped in ``[...]``.
    """
    mask = encoding.mask(reasoning=reasoning)
    escaped = encoding.escaped
    lines = []
    pieces = []
    for index, ((start, end), masked) in enumerate(zip(encoding.offsets, mask, strict=True)):
        text = encoding.text[start:end].replace("\n", "↵\n") if end > start else "∅"
        is_escaped = any(a < end and start < b for a, b in escaped)
        if color:
            style = _STYLE["even" if index % 2 == 0 else "odd"]
            style += _STYLE["masked"] if masked else ""
            style += _STYLE["escaped"] if is_escaped else ""
            pieces.append(f"{style}{text}{_STYLE['reset']}")
        else:
            pieces.append(f"[{text}]" if masked else text)
    lines.append(("" if color else "|").join(pieces))
    lines.append("")
    lines.append(f"{len(encoding.input_ids)} tokens, {sum(mask)} in the assistant mask")
    if escaped:
        lines.append(f"{len(escaped)} control token(s) in content encoded as plain text")
    counts = encoding.message_token_counts
    for index, count in enumerate(counts):
        role = roles[index] if index < len(roles) else "?"
        lines.append(f"  message {index:<3} {role:<10} {count:>6} tokens")
    rest = len(encoding.input_ids) - sum(counts)
    if rest:
        lines.append(f"  {'(template)':<22} {rest:>6} tokens")
    return "\n".join(lines)
