"""``chatcodec diff``: two templates on the same chats, or a template against formatted training samples."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..exceptions import InputError
from ..inspection.compare import Conversation, check_samples, compare, probe_conversations
from ..inspection.loading import load_pair
from . import common

__all__ = ["configure", "run"]

#: exit code when the two sides differ (as diff(1) does); 2 stays the usage error
EXIT_DIFFERENT = 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Render the same conversations with template A and template B and show a unified diff of the prompts,"
        " and of the tokens when tokenizers are given. Without --messages, built-in conversations cover a user"
        " turn, every role, a tool round trip and reasoning in history. B may instead be a .jsonl file of"
        ' formatted training samples ({"messages": [...], "text": "..."} or {"messages": [...], "input_ids": [...]}'
        ' per line), checked against what A renders for their messages; a sample with "text" alone is read'
        " back with A, and differs when A renders it from no conversation. Exits 1 when anything differs."
    )
    parser.add_argument("a", metavar="A", help="a template: built-in name, model folder or template file")
    parser.add_argument("b", metavar="B", help="another template, or a .jsonl file of formatted samples")
    parser.add_argument(
        "--messages",
        metavar="FILE",
        help="conversations to compare on: a JSON list of messages or request body, or a .jsonl of them",
    )
    parser.add_argument("--var", metavar="KEY=VALUE", action="append", default=[], help="a template variable for both")
    parser.add_argument("--a-var", metavar="KEY=VALUE", action="append", default=[], help="a template variable for A")
    parser.add_argument("--b-var", metavar="KEY=VALUE", action="append", default=[], help="a template variable for B")
    parser.add_argument("--tokenizer", metavar="PATH", help="tokenizer for both sides: compare tokens too")
    parser.add_argument("--a-tokenizer", metavar="PATH", help="tokenizer for A (wins over --tokenizer)")
    parser.add_argument("--b-tokenizer", metavar="PATH", help="tokenizer for B (wins over --tokenizer)")
    parser.add_argument("--json", action="store_true", help="print the comparisons as JSON")
    common.add_limit_options(parser)


def run(args: argparse.Namespace) -> int:
    both = dict(common.parse_var(v) for v in args.var)
    vars_a = {**both, **dict(common.parse_var(v) for v in args.a_var)}
    vars_b = {**both, **dict(common.parse_var(v) for v in args.b_var)}
    template_a, codec_a = load_pair(args.a, args.a_tokenizer or args.tokenizer)
    common.with_limits(template_a, args)
    color = common.color_wanted()
    if args.b.endswith(".jsonl"):
        return _samples(args, template_a, codec_a, vars_a, color)

    template_b, codec_b = load_pair(args.b, args.b_tokenizer or args.tokenizer)
    common.with_limits(template_b, args)
    conversations = _conversations(args.messages) if args.messages else probe_conversations()
    labels = (_label(args.a, vars_a, "a"), _label(args.b, vars_b, "b"))
    found = compare(
        template_a,
        template_b,
        conversations,
        variables_a=vars_a,
        variables_b=vars_b,
        codec_a=codec_a,
        codec_b=codec_b,
        labels=labels,
    )
    tokens = codec_a is not None and codec_b is not None
    if args.json:
        body = [
            {
                "conversation": c.name,
                "same": c.same,
                "a": {"text": c.a.text, "error": c.a.error, **({"ids": c.a.ids} if tokens else {})},
                "b": {"text": c.b.text, "error": c.b.error, **({"ids": c.b.ids} if tokens else {})},
            }
            for c in found
        ]
        sys.stdout.write(json.dumps(body, ensure_ascii=False, indent=2) + "\n")
    else:
        for c in found:
            state = "same" if c.same else "differs"
            sys.stdout.write(f"== {c.name}: {state}\n")
            if not c.same:
                sys.stdout.write(c.text_diff(color=color))
                if tokens:
                    sys.stdout.write(f"-- {c.name}: tokens ({len(c.a.ids or [])} vs {len(c.b.ids or [])})\n")
                    sys.stdout.write(c.token_diff(color=color))
        differ = sum(not c.same for c in found)
        sys.stdout.write(f"{differ} of {len(found)} conversations differ\n")
    return EXIT_DIFFERENT if any(not c.same for c in found) else 0


def _samples(args: argparse.Namespace, template: Any, codec: Any, variables: dict[str, Any], color: bool) -> int:
    rows = list(common.read_jsonl(args.b, "formatted samples"))
    if not rows:
        raise InputError(f"{args.b} holds no samples")
    checks = check_samples(template, rows, codec=codec, variables=variables, label=_label(args.a, variables, "a"))
    bad = [c for c in checks if not c.same]
    if args.json:
        body = {
            "samples": len(checks),
            "different": [c.line for c in bad],
        }
        sys.stdout.write(json.dumps(body) + "\n")
    else:
        for check in bad:
            sys.stdout.write(f"== {args.b} line {check.line}: differs from what {args.a} renders\n")
            sys.stdout.write(check.diff(color=color))
        lines = f" (line{'s' * (len(bad) > 1)} {', '.join(str(c.line) for c in bad[:20])})" if bad else ""
        sys.stdout.write(f"{len(bad)} of {len(checks)} samples differ{lines}\n")
    return EXIT_DIFFERENT if bad else 0


def _conversations(path: str) -> list[Conversation]:
    if path.endswith(".jsonl"):
        items = [(f"{path} line {n}", row) for n, row in common.read_jsonl(path, "messages")]
    else:
        items = [(path, common.read_json(path, "messages"))]
    conversations = []
    for label, data in items:
        request = common.request_from(data, label)
        options: dict[str, Any] = {
            "tools": request.tools,
            "documents": request.documents,
            "add_generation_prompt": bool(request.add_generation_prompt),
            **request.variables,
        }
        conversations.append(Conversation(label, request.messages, options))
    return conversations


def _label(name: str, variables: dict[str, Any], side: str) -> str:
    shown = " ".join(f"{k}={json.dumps(v)}" for k, v in variables.items())
    return f"{side}: {name}" + (f" ({shown})" if shown else "")
