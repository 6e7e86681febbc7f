"""Codec: chat messages to token ids, with no double BOS, no special-token injection, and assistant masks.

A :class:`Codec` is a :class:`~chatcodec.ChatTemplate` plus a tokenizer from the ``tokenizers`` library
(never transformers). :meth:`Codec.encode` renders the conversation and tokenizes the prompt so that:

* **ids match transformers.** The template owns BOS and EOS: the prompt is tokenized with
  ``add_special_tokens=False``, as ``apply_chat_template(tokenize=True)`` does (parity notes §2.10), so a
  template that writes BOS never gets a second one.
* **content cannot forge control tokens.** Text that comes from the caller (every string in the
  messages but their ``role``, and in ``tools`` and ``documents``) is tokenized as plain text, while the
  template's own text still gets its special tokens. Each control-token occurrence in content is swapped
  for an inert private-use character before rendering; the template text is then split at its real
  control tokens, and each stretch of text between them is encoded by the model alone, with the
  original token text put back (:class:`Vocabulary`).
* **it is fast.** Those stretches are cached, so the turns a growing chat already had cost a lookup.

Masks and per-message spans are computed on first use (:mod:`chatcodec.masks`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .exceptions import InputError, LoadError, SpecialTokenError
from .polyfills import Polyfill
from .render import ChatTemplate, plain
from .templates import load_template
from .vocab import Run, Vocabulary, alternation

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from .masks import Layout

__all__ = ["Codec", "Encoding", "load"]

ContentPolicy = Literal["escape", "reject", "allow"]
_POLICIES = ("escape", "reject", "allow")

#: escapes use plane-16 private-use characters; the masks use plane 15 (see chatcodec.masks)
_ESCAPE_FIRST, _ESCAPE_LAST = 0x100000, 0x10FFFD
_ESCAPE_RANGE = "[\U00100000-\U0010fffd]"


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
    if control_tokens is None and isinstance(config.get("chat_control_tokens"), list):
        control_tokens = config["chat_control_tokens"]
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
        tokenizer: Tokenizer | None = None,
        *,
        control_tokens: Iterable[str] | None = None,
        split_special_tokens: bool = False,
    ) -> None:
        if not isinstance(template, ChatTemplate):
            raise InputError(f"Codec needs a ChatTemplate, not {type(template).__name__}.")
        self.template = template
        self.tokenizer = tokenizer
        self._vocab = Vocabulary(tokenizer, split_special_tokens) if tokenizer is not None else None
        sources = "\0".join(template.sources.values())
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
        # one pass finds control tokens and the private-use characters escapes must not collide with
        self._scanner = re.compile(f"{alternation(self.control_tokens)}|{_ESCAPE_RANGE}")
        self._reserved = set(re.findall(_ESCAPE_RANGE, sources))

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
        chat_template: str | None = None,
        polyfill: Polyfill = False,
        **template_kwargs: Any,
    ) -> Encoding:
        """Render ``messages`` and tokenize the prompt.

        ``polyfill`` is :meth:`ChatTemplate.render`'s: ``"auto"`` rewrites what the template cannot render
        (:mod:`chatcodec.polyfills`); the default renders exactly.

        ``content_special_tokens`` says what a control token inside content becomes: ``"escape"`` (the
        default) encodes its text as ordinary tokens, ``"reject"`` raises :class:`~chatcodec.SpecialTokenError`,
        ``"allow"`` matches it as the control token, exactly as transformers does. Under ``"escape"`` the
        template sees an inert stand-in for the token, so it cannot act on it either: a template that splits
        assistant content at ``</think>`` will not split at an escaped one (pass reasoning as
        ``reasoning_content``, or use ``"allow"`` for text you trust).

        ``add_special_tokens=True`` adds what the tokenizer's post-processor adds (BOS, EOS) only where the
        prompt lacks it; by default nothing is added, as in transformers, because the template owns them.

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
        escapes: dict[str, str] = {}
        if content_special_tokens != "allow":
            messages, tools, documents, escapes = self._escape(
                messages, tools, documents, reject=content_special_tokens == "reject"
            )
        options: dict[str, Any] = dict(
            tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, now=now, chat_template=chat_template, **template_kwargs,
        )  # fmt: skip
        if polyfill:
            options["polyfill"] = polyfill
        rendered = self.template.render(messages, **options)
        runs, text, escaped = vocab.tokenize(rendered, escapes)
        if escaped:
            vocab.check_escapes(runs, escaped, self.control_tokens)
        if add_special_tokens:
            runs = vocab.add_missing_special_tokens(runs)
        return Encoding(self, text, runs, escaped, (messages, options, rendered, escapes))

    def with_template(self, template: ChatTemplate) -> Codec:
        """The same tokenizer (and its cache) with another template, e.g. a training template with tags."""
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
        return self._require_tokenizer().full.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # --- internals ---------------------------------------------------------------------------------------

    def _require_tokenizer(self) -> Vocabulary:
        if self._vocab is None:
            raise LoadError(
                "This codec has a chat template but no tokenizer (a .gguf gives only its template)."
                " Load it with chatcodec.load(..., tokenizer='path/to/tokenizer.json')."
            )
        return self._vocab

    def _escape(
        self, messages: Any, tools: Any, documents: Any, *, reject: bool, reserved: set[str] | None = None
    ) -> tuple[Any, Any, Any, dict[str, str]]:
        """Swap every control token in caller-supplied text for a private-use stand-in (or reject it).

        Everything in a message but its ``role`` counts as content, and so do tools and documents; the
        template's own variables (``template_kwargs``) do not. Unchanged values are passed on as they are.
        """
        escaper = _Escaper(self._scanner, self.control_tokens, reserved or self._reserved, reject=reject)
        given = messages, tools, documents
        messages = getattr(messages, "messages", messages)
        if isinstance(messages, (list, tuple)):
            escaped_messages = []
            for i, message in enumerate(messages):
                if not isinstance(message, dict):
                    message = plain(message)
                if isinstance(message, dict):
                    owner = f"message {i} ({message.get('role')})"
                    new = {k: v if k == "role" else escaper.walk(v, owner, (k,)) for k, v in message.items()}
                    message = message if all(new[k] is message[k] for k in message) else new
                escaped_messages.append(message)
            messages = escaped_messages
        if isinstance(tools, (list, tuple)):
            tools = [escaper.walk(t, f"tool {i}", ()) if isinstance(t, dict) else t for i, t in enumerate(tools)]
        if isinstance(documents, (list, tuple)):
            documents = [escaper.walk(d, f"document {i}", ()) for i, d in enumerate(documents)]
        if escaper.reserved.intersection(escaper.stand_ins.values()):
            # a stand-in was handed out before a later string showed that character in use: start again
            return self._escape(*given, reject=reject, reserved=escaper.reserved)
        return messages, tools, documents, {char: token for token, char in escaper.stand_ins.items()}


