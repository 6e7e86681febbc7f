"""``chatcodec inspect``: what a template supports, found by probe renders (its capabilities)."""

from __future__ import annotations

import argparse
import json
import sys

from ..capabilities import Capabilities
from . import common

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print what a chat template supports, found by rendering probe conversations: system role, tools,"
        " tool calls and results, reasoning, content parts, what it requires, the think state its generation"
        " prompt leaves, the variables it reads, the special tokens it writes and the markers that end a turn."
    )
    parser.add_argument(
        "template",
        metavar="TEMPLATE",
        help="a built-in name, a model folder, or a .jinja, tokenizer_config.json, chat_template.json or .gguf file",
    )
    parser.add_argument("--json", action="store_true", help='print {"template": ..., "capabilities": {...}} as JSON')
    common.add_limit_options(parser)


def run(args: argparse.Namespace) -> int:
    args.tokenizer = None
    template = common.template_from(args)
    caps = template.capabilities
    if args.json:
        body = {"template": template.name, "capabilities": caps.to_dict()}
        sys.stdout.write(json.dumps(body, ensure_ascii=False, indent=2) + "\n")
    else:
        sys.stdout.write(table(template.name, caps))
    return 0


def table(name: str | None, caps: Capabilities) -> str:
    """The capabilities as a plain two-column table, the template's message beside a probe it rejected.

    >>> from chatcodec import load_template
    >>> print(table("qwen3", load_template("qwen3").capabilities).splitlines()[2])
    system                     yes
    """
    data = caps.to_dict()
    errors = data.pop("errors")
    rows = [("template", name or "unnamed"), ("", "")]
    for key, value in data.items():
        if isinstance(value, bool):
            shown = "yes" if value else "no"
        elif isinstance(value, list):
            shown = ", ".join(value) if value else "-"
        elif value is None:
            shown = "-"
        else:
            shown = str(value)
        if key in errors:
            shown += f"  ({errors[key]})"
        rows.append((key, shown))
    return "".join(f"{key:<26} {value}".rstrip() + "\n" for key, value in rows)
