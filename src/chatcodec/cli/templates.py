"""``chatcodec templates``: the built-in templates, or one of them with its source text and provenance."""

from __future__ import annotations

import argparse
import difflib
import json
import sys

from ..exceptions import TemplateNotFoundError
from ..templates import BuiltinTemplate, builtin_templates

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List the templates built into chatcodec, with where each comes from and its license. With NAME, print"
        " that template's Jinja source after a Jinja comment with its provenance (the comment renders as"
        " nothing, so the output can be saved and used as the template)."
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="a built-in template to print")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the list (or the template, with its source and special tokens) as JSON",
    )


def run(args: argparse.Namespace) -> int:
    entries = builtin_templates()
    if args.name is None:
        if args.json:
            print(json.dumps([_describe(entry) for entry in entries.values()], ensure_ascii=False, indent=2))
            return 0
        width = max(len(name) for name in entries)
        for entry in entries.values():
            print(f"{entry.name:<{width}}  {entry.description}")
            print(f"{'':<{width}}  source: {entry.source}; license: {entry.license}")
        return 0
    chosen = entries.get(args.name)
    if chosen is None:
        close = difflib.get_close_matches(args.name.lower(), list(entries), n=1, cutoff=0.6)
        raise TemplateNotFoundError(
            f"{args.name!r} is not a built-in template."
            + (f" Did you mean {close[0]!r}?" if close else "")
            + f" Built-in templates: {', '.join(entries)}."
        )
    source = chosen.load().source
    if args.json:
        print(json.dumps({**_describe(chosen), "template": source}, ensure_ascii=False, indent=2))
        return 0
    sys.stdout.write(
        f"{{# {chosen.name}: {chosen.description}\n   source: {chosen.source}\n   license: {chosen.license}"
        f"\n   special tokens: {json.dumps(chosen.special_tokens, ensure_ascii=False)} #}}\n"
    )
    sys.stdout.write(source if source.endswith("\n") else source + "\n")
    return 0


def _describe(entry: BuiltinTemplate) -> dict[str, object]:
    return {
        "name": entry.name,
        "description": entry.description,
        "source": entry.source,
        "license": entry.license,
        "special_tokens": entry.special_tokens,
    }
