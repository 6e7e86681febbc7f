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

The work is bounded, linear in the prompt: every search step, every character searched, decoded or checked for
markup, and every render back is paid for from one budget of :data:`WORK_BASE` plus :data:`WORK_PER_CHAR`
per character of the prompt, counted in units of about a microsecond (the costs are measured on hostile and
ordinary prompts); each assistant text is decoded once, however many readings hold it. A prompt the budget cannot
read is refused with :class:`~chatcodec.PromptMismatchError`, which says so. On the reference machine that is
about 2 s per MB of prompt on an idle core, and at most 0.5 s plus 4 s per MB on a loaded one (measured
up to 10 MB), whatever the prompt holds.
"""

from __future__ import annotations

import bisect
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

__all__ = ["WORK_BASE", "WORK_PER_CHAR", "ParsedConversation", "parse_conversation"]

#: the roles a prompt is read in, the likelier first where a template writes two alike
_ROLES = ("system", "user", "assistant", "tool")
#: how a prompt can end after its last message
_ENDINGS = ("end", "generation", "open")
#: probe conversations have up to this many messages
_PROBE_LENGTH = 3
#: readings rendered back before giving up
_MAX_RENDERS = 12
#: the work one parse may do, in units of about a microsecond: this much, plus this much per prompt character
WORK_BASE = 200_000
WORK_PER_CHAR = 1.5
#: what each kind of work costs, in those units (measured by bench/bench_unrender.py)
_STEP_COST = 3.0  # one step of the search: a message's text ended at one more place
_FRAME_COST = 25.0  # a message begun: the places its text may end, gathered from every glue
_SCAN_COST = 0.002  # a character searched for a glue (str.find, in C)
_DECODE_COST = 4.0  # a character of an assistant text run through the template's decoder (in Python)
_MARKUP_COST = 0.02  # a character checked for the template's markup
_MESSAGE_COST = 3.0  # a message of a reading put together as a dict
_RENDER_COST = 0.25  # a character of a render back
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
    decoders = grammar.decoders
    assert decoders is not None  # set when the grammar was learned
    work = _Work(len(prompt))
    texts = _Texts(prompt, grammar, decoders, work)
    reader = _Reader(prompt, grammar, work, texts if strict else None)
    check = _Check(chat, prompt, options, work)
    later: list[tuple[list[dict[str, Any]], str]] = []  # readings whose texts hold markup, tried last
    for reading, ending in reader.readings():
        if check.spent or work.spent:
            break
        for messages, found in _forms(reading, ending, texts):
            if found is not None:
                texts.marked = texts.marked or found
                if not strict and len(later) < _MAX_RENDERS:
                    later.append((messages, ending))
            elif (parsed := check.renders_back(messages, ending)) is not None:
                return parsed
    for messages, ending in later:
        if (parsed := check.renders_back(messages, ending)) is not None:
            return parsed
    why = _mismatch(chat, prompt, reader.furthest, check.closest, grammar, options)
    if work.spent:
        why += (
            f" (The reading stopped at its work budget, {work.budget:,.0f} units for {len(prompt):,} characters:"
            " the prompt holds text that reads many ways.)"
        )
    if texts.marked is not None and strict:
        why += f" (Readings whose texts hold the template's own markup, {texts.marked!r}, are not taken: strict=True.)"
    raise PromptMismatchError(why)


class _Work:
    """What one parse may still spend, in units of about a microsecond (:data:`WORK_BASE` and
    :data:`WORK_PER_CHAR`); every kind of work pays before or as it runs."""

    __slots__ = ("budget", "left")

    def __init__(self, length: int) -> None:
        self.budget = WORK_BASE + WORK_PER_CHAR * length
        self.left = self.budget

    @property
    def spent(self) -> bool:
        return self.left <= 0

    def afford(self, units: float) -> bool:
        """Pay ``units`` if they are left (True); otherwise spend everything (False): the parse stops."""
        if units > self.left:
            self.left = 0
            return False
        self.left -= units
        return True


class _Check:
    """Readings rendered back, at most :data:`_MAX_RENDERS` of them; the closest miss is kept for the error."""

    def __init__(self, template: ChatTemplate, prompt: str, options: dict[str, Any], work: _Work) -> None:
        self.template = template
        self.prompt = prompt
        self.options = options
        self.work = work
        self.renders = 0
        #: how far the rendered reading that agrees with the prompt longest agrees, and what it has there
        self.closest = (-1, "")

    @property
    def spent(self) -> bool:
        return self.renders >= _MAX_RENDERS

    def renders_back(self, messages: list[dict[str, Any]], ending: str) -> ParsedConversation | None:
        """The parsed conversation if ``messages``, ending so, render into the prompt; None otherwise (or when
        the renders are spent)."""
        if self.spent or not self.work.afford(_RENDER_COST * len(self.prompt)):
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


def _markup_in(message: dict[str, Any], structure: list[str]) -> str | None:
    """The first piece of the template's markup in the message's text or reasoning, if any."""
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


#: a place a message's text may end, as the search keeps it (a heap entry): (the end, -the length of what follows,
#: the rank of the next role or -1 at the prompt's end, a serial number (ties go no further), the glue's index in
#: the role's glues or -1 for a tail, the glue's cursor in its occurrences, how the prompt ends for a tail or the
#: fields read from the glue's slots)
_Place = tuple[int, int, int, int, int, int, Any]


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

    def __init__(self, prompt: str, grammar: _Grammar, work: _Work, texts: _Texts | None) -> None:
        self.prompt = prompt
        self.grammar = grammar
        self.work = work
        #: with strict readings: the texts, to cut off every reading through a message whose every form holds
        #: the template's markup
        self.texts = texts
        #: how far into the prompt any reading got (where it stops following the template), -1: not started
        self.furthest = -1
        #: where each glue occurs in the prompt, found once (:meth:`_found`), and each role's glues
        self._occurrences: dict[str, list[int]] = {}
        self._tables: dict[str, tuple[list[tuple[int, int, str]], list[_Glue]]] = {}
        self._serial = itertools.count()

    def readings(self) -> Iterator[tuple[_Step, str]]:
        """Every reading (its last message, which links to the ones before, and how the prompt ends), depth
        first: from the longest head, each message's text ending at the earliest place a glue to a next message
        (or the tail) follows; the places are found as the search reaches them. Each step is paid for."""
        prompt, work, texts = self.prompt, self.work, self.texts
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
        for at, _, role in starts:
            # each frame: a message being read (its role, start, whether its reasoning is open, the one before)
            # and the places its text may end, not yet tried
            stack: list[tuple[str, int, bool, _Step | None, list[_Place], tuple[tuple[str, str], ...]]] = [
                (role, at, False, None, self._ends(role, at), ())
            ]
            while stack and work.afford(_STEP_COST):
                role, at, opened, before, ends, fields = stack[-1]
                self.furthest = max(self.furthest, at)
                if not ends:
                    stack.pop()
                    continue
                end, length, _, _, index, cursor, payload = heapq.heappop(ends)
                step = _Step(role, at, end, opened, before, fields)
                if index >= 0:
                    glue = self._table(role)[1][index]
                    self._push(ends, glue, index, cursor + 1)  # the same glue's next place
                if texts is not None and texts.hopeless(step):
                    continue  # every reading through this text holds markup: none is taken (strict)
                if index < 0:
                    yield step, payload
                else:
                    following, opens = glue[0], glue[2]
                    start = end - length
                    stack.append((following, start, opens, step, self._ends(following, start), payload))

    def _ends(self, role: str, at: int) -> list[_Place]:
        """Where the text of a ``role`` message starting at ``at`` may end, as a heap: earliest first, then the
        longest text after it, then the likelier next role. Each glue is in it by its next place only, and the
        search puts the one after in when it takes one (:meth:`_push`)."""
        self.work.afford(_FRAME_COST)
        tails, glues = self._table(role)
        serial = self._serial
        heap: list[_Place] = [
            (end, negative, -1, next(serial), -1, 0, ending) for end, negative, ending in tails if end >= at
        ]
        for index, glue in enumerate(glues):
            self._push(heap, glue, index, bisect.bisect_left(glue[3], at), heapify=False)
        heapq.heapify(heap)
        return heap

    def _push(self, heap: list[_Place], glue: _Glue, index: int, cursor: int, *, heapify: bool = True) -> None:
        """Put the place of ``glue`` (the role's glue ``index``) at or after occurrence ``cursor`` of its literal start
        into the heap, if there is one; a glue with slots must match there."""
        _, text, _, found, rank, negative, pattern = glue
        while cursor < len(found):
            start = found[cursor]
            place: _Place
            if pattern is None:
                place = (start, negative, rank, next(self._serial), index, cursor, ())
            else:
                self.work.afford(_SCAN_COST * len(text))
                match = pattern.match(self.prompt, start)
                if match is None:
                    cursor += 1
                    continue
                fields = tuple((_SLOT_FIELDS[k], v) for k, v in match.groupdict().items())
                place = (start, start - match.end(), rank, next(self._serial), index, cursor, fields)
            if heapify:
                heapq.heappush(heap, place)
            else:
                heap.append(place)
            return

    def _table(self, role: str) -> tuple[list[tuple[int, int, str]], list[_Glue]]:
        """What can follow a ``role`` message, found once per prompt: the tails the prompt ends with (where the
        text would end, -the tail's length, how the prompt ends), and the glues (:data:`_Glue`)."""
        known = self._tables.get(role)
        if known is None:
            prompt = self.prompt
            tails = sorted(
                (len(prompt) - len(tail), -len(tail), ending)
                for ending, tail in self.grammar.tails.get(role, ())
                if prompt.endswith(tail)
            )
            glues: list[_Glue] = []
            for following, glue, opens in self.grammar.glues.get(role, ()):
                lead = glue.split(_SLOT)[0]
                if lead:  # "" says nothing (and a glue must start with text to be found)
                    pattern = _pattern(glue) if _SLOT in glue else None
                    glues.append((following, glue, opens, self._found(lead), _RANK[following], -len(glue), pattern))
            known = self._tables[role] = (tails, glues)
        return known

    def _found(self, text: str) -> list[int]:
        """Where ``text`` occurs in the prompt, in order. The prompt is searched for it once (paid for then), not
        again from each message: a glue that occurs rarely would be searched for to the end of the prompt from
        every message otherwise."""
        found = self._occurrences.get(text)
        if found is None:
            self.work.afford(_SCAN_COST * len(self.prompt))
            found = self._occurrences[text] = []
            end = self.prompt.find(text)
            while end >= 0:
                found.append(end)
                end = self.prompt.find(text, end + 1)
            self.work.afford(_STEP_COST * len(found) / 8)
        return found


#: a glue as the search uses it: (the next role, the glue, whether it opens the next reasoning, where its literal
#: start occurs in the prompt, the next role's rank, -its length, its pattern if it has slots)
_Glue = tuple[str, str, bool, list[int], int, int, "re.Pattern[str] | None"]


@dataclass(slots=True)
class _Text:
    """One message text of the prompt (a span), in each form a reading may give it, with the markup each holds."""

    plain: dict[str, Any]
    plain_markup: str | None
    #: the assistant text read by the template's decoder (None: the same as plain), and the markup it holds
    decoded: dict[str, Any] | None = None
    decoded_markup: str | None = None
    #: the decoded message with the whitespace a template writes after reasoning taken off its text (None: the
    #: same as decoded)
    trimmed: dict[str, Any] | None = None
    trimmed_markup: str | None = None

    @property
    def hopeless(self) -> bool:
        """Every form of it holds markup: no strict reading through it is taken."""
        return (
            self.plain_markup is not None
            and (self.decoded is None or self.decoded_markup is not None)
            and (self.trimmed is None or self.trimmed_markup is not None)
        )


class _Texts:
    """The message texts the readings of one prompt are made of, each read (decoded, checked for markup) once
    however many readings share it, and paid for when it is."""

    def __init__(self, prompt: str, grammar: _Grammar, decoders: _AssistantDecoders, work: _Work) -> None:
        self.prompt = prompt
        self.structure = grammar.structure
        self.decoders = decoders
        self.work = work
        self._texts: dict[tuple[int, int, bool, bool, tuple[tuple[str, str], ...], str], _Text] = {}
        #: the first piece of markup a text of a reading held, for the error
        self.marked: str | None = None

    def get(self, step: _Step, *, last_open: bool = False) -> _Text:
        """The forms of ``step``'s text; the text of a last message the prompt leaves open stays plain."""
        key = (step.start, step.end, step.opened, last_open, step.fields, step.role)
        known = self._texts.get(key)
        if known is not None:
            return known
        text = self.prompt[step.start : step.end]
        self.work.afford((_MARKUP_COST * max(1, len(self.structure) >> 3) + _SCAN_COST) * len(text))
        plain = {"role": step.role, "content": text, **dict(step.fields)}
        entry = _Text(plain, _markup_in(plain, self.structure))
        if step.role == "assistant" and not last_open:
            decoded = self.decoders.decode(text, step.opened, self.work)
            if decoded is not None:
                entry.decoded, entry.decoded_markup = decoded, _markup_in(decoded, self.structure)
                if decoded.get("reasoning_content") and isinstance(decoded.get("content"), str):
                    trimmed = {**decoded, "content": decoded["content"].lstrip()}
                    if trimmed != decoded:
                        entry.trimmed, entry.trimmed_markup = trimmed, _markup_in(trimmed, self.structure)
        self._texts[key] = entry
        return entry

    def hopeless(self, step: _Step) -> bool:
        """Whether every strict reading through ``step`` is refused for markup (noted for the error)."""
        entry = self.get(step)
        if entry.hopeless:  # its plain form holds markup too, which a last message left open keeps
            self.marked = self.marked or entry.plain_markup
            return True
        return False


def _forms(last: _Step, ending: str, texts: _Texts) -> Iterator[tuple[list[dict[str, Any]], str | None]]:
    """The messages of a reading, most structured first, each with the first markup its texts hold: assistant
    texts read by the template's decoder into reasoning and tool calls (their text without the whitespace a
    template writes after reasoning, then as it is), then every text as it is. The last message's text stays
    whole when the prompt leaves it open."""
    steps: list[_Step] = []
    step: _Step | None = last
    while step is not None:
        steps.append(step)
        step = step.before
    steps.reverse()
    texts.work.afford(_MESSAGE_COST * len(steps))
    entries = [texts.get(s, last_open=ending == "open" and index == len(steps) - 1) for index, s in enumerate(steps)]
    plain = [e.plain for e in entries]
    plain_markup = next((e.plain_markup for e in entries if e.plain_markup is not None), None)
    if any(e.decoded is not None for e in entries):
        decoded = [e.decoded if e.decoded is not None else e.plain for e in entries]
        decoded_markup = next(
            (m for e in entries if (m := e.decoded_markup if e.decoded is not None else e.plain_markup) is not None),
            None,
        )
        if any(e.trimmed is not None for e in entries):
            trimmed = [e.trimmed if e.trimmed is not None else d for e, d in zip(entries, decoded, strict=True)]
            trimmed_markup = next(
                (
                    m
                    for e in entries
                    if (
                        m := e.trimmed_markup
                        if e.trimmed is not None
                        else e.decoded_markup
                        if e.decoded is not None
                        else e.plain_markup
                    )
                    is not None
                ),
                None,
            )
            yield trimmed, trimmed_markup
        yield decoded, decoded_markup
    yield plain, plain_markup


class _AssistantDecoders:
    """An assistant message's text read by the template's own output format: its reasoning (in the text, or
    the text in it) and tool calls as fields. Kept with the grammar and shared by the calls that use it (a
    decoder keeps no state between texts)."""

    def __init__(self, template: ChatTemplate, options: dict[str, Any]) -> None:
        self.template = template
        self.tools = options.get("tools")
        self._decoders: dict[bool, Any] = {}
        #: by ``opened``: the markers without which a text is content alone (none: it must be decoded)
        self._markers: dict[bool, tuple[str, ...]] = {}

    def decode(self, text: str, opened: bool, work: _Work) -> dict[str, Any] | None:
        """The message, or None when the text holds neither reasoning nor tool calls (or the format has none, or
        ``work`` cannot pay for decoding it)."""
        decoder = self._decoder(opened)
        if decoder is None:
            return None
        markers = self._markers.get(opened)
        if markers is None:
            fmt = decoder.format
            plain = not opened and not decoder.options.forced_open and not fmt.uses_tag
            markers = self._markers[opened] = fmt.markers if plain else ()
        if markers:
            work.afford(_SCAN_COST * len(text) * len(markers))
            if not any(marker in text for marker in markers):
                return None  # no marker of its reasoning or calls: the text is content (decoding it says so, slowly)
        if not work.afford(_DECODE_COST * len(text)):
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
