"""Assistant masks and per-message spans for any template, with or without ``{% generation %}`` tags.

With tags, the mask is transformers' ``return_assistant_tokens_mask``: a token is 1 when it overlaps a
generation block (parity notes §2.8–2.9).

Without tags, the conversation is rendered a second time with every content string wrapped in a pair of
private-use marker characters, around its text without surrounding whitespace (so ``| trim`` and
``.strip()`` in a template act as before). Removing the markers must give back the prompt exactly, or the
template treated marked content differently and nothing is inferred. The markers that survive show where
each message's text landed ("anchors"). Then, for each assistant turn:

* it **starts** after its header: the generation prompt (``<|im_start|>assistant\\n``), found by rendering
  the messages before the first assistant turn with and without ``add_generation_prompt``, and looked
  for between the previous message's last anchor and the turn's first one. Template text after the header
  (Qwen3's ``<think>``, ``<tool_call>``) is what the model writes, so it is in. An assistant message that
  follows another with no header and no special token between them (Qwen-Agent's calls, one message
  each) goes on the same turn: it starts where the previous one's text ended;
* it **ends** with its end-of-turn token: the first special token after its last anchor.

So the mask follows what is in the text: reasoning a template drops from earlier turns is not there to
mask. Tokens straddling a turn's edge are 1 when any of their characters is in the turn (the same overlap
rule as with tags), so the model is trained on every character it must produce.
"""

from __future__ import annotations

import marshal
import re
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import accumulate, compress, islice, repeat
from operator import add, attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple
from weakref import WeakKeyDictionary

from jinja2 import nodes

from .exceptions import ChatcodecError, InputError, MaskError
from .render import plain
from .resuming import Memo, Record
from .vocab import common_prefix

if TYPE_CHECKING:
    from .tokens import Codec, Encoding
    from .vocab import Run

__all__ = ["Growing", "Layout", "MaskMemory", "assistant_mask", "has_generation_tags", "layout", "message_token_spans"]

_MARK_FIRST, _MARK_LAST = 0xF0000, 0xFFFFD
_MARK_RANGE = re.compile("[\U000f0000-\U000ffffd]")
_MARK_SPLIT = re.compile("([\U000f0000-\U000ffffd])")
_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass
class Layout:
    """Where the template put each message: the anchors of its content, and the turn header.

    The anchors and the header cost three more renders; they are found the first time they are read,
    so a template with ``{% generation %}`` tags, whose mask needs neither, never pays for them.
    """

    text: str
    roles: list[str | None]
    #: ``{% generation %}`` spans in ``text``, when the template has tags
    generation_spans: list[tuple[int, int]] | None
    special: re.Pattern[str]
    added: re.Pattern[str]
    #: finds the anchors, the reason they could not be found (or None), the header, and what a growing
    #: conversation's next encode can start from (or None)
    locate: Callable[[], tuple[list[list[tuple[int, str]]], str | None, str | None, MaskMemory | None]]

    @cached_property
    def _located(self) -> tuple[list[list[tuple[int, str]]], str | None, str | None, MaskMemory | None]:
        return self.locate()

    @property
    def memory(self) -> MaskMemory | None:
        """What this encode leaves the next encode of its conversation, when it grew from the last one."""
        return self._located[3]

    @property
    def anchors(self) -> list[list[tuple[int, str]]]:
        """Per message, ``(position, kind)`` of each surviving marker, in the order of the text (so a message's
        first anchor is its leftmost and its last the rightmost); kind is content, reasoning or tool_call."""
        return self._located[0]

    @property
    def failure(self) -> str | None:
        """Why no anchors could be found, if so."""
        return self._located[1]

    @property
    def header(self) -> str | None:
        """The generation prompt, or None when it could not be rendered."""
        return self._located[2]

    @cached_property
    def header_cuts(self) -> tuple[int, ...]:
        return _header_cuts(self.header, self.added) if self.header else ()

    @cached_property
    def header_opens(self) -> bool:
        """The header ends with a control token, which the turn's text closes (Qwen3.5's ``<think>\n``)."""
        header = self.header
        return header is not None and any(m.end() == len(header.rstrip()) for m in self.added.finditer(header))


def layout(
    codec: Codec,
    messages: Any,
    options: dict[str, Any],
    rendered: str,
    escapes: dict[str, str],
    text: str,
    spans: list[tuple[int, int]] | None = None,
    growing: Growing | None = None,
) -> Layout:
    """Where every message landed: the ``{% generation %}`` spans of a tagged template (``spans``, when the
    encode's render tracked them, else from a render of its own), or the anchors of a marked render (which
    resumes the last encode's of the conversation, with ``growing``)."""
    vocab = codec._require_tokenizer()
    special, added = _patterns(vocab, codec.template.special_tokens)
    source = getattr(messages, "messages", messages)
    previous = growing.previous if growing is not None else None
    if previous is not None and type(source) is list:
        # the codec's own copies of a growing conversation (plain JSON): the roles of those seen as before are known
        chat = source
        known = min(growing.trusted, len(previous.roles))  # type: ignore[union-attr]
        roles = previous.roles[:known] + _roles(chat[known:])
    else:
        chat = [m if isinstance(m, dict) else plain(m) for m in source]
        roles = _roles(chat)

    generation_spans = None
    if has_generation_tags(tuple(codec.template.sources.values())):
        if options.get("continue_final_message"):
            raise InputError("continue_final_message is not compatible with return_assistant_tokens_mask.")
        spanned = rendered
        if spans is None:
            span_options = {k: v for k, v in options.items() if k != "continue_final_message"}
            spanned, spans = codec.template.render_spans(chat, **span_options)
        if escapes and not all(len(char) == 1 for char in escapes.values()):
            expand = _expander(spanned, escapes)
            generation_spans = [(expand(s), expand(e)) for s, e in spans]
        else:
            generation_spans = list(spans)  # stand-ins put back one for one: the render's positions are the text's

    def locate() -> tuple[list[list[tuple[int, str]]], str | None, str | None, MaskMemory | None]:
        if growing is not None:
            memory = _anchors_growing(codec, chat, roles, options, rendered, escapes, text, growing)
            if memory is not None:
                memory.header = _generation_header(codec, chat, roles, options)
                memory.roles = roles
                return memory.anchors, None, memory.header, memory
        anchors: list[list[tuple[int, str]]] = [[] for _ in chat]
        failure = None
        for only_assistant in (False, True):
            found = _anchors(codec, chat, roles, options, rendered, escapes, text, only_assistant=only_assistant)
            if isinstance(found, list):
                anchors, failure = found, None
                break
            failure = found
        return anchors, failure, _generation_header(codec, chat, roles, options), None

    return Layout(text, roles, generation_spans, special, added, locate)


def _roles(chat: list[Any]) -> list[str | None]:
    return [m.get("role") if isinstance(m, dict) and isinstance(m.get("role"), str) else None for m in chat]


