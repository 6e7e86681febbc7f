"""``chatcodec.lint(template)``: the concrete risks of a chat template, each with a severity, a message and a line.

The rules (codes in brackets; ``error`` findings make ``chatcodec lint`` exit 1):

* ``raises-on-role`` (error; warning for a tool role in a template without tools): a request with a
  system or tool message fails with the template's own message (Gemma's "System role not supported");
* ``drops-tool-calls`` / ``drops-tool-results`` (error where the template renders tool definitions,
  warning where it has no tools at all): a history's calls or results vanish from the prompt silently;
* ``not-prefix-stable`` (warning): a later turn changes how earlier turns render, so cached tokens and
  per-turn training samples no longer match the prompt (history reasoning dropped, ...);
* ``hard-coded-date`` (warning): a date literal the template falls back to ends up in the prompt
  (Llama 3.1's "26 Jul 2024", sglang #3296);
* ``fixed-date`` (warning): the template writes a full date (day, month and year) of its own into the prompt,
  in its text or in a string it prints, whatever day it is rendered on (a month and year alone, such as a
  knowledge cutoff, is not flagged, nor a full date that follows "knowledge", "cutoff" or "updated");
* ``special-token-injection`` (warning): user text holding the template's markers comes out verbatim,
  so a tokenizer that parses special tokens in the prompt turns it into real control tokens (chatcodec's
  :class:`~chatcodec.Codec` escapes it; other stacks do not, transformers #29279);
* ``no-generation-prompt`` (warning): ``add_generation_prompt`` changes nothing and the prompt does not
  end with an assistant header, so the model is not asked to answer;
* ``response-template-misreads`` (error): the ``response_template`` shipped with the template (its
  ``tokenizer_config.json``) does not load, or reads the template's own rendering of a tool call
  differently from chatcodec's decoder for its format;
* ``writes-bos`` (info): the template writes BOS itself: tokenize with ``add_special_tokens=False``;
* ``engine-*`` (warning; ``engine-host-function`` info): a Jinja feature other engines render differently
  (:mod:`chatcodec.inspection.engines`).

>>> import chatcodec
>>> [f.code for f in chatcodec.lint("chatml")]
['drops-tool-calls', 'special-token-injection']
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import jinja2
from jinja2 import nodes

from ..decoders.detect import check_response_template
from ..render import ChatTemplate
from ..templates import load_template
from .engines import RULES, engine_findings, parse
from .prefix import prefix_stability
from .probes import Needles, render_or_error
from .report import role_checks
from .text import Style

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Finding", "Severity", "findings_text", "lint"]

Severity = Literal["error", "warning", "info"]
_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True, slots=True)
class Finding:
    """One risk: ``code`` names the rule, ``line`` is the template source line (None where the risk is in
    what the template does, not in one place), ``template`` the named template (``default``, ``tool_use``)."""

    code: str
    severity: Severity
    message: str
    line: int | None = None
    template: str = "default"

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "line": self.line,
            "template": self.template,
        }


def lint(template: ChatTemplate | str | Path) -> list[Finding]:
    """The findings for ``template`` (or anything :func:`~chatcodec.load_template` takes), errors first."""
    if not isinstance(template, ChatTemplate):
        template = load_template(template)
    findings: list[Finding] = []
    findings += _roles(template)
    findings += _tool_history(template)
    findings += _prefix(template)
    findings += _date_default(template)
    findings += _fixed_date(template, {f.message for f in findings if f.code == "hard-coded-date"})
    findings += _injection(template)
    findings += _generation_prompt(template)
    findings += _bos(template)
    findings += _response_template(template)
    for name, source in template.sources.items():
        findings += _engines(source, name)
    return sorted(findings, key=lambda f: (_ORDER[f.severity], f.line or 0, f.code))


def _response_template(template: ChatTemplate) -> list[Finding]:
    if template.response_template is None:
        return []
    wrong = check_response_template(template, template.response_template)
    if wrong is None:
        return []
    return [Finding("response-template-misreads", "error", f"its shipped response_template: {wrong}")]


def _roles(template: ChatTemplate) -> list[Finding]:
    caps = template.capabilities
    found = []
    for check in role_checks(template):
        if check.status != "rejected":
            continue
        severity: Severity = "warning" if check.role == "tool" and not caps.tools else "error"
        found.append(
            Finding(
                "raises-on-role",
                severity,
                f"a {check.role} message makes the template raise: {check.message!r}"
                " (chatcodec's polyfill='auto' rewrites it into a form the template takes)",
                check.line,
            )
        )
    return found


def _tool_history(template: ChatTemplate) -> list[Finding]:
    caps = template.capabilities
    severity: Severity = "error" if caps.tools else "warning"
    what = "" if caps.tools else " (the template has no tool support; polyfill='auto' writes them as text)"
    found = []
    if not caps.tool_calls and caps.error("tool_calls") is None:
        found.append(
            Finding("drops-tool-calls", severity, f"an assistant turn's tool calls are left out of the prompt{what}")
        )
    if not caps.tool_responses and caps.error("tool_responses") is None and _tool_role_rendered(template):
        found.append(
            Finding("drops-tool-results", severity, f"tool results (role 'tool') are left out of the prompt{what}")
        )
    return found


def _tool_role_rendered(template: ChatTemplate) -> bool:
    return all(c.status != "rejected" for c in role_checks(template) if c.role == "tool")


def _prefix(template: ChatTemplate) -> list[Finding]:
    stability = prefix_stability(template)
    if stability.stable is not False:
        return []
    line = _first_line(template.source, lambda n: _is_key(n, "reasoning_content"))
    found = []
    for change in stability.changes:
        at = line if change.kind == "history_reasoning_dropped" else None
        found.append(
            Finding(
                "not-prefix-stable",
                "warning",
                f"not prefix-stable: {change.explanation}; KV-cache reuse and per-turn training samples break",
                at,
            )
        )
    return found


_DATE = re.compile(
    r"\b(19|20)\d\d\b.*|.*\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\b.*", re.IGNORECASE | re.DOTALL
)


def _date_default(template: ChatTemplate) -> list[Finding]:
    found = []
    for name, source in template.sources.items():
        try:
            tree = parse(source)
        except jinja2.TemplateSyntaxError:  # a template that does not parse cannot have been loaded
            continue
        for assign in tree.find_all(nodes.Assign):
            value = assign.node
            if not (isinstance(value, nodes.Const) and isinstance(value.value, str) and _DATE.fullmatch(value.value)):
                continue
            if not any(w in _target_name(assign.target) for w in ("date", "today", "cutoff")):
                continue
            literal = value.value
            shown = _shows_literal(template, literal)
            if shown:
                found.append(
                    Finding(
                        "hard-coded-date",
                        "warning",
                        f"the prompt carries the hard-coded date {literal!r} unless the caller sets"
                        f" {_target_name(assign.target)}; pass the real date (or pin it on purpose)",
                        assign.lineno,
                        name,
                    )
                )
    return found


_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
#: a full date: 2024-07-26, 2024/07/26, 26/07/2024, 07.26.2024, 26 Jul 2024, July 26, 2024, 26th of July 2024
_FULL_DATE = re.compile(
    r"\b(?:(?:19|20)\d\d[-/.](?:0?[1-9]|1[0-2])[-/.](?:0?[1-9]|[12]\d|3[01])"
    r"|(?:0?[1-9]|[12]\d|3[01])[-/.](?:0?[1-9]|1[0-2])[-/.](?:19|20)\d\d"
    r"|(?:0?[1-9]|1[0-2])[-/.](?:0?[1-9]|[12]\d|3[01])[-/.](?:19|20)\d\d"
    rf"|(?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?(?: of)? {_MONTH},? (?:19|20)\d\d"
    rf"|{_MONTH} (?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?,? (?:19|20)\d\d)\b",
    re.IGNORECASE,
)


_CUTOFF = re.compile(r"cutoff|cut-off|knowledge|updated|trained", re.IGNORECASE)


def _fixed_date(template: ChatTemplate, reported: set[str]) -> list[Finding]:
    """Full dates in the template's text or string literals that a render writes into the prompt."""
    found = []
    seen: set[str] = set()
    for name, source in template.sources.items():
        try:
            tree = parse(source)
        except jinja2.TemplateSyntaxError:
            continue
        texts = [(node.data, node.lineno, True) for node in tree.find_all(nodes.TemplateData)]
        texts += [(v.value, v.lineno, False) for v in tree.find_all(nodes.Const) if isinstance(v.value, str)]
        for text, first, spans_lines in texts:
            for match in _FULL_DATE.finditer(text):
                line = first + text.count("\n", 0, match.start()) if spans_lines else first
                literal = match.group()
                if _CUTOFF.search(text[max(0, match.start() - 60) : match.start()]):
                    continue  # a knowledge cutoff is fixed on purpose
                if literal in seen or any(repr(literal) in message for message in reported):
                    continue
                seen.add(literal)
                if _shows_literal(template, literal):
                    found.append(
                        Finding(
                            "fixed-date",
                            "warning",
                            f"the template writes the fixed date {literal!r} into the prompt whatever day it is"
                            " rendered on; write the real date (strftime_now, or a variable the caller sets)",
                            line,
                            name,
                        )
                    )
    return found


