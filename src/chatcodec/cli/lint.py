"""``chatcodec lint``: the concrete risks of a chat template, with severities and lines; exit 1 on errors."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..inspection import Finding, lint
from ..inspection.linting import findings_text
from ..inspection.loading import load_pair
from . import common

__all__ = ["configure", "github_annotations", "run"]

#: exit code when a finding at the failing severity was found (2 stays the usage error)
EXIT_FINDINGS = 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check chat templates for concrete risks: roles they raise on, tool calls or results they drop, prompts"
        " that change as a chat grows (not prefix-stable), hard-coded dates, user text that can inject special"
        " tokens, a missing generation prompt, and Jinja features other engines (minja, huggingface.js,"
        " minijinja) render differently. Exits 1 when an error is found (or a warning, with --strict)."
    )
    parser.add_argument(
        "templates",
        nargs="+",
        metavar="TEMPLATE",
        help="built-in names, model folders, or .jinja, tokenizer_config.json, chat_template.json or .gguf files",
    )
    parser.add_argument(
        "--format",
        choices=["text", "github", "json"],
        default="text",
        help="text (default); github: workflow annotations (::error file=...,line=...::...); json: a list",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    parser.add_argument(
        "--ignore",
        metavar="CODE,...",
        default="",
        help="leave out findings with these codes (e.g. engine-host-function,writes-bos)",
    )
    common.add_limit_options(parser)


def run(args: argparse.Namespace) -> int:
    ignored = {code.strip() for code in args.ignore.split(",") if code.strip()}
    failing = {"error", "warning"} if args.strict else {"error"}
    results: list[tuple[str, list[Finding]]] = []
    for name in args.templates:
        template, _ = load_pair(name)
        common.with_limits(template, args)
        findings = [f for f in lint(template) if f.code not in ignored]
        results.append((name, findings))
    if args.format == "json":
        body = [{"template": name, "findings": [f.to_dict() for f in found]} for name, found in results]
        sys.stdout.write(json.dumps(body if len(body) > 1 else body[0], ensure_ascii=False, indent=2) + "\n")
    elif args.format == "github":
        for name, found in results:
            sys.stdout.write(github_annotations(found, name))
    else:
        for name, found in results:
            sys.stdout.write(findings_text(found, name, color=common.color_wanted()))
    failed = any(f.severity in failing for _, found in results for f in found)
    return EXIT_FINDINGS if failed else 0


_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def github_annotations(findings: list[Finding], name: str) -> str:
    """GitHub Actions workflow commands, one per finding. A template file of its own (``.jinja``) gets
    ``file`` and ``line``; for a template inside another file (JSON, GGUF) the line is named in the message.

    >>> print(github_annotations([Finding("writes-bos", "info", "BOS, twice", 3)], "no-such.jinja"), end="")
    ::notice title=writes-bos::template line 3: BOS, twice
    """
    path = Path(name)
    exists = path.is_file()
    lines_match = exists and path.suffix == ".jinja"
    out = []
    for f in findings:
        props = [f"file={_escape_property(name)}"] if exists else []
        message = f.message
        if f.line is not None:
            if lines_match and f.template == "default":
                props.append(f"line={f.line}")
            else:
                where = "" if f.template == "default" else f" of {f.template!r}"
                message = f"template line {f.line}{where}: {message}"
        props.append(f"title={_escape_property(f.code)}")
        out.append(f"::{_LEVEL[f.severity]} {','.join(props)}::{_escape_data(message)}\n")
    return "".join(out)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")
