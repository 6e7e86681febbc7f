"""Capabilities against what transformers renders: one test per flag, over every corpus template.

The probes (``chatcodec.capabilities``) render their own needle conversations through chatcodec. Each
test here decides the same question independently, from the goldens (transformers' own renders of the
corpus conversations, in ``shared/corpus/goldens.jsonl``) and, where no golden conversation asks it
(two system messages, documents, two users in a row, the argument forms), from transformers itself
(``tests/reference.py``) rendering conversations of its own. The two must agree for every template.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from functools import cache
from typing import Any

import pytest

from chatcodec import ChatTemplate
from chatcodec.capabilities import THINK_TAGS, Capabilities, think_state_of

from .conftest import CORPUS, GOLDEN_NOW, conversations, goldens, manifest, require_shared, template_source
from .reference import reference_render, require_transformers

NAMES = sorted(manifest()) if CORPUS.is_dir() else ["no-shared-corpus"]


@cache
def _golden_index() -> dict[tuple[str, str, str], str | None]:
    """(template, conversation, options as JSON) -> transformers' output, or None where it raised."""
    return {
        (r["template"], r["conversation"], json.dumps(r["options"], sort_keys=True)): r.get("output") for r in goldens()
    }


def golden(name: str, conversation: str, **options: Any) -> str | None:
    key = (name, conversation, json.dumps(options, sort_keys=True))
    index = _golden_index()
    assert key in index, f"no golden for {key}"
    return index[key]


@cache
def template(name: str) -> ChatTemplate:
    require_shared()
    entry = manifest()[name]
    return ChatTemplate(template_source(name), special_tokens=entry["special_tokens"], name=name)


def caps(name: str) -> Capabilities:
    return template(name).capabilities


