"""``chatcodec unrender``: a rendered prompt back into the messages that render it, as a request body."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..exceptions import InputError
from ..unrender import parse_conversation
from . import common

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read a rendered prompt (a file, or stdin) and print the conversation that renders it, as a request body:"
        " messages, add_generation_prompt and continue_final_message. `chatcodec render` gives the prompt back"
        " from it byte for byte; a prompt the template does not render is an error (exit 2) that says where it"
        " stops following the template."
    )
    parser.add_argument(
        "file", nargs="?", default="-", metavar="FILE", help="the prompt, as UTF-8 text; - or nothing for stdin"
    )
    common.add_template_options(parser, default_note=f"default: the built-in {common.DEFAULT_TEMPLATE}")
    common.add_variable_options(parser)
    parser.add_argument(
        "--now", metavar="ISO-DATE", help="the clock the prompt was rendered with, for templates that write the date"
    )
    common.add_limit_options(parser)


def run(args: argparse.Namespace) -> int:
    prompt = _read_prompt(args.file)
    template = common.template_from(args)
    variables = common.variables_from(args)
    now = common.parse_now(args.now)
    if now is not None:
        variables["now"] = now
    parsed = parse_conversation(template, prompt, tools=common.tools_from(args), **variables)
    body: dict[str, object] = {
        "messages": parsed.messages,
        "add_generation_prompt": parsed.add_generation_prompt,
        "continue_final_message": parsed.continue_final_message,
    }
    sys.stdout.write(json.dumps(body, ensure_ascii=False, indent=2) + "\n")
    return 0


def _read_prompt(path: str) -> str:
    """The prompt's text exactly as stored (no newline translated): stdin's bytes or the file's."""
    label = "stdin" if path == "-" else path
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"prompt file {path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"prompt file {path} is a folder, not a text file") from None
    except OSError as exc:
        raise InputError(f"cannot read the prompt from {label}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"the prompt in {label} is not UTF-8 text (byte {exc.start})") from None
