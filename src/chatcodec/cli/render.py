"""``chatcodec render``: a chat into the exact prompt the model expects, byte for byte on stdout."""

from __future__ import annotations

import argparse
import json
import re
import sys

from ..render import ChatTemplate
from . import common

__all__ = ["configure", "run", "show_prompt"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Render a chat (a list of messages or an OpenAI request body) into the model's prompt. The prompt is"
        " written to stdout byte for byte, with no newline added."
    )
    common.add_request_input(parser)
    common.add_template_options(parser, default_note=f"default: the built-in {common.DEFAULT_TEMPLATE}")
    common.add_variable_options(parser)
    common.add_render_options(parser)
    common.add_output_options(
        parser,
        json_help='print {"prompt": ..., "template": ...} as JSON',
        show_help="print for a person: special tokens and roles coloured, the end of the prompt marked",
    )
    common.add_limit_options(parser)


def run(args: argparse.Namespace) -> int:
    request = common.read_request(args.file)
    variables = common.variables_from(args, request)
    options = common.render_options_from(args, request)
    template = common.template_from(args)
    prompt, applied = template.render_with_report(request.messages, **options, **variables)
    if applied:
        common.note(f"polyfills applied: {', '.join(applied)}")
    if args.json:
        result: dict[str, object] = {"prompt": prompt, "template": template.name}
        if options["polyfill"]:
            result["polyfills"] = list(applied)
        sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
    elif args.show:
        sys.stdout.write(show_prompt(prompt, template, color=common.color_wanted()) + "\n")
    else:
        sys.stdout.buffer.write(prompt.encode("utf-8"))
    sys.stdout.flush()
    return 0


#: text that looks like a control token: <|...|>, <｜...｜>, [INST]-style, <start_of_turn>-style, <s>, </s>
_CONTROL = re.compile(
    r"<\|[^|<>\s]{1,40}\|>|<｜[^｜<>]{1,40}｜>|\[/?[A-Z_]{2,30}\]|</?[a-z_]{1,20}_of_[a-z_]{1,20}>|</?s>"
)
_ROLE = re.compile(r"(?<=<\|im_start\|>)[a-z_]+|(?<=<\|start_header_id\|>)[a-z_]+|(?<=<start_of_turn>)[a-z_]+")
_STYLES = {"token": "\x1b[1;35m", "role": "\x1b[1;36m", "space": "\x1b[2m", "reset": "\x1b[0m"}


def show_prompt(prompt: str, template: ChatTemplate, *, color: bool) -> str:
    """The prompt for a person to read: control tokens and role names stand out; invisible ends are shown.

    >>> from chatcodec import load_template
    >>> show_prompt("<|im_start|>user\\nHi<|im_end|>\\n", load_template("chatml"), color=False)
    '<|im_start|>user\\nHi<|im_end|>\\n⏎'
    """
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