def reference(name: str, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    """transformers' render of ``messages`` with the template, or None where it raised."""
    require_transformers()
    entry = manifest()[name]
    kwargs.setdefault("now", GOLDEN_NOW)
    output, error = reference_render(template_source(name), entry["special_tokens"], copy.deepcopy(messages), **kwargs)
    return None if error else output


def shows(text: str | None, *needles: str) -> bool:
    return text is not None and all(n in text for n in needles)


# -- the flags the goldens decide ------------------------------------------------------------------------

TOOL_CONVERSATIONS = (
    "tools_single_call",
    "tools_roundtrip",
    "tools_roundtrip_short_ids",
    "tools_null_content_string_args",
)
FIRST, SECOND = "get_current_temperature", "get_temperature_date"


def defined_count(name: str, tool: str) -> int:
    """How often the tool definitions alone show a tool's name (tools_query has no calls)."""
    return (golden(name, "tools_query", add_generation_prompt=True) or "").count(tool)


def golden_calls(name: str, both: bool) -> bool:
    """A golden tool-call conversation shows the call's name beyond the definitions (both calls if asked)."""
    for conv in TOOL_CONVERSATIONS:
        text = golden(name, conv, add_generation_prompt=True)
        if text is None:
            continue
        first = text.count(FIRST) > defined_count(name, FIRST)
        second = text.count(SECOND) > defined_count(name, SECOND)
        if first and (second or not both):
            return True
    return False


def string_argument_calls(ids: tuple[str, str] = ("k1L2m3N4o", "P5q6R7s8T")) -> list[dict[str, Any]]:
    """tools_roundtrip_short_ids with "" content and the arguments as JSON strings: the form no golden has."""
    messages = copy.deepcopy(conversations()["tools_roundtrip_short_ids"]["messages"])
    for call, call_id in zip(messages[1]["tool_calls"], ids, strict=True):
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
        call["id"] = call_id
    for result, call_id in zip(messages[2:], ids, strict=True):
        result["tool_call_id"] = call_id
    return messages


def tools_of(conversation: str) -> Any:
    return conversations()[conversation]["tools"]


def reference_calls(name: str, both: bool) -> bool:
    text = reference(name, string_argument_calls(), tools=tools_of("tools_roundtrip"), add_generation_prompt=True)
    if text is None:
        return False
    return text.count(FIRST) > defined_count(name, FIRST) and (
        not both or text.count(SECOND) > defined_count(name, SECOND)
    )


@pytest.mark.parametrize("name", NAMES)
def test_system(name: str) -> None:
    expected = shows(golden(name, "system_user", add_generation_prompt=False), "You are a helpful assistant.")
    assert caps(name).system == expected


@pytest.mark.parametrize("name", NAMES)
def test_tools(name: str) -> None:
    expected = shows(golden(name, "tools_query", add_generation_prompt=True), FIRST)
    assert caps(name).tools == expected


@pytest.mark.parametrize("name", NAMES)
def test_tool_calls(name: str) -> None:
    """Calls show in a golden tool conversation, or (templates that need string arguments and content) in
    transformers' render of the one form the goldens lack: JSON-string arguments with "" content."""
    expected = golden_calls(name, both=False) or reference_calls(name, both=False)
    assert caps(name).tool_calls == expected


@pytest.mark.parametrize("name", NAMES)
def test_parallel_tool_calls(name: str) -> None:
    expected = golden_calls(name, both=True) or reference_calls(name, both=True)
    assert caps(name).parallel_tool_calls == expected


@pytest.mark.parametrize("name", NAMES)
def test_tool_call_ids(name: str) -> None:
    expected = (
        shows(
            golden(name, "tools_roundtrip", add_generation_prompt=True),
            "chatcmpl-tool-924d705adb044ff88e0ef3afdd155f15",
        )
        or shows(golden(name, "tools_roundtrip_short_ids", add_generation_prompt=True), "a1B2c3D4e")
        or shows(
            reference(name, string_argument_calls(), tools=tools_of("tools_roundtrip"), add_generation_prompt=True),
            "k1L2m3N4o",
        )
    )
    assert caps(name).tool_call_ids == expected


@pytest.mark.parametrize("name", NAMES)
def test_tool_responses(name: str) -> None:
    """tools_roundtrip (or another golden tool conversation) renders the tool result."""
    expected = any(shows(golden(name, conv, add_generation_prompt=True), "25.9") for conv in TOOL_CONVERSATIONS[1:])
    expected = expected or shows(golden(name, "tools_single_call", add_generation_prompt=True), "26.1")
    expected = expected or shows(
        reference(name, string_argument_calls(), tools=tools_of("tools_roundtrip"), add_generation_prompt=True), "25.9"
    )
    assert caps(name).tool_responses == expected


@pytest.mark.parametrize("name", NAMES)
def test_reasoning(name: str) -> None:
    reasoning = conversations()["reasoning_final_turn"]["messages"][-1]["reasoning_content"]
    expected = shows(golden(name, "reasoning_final_turn", add_generation_prompt=False), reasoning)
    assert caps(name).reasoning == expected


@pytest.mark.parametrize("name", NAMES)
def test_generation_prompt(name: str) -> None:
    with_gp = golden(name, "single_user", add_generation_prompt=True)
    without = golden(name, "single_user", add_generation_prompt=False)
    expected = with_gp is not None and without is not None and with_gp != without
    assert caps(name).generation_prompt == expected


@pytest.mark.parametrize("name", NAMES)
def test_continue_final_message(name: str) -> None:
    partial = conversations()["ends_with_assistant"]["messages"][-1]["content"]
    text = golden(name, "ends_with_assistant", add_generation_prompt=False, continue_final_message=True)
    assert caps(name).continue_final_message == (text is not None and text.endswith(partial))


@pytest.mark.parametrize("name", NAMES)
def test_content_parts(name: str) -> None:
    """content_parts renders every part's text, and never the parts themselves (a printed list)."""
    text = golden(name, "content_parts", add_generation_prompt=True)
    expected = shows(text, "Describe this in one word:", "sunrise", "Dawn.", "Thanks!") and "'text'" not in (text or "")
    if golden(name, "system_user", add_generation_prompt=False) is None:
        # the golden conversation opens with a system message this template rejects: ask without it
        messages = conversations()["content_parts"]["messages"][1:]
        text = reference(name, messages, add_generation_prompt=True)
        expected = shows(text, "Describe this in one word:", "sunrise", "Dawn.", "Thanks!") and "'text'" not in text
    assert caps(name).content_parts == expected


# -- the flags no golden conversation asks: transformers renders a conversation of the test's own ------


@pytest.mark.parametrize("name", NAMES)
def test_multiple_system(name: str) -> None:
    messages = [
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "Name a river."},
        {"role": "assistant", "content": "The Loire."},
        {"role": "system", "content": "From now on, answer in French."},
        {"role": "user", "content": "Name a mountain."},
    ]
    expected = shows(reference(name, messages, add_generation_prompt=True), "one sentence", "in French")
    assert caps(name).multiple_system == expected


