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

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..exceptions import DecodeError
from ..render import ChatTemplate
from .base import AssistantMessage, Sink, ToolCall, new_call_id, parse_arguments
from .format import Decoder, Format
from .machine import MachineBase, Options, ThinkSpec
from .prompt import as_template, generation_prompt
from .registry import make_decoder
from .response_content import PARSERS, cast_arguments, parse_content, regex_module, tool_params

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
    #: the transform compiled (:func:`_shaper`): a scope in, the transformed value out
    shape: Callable[[Mapping[str, Any]], Any] | None = None


@dataclass(frozen=True, slots=True)
class ResponseTemplate:
    """A validated response template: its fields, the implicit one, and its start anchor."""

    spec: Mapping[str, Any]
    fields: tuple[Field, ...]
    implicit: Field | None
    anchor: Delimiter
    #: what is watched outside every explicit region, and inside each: ``(0 open | 1 close, field, pattern, slot)``
    idle: tuple[tuple[int, Field, Any, int], ...] = ()
    closes: Mapping[str, tuple[tuple[int, Field, Any, int], ...]] = dataclasses.field(default_factory=dict)

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


def load_response_template(spec: Any) -> ResponseTemplate:
    """Validate a ``response_template`` dict as transformers 5.24 does, and compile it.

    Anything transformers would reject, and any field chatcodec has no place for, is a one-line
    :class:`~chatcodec.DecodeError`.
    """
    if isinstance(spec, ResponseTemplate):
        return spec
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
    count = len(fields)
    opens = [(0, f, f.open.whole, i) for i, f in enumerate(fields) if f.open is not None]
    closes = {f.name: ((1, f, f.close.whole, count + i),) if f.close else () for i, f in enumerate(fields)}
    idle = (*opens, *(closes[sink.name] if sink else ()))
    return ResponseTemplate(spec, fields, sink, anchor, idle, closes)


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
    shape = None if transform is None else _shaper(transform)
    return Field(name, role, opener, closer, parser, args, transform, each, shape)


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
        return Delimiter(compiled, None, False, _whole_pattern(compiled))
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
_to_json = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(..., ensure_ascii=False), made once


def parsed_calls(
    field: Field, body: str, captures: Mapping[str, str], params: Mapping[str, Mapping[str, tuple[str, ...]]]
) -> list[Call]:
    """Each call of a closed tool-call region (:data:`Call`); one invalid call holding the whole region
    when it does not parse. ``params`` is :func:`~.response_content.tool_params` of the tools."""
    try:
        value = _transformed(field, body, captures)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        reason = f"the tool call does not parse with the response template: {str(exc).splitlines()[0]}"
        return [(str(captures.get("name", "")), "", "", None, reason)]
    return [_call_of(item, params) for item in (value if isinstance(value, list) else [value])]


def _transformed(field: Field, body: str, captures: Mapping[str, str]) -> Any:
    value = parse_content(field.parser, body, field.args)
    if field.shape is None:
        return value
    if field.transform_each:
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise ValueError("transform_each needs a list of objects")
        return [field.shape({**captures, **item}) for item in value]
    return field.shape({**captures, "content": value})


def _shaper(transform: Any) -> Callable[[Mapping[str, Any]], Any]:
    """``transform`` compiled once: a function of the scope (captures and the parsed content) that builds
    the value, with each ``{placeholder}`` looked up as transformers looks it up (a missing key is a
    ``KeyError``, a lookup into a string a ``TypeError``)."""
    if isinstance(transform, Mapping):
        parts = [(key, _shaper(value)) for key, value in transform.items()]
        return lambda scope: {key: part(scope) for key, part in parts}
    if isinstance(transform, list):
        items = [_shaper(value) for value in transform]
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


def _call_of(item: Any, params: Mapping[str, Mapping[str, tuple[str, ...]]]) -> Call:
    """One parsed call (:data:`Call`), its arguments cast by the tool's schema. The arguments are the value
    their JSON parses back to (what a stream's message holds), so a whole read need not parse it again."""
    fn = item.get("function", item) if isinstance(item, dict) else None
    if not isinstance(fn, dict):
        return "", item, _to_json(item), None, "the tool call is not an object"
    name = fn.get("name")
    arguments = fn.get("arguments", fn.get("parameters", {}))
    if isinstance(arguments, str):
        arguments, ok = parse_arguments(arguments)
        if not ok:
            return str(name or ""), arguments, json.dumps(arguments), None, "the arguments are not valid JSON"
    if isinstance(name, str) and isinstance(arguments, dict) and "function" in item and name in params:
        arguments = cast_arguments(arguments, params[name])
    call_id = item.get("id") if isinstance(item.get("id"), str) and item.get("id") else None
    if not isinstance(name, str) or not name:
        return "", arguments, _to_json(arguments), call_id, "the tool call has no name"
    return name, arguments, _to_json(arguments), call_id, None


