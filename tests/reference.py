"""transformers 5.24 as the reference renderer, for differential tests. Never imported by chatcodec itself."""

from __future__ import annotations

import datetime as _dt
import os
import warnings
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def transformers_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def require_transformers() -> None:
    if not transformers_available():
        pytest.skip("transformers (the reference renderer, a dev dependency) is not installed")


@lru_cache(maxsize=64)
def _tokenizer(special_items: tuple[tuple[str, str], ...]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        backend = Tokenizer(models.WordLevel({"[[unk]]": 0}, unk_token="[[unk]]"))
        return PreTrainedTokenizerFast(tokenizer_object=backend, **dict(special_items))


def pinned_clock(now: _dt.datetime) -> Any:
    """Context manager pinning transformers' strftime_now to ``now`` (its only clock)."""
    import contextlib

    import transformers.utils.chat_template_utils as ctu

    class Fixed(_dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return now

    @contextlib.contextmanager
    def pin() -> Any:
        saved = ctu.datetime
        ctu.datetime = Fixed  # type: ignore[misc]
        try:
            yield
        finally:
            ctu.datetime = saved  # type: ignore[misc]

    return pin()


def reference_render(
    template: str, special_tokens: Mapping[str, str], messages: Any, *, now: _dt.datetime, **kwargs: Any
) -> tuple[str, str | None]:
    """(output, None) or ("", "ErrorType: message") from transformers' apply_chat_template(tokenize=False)."""
    tok = _tokenizer(tuple(sorted(special_tokens.items())))
    with warnings.catch_warnings(), pinned_clock(now):
        warnings.simplefilter("ignore")
        try:
            return tok.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs), None
        except Exception as exc:
            return "", f"{type(exc).__name__}: {exc}"
