"""Codec: chat messages to token ids, with no double BOS, no special-token injection, and assistant masks.

A :class:`Codec` is a :class:`~chatcodec.ChatTemplate` plus a tokenizer from the ``tokenizers`` library
(never transformers), or any :class:`~chatcodec.TextTokenizer` (llama.cpp's for a GGUF:
:class:`chatcodec.backends.GGUFTokenizer`). :meth:`Codec.encode` renders the conversation and tokenizes
the prompt so that:

* **ids match transformers.** The template owns BOS and EOS: the prompt is tokenized with
  ``add_special_tokens=False``, as ``apply_chat_template(tokenize=True)`` does (parity notes §2.10), so a
  template that writes BOS never gets a second one.
* **content cannot forge control tokens.** Text that comes from the caller (every string in the
  messages, keys and roles included, and in ``tools`` and ``documents``) reaches the template with the
  marks that open and close control tokens (``<``, ``>``, ``[``, ``]``) swapped for inert stand-ins
  (:mod:`chatcodec.injection`). Control tokens are matched in the render with the stand-ins in place, so
  whatever the template does with the text (concatenate, replace, lower-case, join parts), a control token
  in the ids has its marks written by the template itself; the stand-ins are then put back and encoded as
  plain text. A template that looks at those characters is rendered a second time with the caller's text
  as written, and its control tokens are compared with the first render's.
* **it is fast.** Those stretches are cached, so the turns a growing chat already had cost a lookup.

Masks and per-message spans are computed on first use (:mod:`chatcodec.masks`), or during
:meth:`Codec.encode` with ``return_assistant_tokens_mask=True``, so that a conversation the mask cannot be
found for fails there.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .exceptions import ChatcodecError, InputError, LimitError, LoadError, SpecialTokenError
from .history import Entry, History, copy_of
from .history import keys as history_keys
from .injection import Marks, Shield, culprit, reads_marks, stand_ins_in, template_variables_with_marks
from .polyfills import Polyfill
from .render import ChatTemplate
from .resuming import Memo
from .templates import load_template
from .vocab import (
    TOKEN_BYTES,
    Matching,
    Run,
    TextTokenizer,
    Tokenized,
    Vocabulary,
    alternation,
    common_prefix,
    swap,
    vocabulary,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from .conversation import Conversation
    from .masks import Growing, Layout

__all__ = ["Codec", "Encoding", "load"]

ContentPolicy = Literal["escape", "reject", "allow"]
_POLICIES = ("escape", "reject", "allow")
_log = logging.getLogger("chatcodec")


# --- loading -------------------------------------------------------------------------------------------


def load(
    source: str | Path,
    *,
    tokenizer: str | Path | Tokenizer | None = None,
    control_tokens: Iterable[str] | None = None,
) -> Codec:
    """Load a model folder (or ``tokenizer.json``'s folder, or a .gguf) as a :class:`Codec`.

    The template comes from :func:`chatcodec.load_template`; the tokenizer from ``tokenizer.json`` beside
    it, or from ``tokenizer`` (a path or a ``tokenizers.Tokenizer``). A .gguf gives a template only: its
    ``Codec.tokenizer`` is None unless ``tokenizer`` is given, and encoding says so.

    >>> import chatcodec.tokens as tokens
    >>> codec = tokens.load("../shared/tokenizers/qwen3")  # doctest: +SKIP
    >>> codec.encode([{"role": "user", "content": "Hi"}]).input_ids  # doctest: +SKIP
    [151644, 872, 198, 13048, 151645, 198]
    """
    path = Path(str(source)).expanduser()
    template = load_template(source)
    folder = path if path.is_dir() else path.parent if path.is_file() else None
    config: dict[str, Any] = {}
    if folder is not None and (folder / "tokenizer_config.json").is_file():
        try:
            config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LoadError(f"Cannot read {folder / 'tokenizer_config.json'}: {exc}.") from None

    backend: Tokenizer | None = None
    if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
        backend = tokenizer
    else:
        file = Path(tokenizer).expanduser() if tokenizer is not None else None
        if file is not None and file.is_dir():
            file = file / "tokenizer.json"
        if file is None and folder is not None and path.suffix != ".gguf":
            file = folder / "tokenizer.json"
            if not file.is_file():
                raise LoadError(
                    f"{folder} has no tokenizer.json, which chatcodec.load needs for tokens."
                    " Pass tokenizer=PATH, or use chatcodec.load_template for the template alone."
                )
        if file is not None:
            backend = _read_tokenizer(file)
            _add_config_tokens(backend, config)
    if control_tokens is None and "chat_control_tokens" in config:
        declared = config["chat_control_tokens"]
        if not isinstance(declared, list) or not all(isinstance(t, str) for t in declared):
            raise LoadError(
                f"{folder / 'tokenizer_config.json' if folder else 'tokenizer_config.json'}: chat_control_tokens must"
                f" be a list of token strings, not {json.dumps(declared)[:80]}."
            )
        control_tokens = declared
    return Codec(
        template,
        backend,
        control_tokens=control_tokens,
        split_special_tokens=bool(config.get("split_special_tokens", False)),
    )


def _read_tokenizer(file: Path) -> Tokenizer:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise LoadError("Tokenizing needs the tokenizers package: pip install 'chatcodec[tokens]'.") from None
    if not file.is_file():
        raise LoadError(f"No tokenizer at {file}.")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises a bare Exception for a malformed file
        raise LoadError(f"{file} is not a tokenizer.json the tokenizers library can read: {exc}.") from None


def _add_config_tokens(backend: Tokenizer, config: Mapping[str, Any]) -> None:
    """Add the tokens ``added_tokens_decoder`` declares and tokenizer.json lacks, as transformers does."""
    from tokenizers import AddedToken

    declared = config.get("added_tokens_decoder")
    if not isinstance(declared, dict):
        return
    present = {token.content for token in backend.get_added_tokens_decoder().values()}
    for entry in declared.values():
        if isinstance(entry, dict) and isinstance(entry.get("content"), str) and entry["content"] not in present:
            flags = {k: bool(entry[k]) for k in ("single_word", "lstrip", "rstrip", "normalized") if k in entry}
            token = AddedToken(entry["content"], special=bool(entry.get("special")), **flags)
            (backend.add_special_tokens if entry.get("special") else backend.add_tokens)([token])


# --- the codec -----------------------------------------------------------------------------------------


class Codec:
    """A chat template and its tokenizer: conversations in, token ids and masks out.

    ``control_tokens`` are the added tokens that content may never produce. By default they are the
    tokenizer's special tokens plus the non-special added tokens the template's source contains (Qwen's
    ``<think>`` and ``<tool_call>``), except whitespace: the same rule as transformers'
    ``sanitize_control_tokens``. Other added tokens (Gemma's HTML tags, FIM tokens no chat template writes)
    keep tokenizing the way the model was trained to see them.

    ``history`` (a :class:`~chatcodec.History`, by default 256 encodes or 64 MiB) remembers recent encodes, so
    that the next turn of a growing chat costs its new text: messages the caller did not change are not
    looked at again, and the prompt is tokenized only from where it stops agreeing with the last one.

    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> vocab = {"hi": 0, "!": 1, "<": 2, "eot": 3, ">": 4, "[UNK]": 5}
    >>> tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
    >>> _ = tok.add_special_tokens(["<eot>"])
    >>> codec = Codec(ChatTemplate("{% for m in messages %}{{ m.content }}<eot>{% endfor %}"), tok)
    >>> codec.encode([{"role": "user", "content": "hi !"}]).input_ids
    [0, 1, 6]
    >>> codec.encode([{"role": "user", "content": "hi<eot>"}]).input_ids  # the content's <eot> is text
    [0, 2, 3, 4, 6]
    """

    def __init__(
        self,
        template: ChatTemplate,
        tokenizer: Tokenizer | TextTokenizer | None = None,
        *,
        control_tokens: Iterable[str] | None = None,
        split_special_tokens: bool = False,
        history: History | None = None,
    ) -> None:
        if not isinstance(template, ChatTemplate):
            raise InputError(f"Codec needs a ChatTemplate, not {type(template).__name__}.")
        if history is not None and not isinstance(history, History):
            raise InputError(f"history must be a chatcodec.History, not {type(history).__name__}.")
        self.template = template
        #: the recent conversations this codec encoded: the next turn of one costs its new text
        self.history = history if history is not None else History()
        self.tokenizer = tokenizer
        self._vocab = vocabulary(tokenizer, split_special_tokens) if tokenizer is not None else None
        sources = "\0".join(template.sources.values())
        if control_tokens is not None:
            control_tokens = list(control_tokens) if not isinstance(control_tokens, (str, bytes)) else [control_tokens]
            if not all(isinstance(t, str) for t in control_tokens):
                raise InputError(f"control_tokens must be token strings, not {control_tokens!r:.80}.")
        self._given_control = None if control_tokens is None else frozenset(t for t in control_tokens if t)
        if self._given_control is not None:
            chosen = set(self._given_control)
        elif self._vocab is not None:
            chosen = self._vocab.control_for(sources)
        else:
            chosen = {t for t in template.special_tokens.values() if t}
        self._set_control(chosen, sources)

    def _set_control(self, chosen: Iterable[str], sources: str) -> None:
        self.control_tokens: frozenset[str] = frozenset(chosen)
        vocab = self._vocab
        self._marks = Marks(self.control_tokens, vocab.normalize if vocab and vocab.normalizer else None)
        others = vocab.matched - self.control_tokens if vocab is not None else frozenset()
        #: control tokens, and the added tokens content may still produce (as the model was trained to see them)
        self._matching = Matching(self._marks.tokens, re.compile(alternation(others)) if others else None)
        specials = "\0".join(self.template.special_tokens.values())
        self._reserved = frozenset(stand_ins_in(sources + "\0" + specials))
        self._sources = tuple(self.template.sources.values())
        self._tags: bool | None = None  # whether {% generation %} blocks decide the mask (_tagged, found once)
        self._marked_variables = frozenset(template_variables_with_marks(self.template.special_tokens, self._marks))

    def __repr__(self) -> str:
        backend = (
            "no tokenizer" if self.tokenizer is None else f"{len(self._vocab.added) if self._vocab else 0} added tokens"
        )
        return f"<Codec {self.template.name or 'unnamed'!r}, {backend}>"

    def encode(
        self,
        messages: Sequence[Any],
        *,
        tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        now: datetime | None = None,
        content_special_tokens: ContentPolicy = "escape",
        add_special_tokens: bool = False,
        return_assistant_tokens_mask: bool = False,
        chat_template: str | None = None,
        polyfill: Polyfill = False,
        **template_kwargs: Any,
    ) -> Encoding:
        """Render ``messages`` and tokenize the prompt.

        ``polyfill`` is :meth:`ChatTemplate.render`'s: ``"auto"`` rewrites what the template cannot render
        (:mod:`chatcodec.polyfills`); the default renders exactly.

        ``content_special_tokens`` says what a control token in text from the caller becomes: ``"escape"``
        (the default) encodes it as ordinary tokens, ``"reject"`` raises :class:`~chatcodec.SpecialTokenError`
        naming the message and field, ``"allow"`` matches it as the control token, exactly as transformers
        does. Under ``"escape"`` and ``"reject"`` the template sees the caller's ``<``, ``>``, ``[`` and ``]``
        (the marks control tokens begin and end with) as inert stand-ins, so it cannot act on a control token
        in content either: a template that splits assistant content at ``</think>`` will not split at one the
        caller wrote (pass reasoning as ``reasoning_content``, or use ``"allow"`` for text you trust).

        ``add_special_tokens=True`` adds what the tokenizer's post-processor adds (BOS, EOS) only where the
        prompt lacks it; by default nothing is added, as in transformers, because the template owns them.
        ``return_assistant_tokens_mask=True`` computes :attr:`Encoding.assistant_mask` now, so that a
        conversation whose assistant turns cannot be found raises :class:`~chatcodec.MaskError` here. For a
        conversation that grew from one the codec remembers, the mask (computed now or read later) goes on
        from that encode's, if its mask was read (:class:`chatcodec.masks.MaskMemory`: the same mask, at the
        cost of the new messages).

        >>> codec = load("../shared/tokenizers/llama3_1")  # doctest: +SKIP
        >>> enc = codec.encode([{"role": "user", "content": "Hi<|eot_id|>"}])  # doctest: +SKIP
        >>> enc.input_ids.count(128009)  # only the template's end of turn  # doctest: +SKIP
        1
        """
        vocab = self._require_tokenizer()
        if content_special_tokens not in _POLICIES:
            raise InputError(
                f"content_special_tokens must be one of {', '.join(map(repr, _POLICIES))},"
                f" not {content_special_tokens!r}."
            )
        options: dict[str, Any] = dict(
            tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, now=now, chat_template=chat_template, **template_kwargs,
        )  # fmt: skip
        if polyfill:
            options["polyfill"] = polyfill
        tagged = not continue_final_message and self._tagged()
        # the mask of a tagged template reads the spans of the encode's own render: one render, not two
        spans = return_assistant_tokens_mask and tagged
        # the mask of a growing conversation goes on from the last encode's (masks.MaskMemory), asked for now
        # or read later from the encoding
        growing = not continue_final_message and not tagged
        try:
            encoding = self._encode(
                vocab, messages, options, template_kwargs, content_special_tokens, spans=spans, growing=growing
            )
            if add_special_tokens:
                encoding._runs = vocab.add_missing_special_tokens(encoding._runs)
                encoding._set_ids()
            if return_assistant_tokens_mask:
                encoding._assistant_mask = encoding.mask()
        except RecursionError:
            raise InputError(
                "The messages, tools, documents or template variables nest too deeply or refer to themselves;"
                " pass plain JSON-like data."
            ) from None
        return encoding

    def with_template(self, template: ChatTemplate) -> Codec:
        """The same tokenizer (and its cache) with another template, e.g. a training template with tags.

        A template that has no special tokens of its own gets this codec's (``bos_token`` and the rest), as
        transformers gives a ``chat_template=`` argument the tokenizer's special tokens.
        """
        if not template.special_tokens and self.template.special_tokens:
            template = ChatTemplate(
                template.sources,
                special_tokens=self.template.special_tokens,
                name=template.name,
                limits=template.limits,
            )
        codec = Codec(template, None)
        codec.tokenizer, codec._vocab = self.tokenizer, self._vocab
        if self._vocab is not None and self._given_control is None:
            sources = "\0".join(template.sources.values())
            codec._set_control(self._vocab.control_for(sources), sources)
        else:
            codec._set_control(self.control_tokens, "\0".join(template.sources.values()))
        codec._given_control = self._given_control
        return codec

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids``, as the tokenizer decodes it."""
        return self._require_tokenizer().decode(ids, skip_special_tokens=skip_special_tokens)

    def conversation(
        self,
        messages: Sequence[Any] = (),
        *,
        tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        mode: Literal["extend", "template"] = "extend",
        **variables: Any,
    ) -> Conversation:
        """An append-only conversation, token in and token out, for RL and agent rollouts.

        :meth:`encode` looks at the whole history at every turn; a :class:`~chatcodec.Conversation` hands
        back only the ids each turn adds, keeps the model's sampled ids as they were sampled, and costs the
        new turn. ``mode="extend"`` never rewrites what the model saw; ``mode="template"`` follows a fresh
        :meth:`encode` and says where it rewrote the prompt (:class:`~chatcodec.Reset`).
        See :mod:`chatcodec.conversation`.
        """
        from .conversation import Conversation

        return Conversation(self, messages, tools=tools, documents=documents, mode=mode, variables=variables)

    def vocabulary_size(self) -> int:
        """How many token ids the tokenizer has (added tokens included): every valid id is below it."""
        vocab = self._require_tokenizer()
        size = getattr(vocab.full, "n_vocab", None)  # a GGUF's tokenizer (a TextTokenizer)
        if size is None and hasattr(vocab.full, "get_vocab_size"):
            size = vocab.full.get_vocab_size(with_added_tokens=True)
        if size is None:
            size = max(vocab.added.values(), default=-1) + 1
        return int(size)

    def _shielded(
        self, messages: list[Any], options: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any], dict[str, str]]:
        """``messages`` and ``options`` with the caller's marks swapped for stand-ins, as :meth:`encode` renders
        them (policy ``"escape"``), and the map that puts the marks back: for rendering pieces of a prompt."""
        reserved = self._reserved
        variables = {k: v for k, v in options.items() if k not in ("tools", "documents")}
        if variables:
            reserved = reserved | stand_ins_in(variables)
        shield = Shield(self._marks, reserved, reject=False)
        shielded, tools, documents = shield.apply(messages, options.get("tools"), options.get("documents"))
        return list(shielded), {**options, "tools": tools, "documents": documents}, shield.restore

    def _piece(self, rendered: str, restore: dict[str, str]) -> Tokenized:
        """The tokens of a piece of a prompt rendered with stand-ins (:meth:`_shielded`), tokenized as the
        middle of a prompt: behind a control token, whose id is then dropped, so that a tokenizer that treats
        the start of its input specially (Metaspace's prepended space) does not. Control tokens only where
        the template wrote them, as in :meth:`encode`."""
        vocab = self._require_tokenizer()
        # only Metaspace's first-only prefix reads the start of the input: other tokenizers need no lead
        lead = min(self.control_tokens & vocab.added.keys(), default="") if vocab.start_sensitive else ""
        tokens = vocab.tokenize(lead + rendered, restore, self._matching)
        if tokens.escaped:
            vocab.check_escapes(tokens.runs, tokens.escaped, self.control_tokens)
        if not lead:
            return tokens
        if not tokens.runs or tokens.runs[0].ids != [vocab.added[lead]]:  # pragma: no cover - one run per token
            raise InputError(f"The tokenizer did not read {lead!r} as one token.")
        shift = len(lead)
        escaped = [(start - shift, end - shift) for start, end in tokens.escaped]
        return Tokenized(tokens.rendered[shift:], tokens.runs[1:], tokens.text[shift:], escaped, tokens.ids[1:])

    # --- internals ---------------------------------------------------------------------------------------

    def _require_tokenizer(self) -> Vocabulary:
        if self._vocab is None:
            raise LoadError(
                "This codec has a chat template but no tokenizer (a .gguf gives only its template)."
                " Load it with chatcodec.load(..., tokenizer='path/to/tokenizer.json')."
            )
        return self._vocab

    def _encode(
        self,
        vocab: Vocabulary,
        messages: Any,
        options: dict[str, Any],
        template_kwargs: dict[str, Any],
        policy: str,
        *,
        spans: bool = False,
        growing: bool = False,
    ) -> Encoding:
        """The encoding of ``messages``, resumed from the codec's memory of the conversation when it grew from
        an encode it remembers; ``growing`` asks for its mask to go on from that encode's too."""
        matching = self._matching
        history = self.history
        slots = history_keys(messages) if history.entries and type(messages) is list else []
        found = history.find(policy, messages, slots) if slots else None
        base, agreeing = found if found is not None else (None, 0)
        if policy == "allow":
            rendered, generation = self._render(messages, options, spans)
            previous = base.tokens if base is not None else None
            tokens = vocab.tokenize(rendered, None, matching, previous=previous, extends=_extends(base, agreeing))
            encoding = Encoding(self, tokens, (messages, options, rendered, {}, generation))
            self._remember(slots, base, agreeing, policy, messages, None, tokens)
            return encoding

        reserved = self._reserved
        if template_kwargs:
            reserved = reserved | stand_ins_in(template_kwargs)
        if base is not None and not spans:  # a conversation seen before, likely growing: resume its last render
            grown = self._encode_growing(vocab, messages, options, template_kwargs, policy, reserved, base, agreeing)
            if grown is not None:
                tokens, state, shield, copies, memo, hit, shielded = grown
                encoding = Encoding(self, tokens, state)
                entry = self._remember(slots, base, agreeing, policy, messages, shield, tokens, copies, memo, hit)
                # the mask goes on from the last one's marked copies of the messages with marks swapped, not of
                # the caller's text as written (a template that looks at marks, _compare)
                if growing and state[0] is shielded:
                    from .masks import Growing

                    keep = history.keeper(entry) if entry is not None else None
                    encoding._growing = Growing(base.mask, memo.trusted, keep)
                return encoding
        shield = Shield(self._marks, reserved, reject=policy == "reject", table=base.table if base else None)
        known = None
        if base is not None and agreeing:
            known = (agreeing, base.marked[: bisect.bisect_left(base.marked, agreeing)], False, False)
        shielded, tools, documents = shield.apply(
            messages,
            options["tools"],
            options["documents"],
            clean=known or (0, (), False, False),
            swapped=base.swapped if base else None,
        )
        if base is not None and shield.conflicts():  # the new text holds a stand-in the old one used: start over
            base, agreeing = None, 0
            shield = Shield(self._marks, reserved, reject=policy == "reject")
            shielded, tools, documents = shield.apply(messages, options["tools"], options["documents"])
        given = options
        if tools is not options["tools"] or documents is not options["documents"]:
            options = {**options, "tools": tools, "documents": documents}
        rendered, generation = self._render(shielded, options, spans)
        tokens, state = self._tokenize(
            vocab, shield, messages, given, options, (shielded, rendered, generation), base, agreeing, template_kwargs
        )
        encoding = Encoding(self, tokens, state)
        self._remember(slots, base, agreeing, policy, messages, shield, tokens)
        return encoding

    def _encode_growing(
        self,
        vocab: Vocabulary,
        messages: list[Any],
        options: dict[str, Any],
        template_kwargs: dict[str, Any],
        policy: str,
        reserved: frozenset[str],
        base: Entry,
        agreeing: int,
    ) -> tuple[Tokenized, Any, Shield, list[Any], Memo, list[int], list[Any]] | None:
        """Encode a conversation that extends ``base``: the template sees copies of the messages (its own, which
        nobody changes), the ones it saw the last time for the leading messages that strictly equal theirs,
        and its render resumes the last one (:mod:`chatcodec.resuming`). None when that cannot be done (a
        message that is not plain JSON, a stand-in the conversation now holds): then encode as usual. Last
        in the result: the messages, marks swapped, the render saw."""
        if not self.template.resumable:  # nothing to resume: the usual encode copies new messages only
            return None
        trusted = base.trusted(messages, agreeing) if base.copies is not None else 0
        fresh = []
        for message in messages[trusted:]:
            copied = copy_of(message)
            if copied is None:
                return None
            fresh.append(copied[0])
        seen: list[Any] = base.seen[:trusted] if trusted else []  # type: ignore[index]
        seen += fresh  # one copy of the history, not two (a slice, then a sum)
        shield = Shield(self._marks, reserved, reject=policy == "reject", table=base.table)
        shielded, tools, documents = shield.apply(
            seen, options["tools"], options["documents"], clean=(trusted, (), False, False)
        )
        if shield.conflicts():
            return None
        # what the messages kept from base hold: marks at these indices, these swapped through JSON
        hit = base.marked[: bisect.bisect_left(base.marked, trusted)] + sorted(i for g, i in shield.marked if g == 0)
        if base.copies is not None and trusted >= len(base.copies):
            shield.swapped.update(base.swapped)  # all of them (the usual growth)
        elif base.swapped:
            shield.swapped.update((i, pair) for i, pair in base.swapped.items() if i < trusted)
        given = options
        if tools is not options["tools"] or documents is not options["documents"]:
            options = {**options, "tools": tools, "documents": documents}
        memo = Memo(base.record if trusted else None, trusted)  # the shield kept the messages seen as they are
        try:
            rendered = self.template.render_resuming(memo, shielded, **options)
        except LimitError:
            raise  # a render over its budget: the usual encode's would be over it too, after spending it again
        except ChatcodecError:
            return None  # the usual encode renders the caller's own messages, and says what is wrong with them
        tokens, state = self._tokenize(
            vocab, shield, messages, given, options, (shielded, rendered, None), base, agreeing, template_kwargs
        )
        copies = (base.copies or [])[:trusted]
        copies += fresh
        return tokens, state, shield, copies, memo, hit, shielded

    def _tokenize(
        self,
        vocab: Vocabulary,
        shield: Shield,
        messages: Any,
        given: dict[str, Any],
        options: dict[str, Any],
        render: tuple[Any, str, list[tuple[int, int]] | None],
        base: Entry | None,
        agreeing: int,
        template_kwargs: dict[str, Any],
    ) -> tuple[Tokenized, Any]:
        """The tokens of a render with stand-ins (``render``: the messages it saw, its text and generation
        spans), checked, and the encoding's state: control tokens only where the template wrote them,
        whatever it did with the caller's marks. The tokens go on from ``base``'s, whose messages agree with
        these for ``agreeing`` of them."""
        shielded, rendered, generation = render
        restore = shield.restore
        previous = base.tokens if base is not None else None
        tokens = vocab.tokenize(rendered, restore, self._matching, previous=previous, extends=_extends(base, agreeing))
        state = (shielded, options, rendered, restore, generation)
        if restore:
            if tokens.escaped and shield.reject:
                raise self._formed(tokens.text[tokens.escaped[0][0] : tokens.escaped[0][1]], shield)
            why = reads_marks(self._sources, self._marks, self._variables_with_marks(template_kwargs))
            if why is not None:
                compared = self._compare(vocab, shield, messages, given, tokens, why)
                if compared is not None:
                    return compared
            if tokens.escaped:
                vocab.check_escapes(tokens.runs, tokens.escaped, self.control_tokens)
        return tokens, state

    def _render(self, messages: Any, options: dict[str, Any], spans: bool) -> tuple[str, list[tuple[int, int]] | None]:
        """The prompt, and the spans of its ``{% generation %}`` blocks when ``spans`` is set (else None)."""
        if not spans:
            return self.template.render(messages, **options), None
        options = {k: v for k, v in options.items() if k != "continue_final_message"}
        return self.template.render_spans(messages, **options)

    def _tagged(self) -> bool:
        if self._tags is None:
            from .masks import has_generation_tags

            self._tags = has_generation_tags(self._sources)
        return self._tags

    def _remember(
        self,
        slots: list[Hashable],
        base: Entry | None,
        agreeing: int,
        policy: str,
        messages: Any,
        shield: Shield | None,
        tokens: Tokenized,
        copies: list[Any] | None = None,
        memo: Memo | None = None,
        hit: list[int] | None = None,
    ) -> Entry | None:
        """Keep what the next encode of this conversation can start from (plain JSON messages only), and return
        it; a growing encode gives its copies, memo and the indices of the messages that hold marks (``hit``).

        Called once the :class:`Encoding` has copied the ids: from here on another thread's encode that extends
        ``tokens`` may take their lists over and cut them back (:meth:`Tokenized.take`)."""
        if not slots:
            return None
        if hit is None:
            marked = shield.marked if shield is not None else []
            if any(group == 0 and index < 0 for group, index in marked):
                return None  # taken apart by the walk: nothing is known per message
            hit = sorted(index for group, index in marked if group == 0)
        size = 0
        if copies is None and base is not None:  # seen before: a conversation that grows, worth copying its messages
            copies = base.copies[:agreeing] if base.copies is not None else []
            for index in range(len(copies), len(messages)):
                copied = copy_of(messages[index])
                if copied is None:
                    copies = None
                    break
                copies.append(copied[0])
                size += copied[1]
        swapped = dict(shield.swapped) if shield is not None else {}
        if memo is not None and base is not None and base.copies is not None and memo.trusted >= len(base.copies):
            # grown from base, with all its swapped messages: theirs are counted
            swapped_chars = base.swapped_chars + sum(len(swapped[i][0]) for i in swapped.keys() - base.swapped.keys())
        else:
            swapped_chars = sum(len(text) for text, _ in swapped.values())
        size += swapped_chars
        # the prompt, and each token's id and offsets (its run's, which the vocabulary's cache may share: counted
        # here too, since a stretch too big for that cache is held by this entry alone)
        size += 2 * len(tokens.rendered) + TOKEN_BYTES * len(tokens.ids) + 100 * len(tokens.runs)
        table = dict(shield.table) if shield is not None else {}
        if memo is not None and memo.record is not None and memo.messages is not None:
            # the copies and the messages seen hold about the text of the prompt each, the record its offsets
            size += 24 * len(memo.record.offsets) + 4 * len(tokens.rendered)
        entry = Entry(slots[0], policy, copies, hit, table, tokens, size, swapped)
        entry.swapped_chars = swapped_chars
        if memo is not None and memo.record is not None and memo.messages is not None and copies is not None:
            entry.keep_render(memo.messages, memo.record, base, memo.trusted)
        self.history.remember(entry, replacing=base if _extends(base, agreeing) else None)
        return entry

    def _variables_with_marks(self, template_kwargs: dict[str, Any]) -> frozenset[str]:
        if not template_kwargs:
            return self._marked_variables
        return self._marked_variables | frozenset(template_variables_with_marks(template_kwargs, self._marks))

    def _compare(
        self,
        vocab: Vocabulary,
        shield: Shield,
        messages: Any,
        options: dict[str, Any],
        tokens: Tokenized,
        why: str,
    ) -> tuple[Tokenized, Any] | None:
        """For a template that looks at marks: render the caller's text as written, and keep only the control
        tokens that the render with stand-ins has too (in order), or None when both renders agree."""
        given, tools, documents = shield.apply_tokens_only(messages, options["tools"], options["documents"])
        options = {**options, "tools": tools, "documents": documents}
        rendered = self.template.render(given, **options)
        restore = shield.restore
        if swap(rendered, restore) == tokens.text:
            return None
        matching = self._matching
        theirs = vocab.tokenize(rendered, restore, matching)
        extra = _unmatched(
            self._control_sequence(vocab, theirs.runs, theirs.text),
            self._control_sequence(vocab, tokens.runs, tokens.text),
            theirs.text,
            tokens.text,
        )
        name = self.template.name or "unnamed"
        if extra:
            if shield.reject:
                raise self._formed(extra[0][1], shield)
            _log.warning(
                "Template %r %s, so chatcodec rendered the conversation as written too; %d control token(s) that"
                " rendering put together from caller text are encoded as plain text: %s",
                name, why, len(extra), ", ".join(repr(t) for _, t in extra[:5]),
            )  # fmt: skip
            theirs = vocab.tokenize(rendered, restore, matching, dropped=frozenset(at for at, _ in extra))
        else:
            _log.info("Template %r %s; its render of the conversation as written has no extra control token", name, why)
        if theirs.escaped and shield.reject:
            raise self._formed(theirs.text[theirs.escaped[0][0] : theirs.escaped[0][1]], shield)
        return theirs, (given, options, rendered, restore, None)

    def _control_sequence(self, vocab: Vocabulary, runs: list[Run], text: str) -> list[tuple[int, int, str]]:
        """``(start, id, text)`` of every control token in the runs, in order."""
        control_ids = {vocab.added[t] for t in self.control_tokens if t in vocab.added}
        found = []
        for run in runs:
            if control_ids.intersection(run.ids):
                for token, (start, end) in zip(run.ids, run.offsets(), strict=True):
                    if token in control_ids:
                        found.append((start, token, text[start:end]))
        return found

    @staticmethod
    def _formed(token: str, shield: Shield) -> SpecialTokenError:
        return SpecialTokenError(
            f"{culprit(token, shield.suspects)} holds part of the control token {token!r}, which the template put"
            ' together from content. Content may not hold control tokens when content_special_tokens="reject";'
            ' "escape" encodes them as plain text.'
        )


