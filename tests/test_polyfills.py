"""Polyfills: every corpus template renders the hard conversations, each rewrite does what it says,
the generic round trip decodes back, and polyfill=False changes nothing."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from chatcodec import ChatcodecError, ChatTemplate, InputError, decoder_for
from chatcodec.polyfills import POLYFILLS, TOOL_INSTRUCTIONS, uses_generic_tools

from .conftest import CORPUS, GOLDEN_NOW, conversations, goldens, manifest, require_shared, template_source
from .test_capabilities import template

NAMES = sorted(manifest()) if CORPUS.is_dir() else ["no-shared-corpus"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_temperature",
            "description": "Get current temperature at a location.",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string", "description": "City, Country."}},
                "required": ["location"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_forecast",
            "description": "Get tomorrow's forecast at a location.",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string", "description": "City, Country."}},
                "required": ["location"],
            },
        },
    },
]


def call(call_id: str, name: str, location: str) -> dict[str, Any]:
    arguments = json.dumps({"location": location})  # the OpenAI wire form: a JSON string
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


#: (id, messages, the texts that must all show in the prompt)
HARD: list[tuple[str, list[dict[str, Any]], list[str]]] = [
    (
        "everything",  # system, tools, parallel calls, results, content null, two users in a row, list content
        [
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "What's the weather in Paris and Lyon?"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Use celsius."}, {"type": "text", "text": "Be quick."}],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    call("call_abc123xyz", "get_current_temperature", "Paris, France"),
                    call("call_def456uvw", "get_forecast", "Lyon, France"),
                ],
            },
            {"role": "tool", "tool_call_id": "call_abc123xyz", "content": "21.5 degrees in Paris"},
            {"role": "tool", "tool_call_id": "call_def456uvw", "content": "23.0 degrees in Lyon"},
            {"role": "assistant", "content": "Paris has 21.5 and Lyon 23.0."},
            {"role": "user", "content": "Thanks, and tomorrow?"},
        ],
        ["get_current_temperature", "get_forecast", "Paris, France", "Lyon, France"],
    ),
    (
        "ends_with_results",  # the prompt ends on tool results; a system message in the middle
        [
            {"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]},
            {"role": "user", "content": "Temperature in Oslo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("1", "get_current_temperature", "Oslo, Norway")],
            },
            {"role": "tool", "tool_call_id": "1", "content": "minus 3 degrees"},
            {"role": "assistant", "content": "It is minus 3 degrees."},
            {"role": "system", "content": "Now answer in French."},
            {"role": "user", "content": "And tomorrow?"},
            {"role": "assistant", "content": None, "tool_calls": [call("2", "get_forecast", "Oslo, Norway")]},
            {"role": "tool", "tool_call_id": "2", "content": "minus 5 degrees"},
        ],
        ["get_forecast", "Oslo, Norway"],
    ),
]


def message_texts(messages: list[dict[str, Any]]) -> list[str]:
    texts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and content:
            texts.append(content)
        elif isinstance(content, list):
            texts += [part["text"] for part in content]
    return texts


#: templates whose own logic rejects every form of a hard conversation, with the reason (none so far)
REJECTS_EVERY_FORM: dict[str, str] = {}


@pytest.mark.parametrize("case", [h[0] for h in HARD])
@pytest.mark.parametrize("name", NAMES)
def test_polyfill_renders_every_hard_conversation(name: str, case: str) -> None:
    """polyfill="auto" gives a prompt that shows every message's text and every call, for every template."""
    _, messages, extra = next(h for h in HARD if h[0] == case)
    if name in REJECTS_EVERY_FORM:
        pytest.xfail(REJECTS_EVERY_FORM[name])
    text, applied = template(name).render_with_report(
        copy.deepcopy(messages), tools=TOOLS, add_generation_prompt=True, now=GOLDEN_NOW, polyfill="auto"
    )
    missing = [t for t in [*message_texts(messages), *extra] if t not in text]
    assert not missing, (applied, missing)


