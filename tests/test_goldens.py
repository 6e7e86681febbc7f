"""Byte parity with transformers 5.24: every line of ../shared/corpus/goldens.jsonl, replayed."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from chatcodec import ChatcodecError, ChatTemplate

from .conftest import GOLDEN_NOW, conversations, goldens, manifest, require_shared, template_source

GOLDENS = goldens()


def _case_id(record: dict[str, Any]) -> str:
    options = ",".join(f"{k}={v}" for k, v in record["options"].items())
    return f"{record['template']}/{record['conversation']}/{options}"


def render_golden_case(record: dict[str, Any]) -> str:
    entry = manifest()[record["template"]]
    template = ChatTemplate(template_source(entry["name"]), special_tokens=entry["special_tokens"], name=entry["name"])
    conversation = conversations()[record["conversation"]]
    messages = copy.deepcopy(conversation["messages"])
    return template.render(messages, tools=conversation["tools"], now=GOLDEN_NOW, **record["options"])


@pytest.mark.parametrize("record", GOLDENS, ids=[_case_id(r) for r in GOLDENS])
def test_golden(record: dict[str, Any]) -> None:
    require_shared()
    if "error" in record:
        with pytest.raises(ChatcodecError) as caught:
            render_golden_case(record)
        # transformers' own wording survives inside ours (ours adds the template and line)
        assert record["error"]["message"].split("\n")[0] in str(caught.value)
    else:
        assert render_golden_case(record) == record["output"]


def test_every_golden_is_replayed() -> None:
    require_shared()
    assert len(GOLDENS) == len(manifest()) * 33
