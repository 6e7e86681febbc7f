"""A griffe extension for the API reference: chatcodec's docstrings are written for the terminal and for
doctest (Sphinx-style roles such as :class:`~chatcodec.Codec`, ``>>>`` examples); in Markdown a role
shows as its raw text and an example as a quotation. This turns each role into code text (the last part
of a ``~`` target, as Sphinx shows it) and each example into a ``pycon`` code block, before the
docstring is read. It changes what the reference shows, never the docstrings in the source."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([^`<]*?)(?:\s*<([^`>]*)>)?`")


def _role(match: re.Match[str]) -> str:
    tilde, text, target = match.groups()
    shown = text.strip() or (target or "")
    if tilde:
        shown = shown.rsplit(".", 1)[-1]
    return f"`{shown}`"


def _examples(text: str) -> str:
    """Wrap each run of doctest lines (a ``>>>`` line up to the next blank line) in a pycon fence."""
    out: list[str] = []
    inside = False
    for line in text.split("\n"):
        if not inside and line.lstrip().startswith(">>>"):
            out.append("```pycon")
            inside = True
        elif inside and not line.strip():
            out.append("```")
            inside = False
        out.append(line)
    if inside:
        out.append("```")
    return "\n".join(out)


def markdown(text: str) -> str:
    """The docstring ``text`` as the reference shows it."""
    return _examples(ROLE.sub(_role, text))


class Roles(griffe.Extension):
    """Rewrites every docstring griffe loads (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
