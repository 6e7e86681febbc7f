"""One self-contained HTML page of a rendered conversation: what the model sees, at a glance.

Each message's span is coloured by its role, special tokens stand out, and with a tokenizer every token
is boxed (its id on hover), the tokens the assistant mask trains on are underlined, and each message's
token count is listed; the template's capabilities and lint findings close the page. The page loads
nothing: no fonts, scripts, styles or images from anywhere, and a Content-Security-Policy that forbids
them, so it reads the same offline and leaks nothing when opened.

Without a tokenizer, message spans come from a character-level tokenizer built for the page (each
character one token, the template's markers one token each): the same span logic, no token boxes.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..exceptions import ChatcodecError, InputError
from ..render import ChatTemplate
from .linting import Finding, markers
from .report import Report

if TYPE_CHECKING:
    from ..tokens import Codec, Encoding

__all__ = ["PageData", "build_page", "layout"]

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class PageData:
    """What the page shows, computed before any HTML is written (and tested as such).

    ``spans``: per message, its ``(start, end)`` characters in ``text``; ``tokens``: ``(start, end, id,
    trained)`` per token when a real tokenizer was given; ``specials``: character spans of the template's
    special tokens; ``escaped``: spans of content that looks like a special token but was encoded as text;
    ``counts``: tokens per message (None without a tokenizer).
    """

    text: str
    roles: list[str]
    spans: list[tuple[int, int]]
    tokens: list[tuple[int, int, int, bool]] | None
    specials: list[tuple[int, int]]
    escaped: list[tuple[int, int]]
    counts: list[int] | None
    mask_note: str | None = None


def layout(template: ChatTemplate, messages: Sequence[Any], *, codec: Codec | None = None, **options: Any) -> PageData:
    """Render ``messages`` (with ``codec`` when given, else a character-level stand-in) and find every span."""
    roles = [str(m.get("role", "?")) if isinstance(m, dict) else "?" for m in messages]
    real = codec is not None
    chosen = codec if codec is not None else _character_codec(template)
    encoding = chosen.encode(list(messages), **options)
    text = encoding.text
    offsets = encoding.offsets
    try:
        token_spans = encoding.message_spans
        spans = [_chars(offsets, start, end) for start, end in token_spans]
    except ChatcodecError as exc:
        raise InputError(f"cannot tell where each message is in the prompt: {exc.message}") from None
    mask: list[int] | None = None
    note = None
    if real:
        try:
            mask = encoding.assistant_mask
        except ChatcodecError as exc:
            note = exc.message
    tokens = None
    if real:
        trained = mask or [0] * len(encoding)
        tokens = [(s, e, i, bool(m)) for (s, e), i, m in zip(offsets, encoding.input_ids, trained, strict=True)]
    specials = _special_spans(text, chosen, encoding)
    return PageData(
        text=text,
        roles=roles,
        spans=spans,
        tokens=tokens,
        specials=specials,
        escaped=list(encoding.escaped),
        counts=[end - start for start, end in token_spans] if real else None,
        mask_note=note,
    )


def _chars(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    if start >= end:
        at = offsets[start][0] if start < len(offsets) else (offsets[-1][1] if offsets else 0)
        return at, at
    return offsets[start][0], offsets[end - 1][1]


def _character_codec(template: ChatTemplate) -> Codec:
    """A Codec whose tokenizer makes every character one token and each of the template's markers one token."""
    try:
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    except ImportError:
        raise InputError("the page needs the tokenizers package: pip install 'chatcodec[tokens]'") from None
    from ..tokens import Codec

    backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    backend.add_special_tokens(markers(template))
    return Codec(template, backend)


def _special_spans(text: str, codec: Codec, encoding: Encoding) -> list[tuple[int, int]]:
    escaped = encoding.escaped
    found = []
    for (start, end), token in zip(encoding.offsets, encoding.tokens, strict=True):
        if token in codec.control_tokens and not any(a <= start < b for a, b in escaped):
            found.append((start, end))
    return found


# --- the HTML ---------------------------------------------------------------------------------------------