@pytest.mark.parametrize("name", NAMES)
def test_documents(name: str) -> None:
    documents = [{"title": "Paris", "text": "Paris had 2.1 million inhabitants in 2020."}]
    user = [{"role": "user", "content": "How many people live in Paris?"}]
    expected = shows(reference(name, user, documents=documents, add_generation_prompt=True), "2.1 million inhabitants")
    assert caps(name).documents == expected


@pytest.mark.parametrize("name", NAMES)
def test_requires_alternation(name: str) -> None:
    alternating = conversations()["multi_turn_no_system"]["messages"]
    doubled = [{"role": "user", "content": "Hi there!"}, {"role": "user", "content": "Tell me a joke."}]
    expected = reference(name, alternating, add_generation_prompt=True) is not None and not shows(
        reference(name, doubled, add_generation_prompt=True), "Hi there!", "Tell me a joke."
    )
    assert caps(name).requires_alternation == expected


@pytest.mark.parametrize("name", NAMES)
def test_requires_short_call_ids(name: str) -> None:
    """The goldens with OpenAI ids fail where the same conversation with nine-character ids renders."""
    short = golden(name, "tools_roundtrip_short_ids", add_generation_prompt=True)
    long = golden(name, "tools_roundtrip", add_generation_prompt=True)
    if short is None:  # no golden shows the short form: ask transformers with string arguments
        short = reference(name, string_argument_calls(), tools=tools_of("tools_roundtrip"), add_generation_prompt=True)
        messages = string_argument_calls(("call_924d705adb044ff88e0e", "call_7e30313081944b11b6e5"))
        long = reference(name, messages, tools=tools_of("tools_roundtrip"), add_generation_prompt=True)
    expected = short is not None and short.count(FIRST) > defined_count(name, FIRST) and long is None
    assert caps(name).requires_short_call_ids == expected


def call_turns(arguments: Any, content: str | None) -> list[dict[str, Any]]:
    call = {"id": "u1V2w3X4y", "type": "function", "function": {"name": FIRST, "arguments": arguments}}
    assistant: dict[str, Any] = {"role": "assistant", "tool_calls": [call]}
    if content is not None:
        assistant["content"] = content
    return [
        {"role": "user", "content": "How warm is it in Lyon?"},
        assistant,
        {"role": "tool", "content": "18 degrees", "tool_call_id": "u1V2w3X4y"},
    ]


def shows_arguments(name: str, as_string: bool, content: str | None = "") -> bool:
    """transformers renders the call with "Lyon, France" as written: not escaped, not a Python dict."""
    arguments: Any = {"location": "Lyon, France"}
    if as_string:
        arguments = json.dumps(arguments)
    text = reference(name, call_turns(arguments, content), tools=tools_of("tools_query"), add_generation_prompt=True)
    if text is None or text.count(FIRST) <= defined_count(name, FIRST):
        return False
    turns = text[text.rfind("How warm is it in Lyon?") :]  # the definitions may print schemas as Python values
    return "Lyon, France" in turns and '\\"location' not in turns and "'location'" not in turns


@pytest.mark.parametrize("name", NAMES)
def test_requires_object_arguments(name: str) -> None:
    expected = shows_arguments(name, as_string=False) and not shows_arguments(name, as_string=True)
    assert caps(name).requires_object_arguments == expected
    if expected:  # the goldens agree: the OpenAI wire form (string arguments) fails or prints escaped JSON
        text = golden(name, "tools_null_content_string_args", add_generation_prompt=True)
        assert text is None or '\\"location' in text


@pytest.mark.parametrize("name", NAMES)
def test_requires_string_arguments(name: str) -> None:
    expected = shows_arguments(name, as_string=True) and not shows_arguments(name, as_string=False)
    assert caps(name).requires_string_arguments == expected
    if expected:  # the goldens agree: dict arguments fail, or print as a Python dict
        text = golden(name, "tools_roundtrip", add_generation_prompt=True)
        assert text is None or "{'location': 'San Francisco, CA, USA'" in text


