"""Whatever a caller passes, render() returns text or raises a ChatcodecError: never another exception."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatcodec import ChatcodecError, ChatTemplate, InputError, load_template

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
junk = json_values | st.sampled_from([object(), b"bytes", {1, 2}, datetime.date(2026, 1, 1), len, ...])
messages = st.one_of(
    junk,
    st.lists(junk, max_size=3),
    st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "name", "reasoning"]), junk), max_size=3
    ),
)


@pytest.mark.parametrize("name", ["chatml", "qwen3", "llama3", "gemma", "gpt-oss", "mistral", "seed-korean-toolcall"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chat=messages,
    tools=st.none() | st.lists(junk, max_size=2) | junk,
    documents=st.none() | st.lists(junk, max_size=2),
    extra=st.dictionaries(st.sampled_from(["enable_thinking", "date_string", "reasoning_effort", "bos_token"]), junk),
    options=st.fixed_dictionaries({"add_generation_prompt": st.booleans(), "continue_final_message": st.booleans()}),
)
def test_render_never_leaks_another_exception(
    name: str, chat: Any, tools: Any, documents: Any, extra: dict[str, Any], options: dict[str, Any]
) -> None:
    template = load_template(name)
    try:
        result = template.render(chat, tools=tools, documents=documents, **options, **extra)
    except ChatcodecError:
        return
    assert isinstance(result, str)


def test_self_referencing_messages() -> None:
    """A message that holds itself where the template reads is refused; where it cannot read (chatml reads
    role and content only), nothing of it is seen, on the first render as on the next ones."""
    message: dict[str, Any] = {"role": "user", "content": ["hi"]}
    message["content"].append(message)
    itself: dict[str, Any] = {"role": "user", "content": "hi", "name": "x"}
    itself["content"] = itself
    for held in (message, itself):
        for _ in range(2):
            with pytest.raises(InputError, match="refer to themselves"):
                load_template("chatml").render([held])
    elsewhere: dict[str, Any] = {"role": "user", "content": "hi"}
    elsewhere["self"] = elsewhere
    for template in (load_template("chatml"), ChatTemplate(load_template("chatml").source)):
        for _ in range(2):
            assert template.render([elsewhere]) == "<|im_start|>user\nhi<|im_end|>\n"


def test_now_must_be_a_datetime() -> None:
    with pytest.raises(InputError, match="now must be a datetime"):
        load_template("llama3").render([{"role": "user", "content": "hi"}], now="2026-11-29")  # type: ignore[arg-type]
