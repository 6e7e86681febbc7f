"""Compare two templates on the same conversations, or a template with training samples already formatted.

Training data formatted with one template and inference with another must agree byte for byte (token for
token), or the model is served a format it was not trained on (user-problems.md §1.5, §5.1). :func:`compare`
renders the same conversations with both templates (and tokenizes them when codecs are given);
:func:`check_samples` renders each sample's messages with a template and compares the result with the
sample's ``text`` or ``input_ids``.

>>> from chatcodec import load_template
>>> found = compare(load_template("qwen3"), load_template("qwen3"), variables_b={"enable_thinking": False})
>>> [c.name for c in found if not c.same]
['user', 'roles', 'tools']
>>> print(found[0].text_diff(color=False), end="")  # doctest: +NORMALIZE_WHITESPACE
--- a
+++ b
@@ -2,2 +2,6 @@
 What is the capital of France?<|im_end|>
 <|im_start|>assistant
+<think>
+
+</think>
+
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..exceptions import ChatcodecError, InputError
from ..render import ChatTemplate
from .probes import NOW
from .text import Style

if TYPE_CHECKING:
    from ..tokens import Codec

__all__ = ["Comparison", "SampleCheck", "Side", "check_samples", "compare", "probe_conversations"]

_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    },
}


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation to compare on: messages and the options it is rendered with."""

    name: str
    messages: list[dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)