@pytest.mark.parametrize("name", NAMES)
def test_polyfill_renders_legacy_function_calls(name: str) -> None:
    """The Qwen-Agent conversation of the corpus (function_call, role function) renders everywhere."""
    conv = conversations()["qwen_agent_function_role"]
    text, applied = template(name).render_with_report(
        copy.deepcopy(conv["messages"]), tools=conv["tools"], add_generation_prompt=True, now=GOLDEN_NOW
    )
    assert "legacy_function_calls" in applied
    for message in conv["messages"]:
        if message["role"] == "function":  # a JSON result: templates may lay it out anew, its values stay
            assert all(str(value) in text for value in json.loads(message["content"]).values())
        elif message["content"]:
            assert message["content"] in text
        if "function_call" in message:
            assert message["function_call"]["name"] in text


@pytest.mark.parametrize("name", NAMES)
def test_generic_round_trip(name: str) -> None:
    """Where tools were polyfilled, the generic JSON answer after the generation prompt decodes back to the calls."""
    chat = template(name)
    if not uses_generic_tools(chat.capabilities):
        assert decoder_for(chat, polyfill="auto").format.name != "generic" or not chat.capabilities.tool_calls
        return
    user = [{"role": "user", "content": "Weather in Paris and Lyon?"}]
    prompt, applied = chat.render_with_report(user, tools=TOOLS, add_generation_prompt=True, now=GOLDEN_NOW)
    assert "tools_in_system" in applied and TOOL_INSTRUCTIONS in prompt
    calls = [
        {"name": "get_current_temperature", "arguments": {"location": "Paris, France"}},
        {"name": "get_forecast", "arguments": {"location": "Lyon, France"}},
    ]
    answer = json.dumps({"tool_calls": calls})
    decoder = decoder_for(chat, polyfill="auto", prompt=prompt)
    assert decoder.format.name == "generic"
    if chat.capabilities.think_state == "open":  # the model closes its reasoning first
        answer = "Thinking it over.</think>" + answer
    message = decoder.decode(answer)
    assert [(c.name, c.arguments) for c in message.tool_calls] == [(c["name"], c["arguments"]) for c in calls]


GOLDENS = [g for g in goldens() if "output" in g]


def test_polyfill_false_is_exact() -> None:
    """polyfill=False (the default) renders every golden byte for byte, and never probes."""
    require_shared()
    for record in GOLDENS:
        entry = manifest()[record["template"]]
        chat = ChatTemplate(template_source(entry["name"]), special_tokens=entry["special_tokens"])
        conv = conversations()[record["conversation"]]
        out = chat.render(
            copy.deepcopy(conv["messages"]), tools=conv["tools"], now=GOLDEN_NOW, polyfill=False, **record["options"]
        )
        assert out == record["output"], record["template"]
        assert chat._capabilities is None  # nothing was probed


def test_auto_changes_nothing_a_template_supports() -> None:
    require_shared()
    chat = template("Qwen-Qwen3-0.6B")
    conv = conversations()["tools_roundtrip"]
    exact = chat.render(conv["messages"], tools=conv["tools"], add_generation_prompt=True)
    assert chat.render_with_report(conv["messages"], tools=conv["tools"], add_generation_prompt=True) == (exact, ())


# -- each rewrite, on the template that needs it -----------------------------------------------------------


def report(name: str, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, tuple[str, ...]]:
    kwargs.setdefault("add_generation_prompt", True)
    return template(name).render_with_report(copy.deepcopy(messages), now=GOLDEN_NOW, **kwargs)


USER = {"role": "user", "content": "Weather in Paris?"}


def test_system_to_user() -> None:
    require_shared()
    text, applied = report("google-gemma-2-2b-it", [{"role": "system", "content": "Be brief."}, USER])
    assert applied == ("system_to_user",)
    assert "<start_of_turn>user\nBe brief.\n\nWeather in Paris?<end_of_turn>" in text


