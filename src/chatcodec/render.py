"""ChatTemplate: render messages and tools into a model's prompt, byte for byte as transformers does.

The rules come from transformers 5.24 ``apply_chat_template(tokenize=False)``; the parity notes
(``shared/docs/transformers-parity.md``) are cited by section. In order, a render:

1. picks the template (named templates: ``tool_use`` when tools are given, else ``default``, §3.3);
2. turns messages, tools, documents and template variables into plain JSON values: objects with
   ``model_dump`` and dataclasses become dicts, ``str``/``int``/``float`` subclasses their base type,
   anything else the placeholder ``"<TypeName>"`` (§5.3); messages lose their top-level ``None`` keys
   (§5.1) and get the reasoning aliases ``thinking``/``reasoning_content`` (§5.4);
3. runs the template in the sandbox (:mod:`chatcodec.sandbox`) under its :class:`~chatcodec.Limits`;
4. for ``continue_final_message``, cuts the prompt where the final message ends (§2.7).
"""

from __future__ import annotations

import dataclasses
import inspect
import marshal
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from threading import get_ident as _get_ident
from typing import Any

from . import polyfills, sandbox
from .capabilities import Capabilities, probe
from .exceptions import (
    InputError,
    RenderWarning,
    TemplateNotFoundError,
    TemplateRaisedError,
    TemplateRuntimeError,
)
from .footprint import ALIASED
from .limits import DEFAULT_LIMITS, Budget, Limits
from .limits import current as _current_state
from .limits import recorded as _recorded_state
from .sandbox import SCALARS

__all__ = ["ChatTemplate", "unwritten"]

