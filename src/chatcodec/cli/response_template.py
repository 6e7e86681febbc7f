"""``chatcodec response-template``: write transformers' ``response_template`` for a model, or add it to its folder.

``--write`` adds the template to the folder's ``tokenizer_config.json`` (or replaces the one there) as
one more top-level key, written in the file's own indentation: every other byte of the file stays as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..decoders import response_template
from ..exceptions import InputError, LoadError
from ..templates import load_template
from . import common

__all__ = ["configure", "insert_key", "run"]

KEY = "response_template"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write transformers' response_template (how tokenizer.parse_response, vLLM and SGLang read a model's"
        " output: reasoning, content and tool calls) for a chat template, for the output format chatcodec"
        " decodes it with, checked on the template's own rendering of a tool call. Prints it as JSON, or with"
        " --write adds it to the model folder's tokenizer_config.json, keeping every other byte of the file."
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a model folder (or its tokenizer_config.json); without --write also a built-in name or a .jinja file",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"add it to tokenizer_config.json as {KEY!r} (replacing one already there) instead of printing it",
    )
    common.add_variable_options(parser)


def run(args: argparse.Namespace) -> int:
    config = _config_path(args.model) if args.write else None
    template = load_template(args.model)
    tools = common.tools_from(args)
    written = response_template(template, tools=tools, **common.variables_from(args))
    if config is None:
        sys.stdout.write(json.dumps(written, ensure_ascii=False, indent=2) + "\n")
        return 0
    text = config.read_text(encoding="utf-8")
    updated = insert_key(text, KEY, written, label=str(config))
    temporary = config.with_name(config.name + ".chatcodec-tmp")
    temporary.write_text(updated, encoding="utf-8")
    os.replace(temporary, config)  # never a half-written config
    common.note(f"wrote {KEY} to {config}")
    return 0


def _config_path(model: str) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "tokenizer_config.json"
    if path.name != "tokenizer_config.json" or not path.is_file():
        raise InputError(f"--write needs a model folder with a tokenizer_config.json (or that file), not {model!r}.")
    return path


def insert_key(text: str, key: str, value: Any, *, label: str = "tokenizer_config.json") -> str:
    """``text`` (a JSON object) with ``key`` set to ``value`` at the top level, every other byte kept.

    A key already there has its value replaced in place; a new one goes after the last entry, indented
    like the file's first key.

    >>> insert_key('{\\n  "a": 1\\n}\\n', "b", {"c": 2})
    '{\\n  "a": 1,\\n  "b": {\\n    "c": 2\\n  }\\n}\\n'
    """
    entries, close = _top_level(text, label)
    indent = _indent_of(text, entries[0][0]) if entries else "  "
    step = len(indent) if indent.strip(" ") == "" and indent else 2
    lines = json.dumps(value, ensure_ascii=False, indent=step).split("\n")
    body = "\n".join([lines[0], *(indent + line for line in lines[1:])])
    for _, name, value_start, value_end in entries:
        if name == key:
            return text[:value_start] + body + text[value_end:]
    if not entries:
        return text[:close] + "\n" + indent + json.dumps(key) + ": " + body + "\n" + text[close:]
    end = entries[-1][3]
    return text[:end] + ",\n" + indent + json.dumps(key) + ": " + body + text[end:]


def _indent_of(text: str, at: int) -> str:
    line_start = text.rfind("\n", 0, at) + 1
    return text[line_start:at] if text[line_start:at].strip() == "" else ""


def _top_level(text: str, label: str) -> tuple[list[tuple[int, str, int, int]], int]:
    """The top-level entries of a JSON object, ``(key start, key, value start, value end)``, and where its ``}`` is."""
    decoder = json.JSONDecoder()
    entries: list[tuple[int, str, int, int]] = []
    i = _skip(text, 0)
    if not text.startswith("{", i):
        raise LoadError(f"{label} does not hold a JSON object.")
    i = _skip(text, i + 1)
    try:
        while not text.startswith("}", i):
            key_start = i
            key, i = decoder.raw_decode(text, i)
            i = _skip(text, i)
            if not isinstance(key, str) or not text.startswith(":", i):
                raise ValueError("expected a key and ':'")
            value_start = _skip(text, i + 1)
            _, value_end = decoder.raw_decode(text, value_start)
            entries.append((key_start, key, value_start, value_end))
            i = _skip(text, value_end)
            if text.startswith(",", i):
                i = _skip(text, i + 1)
            elif not text.startswith("}", i):
                raise ValueError("expected ',' or '}'")
    except (ValueError, IndexError) as exc:
        raise LoadError(f"{label} is not valid JSON near character {i}: {exc}.") from None
    return entries, i


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