_UNSEEN = object()


def read_whole(
    rt: ResponseTemplate,
    params: Mapping[str, Mapping[str, tuple[str, ...]]],
    text: str,
    extract_reasoning: bool = True,
) -> AssistantMessage:
    """The message in a whole text: :class:`ResponseMachine`'s regions, found in one pass with nothing to
    wait for (no partial matches), each delimiter searched again only once the text has passed its last
    match; the whitespace rules are the stream's (:class:`~.base.Sink`)."""
    implicit, idle, closes = rt.implicit, rt.idle, rt.closes
    found: list[Any] = [_UNSEEN] * (2 * len(rt.fields))
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    captures: dict[str, str] = {}
    groups: dict[str, str] = {}
    current, opened, start, pos, n = implicit, False, 0, 0, len(text)
    while True:
        watch = idle if current is implicit else closes[current.name]  # type: ignore[union-attr]
        best: Any = None
        first = n + 1
        for kind, field, pattern, slot in watch:
            m = found[slot]
            if m is _UNSEEN or (m is not None and m.start() < pos):
                m = found[slot] = pattern.search(text, pos)
            if m is not None:
                at = m.start()
                if at < first or (at == first and (m.end(), -kind) > (best[2].end(), -best[0])):
                    first, best = at, (kind, field, m, slot)
        end = n if best is None else first
        if end > pos and current is not None:  # the text before the delimiter is the current region's
            opened = True
            role = current.role
            if role == "content" or (role == "reasoning" and not extract_reasoning):
                content.append(text[pos:end])
            elif role == "reasoning":
                reasoning.append(text[pos:end])
        had = opened
        if best is not None:
            kind, field, m, slot = best
            pos = m.end()
            found[slot] = _UNSEEN  # never the same match twice
            groups = {k: v for k, v in m.groupdict().items() if v is not None} if m.re.groupindex else {}
            if kind == 1 and groups:
                captures = {**captures, **groups}
        if current is not None and opened and current.role == "calls":
            body = text[start:end]
            for k, (name, value, arguments, call_id, error) in enumerate(parsed_calls(current, body, captures, params)):
                raw = "" if k else body  # the region's first call holds its text
                calls.append(ToolCall(name, value, arguments, call_id or new_call_id(), raw, error, len(calls)))
        current, opened, captures = implicit, False, {}
        if best is None or (best[0] == 1 and not had and first == pos):
            rest = best is not None and pos < n and implicit is not None and implicit.role != "calls"
            if rest and implicit is not None:  # a zero-width close of nothing: the rest is the sink's
                (content if implicit.role == "content" or not extract_reasoning else reasoning).append(text[pos:])
            break
        if best[0] == 0:
            current, opened, captures, start = best[1], True, groups, pos
    joined = "".join(content)
    return AssistantMessage(
        joined if joined.strip() else None,
        "".join(reasoning).strip() or None,
        tuple(c for c in calls if c.error is None),
        tuple(c for c in calls if c.error is not None),
    )


class ResponseDecoder(Decoder):
    """A :class:`Decoder` for a response template: streams with :class:`ResponseMachine`, and reads a whole
    text in one pass (:func:`read_whole`), which gives what the stream gives."""

    __slots__ = ("_lead", "_params", "_rt")

    def __init__(self, decoder: Decoder, rt: ResponseTemplate, params: Mapping[str, Mapping[str, Any]], lead: str):
        super().__init__(decoder.format, decoder.options, template=decoder.template)
        self._rt, self._params, self._lead = rt, params, lead

    def decode(self, text: str | bytes) -> AssistantMessage:
        if self.options.stops:
            return super().decode(text)
        if isinstance(text, bytes | bytearray):
            text = bytes(text).decode("utf-8", "replace")
        elif not isinstance(text, str):
            raise DecodeError(f"decode() takes model output as str or UTF-8 bytes, not {type(text).__name__}.")
        return read_whole(self._rt, self._params, self._lead + text, self.options.extract_reasoning)


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