#: the roles chat templates know; a message of another role that a template writes as nothing is worth a warning
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function", "ipython"})

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
#: appended to the text being continued, then found again in the output (§2.7); note the trailing space
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplate:
    """A chat template, ready to render conversations.

    ``source`` is the Jinja text, or a mapping of named templates (``{"default": ..., "tool_use": ...}``).
    ``special_tokens`` (``bos_token``, ``eos_token``, ...) reach the template as variables, the way
    transformers passes ``special_tokens_map``; keyword arguments given to :meth:`render` win over them.

    >>> chat = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}",
    ...                     special_tokens={"eos_token": "</s>"})
    >>> chat.render([{"role": "user", "content": "Hi!"}])
    '<user>Hi!</s>'
    """

    def __init__(
        self,
        source: str | Mapping[str, str],
        *,
        special_tokens: Mapping[str, str] | None = None,
        name: str | None = None,
        limits: Limits | None = None,
    ) -> None:
        if isinstance(source, str):
            self._sources = {"default": source}
        elif isinstance(source, Mapping) and source and all(isinstance(s, str) for s in source.values()):
            self._sources = dict(source)
        else:
            raise InputError(
                f"A chat template is Jinja text or a mapping of names to Jinja text, not {type(source).__name__}."
            )
        self.name = name
        #: transformers' ``response_template`` shipped with the template (``tokenizer_config.json``), if any
        self.response_template: dict[str, Any] | None = None
        self.special_tokens: dict[str, str] = plain(dict(special_tokens or {}))
        self._only_default = list(self._sources) == ["default"]
        self.limits = limits or DEFAULT_LIMITS
        self._compiled: dict[str, sandbox.Compiled] = {}
        self._capabilities: Capabilities | None = None
        #: the compiled default template, once a render has made it: ChatTemplate.render's short way
        self._fast: Any = None
        if "default" in self._sources:
            self._default = self._compile("default")  # report syntax errors now, not at the first render

    @property
    def source(self) -> str:
        """The Jinja text of the default template (the only one, for most models)."""
        return self._sources.get("default") or next(iter(self._sources.values()))

    @property
    def sources(self) -> dict[str, str]:
        """Every named template: ``{"default": ..., "tool_use": ..., ...}``."""
        return dict(self._sources)

    @property
    def capabilities(self) -> Capabilities:
        """What this template supports, found by probe renders once and then kept (:mod:`chatcodec.capabilities`).

        >>> ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}").capabilities.system
        True
        """
        if self._capabilities is None:
            self._capabilities = probe(self)
        return self._capabilities

    def __repr__(self) -> str:
        names = "" if self._only_default else f", templates={sorted(self._sources)}"
        return f"<ChatTemplate {self.name or 'unnamed'!r}{names}>"

    def render(
        self,
        messages: Sequence[Any],
        *,
        tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        now: datetime | None = None,
        chat_template: str | None = None,
        polyfill: polyfills.Polyfill = False,
        **template_kwargs: Any,
    ) -> str:
        """Render ``messages`` into the prompt text.

        ``continue_final_message`` leaves the last message open for the model to continue (``True``
        continues its ``content``; a field name such as ``"reasoning_content"`` continues that field).
        ``now`` pins what ``strftime_now`` reads (local time by default). ``chat_template`` picks a named
        template. ``polyfill`` rewrites the conversation into forms the template supports: ``"auto"``
        applies what it lacks, a set of names those rewrites (:mod:`chatcodec.polyfills`); the default
        renders exactly. Other keyword arguments (``enable_thinking=False``, ...) become template variables.
        """
        fast = self._fast
        if (  # the common render takes the short way (the test inline: a call costs the common render 3%)
            fast is not None
            and messages.__class__ is list
            and messages
            and polyfill is False
            and chat_template is None
            and (now is None or now.__class__ is datetime)
            and not (continue_final_message and add_generation_prompt)
            and not self.limits.isolate
        ):
            return self._render_compiled(
                fast, messages, tools, documents, add_generation_prompt, continue_final_message, now, template_kwargs
            )
        text, _, _ = self._render(
            messages, tools, documents, add_generation_prompt, continue_final_message, now, chat_template,
            template_kwargs, track_generation=False, polyfill=polyfill,
        )  # fmt: skip
        if self._fast is None and self._only_default and type(self._default.fast) is _FAST_TEMPLATE:
            self._fast = self._default.fast  # compiled by that render: later ones take the short way
        return text

    def render_with_report(
        self,
        messages: Sequence[Any],
        *,
        tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        now: datetime | None = None,
        chat_template: str | None = None,
        polyfill: polyfills.Polyfill = "auto",
        **template_kwargs: Any,
    ) -> tuple[str, tuple[str, ...]]:
        """Like :meth:`render` (polyfilling by default), and the names of the rewrites that changed the
        conversation, in the order they ran.

        >>> chat = ChatTemplate("{% for m in messages %}[{{ m.role }}] {{ m.content }}\\n{% endfor %}")
        >>> chat.render_with_report([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
        ('[user] Hi\\n', ('content_parts_to_text',))
        """
        text, _, applied = self._render(
            messages, tools, documents, add_generation_prompt, continue_final_message, now, chat_template,
            template_kwargs, track_generation=False, polyfill=polyfill,
        )  # fmt: skip
        for index in unwritten(messages, text):
            role = messages[index].get("role")
            warnings.warn(
                f"the template wrote nothing for messages[{index}] (role {role!r}, a role it does not know):"
                " its text is not in the prompt",
                RenderWarning,
                stacklevel=2,
            )
        return text, applied

    def render_spans(
        self,
        messages: Sequence[Any],
        *,
        tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        now: datetime | None = None,
        chat_template: str | None = None,
        polyfill: polyfills.Polyfill = False,
        **template_kwargs: Any,
    ) -> tuple[str, list[tuple[int, int]]]:
        """Render, and return the character spans of every ``{% generation %}`` block.

        The spans are transformers' ``return_assistant_tokens_mask`` spans, computed the same way (§2.8).
        """
        text, spans, _ = self._render(
            messages, tools, documents, add_generation_prompt, False, now, chat_template, template_kwargs,
            track_generation=True, polyfill=polyfill,
        )  # fmt: skip
        return text, spans

    # --- internals ------------------------------------------------------------------------------------

    def _render_compiled(
        self,
        fast: Any,
        messages: Any,
        tools: Sequence[Any] | None,
        documents: Sequence[Any] | None,
        add_generation_prompt: bool,
        continue_final_message: bool | str,
        now: datetime | None,
        template_kwargs: dict[str, Any],
        memo: Any = None,
    ) -> str:
        """The common render, the short way: what _render does (in the same order) without the options it
        does not use, and the compiled template called directly (as compiler.render would).

        With a ``memo`` (:class:`chatcodec.resuming.Memo`), its first ``memo.trusted`` messages are the ones
        the previous render saw, already normalized; the render resumes that one where it can, and leaves
        its record and the messages it saw in the memo (no record if it took the generic path).
        """
        try:
            if memo is None:
                chat = _normalize_messages(messages, fast.message_keys)  # plain messages are shared as they are
            else:
                tail = messages[memo.trusted :]
                normalized = _normalize_messages(tail, fast.message_keys)
                if normalized is tail:
                    chat = messages
                else:
                    chat = messages[: memo.trusted]
                    chat += normalized
            if template_kwargs:
                for value in template_kwargs.values():
                    if value.__class__ not in SCALARS:
                        template_kwargs = plain(template_kwargs)
                        break
            schemas = None if tools is None else _tool_schemas(tools, "tools" in fast.names)
            documented = None if documents is None else _documents(documents)
        except RecursionError:
            raise InputError(_TOO_DEEP) from None
        continued = None
        if continue_final_message:
            chat = list(chat)  # the caller's own list, when it needed no conversion: tag a copy
            continued = _tag_final_message(chat, continue_final_message, self._sources["default"])
        # this thread's budget from its last short render, renewed, else a new one (limits.current, inline)
        state = _recorded_state(None)
        if state is None or state.thread != _get_ident():
            state = _current_state()
        budget = state.spare
        if budget is None:
            budget = Budget(self.limits, now)
        else:
            state.spare = None  # a render nested in this one makes its own
            budget.limits = self.limits
            budget.now = now
        special = self.special_tokens
        try:
            text: str = fast.root(
                special, template_kwargs or None, chat, schemas, documented, add_generation_prompt, budget, state, memo
            )
        except Exception as exc:
            if memo is not None:
                memo.record = None
            try:
                given = (special, template_kwargs or None, chat, schemas, documented, add_generation_prompt)
                variables = _COMPILER.variables_of(given)
                text = _COMPILER.recover(exc, self._default, variables, self.name, budget)
            except TemplateRuntimeError as error:
                if not isinstance(error, TemplateRaisedError):
                    _point_at_input(error, chat, messages)
                raise
        else:
            budget.renew()
            state.spare = budget
        if memo is not None:
            memo.messages = chat
            if memo.record is not None:
                memo.record.text = text  # what the next render copies its loop's output from
        return text if continued is None else _cut_at_tag(text, continued)

    @property
    def resumable(self) -> bool:
        """Whether a render can resume the previous render of a conversation (:mod:`chatcodec.resuming`):
        the compiled default template has a loop it can take over (known after the first render)."""
        fast = self._fast
        return fast is not None and bool(fast.resumable)

    def render_resuming(
        self,
        memo: Any,
        messages: Sequence[Any],
        *,
        tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        now: datetime | None = None,
        chat_template: str | None = None,
        polyfill: polyfills.Polyfill = False,
        **template_kwargs: Any,
    ) -> str:
        """:meth:`render`, resuming the render ``memo`` holds (:mod:`chatcodec.resuming`) when the short way
        applies; else a plain render, and no record in the memo."""
        fast = self._fast
        if (
            fast is None
            or polyfill is not False
            or chat_template is not None
            or continue_final_message
            or messages.__class__ is not list
            or not messages
            or (now is not None and now.__class__ is not datetime)
            or self.limits.isolate
        ):
            memo.record = None
            return self.render(
                messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, now=now, chat_template=chat_template,
                polyfill=polyfill, **template_kwargs,
            )  # fmt: skip
        return self._render_compiled(
            fast, messages, tools, documents, add_generation_prompt, False, now, template_kwargs, memo
        )

    def _label(self, key: str) -> str | None:
        if key == "default":
            return self.name
        return f"{self.name}:{key}" if self.name else key

    def _compile(self, key: str) -> sandbox.Compiled:
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = sandbox.compile_template(self._sources[key], self._label(key))
        return compiled

    def _select(self, chat_template: str | None, tools: object) -> str:
        """The key of the template to use (§3.3)."""
        if chat_template is not None:
            if chat_template in self._sources:
                return chat_template
            raise TemplateNotFoundError(
                f"This model has no chat template named {chat_template!r}; its templates are {sorted(self._sources)}."
            )
        if tools is not None and "tool_use" in self._sources:
            return "tool_use"
        if "default" in self._sources:
            return "default"
        raise InputError(
            "This model has multiple chat templates with no default specified! Please either pass a chat "
            "template or the name of the template you wish to use to the `chat_template` argument. Available "
            f"template names are {sorted(self._sources)}."
        )

    def _render(
        self,
        messages: Sequence[Any],
        tools: Sequence[Any] | None,
        documents: Sequence[Any] | None,
        add_generation_prompt: bool,
        continue_final_message: bool | str,
        now: datetime | None,
        chat_template: str | None,
        template_kwargs: dict[str, Any],
        *,
        track_generation: bool,
        polyfill: polyfills.Polyfill = False,
    ) -> tuple[str, list[tuple[int, int]], tuple[str, ...]]:
        names = _NO_POLYFILLS if polyfill is False else polyfills.select(polyfill, lambda: self.capabilities)
        key = "default" if chat_template is None and self._only_default else self._select(chat_template, tools)
        compiled = self._compiled.get(key) or self._compile(key)

        if not messages and isinstance(messages, (list, tuple)):
            raise InputError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        if continue_final_message and add_generation_prompt:
            raise InputError(
                "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message "
                "when you want the model to continue the final message, and add_generation_prompt when you want "
                "to add a header that will prompt it to start a new assistant message instead."
            )
        if now is not None and not isinstance(now, datetime):
            raise InputError(f"now must be a datetime (it pins strftime_now), not {type(now).__name__}.")
        keys = None  # all the template can read of a message; polyfills and a worker process get every key
        if not names and not self.limits.isolate:
            keys = (_COMPILER or _load_compiler()).message_keys(compiled, self._sources[key])
        try:
            chat = _normalize_messages(messages, keys)
            variables: dict[str, Any] = (
                {**self.special_tokens, **plain(template_kwargs)} if template_kwargs else self.special_tokens.copy()
            )
            variables["tools"] = None if tools is None else _tool_schemas(tools)
            variables["documents"] = None if documents is None else _documents(documents)
        except RecursionError:
            raise InputError(_TOO_DEEP) from None
        applied: tuple[str, ...] = ()
        if names:
            chat, variables["tools"], variables["documents"], applied = polyfills.apply(
                names, chat, variables["tools"], variables["documents"]
            )
            if tools is not None and variables["tools"] is None and chat_template is None and not self._only_default:
                key = self._select(None, None)  # the tools went into the text: the template without tools
                compiled = self._compile(key)
        continued = None
        if continue_final_message:
            chat = list(chat)  # the caller's own list, when it needed no conversion: tag a copy
            continued = _tag_final_message(chat, continue_final_message, self._sources[key])
        variables["messages"] = chat
        variables["add_generation_prompt"] = add_generation_prompt

        try:
            if self.limits.isolate:
                from . import isolate  # imported on first use: only isolated renders need a worker process

                text, spans = isolate.render(
                    self._sources[key], variables, name=self._label(key), limits=self.limits, now=now,
                    track_generation=track_generation,
                )  # fmt: skip
            else:
                budget = Budget(self.limits, now, track_generation)
                text = (_COMPILER or _load_compiler()).render(
                    compiled, self._sources[key], variables, self._label(key), budget
                )
                spans = budget.spans or []
        except TemplateRuntimeError as exc:
            if not names and not isinstance(exc, TemplateRaisedError):  # the chat is still the caller's
                _point_at_input(exc, chat, messages)
            raise
        if continued is not None:
            text = _cut_at_tag(text, continued)
        return text, spans, applied


