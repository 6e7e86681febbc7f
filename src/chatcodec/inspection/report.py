"""``chatcodec.inspect(template)``: everything a person checks before using a chat template, in one report.

The facts come from the public API: :attr:`ChatTemplate.capabilities` (probe renders), the output
format :func:`chatcodec.decoders.detect` chose, role probes that keep the template's own message when it
rejects a role, :func:`~chatcodec.inspection.prefix.prefix_stability`, and with a tokenizer, what each
turn costs in tokens beyond its text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..capabilities import Capabilities
from ..decoders import detect
from ..exceptions import ChatcodecError, TemplateError
from ..render import ChatTemplate
from ..templates import load_template
from ..vocab import TextTokenizer
from .prefix import PrefixStability, prefix_stability
from .probes import NOW, Needles, render_or_error, tool_call_turn, tool_result
from .text import Style, capabilities_text, visible

if TYPE_CHECKING:
    from pathlib import Path

    from ..tokens import Codec

__all__ = ["Overhead", "Report", "RoleCheck", "inspect", "report_text", "role_checks"]

#: what ``detect(template).how`` means, in words
HOW = {
    "rendered": "a probe render showed a tool call, and this format decoded it back",
    "source": "no probe render showed a tool call; markers in the template source decided",
    "none": "the template writes no tool-call syntax: output is plain content",
    "catalog": "the template's tool-call rendering matched a known format of the catalog",
    "learned": "no known format matched; the markers were learned from probe renders",
    "fallback": "nothing matched; the fallback format is used",
}

RoleStatus = Literal["rendered", "rejected", "dropped"]


@dataclass(frozen=True, slots=True)
class RoleCheck:
    """What a template does with a message of one role: renders it, rejects it (with its message and
    template line) or drops it (renders without its text)."""

    role: str
    status: RoleStatus
    message: str | None = None
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "status": self.status, "message": self.message, "line": self.line}


@dataclass(frozen=True, slots=True)
class Overhead:
    """Tokens a template adds around the text, measured with a tokenizer.

    ``per_role``: tokens a turn of that role takes beyond its content's tokens; ``fixed``: tokens outside
    every message (BOS, a default system prompt); ``generation_prompt``: the tokens the generation prompt adds.
    """

    per_role: dict[str, int]
    fixed: int
    generation_prompt: int

    def to_dict(self) -> dict[str, Any]:
        return {"per_role": dict(self.per_role), "fixed": self.fixed, "generation_prompt": self.generation_prompt}


@dataclass(frozen=True)
class Report:
    """What :func:`inspect` found about a template.

    ``output_format`` is the decoder format of the model's answers and ``format_how`` how it was chosen
    (see :data:`HOW`); ``tool_call_text`` what the template wrote for a probe tool call. ``special_tokens``
    maps the names of the special tokens the template writes itself to their text (``None`` when the
    template was given no value). ``overhead`` is None without a tokenizer, or when it could not be measured
    (``overhead_error`` says why).
    """

    template: str | None
    capabilities: Capabilities
    output_format: str
    format_how: str
    tool_call_text: str
    roles: tuple[RoleCheck, ...]
    special_tokens: dict[str, str | None]
    prefix: PrefixStability
    overhead: Overhead | None = None
    overhead_error: str | None = None

    @property
    def stop_markers(self) -> tuple[str, ...]:
        return self.capabilities.stop_markers

    @property
    def variables(self) -> tuple[str, ...]:
        return self.capabilities.variables

    @property
    def prefix_stable(self) -> bool | None:
        return self.prefix.stable

    @property
    def rejected_roles(self) -> dict[str, str]:
        """Role -> the template's message, for each role it rejects."""
        return {r.role: r.message or "" for r in self.roles if r.status == "rejected"}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; ``capabilities`` is :meth:`Capabilities.to_dict`."""
        return {
            "template": self.template,
            "capabilities": self.capabilities.to_dict(),
            "output_format": {
                "format": self.output_format,
                "how": self.format_how,
                "explanation": HOW.get(self.format_how, self.format_how),
                "tool_call_text": self.tool_call_text,
            },
            "stop_markers": list(self.stop_markers),
            "special_tokens": dict(self.special_tokens),
            "roles": [r.to_dict() for r in self.roles],
            "variables": list(self.variables),
            "prefix_stable": self.prefix.to_dict(),
            "token_overhead": None if self.overhead is None else self.overhead.to_dict(),
            **({"token_overhead_error": self.overhead_error} if self.overhead_error else {}),
        }

    def __str__(self) -> str:
        return report_text(self, color=False)


def inspect(template: ChatTemplate | str | Path, *, codec: Codec | None = None) -> Report:
    """Inspect ``template`` (a :class:`~chatcodec.ChatTemplate`, or anything :func:`~chatcodec.load_template`
    takes); with ``codec`` (a :class:`~chatcodec.Codec` with a tokenizer) the token overhead is measured too.

    >>> import chatcodec
    >>> report = chatcodec.inspect("qwen3")
    >>> report.output_format, report.prefix_stable, report.stop_markers
    ('hermes', False, ('<|im_end|>',))
    >>> chatcodec.inspect("chatml").prefix_stable
    True
    """
    if not isinstance(template, ChatTemplate):
        template = load_template(template)
    caps = template.capabilities
    detection = detect(template)
    special = {name: template.special_tokens.get(name) for name in caps.special_tokens}
    overhead, overhead_error = None, None
    if codec is not None:
        try:
            overhead = token_overhead(codec if codec.template is template else codec.with_template(template))
        except ChatcodecError as exc:
            overhead_error = exc.message
    return Report(
        template=template.name,
        capabilities=caps,
        output_format=detection.format,
        format_how=str(detection.how),
        tool_call_text=detection.rendered,
        roles=role_checks(template),
        special_tokens=special,
        prefix=prefix_stability(template),
        overhead=overhead,
        overhead_error=overhead_error,
    )


def role_checks(template: ChatTemplate) -> tuple[RoleCheck, ...]:
    """Render one message of each common role (system, user, assistant, tool) in a minimal conversation.

    >>> [(r.role, r.status) for r in role_checks(load_template("gemma"))][-1]
    ('tool', 'rejected')
    """
    caps = template.capabilities
    n = Needles
    user = {"role": "user", "content": n.USER[0]}
    answer = {"role": "assistant", "content": n.ANSWER[0]}
    tool_history = [user, tool_call_turn(caps) if caps.tool_calls else answer, tool_result()]
    probes: list[tuple[str, list[dict[str, Any]], str]] = [
        ("system", [{"role": "system", "content": n.SYSTEM}, user], n.SYSTEM),
        ("user", [user], n.USER[0]),
        ("assistant", [user, answer], n.ANSWER[0]),
        ("tool", tool_history, n.RESULT),
    ]
    checks = []
    for role, messages, needle in probes:
        result = render_or_error(template, messages, add_generation_prompt=messages[-1]["role"] != "assistant")
        if isinstance(result, ChatcodecError):
            line = result.lineno if isinstance(result, TemplateError) else None
            checks.append(RoleCheck(role, "rejected", result.message, line))
        elif needle not in result:
            checks.append(RoleCheck(role, "dropped"))
        else:
            checks.append(RoleCheck(role, "rendered"))
    return tuple(checks)


def token_overhead(codec: Codec) -> Overhead:
    """Tokens each turn costs beyond its text, with ``codec``'s tokenizer.

    A conversation of every role the template renders is encoded; each message's tokens minus the tokens
    of its text alone is that role's overhead.
    """
    caps = codec.template.capabilities
    texts = {"system": "You are a helpful assistant.", "user": "What is the capital of France?"}
    messages: list[dict[str, Any]] = []
    if caps.system:
        messages.append({"role": "system", "content": texts["system"]})
    messages += [
        {"role": "user", "content": texts["user"]},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome."},
    ]
    encoding = codec.encode(messages, now=NOW)
    with_prompt = codec.encode(messages[:-1], add_generation_prompt=True, now=NOW)
    without_prompt = codec.encode(messages[:-1], now=NOW)
    counts = encoding.message_token_counts
    tokenizer = codec.tokenizer
    assert tokenizer is not None  # encode needs one
    per_role: dict[str, int] = {}
    for message, count in zip(messages, counts, strict=True):
        if isinstance(tokenizer, TextTokenizer):  # a GGUF's, through llama.cpp
            content = len(tokenizer.encode_plain(message["content"])[0])
        else:
            content = len(tokenizer.encode(message["content"], add_special_tokens=False).ids)
        per_role.setdefault(message["role"], count - content)
    return Overhead(
        per_role=per_role,
        fixed=len(encoding) - sum(counts),
        generation_prompt=len(with_prompt) - len(without_prompt),
    )


def report_text(report: Report, *, color: bool) -> str:
    """The report of :func:`~chatcodec.inspect`, for a person."""
    s = Style(color)
    caps = report.capabilities
    rows: list[tuple[str, str]] = []
    rows.append(
        (
            "output format",
            f"{s(report.output_format, 'bold')}  {s(HOW.get(report.format_how, report.format_how), 'dim')}",
        )
    )
    if report.tool_call_text:
        rows.append(("", f"a tool call renders as: {visible(report.tool_call_text.strip(), 80)}"))
    rows.append(("stop markers", "  ".join(report.stop_markers) or s("none found", "yellow")))
    if report.special_tokens:
        written = "  ".join(f"{name} {value}" if value else name for name, value in report.special_tokens.items())
        rows.append(("special tokens", written))
        rows.append(("", s("written by the template itself: tokenize its prompt with add_special_tokens=False", "dim")))
    else:
        rows.append(("special tokens", s("none written by the template", "dim")))
    marks = {"rendered": s("✓", "green"), "rejected": s("✗ rejected", "red"), "dropped": s("✗ dropped", "yellow")}
    rows.append(("roles", "  ".join(f"{r.role} {marks[r.status]}" for r in report.roles)))
    for check in report.roles:
        if check.status == "rejected":
            where = f" (template line {check.line})" if check.line else ""
            rows.append(("", f"{check.role}: {s(repr(check.message), 'red')}{where}"))
        elif check.status == "dropped":
            rows.append(("", f"{check.role}: rendered without its text"))
    rows.append(("variables", ", ".join(report.variables) or s("none", "dim")))
    rows.append(("prefix stable", s.yes_no(report.prefix.stable)))
    if report.prefix.stable is False:
        rows += [("", f"- {visible(change.explanation, 160)}") for change in report.prefix.changes]
    elif report.prefix.stable is None:
        rows.append(("", report.prefix.explanation))
    if report.overhead is not None:
        o = report.overhead
        per_role = ", ".join(f"{role} {count}" for role, count in o.per_role.items())
        rows.append(
            (
                "token overhead",
                f"per turn: {per_role}; outside turns: {o.fixed}; generation prompt: {o.generation_prompt}",
            )
        )
    elif report.overhead_error:
        rows.append(("token overhead", s(f"not measured: {report.overhead_error}", "yellow")))
    else:
        rows.append(("token overhead", s("give --tokenizer to measure it", "dim")))
    head = s(report.template or "unnamed template", "bold")
    lines = [head, *(f"  {key:<15} {value}" for key, value in rows), "", s("capabilities", "bold")]
    lines += capabilities_text(caps, color=color)
    return "\n".join(line.rstrip() for line in lines) + "\n"
