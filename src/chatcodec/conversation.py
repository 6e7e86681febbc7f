"""Conversations token in, token out: the ids a model was given and sampled, kept exactly, turn after turn.

RL and agent loops generate a turn, append tool results, and generate again. Re-rendering the messages and
re-tokenizing the model's own text gives ids the model never produced: BPE merges differently across a
boundary, the template rewrites history (Qwen3 drops earlier reasoning), whitespace is normalized, a tool
call is re-serialized. A :class:`Conversation` (:meth:`chatcodec.Codec.conversation`) is append-only:

* :meth:`Conversation.append` adds messages and returns only the ids they add: the template's text for them
  (and the generation prompt when asked), after the end of the last assistant turn;
* :meth:`Conversation.add_completion` takes the sampled ids verbatim, decodes them with the template's
  decoder, and keeps them (and their logprobs) as they are. The text the template writes after an assistant
  turn (Qwen's ``\\n`` after ``<|im_end|>``, or the whole end of turn when the model was cut off) comes with
  the next append, as template text: the model's text is never tokenized again.

How the new text is found, without looking at the history: the template renders a window, the messages from
the last user message on (at most :data:`WINDOW`, and a leading system message), once as it is and once with
the new messages. The new text is what the longer render adds. When the template rewrites the window once
more messages follow (Qwen3's reasoning), the end of the last message's turn is found with a marker in its
content instead. So a turn costs its own messages, however long the conversation is.

``mode="template"`` follows a fresh :meth:`~chatcodec.Codec.encode` of the messages instead, and when that
no longer starts with the ids so far, :meth:`Conversation.append` returns a :class:`Reset` naming where the
prompt changed. Its cost is an encode's (the codec's memory makes that the new text, mostly).

A conversation is not for sharing between threads: a call while another is running raises
:class:`~chatcodec.ConversationError`, and leaves the state as it was. So does every other error: a call
either happens whole or not at all.
"""

from __future__ import annotations

import numbers
import operator
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .decoders import AssistantMessage, Decoder, decoder_for
from .exceptions import ChatcodecError, ConversationError, InputError
from .vocab import common_prefix

if TYPE_CHECKING:
    from .tokens import Codec

__all__ = ["WINDOW", "Conversation", "Drift", "Reset"]

Mode = Literal["extend", "template"]
_MODES = ("extend", "template")
#: how many of the last messages a window render may reach back for the last user message
WINDOW = 16
#: marks the end of a message's content in a window render: a noncharacter, never in text (checked)
_MARK = "\U0010fffe"


@dataclass(frozen=True)
class Reset:
    """What ``mode="template"``'s :meth:`Conversation.append` returns when the fresh render rewrote the prompt:
    the ids from ``position`` on are now ``ids`` (the model's cache from there on is stale)."""

    position: int
    ids: list[int]


@dataclass(frozen=True)
class Drift:
    """How a conversation's ids compare with a fresh :meth:`~chatcodec.Codec.encode` of its messages.

    ``position`` is the first token that differs (None: the same ids), ``ours`` and ``fresh`` the text
    around it in each, and ``reason`` why: ``"boundary"`` (the same text, tokenized differently across the
    edge of a turn), ``"rewritten"`` (the template renders history differently once more messages follow)
    or ``"normalized"`` (the template writes the model's message differently from how the model wrote it:
    whitespace, a re-serialized tool call).
    """

    position: int | None
    reason: Literal["boundary", "rewritten", "normalized"] | None = None
    ours: str = ""
    fresh: str = ""

    @property
    def equal(self) -> bool:
        return self.position is None

    def __str__(self) -> str:
        if self.position is None:
            return "no drift: a fresh encode gives the same ids"
        return f"drift at token {self.position} ({self.reason}): ours {self.ours!r}, fresh {self.fresh!r}"