_NO_POLYFILLS: frozenset[str] = frozenset()
_TOO_DEEP = (
    "The messages, tools, documents or template variables nest too deeply or refer to themselves;"
    " pass plain JSON-like data."
)
#: chatcodec.compiler, imported on the first render (`import chatcodec` stays light)
_COMPILER: Any = None
#: its compiled form's type, which the short path of ChatTemplate.render calls directly
_FAST_TEMPLATE: Any = None


def _load_compiler() -> Any:
    global _COMPILER, _FAST_TEMPLATE
    from . import compiler

    _COMPILER = compiler
    _FAST_TEMPLATE = compiler.FastTemplate
    return compiler


def unwritten(messages: Sequence[Any], text: str) -> list[int]:
    """The indices of the messages of a role outside :data:`KNOWN_ROLES` whose text the rendered ``text`` does not
    hold: the template wrote nothing for them (:meth:`ChatTemplate.render_with_report` warns of each).

    >>> unwritten([{"role": "user", "content": "Hi"}, {"role": "wizard", "content": "Abracadabra"}], "user: Hi")
    [1]
    """
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") in KNOWN_ROLES:
            continue
        content = message.get("content")
        if isinstance(content, list):  # parts: their texts
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
            )
        if isinstance(content, str) and content.strip() and content.strip() not in text:
            out.append(index)
    return out