@pytest.mark.parametrize("name", NAMES)
def test_requires_non_null_content(name: str) -> None:
    def calls(content: str | None) -> bool:
        return any(
            shows_arguments(name, as_string, content) or shows_any_call(name, as_string, content)
            for as_string in (False, True)
        )

    expected = calls("") and not calls(None)
    assert caps(name).requires_non_null_content == expected
    if expected and not caps(name).requires_object_arguments:  # the goldens agree
        assert golden(name, "tools_null_content_string_args", add_generation_prompt=True) is None


def shows_any_call(name: str, as_string: bool, content: str | None) -> bool:
    arguments: Any = {"location": "Lyon, France"}
    if as_string:
        arguments = json.dumps(arguments)
    text = reference(name, call_turns(arguments, content), tools=tools_of("tools_query"), add_generation_prompt=True)
    return text is not None and text.count(FIRST) > defined_count(name, FIRST)


def test_every_boolean_has_a_test() -> None:
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert set(Capabilities.flags()) <= tested


# -- the rest of the object ------------------------------------------------------------------------------


def generation_prompt(name: str, **kwargs: Any) -> str | None:
    user = conversations()["single_user"]["messages"]
    with_gp = reference(name, user, add_generation_prompt=True, **kwargs)
    without = reference(name, user, add_generation_prompt=False, **kwargs)
    if with_gp is None or without is None:
        return None
    common = 0
    while common < min(len(with_gp), len(without)) and with_gp[common] == without[common]:
        common += 1
    return with_gp[common:]


@pytest.mark.parametrize("name", NAMES)
def test_think_states(name: str) -> None:
    """The generation prompt transformers renders ends inside a think block, after one, or neither."""
    found = caps(name)
    for enable_thinking in (None, True, False):
        kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        prompt = generation_prompt(name, **kwargs)
        expected = think_state_of(prompt) if prompt is not None else "none"
        assert found.think_state_for(enable_thinking) == expected, (enable_thinking, prompt)


def test_think_states_seen() -> None:
    """The corpus exercises each state: open, closed, and a template that opens only when asked."""
    require_shared()
    states = {(caps(n).think_state, caps(n).think_state_enabled, caps(n).think_state_disabled) for n in NAMES}
    assert ("open", "open", "closed") in states  # GLM-4.7-Flash, Qwen3.5: open unless thinking is off
    assert ("none", "none", "closed") in states  # Qwen3: the model opens it; off writes an empty block
    assert ("closed", "open", "closed") in states  # DeepSeek V3.2: closed unless asked
    assert caps("Qwen-Qwen3-0.6B").think_tags == ("<think>", "</think>")
    assert caps("Cohere2MoE").think_tags == ("<|START_THINKING|>", "<|END_THINKING|>")


@pytest.mark.parametrize("name", NAMES)
def test_think_state_agrees_with_the_decoders(name: str) -> None:
    """The decoder for a template starts in reasoning exactly where its generation prompt leaves a think
    block open (decoders read the state from these capabilities, with their format's own tags)."""
    from chatcodec.decoders import decoder_for

    found = caps(name)
    for enable_thinking in (None, True, False):
        d = decoder_for(template(name), enable_thinking=enable_thinking)
        if d.format.think is not None and found.think_state_for(enable_thinking) != "none":
            assert d.options.forced_open == (found.think_state_for(enable_thinking) == "open"), enable_thinking


@pytest.mark.parametrize("name", NAMES)
def test_stop_markers(name: str) -> None:
    """Each golden assistant turn is followed by a stop marker (what the template writes after it)."""
    markers = caps(name).stop_markers
    checked = 0
    for conv, answer in (
        ("multi_turn", "The capital of France is Paris."),
        ("multi_turn_no_system", "Hello! How can I help you today?"),
        ("indonesian", "Tokyo"),
    ):
        for options in conversations()[conv]["option_sets"]:
            text = golden(name, conv, **options)
            if text is None:
                continue
            after = text[text.index(answer) + len(answer) :].lstrip()
            assert markers and after.startswith(markers), (conv, after[:60])
            checked += 1
    if checked == 0:  # every multi-turn golden failed: so did the probes
        assert markers == ()


