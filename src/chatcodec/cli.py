"""The ``chatcodec`` command: thin wrappers that parse arguments, call the library, and print.

Every user mistake (a bad file, bad JSON, an unknown template, a template that refuses the input) is
reported as one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from . import __version__
from .exceptions import ChatcodecError, InputError
from .render import ChatTemplate
from .templates import builtin_templates, load_template

__all__ = ["main"]

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        result: int = args.handler(args)
        return result
    except ChatcodecError as exc:
        return fail(str(exc))
    except BrokenPipeError:
        # `chatcodec render ... | head` closed the pipe early: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


def fail(message: str) -> int:
    """Print ``message`` as the command's one error line; returns the exit code."""
    first_line = message.strip().splitlines()[0] if message.strip() else "failed"
    print(f"chatcodec: error: {first_line}", file=sys.stderr)
    return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatcodec",
        description="Chat messages to model prompts and tokens, and model output back to messages.",
    )
    parser.add_argument("--version", action="version", version=f"chatcodec {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    render = commands.add_parser(
        "render",
        help="render messages into the exact prompt a model expects",
        description="Render a chat (an OpenAI request body or a bare list of messages) into the model's prompt. "
        "The prompt is written to stdout byte for byte, with no newline added.",
    )
    render.add_argument("file", nargs="?", default="-", help="JSON file with the messages; - or nothing for stdin")
    render.add_argument(
        "--template",
        "-t",
        metavar="NAME|PATH",
        default="chatml",
        help="built-in name (see `chatcodec templates`), model folder or template file (default: chatml)",
    )
    render.add_argument(
        "--add-generation-prompt",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="open an assistant turn at the end (default: on, or the request's add_generation_prompt)",
    )
    render.add_argument(
        "--continue-final-message",
        action="store_true",
        default=None,
        help="leave the final message open for the model to continue (turns the generation prompt off)",
    )
    render.add_argument("--tools", metavar="FILE", help="JSON file with a list of tools (OpenAI format)")
    render.add_argument(
        "--var",
        metavar="KEY=JSON",
        action="append",
        default=[],
        help="a template variable, e.g. --var enable_thinking=false (repeatable)",
    )
    render.add_argument("--now", metavar="ISO-DATE", help="pin the template's clock, e.g. 2026-11-29T12:00")
    render.add_argument("--show", action="store_true", help="print for a person: special tokens and roles coloured")
    render.set_defaults(handler=_cmd_render)

    templates = commands.add_parser("templates", help="list the built-in templates")
    templates.set_defaults(handler=_cmd_templates)

    for name, (help_text, configure) in _extra_commands().items():
        sub = commands.add_parser(name, help=help_text)
        configure(sub)
    return parser


def _extra_commands() -> dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]]:
    """Commands whose logic lives beside the capability they drive: name -> (help, configure(subparser))."""
    from . import tokenize_cli
    from .decoders import cli as decode_cli

    return {
        "decode": (decode_cli.HELP, decode_cli.configure),
        "tokenize": (tokenize_cli.HELP, tokenize_cli.configure),
    }


# --- reading input ---------------------------------------------------------------------------------