# --- preprocessing: what the template sees ---------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` as plain JSON types (§5.3), without touching the caller's objects.

    Values that are already plain come back as they are, not copied: the sandbox never lets a template
    change a dict or list, so sharing them is safe, and most inputs need no conversion at all.
    """
    kind = type(value)
    if kind in SCALARS:
        return value
    if (kind is dict or kind is list) and _all_plain([value]):
        return value
    return _plain_copy(value)


def _plain_copy(value: Any) -> Any:
    """:func:`plain` of a value that is not plain itself: a copy, sharing the parts that are.

    Recursive, one frame per level as transformers' own conversion (a value nested too deeply, or holding
    itself, ends in RecursionError), and not walked again at every level.
    """
    kind = type(value)
    if kind in SCALARS:
        return value
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str or (type(v) not in SCALARS and _plain_copy(v) is not v):
                return {_plain_copy(k): _plain_copy(v) for k, v in value.items()}
        return value
    if kind is list:
        for v in value:
            if type(v) not in SCALARS and _plain_copy(v) is not v:
                return [_plain_copy(v) for v in value]
        return value
    return _convert(value)


#: nesting levels and containers :func:`_all_plain` looks at before it leaves the question to the
#: recursive copy, which nests as deeply as transformers' own conversion can (deeper is RecursionError,
#: and so is a value that holds itself)
_PLAIN_LEVELS = 256
_PLAIN_CONTAINERS = 1 << 16


def _all_plain(containers: list[Any]) -> bool:
    """Whether the dicts and lists in ``containers`` hold nothing but plain JSON: exact ``str`` keys, and
    values of exact types ``str``, ``int``, ``float``, ``bool``, ``None``, ``dict`` or ``list``, at every level.

    Walked level by level, without recursion; False (the caller then copies) when it would take too long.

    >>> _all_plain([{"a": [1, 2.5, None, {"b": True}]}]), _all_plain([{"a": (1,)}]), _all_plain([{1: "a"}])
    (True, False, False)
    """
    level = containers
    seen = 0
    for _ in range(_PLAIN_LEVELS):
        seen += len(level)
        if seen > _PLAIN_CONTAINERS:
            return False
        nested: list[Any] = []
        add = nested.append
        for node in level:
            if node.__class__ is dict:
                for key, value in node.items():
                    kind = value.__class__
                    if key.__class__ is not str:
                        return False
                    if kind is str:
                        continue
                    if kind is dict or kind is list:
                        add(value)
                    elif kind not in SCALARS:
                        return False
            else:
                for value in node:
                    kind = value.__class__
                    if kind is str:
                        continue
                    if kind is dict or kind is list:
                        add(value)
                    elif kind not in SCALARS:
                        return False
        if not nested:
            return True
        level = nested
    return False


def _known_plain(containers: list[Any]) -> bool:
    """:func:`_all_plain` of tools and documents, remembered for the values marshal writes the same bytes for.

    The same tools and documents come with every request of a chat, and walking them in Python costs more than
    rendering most templates (3.5 us for two tools' schemas). ``marshal`` writes only values
    of exact built-in types (a subclass, or any other object, is a ValueError, and nothing of the caller's
    runs), one type code per value: two values it writes alike have the same types everywhere, so the same
    verdict (a bytes-like object it writes as bytes is not plain either way). Its bytes are written in C in
    a third of the walk's time, and the verdict is then a dict lookup.

    Messages are walked instead: a growing chat's list of them is new at every request (and a render that
    resumes checks only the new ones), and for a small value the bytes and a lookup cost more than the walk.

    >>> _known_plain([{"a": [1, 2.5, None, {"b": True}]}]), _known_plain([{"a": (1,)}]), _known_plain([{1: "a"}])
    (True, False, False)
    """
    try:
        key = _marshal(containers)
    except (ValueError, RecursionError):  # not exact built-in types, or nested past marshal's depth
        return _all_plain(containers)
    verdict = _VERDICTS.get(key)
    if verdict is None:
        verdict = _all_plain(containers)
        if len(key) <= _VERDICT_BYTES:
            if len(_VERDICTS) >= _VERDICT_ENTRIES:
                _VERDICTS.clear()  # bounded: the values of the chats being served come back at once
            _VERDICTS[key] = verdict
    return verdict


_marshal = marshal.dumps
#: :func:`_known_plain`'s verdicts by the values' marshal bytes (at most 256 entries of at most 16 KiB)
_VERDICTS: dict[bytes, bool] = {}
_VERDICT_ENTRIES = 256
_VERDICT_BYTES = 16 << 10


def _convert(value: Any) -> Any:
    """The slow path of :func:`plain`: anything that is not already plain JSON."""
    if isinstance(value, str):
        return str.__str__(value)  # str subclasses (enums, numpy strings) lose their extra methods
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if _is_numpy_scalar(value):
        return plain(value.item())
    as_dict = _object_as_dict(value)
    if as_dict is not None:
        return plain(as_dict)
    return f"<{type(value).__name__}>"


def _is_numpy_scalar(value: Any) -> bool:
    # numpy is never imported here: a numpy scalar's type lives in the numpy module and has .item()
    return type(value).__module__ == "numpy" and callable(getattr(value, "item", None))


def _object_as_dict(value: Any) -> dict[str, Any] | None:
    """The fields of a dataclass instance or pydantic model (an OpenAI SDK message, say), else None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        dumped = dump()
        return dumped if isinstance(dumped, dict) else None
    return None