def test_stop_markers_examples() -> None:
    require_shared()
    assert caps("Qwen-Qwen3-0.6B").stop_markers == ("<|im_end|>",)
    assert caps("meta-llama-Llama-3.1-8B-Instruct").stop_markers == ("<|eot_id|>",)
    assert caps("openai-gpt-oss-120b").stop_markers == ("<|return|>", "<|end|>")
    assert caps("google-gemma-4-31B-it").stop_markers == ("<turn|>",)
    assert caps("chujiezheng-amberchat").stop_markers == ("###Human:",)  # nothing after a turn: the next header


@pytest.mark.parametrize("name", NAMES)
def test_special_tokens(name: str) -> None:
    """A special token is listed exactly when the goldens show its text (tokens of two or more characters)."""
    known = manifest()[name]["special_tokens"]
    outputs = [
        golden(name, conv, **options)
        for conv in ("single_user", "system_user", "multi_turn", "multi_turn_no_system")
        for options in conversations()[conv]["option_sets"]
    ]
    seen = " ".join(o for o in outputs if o is not None)
    listed = caps(name).special_tokens
    for token, value in known.items():
        if isinstance(value, str) and len(value) > 1:
            assert (token in listed) == (value in seen), (token, value)


@pytest.mark.parametrize("name", NAMES)
def test_date_dependent(name: str) -> None:
    """The goldens (rendered on 2026-11-29) change with another clock, or show a date_string given."""
    user = conversations()["single_user"]["messages"]
    other_day = reference(name, user, add_generation_prompt=True, now=datetime(2031, 7, 8, 9, 10, 11))
    clock = other_day is not None and other_day != golden(name, "single_user", add_generation_prompt=True)
    variable = shows(reference(name, user, add_generation_prompt=True, date_string="8 Jul 2031"), "8 Jul 2031")
    assert caps(name).date_dependent == (clock or variable)


@pytest.mark.parametrize("name", NAMES)
def test_variables(name: str) -> None:
    """A template whose goldens change with enable_thinking lists it."""
    on = golden(name, "enable_thinking", add_generation_prompt=True, enable_thinking=True)
    off = golden(name, "enable_thinking", add_generation_prompt=True, enable_thinking=False)
    variables = caps(name).variables
    assert (on != off) <= ("enable_thinking" in variables)
    assert not {"messages", "tools", "add_generation_prompt", "raise_exception", "namespace"} & set(variables)


def test_variables_examples() -> None:
    require_shared()
    llama = caps("meta-llama-Llama-3.1-8B-Instruct").variables
    assert {"date_string", "tools_in_user_message", "custom_tools", "builtin_tools", "bos_token"} <= set(llama)
    assert "tool_call" not in llama  # set by the template itself
    assert caps("Qwen-Qwen3-0.6B").variables == ("enable_thinking",)


def test_errors_keep_the_templates_message() -> None:
    require_shared()
    gemma = caps("google-gemma-2-2b-it")
    assert not gemma.system and gemma.error("system") == "System role not supported"
    llama = caps("meta-llama-Llama-3.1-8B-Instruct")
    assert not llama.parallel_tool_calls
    assert llama.error("parallel_tool_calls") == "This model only supports single tool-calls at once!"
    assert caps("google-gemma-2-2b-it").requires_alternation
    assert "must alternate" in (caps("google-gemma-2-2b-it").error("requires_alternation") or "")
    assert caps("Qwen-Qwen3-0.6B").error("tools") is None


def test_to_dict_is_json() -> None:
    require_shared()
    data = caps("Qwen-Qwen3-0.6B").to_dict()
    assert json.loads(json.dumps(data)) == data
    assert all(isinstance(data[flag], bool) for flag in Capabilities.flags())
    assert data["stop_markers"] == ["<|im_end|>"] and isinstance(data["errors"], dict)


def test_cached_per_template() -> None:
    require_shared()
    chat = template("Qwen-Qwen3-0.6B")
    assert chat.capabilities is chat.capabilities
    with pytest.raises(AttributeError):
        chat.capabilities.system = False  # type: ignore[misc]


def test_think_tags_cover_known_pairs() -> None:
    assert ("<think>", "</think>") in THINK_TAGS
    assert think_state_of("<|START_THINKING|>") == "open" and think_state_of("[THINK]x[/THINK]") == "closed"
    assert think_state_of("<|im_start|>assistant\n") == "none"
