"""The grammars chatcodec serve constrains generation with, run by llama.cpp's own grammar sampler over
SmolLM2's vocabulary: a text is accepted when every one of its tokens is allowed in turn and the grammar may
end after the last (an end-of-generation token is allowed)."""

from __future__ import annotations

import ctypes
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatcodec import load_template
from chatcodec.backends import GGUFTokenizer, default_model_path
from chatcodec.server.constrain import Frame, Thinking, response_constraint, thinking_for, tool_constraint
from chatcodec.server.grammar import GrammarBuilder
from chatcodec.server.protocol import ResponseFormat

from ..conftest import CORPUS, require_shared
from .conftest import temperature_tools


@pytest.fixture(scope="module")
def vocab() -> GGUFTokenizer:
    return GGUFTokenizer(default_model_path())


def accepts(vocab: GGUFTokenizer, grammar: str, text: str) -> bool:
    import llama_cpp as cpp

    sampler = cpp.llama_sampler_init_grammar(vocab._vocab, grammar.encode(), b"root")
    assert sampler, grammar
    one = cpp.llama_token_data(0, 1.0, 0.0)
    array = cpp.llama_token_data_array(ctypes.pointer(one), 1, -1, False)

    def allowed(token: int) -> bool:
        one.id, one.logit = token, 1.0
        array.data, array.size = ctypes.pointer(one), 1
        cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        return not math.isinf(array.data[0].logit)

    try:
        for token in vocab.encode_plain(text)[0]:
            if not allowed(token):
                return False
            cpp.llama_sampler_accept(sampler, token)
        return allowed(vocab.added_tokens["<|im_end|>"])
    finally:
        cpp.llama_sampler_free(sampler)


MARKERS = ["<tool_call>", ">>>", "aab", "<|<", "[TOOL_CALLS]", "abab"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(MARKERS), st.lists(st.sampled_from(["a", "b", "<", ">", "|", "x", " ", "<tool_c", "all>"])))
def test_text_without_a_marker(vocab: GGUFTokenizer, marker: str, pieces: list[str]) -> None:
    g = GrammarBuilder()
    grammar = g.build(g.text_without(marker))
    text = "".join(pieces)
    assert accepts(vocab, grammar, text) == (marker not in text), (marker, text)
    assert accepts(vocab, grammar, text + marker) is False


def call(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": arguments})


def test_auto_with_a_marker_that_repeats_its_first_character(vocab: GGUFTokenizer) -> None:
    """A format whose calls open with ">>>" (functionary's): text, or text then calls, never a stray marker."""
    frame = Frame(">>>", "\n", "")
    constraint = tool_constraint("functionary", temperature_tools(), "auto", parallel=True, frame=frame)
    assert constraint is not None
    grammar = constraint.grammar
    assert accepts(vocab, grammar, "It is 20 degrees > 18 >> 17.")
    assert accepts(vocab, grammar, 'Let me look.>>>get_current_temperature\n{"location": "Paris"}')
    assert not accepts(vocab, grammar, "Sure >>> here")  # a marker must open a well-formed call
    assert not accepts(vocab, grammar, '>>>get_weather\n{"location": "Paris"}')  # not a tool


def test_response_format_after_a_thought(vocab: GGUFTokenizer) -> None:
    require_shared()
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = ResponseFormat("json_schema", schema, "city")
    answer = '{"city": "Paris"}'
    # Qwen3.5's prompt opens a think block: the answer closes it, then the JSON
    qwen35 = load_template(CORPUS / "templates" / "Qwen3.5-4B.jinja")
    opened = thinking_for(qwen35, None)
    assert opened == Thinking("<think>", "</think>", opened=True)
    grammar = response_constraint(fmt, opened).grammar
    assert accepts(vocab, grammar, "The capital.\n</think>\n\n" + answer)
    assert not accepts(vocab, grammar, answer)
    assert not accepts(vocab, grammar, "Hmm.</think>\n\nParis")
    # with thinking off the prompt closes it: the JSON alone
    assert thinking_for(qwen35, False) is None
    assert accepts(vocab, response_constraint(fmt, None).grammar, answer)
    # Qwen3's prompt opens none, but the model may think first
    optional = thinking_for(load_template("qwen3"), None)
    assert optional == Thinking("<think>", "</think>", opened=False)
    grammar = response_constraint(fmt, optional).grammar
    assert accepts(vocab, grammar, "<think>\nThe capital.\n</think>\n\n" + answer)
    assert accepts(vocab, grammar, answer)
    assert not accepts(vocab, grammar, "<think>\nno end " + answer)
    # a template that knows no reasoning: JSON only
    assert thinking_for(load_template("chatml"), None) is None


def test_required_calls_after_a_thought(vocab: GGUFTokenizer) -> None:
    opened = Thinking("<think>", "</think>", opened=True)
    constraint = tool_constraint(
        "generic", temperature_tools(), "required", parallel=False, frame=None, thinking=opened
    )
    assert constraint is not None and constraint.json_schema is None
    arguments = {"location": "Paris, France"}
    calls = '{"tool_calls": [' + call("get_current_temperature", arguments) + "]}"
    assert accepts(vocab, constraint.grammar, "I need the tool.</think>\n" + calls)
    assert not accepts(vocab, constraint.grammar, "I need the tool.</think>\nIt is sunny.")