def _normalize_messages(messages: Any, keys: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """Plain message dicts without top-level ``None`` values, with reasoning aliases (§5.1, §5.4).

    A list of messages that need none of it (plain JSON, no ``None`` value, no reasoning field: most
    conversations) is returned as it is: the sandbox never lets a template change it. With ``keys``, all the
    template can read of a message (:mod:`chatcodec.footprint`), only those keys need it.
    """
    if type(messages) is list:
        for message in messages:
            if message.__class__ is dict and len(message) == 2:
                try:
                    if message["content"].__class__ is str and message["role"].__class__ is str:
                        continue  # the common message, {"role": str, "content": str}
                except KeyError:
                    pass
            return _normalized_mixed(messages, keys)
        return messages
    return _normalized_copy(messages)


_ABSENT: Any = object()  # a key a template reads that a message does not have


def _normalized_mixed(messages: list[Any], keys: frozenset[str] | None) -> list[dict[str, Any]]:
    """:func:`_normalize_messages` of a list: the messages that need no work kept, the others copied."""
    chat: list[dict[str, Any]] | None = None  # a new list, from the first message that needs work
    nested: list[Any] = []  # the lists and dicts in messages taken as they are: checked at the end
    add = nested.append
    aliased = keys is None or not keys.isdisjoint(ALIASED)  # whether reasoning aliases can be seen
    for index, message in enumerate(messages):
        if message.__class__ is dict:
            if len(message) == 2 and message.get("content").__class__ is str and message.get("role").__class__ is str:
                if chat is not None:
                    chat.append(message)
                continue  # the common message, {"role": str, "content": str}
            if (
                not aliased or not ("reasoning_content" in message or "thinking" in message or "reasoning" in message)
            ) and (
                keys is None or not keys.isdisjoint(message)  # none of the keys: its truth may be the nulls'
            ):
                nulls = False
                for key in message if keys is None else keys:
                    if key.__class__ is not str:
                        break
                    value = message.get(key, _ABSENT)
                    kind = value.__class__
                    if kind is str or kind is int or kind is float or kind is bool or value is _ABSENT:
                        continue
                    if value is None:
                        nulls = True  # dropped (§5.1)
                    elif kind is dict or kind is list:
                        add(value)
                    else:
                        break  # a value to convert
                else:
                    if nulls:  # plain but for its nulls (an OpenAI client's "tool_calls": null): a copy without them
                        if chat is None:
                            chat = messages[:index]
                        chat.append({key: value for key, value in message.items() if value is not None})
                    elif chat is not None:
                        chat.append(message)
                    continue
        if chat is None:
            chat = messages[:index]
        chat.append(_normalized_message(message, index))
    if nested and not _all_plain(nested):
        return _normalized_copy(messages)
    return messages if chat is None else chat


def _normalized_message(message: Any, index: int) -> dict[str, Any]:
    """One message as the template sees it: a plain dict, without ``None`` values, with reasoning aliases."""
    if type(message) is not dict:
        message = _message_as_dict(message, index)
    converted: dict[str, Any] = message
    for key, value in message.items():
        if type(value) is str and type(key) is str:
            continue
        if value is None or type(key) is not str or (type(value) not in SCALARS and plain(value) is not value):
            # a copy, plain, without the keys whose value is None (§5.1); most messages need none of it
            converted = {plain(k): plain(v) for k, v in message.items() if v is not None}
            break
    if "reasoning_content" in converted or "thinking" in converted or "reasoning" in converted:
        for field in _REASONING_FIELDS:
            reasoning = converted.get(field)
            if reasoning is not None:
                return {"thinking": reasoning, **converted, "reasoning_content": reasoning}
    return converted


def _normalized_copy(messages: Any) -> list[dict[str, Any]]:
    """:func:`_normalize_messages` of messages that need work: a new list, with new dicts where needed."""
    if type(messages) is not list:
        messages = getattr(messages, "messages", messages)  # a conversation object
    if type(messages) is not list and (
        isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence)
    ):
        raise InputError(
            f"Messages must be a list of message dicts, not {type(messages).__name__}."
            ' Pass [{"role": "user", "content": "..."}, ...].'
        )
    return [_normalized_message(message, index) for index, message in enumerate(messages)]


