"""Differential tests: random conversations rendered by chatcodec and by transformers 5.24 must agree.

For every corpus template, hypothesis generates conversations (alternating or not, with system prompts,
tool calls with dict or string arguments, tool results, reasoning, content parts, empty and hostile
text) and options (generation prompt, continuation, enable_thinking, tools). Both renderers must give
the same bytes, or both must fail, with transformers' message inside chatcodec's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatcodec import ChatcodecError, ChatTemplate

from .conftest import CORPUS, GOLDEN_NOW, manifest, require_shared, template_source
from .reference import reference_render, require_transformers

NAMES = sorted(manifest()) if CORPUS.is_dir() else []

SPICY = [
    "<|im_end|>", "<|eot_id|>", "</s>", "<think>", "</think>", "<tool_call>", "[INST]", "{{ 7*7 }}", "{% if %}",
    "\n", "\n\n", " ", "\t", "é", "한국어", "🙂", '"quoted"', "back\\slash", "CONTINUE_FINAL_MESSAGE_TAG",
]  # fmt: skip
text = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24),
    st.lists(st.sampled_from(SPICY) | st.text(max_size=6), max_size=4).map("".join),
)
names = st.sampled_from(["get_weather", "search", "f", "获取天气"])
arguments = st.dictionaries(
    st.sampled_from(["city", "unit", "q", "n"]), st.one_of(text, st.integers(), st.none()), max_size=3
)
call_ids = st.sampled_from(["call_1", "abc123XYZ", "0", "functions.f:0"])


@st.composite
def tool_call(draw: st.DrawFn) -> dict[str, Any]:
    args = draw(arguments)
    return {
        "id": draw(call_ids),
        "type": "function",
        "function": {"name": draw(names), "arguments": json.dumps(args) if draw(st.booleans()) else args},
    }


@st.composite
def message(draw: st.DrawFn, role: str) -> dict[str, Any]:
    content: Any = draw(text)
    if draw(st.integers(0, 5)) == 0:
        content = [{"type": "text", "text": draw(text)}]
    result: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        if draw(st.integers(0, 3)) == 0:
            result["tool_calls"] = draw(st.lists(tool_call(), min_size=1, max_size=2))
            result["content"] = draw(st.sampled_from([None, "", content]))
        if draw(st.integers(0, 3)) == 0:
            result["reasoning_content"] = draw(text)
    if role == "tool":
        result["tool_call_id"] = draw(call_ids)
        result["name"] = draw(names)
    return result


@st.composite
def conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    chat = [draw(message("system"))] if draw(st.booleans()) else []
    if draw(st.integers(0, 4)) == 0:  # sometimes any order at all: templates must reject it the same way
        roles = draw(st.lists(st.sampled_from(["system", "user", "assistant", "tool"]), min_size=1, max_size=5))
    else:
        turns = draw(st.integers(1, 3))
        roles = []
        for _ in range(turns):
            roles += ["user", "assistant"]
            if draw(st.integers(0, 3)) == 0:
                roles += ["tool"]
        roles = roles[: draw(st.integers(1, len(roles)))]
    chat += [draw(message(role)) for role in roles]
    return chat


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]


@st.composite
def options(draw: st.DrawFn) -> dict[str, Any]:
    chosen: dict[str, Any] = {"add_generation_prompt": draw(st.booleans())}
    if draw(st.integers(0, 3)) == 0:
        chosen["continue_final_message"] = True
    if draw(st.booleans()):
        chosen["enable_thinking"] = draw(st.booleans())
    if draw(st.booleans()):
        chosen["tools"] = TOOLS
    return chosen


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat=conversation(), chosen=options())
def test_same_as_transformers(name: str, chat: list[dict[str, Any]], chosen: dict[str, Any]) -> None:
    require_shared()
    require_transformers()
    entry = manifest()[name]
    source = template_source(name)
    expected, error = reference_render(
        source, entry["special_tokens"], json.loads(json.dumps(chat)), now=GOLDEN_NOW, **chosen
    )
    template = ChatTemplate(source, special_tokens=entry["special_tokens"], name=name)
    if error is None:
        assert template.render(chat, now=GOLDEN_NOW, **chosen) == expected
    else:
        with pytest.raises(ChatcodecError) as caught:
            template.render(chat, now=GOLDEN_NOW, **chosen)
        reason = error.split(": ", 1)[1].split("\n")[0]
        assert reason in str(caught.value)


def test_corpus_is_present_for_the_differential_run() -> None:
    require_shared()
    assert len(NAMES) == 56
