"""The decoder API and the behaviours the parse vectors do not pin down."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chatcodec.decoders import Delta, ToolCall, ToolCallDelta, decoder, formats
from chatcodec.exceptions import ChatcodecError, DecodeError

from .helpers import rebuild

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "zip": {"type": "string"},
                "units": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
        },
    },
}


def stream_text(fmt: str, text: str, **options: object) -> list[Delta]:
    stream = decoder(fmt, **options).stream()
    deltas = []
    for ch in text:
        deltas += stream.feed(ch)
    return deltas + stream.finish()


# -- options -------------------------------------------------------------------------------------


def test_unknown_format_suggests_close_names() -> None:
    with pytest.raises(DecodeError, match="Did you mean 'hermes'"):
        decoder("hermez")


def test_bad_options_raise_decode_error() -> None:
    with pytest.raises(DecodeError, match="reasoning_format"):
        decoder("hermes", reasoning_format="deepseek-legacy")
    with pytest.raises(DecodeError, match="tag option"):
        decoder("hermes", tag="<x>")
    with pytest.raises(DecodeError, match="list of OpenAI tool dicts"):
        decoder("hermes", tools="get_weather")
    with pytest.raises(DecodeError, match="function name"):
        decoder("hermes", tools=[{"type": "function", "function": {}}])
    with pytest.raises(TypeError):
        decoder("hermes", reasoning="on")  # type: ignore[call-arg]


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(DecodeError, ValueError)


def test_every_format_decodes_plain_text() -> None:
    for fmt in formats():
        message = decoder(fmt, thinking_forced_open=False).decode("Just an answer.")
        assert message.content == "Just an answer." and not message.tool_calls, fmt
        # Formats whose prompt opens the think block by default read untagged text as reasoning.
        default = decoder(fmt).decode("Just an answer.")
        assert default.content or default.reasoning_content == "Just an answer.", fmt


# -- the message and its OpenAI form --------------------------------------------------------------


def test_to_openai_message_shape() -> None:
    message = decoder("kimi_k2").decode(
        "<think>plan</think>Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
        '<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|><|tool_calls_section_end|>'
    )
    assert message.to_openai() == {
        "role": "assistant",
        "content": "Sure.",
        "reasoning_content": "plan",
        "tool_calls": [{"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
    }


ID_SHAPES = {"openai": re.compile(r"call_[A-Za-z0-9]{24}"), "mistral": re.compile(r"[A-Za-z0-9]{9}")}


def test_made_ids_are_unique_and_shaped_per_family() -> None:
    """A growing history never repeats an id: every call of every turn gets a fresh one."""
    hermes = '<tool_call>{"name": "f", "arguments": {}}</tool_call>' * 3
    mistral = '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]'
    seen: set[str] = set()
    for fmt, text, shape in [("hermes", hermes, "openai"), ("mistral_pre_v11", mistral, "mistral")]:
        for _ in range(200):
            ids = [c["id"] for c in decoder(fmt).decode(text).to_openai()["tool_calls"]]
            assert all(ID_SHAPES[shape].fullmatch(i) for i in ids), ids
            assert not seen & set(ids)
            seen |= set(ids)
    made = [ToolCall("f", {}, "{}").id for _ in range(3)]
    assert len(set(made)) == 3 and all(ID_SHAPES["openai"].fullmatch(i) for i in made)


def test_the_streamed_id_is_the_message_id() -> None:
    stream = decoder("hermes").stream()
    deltas = stream.feed('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>') + stream.finish()
    head = next(d.tool_call for d in deltas if d.tool_call is not None)
    assert head.id == stream.message.tool_calls[0].id


def test_model_ids_are_kept() -> None:
    kimi = decoder("kimi_k2").decode(
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:3<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|>"
    )
    assert kimi.tool_calls[0].id == "functions.get_weather:3"
    v13 = decoder("mistral_v13").decode('[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{"x": 1}')
    assert v13.tool_calls[0].id == "a1b2c3d4e"


def test_delta_openai_shapes() -> None:
    assert Delta(reasoning_content="x").to_openai() == {"reasoning_content": "x"}
    head = Delta(tool_call=ToolCallDelta(2, "call_abc", "f", "{"))
    assert head.to_openai() == {
        "tool_calls": [{"index": 2, "id": "call_abc", "type": "function", "function": {"name": "f", "arguments": "{"}}]
    }
    assert Delta(tool_call=ToolCallDelta(2, arguments="}")).to_openai() == {
        "tool_calls": [{"index": 2, "function": {"arguments": "}"}}]
    }


def test_arguments_are_streamed_verbatim() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"s": "caf\\u00e9 \\"q\\"",   "n": [1,2]}}</tool_call>'
    (call,) = decoder("hermes").decode(text).tool_calls
    assert call.arguments_json == '{"s": "caf\\u00e9 \\"q\\"",   "n": [1,2]}'
    assert call.arguments == {"s": 'café "q"', "n": [1, 2]}
    assert call.raw == text


def test_arguments_given_as_a_json_string_are_not_double_encoded() -> None:
    deltas = stream_text("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": \\"\\u00e9\\"}"}</tool_call>')
    assert rebuild(deltas).calls == [("f", None, '{"a": "é"}')]


def test_an_id_after_the_arguments_comes_too_late_and_stays_in_raw() -> None:
    """The first delta announces the call with its id; an OpenAI client must never see a second id."""
    text = '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abcdefghi"}]'
    deltas = stream_text("mistral_nemo", text)
    ids = [d.tool_call.id for d in deltas if d.tool_call is not None]
    assert ids[0] and ID_SHAPES["mistral"].fullmatch(ids[0]) and ids[1:] == [None] * (len(ids) - 1)
    (call,) = decoder("mistral_nemo").decode(text).tool_calls
    assert call.id != "abcdefghi" and '"id": "abcdefghi"' in call.raw
    early = decoder("mistral_nemo").decode('[TOOL_CALLS][{"id": "abcdefghi", "name": "f", "arguments": {"a": 1}}]')
    assert early.tool_calls[0].id == "abcdefghi"


def test_nested_arguments_in_bare_json_formats() -> None:
    nested = {"a": {"b": [1, {"c": 2}], "d": [[1], []]}}
    args = json.dumps(nested)
    for fmt, text in [
        ("llama3_json", f'{{"name": "f", "parameters": {args}}}'),
        ("json_bare", f'{{"name": "f", "arguments": {args}}}'),
        ("hermes", f'{{"name": "f", "arguments": {args}}}'),
        ("json_list", f'[{{"name": "f", "arguments": {args}}}]'),
        ("generic_template_tag", f'<tool_call>{{"name": "f", "arguments": {args}}}</tool_call>'),
    ]:
        (call,) = decoder(fmt).decode(text).tool_calls
        assert call.arguments == nested and call.error is None, fmt


def test_a_truncated_call_is_flagged_and_keeps_its_text() -> None:
    message = decoder("hermes").decode('<tool_call>{"name": "f", "arguments": {"a": "tru')
    assert message.tool_calls == ()
    (call,) = message.invalid_tool_calls
    assert call.error and call.arguments == '{"a": "tru' and call.raw.startswith("<tool_call>")
    openai = message.to_openai()
    assert "tool_calls" not in openai
    assert openai["invalid_tool_calls"] == [
        {"index": 0, "id": call.id, "name": "f", "arguments": '{"a": "tru', "raw": call.raw, "error": call.error}
    ]


# -- whitespace and reasoning policy --------------------------------------------------------------


def test_whitespace_only_content_is_null_but_content_is_verbatim() -> None:
    d = decoder("hermes")
    assert d.decode('\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\n').content is None
    assert d.decode('  Hi\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\n').content == "  Hi\n\n"


def test_reasoning_is_stripped_and_stays_out_of_content() -> None:
    message = decoder("hermes").decode("<think>\n  plan \n</think>\n\nAnswer")
    assert (message.reasoning_content, message.content) == ("plan", "\n\nAnswer")


def test_reasoning_format_none_keeps_tags_in_content() -> None:
    assert decoder("hermes", reasoning_format="none").decode("<think>a</think>b").content == "<think>a</think>b"
    harmony = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>hi"
    message = decoder("gpt_oss", reasoning_format="none").decode(harmony)
    assert message.reasoning_content is None and message.content == "<|channel|>analysis<|message|>think<|end|>hi"


def test_thinking_defaults_follow_enable_thinking() -> None:
    assert decoder("reasoning_qwen3").decode("hmm").reasoning_content == "hmm"
    assert decoder("reasoning_qwen3", enable_thinking=False).decode("hmm").content == "hmm"
    assert decoder("deepseek_v3_1", enable_thinking=True).decode("a</think>b").reasoning_content == "a"
    assert decoder("hermes", enable_thinking=True).decode("a</think>b").content == "a</think>b"


def test_a_template_option_sets_the_think_state(tmp_path: Path) -> None:
    from chatcodec import ChatTemplate

    source = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    )
    assert decoder("hermes", template=ChatTemplate(source)).decode("a</think>b").reasoning_content == "a"
    # a path or a built-in name is loaded: this file's generation prompt opens <think>, qwen3's does not
    (tmp_path / "qwq_like.jinja").write_text(source, encoding="utf-8")
    assert decoder("hermes", template=tmp_path / "qwq_like.jinja").decode("a</think>b").reasoning_content == "a"
    assert decoder("hermes", template=str(tmp_path / "qwq_like.jinja")).decode("a</think>b").reasoning_content == "a"
    assert decoder("hermes", template="qwen3").decode("a</think>b").content == "a</think>b"


def test_bad_templates_raise_decode_errors() -> None:
    with pytest.raises(DecodeError, match="template must be a ChatTemplate, a built-in template name or a path"):
        decoder("hermes", template=5)
    with pytest.raises(ChatcodecError, match="No chat template at 'no-such-template'"):
        decoder("hermes", template="no-such-template")


def test_calls_inside_reasoning_are_not_run_unless_the_format_says_so() -> None:
    hermes = decoder("hermes", thinking_forced_open=True)
    text = 'draft <tool_call>{"name": "f", "arguments": {}}</tool_call></think>done'
    assert hermes.decode(text).tool_calls == ()
    # Qwen3.5 and Kimi K2 open real calls inside their thinking: that ends the reasoning.
    qwen = decoder("qwen3_coder", thinking_forced_open=True).decode(
        "I will look.\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"
    )
    assert (qwen.reasoning_content, qwen.tool_calls[0].arguments) == ("I will look.", {"a": 1})
    kimi = decoder("kimi_k2", thinking_forced_open=True).decode(
        "plan<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|>"
    )
    assert kimi.reasoning_content == "plan" and kimi.tool_calls[0].name == "f"


def test_a_mention_of_the_tool_tag_in_reasoning_is_not_an_implicit_end() -> None:
    text = "Use <tool_call> then a function.</think>ok"
    message = decoder("qwen3_coder", thinking_forced_open=True).decode(text)
    assert message.reasoning_content == "Use <tool_call> then a function." and message.content == "ok"


# -- tool names ------------------------------------------------------------------------------------


def test_undeclared_tools_stay_content() -> None:
    d = decoder("hermes", tools=[WEATHER_TOOL, "search"])
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert d.decode(text).content == text
    assert d.decode(text.replace("rm_rf", "search")).tool_calls[0].name == "search"


# -- XML-style values ------------------------------------------------------------------------------


def test_xml_values_are_typed_from_the_tool_schema() -> None:
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n1984\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n<parameter=zip>\n02134\n</parameter>\n<parameter=units>\nNone\n</parameter>\n"
        "<parameter=extra>\n[1, 2]\n</parameter>\n</function>\n</tool_call>"
    )
    (call,) = decoder("qwen3_coder", tools=[WEATHER_TOOL]).decode(text).tool_calls
    # units is anyOf[string, null]: the first non-null type is string, so "None" stays text (vLLM's rule)
    assert call.arguments == {"city": "1984", "days": 3, "zip": "02134", "units": "None", "extra": [1, 2]}
    assert call.arguments_json == json.dumps(call.arguments, ensure_ascii=False)


def test_xml_closing_tag_inside_a_value_needs_its_continuation() -> None:
    text = (
        "<tool_call>\n<function=write>\n<parameter=text>\nsay </parameter> literally\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    (call,) = decoder("qwen3_coder").decode(text).tool_calls
    assert call.arguments == {"text": "say </parameter> literally"}


def test_xml_string_values_stream_before_they_close() -> None:
    stream = decoder("qwen3_coder").stream()
    deltas = stream.feed("<tool_call>\n<function=write>\n<parameter=text>\nhello wor")
    assert rebuild(deltas).calls == [("write", None, '{"text": "hello wor')]


def test_minimax_and_dsml_blocks_hold_several_calls() -> None:
    minimax = decoder("minimax_m2").decode(
        '<minimax:tool_call><invoke name="a"><parameter name="x">1</parameter></invoke>'
        '<invoke name="b"></invoke></minimax:tool_call>'
    )
    assert [(c.name, c.arguments) for c in minimax.tool_calls] == [("a", {"x": 1}), ("b", {})]
    dsml = decoder("deepseek_dsml").decode(
        '<｜DSML｜function_calls><｜DSML｜invoke name="a"><｜DSML｜parameter name="n" string="true">5'
        "</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>"
    )
    assert dsml.tool_calls[0].arguments == {"n": "5"}


def test_glm_call_without_arguments() -> None:
    assert decoder("glm45").decode("<tool_call>ping</tool_call>").tool_calls[0].arguments == {}


# -- other families --------------------------------------------------------------------------------


def test_gemma4_calls_and_reasoning() -> None:
    message = decoder("gemma4").decode(
        '<|channel>thought\nhmm\n<channel|>Ok<|tool_call>call:f{city:<|"|>Paris, "FR"<|"|>,n:2,'
        'o:{<|"|>k<|"|>:[true,null]}}<tool_call|>'
    )
    assert message.reasoning_content == "hmm" and message.content == "Ok"
    assert message.tool_calls[0].arguments == {"city": 'Paris, "FR"', "n": 2, "o": {"k": [True, None]}}


def test_command_r_plus_action_block() -> None:
    message = decoder("command_r_plus").decode(
        'Let me look.\nAction:\n```json\n[\n    {\n        "tool_name": "f",\n'
        '        "parameters": {"a": 1}\n    }\n]```'
    )
    assert message.content == "Let me look.\n" and message.tool_calls[0].arguments == {"a": 1}


def test_apriel_reasons_first() -> None:
    message = decoder("apriel").decode("Think.\n[BEGIN FINAL RESPONSE]\nDone.\n[END FINAL RESPONSE]")
    assert (message.reasoning_content, message.content) == ("Think.", "\nDone.\n")


def test_python_code_calls() -> None:
    llama = decoder("llama3_json").decode("<|python_tag|>print('hi')\nx = 1<|eom_id|>")
    assert llama.tool_calls[0].name == "python" and llama.tool_calls[0].arguments == {"code": "print('hi')\nx = 1"}
    functionary = decoder("functionary_v3_2").decode("all\nSure.>>>python\nprint(2)")
    assert functionary.content == "Sure." and functionary.tool_calls[0].arguments == {"code": "print(2)"}


def test_lfm2_python_form_and_pythonic_literals() -> None:
    message = decoder("lfm2").decode("<|tool_call_start|>[f(a='x\\'y', b=(1, 2), c=None)]<|tool_call_end|>")
    assert message.tool_calls[0].arguments == {"a": "x'y", "b": [1, 2], "c": None}


def test_qwen_agent_code_block() -> None:
    text = '<tool_call>\n{"name": "run", "arguments": {"lang": "py"}}\n<code>\nx = "1"\n</code>\n</tool_call>'
    (call,) = decoder("hermes_qwen_agent_code").decode(text).tool_calls
    assert call.arguments == {"lang": "py", "code": '\nx = "1"\n'}


def test_harmony_builtin_recipient_and_preamble() -> None:
    message = decoder("gpt_oss").decode(
        "<|channel|>commentary<|message|>Looking it up.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.lookup <|constrain|>json<|message|>{"q": 1}<|call|>'
    )
    assert message.content == "Looking it up." and message.tool_calls[0].arguments == {"q": 1}


def test_generic_response_string_is_decoded_as_it_streams() -> None:
    deltas = stream_text("generic", '{"response": "caf\\u00e9 \\ud83c\\udf0d \\"ok\\""}')
    assert rebuild(deltas).content == 'café 🌍 "ok"'


# -- streams -----------------------------------------------------------------------------------------


def test_bytes_split_inside_characters() -> None:
    data = '<tool_call>{"name": "f", "arguments": {"s": "東京 🌍"}}</tool_call>'.encode()
    stream = decoder("hermes").stream()
    deltas = [d for k in range(len(data)) for d in stream.feed(data[k : k + 1])] + stream.finish()
    assert rebuild(deltas).calls == [("f", None, '{"s": "東京 🌍"}')]


def test_feeding_a_finished_stream_is_an_error() -> None:
    stream = decoder("hermes").stream()
    stream.finish()
    assert stream.finish() == []
    with pytest.raises(DecodeError, match="finished"):
        stream.feed("more")
    with pytest.raises(DecodeError, match="feed\\(\\) takes model output as str or UTF-8 bytes, not int"):
        decoder("hermes").stream().feed(42)  # type: ignore[arg-type]


def test_trace_accounts_for_every_character() -> None:
    text = '<think>a</think>Hi <tool_call>{"name": "f", "arguments": {}}</tool_call> bye'
    stream = decoder("hermes").stream(trace=True)
    stream.feed(text)
    stream.finish()
    assert "".join(span.text for span in stream.trace) == text
    assert {span.kind for span in stream.trace} == {"markup", "reasoning", "content", "call"}