def probe_conversations() -> list[Conversation]:
    """The built-in conversations: a user turn, every role, a tool round trip, and reasoning in history."""
    user = {"role": "user", "content": "What is the capital of France?"}
    call = {"id": "call0001a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ask = {"add_generation_prompt": True}
    return [
        Conversation("user", [user], ask),
        Conversation(
            "roles",
            [
                {"role": "system", "content": "You are a helpful assistant."},
                user,
                {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": "And of Italy?"},
            ],
            ask,
        ),
        Conversation(
            "tools",
            [
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call0001a", "name": "get_weather", "content": '{"temp_c": 21}'},
                {"role": "assistant", "content": "It is 21 °C in Paris."},
                {"role": "user", "content": "Thanks! And tomorrow?"},
            ],
            {**ask, "tools": [_WEATHER]},
        ),
        Conversation(
            "reasoning",
            [
                {"role": "user", "content": "What is 17 * 3?"},
                {"role": "assistant", "content": "51.", "reasoning_content": "17 * 3 = 51."},
                {"role": "user", "content": "And 17 * 4?"},
                {"role": "assistant", "content": "68.", "reasoning_content": "17 * 4 = 68."},
            ],
        ),
    ]


@dataclass(frozen=True, slots=True)
class Side:
    """One template's rendering of a conversation: its text (or the error it raised), and its tokens."""

    label: str
    text: str | None
    error: str | None = None
    ids: list[int] | None = None
    tokens: list[str] | None = None

    def lines(self) -> list[str]:
        if self.text is None:
            return [f"(raised: {self.error})\n"]
        return _lines(self.text)

    def token_lines(self) -> list[str]:
        if self.ids is None or self.tokens is None:
            return [f"(no tokens: {self.error})\n"] if self.error else []
        return [f"{i:>8} {t!r}\n" for i, t in zip(self.ids, self.tokens, strict=True)]


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two renderings of one conversation."""

    name: str
    a: Side
    b: Side

    @property
    def same(self) -> bool:
        return self.a.text == self.b.text and self.a.error == self.b.error and self.a.ids == self.b.ids

    def text_diff(self, *, color: bool, context: int = 2) -> str:
        """The unified diff of the two texts ('' when they are equal)."""
        return _unified(self.a.lines(), self.b.lines(), self.a.label, self.b.label, color, context)

    def token_diff(self, *, color: bool, context: int = 3) -> str:
        """The unified diff of the two token lists, one token per line (id, then text)."""
        return _unified(self.a.token_lines(), self.b.token_lines(), self.a.label, self.b.label, color, context)


def compare(
    a: ChatTemplate,
    b: ChatTemplate,
    conversations: Sequence[Conversation] | None = None,
    *,
    variables_a: dict[str, Any] | None = None,
    variables_b: dict[str, Any] | None = None,
    codec_a: Codec | None = None,
    codec_b: Codec | None = None,
    labels: tuple[str, str] = ("a", "b"),
) -> list[Comparison]:
    """Render each conversation (default: :func:`probe_conversations`) with ``a`` and with ``b``.

    With a codec for a side, that side is tokenized too (its template is ``a`` or ``b``).
    """
    found = []
    for conv in conversations if conversations is not None else probe_conversations():
        sides = [
            _side(template, conv, dict(variables or {}), codec, label)
            for template, variables, codec, label in (
                (a, variables_a, codec_a, labels[0]),
                (b, variables_b, codec_b, labels[1]),
            )
        ]
        found.append(Comparison(conv.name, sides[0], sides[1]))
    return found


def _side(
    template: ChatTemplate, conv: Conversation, variables: dict[str, Any], codec: Codec | None, label: str
) -> Side:
    options = {"now": NOW, **conv.options, **variables}
    try:
        text = template.render(conv.messages, **options)
    except ChatcodecError as exc:
        return Side(label, None, exc.message)
    if codec is None:
        return Side(label, text)
    try:
        encoding = codec.encode(conv.messages, **options)
    except ChatcodecError as exc:
        return Side(label, text, f"tokenizing failed: {exc.message}")
    return Side(label, text, None, list(encoding.input_ids), encoding.tokens)


@dataclass(frozen=True, slots=True)
class SampleCheck:
    """One formatted sample against what the template renders for its messages.

    ``line`` is the sample's line in its file (1-based); ``expected`` is the template's side, ``found``
    the sample's.
    """

    line: int
    expected: Side
    found: Side

    @property
    def same(self) -> bool:
        if self.found.ids is not None:
            return self.expected.ids == self.found.ids
        return self.expected.text == self.found.text

    def diff(self, *, color: bool) -> str:
        if self.found.ids is not None:
            return _unified(
                self.expected.token_lines(), self.found.token_lines(), self.expected.label, self.found.label, color, 3
            )
        return _unified(self.expected.lines(), self.found.lines(), self.expected.label, self.found.label, color, 2)


def check_samples(
    template: ChatTemplate,
    samples: Iterable[tuple[int, dict[str, Any]]],
    *,
    codec: Codec | None = None,
    variables: dict[str, Any] | None = None,
    label: str = "template",
) -> list[SampleCheck]:
    """Check formatted samples: ``(line, row)`` pairs, each row with ``messages`` and ``text`` (the formatted
    string) or ``input_ids`` (its tokens; these need ``codec``). A row may carry ``tools``, ``documents``,
    ``chat_template_kwargs`` and ``add_generation_prompt`` (default false), as a request body does.

    A row with ``text`` and no ``messages`` (a dataset kept as rendered text) is checked by reading the text
    back with the template (:func:`chatcodec.parse_conversation`): it is the same when the template
    renders it from some conversation whose texts hold none of the template's markup, and differs with the
    reason when it does not.
    """
    checks = []
    for line, row in samples:
        where = f"line {line}"
        kwargs = row.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise InputError(f'{where}: "chat_template_kwargs" must be an object')
        messages = row.get("messages")
        if messages is None and isinstance(row.get("text"), str):
            given = {"tools": row.get("tools"), "documents": row.get("documents"), **(variables or {}), **kwargs}
            checks.append(
                SampleCheck(line, _read_back(template, row["text"], given, label), Side(f"sample {where}", row["text"]))
            )
            continue
        if not isinstance(messages, list) or not messages:
            raise InputError(f'{where}: a formatted sample needs "messages", a non-empty list (or "text" alone)')
        options: dict[str, Any] = {
            "tools": row.get("tools"),
            "documents": row.get("documents"),
            "add_generation_prompt": bool(row.get("add_generation_prompt", False)),
            **(variables or {}),
            **kwargs,
        }
        conv = Conversation(where, messages, options)
        if isinstance(row.get("input_ids"), list):
            if codec is None:
                raise InputError(f"{where}: the sample has input_ids; give a tokenizer to compare tokens")
            ids = row["input_ids"]
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise InputError(f'{where}: "input_ids" must be a list of integers')
            expected = _side(template, conv, {}, codec, label)
            tokens = [codec.decode([i]) for i in ids]
            checks.append(SampleCheck(line, expected, Side(f"sample {where}", None, None, list(ids), tokens)))
        elif isinstance(row.get("text"), str):
            expected = _side(template, conv, {}, None, label)
            checks.append(SampleCheck(line, expected, Side(f"sample {where}", row["text"])))
        else:
            raise InputError(f'{where}: a formatted sample needs "text" (a string) or "input_ids" (a list)')
    return checks


def _read_back(template: ChatTemplate, text: str, options: dict[str, Any], label: str) -> Side:
    """The template's side for a sample that is text alone: the text itself when the template renders it from
    some conversation, else the reason it does not."""
    from ..unrender import parse_conversation

    try:
        parse_conversation(template, text, **{"now": NOW, **options})
    except InputError as exc:
        return Side(label, None, exc.message)
    return Side(label, text)


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end\n"
    return lines or ["\n\\ (empty)\n"]


def _unified(a: list[str], b: list[str], label_a: str, label_b: str, color: bool, context: int) -> str:
    if a == b:
        return ""
    s = Style(color)
    out = []
    for line in difflib.unified_diff(a, b, label_a, label_b, n=context):
        body = line if line.endswith("\n") else line + "\n"
        if line.startswith(("+++", "---")):
            out.append(s(body.rstrip("\n"), "bold") + "\n")
        elif line.startswith("@@"):
            out.append(s(body.rstrip("\n"), "blue") + "\n")
        elif line.startswith("+"):
            out.append(s(body.rstrip("\n"), "green") + "\n")
        elif line.startswith("-"):
            out.append(s(body.rstrip("\n"), "red") + "\n")
        else:
            out.append(body)
    return "".join(out)
