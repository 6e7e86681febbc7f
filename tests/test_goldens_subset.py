"""Byte parity without ../shared: a subset of the corpus goldens kept in the repository, replayed on the
built-in templates that are those corpus templates byte for byte.

``tests/data/goldens-subset.jsonl`` holds the goldens of three templates (Qwen3, Llama 3.1, Gemma 3: 99 renders
by transformers 5.24.0) and ``tests/data/conversations.json`` the corpus conversations they render, so that
a checkout alone still checks parity; with ../shared beside it, a test checks the copy against the corpus.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from chatcodec import ChatcodecError, load_template

from .conftest import CORPUS, GOLDEN_NOW, require_shared

DATA = Path(__file__).resolve().parent / "data"
#: corpus template -> the built-in that is the same source with the same special tokens
BUILTIN = {"Qwen-Qwen3-0.6B": "qwen3", "meta-llama-Llama-3.1-8B-Instruct": "llama3", "lenml-gemma3": "gemma"}


@cache
def _subset() -> list[dict[str, Any]]:
    with (DATA / "goldens-subset.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@cache
def _conversations() -> dict[str, dict[str, Any]]:
    data = json.loads((DATA / "conversations.json").read_text(encoding="utf-8"))
    return {conversation["id"]: conversation for conversation in data["conversations"]}


def _id(record: dict[str, Any]) -> str:
    return f"{record['template']}/{record['conversation']}/" + ",".join(
        f"{k}={v}" for k, v in record["options"].items()
    )


@pytest.mark.parametrize("record", _subset(), ids=[_id(r) for r in _subset()])
def test_builtin_template_renders_the_golden(record: dict[str, Any]) -> None:
    template = load_template(BUILTIN[record["template"]])
    conversation = _conversations()[record["conversation"]]
    messages = copy.deepcopy(conversation["messages"])
    options = {"tools": conversation["tools"], "now": GOLDEN_NOW, **record["options"]}
    if "error" in record:
        with pytest.raises(ChatcodecError) as caught:
            template.render(messages, **options)
        assert record["error"]["message"].split("\n")[0] in str(caught.value)
    else:
        assert template.render(messages, **options) == record["output"]


def test_the_subset_is_the_corpus() -> None:
    """Every line is the corpus's own line, all of those three templates' lines are here, and the built-ins
    are those templates byte for byte with their special tokens."""
    require_shared()
    with (CORPUS / "goldens.jsonl").open(encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    assert _subset() == [record for record in corpus if record["template"] in BUILTIN]
    assert len(_subset()) == 3 * 33
    shared = json.loads((CORPUS / "conversations.json").read_text(encoding="utf-8"))["conversations"]
    assert list(_conversations().values()) == shared
    manifest = {e["name"]: e for e in json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))["templates"]}
    for name, builtin in BUILTIN.items():
        template = load_template(builtin)
        assert template.source == (CORPUS / manifest[name]["file"]).read_text(encoding="utf-8")
        assert template.special_tokens == manifest[name]["special_tokens"]