class Conversation:
    """An append-only conversation for one model: the ids it was given and sampled, and its messages.

    Made by :meth:`chatcodec.Codec.conversation`. The initial ``messages`` are encoded as
    :meth:`~chatcodec.Codec.encode` does.

    >>> from chatcodec import load
    >>> codec = load("../shared/tokenizers/qwen3")  # doctest: +SKIP
    >>> conv = codec.conversation([{"role": "system", "content": "Be brief."}])  # doctest: +SKIP
    >>> prompt = conv.append({"role": "user", "content": "Hi"}, add_generation_prompt=True)  # doctest: +SKIP
    >>> sampled = codec.tokenizer.encode("Hello!<|im_end|>").ids  # what the model sampled  # doctest: +SKIP
    >>> conv.add_completion(sampled).content  # doctest: +SKIP
    'Hello!'
    """

    def __init__(
        self,
        codec: Codec,
        messages: Sequence[Any] = (),
        *,
        tools: Any = None,
        documents: Any = None,
        mode: Mode = "extend",
        variables: Mapping[str, Any] | None = None,
    ) -> None:
        if mode not in _MODES:
            raise InputError(f"mode must be 'extend' or 'template', not {mode!r}.")
        self.codec = codec
        self.mode: Mode = mode
        self._size = codec.vocabulary_size()
        self._options: dict[str, Any] = {"tools": tools, "documents": documents, **(variables or {})}
        self._messages: list[Any] = []
        self._ids: list[int] = []
        self._sampled: list[int] = []
        self._logprobs: list[float | None] = []
        self._texts: list[str] = []  # the text of each piece of ids, in order
        #: (start, end, message index) of each completion's ids
        self._completions: list[tuple[int, int, int]] = []
        self._decoding: Decoder | None = None
        self._awaiting = False  # the ids end with a generation prompt: add_completion comes next
        self._stop: str | None = None  # after a completion: the control token it ended on ("" for none)
        self._last_user = -1
        self._busy = threading.Lock()
        initial = _messages(messages)
        if initial:
            encoding = codec.encode(initial, **self._options)
            self._commit(initial, encoding.input_ids, encoding.text, awaiting=False)

    def __repr__(self) -> str:
        state = "awaiting a completion" if self._awaiting else "open"
        return f"<Conversation {len(self._messages)} messages, {len(self._ids)} tokens, {self.mode}, {state}>"

    # --- what it holds ---------------------------------------------------------------------------------

    @property
    def input_ids(self) -> list[int]:
        """Every id so far: what the model was given, and what it sampled (a copy)."""
        return list(self._ids)

    @property
    def messages(self) -> list[Any]:
        """The messages so far, completions as the decoder read them (OpenAI form; a copy of the list)."""
        return list(self._messages)

    @property
    def sampled_mask(self) -> list[int]:
        """1 exactly on the ids the model sampled (given to :meth:`add_completion`), 0 elsewhere."""
        return list(self._sampled)

    @property
    def logprobs(self) -> list[float | None]:
        """The logprob of each sampled id, as given to :meth:`add_completion`; None elsewhere."""
        return list(self._logprobs)

    @property
    def awaiting(self) -> bool:
        """True when the ids end with a generation prompt: :meth:`add_completion` comes next."""
        return self._awaiting

    @property
    def options(self) -> dict[str, Any]:
        """What every render of this conversation is given: ``tools``, ``documents`` and the template variables
        (a copy)."""
        return dict(self._options)

    @property
    def text(self) -> str:
        """The text of the ids: template text as rendered, completions as the tokenizer decodes them."""
        return "".join(self._texts)

    def __len__(self) -> int:
        return len(self._ids)

    def to_row(self) -> dict[str, Any]:
        """A training row: :func:`chatcodec.format_dataset`'s columns (``assistant_masks`` is the sampled mask:
        what the model produced) plus ``sampled_mask``, ``logprobs`` and the ``messages``."""
        return {
            "input_ids": list(self._ids),
            "attention_mask": [1] * len(self._ids),
            "assistant_masks": list(self._sampled),
            "num_tokens": len(self._ids),
            "error": None,
            "sampled_mask": list(self._sampled),
            "logprobs": list(self._logprobs),
            "messages": list(self._messages),
        }

    # --- growing it --------------------------------------------------------------------------------------

    def append(self, messages: Any, *, add_generation_prompt: bool = False) -> list[int] | Reset:
        """Add user, tool or system messages (one, or a list); return the ids they add to the model's input.

        ``add_generation_prompt=True`` on the call before generating adds the assistant turn's header; then
        :meth:`add_completion` comes next. In ``mode="template"`` the result is a :class:`Reset` when the
        template rewrote the prompt before its end.
        """
        with self._using():
            new = _messages([messages] if isinstance(messages, Mapping) else messages)
            if self._awaiting:
                raise ConversationError(
                    "The conversation ends with a generation prompt, awaiting the model's turn: pass its ids to"
                    " add_completion() before appending more messages."
                )
            if not isinstance(add_generation_prompt, bool):
                raise InputError(f"add_generation_prompt must be True or False, not {add_generation_prompt!r}.")
            if not new and not add_generation_prompt:
                return []
            if self.mode == "template":
                return self._append_fresh(new, add_generation_prompt)
            if not self._messages:
                encoding = self.codec.encode(new, add_generation_prompt=add_generation_prompt, **self._options)
                ids, text = encoding.input_ids, encoding.text
            else:
                ids, text = self._extension(new, add_generation_prompt)
            self._commit(new, ids, text, awaiting=add_generation_prompt)
            return list(ids)

    def add_completion(self, token_ids: Iterable[int], *, logprobs: Iterable[float] | None = None) -> AssistantMessage:
        """Take the ids the model sampled, verbatim (with the stop token it ended on, if any), and return the
        assistant message the template's decoder reads in them; the ids and logprobs are kept as they are."""
        with self._using():
            if not self._awaiting:
                if self._stop is not None:
                    raise ConversationError(
                        "A completion was added already, and no generation prompt follows it: append the next"
                        " messages with add_generation_prompt=True first."
                    )
                raise ConversationError(
                    "No generation prompt to complete: append messages with add_generation_prompt=True first."
                )
            ids = self._checked_ids(token_ids)
            scores = self._checked_logprobs(logprobs, len(ids))
            codec = self.codec
            text = codec.decode(ids)
            last = codec.decode(ids[-1:]) if ids else ""
            stop = last if last in codec.control_tokens else ""
            message = self._decoder().decode(text)
            found = message.to_openai()
            found.pop("invalid_tool_calls", None)
            if found["content"] is None:  # a turn of calls only: templates read content as text
                found["content"] = ""
            start = len(self._ids)
            self._messages.append(found)
            self._ids += ids
            self._sampled += [1] * len(ids)
            self._logprobs += scores
            self._texts.append(text)
            self._completions.append((start, len(self._ids), len(self._messages) - 1))
            self._awaiting, self._stop = False, stop
            return message

    def drift(self) -> Drift:
        """Compare with a fresh :meth:`~chatcodec.Codec.encode` of :attr:`messages`: the same ids, or the first
        that differs, the text around it in both, and why (see :class:`Drift`)."""
        with self._using():
            codec = self.codec
            fresh = codec.encode(self._messages, add_generation_prompt=self._awaiting, **self._options)
            at = _first_difference(self._ids, fresh.input_ids)
            if at is None:
                return Drift(None)
            ours_text = codec.decode(self._ids)
            fresh_text = codec.decode(fresh.input_ids)
            where = common_prefix(ours_text, fresh_text)
            ours = ours_text[max(0, where - 20) : where + 40]
            theirs = fresh_text[max(0, where - 20) : where + 40]
            if ours_text == fresh_text:  # the same text: the tokens around the first difference show the split
                ours = codec.decode(self._ids[max(0, at - 4) : at + 4])
                theirs = codec.decode(fresh.input_ids[max(0, at - 4) : at + 4])
                return Drift(at, "boundary", ours, theirs)
            for start, stop, index in self._completions:
                before = len(codec.decode(self._ids[:start]))
                if before <= where < before + len(codec.decode(self._ids[start:stop])):
                    # as the last message, does the template write the model's text as the model did?
                    alone = codec.encode(self._messages[: index + 1], **self._options)
                    alone_text = codec.decode(alone.input_ids)
                    if common_prefix(alone_text, ours_text) > where:
                        return Drift(at, "rewritten", ours, theirs)
                    return Drift(at, "normalized", ours, theirs)
            return Drift(at, "rewritten", ours, theirs)

    # --- internals ---------------------------------------------------------------------------------------

    @contextmanager
    def _using(self) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise ConversationError(
                "This conversation is in use by another thread: a conversation is not shared between threads"
                " (make one per rollout)."
            )
        try:
            yield
        except RecursionError:
            raise InputError(
                "The messages nest too deeply or refer to themselves; pass plain JSON-like data."
            ) from None
        finally:
            self._busy.release()

    def _decoder(self) -> Decoder:
        """The template's decoder, made once: where its output starts (inside reasoning or not) comes from the
        generation prompt with this conversation's template variables, as every turn's is."""
        if self._decoding is None:
            options = self._options
            variables = {k: v for k, v in options.items() if k not in ("tools", "documents", "polyfill")}
            tools = [t for t in options["tools"] or () if isinstance(t, Mapping)] or None
            self._decoding = decoder_for(
                self.codec.template,
                chat_template_kwargs=variables,
                tools=tools,
                polyfill=options.get("polyfill", False),  # tools rendered into the system text: read as asked
            )
        return self._decoding

    def _commit(self, new: list[Any], ids: list[int], text: str, *, awaiting: bool) -> None:
        """Add what an append made (nothing here can fail: a call happens whole or not at all)."""
        for index, message in enumerate(new):
            if message.get("role") == "user":
                self._last_user = len(self._messages) + index
        self._messages += new
        self._ids += ids
        self._sampled += [0] * len(ids)
        self._logprobs += [None] * len(ids)
        self._texts.append(text)
        self._awaiting, self._stop = awaiting, None

    def _window(self) -> list[Any]:
        """The messages a window render starts from: from the last user message on (at most :data:`WINDOW`),
        behind the first message when it is a system message."""
        messages = self._messages
        start = max(self._last_user, len(messages) - WINDOW, 0)
        head = [messages[0]] if start > 0 and messages[0].get("role") in ("system", "developer") else []
        return head + messages[start:]

    def _extension(self, new: list[Any], generation: bool) -> tuple[list[int], str]:
        """The ids and text of ``new`` after the conversation so far: what the template writes after the end
        of the last turn (the end of the model's turn, when it left some unwritten), found in window renders."""
        codec = self.codec
        render = codec.template.render
        window = self._window()
        count = len(window)
        shielded, options, restore = codec._shielded(window + new, self._options)
        before = render(shielded[:count], **options)
        after = render(shielded, add_generation_prompt=generation, **options)
        if after.startswith(before):
            added = after[len(before) :]
        else:
            added = self._rewritten(shielded, count, options, generation)
        glue = self._glue(before, shielded[:count], options) if self._stop is not None else ""
        tokens = codec._piece(glue + added, restore)
        return list(tokens.ids), tokens.text

    def _closing(self, window: list[Any], last: Any, options: dict[str, Any]) -> str | None:
        """What the template writes after the content of ``last`` as the last message of ``window``, or None
        when it does not write that content (a turn of tool calls only, in some templates)."""
        marked = _marked(last)
        if marked is None:
            return None
        text = self.codec.template.render([*window, marked], **options)
        return text[text.index(_MARK) + 1 :] if text.count(_MARK) == 1 else None

    def _glue(self, before: str, window: list[Any], options: dict[str, Any]) -> str:
        """What the template writes after the model's text at the end of its turn: after the stop token the
        model ended on, or the whole end of the turn when the model was cut off (see :func:`_glue`)."""
        stop = self._stop or ""
        control = self.codec._marks.tokens
        if stop:
            at = before.rfind(stop)
            if at >= 0 and control.search(before, at + len(stop)) is None:
                return before[at + len(stop) :]
        # a turn the model was cut off in, or one the template ends with another token: the end of a text turn
        for last in (window[-1], {"role": "assistant", "content": ""}):
            closing = self._closing(window[:-1], last, options)
            if closing is not None:
                return _glue(closing, stop, control)
        raise ChatcodecError(
            f"Template {self.codec.template.name or 'unnamed'!r} does not render an assistant message's content,"
            " so the end of its turn cannot be found; use mode='template'."
        )

    def _rewritten(self, shielded: list[Any], count: int, options: dict[str, Any], generation: bool) -> str:
        """The text of the new messages when the template renders the window differently once they follow: what
        comes after the end of the last turn, found by a marker at the end of its content."""
        render = self.codec.template.render
        last = shielded[count - 1]
        closing = self._closing(shielded[: count - 1], last, options)
        marked = _marked(last)
        if marked is not None and closing is not None:
            text = render(
                [*shielded[: count - 1], marked, *shielded[count:]], add_generation_prompt=generation, **options
            )
            if text.count(_MARK) == 1:
                end = text.index(_MARK) + 1
                if text.startswith(closing, end):
                    return text[end + len(closing) :]
        # the template writes the end of a conversation differently from the middle of one (an end-of-text
        # token, a final channel): what it wrote stays, and the new text goes on from where the renders part,
        # moved back to the start of a control token it would cut (drift() names this rewrite)
        before = render(shielded[:count], **options)
        after = render(shielded, add_generation_prompt=generation, **options)
        at = common_prefix(before, after)
        for found in self.codec._marks.tokens.finditer(after, max(0, at - self.codec._require_tokenizer().longest)):
            if found.start() < at < found.end():
                at = found.start()
                break
        return after[at:]

    def _append_fresh(self, new: list[Any], generation: bool) -> list[int] | Reset:
        """``mode="template"``: the ids of a fresh encode, as an extension or as a :class:`Reset`."""
        encoding = self.codec.encode(self._messages + new, add_generation_prompt=generation, **self._options)
        ids = encoding.input_ids
        at = _first_difference(self._ids, ids)
        kept = len(self._ids) if at is None else at
        del self._ids[kept:], self._sampled[kept:], self._logprobs[kept:]
        self._completions = [span for span in self._completions if span[1] <= kept]
        self._commit(new, ids[kept:], "", awaiting=generation)
        self._texts = [encoding.text]
        return ids[kept:] if at is None else Reset(at, ids[kept:])

    def _checked_ids(self, token_ids: Iterable[int]) -> list[int]:
        """The ids as Python ints (NumPy's and torch's integers too), each in the vocabulary."""
        if isinstance(token_ids, (str, bytes, Mapping)) or not isinstance(token_ids, Iterable):
            raise InputError(f"add_completion takes a list of token ids, not {type(token_ids).__name__}.")
        ids = []
        size = self._size
        for token in token_ids:
            try:
                value = operator.index(token) if not isinstance(token, bool) else -1
            except TypeError:
                value = -1
            if not 0 <= value < size:
                raise InputError(f"Token id {token!r} is not in the vocabulary (0 to {size - 1}).")
            ids.append(value)
        return ids

    @staticmethod
    def _checked_logprobs(logprobs: Iterable[float] | None, count: int) -> list[float | None]:
        if logprobs is None:
            return [None] * count
        if isinstance(logprobs, (str, bytes, Mapping)) or not isinstance(logprobs, Iterable):
            raise InputError(f"logprobs must be a list of numbers, one per id, not {type(logprobs).__name__}.")
        scores: list[Any] = list(logprobs)  # what the caller passed: checked here, not trusted
        if len(scores) != count:
            raise InputError(f"logprobs has {len(scores)} values for {count} ids: give one per id.")
        for score in scores:
            if isinstance(score, bool) or not isinstance(score, numbers.Real):
                raise InputError(f"logprobs must be numbers, not {score!r}.")
        return [float(score) for score in scores]


