"""load_template: every place a template lives, with transformers' precedence (parity notes §3)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from chatcodec import ChatTemplate, LoadError, TemplateNotFoundError, builtin_templates, load_template

from .conftest import CORPUS, SHARED, manifest, require_shared, template_source
from .reference import require_transformers

USER = [{"role": "user", "content": "hi"}]


def write(path: Path, content: str | dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def test_config_template_and_special_tokens(tmp_path: Path) -> None:
    write(
        tmp_path / "tokenizer_config.json",
        {
            "chat_template": "{{ bos_token }}|{{ image_token }}|{{ additional_special_tokens }}|{{ eos_token }}",
            "bos_token": "<s>",
            "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True},
            "unk_token": None,
            "image_token": "<|image|>",
            "additional_special_tokens": ["<x>"],
            "add_bos_token": True,
        },
    )
    template = load_template(tmp_path)
    assert template.special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "image_token": "<|image|>"}
    assert template.render(USER) == "<s>|<|image|>||</s>"
    assert template.name == tmp_path.name


def test_jinja_file_replaces_the_config_template(tmp_path: Path) -> None:
    """D31 / T13: chat_template.jinja wins; jinja drops one trailing newline when rendering."""
    write(tmp_path / "tokenizer_config.json", {"chat_template": "CFG"})
    write(tmp_path / "chat_template.jinja", "JINJA\n")
    template = load_template(tmp_path)
    assert template.source == "JINJA\n"
    assert template.render(USER) == "JINJA"


def test_additional_templates(tmp_path: Path) -> None:
    write(tmp_path / "tokenizer_config.json", {"chat_template": "CFG"})
    write(tmp_path / "chat_template.jinja", "JINJA")
    write(tmp_path / "additional_chat_templates" / "tool_use.jinja", "TOOLS")
    template = load_template(tmp_path)
    assert template.sources == {"default": "JINJA", "tool_use": "TOOLS"}
    assert template.render(USER, tools=[]) == "TOOLS"


def test_additional_templates_alone_discard_the_config_template(tmp_path: Path) -> None:
    """D31 trap: without chat_template.jinja the config's template is lost and there is no default."""
    write(tmp_path / "tokenizer_config.json", {"chat_template": "CFG"})
    write(tmp_path / "additional_chat_templates" / "tool_use.jinja", "TOOLS")
    template = load_template(tmp_path)
    assert template.sources == {"tool_use": "TOOLS"}
    assert template.render(USER, tools=[]) == "TOOLS"
    with pytest.raises(Exception, match="no default specified"):
        template.render(USER)


def test_named_templates_in_the_config(tmp_path: Path) -> None:
    write(
        tmp_path / "tokenizer_config.json",
        {"chat_template": [{"name": "default", "template": "D"}, {"name": "rag", "template": "R"}]},
    )
    template = load_template(tmp_path / "tokenizer_config.json")
    assert template.render(USER) == "D"
    assert template.render(USER, chat_template="rag") == "R"


def test_empty_jinja_file_is_a_template(tmp_path: Path) -> None:
    write(tmp_path / "chat_template.jinja", "")
    assert load_template(tmp_path).render(USER) == ""


def test_legacy_processor_template(tmp_path: Path) -> None:
    write(tmp_path / "chat_template.json", {"chat_template": "LEGACY {{ messages|length }}"})
    assert load_template(tmp_path).render(USER) == "LEGACY 1"
    assert load_template(tmp_path / "chat_template.json").render(USER) == "LEGACY 1"


def test_legacy_special_tokens_map(tmp_path: Path) -> None:
    write(tmp_path / "tokenizer_config.json", {"chat_template": "{{ bos_token }}"})
    write(tmp_path / "special_tokens_map.json", {"bos_token": {"content": "<B>", "lstrip": False}})
    assert load_template(tmp_path).render(USER) == "<B>"