def test_later_system_to_user() -> None:
    require_shared()
    messages = [USER, {"role": "assistant", "content": "Sunny."}, {"role": "system", "content": "Use French."}, USER]
    text, applied = report("Qwen3.5-4B", messages)
    assert applied == ("later_system_to_user",)
    assert "<|im_start|>user\nUse French.<|im_end|>" in text


def test_merge_consecutive() -> None:
    require_shared()
    text, applied = report("google-gemma-2-2b-it", [USER, {"role": "user", "content": "In celsius."}])
    assert applied == ("merge_consecutive",)
    assert "<start_of_turn>user\nWeather in Paris?\n\nIn celsius.<end_of_turn>" in text


def test_content_parts_to_text() -> None:
    require_shared()
    parts = [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}]
    text, applied = report("Qwen-Qwen3-0.6B", [{"role": "user", "content": parts}])
    assert applied == ("content_parts_to_text",)
    assert "<|im_start|>user\nWeather in\nParis?<|im_end|>" in text
    image = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    with pytest.raises(InputError, match="'image_url' content part"):
        report("Qwen-Qwen3-0.6B", [{"role": "user", "content": image}])


def tool_turns(arguments: Any, content: Any = "", call_id: str = "call_abc123xyz") -> list[dict[str, Any]]:
    function = {"name": "get_current_temperature", "arguments": arguments}
    return [
        USER,
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "21 degrees"},
    ]


def test_null_content() -> None:
    require_shared()
    with pytest.raises(ChatcodecError):  # exact rendering fails, as in transformers
        template("Qwen-Qwen3-0.6B").render(tool_turns({"location": "Paris"}, content=None), tools=TOOLS)
    text, applied = report("Qwen-Qwen3-0.6B", tool_turns({"location": "Paris"}, content=None), tools=TOOLS)
    assert applied == ("null_content",)
    assert '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "Paris"}}' in text


def test_arguments_to_object() -> None:
    require_shared()
    text, applied = report("GLM-4.7-Flash", tool_turns('{"location": "Paris"}'), tools=TOOLS)
    assert applied == ("arguments_to_object",)
    assert "<arg_key>location</arg_key><arg_value>Paris</arg_value>" in text
    with pytest.raises(InputError, match="not JSON"):
        report("GLM-4.7-Flash", tool_turns("{location: Paris"), tools=TOOLS)


def test_arguments_to_string() -> None:
    require_shared()
    # V3.1 renders no tool definitions, so "auto" takes the generic protocol; asked by name, it renders natively
    messages = tool_turns({"location": "Paris"})
    text, applied = report("deepseek-ai-DeepSeek-V3.1", messages, tools=TOOLS, polyfill={"arguments_to_string"})
    assert applied == ("arguments_to_string",)
    assert 'get_current_temperature<｜tool▁sep｜>{"location": "Paris"}' in text


def test_short_call_ids() -> None:
    require_shared()
    text, applied = report("Mistral-Small-3.2-24B-Instruct-2506", tool_turns({"location": "Paris"}), tools=TOOLS)
    assert applied == ("short_call_ids",)
    assert "call_abc123xyz" not in text
    again, _ = report("Mistral-Small-3.2-24B-Instruct-2506", tool_turns({"location": "Paris"}), tools=TOOLS)
    assert again == text  # the same id gives the same short id: a growing conversation keeps its prefix


def test_split_parallel_calls() -> None:
    require_shared()
    messages = HARD[0][1][1:2] + HARD[0][1][3:6]
    text, applied = report("meta-llama-Llama-3.1-8B-Instruct", messages, tools=TOOLS)
    assert "split_parallel_calls" in applied
    start = text.index("What's the weather in Paris and Lyon?")  # the tool definitions come before
    first = text.index('"name": "get_current_temperature"', start)
    second = text.index('"name": "get_forecast"', start)
    assert first < text.index("21.5 degrees in Paris") < second < text.index("23.0 degrees in Lyon")


