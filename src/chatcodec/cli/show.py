"""``chatcodec show``: a rendered chat as one self-contained HTML page (roles, special tokens, tokens, mask)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..exceptions import InputError
from ..inspection import inspect, lint
from ..inspection.loading import load_pair
from ..inspection.page import build_page, layout
from . import common

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Render a chat with a template and write one self-contained HTML page: each message's span coloured by"
        " role, special tokens highlighted, and with --tokenizer the token boundaries (ids on hover), the"
        " assistant mask and each message's token count; then the template's capabilities and lint findings."
        " The page loads nothing from anywhere."
    )
    common.add_request_input(parser)
    parser.add_argument(
        "-t",
        "--template",
        metavar="NAME|PATH",
        help="chat template: a built-in name, a model folder or a template file (default: --tokenizer's)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="model folder with tokenizer.json (or the file): show tokens, the mask and token counts",
    )
    common.add_variable_options(parser)
    common.add_render_options(parser)
    parser.add_argument("--html", metavar="OUT.html", required=True, help="where to write the page (- for stdout)")
    parser.add_argument("--title", help="the page's title (default: the template and the chat's file)")
    common.add_limit_options(parser)


def run(args: argparse.Namespace) -> int:
    vars_file = args.vars if args.vars is not None and Path(args.vars).expanduser().is_file() else None
    inputs = {"FILE": args.file, "--tools": args.tools, "--template": args.template, "--vars": vars_file}
    tokenizer = Path(args.tokenizer).expanduser() if args.tokenizer else None
    if tokenizer is not None:
        folder = tokenizer if tokenizer.is_dir() else tokenizer.parent
        inputs.update(
            {f"--tokenizer's {name}": str(folder / name) for name in ("tokenizer.json", "tokenizer_config.json")}
        )
    if args.template and Path(args.template).expanduser().is_dir():
        inputs.update({f"--template's {p.name}": str(p) for p in Path(args.template).expanduser().iterdir()})
    common.refuse_overwriting("--html", args.html, inputs)
    request = common.read_request(args.file)
    variables = common.variables_from(args, request)
    options = common.render_options_from(args, request)
    name = args.template or args.tokenizer
    if name is None:
        raise InputError("show needs --template NAME|PATH or --tokenizer PATH")
    template, codec = load_pair(name, args.tokenizer)
    common.with_limits(template, args)
    data = layout(template, request.messages, codec=codec, **options, **variables)
    title = args.title or f"{template.name or name} · {request.label}"
    page = build_page(data, title=title, report=inspect(template), findings=lint(template))
    if args.html == "-":
        sys.stdout.write(page)
    else:
        try:
            Path(args.html).write_text(page, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {args.html}: {exc.strerror or exc}") from None
        common.note(f"wrote {args.html}")
    return 0
