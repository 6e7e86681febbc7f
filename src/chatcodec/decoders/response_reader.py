"""transformers' ``response_template``: read into a streaming machine, and written from a :class:`Format`.

A response template (transformers 5.13 and later, ``tokenizer_config.json``'s ``response_template``) says
how a model's output is parsed, as data: a ``start_anchor`` (where the assistant turn starts in the
prompt), and ``fields``, each a region of the output between an ``open`` and a ``close`` delimiter
(literals, or ``open_pattern``/``close_pattern`` regular expressions), whose body goes through a content
parser (``text``, ``json``, ``xml-inline``, ``python-call-list``, ...) and an optional ``transform``. The
one field without an open delimiter is the *implicit* one: the text outside every other region.

Reading (:func:`decoder_from_response_template`). The regions are found the way transformers finds them:
the earliest delimiter wins (the longest on a tie, an open before a close), and a delimiter that more
text could still extend or complete is waited for. Text regions stream as they arrive (``content``, and
``reasoning_content``/``reasoning``/``thinking`` into reasoning); a tool-call region is parsed when it
closes, and its calls are announced then, whole: the name, then the arguments as JSON. So the machine
never takes anything back, and a whole decode is what the stream gives at any split. Unlike every other
chatcodec machine it runs regular expressions over model output: the template's own, as transformers
does. They need the ``regex`` module (``pip install 'chatcodec[response-templates]'``) for its partial
matches.

Two deliberate differences from transformers, both kept from chatcodec's other decoders: content keeps
the model's whitespace and gathers every content region (transformers strips each and keeps the last),
and a region that does not parse is an invalid call with its text, where transformers raises.

The content parsers are in :mod:`.response_content`; writing one for a format is :mod:`.response_writer`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..exceptions import DecodeError
from ..render import ChatTemplate
from .base import CALL_SLOTS, MESSAGE_SLOTS, AssistantMessage, Sink, ToolCall, parse_arguments
from .format import Decoder, Format
from .machine import MachineBase, Options, ThinkSpec
from .prompt import as_template, generation_prompt
from .registry import make_decoder
from .response_content import PARSERS, cast_arguments, content_parser, regex_module, tool_params

__all__ = ["ResponseMachine", "ResponseTemplate", "decoder_from_response_template", "load_response_template"]

Role = Literal["content", "reasoning", "calls"]

#: the field names chatcodec places, and where
ROLES: dict[str, Role] = {
    "content": "content",
    "reasoning_content": "reasoning",
    "reasoning": "reasoning",
    "thinking": "reasoning",
    "tool_calls": "calls",
}
_TEMPLATE_KEYS = frozenset({"version", "defaults", "fields", "start_anchor", "start_anchor_pattern"})
_FIELD_KEYS = frozenset({
    "open", "open_pattern", "close", "close_pattern", "content", "content_args", "repeats", "join", "optional",
    "transform", "transform_each",
})  # fmt: skip
_PLACEHOLDER = re.compile(r"\{(\w+(?:\.\w+)*)\}")


# -- reading ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delimiter:
    """An open or close delimiter: its pattern, its literals (None for a regex), whether a literal
    match could still grow (one literal is a prefix of another), and the pattern a whole text is searched
    with (see :func:`_whole_pattern`)."""

    pattern: Any
    literals: tuple[str, ...] | None
    extends: bool
    whole: Any


@dataclass(frozen=True, slots=True)
class Field:
    """One region of the output (a ``fields`` entry), with where chatcodec puts it."""

    name: str
    role: Role
    open: Delimiter | None
    close: Delimiter | None
    parser: str
    args: Mapping[str, Any]
    transform: Any
    transform_each: bool
    #: the transform compiled (:func:`_shaper`): the captures and the parsed content in (with
    #: ``transform_each``, one scope per item), the transformed value out
    shape: Callable[..., Any] | None = None
    #: the content parser with its arguments settled (:func:`~.response_content.content_parser`)
    parse: Callable[[str], Any] = str.strip
    #: a tool-call region read into its calls (:func:`_caller`)
    calls: Callable[[str, Mapping[str, str], Params], list[Call]] | None = None


@dataclass(frozen=True, slots=True)
class ResponseTemplate:
    """A validated response template: its fields, the implicit one, and its start anchor."""

    spec: Mapping[str, Any]
    fields: tuple[Field, ...]
    implicit: Field | None
    anchor: Delimiter
    #: what a whole read watches outside every explicit region (:func:`_states`); each delimiter it finds
    #: says which state follows
    idle: State
    #: how many searches a whole read keeps, in the states that make more than one (one per watched pattern)
    slots: int
    #: the whole read (:func:`_reader`): the text, whether reasoning is extracted, and the tools' parameter types
    #: (:func:`~.response_content.tool_params`) in, the message out
    read: Reader

    def tail(self, prompt: str) -> str:
        """The part of ``prompt`` after the last start anchor (all of it if there is none), as
        transformers truncates a ``prefix``."""
        last = None
        for m in self.anchor.pattern.finditer(prompt):
            last = m.end()
        return prompt if last is None else prompt[last:]

    @property
    def markers(self) -> tuple[str, ...]:
        """The literal delimiters (what a literal-only template writes around its regions)."""
        found = [lit for f in self.fields for d in (f.open, f.close) if d and d.literals for lit in d.literals]
        return tuple(dict.fromkeys(found))


#: compiled templates by their JSON text, the oldest dropped first: :func:`decoder_for` builds a decoder per request
#: (a server's), and compiling a template (its whole read and its calls into Python) takes about 1.7 ms, eighty
#: decodes' time. Templates whose JSON is longer than :data:`_COMPILED_TEXT` characters are compiled every time, so
#: the cache holds at most 16 x 64 KiB of them.
_COMPILED: dict[str, ResponseTemplate] = {}
_COMPILED_SIZE = 16
_COMPILED_TEXT = 1 << 16
_COMPILED_LOCK = threading.Lock()


def load_response_template(spec: Any) -> ResponseTemplate:
    """Validate a ``response_template`` dict as transformers 5.24 does, and compile it (or take it from a small
    cache of templates compiled before, each compiled from a copy of its dict, which later changes to the
    caller's dict do not reach).

    Anything transformers would reject, and any field chatcodec has no place for, is a one-line
    :class:`~chatcodec.DecodeError`.
    """
    if isinstance(spec, ResponseTemplate):
        return spec
    try:  # the fields' order counts (the last tie-break), so the keys are not sorted
        key: str | None = json.dumps(spec, ensure_ascii=False) if isinstance(spec, Mapping) else None
    except (TypeError, ValueError, RecursionError):  # not JSON: compiled (or refused) as it is
        key = None
    if key is None or len(key) > _COMPILED_TEXT:
        return _compiled(spec)
    found = _COMPILED.get(key)
    if found is not None and found.spec == spec:  # not just the same JSON: (1,) and [1] are, {1: x} and {"1": x} too
        return found
    copy = json.loads(key)
    if copy != spec:
        return _compiled(spec)
    found = _compiled(copy)
    with _COMPILED_LOCK:
        if len(_COMPILED) >= _COMPILED_SIZE:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = found
    return found


def _compiled(spec: Any) -> ResponseTemplate:
    if not isinstance(spec, Mapping):
        raise DecodeError(f"A response template is a JSON object, not {type(spec).__name__}.")
    if spec.get("version", 1) != 1:
        raise DecodeError(f"Unsupported response_template version {spec.get('version')!r}: only version 1 exists.")
    unknown = sorted(set(spec) - _TEMPLATE_KEYS)
    if unknown:
        raise DecodeError(f"Unknown keys in the response template: {', '.join(unknown)}.")
    if not isinstance(spec.get("defaults", {}), Mapping):
        raise DecodeError("The response template's defaults must be an object.")
    raw_fields = spec.get("fields")
    if not isinstance(raw_fields, Mapping) or not raw_fields:
        raise DecodeError("The response template's fields must be a non-empty object.")
    rx = regex_module()
    fields = tuple(_field(rx, str(name), raw) for name, raw in raw_fields.items())
    implicit = [f for f in fields if f.open is None]
    if len(implicit) > 1:
        names = ", ".join(f.name for f in implicit)
        raise DecodeError(f"At most one response-template field may have no open delimiter; these have none: {names}.")
    anchor = _delimiter(rx, "The response template", spec, "start_anchor", "start_anchor_pattern")
    if anchor is None:
        raise DecodeError("The response template needs a start_anchor or a start_anchor_pattern.")
    sink = implicit[0] if implicit else None
    idle, slots = _states(fields, sink)
    return ResponseTemplate(spec, fields, sink, anchor, idle, slots, _reader(idle, sink, slots))


def _field(rx: Any, name: str, raw: Any) -> Field:
    scope = f"Response-template field {name!r}"
    if not isinstance(raw, Mapping):
        raise DecodeError(f"{scope} must be an object, not {type(raw).__name__}.")
    unknown = sorted(set(raw) - _FIELD_KEYS)
    if unknown:
        raise DecodeError(f"{scope} has unknown keys: {', '.join(unknown)}.")
    role = ROLES.get(name)
    if role is None:
        raise DecodeError(f"{scope} has no place in a chatcodec message: the fields it reads are {', '.join(ROLES)}.")
    parser = raw.get("content", "text")
    if parser not in PARSERS:
        raise DecodeError(f"{scope} names the unknown content parser {parser!r}; known: {', '.join(PARSERS)}.")
    if role != "calls" and parser != "text":
        raise DecodeError(
            f"{scope} is text in a chatcodec message, so its content parser must be 'text', not {parser!r}."
        )
    if role == "calls" and parser in ("text", "int", "float", "bool"):
        raise DecodeError(f"{scope} holds tool calls, so its content parser must be structured, not {parser!r}.")
    if raw.get("join") is not None:
        raise DecodeError(f"{scope} joins its matches ('join'); chatcodec gathers every region of a field itself.")
    args = raw.get("content_args", {})
    if not isinstance(args, Mapping):
        raise DecodeError(f"{scope}: content_args must be an object.")
    if parser == "xml-inline" and not isinstance(args.get("tag_pattern"), str):
        raise DecodeError(f"{scope}: the xml-inline parser needs a tag_pattern.")
    transform = raw.get("transform")
    each = raw.get("transform_each", False)
    if not isinstance(each, bool) or (each and transform is None):
        raise DecodeError(f"{scope}: transform_each must be true or false, and needs a transform.")
    _check_transform(scope, transform)
    opener = _delimiter(rx, scope, raw, "open", "open_pattern")
    closer = _delimiter(rx, scope, raw, "close", "close_pattern")
    if transform is None:
        captured = {g for d in (opener, closer) if d is not None for g in d.pattern.groupindex}
        if captured:
            raise DecodeError(f"{scope} captures {', '.join(sorted(captured))} but has no transform that uses it.")
    if parser == "xml-inline":  # compiled once, not on every region
        try:
            args = {**args, "tag_pattern": _whole_pattern(rx.compile(args["tag_pattern"], rx.DOTALL))}
        except rx.error as exc:
            raise DecodeError(f"{scope}: the tag_pattern is not a valid regular expression: {exc}.") from None
    shape = None if transform is None else _shaper(transform, each)
    field = Field(name, role, opener, closer, parser, args, transform, each, shape, content_parser(parser, args))
    return dataclasses.replace(field, calls=_caller(field)) if role == "calls" else field


def _delimiter(rx: Any, scope: str, raw: Mapping[str, Any], literal_key: str, pattern_key: str) -> Delimiter | None:
    if literal_key in raw and pattern_key in raw:
        raise DecodeError(f"{scope} gives both {literal_key} and {pattern_key}; give one.")
    if literal_key in raw:
        value = raw[literal_key]
        found = [value] if isinstance(value, str) else value
        if not isinstance(found, list) or not found or not all(isinstance(s, str) and s for s in found):
            raise DecodeError(f"{scope}: {literal_key} must be a non-empty string or a list of them.")
        literals = tuple(dict.fromkeys(found))
        ordered = sorted(literals, key=len, reverse=True)
        extends = any(a != b and a.startswith(b) for a in literals for b in literals)
        pattern = rx.compile("|".join(rx.escape(s) for s in ordered), rx.DOTALL)
        return Delimiter(pattern, literals, extends, re.compile("|".join(map(re.escape, ordered))))
    if pattern_key in raw:
        pattern = raw[pattern_key]
        if not isinstance(pattern, str):
            raise DecodeError(f"{scope}: {pattern_key} must be a regular expression as a string.")
        try:
            compiled = rx.compile(pattern, rx.DOTALL)
        except rx.error as exc:
            raise DecodeError(f"{scope}: {pattern_key} is not a valid regular expression: {exc}.") from None
        return Delimiter(compiled, None, False, _delimiter_search(compiled))
    return None


def _whole_pattern(compiled: Any) -> Any:
    """The pattern a whole text is searched with: the standard library's compilation of the same expression
    when it has one (several times faster on short texts; a whole read needs no partial matches), else the
    ``regex`` module's (``\\G``, variable-width lookbehind, ``\\p{...}`` and the like). Both engines are
    backtracking, leftmost-first matchers with the same syntax where both accept it, so they find the same
    matches; the whole-equals-streamed tests hold that over every written and hand-written template."""
    try:
        return re.compile(compiled.pattern, re.DOTALL)
    except (re.error, ValueError, OverflowError):
        return compiled


#: how a lookahead spells "any text, then": ``(?=[\s\S]*?</think>)`` holds wherever ``</think>`` is still ahead
_ANY_RUN = re.compile(r"(?:\[\\s\\S\]|\[\\S\\s\]|\[\\d\\D\]|\[\\D\\d\]|\[\\w\\W\]|\[\\W\\w\]|\.)\*\??")
_EMPTY = re.compile("")
_INLINE_FLAGS = re.compile(r"\(\?[-a-zA-Z^]")


class _Ahead:
    """``(?=<any text>R)`` searched as one search of ``R``: the lookahead holds at a position exactly when
    ``R`` matches at or after it, so it holds from ``pos`` if anywhere after, and the match is empty at
    ``pos``. The engine's own search tries the whole lookahead at every position: quadratic in the text
    when ``R`` is not there. Only for a pattern without groups, whose match is then only its place."""

    __slots__ = ("ahead",)

    def __init__(self, ahead: re.Pattern[str]) -> None:
        self.ahead = ahead

    def search(self, text: str, pos: int = 0) -> re.Match[str] | None:
        return _EMPTY.match(text, pos) if self.ahead.search(text, pos) is not None else None


class _HereOrAhead:
    """``A|\\G(?=<any text>R)`` (a ``regex`` pattern: ``\\G`` is where the search starts) searched with the
    standard library: at ``pos`` the alternatives are tried in their order, ``A`` first, then the lookahead
    (:class:`_Ahead`); after ``pos`` only ``A`` can match. Only for a pattern without groups."""

    __slots__ = ("ahead", "first")

    def __init__(self, first: re.Pattern[str], ahead: re.Pattern[str]) -> None:
        self.first, self.ahead = first, ahead

    def search(self, text: str, pos: int = 0) -> re.Match[str] | None:
        m = self.first.search(text, pos)
        if (m is None or m.start() != pos) and self.ahead.search(text, pos) is not None:
            return _EMPTY.match(text, pos)
        return m


class _Unwrapped:
    """A pattern some of whose alternatives are lookaheads ``(?=R)`` or the end ``$`` (and that has no groups),
    searched with each lookahead's ``R`` in its place and without the end: the others begin with literal text the
    engine skips to (a lookahead or ``$`` among them hides it, and the engine then tries every position). The
    pattern matches first where that search does, or at the end (where ``$`` first holds) if that is sooner;
    there its alternatives are tried in their order, as the engine tries them: a lookahead's match is empty.

    >>> found = _Unwrapped.of(["```\\\\s*", "(?=<end>)", "$"])
    >>> found.search("ab <end>").span(), found.search("a```  b").span(), found.search("ab\\n").span()
    ((3, 3), (1, 6), (2, 2))
    """

    __slots__ = ("end", "joined", "tries")

    def __init__(self, joined: re.Pattern[str], tries: tuple[tuple[re.Pattern[str], bool], ...], end: bool) -> None:
        self.joined, self.tries, self.end = joined, tries, end

    @classmethod
    def of(cls, alternatives: list[str]) -> _Unwrapped | None:
        """The search for these top-level alternatives, or None when none is a lookahead or the end, or what
        stands in for them would not begin with literal text (:func:`_literal_starts`)."""
        inner = [_lookahead_inside(alternative) for alternative in alternatives]
        end = "$" in alternatives
        if all(part is None for part in inner) and not end:
            return None
        searched = [part or alt for part, alt in zip(inner, alternatives, strict=True) if alt != "$"]
        try:
            joined = re.compile("|".join(f"(?:{one})" for one in searched), re.DOTALL)
            tries = tuple(
                (re.compile(part or alt, re.DOTALL), part is not None)
                for part, alt in zip(inner, alternatives, strict=True)
            )
        except (re.error, ValueError, OverflowError, RecursionError):
            return None
        if not searched or _literal_starts(joined) is None:
            return None
        return cls(joined, tries, end)

    def search(self, text: str, pos: int = 0) -> re.Match[str] | None:
        m = self.joined.search(text, pos)
        at = len(text) + 1 if m is None else m.start()
        if self.end:  # "$": before a last newline, or at the very end
            last = len(text) - 1 if text.endswith("\n") and len(text) - 1 >= pos else len(text)
            at = min(at, last)
        elif m is None:
            return None
        for pattern, ahead in self.tries:
            found = pattern.match(text, at)
            if found is not None:
                return _EMPTY.match(text, at) if ahead else found
        return None  # not reached: one of them matches there


def _lookahead_inside(alternative: str) -> str | None:
    """``R`` when ``alternative`` is one lookahead ``(?=R)`` and nothing else, else None."""
    if not alternative.startswith("(?=") or _group_end(alternative) != len(alternative) - 1:
        return None
    return alternative[3:-1] or None


def _delimiter_search(compiled: Any) -> Any:
    """What a whole text's delimiter is searched with: :func:`_whole_pattern`, or for a pattern that is
    (or ends in a ``\\G`` alternative that is) one lookahead over any text, :class:`_Ahead` or
    :class:`_HereOrAhead`, which give the same match in one linear search, or for one with lookahead
    alternatives, :class:`_Unwrapped`."""
    whole = _whole_pattern(compiled)
    if compiled.groups or _INLINE_FLAGS.search(compiled.pattern):  # a flag would not reach every part
        return whole
    alternatives = _top_level_alternatives(compiled.pattern)
    if alternatives is None:
        return whole
    *firsts, last = alternatives
    here = last.startswith("\\G")
    ahead = _ahead_of(last[2:] if here else last)
    if ahead is None and isinstance(whole, re.Pattern):
        return _Unwrapped.of(alternatives) or whole
    if ahead is None or (here and not firsts) or (not here and firsts):
        return whole
    if not here:
        return _Ahead(ahead)
    try:
        first = re.compile("|".join(firsts), re.DOTALL)
    except (re.error, ValueError, OverflowError):
        return whole
    return _HereOrAhead(first, ahead)


def _ahead_of(lookahead: str) -> re.Pattern[str] | None:
    """``R`` compiled when ``lookahead`` is ``(?=<any text>R)`` with no alternative outside a group of ``R``
    (``(?=[\\s\\S]*?a|b)`` is not one: ``b`` must be right there), else None."""
    run = _ANY_RUN.match(lookahead, 3)
    if not lookahead.startswith("(?=") or not lookahead.endswith(")") or run is None:
        return None
    rest = lookahead[run.end() : -1]
    split = _top_level_alternatives(rest)
    if split is None or len(split) != 1:
        return None
    try:
        ahead = re.compile(rest, re.DOTALL)
        re.compile(lookahead[3:-1], re.DOTALL)  # else the lookahead closes before the end: (?=a)(?=b)
    except (re.error, ValueError, OverflowError):
        return None
    return None if ahead.groups else ahead


def _top_level_alternatives(pattern: str) -> list[str] | None:
    """``pattern`` split at its top-level ``|`` (none inside a group, a class or an escape), or None when
    it holds a construct this reading does not follow (a nested class, an unbalanced group).

    >>> _top_level_alternatives(r"<a>|\\G(?=[\\s\\S]*?(?:x|[|)]))")
    ['<a>', '\\\\G(?=[\\\\s\\\\S]*?(?:x|[|)]))']
    """
    marks = _structure(pattern)
    if marks is None:
        return None
    parts, depth, start = [], 0, 0
    for i, c in marks:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
    if depth:
        return None
    parts.append(pattern[start:])
    return parts


def _leading_group(alternative: str) -> str | None:
    """The inside of the non-capturing group ``alternative`` begins with, when that group must match
    (no quantifier after it), else None."""
    end = _group_end(alternative)
    if end is None:
        return None
    after = alternative[end + 1 : end + 2]
    return None if after and after in "*+?{" else alternative[3:end]


def _group_end(pattern: str, start: int = 0) -> int | None:
    """Where the group that opens at ``start`` closes (:func:`_structure`), or None."""
    depth = 0
    for i, c in _structure(pattern[start:]) or ():
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return start + i
    return None


def _structure(pattern: str) -> list[tuple[int, str]] | None:
    """Where ``pattern``'s ``(``, ``)`` and ``|`` are, outside escapes and character classes; None for a class
    this reading does not follow (a nested set, the regex module's V1; or one with no end)."""
    marks, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            j = i + 1
            if pattern.startswith("^", j):
                j += 1
            if pattern.startswith("]", j):
                j += 1
            while j < n and pattern[j] != "]":
                if pattern[j] == "[":
                    return None  # a nested set, or a literal "[" we need not guess at
                j += 2 if pattern[j] == "\\" else 1
            if j >= n:
                return None
            i = j + 1
            continue
        if c in "()|":
            marks.append((i, c))
        i += 1
    return marks


class Member:
    """A delimiter a whole read watches for: whether it closes, its field, its place among the state's
    delimiters (the last tie-break), its pattern's group names, the pattern a whole text is searched with, and
    the state that follows its match (:func:`_states`)."""

    __slots__ = ("closes", "field", "names", "order", "pattern", "then")
    then: State  # set by _states once every state is made

    def __init__(self, closes: bool, field: Field, order: int, names: tuple[str, ...], pattern: Any) -> None:
        self.closes, self.field, self.order, self.names, self.pattern = closes, field, order, names, pattern


#: one search of a state that makes several: ``(pattern, slot, the member it finds, None)``, or for delimiters
#: searched together ``(their pattern, slot, the first of them, ((literal text one of them begins with, that
#: one), ...))``
Watched = tuple[Any, int, Member, tuple[tuple[str, Member], ...] | None]


class State:
    """What a whole read watches in one state (outside every region, or inside one): one search (``search``,
    finding ``single``, or one of ``tagged`` told apart by the literal text it begins with, :attr:`clash`), or when its
    delimiters cannot be found by one search, several (``watched``), each kept in a slot until the read
    passes its match."""

    __slots__ = ("clash", "search", "single", "tagged", "watched")

    def __init__(self, watched: tuple[Watched, ...], clash: bool = False) -> None:
        self.watched = watched  # () for a region that never closes: nothing ends it
        one = watched[0] if len(watched) == 1 else None
        self.search: Callable[[str, int], Any] | None = one[0].search if one is not None else None
        self.single = one[2] if one is not None and one[3] is None else None
        self.tagged: tuple[tuple[str, Member], ...] = (one[3] or ()) if one is not None else ()
        #: whether two of the delimiters searched together can match at one place (one's literal start begins
        #: another's): the text there then says which could, and :func:`_settle` which does
        self.clash = clash


#: what ties delimiters' groups together, or cannot be moved into a larger pattern: back-references and
#: conditionals count groups, and an inline flag (``(?i)``, ``(?-s:...)``) would apply to the others
_UNMOVABLE = re.compile(r"\\[1-9]|\(\?P=|\(\?\(|\(\?[-aiLmsux]")


def _states(fields: tuple[Field, ...], sink: Field | None) -> tuple[State, int]:
    """The whole read's states (:class:`State`): outside every region (each field's open delimiter, and the
    implicit field's close), and inside each field that closes (its close); each delimiter's match leads to the
    state inside its field (an open) or outside every region (a close). The outside state, and how many slots
    the states' searches keep."""
    slots = [0]
    opens = [(False, f, f.open) for f in fields if f.open is not None]
    idle = _state([*opens, *([(True, sink, sink.close)] if sink is not None and sink.close else [])], slots)
    # a field that never closes runs to the end of the text: its state watches nothing
    inside = {f.name: _state([(True, f, f.close)] if f.close else [], slots) for f in fields if f.open is not None}
    for member in _members(idle):
        member.then = idle if member.closes else inside[member.field.name]
    for state in inside.values():
        for member in _members(state):
            member.then = idle
    return idle, slots[0]


def _members(state: State) -> list[Member]:
    found: list[Member] = []
    for _, _, first, tagged in state.watched:
        found.extend([first] if tagged is None else [one for _, one in tagged])
    return list({id(m): m for m in found}.values())


def _state(delimiters: list[tuple[bool, Field, Delimiter]], slots: list[int]) -> State:
    """The searches of one state, each with a slot counted in ``slots[0]``. Delimiters that begin with literal
    text (:func:`_literal_starts`) are searched together as one pattern of alternatives: its leftmost match is
    the leftmost of any of them, in one search instead of one each. Which one it is, the text there says (its
    literal start); when one delimiter's literal start begins another's, both may match there, and
    :func:`_settle` picks as :func:`_earliest` would. The alternatives are not wrapped in groups to tell them
    apart: a group first in a branch hides the branches' first characters from the engine, which then tries
    every position of the text instead of skipping to the next of those characters."""
    members: list[tuple[Member, Any, tuple[str, ...] | None]] = []
    for order, (closes, field, delim) in enumerate(delimiters):
        member = Member(closes, field, order, tuple(delim.pattern.groupindex), delim.whole)
        starts = delim.literals if delim.literals is not None else _literal_starts(delim.whole)
        members.append((member, delim.whole, starts))
    together: list[tuple[Member, Any]] = []
    taken: list[tuple[str, Member]] = []
    clash = False
    for member, pattern, starts in members:
        if not starts or not isinstance(pattern, re.Pattern) or _UNMOVABLE.search(pattern.pattern):
            continue
        if set(member.names) & {name for other, _ in together for name in other.names}:
            continue  # one name for two groups
        clash = clash or any(_overlap(a, b) for a in starts for b, _ in taken)
        together.append((member, pattern))
        taken.extend((start, member) for start in starts)
    found: list[Watched] = []
    joined = None
    if len(together) > 1:
        try:
            joined = re.compile("|".join(f"(?:{pattern.pattern})" for _, pattern in together), re.DOTALL)
        except (re.error, ValueError, OverflowError, RecursionError):
            joined = None
        if joined is not None:
            found.append((joined, _slot(slots), together[0][0], tuple(taken)))
    grouped = {id(member) for member, _ in together} if joined is not None else set()
    found.extend((pattern, _slot(slots), member, None) for member, pattern, _ in members if id(member) not in grouped)
    return State(tuple(found), clash and joined is not None)


def _overlap(one: str, other: str) -> bool:
    """Whether delimiters beginning with these literal texts can match at one place (one begins the other)."""
    return one.startswith(other) or other.startswith(one)


def _slot(slots: list[int]) -> int:
    slots[0] += 1
    return slots[0] - 1


def _literal_starts(pattern: Any) -> tuple[str, ...] | None:
    """The literal text each top-level alternative of a standard-library pattern begins with (looking into
    a non-capturing group it begins with, and at an optional group ``(?:X)?`` after some text, both ways: the
    text and what ``X`` begins with, the text and what follows), or None when one of them need not begin with
    any (``(?=...)``, ``\\s*x``, ``$``, ``(?:a)?``) or the pattern is not one.

    >>> _literal_starts(re.compile(r"</tool_call>\\s*|<\\|im_end\\|>")), _literal_starts(re.compile(r"ab?|\\s*c"))
    (('</tool_call>', '<|im_end|>'), None)
    >>> _literal_starts(re.compile(r"(?:<\\|eot_id\\|>|>>>all\\n)\\s*"))
    ('<|eot_id|>', '>>>all')
    >>> _literal_starts(re.compile(r"<(?:tool_call>\\s*<)?function="))
    ('<tool_call>', '<function=')
    """
    if not isinstance(pattern, re.Pattern) or pattern.flags & ~(re.DOTALL | re.UNICODE):
        return None
    starts = _starts_of(pattern.pattern)
    return tuple(starts) if starts else None


def _starts_of(pattern: str) -> list[str] | None:
    starts: list[str] = []
    for alternative in _top_level_alternatives(pattern) or ():
        if alternative.startswith("(?:"):
            inner = _leading_group(alternative)
            found = _starts_of(inner) if inner is not None else None
            if not found:
                return None
            starts.extend(found)
            continue
        text: list[str] = []
        i, branched = 0, False
        while i < len(alternative):
            c = alternative[i]
            optional = _optional_group(alternative, i) if c == "(" else None
            if optional is not None:  # (?:X)? : the text so far, then X's starts or those of what follows
                inside, after = optional
                prefix = "".join(text)
                for more in (_starts_of(inside), _starts_of(after) if after else None):
                    if not more and not prefix:
                        return None
                    starts.extend([prefix + start for start in more] if more else [prefix])
                branched = True
                break
            if c == "\\":
                escaped = alternative[i + 1 : i + 2]
                if not escaped or escaped.isalnum() or escaped == "_" or not escaped.isascii():
                    break  # a class (\s), an anchor (\A, \b), a code (\n, \x41): not one literal character
                literal, step = escaped, 2
            elif c in ".^$*+?{}[]()|":
                break
            else:
                literal, step = c, 1
            if alternative[i + step : i + step + 1] in ("*", "+", "?", "{"):
                break  # repeated or optional: not there for certain
            text.append(literal)
            i += step
        if branched:
            continue
        if not text:
            return None
        starts.append("".join(text))
    return starts or None


def _optional_group(alternative: str, i: int) -> tuple[str, str] | None:
    """For a non-capturing group at ``i`` that is optional (``(?:X)?``, lazy or possessive too): ``X`` and the
    rest of the alternative after it; else None."""
    close = _group_end(alternative, i) if alternative.startswith("(?:", i) else None
    if close is None or alternative[close + 1 : close + 2] != "?":
        return None
    end = close + (3 if alternative[close + 2 : close + 3] in ("?", "+") else 2)
    return alternative[i + 3 : close], alternative[end:]


def _check_transform(scope: str, transform: Any) -> None:
    todo = [transform]
    while todo:
        item = todo.pop()
        if isinstance(item, Mapping):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, str) and _PLACEHOLDER.search(item) and not _PLACEHOLDER.fullmatch(item):
            raise DecodeError(f"{scope}: the transform string {item!r} mixes a placeholder with literal text.")


class ResponseMachine(MachineBase):
    """Runs a :class:`ResponseTemplate` over model output (see the module docstring).

    ``lead`` is the prompt's text after its last start anchor (transformers' prefix): parsed first,
    so a think block the prompt opened is where the output starts.
    """

    def __init__(
        self, out: Sink, opts: Options, template: ResponseTemplate, params: Mapping[str, Mapping[str, Any]], lead: str
    ) -> None:
        super().__init__(out, opts)
        self.rt = template
        self.params = params
        self.current: Field | None = template.implicit
        self.captures: dict[str, str] = {}
        self.body: list[str] = []
        self.opened = False
        self._opens = [(True, f, f.open) for f in template.fields if f.open is not None]
        implicit = template.implicit
        self._idle = self._opens + ([(False, implicit, implicit.close)] if implicit and implicit.close else [])
        if lead:
            self.feed(lead)

    def feed(self, text: str) -> None:
        if self.pos > 4096 and self.pos * 2 > len(self.buf):  # drop what is decided, now and then
            self.buf = self.buf[self.pos :]
            self.pos = 0
        self.buf += text
        self._run(False)

    def finish(self) -> None:
        self._run(True)

    def _watch(self) -> list[tuple[bool, Field, Delimiter]]:
        field = self.current
        if field is not None and field is not self.rt.implicit:
            return [(False, field, field.close)] if field.close is not None else []
        return self._idle

    def _run(self, final: bool) -> None:
        buf = self.buf
        while True:
            best: Any = None
            best_key: tuple[int, int, int] | None = None
            hold = len(buf)
            for is_open, field, delim in self._watch():
                m = delim.pattern.search(buf, self.pos) if final else delim.pattern.search(buf, self.pos, partial=True)
                if m is None:
                    continue
                if not final and (m.partial or self._can_grow(delim, m)):
                    hold = min(hold, m.start())
                    continue
                key = (m.start(), m.start() - m.end(), 0 if is_open else 1)
                if best_key is None or key < best_key:
                    best_key, best = key, (is_open, field, m)
            if best is not None and best[2].start() < hold:
                is_open, field, m = best
                self._take(m.start())
                self.pos = m.end()
                if is_open:
                    self._close()
                    self.out.markup(m.group())
                    self.current, self.opened = field, True
                    self.captures = {k: v for k, v in m.groupdict().items() if v is not None}
                else:
                    had = self.opened
                    self.captures.update({k: v for k, v in m.groupdict().items() if v is not None})
                    self._close()  # a call is announced before its closing delimiter is traced
                    self.out.markup(m.group())
                    if not had and m.start() == m.end():
                        if not final:
                            break
                        self._take(len(buf))  # nothing left to wait for: the rest is the current region's
                        self._close()
                        break
                continue
            if final:
                self._take(len(buf))
                self._close()
            else:
                self._take(hold)
            break

    def _can_grow(self, delim: Delimiter, m: Any) -> bool:
        """Whether a complete match could still change with more text (transformers' rule)."""
        if m.end() != len(self.buf):
            if delim.literals is not None:
                return False
            if delim.pattern.fullmatch(self.buf, m.start(), partial=True) is not None:
                return True  # all the text from here on could be the start of a longer match: wait for it
            # Continue the text with a character that is neither a newline nor the end: a match that
            # moves or changes leaned on the edge of the text so far.
            again = delim.pattern.match(self.buf + "\x00", m.start())
            return again is None or again.span() != m.span() or again.groupdict() != m.groupdict()
        if m.start() == m.end():
            return True
        return delim.literals is None or delim.extends

    def _take(self, end: int) -> None:
        """Route ``buf[pos:end]`` into the current region."""
        if end <= self.pos:
            return
        text = self.buf[self.pos : end]
        self.pos = end
        field = self.current
        if field is None:
            self.out.markup(text)  # outside every region: transformers drops it too
            return
        self.opened = True
        if field.role == "calls":
            self.body.append(text)
        elif field.role == "reasoning" and self.opts.extract_reasoning:
            self.out.reasoning(text)
        else:
            self.out.content(text)

    def _close(self) -> None:
        field = self.current
        if field is not None and self.opened and field.role == "calls":
            self._calls(field, "".join(self.body))
        self.current, self.captures, self.body, self.opened = self.rt.implicit, {}, [], False

    def _calls(self, field: Field, body: str) -> None:
        out = self.out
        for n, (name, _, arguments, call_id, error) in enumerate(parsed_calls(field, body, self.captures, self.params)):
            out.begin_call(name, call_id)
            if n == 0:
                out.raw(body)
            out.args(arguments)
            out.end_call(error)


#: one parsed call: ``(name, arguments, arguments JSON, id, error)``, the arguments being the JSON's value
Call = tuple[str, Any, str, str | None, str | None]
#: the tools' parameter types by tool (:func:`~.response_content.tool_params`)
Params = Mapping[str, Mapping[str, tuple[str, ...]]]


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


# json.dumps(..., ensure_ascii=False) builds an encoder on every call; one prebuilt C encoder gives the same
# text faster. What it writes was parsed (JSON, Python literals, tags) and reshaped by a transform, which
# cannot make a cycle, so no cycle bookkeeping is needed.
_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_to_json: Callable[[Any], str] = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(..., ensure_ascii=False)
if _c_encoder is not None:
    _encode = _c_encoder(None, _not_serializable, json.encoder.encode_basestring, None, ": ", ", ", False, False, True)

    def _to_json(value: Any) -> str:
        return "".join(_encode(value, 0))


def parsed_calls(field: Field, body: str, captures: Mapping[str, str], params: Params) -> list[Call]:
    """Each call of a closed tool-call region (:data:`Call`); one invalid call holding the whole region
    when it does not parse. ``params`` is :func:`~.response_content.tool_params` of the tools."""
    if field.calls is None:
        raise DecodeError(f"The response-template field {field.name!r} holds no tool calls.")
    return field.calls(body, captures, params)


_PARSE_ERRORS = (ValueError, KeyError, TypeError, RecursionError)


def _unparsed(captures: Mapping[str, str], exc: BaseException) -> Call:
    """The one invalid call of a region whose content or transform failed with ``exc``."""
    reason = (str(exc).splitlines() or [type(exc).__name__])[0]
    why = f"the tool call does not parse with the response template: {reason}"
    return str(captures.get("name", "")), "", "", None, why


def _caller(field: Field) -> Callable[[str, Mapping[str, str], Params], list[Call]]:
    """``field``'s tool-call regions read, compiled once into one Python function: the body, the captures and
    the tools' parameter types in (:func:`~.response_content.tool_params`), each call of the region out
    (:data:`Call`), or one invalid call holding the whole region when it does not parse.

    The content is parsed, the transform applied, and the call taken from the value the transform makes:
    its ``function`` (or the value itself), that object's ``name``, its ``arguments`` (or ``parameters``;
    JSON text is parsed), and the value's ``id``. A transform that is an object says where each of these
    comes from, so the value is not built and searched on every call; what only the content says (``"function":
    "{content}"``) is checked as the region is read. The arguments are cast by the tool's schema as
    transformers casts them, and are the value their JSON parses back to (what a stream's message holds).

    >>> rt = load_response_template({"start_anchor": "A:", "fields": {"tool_calls": {"open": "<c>", "close": "</c>",
    ...     "content": "json", "transform": {"type": "function", "function": "{content}"}}}})
    >>> rt.fields[0].calls('{"name": "f", "arguments": {"x": 1}}', {}, {})
    [('f', {'x': 1}, '{"x": 1}', None, None)]
    """
    try:
        return _calls_source(field, isinstance(field.transform, Mapping))
    except (SyntaxError, RecursionError, MemoryError, ValueError):  # nested past what the compiler takes
        return _calls_source(field, False)


def _calls_source(field: Field, static: bool) -> Callable[..., list[Call]]:
    """:func:`_caller`'s function; with ``static``, the transform (an object) is read as it is written, else the
    value it makes is built (:func:`_shaper`) and searched."""
    out = _Source()
    const = out.constant
    out.names.update({
        "_parse": field.parse, "_ERRORS": _PARSE_ERRORS, "_unparsed": _unparsed, "_to_json": _to_json,
        "_dumps": json.dumps, "parse_arguments": parse_arguments, "cast_arguments": cast_arguments,
    })  # fmt: skip
    transform, each = field.transform, field.transform_each
    places: dict[tuple[Any, ...], str] = {}

    def look(node: Any, path: tuple[Any, ...]) -> None:
        """Each placeholder of ``node`` looked up into a local, in the order the transform is written (so the
        first missing one is the one that fails, as when the value is built)."""
        if isinstance(node, Mapping):
            for key, value in node.items():
                look(value, (*path, key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                look(value, (*path, i))
        elif isinstance(node, str) and (whole := _PLACEHOLDER.fullmatch(node)) is not None:
            root, *keys = whole.group(1).split(".")
            source = "v" if root == "content" and not each else f"s[{const(root)}]" if each else f"c[{const(root)}]"
            places[path] = local = f"x{len(places)}"
            out(f"{local} = {source}" + "".join(f"[{const(key)}]" for key in keys))

    def value(node: Any, path: tuple[Any, ...]) -> str:
        """The source of ``node``'s value, built from the locals."""
        if path in places:
            return places[path]
        if isinstance(node, Mapping):
            return "{" + ", ".join(f"{const(k)}: {value(v, (*path, k))}" for k, v in node.items()) + "}"
        if isinstance(node, list):
            return "[" + ", ".join(value(v, (*path, i)) for i, v in enumerate(node)) + "]"
        return const(node)

    single = static and not each  # one call, its values in locals
    out("def calls(body, c, params):")
    out.depth = 1
    with out.block("try:"):
        out("v = _parse(body)")
        if each:
            out(
                "if not isinstance(v, list) or not all(isinstance(item, dict) for item in v):",
                "    raise ValueError('transform_each needs a list of objects')",
            )
        if single:
            look(transform, ())
        elif static:
            out("found = []")
            with out.block("for it in v:"):
                out("s = {**c, **it}")
                look(transform, ())
                out(f"found.append(({''.join(f'{x}, ' for x in places.values())}))")  # () when nothing is looked up
        elif transform is None:
            out("found = v if isinstance(v, list) else [v]")
        elif each:
            out(f"found = [{const(field.shape)}({{**c, **it}}) for it in v]")
        else:
            out(f"found = {const(field.shape)}(c, v)", "found = found if isinstance(found, list) else [found]")
    with out.block("except _ERRORS as exc:"):
        out("return [_unparsed(c, exc)]")

    def emit(call: str, last: bool = False) -> None:
        if single:
            out(f"return [{call}]")
        else:
            out(f"made.append({call})", *(() if last else ("continue",)))

    if not single:
        out("made = []")
        names = ", ".join(places.values())
        out(f"for {'item' if not static else f'({names},)' if names else '_'} in found:")
        out.depth += 1
    if static:
        fn = transform.get("function", transform)
        fn_path = ("function",) if "function" in transform else ()
        function = "True" if "function" in transform else "False"
        call_id = value(transform["id"], ("id",)) if "id" in transform else None
        dynamic = not isinstance(fn, Mapping)  # "function": "{content}": what it is, the content says
        if not dynamic:
            keys = "arguments" if "arguments" in fn else "parameters" if "parameters" in fn else None
            out(f"name = {value(fn['name'], (*fn_path, 'name')) if 'name' in fn else 'None'}")
            out(f"arguments = {value(fn[keys], (*fn_path, keys)) if keys else '{}'}")
        else:
            out(f"fn = {value(fn, fn_path)}")
            with out.block("if not isinstance(fn, dict):"):
                out(f"item = {value(transform, ())}")
                emit("('', item, _to_json(item), None, 'the tool call is not an object')")
    else:
        out("fn = item.get('function', item) if isinstance(item, dict) else None")
        with out.block("if not isinstance(fn, dict):"):
            emit("('', item, _to_json(item), None, 'the tool call is not an object')")
        function, call_id, dynamic = "'function' in item", "item.get('id')", True
    if dynamic:
        out("name = fn.get('name')", "arguments = fn['arguments'] if 'arguments' in fn else fn.get('parameters', {})")
    with out.block("if isinstance(arguments, str):"):
        out("arguments, ok = parse_arguments(arguments)")
        with out.block("if not ok:"):
            emit("(str(name or ''), arguments, _dumps(arguments), None, 'the arguments are not valid JSON')")
    if function != "False":
        test = "" if function == "True" else f"{function} and "
        with out.block(f"if {test}isinstance(name, str) and isinstance(arguments, dict):"):
            out("types = params.get(name)", "if types:  # a tool whose parameters casting never changes is not copied")
            out("    arguments = cast_arguments(arguments, types)")
    if call_id is None:
        out("call_id = None")
    else:
        out(f"call_id = {call_id}", "if not (isinstance(call_id, str) and call_id):", "    call_id = None")
    with out.block("if not isinstance(name, str) or not name:"):
        emit("('', arguments, _to_json(arguments), call_id, 'the tool call has no name')")
    emit("(name, arguments, _to_json(arguments), call_id, None)", last=True)
    if not single:
        out.depth = 1
        out("return made")
    return out.function("calls", "<response-template calls>")


def _shaper(transform: Any, each: bool = False) -> Callable[..., Any]:
    """``transform`` compiled once into one Python expression (:func:`_shape_source`): a function of the
    captures and the parsed content (with ``each``, of one scope: the captures and an item) that builds the
    value, each ``{placeholder}`` looked up as transformers looks it up (a missing key is a ``KeyError``, a
    lookup into a string a ``TypeError``). A transform too deep to compile is walked instead
    (:func:`_walker`).

    >>> _shaper({"type": "function", "function": {"name": "{name}", "arguments": "{content}"}})({"name": "f"}, [1])
    {'type': 'function', 'function': {'name': 'f', 'arguments': [1]}}
    """
    constants: list[Any] = []
    try:
        source = _shape_source(transform, constants, each)
        made = eval(compile(f"lambda c, v: {source}", "<response-template transform>", "eval"), {"k": constants})
    except (SyntaxError, RecursionError, MemoryError, ValueError):  # nested past what the compiler takes
        walk = _walker(transform)
        if each:
            return walk
        return lambda captures, value: walk({**captures, "content": value})
    if each:
        return lambda scope: made(scope, None)
    return made  # type: ignore[no-any-return]


def _shape_source(transform: Any, constants: list[Any], each: bool) -> str:
    """The expression that builds ``transform``'s value from ``c`` (the captures, or with ``each`` the
    whole scope) and ``v`` (the parsed content), its constants in ``k`` (``constants``). A mapping and a list
    are built in order, so the first missing placeholder is the one that fails, as when walked."""

    def constant(value: Any) -> str:
        constants.append(value)
        return f"k[{len(constants) - 1}]"

    if isinstance(transform, Mapping):
        items = [f"{constant(key)}: {_shape_source(value, constants, each)}" for key, value in transform.items()]
        return "{" + ", ".join(items) + "}"
    if isinstance(transform, list):
        return "[" + ", ".join(_shape_source(value, constants, each) for value in transform) + "]"
    whole = _PLACEHOLDER.fullmatch(transform) if isinstance(transform, str) else None
    if whole is None:
        return constant(transform)
    root, *keys = whole.group(1).split(".")
    # the scope is the captures with the content over them: "content" is the content, whatever was captured
    source = "v" if root == "content" and not each else f"c[{constant(root)}]"
    return source + "".join(f"[{constant(key)}]" for key in keys)


def _walker(transform: Any) -> Callable[[Mapping[str, Any]], Any]:
    """``transform`` as closures walked on every call: a scope in, the value out (what :func:`_shaper`
    compiles, for a transform nested too deep to compile)."""
    if isinstance(transform, Mapping):
        parts = [(key, _walker(value)) for key, value in transform.items()]
        return lambda scope: {key: part(scope) for key, part in parts}
    if isinstance(transform, list):
        items = [_walker(value) for value in transform]
        return lambda scope: [item(scope) for item in items]
    whole = _PLACEHOLDER.fullmatch(transform) if isinstance(transform, str) else None
    if whole is None:
        return lambda scope: transform
    root, *keys = whole.group(1).split(".")
    if not keys:
        return lambda scope: scope[root]

    def lookup(scope: Mapping[str, Any]) -> Any:
        value = scope[root]
        for key in keys:
            value = value[key]
        return value

    return lookup


_UNSEEN = object()
_NO_GROUPS: dict[str, str] = {}

#: a compiled whole read (:func:`_reader`): the text, whether reasoning is extracted and the tools' parameter types in
Reader = Callable[[str, bool, Params], AssistantMessage]


class _Source:
    """Python source written line by line, each at the indent of the block it is in, with the values it names
    (:meth:`constant`), compiled into a function (:meth:`function`)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0
        self.names: dict[str, Any] = {}

    def __call__(self, *lines: str) -> None:
        self.lines.extend("    " * self.depth + line for line in lines)

    @contextlib.contextmanager
    def block(self, head: str) -> Iterator[None]:
        self(head)
        self.depth += 1
        yield
        self.depth -= 1

    def constant(self, value: Any) -> str:
        """A name the source can use for ``value``."""
        name = f"_k{len(self.names)}"
        self.names[name] = value
        return name

    def function(self, name: str, filename: str) -> Callable[..., Any]:
        """The function ``name`` the source defines. Its code is compiled for it alone, even when another template
        of the same shape wrote the same source: the interpreter specializes a code object for the values it
        meets, and code shared by two templates that take turns decodes about 4% slower."""
        namespace = dict(self.names)
        exec(compile("\n".join(self.lines), filename, "exec"), namespace)
        return namespace[name]  # type: ignore[no-any-return]


def _starts(literals: list[str]) -> str:
    """The source of a test that the text at ``first`` begins with one of ``literals``."""
    return f"text.startswith({literals[0] if len(literals) == 1 else tuple(literals)!r}, first)"


def _reader(idle: State, implicit: Field | None, slots: int) -> Reader:
    """The whole read of a template, compiled once into one Python function: the regions found in one pass,
    the state machine :func:`_states` describes unrolled into the function's own branches, each delimiter's
    field, role and groups settled as it is written, not looked up at every step.

    The read starts outside every region, in the implicit field (``implicit``; text outside every region is
    dropped when there is none). It searches the outside state's delimiters from where it is. An open
    delimiter starts its field's region: the text up to the field's close is the region's (all the rest when
    it never closes), and the read goes on after the close, outside again. The implicit field's close ends
    its stretch of text; a close whose match is empty, where the stretch has no text yet, ends the read, and the
    rest of the text is the implicit field's. Of delimiters that match at one place, the longest wins, then
    an open, then the first listed (:class:`State`, :func:`_settle`, :func:`_earliest`). The whitespace rules are the
    stream's (:class:`~.base.Sink`): content keeps its white space unless it is only white space, reasoning
    is stripped."""
    out = _Source()
    const = out.constant
    out.names.update({
        "_earliest": _earliest, "_UNSEEN": _UNSEEN, "_NO": _NO_GROUPS, "_W": idle.watched, "_settle": _settle,
        "_new": object.__new__, "_ToolCall": ToolCall, "_AssistantMessage": AssistantMessage,
        **{f"_call_{name}": setter for name, setter in CALL_SLOTS.items()},
        **{f"_message_{name}": setter for name, setter in MESSAGE_SLOTS.items()},
    })  # fmt: skip

    def route(field: Field | None, piece: str) -> None:
        """Append ``piece``'s text to where ``field``'s text goes (a tool-call region's is its body)."""
        if field is None or field.role == "calls":
            return
        out(f"{'content' if field.role == 'content' else 'think'}.append({piece})")

    def calls(field: Field, body: str, captures: str) -> None:
        """Parse the tool-call region ``body`` of ``field`` into calls; the region's first call keeps its text."""
        out(
            f"body = {body}",
            f"for k, (name, value, arguments, call_id, error) in enumerate({const(field.calls)}(body, {captures},"
            " params)):",
            "    call = _new(_ToolCall)  # its slots set in turn (base.CALL_SLOTS); an id left unset is made when read",
            "    _call_name(call, name)",
            "    _call_arguments(call, value)",
            "    _call_arguments_json(call, arguments)",
            "    if call_id is not None:",
            "        _call_id(call, call_id)",
            "    _call_raw(call, '' if k else body)",
            "    _call_error(call, error)",
            "    _call_index(call, len(valid) + len(invalid))",
            "    (valid if error is None else invalid).append(call)",
        )

    def groups(target: str, names: tuple[str, ...], match: str) -> bool:
        """``target`` = the groups of ``match`` that took part, by name; False when there are no names."""
        if not names:
            return False
        out(f"{target} = {{}}")
        for name in names:
            out(f"v = {match}.group({name!r})", "if v is not None:", f"    {target}[{name!r}] = v")
        return True

    def implicit_calls(end: str, captures: str) -> None:
        if implicit is not None and implicit.role == "calls":
            with out.block("if opened:"):
                calls(implicit, f"text[start:{end}]", captures)

    def nothing_found() -> None:
        if implicit is not None:
            with out.block("if n > pos:"):
                route(implicit, "text[pos:]")
                out("opened = True")
        implicit_calls("n", "_NO")
        out("break")

    def found(member: Member) -> None:
        """The code for ``member`` found at ``first`` by the match ``won``."""
        if member.closes:  # the implicit field's close
            out("had = opened")
            captures = "g" if groups("g", member.names, "won") else "_NO"
            out("end = won.end()")
            implicit_calls("first", captures)
            with out.block("if not had and first == end:"):  # a zero-width close of nothing: the rest is the sink's
                if implicit.role != "calls":  # type: ignore[union-attr]
                    with out.block("if end < n:"):
                        route(implicit, "text[end:]")
                out("break")
            out("pos = start = end", "opened = False", "continue")
            return
        field = member.field
        implicit_calls("first", "_NO")
        captures = "g" if groups("g", member.names, "won") else "_NO"
        out("pos = won.end()")
        inside = member.then
        if inside.watched:
            out(f"m = {const(inside.search)}(text, pos)", "stop = n if m is None else m.start()")
        else:  # a field that never closes runs to the end of the text
            out("m = None", "stop = n")
        if field.role != "calls":
            with out.block("if stop > pos:"):
                route(field, "text[pos:stop]")
        else:
            close = inside.single  # a region's state watches its one close
            if close is not None and close.names:  # the close's groups join the open's
                if captures == "_NO":
                    out("g = _NO")
                with out.block("if m is not None:"):
                    groups("g2", close.names, "m")
                    with out.block("if g2:"):
                        out("g = {**g, **g2}")
                captures = "g"
            calls(field, "text[pos:stop]", captures)
        out("if m is None:", "    break", "pos = start = m.end()", "opened = False", "continue")

    members = _members(idle)
    out(
        "def read(text, extract_reasoning, params):",
        "    content = []",
        "    reasoning = []",
        "    think = reasoning if extract_reasoning else content",
        "    valid = []",
        "    invalid = []",
        "    n = len(text)",
        "    pos = start = 0",
        "    opened = False",
    )
    out.depth = 1
    if idle.watched and idle.search is None:
        out(f"found = [_UNSEEN] * {slots}")
    with out.block("while True:"):
        if not idle.watched:
            nothing_found()
        else:
            if idle.search is None:  # several searches (:func:`_earliest`)
                out("best, won, first = _earliest(_W, found, text, pos, n)")
                with out.block("if best is None:"):
                    nothing_found()
            else:
                out(f"won = {const(idle.search)}(text, pos)")
                with out.block("if won is None:"):
                    nothing_found()
                out("first = won.start()")
            if implicit is not None:
                with out.block("if first > pos:"):
                    route(implicit, "text[pos:first]")
                    out("opened = True")
            if idle.search is None:
                tests = [f"best is {const(member)}" for member in members]
            elif idle.single is not None:
                tests = ["True"]
            elif idle.clash:  # searched together, and two may match here: the text there says when only one can
                for i, member in enumerate(members):
                    mine = [lit for lit, m in idle.tagged if m is member]
                    rivals = [lit for lit, m in idle.tagged if m is not member and any(_overlap(lit, a) for a in mine)]
                    alone = f" and not {_starts(rivals)}" if rivals else ""
                    with out.block(f"{'el' if i else ''}if {_starts(mine)}{alone}:"):
                        out(f"best = {const(member)}")
                with out.block("else:"):
                    out(f"best, won = _settle({const(idle.tagged)}, text, first, won)")
                tests = [f"best is {const(member)}" for member in members]
            else:  # searched together: the literal text at the match says which delimiter it is
                tests = [_starts([lit for lit, m in idle.tagged if m is member]) for member in members]
            for i, (member, test) in enumerate(zip(members, tests, strict=True)):
                last = i == len(members) - 1
                with out.block("else:" if last and i else f"{'if' if i == 0 else 'elif'} {test}:"):
                    found(member)
    out.depth = 0
    out(
        "    joined = ''.join(content)",
        "    message = _new(_AssistantMessage)",
        "    _message_content(message, joined if joined and not joined.isspace() else None)",
        "    _message_reasoning_content(message, ''.join(reasoning).strip() or None)",
        "    _message_tool_calls(message, tuple(valid))",
        "    _message_invalid_tool_calls(message, tuple(invalid))",
        "    return message",
    )
    return out.function("read", "<response-template reader>")


def _earliest(
    watched: tuple[Watched, ...], found: list[Any], text: str, pos: int, n: int
) -> tuple[Member | None, Any, int]:
    """The delimiter a state that makes several searches finds first from ``pos``: ``(member, match, start)``,
    or ``(None, None, n)``. Each search is made again only once the read has passed its last match, and the
    match taken is never taken again. Of matches at one place, the longest, then an open before a close,
    then the first listed."""
    best: Member | None = None
    won: Any = None
    first, rank, slot = n + 1, (0, False, 0), 0
    for pattern, at_slot, single, tagged in watched:
        m = found[at_slot]
        if m is _UNSEEN or (m is not None and m.start() < pos):
            m = found[at_slot] = pattern.search(text, pos)
        if m is None:
            continue
        at = m.start()
        if at > first:
            continue
        member = single
        if tagged is not None:
            member, m = _settle(tagged, text, at, m)
        place = _place(member, m)
        if at < first or place < rank:
            first, rank, best, won, slot = at, place, member, m, at_slot
    if best is None:
        return None, None, n
    found[slot] = _UNSEEN
    return best, won, first


def _place(member: Member, m: Any) -> tuple[int, bool, int]:
    """How ``member``'s match ``m`` ranks against others at the same place, the least first: the longest, then an
    open before a close, then the first listed."""
    return -m.end(), member.closes, member.order


def _settle(tagged: tuple[tuple[str, Member], ...], text: str, at: int, won: Any) -> tuple[Member, Any]:
    """Which of the delimiters searched together (``tagged``, :class:`State`) their joined match ``won``, at
    ``at``, is: the one whose literal start is there, or when several are (one's start begins another's), the
    one :func:`_earliest` picks of their own matches there (the longest, then an open, then the first listed),
    with its match."""
    found = None
    for literal, member in tagged:
        if text.startswith(literal, at):
            if found is None:
                found = member
            elif member is not found:
                break
    else:
        return found, won  # type: ignore[return-value]  # (one of them is there: the joined match is its)
    best, rank = found, None
    for member in dict.fromkeys(member for literal, member in tagged if text.startswith(literal, at)):
        m = member.pattern.match(text, at)
        if m is None:
            continue
        place = _place(member, m)
        if rank is None or place < rank:
            best, won, rank = member, m, place
    return best, won


class ResponseDecoder(Decoder):
    """A :class:`Decoder` for a response template: streams with :class:`ResponseMachine`, and reads a whole
    text in one pass (its template's compiled :attr:`~ResponseTemplate.read`), which gives what the stream gives."""

    __slots__ = ("_lead", "_params", "_rt")

    def __init__(self, decoder: Decoder, rt: ResponseTemplate, params: Mapping[str, Mapping[str, Any]], lead: str):
        super().__init__(decoder.format, decoder.options, template=decoder.template)
        self._rt, self._params, self._lead = rt, params, lead

    def decode(self, text: str | bytes) -> AssistantMessage:
        options = self.options
        if options.stops:
            return super().decode(text)
        if not isinstance(text, str):  # (str first: ``bytes | bytearray`` would build a union on every call)
            if not isinstance(text, bytes | bytearray):
                raise DecodeError(f"decode() takes model output as str or UTF-8 bytes, not {type(text).__name__}.")
            text = bytes(text).decode("utf-8", "replace")
        return self._rt.read(self._lead + text, options.extract_reasoning, self._params)


def response_format(template: ResponseTemplate, params: Mapping[str, Mapping[str, Any]], lead: str) -> Format:
    """A :class:`Format` that runs ``template`` (its machine starts by reading ``lead``)."""

    def build(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
        return ResponseMachine(out, opts, template, params, lead)

    return Format("response_template", "the model's own response_template", build, syntax=template.markers)


def decoder_from_response_template(
    response_template: Mapping[str, Any] | ResponseTemplate,
    *,
    prompt: str | None = None,
    template: ChatTemplate | str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    enable_thinking: bool | None = None,
    tools: Iterable[Mapping[str, Any] | str] | None = None,
    reasoning_format: str = "auto",
    thinking_forced_open: bool | None = None,
    stop_markers: Iterable[str] | None = None,
    tools_schema: Mapping[str, Any] | None = None,
    tag: str | None = None,
) -> Decoder:
    """A decoder that follows a transformers ``response_template`` (a dict, as in ``tokenizer_config.json``).

    The output is read after ``prompt`` (transformers' ``prefix``: its text after the last start anchor
    is read first), or after ``template``'s generation prompt (with ``chat_template_kwargs`` and
    ``enable_thinking``) when no prompt is given. ``tools`` cast string arguments by their schemas as
    transformers casts them. ``thinking_forced_open=True`` starts inside the reasoning field.

    >>> rt = {"start_anchor": "<|im_start|>assistant\\n", "fields": {
    ...     "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "repeats": True, "content": "json",
    ...                    "transform": {"type": "function", "function": "{content}"}},
    ...     "content": {"content": "text"}}}
    >>> d = decoder_from_response_template(rt, prompt="<|im_start|>assistant\\n")
    >>> d.decode('Hi.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>').tool_calls[0].arguments
    {'x': 1}
    """
    if tools_schema is not None:
        raise DecodeError("A response template casts arguments by the tools' schemas: pass tools=, not tools_schema=.")
    if tag is not None:
        raise DecodeError(
            f"The tag option is for Ollama's template-tag formats, not a response template (got {tag!r})."
        )
    loaded = load_response_template(response_template)
    chat = as_template(template) if template is not None else None
    if prompt is not None and not isinstance(prompt, str):
        raise DecodeError(f"prompt must be the prompt text, not {type(prompt).__name__}.")
    if prompt is None and chat is not None:
        kwargs = dict(chat_template_kwargs or {})
        if enable_thinking is not None:
            kwargs.setdefault("enable_thinking", enable_thinking)
        prompt = generation_prompt(chat, kwargs)
    lead = loaded.tail(prompt) if prompt else ""
    if thinking_forced_open:
        opener = next((f.open for f in loaded.fields if f.role == "reasoning" and f.open is not None), None)
        if opener is None or not opener.literals:
            raise DecodeError("thinking_forced_open needs a reasoning field that opens at a literal delimiter.")
        lead += opener.literals[0]
    listed = list(tools) if tools is not None else None
    params = tool_params([t for t in listed or () if isinstance(t, Mapping)])
    made = make_decoder(
        response_format(loaded, params, lead),
        reasoning_format=reasoning_format,
        tools=listed,
        template=chat,
        stop_markers=() if stop_markers is None else stop_markers,
        thinking_forced_open=False,
    )
    return ResponseDecoder(made, loaded, params, lead)
