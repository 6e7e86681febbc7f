"""The formatting function: one dataset row in, token ids and a training mask out (or the reason it can't be).

:class:`Formatter` is what every engine runs, row by row, and it is also a function for Hugging Face
``datasets.Dataset.map(batched=True, num_proc=N)``: it pickles as its settings (the tokenizer folder, the
template and the options) and loads the codec again in each process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from .. import polyfills
from ..capabilities import Capabilities
from ..exceptions import (
    ChatcodecError,
    InputError,
    LoadError,
    MaskError,
    SpecialTokenError,
    TemplateError,
)
from ..history import History
from ..polyfills import Polyfill
from ..render import ChatTemplate
from ..templates import load_template
from ..tokens import Codec, ContentPolicy, load
from .rows import RowError, _list_or_json, to_conversation

__all__ = ["REASONS", "FormatOptions", "Formatted", "Formatter", "Overlong", "Rejected"]

Overlong = Literal["drop", "truncate", "keep"]

#: why a row can be rejected, each with what it means
REASONS: dict[str, str] = {
    "bad_row": "the row is not a conversation: missing fields, unknown roles, wrong types",
    "template_error": "the template failed or refused the conversation",
    "control_token": 'a control token in the content, with content_special_tokens="reject"',
    "mask_error": "no token of the assistant turns could be found in the prompt",
    "unsupervised": "nothing to learn: no assistant turn, or a mask with no token in it",
    "too_long": "longer than max_length, with overlong='drop' (or 'truncate' leaving nothing supervised)",
    "error": "any other failure (a bug: please report it)",
}

_OVERLONG = ("drop", "truncate", "keep")
_POLICIES = ("escape", "reject", "allow")


@dataclass(frozen=True)
class FormatOptions:
    """What is supervised, how long a row may be, and how content is tokenized.

    * ``reasoning``, ``end_of_turn``: whether the assistant's reasoning and each turn's end-of-turn token
      are supervised (templates with ``{% generation %}`` tags decide for themselves);
    * ``last_turn_only``: supervise only the last assistant turn;
    * ``labels``: write ``labels`` (the ids, -100 where unsupervised) instead of ``assistant_masks``;
    * ``max_length`` and ``overlong``: a longer row is dropped (to the rejects), truncated (its start is
      kept) or kept whole;
    * ``content_special_tokens``: ``"escape"`` (control tokens in content are plain text), ``"reject"``
      or ``"allow"`` (transformers' behaviour);
    * ``template_kwargs``: template variables for every row (a row's ``chat_template_kwargs`` win);
    * ``polyfill``: rewrite what the template cannot render (``"auto"``, or rewrite names: see
      :mod:`chatcodec.polyfills`); by default rows are rendered exactly, and a template error is a reject;
    * ``text_template``: the template (a built-in name or a template file) that rendered rows kept as text
      alone (a ``text`` column, no messages): each is read back into its messages
      (:func:`chatcodec.parse_conversation`) and formatted as they are; a text that template does not
      render is a ``bad_row`` reject saying where it stops following it.
    """

    reasoning: bool = True
    end_of_turn: bool = True
    last_turn_only: bool = False
    labels: bool = False
    max_length: int | None = None
    overlong: Overlong = "drop"
    content_special_tokens: ContentPolicy = "escape"
    template_kwargs: Mapping[str, Any] | None = None
    polyfill: Polyfill = False
    text_template: str | None = None

    def __post_init__(self) -> None:
        if self.polyfill not in (False, None, True, "auto"):
            object.__setattr__(self, "polyfill", polyfills.select(self.polyfill, _no_capabilities))
        if self.overlong not in _OVERLONG:
            raise InputError(f"overlong must be one of {', '.join(_OVERLONG)}, not {self.overlong!r}.")
        if self.content_special_tokens not in _POLICIES:
            raise InputError(
                f"content_special_tokens must be one of {', '.join(_POLICIES)}, not {self.content_special_tokens!r}."
            )
        if self.max_length is not None and (not isinstance(self.max_length, int) or self.max_length < 1):
            raise InputError(f"max_length must be a positive number of tokens, not {self.max_length!r}.")


class Formatted(NamedTuple):
    """A row as training data: its ids and its mask (1 where the model learns)."""

    id: str
    input_ids: list[int]
    mask: list[int]
    truncated: bool


class Rejected(NamedTuple):
    """A row that could not be formatted, with one of :data:`REASONS` and the error message."""

    id: str
    reason: str
    message: str


class Formatter:
    """Formats rows for training; a batched function for ``datasets.Dataset.map`` too.

    ``tokenizer`` is a model folder with ``tokenizer.json`` (and its template unless ``template`` is
    given: a built-in name, a template file or folder, or a :class:`~chatcodec.ChatTemplate`). The codec is
    loaded at once, unless ``load=False`` (for a formatter that runs elsewhere: then only the templates are
    checked, and the codec is loaded on first use).

    >>> fmt = Formatter("../shared/tokenizers/qwen3", reasoning=False)  # doctest: +SKIP
    >>> ds = ds.map(fmt, batched=True, num_proc=4)  # doctest: +SKIP

    Called on a batch (a mapping of column names to lists), it returns ``input_ids``, ``attention_mask``,
    ``assistant_masks`` (or ``labels``), ``num_tokens`` and ``error``: a row that cannot be formatted keeps
    its place with empty lists and ``error`` set to ``"reason: message"``, so nothing disappears silently;
    ``ds.filter(lambda row: row["error"] is None)`` drops them.
    """

    def __init__(
        self,
        tokenizer: str | Path,
        *,
        template: str | Path | ChatTemplate | None = None,
        options: FormatOptions | None = None,
        load: bool = True,
        **option_values: Any,
    ) -> None:
        self.tokenizer = str(tokenizer)
        if isinstance(template, ChatTemplate):
            self._template: Any = (template.sources, template.special_tokens, template.name)
        else:
            self._template = None if template is None else str(template)
        if options is not None and option_values:
            raise InputError("Give either options= or option keywords, not both.")
        unknown = sorted(set(option_values) - set(FormatOptions.__dataclass_fields__))
        if unknown:
            known = ", ".join(FormatOptions.__dataclass_fields__)
            raise InputError(f"Unknown dataset option {unknown[0]!r}; the options are {known}.")
        self.options = options if options is not None else FormatOptions(**option_values)
        self._codec: Codec | None = None
        self._text_template: ChatTemplate | None = None
        if load:
            self._codec = self.codec  # load now: a bad folder or template is reported before any work starts
            if self.options.text_template is not None:
                self._text_template = load_template(self.options.text_template)
        else:
            self._check()

    def _check(self) -> None:
        """What loading checks, but for reading the tokenizer itself (a second or so): for a formatter that
        runs in worker processes, each of which loads the codec."""
        load_template(self.tokenizer)
        if isinstance(self._template, str):
            load_template(self._template)
        if self.options.text_template is not None:
            load_template(self.options.text_template)
        folder = Path(self.tokenizer).expanduser()
        if folder.is_dir() and not (folder / "tokenizer.json").is_file():
            raise LoadError(f"{folder} has no tokenizer.json, which formatting needs for tokens.")

    @property
    def codec(self) -> Codec:
        """The codec, loaded on first use in each process."""
        if self._codec is None:
            codec = load(self.tokenizer)
            if self._template is not None:
                if isinstance(self._template, tuple):
                    sources, special_tokens, name = self._template
                    template = ChatTemplate(sources, special_tokens=special_tokens, name=name)
                else:
                    template = load_template(self._template)
                # a bare .jinja file knows no special tokens: the tokenizer folder's fill what it lacks
                template.special_tokens = {**codec.template.special_tokens, **template.special_tokens}
                codec = codec.with_template(template)
            codec.history = History(entries=0)  # rows are one-shot: none is the next turn of another
            self._codec = codec
        return self._codec

    def _read_text(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        """A row kept as text alone, with the messages its text is read back into (others as they are)."""
        if not isinstance(row.get("text"), str) or any(row.get(k) is not None for k in ("messages", "conversations")):
            return row
        from ..unrender import parse_conversation

        if self._text_template is None:
            assert self.options.text_template is not None
            self._text_template = load_template(self.options.text_template)
        parsed = parse_conversation(self._text_template, row["text"], tools=_list_or_json(row.get("tools"), "tools"))
        return {**row, "messages": parsed.messages}

    def __getstate__(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer, "_template": self._template, "options": asdict(self.options)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tokenizer = state["tokenizer"]
        self._template = state["_template"]
        self.options = FormatOptions(**state["options"])
        self._codec = None
        self._text_template = None

    def __repr__(self) -> str:
        return f"<Formatter {self.tokenizer!r} {self.options}>"

    def format(self, row: Mapping[str, Any], row_id: str) -> Formatted | Rejected:
        """Format one row; every failure comes back as a :class:`Rejected`, never as an exception."""
        try:
            return self._format(row, row_id)
        except RowError as exc:
            return Rejected(row_id, "bad_row", str(exc))
        except SpecialTokenError as exc:
            return Rejected(row_id, "control_token", str(exc))
        except MaskError as exc:
            return Rejected(row_id, "mask_error", str(exc))
        except TemplateError as exc:
            return Rejected(row_id, "template_error", str(exc))
        except InputError as exc:
            return Rejected(row_id, "bad_row", str(exc))
        except ChatcodecError as exc:
            return Rejected(row_id, "error", str(exc))
        except Exception as exc:  # a row must never stop the run: this is reported, counted and kept
            return Rejected(row_id, "error", f"{type(exc).__name__}: {exc}")

    def _format(self, row: Mapping[str, Any], row_id: str) -> Formatted | Rejected:
        options = self.options
        conversation = to_conversation(self._read_text(row) if options.text_template is not None else row)
        if not any(m["role"] == "assistant" for m in conversation.messages):
            return Rejected(row_id, "unsupervised", "the conversation has no assistant turn to learn from")
        codec = self.codec
        tagged = codec._tagged()  # the template's tags decide the mask: it is computed with the encode's render
        encoding = codec.encode(
            conversation.messages,
            tools=conversation.tools,
            documents=conversation.documents,
            content_special_tokens=options.content_special_tokens,
            polyfill=options.polyfill,
            return_assistant_tokens_mask=tagged,
            **{**(options.template_kwargs or {}), **conversation.kwargs},
        )
        ids = encoding.input_ids
        if tagged:
            mask = encoding.assistant_mask
        else:
            mask = encoding.mask(reasoning=options.reasoning, end_of_turn=options.end_of_turn)
        if options.last_turn_only:
            mask = only_last_run(mask)
        truncated = False
        if options.max_length is not None and len(ids) > options.max_length:
            if options.overlong == "drop":
                return Rejected(row_id, "too_long", f"{len(ids)} tokens, over max_length={options.max_length}")
            if options.overlong == "truncate":
                ids, mask, truncated = ids[: options.max_length], mask[: options.max_length], True
                if not any(mask):
                    return Rejected(
                        row_id, "too_long", f"over max_length={options.max_length}, and no supervised token is left"
                    )
        if not any(mask):
            return Rejected(row_id, "unsupervised", "no token is supervised")
        return Formatted(row_id, ids, mask, truncated)

    def __call__(self, batch: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
        """``datasets.Dataset.map(formatter, batched=True)``: a batch of rows in, the same number out."""
        columns = list(batch)
        size = len(batch[columns[0]]) if columns else 0
        key = "labels" if self.options.labels else "assistant_masks"
        out: dict[str, list[Any]] = {"input_ids": [], "attention_mask": [], key: [], "num_tokens": [], "error": []}
        for index in range(size):
            row = {column: batch[column][index] for column in columns}
            result = self.format(row, str(row.get("id", index)))
            if isinstance(result, Rejected):
                for name in ("input_ids", "attention_mask", key):
                    out[name].append([])
                out["num_tokens"].append(0)
                out["error"].append(f"{result.reason}: {result.message}")
                continue
            out["input_ids"].append(result.input_ids)
            out["attention_mask"].append([1] * len(result.input_ids))
            out[key].append(labels(result.input_ids, result.mask) if self.options.labels else result.mask)
            out["num_tokens"].append(len(result.input_ids))
            out["error"].append(None)
        return out


def _no_capabilities() -> Capabilities:
    raise AssertionError("rewrite names need no capabilities")  # select() asks only for "auto"


def only_last_run(mask: list[int]) -> list[int]:
    """The mask with every run of ones but the last cleared: the last assistant turn alone.

    >>> only_last_run([0, 1, 1, 0, 0, 1, 1, 0])
    [0, 0, 0, 0, 0, 1, 1, 0]
    """
    end = len(mask)
    while end and not mask[end - 1]:
        end -= 1
    start = end
    while start and mask[start - 1]:
        start -= 1
    return [0] * start + mask[start:]


def labels(ids: Sequence[int], mask: Sequence[int]) -> list[int]:
    """The ids where the mask is 1 and -100 elsewhere, the loss-ignore index of PyTorch and TRL.

    >>> labels([5, 6, 7], [0, 1, 1])
    [-100, 6, 7]
    """
    return [i if m else -100 for i, m in zip(ids, mask, strict=True)]
