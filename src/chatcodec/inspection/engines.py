"""Jinja features that other template engines render differently from transformers' jinja2, found in the syntax tree.

A template is rendered by more than one engine in practice: transformers (jinja2), llama.cpp (minja and
its successor), huggingface.js / transformers.js, minijinja (mistral.rs, Rust servers), swift-jinja. Each
rule here is a difference someone hit, with its evidence (``shared/docs/transformers-parity.md`` §7.1,
``shared/docs/user-problems.md`` §1.1–1.3); :func:`engine_findings` reports each use with its line.

>>> source = "{% for m in messages %}\\n{{ m.content.rsplit(' ', 1)[0] }}{% endfor %}"
>>> [(f.code, f.line) for f in engine_findings(source)]
[('engine-python-method', 2)]
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes

__all__ = ["RULES", "EngineRule", "engine_findings", "parse"]


@dataclass(frozen=True, slots=True)
class EngineRule:
    """One difference between engines: ``engines`` that render it differently, and the ``evidence``."""

    code: str
    what: str
    engines: str
    evidence: str


RULES: dict[str, EngineRule] = {
    rule.code: rule
    for rule in (
        EngineRule(
            "engine-generation-tag",
            "{% generation %} is a transformers extension",
            "minijinja (syntax error unless emulated), huggingface.js/transformers.js ('Unknown statement type')",
            "parity §7.1; transformers.js #1724",
        ),
        EngineRule(
            "engine-loop-controls",
            "{% break %} / {% continue %} (jinja2's loopcontrols extension)",
            "older minja (llama.cpp crashed at load on command-r7b)",
            "llama.cpp #11443",
        ),
        EngineRule(
            "engine-python-method",
            "a Python string method few engines implement",
            "minijinja's pycompat lacks rsplit and others; huggingface.js and minja implement a subset",
            "parity §7.1; huggingface.js #522",
        ),
        EngineRule(
            "engine-percent-format",
            "'%' string formatting",
            "minijinja (error)",
            "parity §7.1",
        ),
        EngineRule(
            "engine-sequence-test",
            "`is sequence`, true for strings and dicts in jinja2",
            "minijinja (false for strings and dicts)",
            "parity §7.1",
        ),
        EngineRule(
            "engine-tojson-arguments",
            "tojson with arguments (indent, separators, sort_keys, ensure_ascii)",
            "huggingface.js ignores separators, mistral.rs ignores sort_keys/ensure_ascii/indent, some reject"
            " ensure_ascii",
            "huggingface.js #1929; mistral.rs #2431; opencode #4049",
        ),
        EngineRule(
            "engine-tojson-positional",
            "tojson(4): in transformers the first positional argument is ensure_ascii, not indent",
            "every engine that reads it as indent (jinja2's own tojson does)",
            "parity §1.4",
        ),
        EngineRule(
            "engine-indent-filter",
            "the indent filter keeps a trailing newline in jinja2",
            "minijinja (drops it)",
            "parity §7.1",
        ),
        EngineRule(
            "engine-float-filter",
            "the float filter reads '1e3' as 1000.0 in jinja2",
            "minijinja (error)",
            "parity §7.1",
        ),
        EngineRule(
            "engine-missing-filter",
            "a filter or test several engines lack",
            "minijinja (center, wordcount, truncate, callable, ...), older minja/node-llama-cpp (rejectattr)",
            "parity §7.1; node-llama-cpp #366",
        ),
        EngineRule(
            "engine-negative-slice",
            "unary minus in a slice",
            "minja (llama.cpp failed to parse it)",
            "llama.cpp #29233",
        ),
        EngineRule(
            "engine-range-step",
            "range() with a negative step",
            "engines without a full range (mistral.rs rewrote it as reverse)",
            "mistral.rs fork #179",
        ),
        EngineRule(
            "engine-loop-neighbours",
            "loop.previtem / loop.nextitem",
            "engines that implement only loop.index/first/last (a C++ port needed a patch)",
            "gzenz/ninfer PR #4",
        ),
        EngineRule(
            "engine-host-function",
            "strftime_now / raise_exception are functions the host must provide",
            "runtimes that do not provide them (they fail with 'Object is not callable: null', or some fall back"
            " to ChatML silently)",
            "ik_llama.cpp #693; oobabooga #6675",
        ),
        EngineRule(
            "engine-carriage-return",
            "a carriage return in the template source (jinja2 turns it into \\n)",
            "minijinja (keeps it verbatim)",
            "parity §7.1",
        ),
    )
}

#: string methods every engine of note implements; others are reported
_COMMON_METHODS = frozenset(
    {
        "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower", "replace",
        "items", "keys", "values", "get",
    }
)  # fmt: skip
_RARE_FILTERS = frozenset(
    {"center", "wordcount", "truncate", "filesizeformat", "urlize", "wordwrap", "xmlattr", "forceescape", "rejectattr"}
)
_RARE_TESTS = frozenset({"callable", "sameas", "escaped"})


class _GenerationTag(jinja2.ext.Extension):
    """Parses ``{% generation %}...{% endgeneration %}`` into a node that keeps its line."""

    tags = {"generation"}  # noqa: RUF012  (jinja2's API)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        block = nodes.Scope(body, lineno=lineno)
        block.generation = True  # type: ignore[attr-defined]
        return block


_PARSER = jinja2.Environment(extensions=[jinja2.ext.loopcontrols, _GenerationTag])


def parse(source: str) -> nodes.Template:
    """The syntax tree of ``source``, as the chat sandbox reads it (loop controls and ``{% generation %}``).

    Raises :class:`jinja2.TemplateSyntaxError` for a template that does not parse.
    """
    return _PARSER.parse(source)


def _found(tree: nodes.Template) -> Iterator[tuple[str, int, str]]:
    """(rule code, line, detail) for every use of a feature the rules name."""
    for node in tree.find_all(nodes.Node):
        line = node.lineno
        if isinstance(node, nodes.Scope) and getattr(node, "generation", False):
            yield "engine-generation-tag", line, "{% generation %}"
        elif isinstance(node, (nodes.Break, nodes.Continue)):
            yield "engine-loop-controls", line, "{% break %}" if isinstance(node, nodes.Break) else "{% continue %}"
        elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
            method = node.node.attr
            owner = node.node.node
            if isinstance(owner, nodes.Name) and owner.name in ("loop", "namespace", "dict", "cycler", "joiner"):
                continue
            if method not in _COMMON_METHODS:
                yield "engine-python-method", line, f".{method}()"
        elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name):
            name = node.node.name
            if name in ("strftime_now", "raise_exception"):
                yield "engine-host-function", line, f"{name}()"
            elif name == "range" and len(node.args) == 3 and _negative(node.args[2]):
                yield "engine-range-step", line, "range(..., -1)"
        elif isinstance(node, nodes.Mod) and isinstance(node.left, nodes.Const) and isinstance(node.left.value, str):
            yield "engine-percent-format", line, "'...' % value"
        elif isinstance(node, nodes.Test):
            if node.name == "sequence":
                yield "engine-sequence-test", line, "is sequence"
            elif node.name in _RARE_TESTS:
                yield "engine-missing-filter", line, f"is {node.name}"
        elif isinstance(node, nodes.Filter):
            if node.name == "tojson" and node.args:
                yield "engine-tojson-positional", line, "tojson(...) with a positional argument"
            elif node.name == "tojson" and node.kwargs:
                names = ", ".join(str(getattr(kw, "key", "")) for kw in node.kwargs)
                yield "engine-tojson-arguments", line, f"tojson({names}=...)"
            elif node.name == "indent":
                yield "engine-indent-filter", line, "|indent"
            elif node.name == "float":
                yield "engine-float-filter", line, "|float"
            elif node.name in _RARE_FILTERS:
                yield "engine-missing-filter", line, f"|{node.name}"
        elif isinstance(node, nodes.Slice) and any(_negative(part) for part in (node.start, node.stop, node.step)):
            yield "engine-negative-slice", line, "[-n:]"
        elif (
            isinstance(node, nodes.Getattr)
            and isinstance(node.node, nodes.Name)
            and node.node.name == "loop"
            and node.attr in ("previtem", "nextitem")
        ):
            yield "engine-loop-neighbours", line, f"loop.{node.attr}"


def _negative(node: nodes.Node | None) -> bool:
    if isinstance(node, nodes.Neg):
        return True
    return isinstance(node, nodes.Const) and isinstance(node.value, (int, float)) and node.value < 0


@dataclass(frozen=True, slots=True)
class EngineFinding:
    code: str
    line: int
    detail: str


def engine_findings(source: str) -> list[EngineFinding]:
    """One finding per rule and line, in line order (a template that does not parse has none)."""
    try:
        tree = parse(source)
    except jinja2.TemplateSyntaxError:
        return []
    seen: dict[tuple[str, int], EngineFinding] = {}
    for code, line, detail in _found(tree):
        seen.setdefault((code, line), EngineFinding(code, line, detail))
    for match in re.finditer("\r", source):
        line = source.count("\n", 0, match.start()) + 1
        seen.setdefault(("engine-carriage-return", line), EngineFinding("engine-carriage-return", line, "\\r"))
        break
    return sorted(seen.values(), key=lambda f: (f.line, f.code))