def _target_name(target: nodes.Node) -> str:
    if isinstance(target, nodes.Name):
        return target.name
    if isinstance(target, nodes.NSRef):
        return f"{target.name}.{target.attr}"
    return ""


def _shows_literal(template: ChatTemplate, literal: str) -> bool:
    system = {"role": "system", "content": Needles.SYSTEM}
    user = {"role": "user", "content": Needles.USER[0]}
    for messages in ([system, user], [user]):
        text = render_or_error(template, messages, add_generation_prompt=True)
        if isinstance(text, str) and literal in text:
            return True
    return False


#: text that looks like a control token (the forms templates write)
_CONTROL = re.compile(
    r"<\|[^|<>\s]{1,40}\|>|<｜[^｜<>]{1,40}｜>|\[/?[A-Z_]{2,30}\]|</?[a-z_]{1,20}_of_[a-z_]{1,20}>|</?s>"
)


def markers(template: ChatTemplate) -> list[str]:
    """The control-token texts a template writes: its special tokens, its stop markers, and strings in its
    source that look like control tokens, longest first."""
    caps = template.capabilities
    found = {v for v in template.special_tokens.values() if isinstance(v, str) and len(v) > 1}
    found |= set(caps.stop_markers)
    for source in template.sources.values():
        found |= set(_CONTROL.findall(source))
    return sorted(found, key=lambda t: (-len(t), t))


