"""What a chat template supports, found by rendering probe conversations.

Every flag comes from renders with sentinel values ("needles") that no template contains, never from
searching the template's text: a feature is supported when its needle comes out of the render, in the
form it went in. A probe the template rejects (``raise_exception``, a type error, a missing key) leaves
its flag false and keeps the template's own message in :attr:`Capabilities.errors`. This is how
llama.cpp's minja probes (``shared/docs/output-formats.md`` §3.3), extended to every flag
:class:`Capabilities` lists.

The probes render through :class:`~chatcodec.ChatTemplate` itself, with its special tokens and a
pinned clock; nothing here changes how a template renders. ``ChatTemplate.capabilities`` computes the
object once per template and keeps it.

>>> from chatcodec import load_template
>>> caps = load_template("qwen3").capabilities
>>> caps.tools, caps.tool_calls, caps.requires_non_null_content
(True, True, True)
>>> caps.think_state, caps.think_state_disabled, caps.stop_markers
('none', 'closed', ('<|im_end|>',))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from jinja2 import meta, nodes

from . import sandbox
from .exceptions import ChatcodecError

if TYPE_CHECKING:
    from .render import ChatTemplate

__all__ = ["THINK_TAGS", "Capabilities", "ThinkState", "probe", "think_state_of"]

ThinkState = Literal["open", "closed", "none"]

#: reasoning tag pairs that templates write (start, end); a generation prompt's think state is read
#: with these (the same tags the decoders know; Apriel's answer marker ends its reasoning too)
THINK_TAGS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<seed:think>", "</seed:think>"),
    ("<thinking>", "</thinking>"),
    ("<thinking>", "[BEGIN FINAL RESPONSE]"),
    ("[THINK]", "[/THINK]"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("<|inner_prefix|>", "<|inner_suffix|>"),
    ("<|channel>thought", "<channel|>"),
)

#: the variables every render sets; :attr:`Capabilities.variables` lists the others the template reads
_STANDARD_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})

# -- the needles ---------------------------------------------------------------------------------------
# Lower-case words and digits: they survive trim, title-case-free templates and JSON encoding unchanged.

_SYSTEM = "probe system text 4f1c"
_SYSTEM_2 = "probe second system text 8d2e"
_USER = "probe user text 7a3b"
_USER_2 = "probe user text 2c9d"
_ANSWER = "probe answer text 5e6f"
_PARTIAL = "probe partial answer 3b8a"
_REASONING = "probe reasoning text 9c4d"
_RESULT = "probe tool result 6d1e"
_RESULT_2 = "probe tool result 1f7a"
_DOCUMENT = "probe document text 0b5c"
_PART_A = "probe part one 2e4f"
_PART_B = "probe part two 8a6b"
_TOOL = "probe_lookup_tool"
_TOOL_2 = "probe_search_tool"
_ARG_KEY = "probe_key"
_ARG_VALUE = "probe value 3d7e"
_CALL_ID = "q7w8e9r0t"  # nine alphanumerics: Mistral templates reject anything else
_CALL_ID_2 = "z1x2c3v4b"
_LONG_CALL_ID = "call_probe0long0id0for0openai"
_DATE_STRING = "probe date 4a9e"
_CLOCKS = (datetime(2026, 1, 2, 3, 4, 5), datetime(2031, 7, 8, 9, 10, 11))

_NOW = _CLOCKS[0]


def _tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "Look something up.",
            "parameters": {
                "type": "object",
                "properties": {_ARG_KEY: {"type": "string", "description": "What to look up."}},
                "required": [_ARG_KEY],
            },
        },
    }


_TOOLS = [_tool(_TOOL), _tool(_TOOL_2)]


def _call(name: str, call_id: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _user(text: str = _USER) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _assistant(text: str = _ANSWER, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def _system(text: str = _SYSTEM) -> dict[str, Any]:
    return {"role": "system", "content": text}


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a template renders, found by probe renders (see the module's documentation).

    The booleans, each true exactly when its probe's needle comes out of the render:

    - ``system``: a system message's text is rendered;
    - ``multiple_system``: a second system message, later in the conversation, is rendered too;
    - ``tools``: tool definitions are rendered (the tool's name appears);
    - ``tool_calls``: an assistant tool call is rendered (its name, beyond the definitions);
    - ``tool_call_ids``: a call's id is rendered (in the call or with its result);
    - ``tool_responses``: a tool result (role ``tool``) is rendered;
    - ``parallel_tool_calls``: two calls in one assistant turn are both rendered;
    - ``reasoning``: an assistant turn's ``reasoning_content`` is rendered (the final turn);
    - ``generation_prompt``: ``add_generation_prompt`` changes the prompt;
    - ``continue_final_message``: a final assistant message can be left open to continue;
    - ``content_parts``: OpenAI lists of ``{"type": "text"}`` parts render as their text;
    - ``documents``: ``documents=`` are rendered;
    - ``requires_object_arguments``: call arguments render as written only when given as an object
      (a JSON string is rejected or printed escaped);
    - ``requires_string_arguments``: only when given as a JSON string (an object is rejected or printed
      as a Python dict);
    - ``requires_non_null_content``: an assistant tool-call turn without content (``content: null``,
      which the OpenAI SDK sends and which is dropped before rendering) fails where ``""`` renders;
    - ``requires_alternation``: two user messages in a row are rejected (or one of them lost);
    - ``requires_short_call_ids``: call ids must be nine letters and digits (Mistral): an OpenAI id
      (``call_...``) is rejected where a nine-character one renders.

    Also:

    - ``think_state``, ``think_state_enabled``, ``think_state_disabled``: how the generation prompt
      leaves reasoning, without ``enable_thinking``, with ``enable_thinking=True`` and with ``False``:
      ``"open"`` (it ends inside a think block: the model's output starts as reasoning), ``"closed"``
      (it wrote an empty or finished block: thinking is off) or ``"none"``;
    - ``think_tags``: the (start, end) reasoning tags the template writes around ``reasoning_content``,
      or None;
    - ``variables``: the template variables it reads beyond messages, tools, documents and
      ``add_generation_prompt`` (``enable_thinking``, ``bos_token``, ...), from its syntax tree;
    - ``date_dependent``: the prompt shows a date, from the clock (``strftime_now``) or the
      ``date_string`` variable;
    - ``special_tokens``: the special tokens (``bos_token``, ``eos_token``, ...) the template writes
      itself, through their variables or literally: text that must not be added again at tokenization;
    - ``stop_markers``: the text that ends an assistant turn (``<|im_end|>``), what a generation stops at;
    - ``errors``: for each false flag whose probe the template rejected, the template's own message.
    """

    system: bool
    multiple_system: bool
    tools: bool
    tool_calls: bool
    tool_call_ids: bool
    tool_responses: bool
    parallel_tool_calls: bool
    reasoning: bool
    generation_prompt: bool
    continue_final_message: bool
    content_parts: bool
    documents: bool
    requires_object_arguments: bool
    requires_string_arguments: bool
    requires_non_null_content: bool
    requires_alternation: bool
    requires_short_call_ids: bool
    think_state: ThinkState
    think_state_enabled: ThinkState
    think_state_disabled: ThinkState
    think_tags: tuple[str, str] | None
    variables: tuple[str, ...]
    date_dependent: bool
    special_tokens: tuple[str, ...]
    stop_markers: tuple[str, ...]
    errors: tuple[tuple[str, str], ...] = ()

    def think_state_for(self, enable_thinking: bool | None = None) -> ThinkState:
        """The generation prompt's think state for this ``enable_thinking`` (None: not passed)."""
        if enable_thinking is None:
            return self.think_state
        return self.think_state_enabled if enable_thinking else self.think_state_disabled

    def error(self, flag: str) -> str | None:
        """The template's message for a probe it rejected, or None."""
        return dict(self.errors).get(flag)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: booleans, strings, lists, and ``errors`` as ``{flag: message}``.

        >>> from chatcodec import load_template
        >>> load_template("gemma").capabilities.to_dict()["system"]
        True
        """
        out: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "errors":
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[field.name] = value
        return out

    @classmethod
    def flags(cls) -> tuple[str, ...]:
        """The names of the boolean capabilities, in order."""
        return tuple(f.name for f in fields(cls) if f.type == "bool" and f.name != "date_dependent")


def think_state_of(generation_prompt: str) -> ThinkState:
    """Whether ``generation_prompt`` ends inside a think block (``"open"``), after one (``"closed"``), or neither.

    Give it the text the generation prompt adds (a system prompt may well mention the tags).

    >>> think_state_of("<|im_start|>assistant\\n<think>\\n")
    'open'
    >>> think_state_of("<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n")
    'closed'
    """
    opened = max(generation_prompt.rfind(start) for start, _ in THINK_TAGS)
    closed = max(generation_prompt.rfind(end) for _, end in THINK_TAGS)
    if opened > closed:
        return "open"
    return "closed" if closed >= 0 else "none"


# -- the probes ------------------------------------------------------------------------------------------


class _Prober:
    """Renders probes for one template and keeps, per flag, the template's message when every attempt failed."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.errors: dict[str, str] = {}
        self._rendered: set[str] = set()  # flags with at least one probe that rendered

    def render(self, flag: str, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
        return self.note(flag, self.attempt(messages, **kwargs))

    def attempt(self, messages: list[dict[str, Any]], **kwargs: Any) -> str | ChatcodecError:
        kwargs.setdefault("now", _NOW)
        try:
            return self.template.render(messages, **kwargs)
        except ChatcodecError as exc:
            return exc

    def note(self, flag: str, result: str | ChatcodecError) -> str | None:
        """Record ``result`` for ``flag``; the rendered text, or None."""
        if isinstance(result, str):
            self._rendered.add(flag)
            self.errors.pop(flag, None)
            return result
        if flag not in self._rendered:
            self.errors.setdefault(flag, result.message)
        return None

    def first(
        self, flag: str, attempts: Sequence[Callable[[], str | ChatcodecError]], accept: Callable[[str], bool]
    ) -> bool:
        """True when one attempt renders and its text is accepted."""
        for attempt in attempts:
            text = self.note(flag, attempt())
            if text is not None and accept(text):
                return True
        return False


def _faithful_arguments(text: str) -> bool:
    """The probe argument came out as written: neither escaped JSON nor a Python dict.

    Only the conversation is read, after the user's message: tool definitions may print schemas as
    Python values (``['probe_key']``).
    """
    turns = text[text.rfind(_USER) :]
    return _ARG_VALUE in turns and '\\"' + _ARG_KEY not in turns and f"'{_ARG_KEY}'" not in turns


def probe(template: ChatTemplate) -> Capabilities:
    """Probe ``template``; use ``template.capabilities``, which caches the result."""
    p = _Prober(template)
    system = _has(p.render("system", [_system(), _user()]), _SYSTEM)
    multiple = [_system(), _user(), _assistant(), _system(_SYSTEM_2), _user(_USER_2)]
    calls = _CallProbes(p)
    reasoning_text = p.render("reasoning", [_user(), _assistant(reasoning_content=_REASONING)])
    reasoning = _has(reasoning_text, _REASONING)
    plain, enabled, disabled, generation_prompt = _think_states(p)
    continued = p.render("continue_final_message", [_user(), _assistant(_PARTIAL)], continue_final_message=True)
    documents = [{"title": "probe", "text": _DOCUMENT}]
    values: dict[str, Any] = dict(
        system=system,
        multiple_system=_has(p.render("multiple_system", multiple), _SYSTEM, _SYSTEM_2),
        tools=calls.tools,
        tool_calls=calls.tool_calls,
        tool_call_ids=calls.ids,
        tool_responses=calls.responses,
        parallel_tool_calls=calls.parallel,
        reasoning=reasoning,
        generation_prompt=generation_prompt,
        continue_final_message=continued is not None and continued.endswith(_PARTIAL),
        content_parts=_content_parts(p, system),
        documents=_has(p.render("documents", [_user()], documents=documents, add_generation_prompt=True), _DOCUMENT),
        requires_object_arguments=calls.object_arguments and not calls.string_arguments,
        requires_string_arguments=calls.string_arguments and not calls.object_arguments,
        requires_non_null_content=calls.tool_calls and calls.with_content("") and not calls.with_content(None),
        requires_alternation=_requires_alternation(p),
        requires_short_call_ids=calls.short_ids(),
        think_state=plain,
        think_state_enabled=enabled,
        think_state_disabled=disabled,
        think_tags=_think_tags(reasoning_text) if reasoning else None,
        variables=_variables(template),
        date_dependent=_date_dependent(p),
        special_tokens=_special_tokens(p),
        stop_markers=_stop_markers(p),
    )
    if values["requires_object_arguments"]:
        calls.keep_rejection("requires_object_arguments", string=True, content="")
    if values["requires_string_arguments"]:
        calls.keep_rejection("requires_string_arguments", string=False, content="")
    if values["requires_non_null_content"]:
        calls.keep_rejection("requires_non_null_content", string=False, content=None)
    # a message explains a capability that is missing, or a requirement that holds
    errors = sorted((flag, text) for flag, text in p.errors.items() if values.get(flag) is flag.startswith("requires_"))
    return Capabilities(**values, errors=tuple(errors))


class _CallProbes:
    """The tool probes: definitions, then a call turn in every form a request may carry.

    A call turn is rendered with object and JSON-string arguments, ``""`` and missing content (the
    OpenAI SDK's ``null``), with one or two calls, and followed by the results or last. A call counts as
    rendered when its tool's name shows more often than in the definitions alone.
    """

    def __init__(self, p: _Prober) -> None:
        self.p = p
        self._renders: dict[tuple[bool, str | None, int, bool], str | ChatcodecError] = {}
        defined = p.render("tools", [_user()], tools=_TOOLS, add_generation_prompt=True)
        self.tools = _has(defined, _TOOL)
        self._defined = ((defined or "").count(_TOOL), (defined or "").count(_TOOL_2))
        forms = [
            (string, content, last) for content in ("", None) for string in (False, True) for last in (False, True)
        ]
        self.tool_calls = p.first("tool_calls", [self._attempt(*form, 1) for form in forms], self._shows)
        self.parallel = p.first("parallel_tool_calls", [self._attempt(*form, 2) for form in forms], self._shows_both)
        self.ids = p.first("tool_call_ids", [self._attempt(*form, 1) for form in forms], _showing(_CALL_ID))
        followed = [self._attempt(*form, 1) for form in forms if not form[2]]
        self.responses = p.first("tool_responses", followed, _showing(_RESULT))
        # requirements are judged in a history (the call followed by its result), as every request has them
        self.object_arguments = self.tool_calls and self._faithful(string=False)
        self.string_arguments = self.tool_calls and self._faithful(string=True)

    def render(self, string: bool, content: str | None, last: bool, calls: int) -> str | ChatcodecError:
        key = (string, content, calls, last)
        if key not in self._renders:
            self._renders[key] = self._call_render(string, content, last, calls, (_CALL_ID, _CALL_ID_2))
        return self._renders[key]

    def _call_render(
        self, string: bool, content: str | None, last: bool, calls: int, ids: tuple[str, str]
    ) -> str | ChatcodecError:
        arguments: Any = {_ARG_KEY: _ARG_VALUE}
        if string:
            arguments = json.dumps(arguments)
        pairs = list(zip((_TOOL, _TOOL_2), ids, (_RESULT, _RESULT_2), strict=True))[:calls]
        turn = {"role": "assistant", "content": content, "tool_calls": [_call(n, i, arguments) for n, i, _ in pairs]}
        messages = [_user(), turn]
        if not last:
            messages += [{"role": "tool", "content": r, "tool_call_id": i} for _, i, r in pairs]
        return self.p.attempt(messages, tools=_TOOLS, add_generation_prompt=not last)

    def short_ids(self) -> bool:
        """A call history that renders with nine-character ids is rejected with OpenAI's long ids."""
        for (string, content, calls, last), text in list(self._renders.items()):
            if calls == 1 and not last and isinstance(text, str) and self._shows(text):
                found = self._call_render(string, content, last, calls, (_LONG_CALL_ID, _LONG_CALL_ID + "2"))
                if isinstance(found, ChatcodecError):
                    self.p.errors["requires_short_call_ids"] = found.message
                    return True
                return False
        return False

    def _attempt(self, string: bool, content: str | None, last: bool, calls: int) -> Callable[[], str | ChatcodecError]:
        return lambda: self.render(string, content, last, calls)

    def _text(self, string: bool, content: str | None) -> str | None:
        text = self.render(string, content, False, 1)
        return text if isinstance(text, str) and self._shows(text) else None

    def _shows(self, text: str) -> bool:
        return text.count(_TOOL) > self._defined[0]

    def _shows_both(self, text: str) -> bool:
        return self._shows(text) and text.count(_TOOL_2) > self._defined[1]

    def _faithful(self, string: bool) -> bool:
        return any(_faithful_arguments(self._text(string, content) or "") for content in ("", None))

    def with_content(self, content: str | None) -> bool:
        """A call turn with this content renders its call, with either form of arguments."""
        return any(self._text(string, content) is not None for string in (False, True))

    def keep_rejection(self, flag: str, string: bool, content: str | None) -> None:
        """Keep the template's message for the form it rejected (a ``requires_*`` flag that holds)."""
        for other in (content, "", None):
            found = self._renders.get((string, other, 1, False))
            if isinstance(found, ChatcodecError):
                self.p.errors[flag] = found.message
                return


def _showing(needle: str) -> Callable[[str], bool]:
    return lambda text: needle in text


def _has(text: str | None, *needles: str) -> bool:
    return text is not None and all(needle in text for needle in needles)


def _content_parts(p: _Prober, system: bool) -> bool:
    """Every message's parts render as text (the system message's too, where there is one)."""

    def parts(*texts: str) -> list[dict[str, str]]:
        return [{"type": "text", "text": t} for t in texts]

    messages = [{"role": "system", "content": parts(_SYSTEM)}] if system else []
    messages += [
        {"role": "user", "content": parts(_PART_A, _PART_B)},
        {"role": "assistant", "content": parts(_ANSWER)},
        {"role": "user", "content": parts(_USER_2)},
    ]
    text = p.render("content_parts", messages, add_generation_prompt=True)
    return _has(text, _PART_A, _PART_B, _ANSWER, _USER_2, *([_SYSTEM] if system else [])) and not any(
        quoted in (text or "") for quoted in ("'text'", '"text"', "'type'", '"type"')
    )


def _requires_alternation(p: _Prober) -> bool:
    alternating = p.render("requires_alternation", [_user(), _assistant(), _user(_USER_2)], add_generation_prompt=True)
    if alternating is None:
        return False
    doubled = p.attempt([_user(), _user(_USER_2)], add_generation_prompt=True)
    if isinstance(doubled, ChatcodecError):
        p.errors["requires_alternation"] = doubled.message  # the rejection is the finding
        return True
    return not _has(doubled, _USER, _USER_2)


def _generation_prompt(p: _Prober, **kwargs: Any) -> str | None:
    """What ``add_generation_prompt`` appends after a user turn (None if the template rejects it)."""
    with_gp = p.render("generation_prompt", [_user()], add_generation_prompt=True, **kwargs)
    without = p.render("generation_prompt", [_user()], **kwargs)
    if with_gp is None or without is None:
        return None
    common = 0
    limit = min(len(with_gp), len(without))
    while common < limit and with_gp[common] == without[common]:
        common += 1
    return with_gp[common:]


def _think_states(p: _Prober) -> tuple[ThinkState, ThinkState, ThinkState, bool]:
    plain = _generation_prompt(p)
    enabled = _generation_prompt(p, enable_thinking=True)
    disabled = _generation_prompt(p, enable_thinking=False)
    states = [think_state_of(gp) if gp is not None else "none" for gp in (plain, enabled, disabled)]
    return states[0], states[1], states[2], bool(plain)


def _think_tags(text: str | None) -> tuple[str, str] | None:
    """The known tag pair written around the reasoning needle: the start nearest before it."""
    if text is None:
        return None
    at = text.find(_REASONING)
    best: tuple[int, tuple[str, str]] | None = None
    for start, end in THINK_TAGS:
        opened = text.rfind(start, 0, at)
        if opened >= 0 and end in text[at:] and (best is None or opened > best[0]):
            best = (opened, (start, end))
    return best[1] if best else None


def _variables(template: ChatTemplate) -> tuple[str, ...]:
    """The names a template takes from its caller: read before being set, or tested for a caller's value.

    ``{% if not date_string is defined %}{% set date_string = ... %}`` reads ``date_string``; a name the
    template only sets for itself (``{% set content = ... %}``) is not a variable of the template.
    """
    names: set[str] = set()
    for source in template.sources.values():
        tree = sandbox.environment.parse(source)
        undeclared = meta.find_undeclared_variables(tree)
        assigned = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
        tested = {
            test.node.name
            for test in tree.find_all((nodes.Test, nodes.Filter))
            if isinstance(test.node, nodes.Name)
            and (test.name in ("defined", "undefined", "none") or test.name in ("default", "d"))
        }
        names |= {name for name in undeclared if name not in assigned or name in tested}
    return tuple(sorted(names - _STANDARD_VARIABLES - set(sandbox.environment.globals)))


def _date_dependent(p: _Prober) -> bool:
    messages = [_user()]
    first, second = (p.render("date_dependent", messages, add_generation_prompt=True, now=now) for now in _CLOCKS)
    if first is not None and second is not None and first != second:
        return True
    return _has(
        p.render("date_dependent", messages, add_generation_prompt=True, date_string=_DATE_STRING), _DATE_STRING
    )


#: special token variables probed besides the template's own
_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _special_tokens(p: _Prober) -> tuple[str, ...]:
    """The special tokens written through their variable (a needle shows it) or literally (the real value)."""
    known = p.template.special_tokens
    names = sorted(set(_TOKEN_NAMES) | {k for k, v in known.items() if isinstance(v, str)})
    needles = {name: f"<probe_{name}_needle>" for name in names}
    written: set[str] = set()
    for messages, gp in (([_user()], False), ([_user(), _assistant(), _user(_USER_2)], True)):
        with_needles = p.render("special_tokens", messages, add_generation_prompt=gp, **needles)
        if with_needles is None:
            continue
        written |= {name for name, needle in needles.items() if needle in with_needles}
        written |= {n for n, v in known.items() if isinstance(v, str) and len(v) > 1 and v in with_needles}
    # tokens that share a text (pad_token = eos_token) are written together
    texts = {known[name] for name in written if isinstance(known.get(name), str)}
    written |= {name for name, value in known.items() if value in texts}
    return tuple(name for name in names if name in written)


def _stop_markers(p: _Prober) -> tuple[str, ...]:
    """What the template writes first after an assistant turn's content: in a final turn, and in a turn
    followed by a user message (gpt-oss ends the two differently, ``<|return|>`` and ``<|end|>``).

    Only the first token counts (``<|end|>\n</s>`` stops at ``<|end|>``); a template that writes
    nothing after a turn gives the next user turn's header (``###Human:``).
    """
    found = []
    for messages in ([_user(), _assistant()], [_user(), _assistant(), _user(_USER_2)]):
        text = p.render("stop_markers", messages)
        if text is not None and _ANSWER in text:
            after = text[text.rfind(_ANSWER) + len(_ANSWER) :]
            if after.strip():
                found.append(_first_token(after))
    return tuple(dict.fromkeys(found))


def _first_token(text: str) -> str:
    """The first ``<...>`` or ``[...]`` token of ``text``, or its first word up to one."""
    word = text.split()[0]
    for opening, closing in (("<", ">"), ("[", "]")):
        if word.startswith(opening) and closing in word:
            return word[: word.index(closing) + 1]
    at = word.find("<", 1)
    return word[:at] if at > 0 else word
