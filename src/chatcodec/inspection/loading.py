"""A template, and the tokenizer that goes with it when there is one, from what a person names on a command line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..exceptions import InputError
from ..render import ChatTemplate
from ..templates import load_template

if TYPE_CHECKING:
    from ..tokens import Codec

__all__ = ["load_pair"]


def load_pair(template: str | Path, tokenizer: str | Path | None = None) -> tuple[ChatTemplate, Codec | None]:
    """The template ``template`` names and a :class:`~chatcodec.Codec` for it: from ``tokenizer`` (a model
    folder or a tokenizer.json), else from ``template`` itself when it is a model folder with a tokenizer.json
    (or a file beside one); else None.

    A template file given no special tokens of its own gets the tokenizer's (``bos_token`` and the rest), as
    transformers gives a ``chat_template=`` argument the tokenizer's special tokens.
    """
    chat = load_template(template)
    folder = _tokenizer_folder(tokenizer) if tokenizer is not None else _beside(Path(str(template)).expanduser())
    if folder is None:
        return chat, None
    from ..tokens import load

    file = Path(str(tokenizer)).expanduser() if tokenizer is not None else None
    codec = load(folder, tokenizer=file if file is not None and file.is_file() else None)
    paired = codec.with_template(chat)
    return paired.template, paired


def _tokenizer_folder(path: str | Path) -> Path:
    location = Path(str(path)).expanduser()
    if location.is_file():
        return location.parent
    if location.is_dir():
        return location
    raise InputError(f"--tokenizer {path}: no such folder or file")


def _beside(path: Path) -> Path | None:
    folder = path if path.is_dir() else path.parent if path.is_file() and path.suffix == ".json" else None
    return folder if folder is not None and (folder / "tokenizer.json").is_file() else None