class _Escaper:
    """Walks caller data, replacing control tokens in strings by private-use stand-ins (or rejecting them)."""

    def __init__(self, scanner: re.Pattern[str], control: frozenset[str], reserved: set[str], *, reject: bool) -> None:
        self.scanner = scanner
        self.control = control
        self.reserved = set(reserved)
        self.reject = reject
        self.stand_ins: dict[str, str] = {}
        self._next = _ESCAPE_FIRST

    def walk(self, value: Any, owner: str, path: tuple[Any, ...]) -> Any:
        """``value`` with control tokens escaped; the very same object when there was nothing to escape."""
        kind = type(value)
        if kind is str:
            return self._string(value, owner, path)
        if kind is dict:
            changed = None
            for key, item in value.items():
                new = self.walk(item, owner, (*path, key))
                if new is not item:
                    changed = changed or dict(value)
                    changed[key] = new
            return value if changed is None else changed
        if kind is list or kind is tuple:
            items = [self.walk(item, owner, (*path, i)) for i, item in enumerate(value)]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        if kind in (int, float, bool, type(None)):
            return value
        return self.walk(plain(value), owner, path)

    def _string(self, text: str, owner: str, path: tuple[Any, ...]) -> str:
        hits = self.scanner.findall(text)
        if not hits:
            return text
        tokens = [h for h in hits if h in self.control]
        self.reserved.update(h for h in hits if h not in self.control)
        if not tokens:
            return text
        if self.reject:
            field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
            raise SpecialTokenError(
                f"{owner}{' ' + field if field else ''} contains the control token {tokens[0]!r}. Content may not"
                ' hold control tokens when content_special_tokens="reject"; "escape" encodes them as plain text.'
            )
        for token in tokens:
            if token not in self.stand_ins:
                self.stand_ins[token] = self._allocate()
        return self.scanner.sub(lambda m: self.stand_ins.get(m.group(), m.group()), text)

    def _allocate(self) -> str:
        while self._next <= _ESCAPE_LAST and chr(self._next) in self.reserved:
            self._next += 1
        if self._next > _ESCAPE_LAST:
            raise InputError("The conversation uses every private-use character chatcodec could escape with.")
        char = chr(self._next)
        self._next += 1
        return char


# --- the encoding --------------------------------------------------------------------------------------


class Encoding:
    """The tokens of one rendered conversation.

    ``input_ids``, ``attention_mask`` and ``text`` are computed by :meth:`Codec.encode`; ``offsets``,
    ``assistant_mask``, ``message_spans`` and ``message_token_counts`` are worked out the first time they
    are read, so inference pays only for ids.
    """

    def __init__(
        self,
        codec: Codec,
        text: str,
        runs: list[Run],
        escaped: list[tuple[int, int]],
        render_state: tuple[Any, dict[str, Any], str, dict[str, str]],
    ) -> None:
        self.text = text
        self._runs = runs
        self.input_ids: list[int] = [i for run in runs for i in run.ids]
        self.attention_mask: list[int] = [1] * len(self.input_ids)
        #: character spans of ``text`` that came from content and were encoded as plain text
        self.escaped = escaped
        self._codec = codec
        self._render_state = render_state
        self._offsets: list[tuple[int, int]] | None = None
        self._layout: Layout | None = None

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
        return self.mask()

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

            messages, options, rendered, escapes = self._render_state
            self._layout = masks.layout(self._codec, messages, options, rendered, escapes, self.text)
        return self._layout
