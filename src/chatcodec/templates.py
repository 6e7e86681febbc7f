"""load_template: find a chat template wherever it lives, with the special tokens that go with it.

Places, in the precedence transformers 5.24 uses (parity notes §3):

* a **model folder**: ``tokenizer_config.json`` (``chat_template`` as a string or a list of named
  templates) is replaced entirely by ``chat_template.jinja`` and ``additional_chat_templates/*.jinja``
  when any of those exist; a processor's legacy ``chat_template.json`` is the last resort. Special
  tokens come from ``tokenizer_config.json`` (and a legacy ``special_tokens_map.json``);
* a single file: ``tokenizer_config.json``, ``chat_template.jinja`` (special tokens from a
  ``tokenizer_config.json`` beside it), ``chat_template.json``, or a ``.gguf`` model
  (``tokenizer.chat_template``, and bos/eos looked up in its vocabulary);
* the name of a built-in template (``chatcodec templates`` lists them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from .exceptions import ChatcodecError, LoadError, TemplateNotFoundError
from .render import ChatTemplate

__all__ = ["BuiltinTemplate", "builtin_templates", "content_key", "load_template", "special_tokens_from_config"]

#: the special tokens transformers always names (``PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES``)
NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@dataclass(frozen=True)
class BuiltinTemplate:
    """A template shipped with chatcodec, with its special tokens and where it came from."""

    name: str
    file: str
    description: str
    source: str
    license: str
    special_tokens: dict[str, str] = field(default_factory=dict)

    def load(self) -> ChatTemplate:
        text = resources.files("chatcodec").joinpath("builtin").joinpath(self.file).read_text(encoding="utf-8")
        return ChatTemplate(text, special_tokens=self.special_tokens, name=self.name)


@lru_cache(maxsize=1)
def builtin_templates() -> dict[str, BuiltinTemplate]:
    """Every built-in template by name, in the order ``chatcodec templates`` lists them."""
    index = json.loads(
        resources.files("chatcodec").joinpath("builtin").joinpath("index.json").read_text(encoding="utf-8")
    )
    return {entry["name"]: BuiltinTemplate(**entry) for entry in index["templates"]}


def content_key(template: ChatTemplate) -> tuple[Any, ...]:
    """What a template renders from, as a key: its sources and special tokens. Two template objects with the
    same key render alike, so what is learned from one (by probe renders) holds for the other."""
    return tuple(sorted(template.sources.items())), tuple(sorted(template.special_tokens.items(), key=repr))


def load_template(source: str | Path, *, name: str | None = None) -> ChatTemplate:
    """Load a chat template from a model folder, a file, or a built-in name.

    >>> load_template("chatml").render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
    """
    text = str(source)
    path = _path(text)
    builtins = builtin_templates()
    if text in builtins and not _is(path, Path.exists):
        template = builtins[text].load()
        if name:
            template.name = name
        return template
    if _is(path, Path.is_dir):
        return _from_folder(path, name or path.name)
    if _is(path, Path.is_file):
        return _from_file(path, name)
    hint = _closest(text, builtins)
    raise TemplateNotFoundError(
        f"No chat template at {text!r}: it is neither an existing file, nor a folder, nor a built-in template."
        + (f" Did you mean {hint!r}?" if hint else "")
        + f" Built-in templates: {', '.join(builtins)}."
    )


# --- files ------------------------------------------------------------------------------------------

#: largest template or configuration file read (a tokenizer_config.json is a few MB at most)
MAX_FILE_SIZE = 256 * 2**20


def _path(text: str) -> Path:
    try:
        return Path(text).expanduser()
    except RuntimeError:  # "~someone" without such a user: take it literally
        return Path(text)


def _is(path: Path, test: Any) -> bool:
    """``path.exists()`` or ``is_dir()``/``is_file()``, False for names the system cannot even look up."""
    try:
        return bool(test(path))
    except (OSError, ValueError):  # a name too long, a NUL byte
        return False


def _read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_SIZE:
            raise LoadError(
                f"{path} is {size // 2**20:,} MiB, too large for a chat template or tokenizer configuration"
                f" (at most {MAX_FILE_SIZE // 2**20} MiB)."
            )
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise LoadError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
    except OSError as exc:
        raise LoadError(f"Cannot read {path}: {exc.strerror or exc}.") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise LoadError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from None
    except RecursionError:
        raise LoadError(f"{path} nests too deeply to read.") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise LoadError(f"{path} is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise LoadError(f"{path} should hold a JSON object, but holds a {type(data).__name__}.")
    return data


def _from_file(path: Path, name: str | None) -> ChatTemplate:
    label = name or path.stem
    if path.suffix == ".gguf":
        return _from_gguf(path, name or path.stem)
    if path.suffix == ".jinja":
        config = path.with_name("tokenizer_config.json")
        tokens = special_tokens_from_config(config) if config.is_file() else {}
        return ChatTemplate(_read_text(path), special_tokens=tokens, name=label)
    if path.suffix == ".json":
        data = _read_json(path)
        if "chat_template" not in data or data["chat_template"] is None:
            raise TemplateNotFoundError(f"{path} has no chat_template.")
        tokens = _special_tokens(data, path.with_name("special_tokens_map.json"))
        found = ChatTemplate(_templates_from_config(data["chat_template"], path), special_tokens=tokens, name=label)
        return _with_response_template(found, data)
    raise LoadError(
        f"Cannot tell what {path.name} is: expected a model folder, tokenizer_config.json, a .jinja file,"
        " chat_template.json or a .gguf model."
    )


def _from_folder(folder: Path, name: str) -> ChatTemplate:
    config_path = folder / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    tokens = _special_tokens(config, folder / "special_tokens_map.json")

    templates: dict[str, str] = {}
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        templates["default"] = _read_text(jinja)
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            templates[file.stem] = _read_text(file)
    if not templates and config.get("chat_template") is not None:
        found = _templates_from_config(config["chat_template"], config_path)
        templates = found if isinstance(found, dict) else {"default": found}
    legacy = folder / "chat_template.json"
    if not templates and legacy.is_file():
        data = _read_json(legacy)
        if data.get("chat_template") is not None:
            found = _templates_from_config(data["chat_template"], legacy)
            templates = found if isinstance(found, dict) else {"default": found}
    if not templates:
        raise TemplateNotFoundError(
            f"The folder {folder} has no chat template: looked for chat_template.jinja,"
            " additional_chat_templates/, a chat_template in tokenizer_config.json, and chat_template.json."
        )
    template = ChatTemplate(templates if list(templates) != ["default"] else templates["default"],
                            special_tokens=tokens, name=name)  # fmt: skip
    return _with_response_template(template, config)


def _with_response_template(template: ChatTemplate, config: dict[str, Any]) -> ChatTemplate:
    """The template with the config's ``response_template`` (how the model's output is parsed), if it has one."""
    found = config.get("response_template")
    if isinstance(found, dict):
        template.response_template = found
    return template


def _templates_from_config(value: Any, path: Path) -> str | dict[str, str]:
    """A config's ``chat_template``: a string, or a list of ``{"name", "template"}`` entries."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("template"), str) for e in value
    ):
        return {entry["name"]: entry["template"] for entry in value}
    raise LoadError(
        f"The chat_template in {path} is neither a string nor a list of {{name, template}} entries with string values."
    )