def _message_as_dict(message: Any, index: int) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        message = _object_as_dict(message) or message
    if not isinstance(message, Mapping):
        raise InputError(
            f"Chat messages should be dicts, dataclasses or pydantic models, but got {message!r} (message {index})."
        )
    return dict(message)


def _tool_schemas(tools: Sequence[Any] | None, read: bool = True) -> list[Any] | None:
    """The tools as the template sees them: JSON schemas, plain (or as given, when the template never reads them)."""
    if tools is None:
        return None
    if type(tools) is list:
        for tool in tools:
            if tool.__class__ is not dict:
                break
        else:
            if not read or _known_plain(tools):
                return tools  # plain JSON schemas, shared as they are (the template cannot change them)
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise InputError(f"tools must be a list of tool schemas or functions, not {type(tools).__name__}.")
    schemas = []
    for tool in tools:
        if isinstance(tool, dict):
            schemas.append(plain(tool))
        elif inspect.isfunction(tool) or inspect.ismethod(tool):
            from .schema import function_schema  # imported on first use: only Python functions need it

            schemas.append(function_schema(tool))
        else:
            raise InputError(
                "Tools should either be a JSON schema, or a callable function with type hints "
                f"and a docstring suitable for auto-conversion to a schema; got {tool!r}."
            )
    return schemas