def test_jinja_file_picks_up_the_special_tokens_beside_it(tmp_path: Path) -> None:
    write(tmp_path / "tokenizer_config.json", {"eos_token": "<E>"})
    path = write(tmp_path / "chat_template.jinja", "x{{ eos_token }}")
    assert load_template(path).render(USER) == "x<E>"
    assert load_template(path).name == "chat_template"


@pytest.mark.parametrize("folder", ["qwen3", "llama3_1"])
def test_real_tokenizer_folders_match_transformers(folder: str) -> None:
    require_shared()
    require_transformers()
    from transformers import AutoTokenizer

    path = SHARED / "tokenizers" / folder
    ours = load_template(path)
    theirs = AutoTokenizer.from_pretrained(str(path))
    assert ours.special_tokens == dict(theirs.special_tokens_map)
    assert ours.source == theirs.chat_template
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, date_string="1 Jan 2026")
    assert ours.render(chat, add_generation_prompt=True, date_string="1 Jan 2026") == expected


def test_gguf(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf extra (pip install 'chatcodec[gguf]') is not installed")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_chat_template("{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")
    writer.add_chat_template([{"name": "tool_use", "template": "TOOLS"}])
    writer.add_token_list(["<unk>", "<|begin|>", "<|end|>", "hello"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    template = load_template(path)
    assert template.special_tokens == {"bos_token": "<|begin|>", "eos_token": "<|end|>"}
    assert template.render(USER) == "<|begin|>hi<|end|>"
    assert template.render(USER, tools=[]) == "TOOLS"


def test_not_a_gguf(tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason="the gguf extra is not installed")
    with pytest.raises(LoadError, match="not a readable GGUF file"):
        load_template(write(tmp_path / "broken.gguf", "not gguf at all"))


@pytest.mark.parametrize(
    ("setup", "error", "text"),
    [
        (lambda p: p / "nowhere", TemplateNotFoundError, "neither an existing file, nor a folder, nor a built-in"),
        (lambda p: p, TemplateNotFoundError, "has no chat template"),
        (lambda p: write(p / "tokenizer_config.json", "{oops"), LoadError, "is not valid JSON"),
        (lambda p: write(p / "tokenizer_config.json", "[1]"), LoadError, "should hold a JSON object"),
        (
            lambda p: write(p / "tokenizer_config.json", {"eos_token": "x"}),
            TemplateNotFoundError,
            "has no chat_template",
        ),
        (lambda p: write(p / "tokenizer_config.json", {"chat_template": 3}), LoadError, "neither a string nor a list"),
        (lambda p: write(p / "notes.txt", "hello"), LoadError, "Cannot tell what notes.txt is"),
    ],
)
def test_bad_sources_give_one_clear_error(tmp_path: Path, setup: Any, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        load_template(setup(tmp_path))


def test_unknown_name_suggests_the_closest_builtin() -> None:
    with pytest.raises(TemplateNotFoundError, match="Did you mean 'qwen3'"):
        load_template("qwen-3")


def test_non_utf8_template(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(LoadError, match="not UTF-8"):
        load_template(tmp_path)


REQUIRED_BUILTINS = {
    "chatml", "llama2", "llama3", "mistral", "qwen3", "gemma", "phi-3", "deepseek-r1", "gpt-oss", "midm",
    "seed-korean-toolcall",
}  # fmt: skip


def test_builtins_are_all_there_with_provenance() -> None:
    entries = builtin_templates()
    assert set(entries) >= REQUIRED_BUILTINS
    for entry in entries.values():
        assert entry.source and entry.license and entry.description
        assert isinstance(entry.load(), ChatTemplate)


# built-in name -> the corpus template it was taken from, byte for byte
FROM_CORPUS = {
    "llama2": "chujiezheng-llama-2-chat",
    "llama3": "meta-llama-Llama-3.1-8B-Instruct",
    "mistral": "Mistral-Small-3.2-24B-Instruct-2506",
    "qwen3": "Qwen-Qwen3-0.6B",
    "gemma": "lenml-gemma3",
    "phi-3": "microsoft-Phi-3.5-mini-instruct",
    "deepseek-r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "gpt-oss": "openai-gpt-oss-120b",
    "midm": "midm",
    "seed-korean-toolcall": "seed-korean-toolcall",
}


@pytest.mark.parametrize("name", list(FROM_CORPUS))
def test_builtins_are_the_corpus_templates(name: str) -> None:
    require_shared()
    template = load_template(name)
    corpus_name = FROM_CORPUS[name]
    assert template.source == template_source(corpus_name)
    assert template.special_tokens == manifest()[corpus_name]["special_tokens"]


def test_a_folder_named_like_a_builtin_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_shared()
    shutil.copy(CORPUS / "templates" / "chujiezheng-zephyr.jinja", tmp_path / "chat_template.jinja")
    monkeypatch.chdir(tmp_path.parent)
    (tmp_path.parent / "qwen3").mkdir(exist_ok=True)
    shutil.copy(tmp_path / "chat_template.jinja", tmp_path.parent / "qwen3" / "chat_template.jinja")
    assert load_template("qwen3").source == template_source("chujiezheng-zephyr")


def _gguf_with(path: Path, build: Any) -> Path:
    gguf = pytest.importorskip("gguf", reason="the gguf extra (pip install 'chatcodec[gguf]') is not installed")
    writer = gguf.GGUFWriter(str(path), "llama")
    build(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


HOSTILE_FILES = {
    "JSON nested 100,000 deep": lambda p: write(p / "tokenizer_config.json", "[" * 100000 + "]" * 100000).parent,
    "a 5,000-digit integer": lambda p: write(
        p / "tokenizer_config.json", '{"chat_template": "x", "n": ' + "9" * 5000 + "}"
    ),
    "a UTF-8 byte order mark": lambda p: write(p / "tokenizer_config.json", '\ufeff{"chat_template": "x"}'),
    "a template name that is a list": lambda p: write(
        p / "tokenizer_config.json", {"chat_template": [{"name": [1], "template": "x"}]}
    ),
    "a template that is a number": lambda p: write(
        p / "tokenizer_config.json", {"chat_template": [{"name": "default", "template": 5}]}
    ),
    "a processor template that is a list": lambda p: write(p / "chat_template.json", {"chat_template": [1]}).parent,
    "a deep special_tokens_map.json": lambda p: (
        write(p / "tokenizer_config.json", {"chat_template": "x"}),
        write(p / "special_tokens_map.json", "[" * 100000 + "]" * 100000),
    )[0],
    "a template nested 100,000 deep": lambda p: write(p / "chat_template.jinja", "{{ " + "(" * 100000 + ")" * 100000),
    "5,000 nested blocks": lambda p: write(p / "chat_template.jinja", "{% if 1 %}" * 5000 + "{% endif %}" * 5000),
    "a directory where a template should be": lambda p: (
        (
            write(p / "chat_template.jinja", "x"),
            (p / "additional_chat_templates" / "tool_use.jinja").mkdir(parents=True),
        )[0].parent
    ),
    "a name with a NUL byte": lambda p: str(p / "a\x00b"),
    "a name too long for the system": lambda p: str(p / ("a" * 5000)),
    "a symlink loop": lambda p: (os.symlink(p / "a", p / "b"), os.symlink(p / "b", p / "a"), p / "a")[2],
    "a truncated GGUF file": lambda p: write(p / "m.gguf", "GGUF\x03\x00\x00\x00" + "\xff" * 16),
    "GGUF template names that are not a list": lambda p: _gguf_with(
        p / "m.gguf",
        lambda w: (w.add_chat_template("{{ 1 }}"), w.add_uint32("tokenizer.chat_templates", 7)),
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE_FILES))
def test_hostile_files_raise_only_chatcodec_errors(tmp_path: Path, name: str) -> None:
    from chatcodec import ChatcodecError

    target = HOSTILE_FILES[name](tmp_path)
    try:
        load_template(target)
    except ChatcodecError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
