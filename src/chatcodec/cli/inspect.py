"""``chatcodec inspect``: what a template supports and how it behaves, for a person or (``--json``) a program."""

from __future__ import annotations

import argparse
import json
import sys

from ..decoders import response_template
from ..inspection import inspect
from ..inspection.loading import load_pair
from ..inspection.report import report_text
from . import common

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Report what a chat template supports and how it behaves, found by rendering probe conversations: its"
        " capabilities, the output format a model trained on it writes (and how that was chosen), the markers that"
        " end a turn, the special tokens it writes itself, the roles it rejects (with its own message), the"
        " variables it reads, whether a growing chat only grows at its end (prefix stability), and with a"
        " tokenizer, what each turn costs in tokens."
    )
    parser.add_argument(
        "template",
        metavar="TEMPLATE",
        help="a built-in name, a model folder, or a .jinja, tokenizer_config.json, chat_template.json or .gguf file",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="model folder with tokenizer.json (or the file): measure the token overhead per turn"
        " (a model folder given as TEMPLATE is used for this too)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print the report as JSON: {"template", "capabilities": {...}, "output_format", "roles",'
        ' "prefix_stable", "token_overhead", ...}',
    )
    parser.add_argument(
        "--response-template",
        action="store_true",
        help="print transformers' response_template for it instead (the one it ships, or the one chatcodec writes:"
        " chatcodec response-template)",
    )
    common.add_limit_options(parser)


def run(args: argparse.Namespace) -> int:
    template, codec = load_pair(args.template, args.tokenizer)
    common.with_limits(template, args)
    if args.response_template:
        found = template.response_template or response_template(template)
        sys.stdout.write(json.dumps(found, ensure_ascii=False, indent=2) + "\n")
        return 0
    report = inspect(template, codec=codec)
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), ensure_ascii=False, indent=2) + "\n")
    else:
        sys.stdout.write(report_text(report, color=common.color_wanted()))
    return 0