_CSS = """
:root { color-scheme: light; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1100px;
  padding: 0 16px; color: #1d1d1f; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.sub { color: #666; margin: 0 0 16px; }
#legend { display: flex; flex-wrap: wrap; gap: 8px 16px; padding: 10px 12px; border: 1px solid #ddd;
  border-radius: 8px; background: #fafafa; font-size: 13px; }
#legend span.key { padding: 1px 6px; border-radius: 4px; font-family: ui-monospace, Menlo, Consolas, monospace; }
pre.prompt { font: 13.5px/1.7 ui-monospace, Menlo, Consolas, "DejaVu Sans Mono", monospace; white-space: pre-wrap;
  word-break: break-word; border: 1px solid #ddd; border-radius: 8px; padding: 12px; background: #fff; }
.role-system { background: #ede7f6; } .role-user { background: #e3f2fd; } .role-assistant { background: #e8f5e9; }
.role-tool { background: #fff3e0; } .role-other { background: #fce4ec; } .role-template { background: #f2f2f2; }
.special { color: #6a1b9a; font-weight: 700; outline: 1px solid #ab47bc; border-radius: 3px; }
.escaped { text-decoration: underline wavy #e65100; }
.tok { box-shadow: inset -1px 0 0 rgba(0, 0, 0, 0.28); }
.trained { text-decoration: underline 3px #2e7d32; text-underline-offset: 3px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
ul.findings li { margin: 2px 0; } .sev-error { color: #b71c1c; font-weight: 700; }
.sev-warning { color: #e65100; font-weight: 700; } .sev-info { color: #1565c0; font-weight: 700; }
.caps { columns: 3; font-size: 13px; } .yes { color: #2e7d32; } .no { color: #9e9e9e; }
"""


def build_page(
    data: PageData,
    *,
    title: str,
    report: Report | None = None,
    findings: list[Finding] | None = None,
) -> str:
    """The page for ``data``, with the capabilities of ``report`` and the lint ``findings``."""
    tokens = data.tokens is not None
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="sub">{len(data.roles)} messages, {len(data.text):,} characters'
        + (f", {len(data.tokens or []):,} tokens, {sum(t[3] for t in data.tokens or [])} trained" if tokens else "")
        + "</p>",
        _legend(data, tokens),
        '<h2>Prompt</h2><pre class="prompt" id="prompt">' + _prompt(data) + "</pre>",
    ]
    if data.mask_note:
        parts.append(f'<p class="sub">No assistant mask: {html.escape(data.mask_note)}</p>')
    parts.append(_messages_table(data))
    if report is not None:
        parts.append(_capabilities(report))
    if findings is not None:
        parts.append(_findings(findings))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _legend(data: PageData, tokens: bool) -> str:
    keys = [f'<span class="key role-{r}">{r}</span>' for r in ROLES]
    keys.append('<span class="key role-template">template text (outside messages)</span>')
    keys.append('<span class="key special">&lt;special token&gt;</span>')
    if data.escaped:
        keys.append('<span class="key escaped">content that looks like a special token, encoded as text</span>')
    if tokens:
        keys.append('<span class="key tok">token</span><span class="key tok">boundaries</span>')
        keys.append('<span class="key trained">trained (assistant mask = 1)</span>')
    return '<div id="legend"><strong>Legend</strong> ' + " ".join(keys) + "</div>"


def _prompt(data: PageData) -> str:
    """The prompt as nested spans: message (by role), then token (or special-token) pieces."""
    text = data.text
    owner = _owners(data)
    cuts = {0, len(text)}
    for start, end in data.spans:
        cuts |= {start, end}
    for start, end in data.specials + data.escaped:
        cuts |= {start, end}
    if data.tokens is not None:
        for start, end, _, _ in data.tokens:
            if end > start:
                cuts |= {start, end}
    points = sorted(c for c in cuts if 0 <= c <= len(text))
    token_at = {}
    if data.tokens is not None:
        for index, (start, end, token_id, trained) in enumerate(data.tokens):
            if end > start:
                token_at[start] = (index, end, token_id, trained)
    specials = {start: end for start, end in data.specials}
    escaped = data.escaped
    out = []
    current_owner: int | None = -2
    open_token_end: int | None = None
    for a, b in itertools.pairwise(points):
        who = owner(a)
        if who != current_owner:
            if open_token_end is not None:
                out.append("</span>")
                open_token_end = None
            if current_owner != -2:
                out.append("</span>")
            role = data.roles[who] if who is not None and who >= 0 else "template"
            css = role if role in ROLES or role == "template" else "other"
            label = (
                f' data-message="{who}" title="message {who}: {html.escape(role)}"'
                if who is not None and who >= 0
                else ""
            )
            out.append(f'<span class="msg role-{css}"{label}>')
            current_owner = who
        if a in token_at and open_token_end is None:
            index, end, token_id, trained = token_at[a]
            token_class = "tok" + (" trained" if trained else "")
            out.append(f'<span class="{token_class}" title="token {index}: id {token_id}">')
            open_token_end = end
        classes = []
        if a in specials or any(s <= a < e for s, e in data.specials):
            classes.append("special")
        if any(s <= a < e for s, e in escaped):
            classes.append("escaped")
        piece = html.escape(text[a:b])
        out.append(f'<span class="{" ".join(classes)}">{piece}</span>' if classes else piece)
        if open_token_end is not None and b >= open_token_end:
            out.append("</span>")
            open_token_end = None
    if open_token_end is not None:
        out.append("</span>")
    if current_owner != -2:
        out.append("</span>")
    return "".join(out)


