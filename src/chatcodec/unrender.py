"""Inverse chat templating: read a rendered prompt back into the messages that render it.

Datasets are often kept as rendered text, a server's log holds the prompt it sent, and a prompt from another
stack is easier to compare as messages than as text. :func:`parse_conversation` reads such a prompt with a
given template and no format written by hand: the template is rendered on probe conversations whose texts
are unique markers (every sequence of up to three roles, assistant messages with and without reasoning,
ending plainly, with the generation prompt, or left open), which shows the literal text it writes before a
conversation's first message, between any two messages by their roles, and after the last one. A prompt is
read as one of those heads, message texts joined by those glues, and one of those tails, each text ending
at the earliest place that still leads to a reading; the text of an assistant message goes through the
template's own decoder (:func:`chatcodec.decoder_for`), so that its reasoning and tool calls come back as
fields.

A reading is returned only if rendering it gives the prompt back byte for byte, and (unless
``strict=False``) if none of its texts holds the template's own markup; otherwise
:class:`~chatcodec.PromptMismatchError` says how far the prompt follows the template. What comes back is *a*
conversation that renders the prompt: what the template drops (the reasoning of earlier turns, whitespace it
trims) is not in the prompt to be read.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import os
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .decoders import decoder_for
from .decoders.prompt import as_template
from .exceptions import ChatcodecError, DecodeError, InputError, PromptMismatchError
from .render import ChatTemplate
from .templates import content_key
from .vocab import common_prefix

__all__ = ["ParsedConversation", "parse_conversation"]

#: the roles a prompt is read in, the likelier first where a template writes two alike
_ROLES = ("system", "user", "assistant", "tool")
#: how a prompt can end after its last message
_ENDINGS = ("end", "generation", "open")
#: probe conversations have up to this many messages
_PROBE_LENGTH = 3
#: readings rendered back before giving up, and reading steps (more for a longer prompt): a bound on the
#: work a prompt full of glue-like text can cause
_MAX_RENDERS = 12
_MAX_STEPS = 20_000
#: grammars kept (one per template and distinct set of tools and template variables)
_KEPT = 64


@dataclass(frozen=True)
class ParsedConversation:
    """What :func:`parse_conversation` read: the messages, and how the prompt ends after them.

    ``render_options()`` are the options that render ``messages`` back into the prompt (with the tools and
    variables the prompt was parsed with).
    """

    messages: list[dict[str, Any]]
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    options: dict[str, Any] = field(default_factory=dict, repr=False)

    def render_options(self) -> dict[str, Any]:
        return {
            **self.options,
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
        }


def parse_conversation(
    template: ChatTemplate | str | os.PathLike[str],
    prompt: str,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    strict: bool = True,
    **template_kwargs: Any,
) -> ParsedConversation:
    """The messages that ``template`` renders into ``prompt``, exactly.

    ``tools``, ``documents`` and template variables (``now=``, ``enable_thinking=`` ...) are the ones the
    prompt was rendered with: a template that writes tool definitions or the date into the prompt needs
    them to read it. Raises :class:`~chatcodec.PromptMismatchError` when no reading renders back into the
    prompt, and :class:`~chatcodec.InputError` for arguments it cannot use.

    A reading whose texts (or reasoning) hold the template's own markup (a special token, a role header) is
    not taken unless ``strict=False``, and then only after the others: otherwise another template's prompt
    could pass as one long message holding its turns, and such a text would not encode to the prompt's
    tokens (:meth:`chatcodec.Codec.encode` escapes markup in texts by default).

    >>> prompt = "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n<|im_start|>assistant\\n"
    >>> parsed = parse_conversation("chatml", prompt)
    >>> parsed.messages
    [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello!'}]
    >>> parsed.add_generation_prompt
    True
    """
    chat = as_template(template, InputError)
    if not isinstance(prompt, str):
        raise InputError(f"prompt must be the rendered prompt as text, not {type(prompt).__name__}.")
    for name in ("add_generation_prompt", "continue_final_message"):
        if name in template_kwargs:
            raise InputError(f"{name} is read from the prompt, not given: leave it out.")
    options: dict[str, Any] = {**template_kwargs}
    if tools is not None:
        options["tools"] = tools
    if documents is not None:
        options["documents"] = documents
    grammar = _grammar(chat, options)
    reader = _Reader(prompt, grammar)
    decoders = grammar.decoders
    assert decoders is not None  # set when the grammar was learned
    check = _Check(chat, prompt, options)
    marked = None
    later: list[tuple[list[dict[str, Any]], str]] = []  # readings whose texts hold markup, tried last
    for reading, ending in reader.readings():
        if check.spent:
            break
        for messages in _forms(reading, ending, decoders):
            found = _markup(messages, grammar.structure)
            if found is not None:
                marked = marked or found
                if not strict and len(later) < _MAX_RENDERS:
                    later.append((messages, ending))
            elif (parsed := check.renders_back(messages, ending)) is not None:
                return parsed
    for messages, ending in later:
        if (parsed := check.renders_back(messages, ending)) is not None:
            return parsed
    why = _mismatch(chat, prompt, reader.furthest, check.closest, grammar, options)
    if marked is not None and strict:
        why += f" (Readings whose texts hold the template's own markup, {marked!r}, are not taken: strict=True.)"
    raise PromptMismatchError(why)


class _Check:
    """Readings rendered back, at most :data:`_MAX_RENDERS` of them; the closest miss is kept for the error."""

    def __init__(self, template: ChatTemplate, prompt: str, options: dict[str, Any]) -> None:
        self.template = template
        self.prompt = prompt
        self.options = options
        self.renders = 0
        #: how far the rendered reading that agrees with the prompt longest agrees, and what it has there
        self.closest = (-1, "")

    @property
    def spent(self) -> bool:
        return self.renders >= _MAX_RENDERS

    def renders_back(self, messages: list[dict[str, Any]], ending: str) -> ParsedConversation | None:
        """The parsed conversation if ``messages``, ending so, render into the prompt; None otherwise (or when
        the renders are spent)."""
        if self.spent:
            return None
        self.renders += 1
        generation, open_ = ending == "generation", ending == "open"
        try:
            again = self.template.render(
                messages, add_generation_prompt=generation, continue_final_message=open_, **self.options
            )
        except ChatcodecError:
            return None
        if again == self.prompt:
            return ParsedConversation(messages, generation, open_, dict(self.options))
        agree = common_prefix(again, self.prompt)
        if agree > self.closest[0]:
            self.closest = (agree, again[agree : agree + 40])
        return None


def _markup(messages: list[dict[str, Any]], structure: list[str]) -> str | None:
    """The first piece of the template's markup in a text or reasoning of the messages, if any."""
    for message in messages:
        for key in ("content", "reasoning_content"):
            text = message.get(key)
            if isinstance(text, str):
                for piece in structure:
                    if piece in text:
                        return piece
    return None


# --- learning the template's text ------------------------------------------------------------------------


@dataclass
class _Grammar:
    """The literal text a template writes around message texts, by role, each with every variant seen."""

    #: the first message's role -> the text before it
    heads: dict[str, list[str]] = field(default_factory=dict)
    #: a message's role -> (the next one's role, the text between them, whether that text opens the next
    #: message's reasoning: an assistant message then starts inside it)
    glues: dict[str, list[tuple[str, str, bool]]] = field(default_factory=dict)
    #: the last message's role -> (how the prompt ends, the text after it)
    tails: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: texts that mark the template's structure (see :meth:`mark_structure`)
    structure: list[str] = field(default_factory=list)
    #: the template's decoders for assistant texts (with these options' tools), kept with what was learned
    decoders: _AssistantDecoders | None = None

    def add(self, roles: tuple[str, ...], opens: tuple[bool, ...], ending: str, pieces: list[str]) -> None:
        _add(self.heads.setdefault(roles[0], []), pieces[0])
        for index in range(len(roles) - 1):
            _add(self.glues.setdefault(roles[index], []), (roles[index + 1], pieces[index + 1], opens[index + 1]))
        _add(self.tails.setdefault(roles[-1], []), (ending, pieces[-1]))

    def mark_structure(self, template: ChatTemplate) -> None:
        """Keep the texts that mark the template's structure (its special tokens, the literal text around
        messages, whitespace aside): a reading whose message texts hold one is likely wrong (strict)."""
        texts = {token for token in template.special_tokens.values() if isinstance(token, str)}
        texts.update(head for heads in self.heads.values() for head in heads)
        texts.update(part for glues in self.glues.values() for entry in glues for part in entry[1].split(_SLOT))
        texts.update(tail for tails in self.tails.values() for _, tail in tails)
        self.structure = sorted({text.strip() for text in texts if len(text.strip()) >= 2})


def _add(variants: list[Any], value: Any) -> None:
    if value not in variants:
        variants.append(value)


#: grammars by template (sources and special tokens) and options, least recently used out
_GRAMMARS: OrderedDict[tuple[Any, ...], _Grammar] = OrderedDict()
_LOCK = threading.Lock()


def _grammar(template: ChatTemplate, options: dict[str, Any]) -> _Grammar:
    """The template's grammar for these options, learned once: a template loaded again by name, or another
    object with the same source, reuses it."""
    try:
        given = json.dumps(options, sort_keys=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        raise InputError("tools, documents and template variables must be plain JSON-like data.") from None
    key = (*content_key(template), given)
    with _LOCK:
        grammar = _GRAMMARS.get(key)
        if grammar is not None:
            _GRAMMARS.move_to_end(key)
            return grammar
    grammar = _learn(template, options)
    with _LOCK:
        _GRAMMARS[key] = grammar
        if len(_GRAMMARS) > _KEPT:
            _GRAMMARS.popitem(last=False)
    return grammar


def _learn(template: ChatTemplate, options: dict[str, Any]) -> _Grammar:
    """Render every probe conversation the template accepts, and keep the text around the markers."""
    grammar = _Grammar()
    for length in range(1, _PROBE_LENGTH + 1):
        for roles in itertools.product(_ROLES, repeat=length):
            # each assistant message without reasoning and with it
            choices = [(False, True) if role == "assistant" else (False,) for role in roles]
            for thinking in itertools.product(*choices):
                messages = [
                    _probe(at, role, thought) for at, (role, thought) in enumerate(zip(roles, thinking, strict=True))
                ]
                for ending in _ENDINGS:
                    if ending == "open" and roles[-1] != "assistant":
                        continue
                    try:
                        text = template.render(
                            messages,
                            add_generation_prompt=ending == "generation",
                            continue_final_message=ending == "open",
                            **options,
                        )
                    except ChatcodecError:
                        continue  # a conversation the template refuses (roles that must alternate ...)
                    found = _split(text, messages, thinking)
                    if found is not None:
                        grammar.add(roles, found[1], ending, found[0])
    if grammar.heads:
        _learn_tool_results(template, options, grammar)
        grammar.mark_structure(template)
        grammar.decoders = _AssistantDecoders(template, options)
    if not grammar.heads:
        raise PromptMismatchError(
            f"Template {template.name or 'unnamed'!r} writes no conversation of plain text messages in order"
            " (each text once, where its message is), so its prompts cannot be read back."
        )
    return grammar


#: a slot in a glue: the text there is the call's id or the function's name (``_SLOT + "id" + _SLOT``)
_SLOT = "\x00"
#: the message field a slot's text goes to
_SLOT_FIELDS = {"id": "tool_call_id", "name": "name"}


def _learn_tool_results(template: ChatTemplate, options: dict[str, Any], grammar: _Grammar) -> None:
    """The text a template writes around tool results that answer calls: often the call's id or function name
    (Kimi K2's ``## Return of <id>``), or a frame that only results after calls get. Probes: a question, an
    answer with one call (two), the result of each, then a question or an answer; the text between the
    answer's end (where the same answer, last, meets its tail) and the first result is a glue from an
    assistant to a tool, with slots where the id and the name are."""
    calls: list[dict[str, Any]] = [
        {
            "id": f"call{i}Qzid{i}Xq",
            "type": "function",
            "function": {"name": f"Qzfn{i}Xq", "arguments": {"q": f"Qzarg{i}Xq"}},
        }
        for i in range(2)
    ]
    for count in (1, 2):
        asked: list[dict[str, Any]] = [
            _probe(0, "user", False),
            {**_probe(1, "assistant", False), "tool_calls": calls[:count]},
        ]
        answered: list[dict[str, Any]] = [
            {**_probe(2 + i, "tool", False), "tool_call_id": call["id"], "name": call["function"]["name"]}
            for i, call in enumerate(calls[:count])
        ]
        try:
            alone = template.render(asked, **options)
        except ChatcodecError:
            continue  # a template that renders no calls, or not this many
        ends = [
            len(alone) - len(tail)
            for ending, tail in grammar.tails.get("assistant", ())
            if ending == "end" and alone.endswith(tail)
        ]
        if not ends:
            continue
        answer_end = min(ends)
        for following, ending in ((None, "end"), (None, "generation"), ("user", "end"), ("assistant", "end")):
            after = [] if following is None else [_probe(2 + count, following, False)]
            messages = asked + answered + after
            try:
                text = template.render(messages, add_generation_prompt=ending == "generation", **options)
            except ChatcodecError:
                continue
            texts = [message["content"] for message in answered + after]
            starts = [text.find(marker) for marker in texts]
            if (
                not text.startswith(alone[:answer_end])  # the answer renders otherwise when results follow it
                or any(at < answer_end or text.count(marker) != 1 for at, marker in zip(starts, texts, strict=True))
                or starts != sorted(starts)
            ):
                continue
            between = [text[answer_end : starts[0]]]
            between += [text[starts[i] + len(texts[i]) : starts[i + 1]] for i in range(len(texts) - 1)]
            slotted = [
                _slots(piece, answered_call)
                for piece, answered_call in zip(between, [*calls[:count], None], strict=False)
            ]
            tail = text[starts[-1] + len(texts[-1]) :]
            if any(piece is None for piece in slotted) or "Qz" in tail:
                continue
            roles = ["assistant"] + ["tool"] * count + ([following] if following else [])
            for index, piece in enumerate(slotted):
                assert piece is not None
                _add(grammar.glues.setdefault(roles[index], []), (roles[index + 1], piece, False))
            _add(grammar.tails.setdefault(roles[-1], []), (ending, tail))


def _slots(piece: str, call: dict[str, Any] | None) -> str | None:
    """``piece`` with the call's id and function name as slots; None if it holds any other probe marker (it
    is not text written between two messages alone)."""
    if call is not None:
        piece = piece.replace(call["id"], f"{_SLOT}id{_SLOT}").replace(call["function"]["name"], f"{_SLOT}name{_SLOT}")
    return None if "Qz" in piece else piece


def _probe(at: int, role: str, thought: bool) -> dict[str, str]:
    """A probe message: its text a marker no template writes itself and no filter it applies (trim, escape)
    changes; with ``thought``, its reasoning another."""
    message = {"role": role, "content": f"Qz{at}chatcodec{at}Xq"}
    if thought:
        message["reasoning_content"] = f"Qz{at}reasoning{at}Xq"
    return message


def _split(
    text: str, messages: list[dict[str, str]], thinking: tuple[bool, ...]
) -> tuple[list[str], tuple[bool, ...]] | None:
    """The text before, between and after the probe messages, and which of them the text opened with their
    reasoning; None unless each text is there exactly once, in order (a reasoning that is left out is fine)."""
    pieces, opens, at = [], [], 0
    for message, thought in zip(messages, thinking, strict=True):
        reasoning = message.get("reasoning_content") if thought else None
        start = text.find(reasoning, at) if reasoning is not None else -1
        content = message["content"]
        found = text.find(content, max(at, start))
        if found < 0 or text.count(content) != 1 or (reasoning is not None and text.count(reasoning) > 1):
            return None
        if start >= 0:
            pieces.append(text[at:start])
            opens.append(True)
        else:
            if reasoning is not None and reasoning in text:
                return None  # the reasoning after the text
            pieces.append(text[at:found])
            opens.append(False)
        at = found + len(content)
    pieces.append(text[at:])
    return pieces, tuple(opens)


# --- reading a prompt -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Step:
    """A message read: its role, its text's span, whether the text before it opened its reasoning, and the
    message before it (the messages of a reading are a linked list)."""

    role: str
    start: int
    end: int
    opened: bool
    before: _Step | None
    #: fields the text before it gave (a tool result's ``tool_call_id`` and ``name``, from slots)
    fields: tuple[tuple[str, str], ...] = ()


#: where a message's text may end: (the end, -the length of what follows, the rank of the next role, the next
#: role or None at the prompt's end, the glue or how the prompt ends, whether the glue opens the next reasoning,
#: the next message's fields read from the glue's slots)
_Place = tuple[int, int, int, str | None, str, bool, tuple[tuple[str, str], ...]]


def _order(place: _Place) -> tuple[int, int, int]:
    return place[0], place[1], place[2]


#: a message read: its role, its text, whether the text before it opened its reasoning, and fields from slots
_Read = tuple[str, str, bool, tuple[tuple[str, str], ...]]


@functools.lru_cache(maxsize=256)
def _pattern(glue: str) -> re.Pattern[str]:
    """A glue with slots as a regular expression: each slot a named group on one line (a second use of the
    same slot must repeat it)."""
    parts = glue.split(_SLOT)
    out, seen = [], set()
    for index, part in enumerate(parts):
        if index % 2 == 0:
            out.append(re.escape(part))
        elif part in seen:
            out.append(f"(?P={part})")
        else:
            seen.add(part)
            out.append(f"(?P<{part}>[^\n]+?)")
    return re.compile("".join(out))


#: the role a text is read as when the template writes two roles alike (a tool result as a user turn)
_RANK = {role: rank for rank, role in enumerate(_ROLES)}


class _Reader:
    """Every reading of a prompt as head, message texts joined by glues, and tail, most likely first."""

    def __init__(self, prompt: str, grammar: _Grammar) -> None:
        self.prompt = prompt
        self.grammar = grammar
        #: how far into the prompt any reading got (where it stops following the template), -1: not started
        self.furthest = -1

    def readings(self) -> Iterator[tuple[list[_Read], str]]:
        """Every reading (messages as role, text and whether the text before opened their reasoning, and how
        the prompt ends), depth first: from the longest head, each message's text ending at the earliest place
        a glue to a next message (or the tail) follows; the places are found as the search reaches them."""
        prompt = self.prompt
        # the longest head first: text the template writes itself (a default system prompt) is not a message
        heads = self.grammar.heads.items()
        starts = sorted(
            (
                (len(head), -_RANK[role], role)
                for role, variants in heads
                for head in variants
                if prompt.startswith(head)
            ),
            reverse=True,
        )
        steps, budget = 0, _MAX_STEPS + len(prompt) // 8
        for at, _, role in starts:
            # each frame: a message being read (its role, start, whether its reasoning is open, the one before)
            # and the places its text may end, not yet tried
            stack: list[tuple[str, int, bool, _Step | None, Iterator[_Place], tuple[tuple[str, str], ...]]] = [
                (role, at, False, None, self._ends(role, at), ())
            ]
            while stack and steps < budget:
                steps += 1
                role, at, opened, before, ends, fields = stack[-1]
                self.furthest = max(self.furthest, at)
                found = next(ends, None)
                if found is None:
                    stack.pop()
                    continue
                end, length, _, following, what, opens, slots = found
                step = _Step(role, at, end, opened, before, fields)
                if following is None:
                    yield self._messages(step), what
                else:
                    start = end - length
                    stack.append((following, start, opens, step, self._ends(following, start), slots))

    def _ends(self, role: str, at: int) -> Iterator[_Place]:
        """Where the text of a ``role`` message starting at ``at`` may end (:data:`_Place`), earliest first,
        then the longest text after it, then the likelier next role."""
        prompt = self.prompt
        tails = []
        for ending, tail in self.grammar.tails.get(role, ()):
            end = len(prompt) - len(tail)
            if end >= at and prompt.endswith(tail):
                tails.append((end, -len(tail), -1, None, ending, False, ()))
        tails.sort(key=_order)

        def places(following: str, glue: str, opens: bool) -> Iterator[_Place]:
            if _SLOT in glue:
                for match in _pattern(glue).finditer(prompt, at):
                    found = tuple((_SLOT_FIELDS[k], v) for k, v in match.groupdict().items())
                    yield (match.start(), match.start() - match.end(), _RANK[following], following, glue, opens, found)
                return
            end = prompt.find(glue, at)
            while end >= 0:
                yield (end, -len(glue), _RANK[following], following, glue, opens, ())
                end = prompt.find(glue, end + 1)

        glues = [places(*glue) for glue in self.grammar.glues.get(role, ()) if glue[1]]  # "" says nothing
        return heapq.merge(tails, *glues, key=_order)

    def _messages(self, last: _Step) -> list[_Read]:
        out = []
        step: _Step | None = last
        while step is not None:
            out.append((step.role, self.prompt[step.start : step.end], step.opened, step.fields))
            step = step.before
        out.reverse()
        return out


def _forms(reading: list[_Read], ending: str, decoders: _AssistantDecoders) -> Iterator[list[dict[str, Any]]]:
    """The messages of a reading, most structured first: assistant texts read by the template's decoder into
    reasoning and tool calls (their text without the whitespace a template writes after reasoning, then as
    it is), then every text as it is. The last message's text stays whole when the prompt leaves it open."""
    plain = [{"role": role, "content": text, **dict(fields)} for role, text, _, fields in reading]
    decoded = list(plain)
    for index, (role, text, opened, _) in enumerate(reading):
        if role == "assistant" and not (ending == "open" and index == len(reading) - 1):
            decoded[index] = decoders.decode(text, opened) or plain[index]
    if decoded != plain:
        trimmed = [
            {**message, "content": message["content"].lstrip()}
            if message.get("reasoning_content") and isinstance(message.get("content"), str)
            else message
            for message in decoded
        ]
        if trimmed != decoded:
            yield trimmed
        yield decoded
    yield plain


class _AssistantDecoders:
    """An assistant message's text read by the template's own output format: its reasoning (in the text, or
    the text in it) and tool calls as fields. Kept with the grammar and shared by the calls that use it (a
    decoder keeps no state between texts)."""

    def __init__(self, template: ChatTemplate, options: dict[str, Any]) -> None:
        self.template = template
        self.tools = options.get("tools")
        self._decoders: dict[bool, Any] = {}

    def decode(self, text: str, opened: bool) -> dict[str, Any] | None:
        """The message, or None when the text holds neither reasoning nor tool calls (or the format has none)."""
        decoder = self._decoder(opened)
        if decoder is None:
            return None
        message = decoder.decode(text)
        if not message.reasoning_content and not message.tool_calls:
            return None
        out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        if message.reasoning_content:
            out["reasoning_content"] = message.reasoning_content
        if message.tool_calls:
            out["tool_calls"] = [_call(call, text) for call in message.tool_calls]
        return out

    def _decoder(self, opened: bool) -> Any:
        if opened not in self._decoders:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a template with no tool-call format: texts stay texts
                try:
                    self._decoders[opened] = decoder_for(self.template, thinking_forced_open=opened, tools=self.tools)
                except DecodeError:
                    self._decoders[opened] = None
        return self._decoders[opened]


def _call(call: Any, text: str) -> dict[str, Any]:
    """A decoded tool call as a message holds it: arguments as the JSON value (what templates render with
    ``tojson``), and the id only when the prompt has it (a template that writes ids)."""
    out: dict[str, Any] = {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    if call.id and call.id in text:
        out["id"] = call.id
    return out


def _mismatch(
    template: ChatTemplate,
    prompt: str,
    furthest: int,
    closest: tuple[int, str],
    grammar: _Grammar,
    options: dict[str, Any],
) -> str:
    """Why no reading was returned, in one line: where the prompt stops following the template."""
    name = template.name or "unnamed"
    hint = ""
    if "tools" not in options and "now" not in options:
        hint = " If it was rendered with tools, a date or template variables, pass them."
    if furthest < 0:
        at, head = max((common_prefix(h, prompt), h) for heads in grammar.heads.values() for h in heads)
        return (
            f"The prompt does not start as template {name!r} starts a conversation: from character {at} the"
            f" template writes {head[at : at + 40]!r} where the prompt has {prompt[at : at + 40]!r}.{hint}"
        )
    at, theirs = closest
    if at >= 0:  # readings were rendered: say where the closest one differs
        how = f"its closest reading renders back equal up to character {at}, then has {theirs!r}"
    else:
        at, how = furthest, f"it follows the template's text up to character {furthest}"
    return (
        f"The prompt is not one template {name!r} renders from text messages: {how} where the prompt"
        f" ({len(prompt)} characters) has {prompt[at : at + 40]!r}.{hint}"
    )
