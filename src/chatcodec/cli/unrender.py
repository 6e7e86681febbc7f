"""``chatcodec unrender``: a rendered prompt back into the messages that render it, as a request body; or
a JSON-lines dataset of rendered texts back into chats, one line for one line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..exceptions import InputError, PromptMismatchError
from ..render import ChatTemplate
from ..unrender import ParsedConversation, parse_conversation
from . import common

__all__ = ["configure", "run"]

#: exit code when some lines of a dataset were not read (their lines say why); 2 stays the usage error
EXIT_UNREAD = 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read a rendered prompt (a file, or stdin) and print the conversation that renders it, as a request body:"
        " messages, add_generation_prompt and continue_final_message. `chatcodec render` gives the prompt back"
        " from it byte for byte; a prompt the template does not render is an error (exit 2) that says where it"
        " stops following the template. A .jsonl file is a dataset: each line's --field text becomes that"
        " line's messages (its other fields kept; its tools and chat_template_kwargs, if any, used to read it);"
        " a line that is not read keeps its text and gets"
        ' "unrender_error", and the exit code is 1.'
    )
    parser.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE",
        help="the prompt, as UTF-8 text, or a .jsonl dataset of them; - or nothing for stdin (one prompt)",
    )
    common.add_template_options(parser, default_note=f"default: the built-in {common.DEFAULT_TEMPLATE}")
    common.add_variable_options(parser)
    parser.add_argument(
        "--now", metavar="ISO-DATE", help="the clock the prompt was rendered with, for templates that write the date"
    )
    parser.add_argument(
        "--allow-markup",
        action="store_true",
        help="take a reading whose texts hold the template's own markup (control tokens typed into a message);"
        " by default such a prompt is refused, as another template's prompt would be",
    )
    parser.add_argument(
        "--field", default="text", metavar="NAME", help="with a .jsonl dataset: the field holding the text (text)"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (there is none off a terminal anyway)"
    )
    common.add_limit_options(parser)


def run(args: argparse.Namespace) -> int:
    template = common.template_from(args)
    options = common.variables_from(args)
    now = common.parse_now(args.now)
    if now is not None:
        options["now"] = now
    options["tools"] = common.tools_from(args)
    options["strict"] = not args.allow_markup
    if args.file.endswith(".jsonl"):
        return _dataset(args, template, options)
    parsed = parse_conversation(template, _read_prompt(args.file), **options)
    sys.stdout.write(json.dumps(_body(parsed), ensure_ascii=False, indent=2) + "\n")
    return 0


def _body(parsed: ParsedConversation) -> dict[str, Any]:
    return {
        "messages": parsed.messages,
        "add_generation_prompt": parsed.add_generation_prompt,
        "continue_final_message": parsed.continue_final_message,
    }


def _dataset(args: argparse.Namespace, template: ChatTemplate, options: dict[str, Any]) -> int:
    """Each line's text read back, written as the line with its messages instead; unread lines say why."""
    from rich.console import Console
    from rich.progress import track

    rows = _read_rows(args.file, args.field)
    unread = []
    out = sys.stdout
    show = not args.no_progress and sys.stderr.isatty()
    for number, row in track(rows, description="reading", console=Console(stderr=True), disable=not show):
        variables = row.get("chat_template_kwargs")
        given = {
            **options,
            "tools": row.get("tools", options["tools"]),
            **(variables if isinstance(variables, dict) else {}),
        }
        try:
            parsed = parse_conversation(template, row[args.field], **given)
        except PromptMismatchError as exc:
            unread.append(number)
            out.write(json.dumps({**row, "unrender_error": exc.message}, ensure_ascii=False) + "\n")
            continue
        kept = {key: value for key, value in row.items() if key != args.field}
        out.write(json.dumps({**kept, **_body(parsed)}, ensure_ascii=False) + "\n")
    lines = f" (line{'s' * (len(unread) > 1)} {', '.join(map(str, unread[:20]))})" if unread else ""
    common.note(f"read {len(rows) - len(unread)} of {len(rows)} texts; {len(unread)} not read{lines}")
    return EXIT_UNREAD if unread else 0


def _read_rows(path: str, field: str) -> list[tuple[int, dict[str, Any]]]:
    rows = common.read_jsonl(path, "texts")
    for number, row in rows:
        if not isinstance(row.get(field), str):
            raise InputError(f"{path} line {number} must be a JSON object with a text in {field!r}")
    if not rows:
        raise InputError(f"{path} holds no texts")
    return rows


def _read_prompt(path: str) -> str:
    """The file's (or stdin's) text exactly as stored, no newline translated."""
    return common.read_text(path, "the prompt")