def _owners(data: PageData) -> Any:
    spans = data.spans

    def owner(position: int) -> int | None:
        for index, (start, end) in enumerate(spans):
            if start <= position < end:
                return index
        return -1

    return owner


def _messages_table(data: PageData) -> str:
    rows = []
    for index, (role, (start, end)) in enumerate(zip(data.roles, data.spans, strict=True)):
        count = f'<td class="num">{data.counts[index]}</td>' if data.counts is not None else ""
        trained = ""
        if data.tokens is not None:
            n = sum(1 for s, e, _, t in data.tokens if t and start <= s < end)
            trained = f'<td class="num">{n}</td>'
        preview = data.text[start:end].replace("\n", "⏎ ")
        preview = preview if len(preview) <= 90 else preview[:89] + "…"
        rows.append(
            f'<tr><td class="num">{index}</td><td class="role-{role if role in ROLES else "other"}">{html.escape(role)}'
            f'</td><td class="num">{end - start}</td>{count}{trained}<td><code>{html.escape(preview)}</code></td></tr>'
        )
    head = "<th>#</th><th>role</th><th>characters</th>"
    if data.counts is not None:
        head += "<th>tokens</th><th>trained</th>"
    return f'<h2>Messages</h2><table id="messages"><tr>{head}<th>text</th></tr>' + "".join(rows) + "</table>"


def _capabilities(report: Report) -> str:
    caps = report.capabilities
    items = []
    for flag in caps.flags():
        value = getattr(caps, flag)
        items.append(f'<div class="{"yes" if value else "no"}">{"✓" if value else "✗"} {flag}</div>')
    facts = [
        f"output format <code>{html.escape(report.output_format)}</code> ({html.escape(report.format_how)})",
        "stop markers " + (", ".join(f"<code>{html.escape(m)}</code>" for m in report.stop_markers) or "none"),
        "special tokens written by the template: "
        + (", ".join(f"<code>{html.escape(n)}</code>" for n in report.special_tokens) or "none"),
        "variables: " + (", ".join(f"<code>{html.escape(v)}</code>" for v in report.variables) or "none"),
        "prefix stable: "
        + {True: "yes", False: "no", None: "unknown"}[report.prefix.stable]
        + (f" ({html.escape(report.prefix.explanation)})" if report.prefix.stable is False else ""),
    ]
    rejected = [f"{r.role}: {html.escape(repr(r.message))}" for r in report.roles if r.status == "rejected"]
    if rejected:
        facts.append("rejected roles: " + "; ".join(rejected))
    return (
        '<h2>Capabilities</h2><div id="capabilities"><ul>'
        + "".join(f"<li>{fact}</li>" for fact in facts)
        + '</ul><div class="caps">'
        + "".join(items)
        + "</div></div>"
    )


def _findings(findings: list[Finding]) -> str:
    if not findings:
        return '<h2>Lint</h2><p id="findings">No findings.</p>'
    items = []
    for f in findings:
        where = f" (line {f.line})" if f.line else ""
        items.append(
            f'<li><span class="sev-{f.severity}">{f.severity}</span> <code>{html.escape(f.code)}</code>{where}: '
            f"{html.escape(f.message)}</li>"
        )
    return '<h2>Lint</h2><ul class="findings" id="findings">' + "".join(items) + "</ul>"
