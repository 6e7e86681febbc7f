"""``chatcodec tokenize``: print a conversation's token ids, or show its tokens, mask and per-message counts.

Wired into the ``chatcodec`` command by :func:`configure` (it adds the arguments and the handler to a
sub-parser); :func:`main` runs it on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .exceptions import ChatcodecError, InputError, MaskError
from .tokens import Encoding, load

__all__ = ["configure", "main", "show_encoding"]

HELP = "encode messages into token ids; --show colours the tokens, the assistant mask and per-message counts"
_STYLE = {
    "even": "\x1b[48;5;236m",
    "odd": "\x1b[48;5;239m",
    "masked": "\x1b[1;32m",
    "escaped": "\x1b[4m",
    "dim": "\x1b[2m",
    "reset": "\x1b[0m",
}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``tokenize``'s arguments and handler to ``parser`` (a sub-parser of ``chatcodec``)."""
    parser.description = (
        "Render a chat (a list of messages or an OpenAI request body) with a model's template and tokenize it."
        " Prints the ids, one line, space-separated."
    )
    parser.add_argument("model", help="model folder with tokenizer.json (and its chat template)")
    parser.add_argument("file", nargs="?", default="-", help="JSON file with the messages; - or nothing for stdin")
    parser.add_argument("--add-generation-prompt", action="store_true", help="open an assistant turn at the end")
    parser.add_argument(
        "--content-special-tokens",
        choices=["escape", "reject", "allow"],
        default="escape",
        help="what a control token inside content becomes (default: escape, i.e. plain text)",
    )
    parser.add_argument("--show", action="store_true", help="show tokens, the assistant mask and per-message counts")
    parser.add_argument("--json", action="store_true", help="print ids, mask and per-message counts as JSON")
    parser.add_argument("--no-reasoning", action="store_true", help="leave reasoning out of the mask")
    parser.set_defaults(handler=run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``chatcodec tokenize`` with ``argv``; every chatcodec error is one line on stderr and exit code 2."""
    parser = argparse.ArgumentParser(prog="chatcodec tokenize")
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ChatcodecError as exc:
        print(f"chatcodec: error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    """The command itself: errors are raised as :class:`~chatcodec.ChatcodecError` for the caller to print."""
    request = _read_request(args.file)
    codec = load(args.model)
    encoding = codec.encode(
        request["messages"],
        tools=request.get("tools"),
        documents=request.get("documents"),
        add_generation_prompt=args.add_generation_prompt or bool(request.get("add_generation_prompt")),
        content_special_tokens=args.content_special_tokens,
        **dict(request.get("chat_template_kwargs") or {}),
    )
    if args.json:
        mask, note = _mask(encoding, reasoning=not args.no_reasoning)
        out: dict[str, Any] = {"input_ids": encoding.input_ids, "assistant_mask": mask}
        if note:
            out["mask_error"] = note
        out["message_token_counts"] = _counts(encoding)
        print(json.dumps(out))
    elif args.show:
        color = sys.stdout.isatty() or (bool(os.environ.get("FORCE_COLOR")) and not os.environ.get("NO_COLOR"))
        roles = [m.get("role", "?") if isinstance(m, dict) else "?" for m in request["messages"]]
        print(show_encoding(encoding, roles, color=color, reasoning=not args.no_reasoning))
    else:
        print(" ".join(map(str, encoding.input_ids)))
    return 0


def show_encoding(encoding: Encoding, roles: Sequence[str], *, color: bool, reasoning: bool = True) -> str:
    """Tokens for a person to read: boundaries, masked tokens, escaped text, then counts per message.

    With colour, tokens alternate two backgrounds and masked ones are green; without, tokens are
    separated by ``|`` and masked ones wrapped in ``[...]``.
    """
    mask, note = _mask(encoding, reasoning=reasoning)
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
    supervised = sum(mask)
    lines.append(
        f"{len(encoding.input_ids)} tokens, {supervised} in the assistant mask" + (f" ({note})" if note else "")
    )
    if escaped:
        lines.append(f"{len(escaped)} control token(s) in content encoded as plain text")
    counts = _counts(encoding)
    if counts is not None:
        for index, count in enumerate(counts):
            role = roles[index] if index < len(roles) else "?"
            lines.append(f"  message {index:<3} {role:<10} {count:>6} tokens")
        rest = len(encoding.input_ids) - sum(counts)
        if rest:
            lines.append(f"  {'(template)':<22} {rest:>6} tokens")
    return "\n".join(lines)


def _mask(encoding: Encoding, *, reasoning: bool) -> tuple[list[int], str | None]:
    try:
        return encoding.mask(reasoning=reasoning), None
    except MaskError as exc:
        return [0] * len(encoding.input_ids), str(exc)


def _counts(encoding: Encoding) -> list[int] | None:
    try:
        return encoding.message_token_counts
    except MaskError:
        return None


def _read_request(path: str) -> dict[str, Any]:
    label = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"Cannot read the messages from {label}: {exc}.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{label} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from None
    request = {"messages": data} if isinstance(data, list) else data
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        raise InputError(f'{label} must hold a list of messages or a request body with "messages".')
    return request


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