def _injection(template: ChatTemplate) -> list[Finding]:
    candidates = [m for m in markers(template) if _CONTROL.fullmatch(m) or m in template.special_tokens.values()]
    verbatim = []
    for marker in candidates[:12]:
        content = f"{Needles.USER[0]}{marker}{Needles.USER[1]}"
        text = render_or_error(template, [{"role": "user", "content": content}], add_generation_prompt=True)
        if isinstance(text, str) and content in text:
            verbatim.append(marker)
    if not verbatim:
        return []
    shown = ", ".join(verbatim[:4]) + (", ..." if len(verbatim) > 4 else "")
    line = _first_line(template.source, lambda n: _mentions(n, "content") and isinstance(n, nodes.Output))
    return [
        Finding(
            "special-token-injection",
            "warning",
            f"user text holding {shown} is written verbatim: rendered to text and tokenized with special tokens"
            " parsed, it becomes real control tokens (chatcodec's Codec escapes it)",
            line,
        )
    ]


def _generation_prompt(template: ChatTemplate) -> list[Finding]:
    caps = template.capabilities
    if caps.generation_prompt or caps.error("generation_prompt"):
        return []
    user = {"role": "user", "content": Needles.USER[0]}
    prompt = render_or_error(template, [user], add_generation_prompt=True)
    turn = render_or_error(template, [user, {"role": "assistant", "content": Needles.ANSWER[0]}])
    if isinstance(prompt, str) and isinstance(turn, str) and Needles.ANSWER[0] in turn:
        header = turn[: turn.index(Needles.ANSWER[0])]
        if header.startswith(prompt) and not header[len(prompt) :].strip():
            return []  # every prompt already ends with the assistant's header
    return [
        Finding(
            "no-generation-prompt",
            "warning",
            "add_generation_prompt changes nothing: the prompt ends after the last message, so the model is not"
            " asked to answer as the assistant",
        )
    ]


def _bos(template: ChatTemplate) -> list[Finding]:
    if "bos_token" not in template.capabilities.special_tokens:
        return []
    line = _first_line(template.source, lambda n: isinstance(n, nodes.Name) and n.name == "bos_token")
    return [
        Finding(
            "writes-bos",
            "info",
            "the template writes BOS itself: tokenize its prompt with add_special_tokens=False, or BOS comes twice",
            line,
        )
    ]


def _engines(source: str, name: str) -> list[Finding]:
    grouped: dict[tuple[str, str], list[int]] = {}
    for f in engine_findings(source):
        grouped.setdefault((f.code, f.detail), []).append(f.line)
    found = []
    for (code, detail), lines in grouped.items():
        rule = RULES[code]
        more = (
            f" (also line{'s' * (len(lines) > 2)} {', '.join(map(str, lines[1:4]))}{', ...' if len(lines) > 4 else ''})"
        )
        severity: Severity = "info" if code == "engine-host-function" else "warning"
        found.append(
            Finding(
                code,
                severity,
                f"{detail}: {rule.what}; renders differently in {rule.engines} [{rule.evidence}]"
                + (more if len(lines) > 1 else ""),
                lines[0],
                name,
            )
        )
    return found


def _is_key(node: nodes.Node, key: str) -> bool:
    """``node`` reads ``.key`` or ``["key"]``."""
    if isinstance(node, nodes.Getattr):
        return node.attr == key
    return isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == key


def _mentions(node: nodes.Node, key: str) -> bool:
    return any(_is_key(inner, key) for inner in node.find_all((nodes.Getattr, nodes.Getitem)))


def _first_line(source: str, wanted: Callable[[nodes.Node], bool]) -> int | None:
    try:
        tree = parse(source)
    except jinja2.TemplateSyntaxError:
        return None
    lines = [n.lineno for n in tree.find_all(nodes.Node) if wanted(n)]
    return min(lines) if lines else None


def findings_text(findings: list[Finding], source_name: str, *, color: bool) -> str:
    """Lint findings as ``NAME:LINE: severity: message [code]`` lines, then a count."""
    s = Style(color)
    tone = {"error": "red", "warning": "yellow", "info": "blue"}
    lines = []
    for f in findings:
        where = f"{source_name}:{f.line}" if f.line else source_name
        lines.append(f"{where}: {s(f.severity, tone[f.severity], 'bold')}: {f.message} [{f.code}]")
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    if findings:
        lines.append(f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}")
    else:
        lines.append(s("no findings", "green"))
    return "\n".join(lines) + "\n"