def _extends(base: Entry | None, agreeing: int) -> bool:
    """Whether an encode whose messages agree with ``base``'s for ``agreeing`` of them extends it, and so
    replaces it in the memory (:meth:`History.remember`): all of its messages agree, or it kept none."""
    return base is not None and (base.copies is None or agreeing == len(base.copies))


def _unmatched(
    theirs: list[tuple[int, int, str]], ours: list[tuple[int, int, str]], their_text: str, our_text: str
) -> list[tuple[int, str]]:
    """The control tokens of one render (``theirs``) that the other (``ours``) does not have at the same place.

    Both texts agree up to their first difference and after their last: there, a token is matched by its
    position. In between, the two sequences of tokens are aligned (longest common subsequence).
    """
    import difflib  # here, not at import: only a template that looks at marks gets this far (2 ms)

    prefix = common_prefix(their_text, our_text)
    limit = min(len(their_text), len(our_text)) - prefix
    suffix = common_prefix(their_text[::-1], our_text[::-1], limit)
    shift = len(our_text) - len(their_text)
    their_tail, our_tail = len(their_text) - suffix, len(our_text) - suffix
    placed = {(start, token) for start, token, _ in ours}
    extra: list[tuple[int, str]] = []
    middle = []
    for start, token, written in theirs:
        if start + len(written) <= prefix:
            if (start, token) not in placed:
                extra.append((start, written))
        elif start >= their_tail:
            if (start + shift, token) not in placed:
                extra.append((start, written))
        else:
            middle.append((start, token, written))
    rest = [token for start, token, written in ours if start + len(written) > prefix and start < our_tail]
    matcher = difflib.SequenceMatcher(None, [token for _, token, _ in middle], rest, autojunk=False)
    kept = {i for a, _, size in matcher.get_matching_blocks() for i in range(a, a + size)}
    extra.extend((start, written) for i, (start, _, written) in enumerate(middle) if i not in kept)
    return sorted(extra)