def special_tokens_from_config(path: Path) -> dict[str, str]:
    """The special tokens a template sees, read from a ``tokenizer_config.json``."""
    return _special_tokens(_read_json(path), path.with_name("special_tokens_map.json"))


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])  # a serialized AddedToken
    return None


def _special_tokens(config: dict[str, Any], legacy_map: Path) -> dict[str, str]:
    """transformers' ``special_tokens_map``: the named tokens that are set, plus model-specific ``*_token`` keys."""
    settings = dict(config)
    if "added_tokens_decoder" not in config and legacy_map.is_file():
        for key, value in _read_json(legacy_map).items():
            if not settings.get(key):
                settings[key] = value
    extra = settings.get("extra_special_tokens")
    if isinstance(extra, dict):
        settings = {**extra, **settings}
    tokens: dict[str, str] = {}
    for key in NAMED_SPECIAL_TOKENS:
        text = _token_text(settings.get(key))
        if text is not None:
            tokens[key] = text
    for key, value in settings.items():
        text = _token_text(value)
        if key.endswith("_token") and key not in tokens and text is not None:
            tokens[key] = text
    return tokens


# --- GGUF --------------------------------------------------------------------------------------------


def _from_gguf(path: Path, name: str) -> ChatTemplate:
    try:
        from gguf import GGUFReader
    except ImportError:
        raise LoadError(f"Reading {path.name} needs the gguf package: pip install 'chatcodec[gguf]'.") from None
    try:
        return _read_gguf(GGUFReader(path), path, name)
    except ChatcodecError:
        raise
    except Exception as exc:  # a malformed file fails anywhere inside the reader
        raise LoadError(f"{path} is not a readable GGUF file: {exc}.") from None


def _read_gguf(reader: Any, path: Path, name: str) -> ChatTemplate:
    fields = reader.fields

    def value(key: str) -> Any:
        entry = fields.get(key)
        return None if entry is None else entry.contents()

    templates: dict[str, str] = {}
    default = value("tokenizer.chat_template")
    if isinstance(default, str):
        templates["default"] = default
    extras = value("tokenizer.chat_templates")
    for extra in extras if isinstance(extras, list) else []:
        text = value(f"tokenizer.chat_template.{extra}")
        if isinstance(extra, str) and isinstance(text, str):
            templates[extra] = text
    if not templates:
        raise TemplateNotFoundError(f"The GGUF file {path} has no tokenizer.chat_template in its metadata.")

    tokens: dict[str, str] = {}
    vocab = fields.get("tokenizer.ggml.tokens")
    for kind in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        token_id = value(f"tokenizer.ggml.{kind}_token_id")
        if vocab is not None and isinstance(token_id, int) and 0 <= token_id < len(vocab.data):
            token = vocab.contents(token_id)
            if isinstance(token, str):
                tokens[f"{kind}_token"] = token
    return ChatTemplate(templates if list(templates) != ["default"] else templates["default"],
                        special_tokens=tokens, name=name)  # fmt: skip


def _closest(text: str, names: dict[str, Any]) -> str | None:
    import difflib

    matches = difflib.get_close_matches(text.lower(), list(names), n=1, cutoff=0.6)
    return matches[0] if matches else None