def _documents(documents: Sequence[Any] | None) -> list[Any] | None:
    if documents is None:
        return None
    if isinstance(documents, (str, bytes, Mapping)) or not isinstance(documents, Sequence):
        raise InputError(f"documents must be a list of dicts, not {type(documents).__name__}.")
    for document in documents:
        if not isinstance(document, dict):
            raise InputError(f"Documents should be a list of dicts with 'title' and 'text' keys! Got {document!r}.")
    if type(documents) is list and _known_plain(documents):
        return documents
    return plain(list(documents))  # type: ignore[no-any-return]


# --- continue_final_message (§2.7) ------------------------------------------------------------------


def _tag_final_message(chat: list[dict[str, Any]], how: bool | str, source: str) -> str:
    """Append the continuation tag to the text being continued; return that text (untagged)."""
    field = how if isinstance(how, str) else "content"
    final = chat[-1].get(field)
    if final is None:
        raise InputError(f'continue_final_message is set but the final message has no "{field}" to continue!')
    fields = [field]
    if field in _REASONING_FIELDS:
        # reasoning is copied under several names: tag every copy, accept whichever the template reads
        fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final]
    if not any(f in source for f in fields):
        raise InputError(
            f'continue_final_message is set to "{field}" but this is not an accepted field in the chat_template'
        )
    last = chat[-1] = dict(chat[-1])  # the messages may be the caller's own dicts: edit a copy
    if isinstance(final, (list, tuple)):
        blocks = last[field] = list(final)
        for at in range(len(blocks) - 1, -1, -1):
            if isinstance(blocks[at], dict) and "text" in blocks[at]:
                text: str = blocks[at]["text"]
                blocks[at] = {**blocks[at], "text": text + _CONTINUE_TAG}
                return text
        raise InputError(
            "continue_final_message is set but we could not find any text to continue in the final message!"
        )
    if not isinstance(final, str):
        raise InputError(f'continue_final_message needs text to continue, but "{field}" is {type(final).__name__}.')
    for f in fields:
        last[f] = last[f] + _CONTINUE_TAG
    return final