def test_tools_in_system_and_calls_as_json() -> None:
    require_shared()
    messages = tool_turns({"location": "Paris"}, content="Checking.")
    text, applied = report("HuggingFaceTB-SmolLM3-3B", messages, tools=TOOLS)
    assert applied == ("tool_calls_as_json", "tools_in_system")
    assert TOOL_INSTRUCTIONS in text and json.dumps(TOOLS[0]) in text
    envelope = {
        "response": "Checking.",
        "tool_calls": [{"name": "get_current_temperature", "arguments": {"location": "Paris"}, "id": "call_abc123xyz"}],
    }
    assert json.dumps(envelope) in text


def test_tool_results_as_user() -> None:
    require_shared()
    text, applied = report("Kimi-K2-Instruct", tool_turns({"location": "Paris"}), tools=TOOLS)
    assert "tool_results_as_user" in applied
    response = {"tool_response": {"name": "get_current_temperature", "id": "call_abc123xyz", "content": "21 degrees"}}
    assert json.dumps(response) in text


def test_documents_in_system() -> None:
    require_shared()
    documents = [{"title": "Paris", "text": "Paris is often sunny in June."}]
    text, applied = report("Qwen-Qwen3-0.6B", [USER], documents=documents)
    assert applied == ("documents_in_system",)
    assert "Document 1: Paris\nParis is often sunny in June." in text


def test_legacy_function_calls_pair_results_with_calls() -> None:
    require_shared()
    conv = conversations()["qwen_agent_function_role"]
    text, applied = report("Qwen-Qwen3-0.6B", conv["messages"], tools=conv["tools"])
    assert applied == ("legacy_function_calls",)
    # one assistant turn with both calls, then both results
    assert text.count('<tool_call>\n{"name": "get_') == 2 and text.count("<tool_response>\n") == 2


def test_named_rewrites_apply_whatever_the_template_supports() -> None:
    require_shared()
    text, applied = report(
        "Qwen-Qwen3-0.6B", [{"role": "system", "content": "Be brief."}, USER], polyfill={"system_to_user"}
    )
    assert applied == ("system_to_user",) and "<|im_start|>user\nBe brief.\n\nWeather in Paris?" in text
    with pytest.raises(InputError, match="Unknown polyfill 'nope'"):
        report("Qwen-Qwen3-0.6B", [USER], polyfill={"nope"})
    with pytest.raises(InputError, match="polyfill must be"):
        report("Qwen-Qwen3-0.6B", [USER], polyfill="always")


def test_every_rewrite_is_documented_and_tested() -> None:
    import chatcodec.polyfills as module

    tested = " ".join(name for name in globals() if name.startswith("test_"))
    for name in POLYFILLS:
        assert f"``{name}``" in (module.__doc__ or ""), name
        assert name in tested or name in ("tool_calls_as_json", "tools_in_system"), name


def test_caller_messages_are_not_changed() -> None:
    require_shared()
    messages = copy.deepcopy(HARD[0][1])
    template("google-gemma-2-2b-it").render(messages, tools=TOOLS, polyfill="auto")
    assert messages == HARD[0][1]


def test_codec_encode_polyfill() -> None:
    """Codec.encode(polyfill="auto") tokenizes the polyfilled prompt, and the assistant mask still finds the turns."""
    require_shared()
    from chatcodec import load

    codec = load(CORPUS.parent / "tokenizers" / "qwen3")
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [call("call_1", "get_current_temperature", "Paris")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
        {"role": "assistant", "content": "It is 21 degrees."},
    ]
    with pytest.raises(ChatcodecError):
        codec.encode(messages, tools=TOOLS)
    encoding = codec.encode(messages, tools=TOOLS, polyfill="auto")
    assert encoding.text == codec.template.render(messages, tools=TOOLS, polyfill="auto")
    supervised = codec.decode([i for i, m in zip(encoding.input_ids, encoding.assistant_mask, strict=True) if m])
    assert "get_current_temperature" in supervised and "It is 21 degrees." in supervised
    assert "Weather in Paris?" not in supervised and "21 degrees<" not in supervised
