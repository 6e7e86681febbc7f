"""``POST /v1/messages`` (Anthropic's Messages API): the request as the internal one (tables), the answer's shape
and events, errors in Anthropic's shape, and the ``anthropic`` SDK end to end on the embedded model."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from chatcodec.decoders import Delta, ToolCallDelta
from chatcodec.server.chat import Outcome
from chatcodec.server.dialects.messages import EventStream, message_object, parse_messages
from chatcodec.server.errors import APIError

from .. import forced
from .conftest import Server

MODEL = "SmolLM2-135M-Instruct"
SCHEMA = {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
TOOL = {"name": "get_weather", "description": "The weather in a place.", "input_schema": SCHEMA}
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"location": "Oslo"}}
BASE = {"model": MODEL, "max_tokens": 50}

#: (request fields, the internal messages they become)
MESSAGES: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [
    ({"messages": [{"role": "user", "content": "Hi"}]}, [{"role": "user", "content": "Hi"}]),
    (
        {
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": [{"role": "user", "content": "Hi"}],
        },
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "Ask the tool.", "signature": "s"}, USE],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "Sunny"}],
                        },
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ]
        },
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Ask the tool.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"location": "Oslo"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny", "name": "get_weather"},
            {"role": "user", "content": "And tomorrow?"},
        ],
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [USE]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no network", "is_error": True}
                    ],
                },
            ]
        },
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"location": "Oslo"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no network", "name": "get_weather"},
        ],
    ),
]


@pytest.mark.parametrize(("fields", "messages"), MESSAGES)
def test_content_blocks_become_chat_messages(fields: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    assert parse_messages({**BASE, **fields}).messages == messages


USER = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("choice", "internal", "parallel"),
    [
        ({"type": "auto"}, "auto", True),
        ({"type": "any"}, "required", True),
        ({"type": "tool", "name": "get_weather"}, "get_weather", True),
        ({"type": "none"}, "none", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ],
)
def test_tool_choice(choice: dict[str, Any], internal: str, parallel: bool) -> None:
    req = parse_messages({**BASE, "messages": USER, "tools": [TOOL], "tool_choice": choice})
    assert (req.tool_choice, req.parallel_tool_calls) == (internal, parallel)
    assert req.tools == [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": SCHEMA, "description": "The weather in a place."},
        }
    ]


def test_sampling_limits_and_thinking() -> None:
    req = parse_messages(
        {
            **BASE,
            "max_tokens": 5000,
            "messages": USER,
            "stop_sequences": ["END"],
            "temperature": 0.2,
            "top_p": 0.5,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "metadata": {"user_id": "u"},
        }
    )
    assert (req.max_tokens, req.stop, req.temperature, req.top_p) == (5000, ("END",), 0.2, 0.5)
    assert (req.reasoning_effort, req.thinking_budget) == ("low", 2048)
    off = parse_messages({**BASE, "messages": USER, "thinking": {"type": "disabled"}})
    assert (off.reasoning_effort, off.thinking_budget) == ("none", 0)
    assert parse_messages({"model": MODEL, "messages": USER}, counting=True).max_tokens is None


#: (body, status, the field the error names)
BAD: list[tuple[Any, int, str]] = [
    ([1], 400, "body"),
    ({"model": MODEL, "messages": USER}, 400, "max_tokens"),
    ({"max_tokens": 5, "messages": USER}, 400, "model"),
    ({**BASE}, 400, "messages"),
    ({**BASE, "messages": []}, 400, "messages"),
    ({**BASE, "messages": USER, "top_k": 3}, 400, "top_k"),
    ({**BASE, "max_tokens": "ten", "messages": USER}, 400, "max_tokens"),
    ({**BASE, "messages": [{"role": "system", "content": "x"}]}, 400, "messages.0.role"),
    (
        {**BASE, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        400,
        "messages.0.content.0.type",
    ),
    (
        {**BASE, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
        400,
        "messages.0.content.0.tool_use_id",
    ),
    (
        {**BASE, "messages": [{"role": "assistant", "content": [{**USE, "input": "x"}]}]},
        400,
        "messages.0.content.0.input",
    ),
    ({**BASE, "messages": USER, "tools": [{"name": "f"}]}, 400, "tools.0.input_schema"),
    ({**BASE, "messages": USER, "tools": [{**TOOL, "input_schema": {"type": "thing"}}]}, 400, "tools.0.input_schema"),
    ({**BASE, "messages": USER, "tools": [{"type": "web_search_20250305", "name": "s"}]}, 400, "tools.0.type"),
    ({**BASE, "messages": USER, "tools": [TOOL], "tool_choice": {"type": "sometimes"}}, 400, "tool_choice.type"),
    ({**BASE, "messages": USER, "tools": [TOOL], "tool_choice": {"type": "tool", "name": "g"}}, 400, "tool_choice"),
    ({**BASE, "messages": USER, "tool_choice": {"type": "any"}}, 400, "tool_choice"),
    ({**BASE, "messages": USER, "temperature": 1.5}, 400, "temperature"),
    ({**BASE, "messages": USER, "stop_sequences": "END"}, 400, "stop_sequences"),
    ({**BASE, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": 10}}, 400, "thinking.budget_tokens"),
    ({**BASE, "messages": USER, "thinking": {"type": "sometimes"}}, 400, "thinking.type"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD)
def test_bad_requests_name_the_field(body: Any, status: int, param: str) -> None:
    with pytest.raises(APIError) as caught:
        parse_messages(body)
    assert (caught.value.status, caught.value.param) == (status, param), caught.value.message
    assert param.split(".")[0] in caught.value.message


OUTCOME = Outcome(
    content="Let me look.",
    reasoning="Use the tool.",
    calls=[{"id": "call_7", "name": "get_weather", "arguments": '{"location": "Oslo"}'}],
    invalid=[],
    finish="tool_calls",
    prompt_tokens=40,
    completion_tokens=12,
)


def test_the_whole_answer() -> None:
    answer = message_object(OUTCOME, MODEL, "msg_1")
    assert answer["content"] == [
        {"type": "thinking", "thinking": "Use the tool.", "signature": ""},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "call_7", "name": "get_weather", "input": {"location": "Oslo"}},
    ]
    assert answer["stop_reason"] == "tool_use" and answer["usage"] == {"input_tokens": 40, "output_tokens": 12}
    for finish, reason in [("stop", "end_turn"), ("length", "max_tokens")]:
        assert message_object(Outcome("x", None, [], [], finish, 1, 1), MODEL)["stop_reason"] == reason
    parsed = anthropic.types.Message.model_validate(answer)
    assert parsed.content[2].type == "tool_use"


def test_the_event_sequence() -> None:
    stream = EventStream(MODEL, 40)
    chunks = stream.start()
    for delta in [
        Delta(reasoning_content="Use "),
        Delta(reasoning_content="the tool."),
        Delta(content="Let me look."),
        Delta(tool_call=ToolCallDelta(0, "call_7", "get_weather", "")),
        Delta(tool_call=ToolCallDelta(0, arguments='{"location": ')),
        Delta(tool_call=ToolCallDelta(0, arguments='"Oslo"}')),
    ]:
        chunks += stream.feed(delta)
    chunks += stream.finish(OUTCOME)
    events = []
    for chunk in chunks:
        kind, data = chunk.decode().strip().split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert kind == f"event: {events[-1]['type']}"
    assert [(e["type"], e.get("delta", {}).get("type")) for e in events] == [
        ("message_start", None),
        ("content_block_start", None),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_stop", None),
        ("content_block_start", None),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", None),
        ("content_block_delta", "input_json_delta"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[0]["message"]["usage"]["input_tokens"] == 40
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1, 2]
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-2]["usage"]["output_tokens"] == 12
    json_text = "".join(
        e["delta"]["partial_json"] for e in events if e.get("delta", {}).get("type") == "input_json_delta"
    )
    assert json.loads(json_text) == {"location": "Oslo"}


# --- end to end, with the anthropic SDK ------------------------------------------------------------------


def client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", timeout=600, max_retries=0)


#: the weather tool of the end-to-end runs: its location is an enum, so a forced call has a bound (tests/forced.py)
WEATHER = {**TOOL, "input_schema": forced.weather_parameters()}


def test_sdk_create_with_any_tool_then_a_tool_result(embedded: Server) -> None:
    sdk = client(embedded)
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = sdk.messages.create(
        model=MODEL,
        max_tokens=forced.CALL_TOKENS,  # one call, its location an enum: at most 107 bytes
        messages=[question],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 0},
    )
    uses = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and uses
    for use in uses:
        assert use.name == "get_weather"
        jsonschema.validate(use.input, WEATHER["input_schema"])
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": "Sunny, 24 C"} for u in uses]
    second = sdk.messages.create(
        model=MODEL,
        max_tokens=30,
        extra_body={"temperature": 0},
        tools=[WEATHER],  # type: ignore[list-item]
        messages=[question, {"role": "assistant", "content": first.content}, {"role": "user", "content": results}],  # type: ignore[list-item]
    )
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert second.usage.input_tokens > first.usage.input_tokens, "the second turn's prompt holds the first"
    count = sdk.messages.count_tokens(model=MODEL, messages=[question], tools=[WEATHER])  # type: ignore[list-item]
    assert count.input_tokens == first.usage.input_tokens


def test_sdk_stream_with_any_tool(embedded: Server) -> None:
    sdk = client(embedded)
    kinds: list[str] = []
    with sdk.messages.stream(
        model=MODEL,
        max_tokens=forced.CALL_TOKENS,  # one call, its location an enum: at most 107 bytes
        extra_body={"temperature": 0},
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "any", "disable_parallel_tool_use": True},  # parallel calls would have no bound
        messages=[{"role": "user", "content": "Weather in Rome?"}],
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "content_block_start" in kinds and kinds[-1] == "message_stop"
    uses = [block for block in final.content if block.type == "tool_use"]
    assert final.stop_reason == "tool_use" and uses
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])


def test_sdk_text_and_max_tokens(embedded: Server) -> None:
    answer = client(embedded).messages.create(
        model=MODEL,
        max_tokens=4,
        messages=[{"role": "user", "content": "Count to twenty."}],
        system="Count.",
        extra_body={"temperature": 0},  # greedy: at the default temperature the turn may end within 4 tokens
    )
    assert answer.stop_reason == "max_tokens" and answer.usage.output_tokens == 4
    assert answer.content and answer.content[0].type == "text"


def stop_sequence_checks(sdk: anthropic.Anthropic, model: str = MODEL) -> None:
    """A stop sequence taken from the model's own answer ends the next, same answer there: ``stop_sequence`` names
    it (whole, and in the stream's ``message_delta``), the text is what came before it, and one never met is not
    named. Without one, the model's own end is ``end_turn`` or the limit's ``max_tokens``, with no sequence."""
    ask: dict[str, Any] = {
        "model": model,
        "max_tokens": 24,
        "messages": [{"role": "user", "content": "Name five colours of the rainbow."}],
        "extra_body": {"temperature": 0},
    }
    # every answer compared comes from the engine's cached prefix: the first request evaluates the prompt in one
    # batch, and llama.cpp's logits then differ in their last bits (a near tie can flip a greedy token)
    sdk.messages.create(**ask)
    free = sdk.messages.create(**ask)
    assert free.stop_reason in ("end_turn", "max_tokens") and free.stop_sequence is None
    text = "".join(block.text for block in free.content if block.type == "text")
    words = text.split()
    assert len(words) > 3, text
    met = words[2]
    stops = ["§never met§", met]
    whole = sdk.messages.create(**ask, stop_sequences=stops)
    assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", met)
    cut = "".join(block.text for block in whole.content if block.type == "text")
    assert cut == text[: text.index(met)].strip() or cut == text[: text.index(met)], (cut, text)
    with sdk.messages.stream(**ask, stop_sequences=stops) as stream:
        deltas = [event for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()
    assert [(d.delta.stop_reason, d.delta.stop_sequence) for d in deltas] == [("stop_sequence", met)]
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", met)
    assert "".join(block.text for block in final.content if block.type == "text") == cut


def test_sdk_stop_sequences_are_named(embedded: Server) -> None:
    stop_sequence_checks(client(embedded))


def test_bad_requests_over_http_get_anthropics_shape(embedded: Server) -> None:
    for body, status, _param in BAD:
        response = httpx.post(embedded.url + "/v1/messages", json=body, timeout=60)
        assert response.status_code == status, (body, response.text)
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    for content in (b"{oops", b"x" * (9 * 1024 * 1024)):
        response = httpx.post(embedded.url + "/v1/messages", content=content, timeout=60)
        assert response.status_code in (400, 413) and response.json()["type"] == "error"
    missing = httpx.post(embedded.url + "/v1/messages/nothing", json={}, timeout=60)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(embedded).messages.create(model=MODEL, max_tokens=5, messages=[])
    assert "messages" in str(caught.value)
    assert httpx.get(embedded.url + "/health", timeout=60).status_code == 200
