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

from chatcodec import ChatTemplate, load_template
from chatcodec.backends import GGUFTokenizer, ModelInfo, default_model_path
from chatcodec.server.chat import ChatService
from chatcodec.server.constrain import Frame, Thinking, response_constraint, thinking_for, tool_constraint
from chatcodec.server.grammar import GrammarBuilder
from chatcodec.server.protocol import ChatRequest, ResponseFormat

from .. import forced
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


def test_tool_choice_none_in_the_generic_protocol_never_opens_a_call(vocab: GGUFTokenizer) -> None:
    """The generic decoder skips every white space character (``\\s``) before a "{" that opens a call, so the answer
    of tool_choice "none" may begin with none of them: each is refused before "{", and the text decodes as no call."""
    from chatcodec.decoders import decoder
    from chatcodec.server.constrain import text_constraint

    grammar = text_constraint().grammar
    generic = decoder("generic")
    opened = '{"tool_calls": [{"name": "f", "arguments": {}}]}'
    for space in (c for c in map(chr, range(0x3001)) if c.isspace()):
        assert generic.decode(space + opened).tool_calls, repr(space)  # what the grammar must not let through
        assert not accepts(vocab, grammar, space + opened), repr(space)
    assert not accepts(vocab, grammar, opened)
    for answer in ("It is sunny.", "x{}", "\u00e9t\u00e9 {"):
        assert accepts(vocab, grammar, answer) and not generic.decode(answer).tool_calls, answer


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


# --- the token caps of tests/forced.py, against the grammars the server builds for the embedded model ----------


class _Quiet:
    """A backend that is never asked to generate: the plan's grammar is under test."""

    info = ModelInfo("quiet", context_length=8192)


@pytest.fixture(scope="module")
def smol() -> ChatTemplate:
    """The embedded model's own template (SmolLM2's, from the GGUF): its calls are the generic format's JSON."""
    return load_template(default_model_path())


def served_grammar(template: ChatTemplate, request: ChatRequest | None = None, **fields: Any) -> str:
    """The grammar the server constrains ``request`` (or a question with ``fields``) to."""
    if request is None:
        request = ChatRequest(messages=[{"role": "user", "content": "What is the temperature in Paris?"}], **fields)
    plan = ChatService(_Quiet(), template, model="quiet").plan(request)  # type: ignore[arg-type]
    assert plan.decoder.name == "generic" and plan.generation.constraint is not None
    return plan.generation.constraint.grammar


def weather_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "get_weather", "parameters": forced.weather_parameters()}}]


def test_the_bounds_read_from_small_grammars() -> None:
    """tests/forced.py's bounds on grammars small enough to count by hand."""
    grammar = 'root ::= "x" [a-c]{2,3} ( "y" | "zz" )? "\\"" ws\nws ::= | " "\n'
    assert forced.longest(grammar) == 8  # x, three letters, zz, the quote, a space
    assert forced.fewest_tokens(grammar, [b"x", b"a", b"ab", b'b"']) == 3  # x, ab, b"
    assert forced.fewest_tokens(grammar, [b"x", b"a", b"ab", b'b"', b'xaaa"']) == 1
    string = 'root ::= "{" [^"\\\\\\x7F\\x00-\\x1F]* "}"\n'  # any JSON string's characters, unescaped
    assert forced.longest(string) == math.inf
    assert forced.fewest_tokens(string, [b"{", b"}", "{\u00e9}".encode()]) == 1  # a character past ASCII
    with pytest.raises(ValueError, match="no text"):
        forced.fewest_tokens(string, [b'{"}', b"{\\}"])
    assert forced.longest('root ::= [^a] "\\u00e9"{2}\n') == 4 + 2 * 2


@pytest.mark.parametrize(
    ("tools", "choice"),
    [
        (forced.temperature_tools, "required"),
        (forced.temperature_tools, "get_current_temperature"),
        (forced.temperature_tools, "get_temperature_date"),
        (weather_tools, "required"),
        (weather_tools, "get_weather"),
    ],
)
def test_call_tokens_finish_any_forced_call_of_the_bounded_tools(smol: ChatTemplate, tools: Any, choice: str) -> None:
    """Every token is at least a byte of the call, and the end token is allowed once the call is whole: a forced
    call of tests/forced.py's tools, one at a time, ends within CALL_TOKENS whatever the model samples."""
    grammar = served_grammar(smol, tools=tools(), tool_choice=choice, parallel_tool_calls=False)
    assert forced.longest(grammar) + 1 <= forced.CALL_TOKENS
    # parallel calls have no bound (call after call): the tests that need a whole call ask for one at a time
    assert forced.longest(served_grammar(smol, tools=tools(), tool_choice="required")) == math.inf


def test_city_tokens_finish_any_answer_for_the_city_schema() -> None:
    """An answer for tests/forced.py's CITY schema ends within CITY_TOKENS, whatever the model samples."""
    grammar = response_constraint(ResponseFormat("json_schema", forced.CITY, "city")).grammar
    assert forced.longest(grammar) == 194 and forced.CITY_TOKENS >= 194 + 1


def test_the_longest_forced_call_is_one_the_grammar_takes(smol: ChatTemplate, vocab: GGUFTokenizer) -> None:
    """The bound is met: the longest call llama.cpp's grammar takes is the one tests/forced.py says."""
    grammar = served_grammar(smol, tools=forced.temperature_tools(), tool_choice="required", parallel_tool_calls=False)
    arguments = '{ "location" : "San Francisco, CA, USA" , "date" : "2024-09-30" , "unit" : "fahrenheit" }'
    text = f'{{ "tool_calls" : [ {{ "name" : "get_temperature_date" , "arguments" : {arguments} }} ] }}'
    assert accepts(vocab, grammar, text) and len(text.encode()) == forced.longest(grammar) == 164
    assert not accepts(vocab, grammar, text.replace("San Francisco, CA, USA", "San Francisco, California, USA"))


def test_cut_tokens_cut_any_forced_call_of_the_seeds_tools(smol: ChatTemplate, vocabulary: Any) -> None:
    """The cut-call tests ask for CUT_TOKENS tokens of a forced call of the seed's tools (free strings, parallel
    calls): fewer tokens than any whole call takes, and at least the bytes that name "tool_calls"."""
    grammar = served_grammar(smol, tools=temperature_tools(), tool_choice="required")
    fewest = forced.fewest_tokens(grammar, forced.pieces(vocabulary))
    assert fewest == 23 and fewest > forced.CUT_TOKENS
    assert grammar.startswith('root ::= "{" ws "\\"tool_calls\\""') and len('{ "tool_calls"') <= forced.CUT_TOKENS
