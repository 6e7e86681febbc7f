"""A drop-in for transformers' ``apply_chat_template``, and :func:`patch` to put it into a tokenizer.

:func:`apply_chat_template` takes the arguments of ``PreTrainedTokenizerBase.apply_chat_template``
(transformers 5.24; parity notes §2) and gives its results: the prompt text, the ids, or a dict with
``input_ids``, ``attention_mask`` and ``assistant_masks``, for one conversation or a batch. Two things
differ on purpose:

* **content cannot forge control tokens.** A control token inside content is encoded as plain text
  (``content_special_tokens="escape"``, the default); ``"allow"`` gives transformers' ids exactly.
  Without control tokens in content, the ids are the same either way.
* **masks for every template.** Where the template has no ``{% generation %}`` block, transformers
  returns an all-zero ``assistant_masks`` (and warns); here the assistant turns are found anyway
  (:meth:`chatcodec.Encoding.mask`). Templates with the block give transformers' masks exactly.

:func:`patch` makes a transformers tokenizer's own ``apply_chat_template`` this one, so a training
pipeline (TRL, axolotl, a ``datasets.map``) gets the safety and the masks with one line.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from .exceptions import InputError
from .render import ChatTemplate
from .tokens import Codec, ContentPolicy, Encoding, load

__all__ = ["apply_chat_template", "patch"]

Padding = bool | Literal["longest", "max_length", "do_not_pad"]
Truncation = bool | Literal["longest_first", "only_first", "only_second", "do_not_truncate"]

#: transformers' "no limit" model_max_length (``VERY_LARGE_INTEGER``): any value this large means none
_NO_LIMIT = int(1e20)


def apply_chat_template(
    tokenizer_or_codec: Any,
    conversation: Sequence[Any],
    tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    chat_template: str | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    tokenize: bool = True,
    sanitize_control_tokens: bool = False,
    padding: Padding = False,
    truncation: Truncation = False,
    max_length: int | None = None,
    return_tensors: str | None = None,
    return_dict: bool = True,
    return_assistant_tokens_mask: bool = False,
    tokenizer_kwargs: Mapping[str, Any] | None = None,
    *,
    content_special_tokens: ContentPolicy = "escape",
    **kwargs: Any,
) -> Any:
    """transformers' ``tokenizer.apply_chat_template(conversation, ...)``, done by chatcodec.

    ``tokenizer_or_codec`` is a :class:`~chatcodec.Codec`, a transformers tokenizer (one with a fast
    ``tokenizers`` backend), a model folder for :func:`chatcodec.load`, or a
    :class:`~chatcodec.ChatTemplate` (for ``tokenize=False`` only). The other arguments are
    transformers'; extra keyword arguments are template variables. ``sanitize_control_tokens`` is
    accepted for compatibility: control tokens in content are governed by ``content_special_tokens``
    (``"escape"`` by default; ``"reject"`` raises; ``"allow"`` is transformers' default behaviour).

    >>> import chatcodec
    >>> chat = [{"role": "user", "content": "Hi"}]
    >>> chatcodec.apply_chat_template(chatcodec.load_template("chatml"), chat, tokenize=False)
    '<|im_start|>user\\nHi<|im_end|>\\n'
    """
    if not tokenize:
        return_dict = False
    if return_assistant_tokens_mask and not (return_dict and tokenize):
        raise InputError("`return_assistant_tokens_mask=True` requires `return_dict=True` and `tokenize=True`")
    if tokenizer_kwargs:
        raise InputError(
            f"tokenizer_kwargs are not supported by chatcodec's apply_chat_template (got {sorted(tokenizer_kwargs)});"
            " use padding=, truncation= and max_length="
        )
    source, hf = _source(tokenizer_or_codec, tokenize)
    if isinstance(conversation, (list, tuple)) and not conversation:
        raise InputError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    batched = isinstance(conversation, (list, tuple)) and (
        isinstance(conversation[0], (list, tuple)) or hasattr(conversation[0], "messages")
    )
    conversations = list(conversation) if batched else [conversation]
    if continue_final_message:
        if add_generation_prompt:
            raise InputError(
                "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message "
                "when you want the model to continue the final message, and add_generation_prompt when you want "
                "to add a header that will prompt it to start a new assistant message instead."
            )
        if return_assistant_tokens_mask:
            raise InputError("continue_final_message is not compatible with return_assistant_tokens_mask.")
    options: dict[str, Any] = dict(
        tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message, **kwargs,
    )  # fmt: skip

    if not tokenize:
        template, key = _template(source, chat_template)
        texts = [template.render(chat, chat_template=key, **options) for chat in conversations]
        return texts if batched else texts[0]

    if not isinstance(source, Codec):
        raise InputError("A ChatTemplate has no tokenizer: pass tokenize=False, or a Codec (chatcodec.load).")
    codec, key = _codec_for(source, chat_template)
    encodings = [
        codec.encode(chat, content_special_tokens=content_special_tokens, chat_template=key, **options)
        for chat in conversations
    ]
    columns = _columns(encodings, masks=return_assistant_tokens_mask)
    limit = _max_length(hf, truncation, padding, max_length)
    if truncation not in (False, "do_not_truncate") and limit is not None:
        side = getattr(hf, "truncation_side", "right")
        columns = {k: [_truncate(row, limit, side) for row in rows] for k, rows in columns.items()}
    if padding not in (False, "do_not_pad"):
        columns = _pad(columns, codec, hf, "max_length" if padding == "max_length" else "longest", limit)
    if not return_dict:
        ids = columns["input_ids"]
        return _tensors(hf, {"input_ids": ids if batched else ids[0]}, return_tensors)["input_ids"]
    data = {k: rows if batched else rows[0] for k, rows in columns.items()}
    return _tensors(hf, data, return_tensors)


def patch(tokenizer: Any) -> Any:
    """Make ``tokenizer.apply_chat_template`` chatcodec's :func:`apply_chat_template`; returns the tokenizer.

    ``tokenizer`` is a transformers tokenizer with a fast backend. Every caller of its
    ``apply_chat_template`` (TRL's data preparation, axolotl, your own ``datasets.map``) then gets
    content that cannot forge control tokens and masks for any template, with transformers' return
    types (``BatchEncoding``, tensors with ``return_tensors``). Patching twice changes nothing.
    """
    if not callable(getattr(tokenizer, "apply_chat_template", None)) or not hasattr(tokenizer, "backend_tokenizer"):
        raise InputError(
            f"chatcodec.patch takes a transformers tokenizer with a fast (tokenizers) backend, not"
            f" {type(tokenizer).__name__}."
        )
    if not isinstance(tokenizer.__dict__.get("apply_chat_template"), _Patched):
        tokenizer.apply_chat_template = _Patched(tokenizer)
    return tokenizer


class _Patched:
    """The ``apply_chat_template`` a patched tokenizer carries (a class, so the tokenizer still pickles)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, conversation: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        return apply_chat_template(self.tokenizer, conversation, *args, **kwargs)


# --- where the template and the tokenizer come from ----------------------------------------------------


def _source(given: Any, tokenize: bool) -> tuple[Codec | ChatTemplate, Any]:
    """(a Codec, or a ChatTemplate when only text is asked for; the transformers tokenizer or None)."""
    if isinstance(given, (Codec, ChatTemplate)):
        return given, None
    if isinstance(given, (str, Path)):
        return load(given), None
    if hasattr(given, "backend_tokenizer") and hasattr(given, "special_tokens_map"):
        return (_codec_of_transformers(given) if tokenize else _template_of_transformers(given)), given
    raise InputError(
        "apply_chat_template takes a chatcodec Codec, a transformers tokenizer with a fast backend, a model"
        f" folder or a ChatTemplate, not {type(given).__name__}."
    )


class _Adapted:
    """What chatcodec made of one transformers tokenizer: a template per chat_template text, and one codec."""

    def __init__(self) -> None:
        self.templates: dict[Any, ChatTemplate] = {}
        self.codec: Codec | None = None
        self.codecs: dict[Any, Codec] = {}


#: a transformers tokenizer -> what chatcodec made of it (built on first use, dropped with the tokenizer)
_ADAPTED: weakref.WeakKeyDictionary[Any, _Adapted] = weakref.WeakKeyDictionary()


def _template_of_transformers(tokenizer: Any) -> ChatTemplate:
    """``tokenizer.chat_template`` (as it is now: it may be reassigned) as a ChatTemplate with its special tokens."""
    source = tokenizer.chat_template
    if source is None:
        raise InputError(
            "Cannot use chat template functions because tokenizer.chat_template is not set and no template"
            " argument was passed!"
        )
    adapted = _ADAPTED.setdefault(tokenizer, _Adapted())
    key = source if isinstance(source, str) else tuple(sorted(source.items()))
    template = adapted.templates.get(key)
    if template is None:
        if len(adapted.templates) > _VARIANTS_KEPT:
            adapted.templates.clear()
        special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        name = getattr(tokenizer, "name_or_path", None)
        template = ChatTemplate(source, special_tokens=special, name=Path(name).name if name else None)
        adapted.templates[key] = template
    return template


def _codec_of_transformers(tokenizer: Any) -> Codec:
    """A Codec over a copy of ``tokenizer``'s backend (built once) with its current chat template."""
    template = _template_of_transformers(tokenizer)
    adapted = _ADAPTED[tokenizer]
    if adapted.codec is None:
        from tokenizers import Tokenizer

        # a copy: transformers turns padding and truncation on and off on its own backend between calls
        backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        backend.no_padding()
        backend.no_truncation()
        control = getattr(tokenizer, "chat_control_tokens", None)
        adapted.codec = Codec(
            template,
            backend,
            control_tokens=control if isinstance(control, (list, tuple)) else None,
            split_special_tokens=bool(getattr(tokenizer, "split_special_tokens", False)),
        )
    if template is adapted.codec.template:
        return adapted.codec
    codec = adapted.codecs.get(id(template))
    if codec is None or codec.template is not template:
        if len(adapted.codecs) > _VARIANTS_KEPT:
            adapted.codecs.clear()
        codec = adapted.codecs[id(template)] = adapted.codec.with_template(template)
    return codec


def _template(source: Codec | ChatTemplate, chat_template: str | None) -> tuple[ChatTemplate, str | None]:
    """The template to render with and the name of the one to pick in it (transformers §3.3)."""
    template = source.template if isinstance(source, Codec) else source
    if chat_template is None:
        return template, None
    if len(template.sources) > 1 and chat_template in template.sources:
        return template, chat_template
    return _variant(template, chat_template), None  # anything else is template text, as in transformers


def _codec_for(codec: Codec, chat_template: str | None) -> tuple[Codec, str | None]:
    template, key = _template(codec, chat_template)
    if template is codec.template:
        return codec, key
    known = _CODEC_VARIANTS.setdefault(codec, {})
    if len(known) > _VARIANTS_KEPT:
        known.clear()
    if template.source not in known:
        known[template.source] = codec.with_template(template)
    return known[template.source], key


#: templates given as text (``chat_template=SOURCE``), compiled once per base template, and their codecs
_VARIANTS: weakref.WeakKeyDictionary[ChatTemplate, dict[str, ChatTemplate]] = weakref.WeakKeyDictionary()
_CODEC_VARIANTS: weakref.WeakKeyDictionary[Codec, dict[str, Codec]] = weakref.WeakKeyDictionary()
_VARIANTS_KEPT = 32


def _variant(base: ChatTemplate, source: str) -> ChatTemplate:
    """``source`` as a template with ``base``'s special tokens and limits."""
    known = _VARIANTS.setdefault(base, {})
    if len(known) > _VARIANTS_KEPT:
        known.clear()
    if source not in known:
        known[source] = ChatTemplate(source, special_tokens=base.special_tokens, name=base.name, limits=base.limits)
    return known[source]


# --- the columns transformers returns ------------------------------------------------------------------


def _columns(encodings: list[Encoding], *, masks: bool) -> dict[str, list[list[int]]]:
    columns = {
        "input_ids": [enc.input_ids for enc in encodings],
        "attention_mask": [enc.attention_mask for enc in encodings],
    }
    if masks:
        columns["assistant_masks"] = [enc.mask() for enc in encodings]
    return columns


def _max_length(hf: Any, truncation: Truncation, padding: Padding, max_length: int | None) -> int | None:
    if max_length is not None:
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
            raise InputError(f"max_length must be a positive integer, not {max_length!r}")
        return max_length
    model_max = getattr(hf, "model_max_length", None)
    if isinstance(model_max, int) and model_max < _NO_LIMIT:
        return model_max
    return None


def _truncate(row: list[int], limit: int, side: str) -> list[int]:
    if len(row) <= limit:
        return row
    return row[len(row) - limit :] if side == "left" else row[:limit]


def _pad(
    columns: dict[str, list[list[int]]], codec: Codec, hf: Any, strategy: str, limit: int | None
) -> dict[str, list[list[int]]]:
    if strategy == "max_length" and limit is None:
        return columns  # no length to pad to: transformers does not pad either
    pad_id = _pad_id(codec, hf)  # asked for even when no row is short, as transformers does
    width = limit if strategy == "max_length" and limit is not None else max(map(len, columns["input_ids"]))
    if all(len(row) == width for row in columns["input_ids"]):
        return columns
    left = getattr(hf, "padding_side", "right") == "left"
    padded = {}
    for key, rows in columns.items():
        fill = pad_id if key == "input_ids" else 0
        padded[key] = [
            ([fill] * (width - len(row)) + row if left else row + [fill] * (width - len(row)))
            if len(row) < width
            else row
            for row in rows
        ]
    return padded


def _pad_id(codec: Codec, hf: Any) -> int:
    if hf is not None:
        pad_id = hf.pad_token_id
    else:
        token = codec.template.special_tokens.get("pad_token")
        pad_id = codec.tokenizer.token_to_id(token) if token and codec.tokenizer is not None else None
    if not isinstance(pad_id, int):
        raise InputError(
            "Asking to pad but the tokenizer does not have a padding token. Please select a token to use as"
            " `pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)` or pass padding=False."
        )
    return pad_id


def _tensors(hf: Any, data: dict[str, Any], return_tensors: str | None) -> Any:
    """transformers' ``BatchEncoding`` (with tensors if asked) for a transformers tokenizer; else a dict."""
    if hf is not None:
        module = sys.modules.get(type(hf).__module__.split(".")[0])
        batch_encoding = getattr(module, "BatchEncoding", None)
        if batch_encoding is not None:
            return batch_encoding(data, tensor_type=return_tensors)
    if return_tensors is not None:
        raise InputError(
            "return_tensors needs a transformers tokenizer (pass one, or chatcodec.patch it); with a chatcodec"
            " Codec the result is lists"
        )
    return data