def _cut_at_tag(text: str, final: str) -> str:
    marker = _CONTINUE_TAG.strip()
    if final.strip() not in text or marker not in text:
        raise InputError(
            "continue_final_message is set but the final message does not appear in the chat after applying the"
            " chat template! This can happen if the chat template deletes portions of the final message. Please"
            " verify the chat template and final message in your chat to ensure they are compatible."
            f"Final message to continue: {final.strip()}\nRendered chat:\n{text}"
        )
    at = text.rindex(marker)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]  # the template kept the message's spacing
    return text[:at].rstrip()  # the template trimmed the message; trim what was before the tag too


# --- errors that point at the input ----------------------------------------------------------------


def _point_at_input(error: TemplateRuntimeError, chat: list[dict[str, Any]], given: Any) -> None:
    """Add to ``error`` which message and field a template choked on, when the failure is a common shape.

    Templates fail on shapes they were not written for (``"content": null`` beside tool calls, content
    as a list of parts, tool-call arguments as a JSON string or as an object) with Jinja's words, which
    name no message. The original text is kept whole; the pointer follows it, with the fix by hand and
    the polyfill that makes it (:mod:`chatcodec.polyfills`).
    """
    reason = error.message
    pointer = None
    missing = re.fullmatch(r"'dict object' has no attribute '(\w+)'", reason)
    if missing:
        pointer = _missing_field(missing.group(1), chat, given)
    elif reason.startswith('can only concatenate str (not "list")') or reason.startswith("'list object' has no"):
        pointer = next(
            (
                f"message {i} ({m.get('role')}) has its content as a list of parts, and this template wants a"
                " string: join the parts' text"
                for i, m in enumerate(chat)
                if isinstance(m.get("content"), list)
            ),
            None,
        )
    elif reason.startswith('can only concatenate str (not "dict")'):
        pointer = _arguments(chat, dict, "an object, and this template wants a JSON string: json.dumps it")
    elif reason in ("'str object' has no attribute 'items'", "Can only get item pairs from a mapping."):
        pointer = _arguments(chat, str, "a JSON string, and this template wants an object: json.loads it")
    if pointer:
        error.message = f'{reason}: {pointer}, or render with polyfill="auto"'


def _missing_field(field: str, chat: list[dict[str, Any]], given: Any) -> str | None:
    """The first message without ``field`` when that is a shape problem: content, or a field given as null."""
    for index, message in enumerate(chat):
        if field in message:
            continue
        original = given[index] if isinstance(given, (list, tuple)) and index < len(given) else None
        was_null = isinstance(original, Mapping) and field in original and original[field] is None
        if field == "content" or was_null:
            state = f'"{field}": null (transformers drops null fields)' if was_null else f'no "{field}"'
            fix = '"content": ""' if field == "content" else f'a "{field}"'
            return f"message {index} ({message.get('role')}) has {state}, and this template reads it: give it {fix}"
    return None


def _arguments(chat: list[dict[str, Any]], kind: type, what: str) -> str | None:
    for index, message in enumerate(chat):
        calls = message.get("tool_calls")
        for number, call in enumerate(calls if isinstance(calls, list) else []):
            function = call.get("function", call) if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), kind):
                return f"message {index} ({message.get('role')}) tool_calls[{number}] arguments are {what}"
    return None