def read_json(path: str, what: str) -> Any:
    """Parse JSON from ``path`` (``-`` for stdin), failing with one clear line."""
    label = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what} from {label}: {exc}") from None
    if not text.strip():
        raise InputError(f"{what} input ({label}) is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{label} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None


def chat_request(data: Any, label: str) -> dict[str, Any]:
    """Normalise a bare message list or an OpenAI chat request body to ``{"messages": [...], ...}``."""
    request = {"messages": data} if isinstance(data, list) else data
    if not isinstance(request, dict) or "messages" not in request:
        raise InputError(f'{label} must hold a list of messages or a request body with "messages"')
    messages = request["messages"]
    if not isinstance(messages, list) or not messages:
        raise InputError(f'"messages" in {label} must be a non-empty list')
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InputError(f"message {index} in {label} is {type(message).__name__}, not an object")
        if not isinstance(message.get("role"), str):
            raise InputError(f'message {index} in {label} has no "role"')
    return request


def template_variables(assignments: Sequence[str]) -> dict[str, Any]:
    variables = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key.isidentifier():
            raise InputError(f"--var takes KEY=JSON, e.g. --var enable_thinking=false; got {assignment!r}")
        try:
            variables[key] = json.loads(raw)
        except json.JSONDecodeError:
            variables[key] = raw  # a bare word is meant as a string: --var reasoning_effort=high
    return variables


def parse_now(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InputError(f"--now takes an ISO date or date-time such as 2026-11-29T12:00, not {text!r}") from None


# --- render ------------------------------------------------------------------------------------------


def _cmd_render(args: argparse.Namespace) -> int:
    label = "stdin" if args.file == "-" else args.file
    request = chat_request(read_json(args.file, "messages"), label)
    template = load_template(args.template)
    tools = read_json(args.tools, "tools") if args.tools else request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InputError("tools must be a JSON list")

    variables = dict(request.get("chat_template_kwargs") or {})
    variables.update(template_variables(args.var))
    continue_final = _first(args.continue_final_message, request.get("continue_final_message"), False)
    add_generation_prompt = _first(args.add_generation_prompt, request.get("add_generation_prompt"), not continue_final)
    prompt = template.render(
        request["messages"],
        tools=tools,
        documents=request.get("documents"),
        add_generation_prompt=bool(add_generation_prompt),
        continue_final_message=bool(continue_final),
        now=parse_now(args.now),
        **variables,
    )
    if args.show:
        sys.stdout.write(show_prompt(prompt, template, color=color_wanted()) + "\n")
    else:
        sys.stdout.buffer.write(prompt.encode("utf-8"))
    sys.stdout.flush()
    return 0


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def color_wanted() -> bool:
    """Colour on a terminal, or when FORCE_COLOR is set; never when NO_COLOR is."""
    if os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty() or bool(os.environ.get("FORCE_COLOR"))


#: text that looks like a control token: <|...|>, <｜...｜>, [INST]-style, <start_of_turn>-style, <s>, </s>
_CONTROL = re.compile(
    r"<\|[^|<>\s]{1,40}\|>|<｜[^｜<>]{1,40}｜>|\[/?[A-Z_]{2,30}\]|</?[a-z_]{1,20}_of_[a-z_]{1,20}>|</?s>"
)
_ROLE = re.compile(r"(?<=<\|im_start\|>)[a-z_]+|(?<=<\|start_header_id\|>)[a-z_]+|(?<=<start_of_turn>)[a-z_]+")
_STYLES = {"token": "\x1b[1;35m", "role": "\x1b[1;36m", "space": "\x1b[2m", "reset": "\x1b[0m"}


def show_prompt(prompt: str, template: ChatTemplate, *, color: bool) -> str:
    """The prompt for a person to read: control tokens and role names stand out; invisible ends are shown."""
    tokens = sorted({t for t in template.special_tokens.values() if t}, key=len, reverse=True)
    alternatives = "|".join([*map(re.escape, tokens), _CONTROL.pattern])
    pattern = re.compile(f"(?P<token>{alternatives})|(?P<role>{_ROLE.pattern})")
    out = []
    last = 0
    for match in pattern.finditer(prompt):
        out.append(prompt[last : match.start()])
        kind = match.lastgroup or "token"
        out.append(f"{_STYLES[kind]}{match.group()}{_STYLES['reset']}" if color else match.group())
        last = match.end()
    out.append(prompt[last:])
    text = "".join(out)
    # trailing whitespace matters to the model and is invisible on a terminal: mark where the prompt ends
    end = "⏎" if prompt.endswith("\n") else "∎"
    return text + (f"{_STYLES['space']}{end}{_STYLES['reset']}" if color else end)


# --- templates ---------------------------------------------------------------------------------------


def _cmd_templates(args: argparse.Namespace) -> int:
    entries = builtin_templates()
    width = max(len(name) for name in entries)
    for entry in entries.values():
        print(f"{entry.name:<{width}}  {entry.description}")
        print(f"{'':<{width}}  source: {entry.source}; license: {entry.license}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