def _messages(messages: Any) -> list[Any]:
    """The messages of an append, checked for the shape every template needs: mappings with a role."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InputError(f"Messages must be a message (a dict) or a list of them, not {type(messages).__name__}.")
    found = list(messages)
    for index, message in enumerate(found):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InputError(f"Message {index} must be a dict with a 'role' string, not {message!r:.80}.")
        if _MARK in repr(message):
            raise InputError(f"Message {index} holds U+10FFFE, a noncharacter chatcodec uses as a marker.")
    return [dict(message) for message in found]


def _marked(message: Any) -> dict[str, Any] | None:
    """``message`` with a marker after its content (None when its content is not text)."""
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return None
    return {**message, "content": (content or "") + _MARK}


def _glue(closing: str, stop: str, control: re.Pattern[str]) -> str:
    """What the template writes after the model's text, given the end of its turn after the content
    (``closing``) and the control token the model ended on (``stop``, "" when it was cut off)."""
    if not stop:
        return closing
    at = closing.find(stop)
    if at >= 0:
        return closing[at + len(stop) :]
    found = control.search(closing)  # the model ended its turn with another control token than the template
    return closing[found.end() :] if found is not None else ""


def _first_difference(ours: list[int], theirs: list[int]) -> int | None:
    """The first index where the two lists differ (one ending counts), or None when ``theirs`` starts with all
    of ``ours``."""
    count = len(ours)
    if theirs[:count] == ours:
        return None
    low, high = 0, min(count, len(theirs))  # ours[:low] agree; the first difference is below high or at it
    while low < high:
        middle = (low + high + 1) // 2
        if theirs[low:middle] == ours[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low