# --- the encoding --------------------------------------------------------------------------------------


class Encoding:
    """The tokens of one rendered conversation.

    ``input_ids`` and ``text`` are computed by :meth:`Codec.encode`; ``attention_mask``, ``offsets``,
    ``assistant_mask``, ``message_spans`` and ``message_token_counts`` are worked out the first time they
    are read, so inference pays only for ids (``return_assistant_tokens_mask=True`` computes the mask in
    :meth:`Codec.encode` instead, where its errors belong).
    """

    def __init__(
        self,
        codec: Codec,
        tokens: Tokenized,
        render_state: tuple[Any, dict[str, Any], str, dict[str, str], list[tuple[int, int]] | None],
    ) -> None:
        self.text = tokens.text
        self._runs = tokens.runs
        self.input_ids: list[int] = list(tokens.ids)  # the codec's history keeps the original
        self._attention_mask: list[int] | None = None  # made when first read, as long as the ids are now
        self._count = len(self.input_ids)
        #: character spans of ``text`` that read as a control token but hold text from the caller, and so
        #: were encoded as plain text
        self.escaped = list(tokens.escaped)
        self._codec = codec
        self._render_state = render_state
        self._offsets: list[tuple[int, int]] | None = None
        self._layout: Layout | None = None
        self._assistant_mask: list[int] | None = None
        #: what the mask goes on from, when the conversation grew from one the codec remembers (until read)
        self._growing: Growing | None = None

    def _set_ids(self) -> None:
        self.input_ids = [i for run in self._runs for i in run.ids]
        self._attention_mask, self._count = None, len(self.input_ids)

    @property
    def attention_mask(self) -> list[int]:
        """1 for every token (one conversation has no padding), made when first read."""
        if self._attention_mask is None:
            self._attention_mask = [1] * self._count
        return self._attention_mask

    @attention_mask.setter
    def attention_mask(self, value: list[int]) -> None:
        self._attention_mask = value

    def __len__(self) -> int:
        return len(self.input_ids)

    def __repr__(self) -> str:
        return f"<Encoding {len(self.input_ids)} tokens, {len(self.text)} characters>"

    @property
    def offsets(self) -> list[tuple[int, int]]:
        """Each token's ``(start, end)`` character span in :attr:`text`; ``(0, 0)`` for tokens added to it."""
        if self._offsets is None:
            self._offsets = [span for run in self._runs for span in run.offsets()]
        return self._offsets

    @property
    def tokens(self) -> list[str]:
        """Each token's text, cut from :attr:`text` (empty for tokens added to it)."""
        return [self.text[s:e] for s, e in self.offsets]

    @property
    def assistant_mask(self) -> list[int]:
        """1 for every token the model must learn to produce: :meth:`mask` with its defaults."""
        if self._assistant_mask is None:
            self._assistant_mask = self.mask()
        return self._assistant_mask

    def mask(self, *, reasoning: bool = True, end_of_turn: bool = True) -> list[int]:
        """The assistant mask, choosing whether reasoning and each turn's end-of-turn token are included.

        Templates with ``{% generation %}`` blocks give transformers' ``return_assistant_tokens_mask``
        (their tags decide, so the options do not apply). For the others the turns are found by rendering
        with marked content (:mod:`chatcodec.masks`). Raises :class:`~chatcodec.MaskError` when the
        conversation has assistant turns and none of their tokens is found.
        """
        from . import masks

        return masks.assistant_mask(self, self._get_layout(), reasoning=reasoning, end_of_turn=end_of_turn)

    @property
    def message_spans(self) -> list[tuple[int, int]]:
        """``(start, end)`` token ranges, one per message; empty where the template dropped a message."""
        from . import masks

        return masks.message_token_spans(self, self._get_layout())

    @property
    def message_token_counts(self) -> list[int]:
        """How many tokens each message takes (see :attr:`message_spans`)."""
        return [end - start for start, end in self.message_spans]

    def _get_layout(self) -> Layout:
        if self._layout is None:
            from . import masks

            messages, options, rendered, escapes, spans = self._render_state
            growing, self._growing = self._growing, None
            self._layout = masks.layout(self._codec, messages, options, rendered, escapes, self.text, spans, growing)
        return self._layout