#: per vocabulary, per template special tokens (their texts in order): the special and the added tokens' patterns
_PATTERNS: WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[re.Pattern[str], re.Pattern[str]]]] = WeakKeyDictionary()


def _patterns(vocab: Any, special_tokens: dict[str, Any]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The patterns of the special tokens (the tokenizer's, and the template's it holds) and of all added tokens:
    made once per vocabulary and template special tokens, not for every encoding (hundreds of texts for Llama 3)."""
    texts = tuple(special_tokens.values())
    known: dict[tuple[Any, ...], Any] | None = None
    found = None
    try:
        known = _PATTERNS.setdefault(vocab, {})
        found = known.get(texts)
    except TypeError:  # not weakly referable, or a value that is not a text: nothing is kept
        known = None
    if found is None:
        special_texts = set(vocab.special) | {t for t in texts if t in vocab.added}
        found = (_alternation(frozenset(special_texts)), _alternation(frozenset(vocab.added)))
        if known is not None:
            if len(known) >= 64:
                known.clear()
            known[texts] = found
    return found


@lru_cache(maxsize=64)
def has_generation_tags(sources: tuple[str, ...]) -> bool:
    """Whether a template's sources hold ``{% generation %}`` blocks (then they decide the mask).

    >>> has_generation_tags(("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",))
    True
    """
    return any(_GENERATION_TAG.search(source) for source in sources)


# --- the marked render -----------------------------------------------------------------------------------


def _anchors(
    codec: Codec,
    chat: list[Any],
    roles: list[str | None],
    options: dict[str, Any],
    rendered: str,
    escapes: dict[str, str],
    text: str,
    *,
    only_assistant: bool,
) -> list[list[tuple[int, str]]] | str:
    """Each message's anchors, or the reason the marked render could not be used."""
    reserved = set() if rendered.isascii() else set(_MARK_RANGE.findall(rendered))
    marker = _Marker(reserved)
    marked = _marked(chat, roles, marker, 0, only_assistant=only_assistant)
    if not marker.leaves:
        return [[] for _ in chat]
    try:
        output = codec.template.render(marked, **options)
    except ChatcodecError as exc:
        return f"the template failed on marked content ({exc})"
    scan = _anchors_in if all(len(char) == 1 for char in escapes.values()) else _anchors_scan
    return scan(output, marker.leaves, escapes, text, len(chat))


def _marked(
    chat: list[Any], roles: list[str | None], marker: _Marker, first: int, *, only_assistant: bool = False
) -> list[Any]:
    """The messages from ``first`` on with their content strings wrapped by ``marker`` (in order: the markers
    of a message depend on the messages before it only)."""
    marked = []
    for index in range(first, len(chat)):
        message = chat[index]
        marker.counters.append(marker.next)
        if not isinstance(message, dict) or (only_assistant and roles[index] != "assistant"):
            marked.append(message)
            continue
        message = dict(message)
        if "content" in message:
            message["content"] = marker.wrap(message["content"], index, "content")
        if roles[index] == "assistant":
            for name in _REASONING_FIELDS:
                if isinstance(message.get(name), str):
                    message[name] = marker.wrap(message[name], index, "reasoning")
            if isinstance(message.get("tool_calls"), list):
                message["tool_calls"] = [_mark_call(call, marker, index) for call in message["tool_calls"]]
            if isinstance(message.get("function_call"), dict):
                message["function_call"] = _mark_call(message["function_call"], marker, index)
        marked.append(message)
    return marked


def _anchors_scan(
    output: str, leaves: dict[str, tuple[int, str]], escapes: dict[str, str], text: str, count: int
) -> list[list[tuple[int, str]]] | str:
    """The anchors in the marked render ``output``, read marker by marker and stand-in by stand-in; or why
    there are none: the render without markers, stand-ins swapped back, must be the prompt's ``text``."""
    chars = set(leaves) | set(escapes)
    pattern = re.compile("[" + "".join(map(re.escape, sorted(chars))) + "]")
    anchors: list[list[tuple[int, str]]] = [[] for _ in range(count)]
    parts: list[str] = []
    length = cursor = 0
    for match in pattern.finditer(output):
        piece = output[cursor : match.start()]
        parts.append(piece)
        length += len(piece)
        char = match.group()
        if char in escapes:
            parts.append(escapes[char])
            length += len(escapes[char])
        else:
            index, kind = leaves[char]
            anchors[index].append((length, kind))
        cursor = match.end()
    parts.append(output[cursor:])
    if "".join(parts) != text:
        return "the template renders marked content differently (it inspects the text, not just prints it)"
    return anchors


def _anchors_in(
    output: str, leaves: dict[str, tuple[int, str]], escapes: dict[str, str], text: str, count: int
) -> list[list[tuple[int, str]]] | str:
    """:func:`_anchors_scan`, when every stand-in stands for one character: the render is split at the markers,
    a marker's place in the text is the length of the pieces before it, and the text checked is the pieces
    joined (C passes, not a Python step per marker and stand-in). A character of the markers' range that is
    not a marker (the prompt held it) goes to the scan."""
    split = _split_at_markers(output, leaves)
    if split is None:  # a character of the range that is no marker
        return _anchors_scan(output, leaves, escapes, text, count)
    found, pieces = split
    anchors: list[list[tuple[int, str]]] = [[] for _ in range(count)]
    for (index, kind), place in zip(found, accumulate(map(len, pieces)), strict=False):  # one piece more
        anchors[index].append((place, kind))
    if not _restores(pieces, escapes, text):
        return "the template renders marked content differently (it inspects the text, not just prints it)"
    return anchors


def _split_at_markers(
    output: str, leaves: dict[str, tuple[int, str]]
) -> tuple[list[tuple[int, str]], list[str]] | None:
    """The markers of a marked render, as ``leaves`` says whose they are, and the text around them (one piece
    more than markers); None when a character of the markers' range is no marker."""
    parts = _MARK_SPLIT.split(output)  # text, marker, text, marker, ..., text
    found: list[tuple[int, str]] = list(map(leaves.get, parts[1::2]))  # type: ignore[arg-type]
    return None if None in found else (found, parts[0::2])


def _restores(pieces: list[str], escapes: dict[str, str], text: str) -> bool:
    """Whether the text around the markers, one-character stand-ins put back, is ``text``: the template printed
    the marked content as it prints the content, and nothing else changed."""
    stripped = "".join(pieces)
    for stand_in, char in escapes.items():
        stripped = stripped.replace(stand_in, char)
    return stripped == text


class _Marker:
    """Hands out marker characters, two per content string, none that the prompt already holds.

    A marker that goes on from an earlier one (``leaves`` and ``first``: the markers it handed out to the
    messages before, and the next character) marks the later messages as the earlier one would have.
    """

    def __init__(
        self, reserved: set[str], leaves: dict[str, tuple[int, str]] | None = None, first: int = _MARK_FIRST
    ) -> None:
        self.reserved = reserved
        self.leaves: dict[str, tuple[int, str]] = leaves if leaves is not None else {}
        self._next = first
        #: the next character's code point before each message was marked (:func:`_marked`)
        self.counters: list[int] = []

    @property
    def next(self) -> int:
        return self._next

    def wrap(self, value: Any, index: int, kind: str) -> Any:
        if isinstance(value, str):
            core = value.strip()
            if not core:
                return value
            opening = self._char(index, kind)
            closing = self._char(index, kind)
            if core is value:  # nothing to strip (most text): one concatenation
                return f"{opening}{core}{closing}"
            at = value.index(core)
            return value[:at] + opening + core + closing + value[at + len(core) :]
        if isinstance(value, list):
            return [
                {**part, "text": self.wrap(part["text"], index, kind)}
                if isinstance(part, dict) and isinstance(part.get("text"), str)
                else part
                for part in value
            ]
        return value

    def _char(self, index: int, kind: str) -> str:
        if self.reserved:
            while self._next <= _MARK_LAST and chr(self._next) in self.reserved:
                self._next += 1
        if self._next > _MARK_LAST:
            raise MaskError("The conversation has more content strings than chatcodec can mark.")
        char = chr(self._next)
        self._next += 1
        self.leaves[char] = (index, kind)
        return char


def _mark_call(call: Any, marker: _Marker, index: int) -> Any:
    """Mark the argument values of a tool call; names, ids and types are left alone (templates compare them)."""
    if not isinstance(call, dict):
        return call
    function = call.get("function")
    target: dict[str, Any] = function if isinstance(function, dict) else call
    arguments = target.get("arguments")
    if isinstance(arguments, str):
        new_arguments: Any = marker.wrap(arguments, index, "tool_call")
    elif isinstance(arguments, dict):
        new_arguments = {k: marker.wrap(v, index, "tool_call") for k, v in arguments.items()}
    else:
        return call
    if target is call:
        return {**call, "arguments": new_arguments}
    return {**call, "function": {**target, "arguments": new_arguments}}


def _expander(rendered: str, escapes: dict[str, str]) -> Any:
    """Map a position in the render with escape stand-ins to the position in the restored text: moved by what
    the stand-ins before it grow (found by bisection: a tagged template's spans cost their number, not their
    number times the stand-ins')."""
    found = [(m.start(), len(escapes[m.group()]) - 1) for m in re.finditer("|".join(map(re.escape, escapes)), rendered)]
    starts = [at for at, _ in found]
    grown = list(accumulate((extra for _, extra in found), initial=0))

    def expand(position: int) -> int:
        return position + grown[bisect_left(starts, position)]

    return expand


# --- a growing conversation ------------------------------------------------------------------------------


class Growing(NamedTuple):
    """What an encode of a conversation that grew from the last one gives its mask: the last encode's
    :class:`MaskMemory` (or None), how many leading messages the encode saw as the last one did (the same
    objects, unchanged: ``trusted``), and where to keep this encode's memory (or None)."""

    previous: MaskMemory | None
    trusted: int
    keep: Callable[[MaskMemory], None] | None


class MaskMemory:
    """What the default assistant mask of one encode leaves the next encode of the same conversation, so that
    its cost follows the new messages, not the history (a serving or agent loop encodes the whole chat at
    every turn).

    * The **marked render** resumes the last one (:mod:`chatcodec.resuming`): the marked copies of the
      messages it saw as before are the ones it rendered (``seen``), and the markers go on from where those
      messages' ended (``counters``, ``leaves``), so the marked copies are what a fresh marking would make.
    * The **anchors** before the first character where the two marked renders, or the two prompts, differ
      are the last ones (``places``, ``marks``, ``owners``); only the rest of the render is read, and checked
      against the rest of the prompt. Anchors of messages the render did not see as before are read again.
    * The **turns** whose text and neighbours lie before that point and belong to messages that kept all
      their anchors are the last ones (``regions``); the others are found again.
    * The **mask** of the leading tokens that are the very same (the prompt's runs, kept by the tokenizer)
      and end before the first turn that changed is the last one's; the rest is worked out again.

    Every step checks what it reuses, so the mask is always the one a codec without memory computes; what
    cannot be read this way (a prompt that holds characters of the markers' range, stand-ins for several
    characters, a template that looks at the marked text) is worked out in full.
    """

    __slots__ = (
        "anchors", "at", "counters", "done", "emitted", "escapes", "firsts", "header", "keep", "kept_spans",
        "leaves", "lo", "marks", "mask", "nexts", "output", "owners", "places", "previous", "reach", "record",
        "regions", "roles", "runs", "seen", "size", "spans", "special", "starts", "text",
    )  # fmt: skip

    def __init__(
        self,
        seen: list[Any],
        record: Record | None,
        counters: list[int],
        leaves: dict[str, tuple[int, str]],
        output: str,
        text: str,
        escapes: dict[str, str],
    ) -> None:
        #: the marked messages the marked render saw (normalized), and its record: what the next one resumes
        self.seen = seen
        self.record = record
        #: the first marker's code point of each message, and the next one after the last
        self.counters = counters
        #: marker -> (message index, kind), in the order they were handed out
        self.leaves = leaves
        self.output = output
        self.text = text
        self.escapes = escapes
        #: of every anchor in the order of the text: its place in ``text``, in ``output``, its (message, kind),
        #: and the highest message index of the anchors up to it
        self.places: list[int] = []
        self.marks: list[int] = []
        self.owners: list[tuple[int, str]] = []
        self.reach: list[int] = []
        self.anchors: list[list[tuple[int, str]]] = []
        self.roles: list[str | None] = []
        #: up to where (in ``text``) the anchors are the last encode's, and the first message whose are not
        self.at = 0
        self.lo = 0
        self.header: str | None = None
        self.special: re.Pattern[str] | None = None
        #: per assistant turn (in the order of the messages): (message, next anchored message, first anchor
        #: of that one, start, end); the next ones' indices; how many spans the turns before each gave (the
        #: turns with text); the spans
        self.regions: list[tuple[int, int, int, int, int]] | None = None
        self.nexts: list[int] = []
        self.emitted: list[int] = [0]
        self.spans: list[tuple[int, int]] = []
        #: how many of the spans are the last encode's
        self.kept_spans = 0
        #: the runs the mask is of, where each starts in the text, the index of its first token (and the
        #: count); the mask
        self.runs: list[Run] | None = None
        self.starts: list[int] = []
        self.firsts: list[int] = []
        self.mask: list[int] | None = None
        #: the last encode's memory and where to keep this one, while it is being made (then dropped: memories
        #: do not chain); once kept (``done``), it is read, never changed (other threads read it)
        self.previous: MaskMemory | None = None
        self.keep: Callable[[MaskMemory], None] | None = None
        self.done = False
        self.size = 0

    def finish(self) -> None:
        """Done with the last encode's memory: keep this one where the encode said."""
        keep, self.keep, self.previous, self.done = self.keep, None, None, True
        self.size = self.estimate()
        if keep is not None:
            keep(self)

    def estimate(self) -> int:
        """About how many bytes this memory holds beyond the prompt and its runs (the encode's own)."""
        record = self.record
        return (
            8 * len(self.output)  # the render and the marked copies of the messages' text, markers make both wide
            + 100 * len(self.leaves)
            + 90 * len(self.places)
            + 68 * len(self.anchors)
            + 160 * len(self.regions or ())
            + 80 * len(self.starts)
            + 8 * len(self.mask or ())
            + (24 * len(record.offsets) if record is not None else 0)
        )


def _anchors_growing(
    codec: Codec,
    chat: list[Any],
    roles: list[str | None],
    options: dict[str, Any],
    rendered: str,
    escapes: dict[str, str],
    text: str,
    growing: Growing,
) -> MaskMemory | None:
    """The anchors of a conversation that grew from the last encode's, in a :class:`MaskMemory`: its marked
    render resumed, and read from where it differs from the last one. None when the marked render cannot be
    read this way (the usual path then says why)."""
    # The markers reserve nothing: a prompt that holds a character of their range (which a fresh marking would
    # skip) fails the reading below, which then leaves it to the usual path (no scan of the prompt for them)
    if any(len(char) != 1 for char in escapes.values()):
        return None  # places in the render would not be places in the prompt
    previous = growing.previous
    start = min(growing.trusted, len(previous.counters) - 1, len(chat)) if previous is not None else 0
    if previous is None or not start:
        previous, start, marker = None, 0, _Marker(set())
    else:  # the messages seen as before keep their marked copies, and the markers go on after theirs
        first = previous.counters[start]
        leaves = previous.leaves
        handed = first - _MARK_FIRST
        marker = _Marker(set(), leaves.copy() if handed == len(leaves) else dict(islice(leaves.items(), handed)), first)
    marked = (previous.seen[:start] if previous is not None else []) + _marked(chat, roles, marker, start)
    if not marker.leaves:
        return None
    # the copies kept are the ones the last render saw, normalized, when it left a record
    memo = Memo(previous.record, start) if previous is not None and previous.record is not None else Memo()
    try:
        output = codec.template.render_resuming(memo, marked, **options)
    except ChatcodecError:
        return None  # the usual path renders again, and says what went wrong
    counters = (previous.counters[:start] if previous is not None else []) + marker.counters + [marker.next]
    seen = memo.messages if memo.record is not None and memo.messages is not None else marked
    memory = MaskMemory(seen, memo.record, counters, marker.leaves, output, text, escapes)
    kept, cut = _kept_anchors(previous, output, text, escapes, start) if previous is not None else (0, 0)
    if not _read_marked(memory, previous, kept, cut, start, len(chat)):
        return None
    memory.previous, memory.keep = previous, growing.keep
    return memory


def _kept_anchors(previous: MaskMemory, output: str, text: str, escapes: dict[str, str], start: int) -> tuple[int, int]:
    """How many of the last marked render's anchors hold for this one, and where in ``output`` reading goes on
    (after those anchors' markers): before the first character where the marked renders differ, where the
    prompts differ, and before the first anchor of a message not seen as before (its markers may be another
    message's now)."""
    agree = common_prefix(previous.text, text)
    cut = min(
        common_prefix(previous.output, output),
        agree + bisect_left(previous.places, agree),  # the markers placed before ``agree``, and its text
    )
    owned = bisect_left(previous.reach, start)
    if owned < len(previous.marks):
        cut = min(cut, previous.marks[owned])
    for stand_in in previous.escapes.keys() | escapes.keys():  # a stand-in restored otherwise now
        if previous.escapes.get(stand_in) != escapes.get(stand_in) and previous.output.find(stand_in, 0, cut) >= 0:
            return 0, 0
    return bisect_left(previous.marks, cut), cut


def _read_marked(memory: MaskMemory, previous: MaskMemory | None, kept: int, cut: int, start: int, count: int) -> bool:
    """Read the anchors of ``memory.output`` from ``cut`` on (the ``kept`` anchors before it are
    ``previous``'s), checking that the render without markers is the prompt from there on; False if not."""
    output, text, escapes = memory.output, memory.text, memory.escapes
    at = cut - kept  # the place in the prompt where reading goes on
    split = _split_at_markers(output[cut:] if cut else output, memory.leaves)
    if split is None or not _restores(split[1], escapes, text[at:] if at else text):
        return False
    found, pieces = split
    lengths = list(map(len, pieces))
    lengths[0] += at
    places = list(accumulate(lengths))
    places.pop()  # one piece more than markers
    anchors: list[list[tuple[int, str]]]
    own: set[int] = set()  # the messages whose lists are this memory's (the others are shared with previous)
    if previous is not None and kept:
        dropped: dict[int, int] = {}  # message -> how many of its last anchors are read again
        for index, _ in islice(previous.owners, kept, None):
            dropped[index] = dropped.get(index, 0) + 1
        memory.places = previous.places[:kept] + places
        memory.marks = previous.marks[:kept] + list(map(add, places, range(kept, kept + len(places))))
        memory.owners = previous.owners[:kept] + found
        highest = previous.reach[kept - 1]
        anchors = previous.anchors[:count]
        anchors += [[] for _ in range(count - len(anchors))]
        for index, number in dropped.items():
            if index < count:
                anchors[index] = anchors[index][:-number]
                own.add(index)
        memory.lo = min([start, *dropped, *map(itemgetter(0), found)])
    else:
        memory.places, memory.owners = places, found
        memory.marks = list(map(add, places, range(len(places))))
        highest = -1
        anchors = [[] for _ in range(count)]
        own.update(range(count))
    memory.reach = (previous.reach[:kept] if previous is not None else []) + list(
        accumulate(map(itemgetter(0), found), max, initial=highest)
    )[1:]
    for (index, kind), place in zip(found, places, strict=True):
        if index not in own:
            anchors[index] = list(anchors[index])
            own.add(index)
        anchors[index].append((place, kind))
    memory.anchors, memory.at = anchors, at
    return True


def _growing_regions(layout: Layout, memory: MaskMemory) -> list[tuple[int, int]]:
    """:func:`assistant_regions` with the defaults (reasoning and end-of-turn in), the last encode's turns
    kept where nothing they read changed: the anchors of the turn's message and of the anchored messages
    either side, the text up to the next one's first anchor, the roles, the header and the special tokens.
    The messages before ``memory.lo`` are the last ones, with the same anchors, all placed where the two
    prompts agree: a turn followed by one of them read nothing else."""
    previous = memory.previous
    anchors = layout.anchors
    anchored = list(compress(range(len(anchors)), anchors))
    keep = 0
    if (
        previous is not None
        and previous.regions is not None
        and previous.header == layout.header
        and previous.special is layout.special
    ):
        keep = bisect_left(previous.nexts, memory.lo)
    fresh: list[tuple[int, int, int, int, int]] = []
    if keep:
        assert previous is not None and previous.regions is not None
        kept = previous.regions[:keep]
        memory.kept_spans = previous.emitted[keep]
        memory.spans = previous.spans[: memory.kept_spans]
        memory.spans += _turn_regions(layout, anchored, bisect_right(anchored, kept[-1][0]), True, True, fresh)
        memory.regions = kept + fresh
        memory.nexts = previous.nexts[:keep]
        memory.emitted = previous.emitted[: keep + 1]
    else:
        memory.spans = _turn_regions(layout, anchored, 0, True, True, fresh)
        memory.regions = fresh
    memory.special = layout.special
    memory.nexts += map(itemgetter(1), fresh)
    emitted = (1 if end > start else 0 for _, _, _, start, end in fresh)
    memory.emitted += list(accumulate(emitted, initial=memory.emitted[-1]))[1:]
    return memory.spans


# --- the generation header ------------------------------------------------------------------------------


def _generation_header(codec: Codec, chat: list[Any], roles: list[str | None], options: dict[str, Any]) -> str | None:
    """What ``add_generation_prompt`` adds after the messages before the first assistant turn.

    Two renders of those messages, without and with the prompt; or one, when the template adds the prompt
    last and alone (:func:`_prompt_names`): then the prompt is the same text for every conversation that
    gives the names it reads the same values, and the render without it only tells whether these messages
    render at all.
    """
    first = next((i for i, role in enumerate(roles) if role == "assistant"), None)
    prefix = chat[:first] if first else [{"role": "user", "content": "Hi"}]
    bare = {**options, "add_generation_prompt": False, "continue_final_message": False}
    template = codec.template
    key = _prompt_key(template, bare)
    try:
        without = template.render(prefix, **bare)
    except ChatcodecError:
        return None
    known = _PROMPTS.get(template)
    if key is not None and known is not None and key in known:
        header = known[key]
        if len(without) + len(header) <= template.limits.max_output:  # what the render with it would check
            return header
    try:
        with_prompt = template.render(prefix, **{**bare, "add_generation_prompt": True})
    except ChatcodecError:
        return None
    header = with_prompt[common_prefix(without, with_prompt) :]
    if key is not None and with_prompt == without + header:  # the prompt was added at the end, as planned
        _PROMPTS.setdefault(template, {})[key] = header
    return header


#: per template, the generation prompt for each key of :func:`_prompt_key`
_PROMPTS: WeakKeyDictionary[Any, dict[bytes, str]] = WeakKeyDictionary()
#: what the prompt's block may hold: text, names and tests (no call, filter, attribute, loop or assignment)
_PROMPT_NODES: tuple[type[nodes.Node], ...] = (
    nodes.Output, nodes.If, nodes.TemplateData, nodes.Const, nodes.Name, nodes.Test, nodes.Not, nodes.And,
    nodes.Or, nodes.Concat, nodes.CondExpr,
)  # fmt: skip
_MISSING = object()


def _prompt_key(template: Any, options: dict[str, Any]) -> bytes | None:
    """The values of the names the generation prompt reads (marshalled: 1, 1.0 and True differ), when the
    template adds it last and alone; else None."""
    if not getattr(template, "_only_default", False) or options.get("chat_template") or options.get("polyfill"):
        return None  # the render could take another template, or a rewritten conversation
    names = _prompt_names(template.source)
    if names is None:
        return None
    special = template.special_tokens
    values = tuple(options.get(name, special.get(name, _MISSING)) for name in names)
    try:
        given = tuple((name, value) for name, value in zip(names, values, strict=True) if value is not _MISSING)
        return marshal.dumps(given)
    except ValueError:  # not plain data: no key
        return None


@lru_cache(maxsize=64)
def _prompt_names(source: str) -> tuple[str, ...] | None:
    """The names the generation prompt's text reads, when the template adds it last and alone: its only read
    of ``add_generation_prompt`` is the test of an ``{% if %}`` (no elif, no else) that ends the template,
    and that block holds only text, tests and names the template never sets (not ``messages``). The output
    with the prompt is then the output without it, followed by the block's text, which depends on those
    names only. A template that reads the clock (``strftime_now``) is left out: its two renders may differ.
    None otherwise.
    """
    from .sandbox import environment

    if "strftime_now" in source:
        return None
    try:
        tree = environment.parse(source)
    except Exception:  # the render reports it
        return None
    body = list(tree.body)
    if not body or not isinstance(body[-1], nodes.If):
        return None
    last = body[-1]
    test = last.test
    if not isinstance(test, nodes.Name) or test.name != "add_generation_prompt" or last.elif_ or last.else_:
        return None
    if sum(1 for name in tree.find_all(nodes.Name) if name.name == "add_generation_prompt") != 1:
        return None
    assigned = {name.name for name in tree.find_all(nodes.Name) if name.ctx in ("store", "param")}
    assigned.update(macro.name for macro in tree.find_all(nodes.Macro))
    names: set[str] = set()
    for node in last.body:
        for part in (node, *node.find_all(nodes.Node)):
            if not isinstance(part, _PROMPT_NODES):
                return None
            if isinstance(part, nodes.Name):
                if part.name in assigned or part.name in ("messages", "loop"):
                    return None
                names.add(part.name)
    return tuple(sorted(names))


@lru_cache(maxsize=64)
def _header_cuts(header: str, added: re.Pattern[str]) -> tuple[int, ...]:
    """Lengths of the header's prefixes worth looking for, longest first: whole lines and control tokens (the
    same header for every conversation of a template, mostly: worked out once)."""
    cuts = {len(header)}
    cuts.update(i + 1 for i, char in enumerate(header) if char == "\n")
    cuts.update(m.end() for m in added.finditer(header))
    return tuple(sorted((c for c in cuts if header[:c].strip()), reverse=True))


def _find_header(layout: Layout, glue: str) -> tuple[int, int] | None:
    """Where the turn header (or its longest natural prefix) last occurs in ``glue``."""
    if layout.header is None:
        return None
    if layout.header == "":
        return (len(glue), len(glue))
    for cut in layout.header_cuts:
        at = glue.rfind(layout.header[:cut])
        if at >= 0:
            return (at, at + cut)
    return None


def _end_of_turn(layout: Layout, tail: str) -> tuple[int, int] | None:
    """The first special token of ``tail``, unless it opens the next header."""
    match = layout.special.search(tail)
    if match is None or (layout.header and layout.header.startswith(match.group())):
        return None
    return match.span()


# --- masks ----------------------------------------------------------------------------------------------


def assistant_regions(layout: Layout, *, reasoning: bool, end_of_turn: bool) -> list[tuple[int, int]]:
    """The character spans of the prompt the model writes in its assistant turns."""
    anchored = list(compress(range(len(layout.anchors)), layout.anchors))
    return _turn_regions(layout, anchored, 0, reasoning, end_of_turn)


def _turn_regions(
    layout: Layout,
    anchored: list[int],
    from_rank: int,
    reasoning: bool,
    end_of_turn: bool,
    detail: list[tuple[int, int, int, int, int]] | None = None,
) -> list[tuple[int, int]]:
    """The regions of the assistant turns of the anchored messages from rank ``from_rank`` on; ``detail`` gets, for
    each turn, what its region read and what it is (see :attr:`MaskMemory.regions`)."""
    text, anchors, roles = layout.text, layout.anchors, layout.roles
    regions = []
    for rank in range(from_rank, len(anchored)):
        index = anchored[rank]
        if roles[index] != "assistant":
            continue
        first, last = anchors[index][0][0], anchors[index][-1][0]  # anchors are in the order of the text
        before = anchors[anchored[rank - 1]][-1][0] if rank else 0
        after = anchors[anchored[rank + 1]][0][0] if rank + 1 < len(anchored) else len(text)
        header = _find_header(layout, text[before:first])
        start = before + header[1] if header else first
        if not header and rank and _continues(layout, anchored[rank - 1], text[before:first]):
            start = before  # a second assistant message the template wrote into the same turn
        end = last
        eot = _end_of_turn(layout, text[last:after])
        if eot is not None:
            end = last + (eot[1] if end_of_turn else eot[0])
        if not reasoning:
            thoughts = [p for p, kind in anchors[index] if kind == "reasoning"]
            resume = min((p for p, kind in anchors[index] if kind != "reasoning"), default=end)
            start = _after_reasoning(layout, start, resume, thoughts)
        if detail is not None:
            detail.append((index, anchored[rank + 1] if rank + 1 < len(anchored) else sys.maxsize, after, start, end))
        if end > start:
            regions.append((start, end))
    return regions


def _continues(layout: Layout, previous: int, glue: str) -> bool:
    """Whether an assistant message goes on the turn of the ``previous`` message, with only ``glue`` between:
    the previous message is the assistant's too and no special token ends its turn in between (Qwen-Agent's
    reasoning, then a call, then another call, as consecutive messages of one turn)."""
    return layout.roles[previous] == "assistant" and layout.special.search(glue) is None


def _after_reasoning(layout: Layout, start: int, resume: int, reasoning_anchors: list[int]) -> int:
    """Where the turn goes on after its reasoning block: past the block's closing control token and spaces.

    ``resume`` is where the turn's other text (content, tool calls) begins. An empty block the template
    writes itself (Qwen3's ``<think>\n\n</think>``) counts as reasoning too: a control token right at the
    start of the turn, followed by spaces and a second control token.
    """
    text = layout.text
    if reasoning_anchors:
        cut = max(reasoning_anchors)
    elif layout.header_opens:
        cut = start  # the header opened the block: the turn starts inside it
    else:
        opener = layout.added.match(text, start + _spaces(text, start))
        if opener is None or opener.end() > resume:
            return start
        cut = opener.end()
    closer = layout.added.match(text, cut + _spaces(text, cut))
    if closer is None or closer.end() > resume:
        return cut if reasoning_anchors else start
    return closer.end() + _spaces(text, closer.end())


def _spaces(text: str, at: int) -> int:
    end = at
    while end < len(text) and text[end].isspace():
        end += 1
    return end - at


def assistant_mask(encoding: Encoding, layout: Layout, *, reasoning: bool, end_of_turn: bool) -> list[int]:
    """1 for each token that overlaps an assistant region; raises when assistant turns get none."""
    memory = None
    if layout.generation_spans is not None:
        spans = layout.generation_spans
    elif layout.failure is not None:
        spans = []
    elif reasoning and end_of_turn and layout.memory is not None and not layout.memory.done:
        memory = layout.memory  # a growing conversation: what did not change is the last encode's
        spans = _growing_regions(layout, memory)
    else:
        spans = assistant_regions(layout, reasoning=reasoning, end_of_turn=end_of_turn)
    mask = _growing_mask(encoding, spans, memory) if memory is not None and encoding._offsets is None else None
    if mask is None:
        if encoding._offsets is not None:
            mask = overlap_mask(encoding._offsets, spans)
        else:
            ascii_mask = byte_width_mask(encoding, spans)
            mask = ascii_mask if ascii_mask is not None else runs_mask(encoding._runs, spans)
    if memory is not None:
        memory.finish()
    if "assistant" in layout.roles and not any(mask):
        if layout.generation_spans is not None:
            why = "; its {% generation %} blocks cover none of their tokens"
        else:
            why = f"; {layout.failure}" if layout.failure else ""
        raise MaskError(
            f"The conversation has assistant turns, but no token of them could be found in the prompt{why}."
            " Check that the assistant messages have content the template prints."
        )
    return mask


def overlap_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """transformers' rule (§2.9): a token is 1 when it overlaps a span; zero-width tokens never are."""
    mask = [0] * len(offsets)
    remaining = iter(sorted(spans))
    first = next(remaining, None)
    if first is None:
        return mask
    low, high = first
    for index, (start, end) in enumerate(offsets):
        while start >= high:  # this token is past the span: move to the next one
            following = next(remaining, None)
            if following is None:
                return mask
            low, high = following
        if end > low and end > start:
            mask[index] = 1
    return mask


def runs_mask(runs: list[Run], spans: list[tuple[int, int]]) -> list[int]:
    """:func:`overlap_mask` of the runs' tokens, read where each run keeps them: no list of offsets is made.

    A run of text holds its tokens' offsets as its encoding has them (several runs may share one encoding, each
    from its own first token and character): the spans are moved to the run's coordinates instead.

    >>> from chatcodec.vocab import Run
    >>> runs = [Run(0, [1], width=3), Run(3, [2, 3], spans=[(3, 5), (5, 8)]), Run(8, [4], width=3)]
    >>> runs_mask(runs, [(5, 11)]) == overlap_mask([(0, 3), (3, 5), (5, 8), (8, 11)], [(5, 11)])
    True
    """
    total = sum(len(run.ids) for run in runs)
    remaining = iter(sorted(spans))
    first = next(remaining, None)
    if first is None:
        return [0] * total
    low, high = first
    mask: list[int] = []
    append = mask.append
    for run in runs:
        if run.encoding is None or run.spans is not None:
            offsets, begin, shift = run.offsets(), 0, 0
        else:
            offsets, begin, shift = run.encoding.offsets, run.skip, run.start - run.lead
        local_low, local_high = low - shift, high - shift
        for index in range(begin, begin + len(run.ids)):
            start, end = offsets[index]
            while start >= local_high:  # this token is past the span: move to the next one
                following = next(remaining, None)
                if following is None:
                    return mask + [0] * (total - len(mask))
                low, high = following
                local_low, local_high = low - shift, high - shift
            append(1 if end > local_low and end > start else 0)
    return mask


def byte_width_mask(encoding: Encoding, spans: list[tuple[int, int]]) -> list[int] | None:
    """:func:`overlap_mask` of a prompt encoded by a byte-level BPE tokenizer, read from its runs: or None when
    that does not apply.

    In such a tokenizer (:func:`byte_widths`) no token is empty, and a token of ASCII text is as many characters
    wide as its vocabulary string is long (one character per byte). The runs lie end to end from character 0, so
    the run a span's edge falls in is found by bisecting the runs' starts, and only a run an edge falls inside
    has its tokens placed (:func:`_placed`): every token between the edges overlaps the span. So an ASCII prompt
    reads no offsets, and another reads those of the runs of other text that an edge falls inside.
    """
    widths = byte_widths(encoding._codec._vocab)
    if widths is None:
        return None
    grid = _Grid.of(encoding.text, encoding._runs, widths)
    if grid is None:
        return None
    mask = [0] * grid.count
    return mask if grid.cover(spans, mask) else None


class _Grid:
    """The runs of a prompt from one of them on (:func:`byte_width_mask`'s tokenizers): where each starts in
    the text, and the index of its first token, to find the tokens a span covers."""

    __slots__ = ("ascii_text", "count", "firsts", "runs", "starts", "text", "widths")

    def __init__(
        self, text: str, runs: list[Run], starts: list[int], firsts: list[int], count: int, widths: dict[int, int]
    ) -> None:
        self.text = text
        self.ascii_text = text.isascii()
        self.runs = runs
        self.starts = starts
        self.firsts = firsts
        self.count = count
        self.widths = widths

    @classmethod
    def of(
        cls, text: str, runs: list[Run], widths: dict[int, int], first_run: int = 0, first_token: int = 0
    ) -> _Grid | None:
        """The grid of ``runs`` from ``first_run`` on (whose first token is ``first_token``), or None when the
        runs hold tokens the text does not, or offsets given outright, or do not start at character 0."""
        if first_run:
            runs = runs[first_run:]
        if not runs or min(map(_WIDTH, runs)) < 0 or list(map(_SPANS, runs)).count(None) < len(runs):
            return None
        starts = list(map(_START, runs))  # where each run starts in the text (C passes: no Python step per run)
        firsts = list(accumulate(map(len, map(_IDS, runs)), initial=first_token))  # each run's first token, the count
        count = firsts.pop()
        if count == first_token or (not first_run and starts[0] != 0):
            return None
        return cls(text, runs, starts, firsts, count, widths)

    def cover(self, spans: list[tuple[int, int]], mask: list[int]) -> bool:
        """Set to 1 the bits of ``mask`` of the tokens (from this grid's first) that overlap a span; False when
        a run an edge falls inside cannot be placed."""
        text, ascii_text, runs, starts, firsts, widths = (
            self.text, self.ascii_text, self.runs, self.starts, self.firsts, self.widths,
        )  # fmt: skip
        length, count, floor = len(text), self.count, starts[0]
        for low, high in spans:
            if low >= length or high <= floor:
                continue  # no token ends after low, or none of these starts before high
            first = firsts[0]  # the first token that ends after low
            if low > floor:
                index = bisect_right(starts, low) - 1
                first = firsts[index]
                if low > starts[index]:
                    placed = _placed(text, ascii_text, runs, starts, index, widths)
                    if placed is None:
                        return False
                    first += bisect_right(placed[1], low - starts[index])
            stop = count  # past the last token that starts before high
            if high < length:
                index = bisect_left(starts, high)
                if index < len(starts) and starts[index] == high:  # a run starts at high: the one before ends there
                    stop = firsts[index]
                else:
                    index -= 1
                    placed = _placed(text, ascii_text, runs, starts, index, widths)
                    if placed is None:
                        return False
                    stop = firsts[index] + bisect_left(placed[0], high - starts[index])
            if stop > first:
                mask[first:stop] = [1] * (stop - first)
        return True


def _growing_mask(encoding: Encoding, spans: list[tuple[int, int]], memory: MaskMemory) -> list[int] | None:
    """:func:`byte_width_mask`, the last encode's bits kept for the leading tokens that are the very same (the
    runs the tokenizer kept) and end before every turn that changed (any turn the last encode had or this one
    has but the ones both keep); the memory keeps this one's. None when the grid does not apply."""
    widths = byte_widths(encoding._codec._vocab)
    if widths is None:
        return None
    runs, previous = encoding._runs, memory.previous
    first_run = first_token = 0
    bits: list[int] = []
    if previous is not None and previous.mask is not None and previous.runs is not None:
        first_run = min(_same_leading(previous.runs, runs), len(runs) - 1)
        kept = memory.kept_spans
        changed = [low for low, _ in previous.spans[kept:]] + [low for low, _ in spans[kept:]]
        if changed:  # the tokens before the run the first changed turn starts in
            first_run = min(first_run, max(bisect_right(previous.starts, min(changed), 0, first_run) - 1, 0))
        first_token = previous.firsts[first_run]
        bits = previous.mask[:first_token]
    grid = _Grid.of(encoding.text, runs, widths, first_run, first_token)
    if grid is None:
        return None
    bits.extend(repeat(0, grid.count - first_token))
    if not grid.cover(spans, bits):
        return None
    memory.runs = runs
    memory.starts = (previous.starts[:first_run] if previous is not None else []) + grid.starts
    memory.firsts = (previous.firsts[:first_run] if previous is not None else []) + grid.firsts + [grid.count]
    memory.mask = bits[:]  # the caller's list may be changed: the memory keeps its own
    return bits


def _same_leading(old: list[Any], new: list[Any]) -> int:
    """How many leading items of ``new`` are the very ones of ``old`` (compared in C: a binary search)."""
    count = min(len(old), len(new))
    if old[:count] == new[:count]:
        return count
    low, high = 0, count - 1  # new[:low] agree, new[:high + 1] do not
    while low < high:
        middle = (low + high + 1) // 2
        if old[low:middle] == new[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _placed(
    text: str, ascii_text: bool, runs: list[Run], starts: list[int], index: int, widths: dict[int, int]
) -> tuple[list[int], list[int]] | None:
    """Where a run's tokens start and end, from the run's start; None unless they lie in order and are not empty.

    A control token is one token as wide as its text. A stretch of ASCII text is model tokens of the ByteLevel
    alphabet, end to end, whose widths must sum to the run's length; another stretch's tokens are where its
    offsets say.
    """
    run = runs[index]
    begin = starts[index]
    size = (starts[index + 1] if index + 1 < len(starts) else len(text)) - begin
    if run.encoding is None:
        return ([0], [size]) if run.width == size and len(run.ids) == 1 else None
    if run.width:
        return None
    if ascii_text or text[begin : begin + size].isascii():
        lengths = list(map(widths.__getitem__, run.ids))
        if 0 in lengths:  # an id that is not a model token of the ByteLevel alphabet
            return None
        ends = list(accumulate(lengths))
        return ([0, *ends[:-1]], ends) if ends and ends[-1] == size else None
    offsets = run.offsets()
    token_starts = [start - begin for start, _ in offsets]
    token_ends = [end - begin for _, end in offsets]
    if not offsets or token_starts[0] < 0 or token_ends[-1] > size:
        return None
    if any(e <= s for s, e in zip(token_starts, token_ends, strict=True)):
        return None  # an empty token: never in a mask
    if token_starts != sorted(token_starts) or token_ends != sorted(token_ends):
        return None
    return token_starts, token_ends


#: the runs' fields, read in C passes
_START, _IDS, _WIDTH, _SPANS = map(attrgetter, ("start", "ids", "width", "spans"))

#: per vocabulary, its model tokens' widths on ASCII text (None: not a tokenizer whose offsets follow bytes)
_BYTE_WIDTHS: WeakKeyDictionary[Any, dict[int, int] | None] = WeakKeyDictionary()
_KEEPING_SPLITS = ("Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")


def byte_widths(vocab: Any) -> dict[int, int] | None:
    """For a byte-level BPE tokenizer whose offsets are its tokens' bytes, each model token's length in
    characters of ASCII text (its vocabulary string's length), by id; else None.

    That tokenizer: the tokenizers library's BPE without dropout, subword prefix or suffix, whose strings are
    in the ByteLevel alphabet (each id's, when first met: :class:`_Widths`); no normalizer or NFC (which
    leave ASCII as it is); pre-tokenized by splits that keep every character and then ByteLevel without an
    added prefix space; post-processed, if at all, by ByteLevel without trimmed offsets or by a template.
    Qwen2/3 and Llama 3 are such tokenizers.
    """
    try:
        return _BYTE_WIDTHS[vocab]
    except KeyError:
        pass
    except TypeError:  # not weakly referable: not a Vocabulary
        return None
    widths = _find_byte_widths(vocab)
    _BYTE_WIDTHS[vocab] = widths
    return widths


def _find_byte_widths(vocab: Any) -> dict[int, int] | None:
    import json

    from .vocab import Vocabulary

    if type(vocab) is not Vocabulary or vocab.splitter is None:
        return None  # another tokenizer, or one that encodes prompts whole (runs then hold added tokens)
    tokenizer = vocab.joiner  # what encodes the stretches of text
    model = tokenizer.model
    if type(model).__name__ != "BPE" or model.dropout or model.continuing_subword_prefix or model.end_of_word_suffix:
        return None
    normalizer = tokenizer.normalizer
    if normalizer is not None and json.loads(normalizer.__getstate__()) != {"type": "NFC"}:
        return None
    pre = tokenizer.pre_tokenizer
    steps = [] if pre is None else [json.loads(pre.__getstate__())]
    if steps and steps[0].get("type") == "Sequence":
        steps = steps[0].get("pretokenizers") or []
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        return None
    if any(step.get("type") != "Split" or step.get("behavior") not in _KEEPING_SPLITS for step in steps[:-1]):
        return None
    post = tokenizer.post_processor
    processors = [] if post is None else [json.loads(post.__getstate__())]
    if processors and processors[0].get("type") == "Sequence":
        processors = processors[0].get("processors") or []
    for processor in processors:
        kind = processor.get("type")
        if not (kind == "TemplateProcessing" or (kind == "ByteLevel" and not processor.get("trim_offsets"))):
            return None
    return _Widths(tokenizer)


class _Widths(dict):  # type: ignore[type-arg]
    """Token id -> its vocabulary string's length, looked up the first time the id is met (the whole
    vocabulary's table would cost a tenth of a second in each process); 0 for an id that is not a model
    token or whose string is not in the ByteLevel alphabet, which sends the mask back to the offsets."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers import pre_tokenizers

        super().__init__()
        self.model = tokenizer.model
        self.alphabet = frozenset(pre_tokenizers.ByteLevel.alphabet())

    def __missing__(self, index: int) -> int:
        string = self.model.id_to_token(index) if isinstance(index, int) and index >= 0 else None
        width = len(string) if string and self.alphabet.issuperset(string) else 0
        self[index] = width
        return width


# --- per-message spans ----------------------------------------------------------------------------------


def message_char_spans(layout: Layout) -> list[tuple[int, int]]:
    """Each message's character span: from the end of the previous one's end-of-turn to its own."""
    text, anchors = layout.text, layout.anchors
    anchored = [i for i, a in enumerate(anchors) if a]
    if layout.failure is not None or not anchored:
        raise MaskError(f"Cannot tell where each message is in the prompt: {layout.failure or 'no message has text'}.")
    starts = {anchored[0]: 0}
    for rank in range(1, len(anchored)):
        index, previous = anchored[rank], anchored[rank - 1]
        before = max(p for p, _ in anchors[previous])
        glue = text[before : min(p for p, _ in anchors[index])]
        header = _find_header(layout, glue) if layout.roles[index] == "assistant" else None
        eot = _end_of_turn(layout, glue)
        if header is not None and header[0] < len(glue):
            starts[index] = before + header[0]
        elif eot is not None:
            starts[index] = before + eot[1] + _spaces(glue, eot[1])
        else:
            starts[index] = before
    last = anchored[-1]
    end_of_last = max(p for p, _ in anchors[last])
    eot = _end_of_turn(layout, text[end_of_last:])
    final = end_of_last + eot[1] + _spaces(text, end_of_last + eot[1]) if eot else len(text)
    spans: list[tuple[int, int]] = []
    following = [*anchored[1:], None]
    for index in range(len(anchors)):
        if index in starts:
            nxt = following[anchored.index(index)]
            spans.append((starts[index], starts[nxt] if nxt is not None else final))
        else:
            later = [starts[i] for i in anchored if i > index]
            at = later[0] if later else final
            spans.append((at, at))
    return spans


def message_token_spans(encoding: Encoding, layout: Layout) -> list[tuple[int, int]]:
    """Token ranges per message: a token belongs to the message its first character is in."""
    import bisect

    starts = []
    highest = 0
    for start, _ in encoding.offsets:
        highest = max(highest, start)
        starts.append(highest)
    return [(bisect.bisect_left(starts, a), bisect.bisect_left(starts, b)) for a, b in message_char_spans(layout)]


@lru_cache(maxsize=64)
def _alternation(texts: frozenset[str]) -> re.Pattern[str]:
    """One compiled pattern per set of token texts: every encoding of a codec shares it."""
    from .vocab import alternation

    return re.compile(alternation(texts))
