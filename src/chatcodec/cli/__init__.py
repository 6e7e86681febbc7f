"""The ``chatcodec`` command: one module per command over :mod:`chatcodec.cli.common`.

:data:`COMMANDS` is the table of commands. A command's module is imported only when that command
runs, so ``chatcodec --help`` stays fast and a command's dependencies (tokenizers, a server, ...) load
only for it. Each module defines:

* ``configure(parser)``: add the command's arguments to its sub-parser (with the shared ``add_*``
  options of :mod:`chatcodec.cli.common`) and set ``parser.description``;
* ``run(args) -> int``: do the work and return the exit code; raise
  :class:`~chatcodec.ChatcodecError` for anything the user can fix (one line on stderr, exit 2).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from .. import __version__
from .common import ArgumentParser, add_input_limit
from .common import run as run_command

__all__ = ["COMMANDS", "main"]

#: command name -> (module, one-line help shown by ``chatcodec --help``), in the order listed there
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("chatcodec.cli.render", "render messages into the exact prompt a model expects"),
    "tokenize": ("chatcodec.cli.tokenize", "encode messages into token ids, with the assistant mask"),
    "decode": ("chatcodec.cli.decode", "decode a completion into content, reasoning and tool calls"),
    "unrender": ("chatcodec.cli.unrender", "read a rendered prompt back into the messages that render it"),
    "inspect": ("chatcodec.cli.inspect", "what a template supports and how it behaves, found by probe renders"),
    "response-template": (
        "chatcodec.cli.response_template",
        "write transformers' response_template for a model, or add it to its tokenizer_config.json",
    ),
    "lint": ("chatcodec.cli.lint", "check templates for concrete risks, with lines; exit 1 on errors (CI)"),
    "diff": ("chatcodec.cli.diff", "compare two templates on the same chats, or a template with formatted samples"),
    "show": ("chatcodec.cli.show", "write a rendered chat as one self-contained HTML page: roles, tokens, mask"),
    "templates": ("chatcodec.cli.templates", "list the built-in templates, or print one"),
    "tools": ("chatcodec.cli.tools", "tool schemas from Python functions, and the function-calling loop"),
    "rollout": ("chatcodec.cli.rollout", "multi-turn tool rollouts token in, token out, written as training rows"),
    "dataset": ("chatcodec.cli.dataset", "format a chat dataset for training (ids, masks, packing), or its stats"),
    "serve": ("chatcodec.cli.serve", "an OpenAI-compatible chat server over the embedded model or a remote engine"),
    "doctor": ("chatcodec.cli.doctor", "this machine, the llama.cpp build, the engine check's choice and its speed"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``chatcodec`` command with ``argv`` (default: the process's arguments); returns the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = ArgumentParser(
        prog="chatcodec",
        description="Chat messages to model prompts and tokens, and model output back to messages.",
    )
    parser.add_argument("--version", action="version", version=f"chatcodec {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    chosen = next((a for a in arguments if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the command that runs is imported and configured
            module = importlib.import_module(module_name)
            module.configure(sub)
            add_input_limit(sub)
            sub.set_defaults(run=module.run)
    return run_command(parser, arguments)
