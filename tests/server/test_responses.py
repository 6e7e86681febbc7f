"""``POST /v1/responses``: the request as the internal one (tables), the answer's shape and events, the store, and
the official SDKs end to end on the embedded model (``openai``'s ``client.responses``, the Agents SDK's default
model, LangChain's ``ChatOpenAI``)."""

from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import TypeAdapter

from chatcodec import load_template
from chatcodec.backends import default_model_path
from chatcodec.decoders import Delta, ToolCallDelta
from chatcodec.server.chat import Outcome
from chatcodec.server.dialects.messages import parse_messages
from chatcodec.server.dialects.responses import EventStream, parse_responses, response_object
from chatcodec.server.errors import APIError
from chatcodec.server.store import ResponseStore, Stored

from .. import forced
from .conftest import Server, chatcodec_serve
from .test_constrain import served_grammar

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "dialects.md"
MODEL = "SmolLM2-135M-Instruct"
SCHEMA = {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a place.", "parameters": SCHEMA}

# --- the request, as the internal one -----------------------------------------------------------------

CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"location": "Oslo"}'}
#: (request fields, the internal messages they become)
INPUTS: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [
    ({"input": "Hi"}, [{"role": "user", "content": "Hi"}]),
    (
        {"input": "Hi", "instructions": "Be brief."},
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ),
    (
        {
            "input": [
                {"role": "developer", "content": "Rules."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                },
            ]
        },
        [{"role": "system", "content": "Rules."}, {"role": "user", "content": "ab"}],
    ),
    (
        {
            "input": [
                {"role": "user", "content": "Weather?"},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look it up."}]},
                CALL,
                {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            ]
        },
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Look it up.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"location": "Oslo"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny", "name": "get_weather"},
        ],
    ),
    (
        {
            "input": [
                {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
                {"role": "user", "content": "Bye"},
            ]
        },
        [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
    ),
]


@pytest.mark.parametrize(("fields", "messages"), INPUTS)
def test_input_items_become_chat_messages(fields: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    assert parse_responses({"model": MODEL, **fields}).chat.messages == messages


def test_the_request_fields_become_the_internal_ones() -> None:
    req = parse_responses(
        {
            "model": MODEL,
            "input": "Hi",
            "tools": [TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
            "max_output_tokens": 30,
            "temperature": 0.5,
            "top_p": 0.9,
            "reasoning": {"effort": "low"},
            "metadata": {"k": "v"},
            "store": False,
        }
    )
    chat = req.chat
    assert chat.tools == [{"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}]
    assert (chat.tool_choice, chat.parallel_tool_calls, chat.max_tokens) == ("get_weather", False, 30)
    assert (chat.temperature, chat.top_p, chat.reasoning_effort, chat.model) == (0.5, 0.9, "low", MODEL)
    assert req.store is False and req.echo["metadata"] == {"k": "v"}
    schema = parse_responses(
        {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}}}
    )
    assert schema.chat.response_format is not None and schema.chat.response_format.schema == SCHEMA
    assert parse_responses({"input": "Hi", "text": {"format": {"type": "json_object"}}}).chat.response_format


def test_previous_response_id_puts_the_stored_conversation_first() -> None:
    earlier = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Sunny."}]
    stored = {"resp_1": Stored({"id": "resp_1"}, earlier)}
    req = parse_responses({"input": "Thanks", "instructions": "Be kind.", "previous_response_id": "resp_1"}, stored.get)
    assert req.chat.messages == [
        {"role": "system", "content": "Be kind."},
        *earlier,
        {"role": "user", "content": "Thanks"},
    ]
    assert req.history == [*earlier, {"role": "user", "content": "Thanks"}], "instructions do not carry over"
    with pytest.raises(APIError) as missing:
        parse_responses({"input": "Hi", "previous_response_id": "resp_gone"}, stored.get)
    assert missing.value.status == 404 and missing.value.param == "previous_response_id"


#: (body, status, the field the error names)
BAD: list[tuple[Any, int, str]] = [
    ([1], 400, "body"),
    ({}, 400, "input"),
    ({"input": 5}, 400, "input"),
    ({"input": []}, 400, "input"),
    ({"input": "Hi", "frobnicate": 1}, 400, "frobnicate"),
    ({"input": [{"role": "wizard", "content": "x"}]}, 400, "input[0].role"),
    ({"input": [{"type": "message", "role": "user"}]}, 400, "input[0].content"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
        "input[0].content[0].type",
    ),
    ({"input": [{**CALL, "arguments": "{oops"}]}, 400, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, 400, "input[0].call_id"),
    ({"input": [{"type": "web_search_call"}]}, 400, "input[0].type"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"input": "Hi", "tools": [{**TOOL, "parameters": {"type": "thing"}}]}, 400, "tools[0].parameters"),
    ({"input": "Hi", "tools": [TOOL], "tool_choice": "always"}, 400, "tool_choice"),
    ({"input": "Hi", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "Hi", "text": {"format": {"type": "yaml"}}}, 400, "text.format.type"),
    (
        {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 3}}}},
        400,
        "text.format.json_schema.schema",
    ),
    ({"input": "Hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "Hi", "temperature": "hot"}, 400, "temperature"),
    ({"input": "Hi", "store": "yes"}, 400, "store"),
    ({"input": "Hi", "metadata": {"k": 1}}, 400, "metadata.k"),
    ({"input": "Hi", "reasoning": {"effort": "extreme"}}, 400, "reasoning.effort"),
    ({"input": "Hi", "previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD)
def test_bad_requests_name_the_field(body: Any, status: int, param: str) -> None:
    with pytest.raises(APIError) as caught:
        parse_responses(body, lambda rid: None)
    assert (caught.value.status, caught.value.param) == (status, param), caught.value.message


# --- the answer's shape and events ----------------------------------------------------------------------

OUTCOME = Outcome(
    content="It is sunny.",
    reasoning="Check the tool.",
    calls=[{"id": "call_7", "name": "get_weather", "arguments": '{"location": "Oslo"}'}],
    invalid=[],
    finish="tool_calls",
    prompt_tokens=40,
    completion_tokens=12,
)


def test_the_whole_answer() -> None:
    req = parse_responses({"model": MODEL, "input": "Hi", "metadata": {"k": "v"}})
    answer = response_object(req, OUTCOME, "resp_1", 1, MODEL)
    assert [item["type"] for item in answer["output"]] == ["reasoning", "message", "function_call"]
    reasoning, message, call = answer["output"]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Check the tool."}]
    assert message["content"][0]["type"] == "output_text" and message["content"][0]["text"] == "It is sunny."
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_7", "get_weather", '{"location": "Oslo"}')
    assert answer["status"] == "completed" and answer["incomplete_details"] is None
    assert answer["usage"]["input_tokens"] == 40 and answer["usage"]["output_tokens"] == 12
    assert answer["metadata"] == {"k": "v"} and answer["object"] == "response"
    cut = response_object(req, Outcome("It is", None, [], [], "length", 40, 3), "resp_2", 1, MODEL)
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    # the SDK reads the answer as its own type
    parsed = openai.types.responses.Response.model_validate(answer)
    assert parsed.output_text == "It is sunny."


def _events(chunks: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for chunk in chunks:
        kind, data = chunk.decode().strip().split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        out.append(event)
    return out


def test_the_event_sequence() -> None:
    req = parse_responses({"model": MODEL, "input": "Hi"})
    stream = EventStream(req, "resp_1", MODEL)
    chunks = stream.start()
    for delta in [
        Delta(reasoning_content="Check "),
        Delta(reasoning_content="the tool."),
        Delta(content="It is "),
        Delta(content="sunny."),
        Delta(tool_call=ToolCallDelta(0, "call_7", "get_weather", "")),
        Delta(tool_call=ToolCallDelta(0, arguments='{"location": ')),
        Delta(tool_call=ToolCallDelta(0, arguments='"Oslo"}')),
    ]:
        chunks += stream.feed(delta)
    chunks += stream.finish(OUTCOME)
    chunks.append(stream.closing())
    events = _events(chunks)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2]
    done = events[-1]["response"]
    assert [i["type"] for i in done["output"]] == ["reasoning", "message", "function_call"]
    assert (
        done["output"][2]["arguments"] == '{"location": "Oslo"}'
        and done["output"][1]["content"][0]["text"] == "It is sunny."
    )
    # the SDK reads each event as its own type
    adapter = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    for event in events:
        assert adapter.validate_python(event).type == event["type"]
    incomplete = EventStream(req, "resp_2", MODEL)
    incomplete.start()
    incomplete.feed(Delta(content="It is"))
    incomplete.finish(Outcome("It is", None, [], [], "length", 4, 2))
    assert _events([incomplete.closing()])[0]["type"] == "response.incomplete"


# --- the store ------------------------------------------------------------------------------------------


def test_the_store_stays_within_its_bounds(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite3", max_entries=500, max_bytes=60_000)
    for n in range(10_000):
        store.put(f"resp_{n}", {"id": f"resp_{n}", "pad": "x" * (n % 50)}, [{"role": "user", "content": str(n)}])
        if n % 997 == 0:
            count, size = store.usage()
            assert count <= 500 and size <= 60_000
    count, size = store.usage()
    assert count <= 500 and size <= 60_000 and count > 100
    assert store.get("resp_9999") is not None and store.get("resp_0") is None, "the oldest went first"
    assert store.delete("resp_9999") and store.get("resp_9999") is None and not store.delete("resp_9999")


def _writer(path: str, start: int) -> None:
    store = ResponseStore(path, max_entries=300)
    for n in range(start, start + 200):
        store.put(f"resp_{n}", {"id": f"resp_{n}"}, [])


def test_processes_share_the_store(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.sqlite3")
    workers = [multiprocessing.get_context("spawn").Process(target=_writer, args=(path, k * 1000)) for k in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    store = ResponseStore(path, max_entries=300)
    assert len(store) == 300
    assert store.get("resp_199") is not None and store.get("resp_1199") is not None, "each sees the other's last"


# --- end to end, with the official SDKs ------------------------------------------------------------------


@pytest.fixture(scope="module")
def store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store") / "responses.sqlite3"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, store_file: Path) -> Iterator[Server]:
    """The embedded model with its Responses store in a file of the test's own."""
    server = chatcodec_serve(
        tmp_path_factory.mktemp("responses"), "--responses-store", str(store_file), name="responses"
    )
    yield server
    server.stop()


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600, max_retries=0)


#: the weather tool of the end-to-end runs: its location is an enum, so a forced call has a bound (tests/forced.py)
WEATHER = {**TOOL, "parameters": forced.weather_parameters()}


def test_sdk_create_with_a_required_tool_then_continue(served: Server) -> None:
    sdk = client(served)
    first = sdk.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=forced.CALL_TOKENS,  # one call, its location an enum: at most 107 bytes
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and calls
    for call in calls:
        assert call.name == "get_weather" and call.call_id
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 24 C"} for c in calls]
    second = sdk.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=outputs,
        tools=[WEATHER],  # type: ignore[list-item]
        temperature=0,
        max_output_tokens=30,
    )
    assert second.usage is not None and first.usage is not None
    seen = first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens > seen, "the second turn's prompt holds the first turn"
    alone = sdk.responses.create(model=MODEL, input=[{"role": "user", "content": "x"}], max_output_tokens=1)
    assert alone.usage is not None and alone.usage.input_tokens < seen
    assert sdk.responses.retrieve(second.id).id == second.id


def test_sdk_stream_with_a_required_tool(served: Server) -> None:
    sdk = client(served)
    kinds: list[str] = []
    numbers: list[int] = []
    with sdk.responses.stream(
        model=MODEL,
        input="Weather in Rome?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,  # parallel calls would have no bound
        temperature=0,
        max_output_tokens=forced.CALL_TOKENS,  # one call, its location an enum: at most 107 bytes
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
        final = stream.get_final_response()
    assert numbers == list(range(len(numbers)))
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and all(call.name == "get_weather" for call in calls)
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    assert client(served).responses.retrieve(final.id).status == "completed", "a streamed response is stored too"


def test_text_stream_and_an_incomplete_answer(served: Server) -> None:
    sdk = client(served)
    # greedy: at the default temperature the model may end its turn within 5 tokens (seen once in CI)
    stream = sdk.responses.create(
        model=MODEL, input="Count to twenty.", max_output_tokens=5, temperature=0, stream=True
    )
    events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    assert final.incomplete_details is not None and final.incomplete_details.reason == "max_output_tokens"
    assert final.output_text == text and final.usage is not None and final.usage.output_tokens == 5


def test_input_items_list_the_whole_chain(served: Server) -> None:
    """``GET /v1/responses/{id}/input_items``: every item the response was answered from, those of the responses
    it continues first (their output items with their ids), newest first by default, in pages."""
    sdk = client(served)
    first = sdk.responses.create(model=MODEL, input="Hi", instructions="Be brief.", max_output_tokens=3)
    follow = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Say more."}]}]
    second = sdk.responses.create(model=MODEL, previous_response_id=first.id, input=follow, max_output_tokens=3)  # type: ignore[arg-type]
    listed = sdk.responses.input_items.list(second.id, order="asc")
    items = [item.model_dump(exclude_none=True) for item in listed.data]
    assert [(i["type"], i.get("role")) for i in items] == [
        ("message", "user"),
        *[(o.type, getattr(o, "role", None)) for o in first.output],
        ("message", "developer"),
    ]
    assert items[0]["content"] == [{"type": "input_text", "text": "Hi"}]
    assert [i["id"] for i in items[1:-1]] == [o.id for o in first.output], "an output item keeps its id"
    assert items[-1]["content"] == follow[0]["content"] and len({i["id"] for i in items}) == len(items)
    raw = httpx.get(f"{served.url}/v1/responses/{second.id}/input_items", timeout=60).json()
    assert raw["object"] == "list" and [i["id"] for i in raw["data"]] == [i["id"] for i in reversed(items)]
    assert (raw["first_id"], raw["last_id"], raw["has_more"]) == (items[-1]["id"], items[0]["id"], False)
    page = httpx.get(
        f"{served.url}/v1/responses/{second.id}/input_items",
        params={"limit": 1, "order": "asc", "after": items[0]["id"]},
        timeout=60,
    ).json()
    assert [i["id"] for i in page["data"]] == [items[1]["id"]] and page["has_more"] is (len(items) > 2)
    assert [i.id for i in sdk.responses.input_items.list(first.id).data] == [items[0]["id"]]
    with pytest.raises(openai.NotFoundError):
        sdk.responses.input_items.list("resp_none")
    for query in ({"limit": 0}, {"limit": "x"}, {"order": "up"}, {"after": "msg_none"}, {"before": "x"}):
        bad = httpx.get(f"{served.url}/v1/responses/{second.id}/input_items", params=query, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == next(iter(query)), bad.text


def test_store_false_keeps_nothing_and_delete_removes(served: Server) -> None:
    sdk = client(served)
    kept = sdk.responses.create(model=MODEL, input="Hi", max_output_tokens=3)
    gone = sdk.responses.create(model=MODEL, input="Hi", max_output_tokens=3, store=False)
    assert sdk.responses.retrieve(kept.id).id == kept.id
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(gone.id)
    sdk.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(kept.id)


def test_bad_requests_over_http_keep_the_server_serving(served: Server) -> None:
    for body, status, param in BAD:
        response = httpx.post(served.url + "/v1/responses", json=body, timeout=60)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["param"] == param
    big = httpx.post(served.url + "/v1/responses", content=b"x" * (9 * 1024 * 1024), timeout=60)
    assert big.status_code in (400, 413) and "limit" in big.json()["error"]["message"]
    assert httpx.post(served.url + "/v1/responses", content=b"{oops", timeout=60).status_code == 400
    assert httpx.get(served.url + "/v1/responses/resp_none", timeout=60).status_code == 404
    assert httpx.get(served.url + "/health", timeout=60).status_code == 200


def test_a_response_outlives_a_restart(tmp_path: Path) -> None:
    store = tmp_path / "kept.sqlite3"
    first = chatcodec_serve(tmp_path, "--responses-store", str(store), name="before")
    try:
        answer = client(first).responses.create(model=MODEL, input="Say hi.", max_output_tokens=4)
    finally:
        first.stop()
    second = chatcodec_serve(tmp_path, "--responses-store", str(store), name="after")
    try:
        again = client(second).responses.retrieve(answer.id)
        assert again.output_text == answer.output_text and again.id == answer.id
        more = client(second).responses.create(
            model=MODEL, input="Again.", previous_response_id=answer.id, max_output_tokens=2
        )
        assert more.usage is not None and answer.usage is not None
        assert more.usage.input_tokens > answer.usage.input_tokens
    finally:
        second.stop()


def test_the_agents_sdk_runs_a_tool_to_a_final_answer(served: Server) -> None:
    import asyncio

    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def get_weather(location: forced.Location) -> str:  # an enum: the forced call has a bound (tests/forced.py)
        """The weather in a place."""
        ran.append(location)
        return f"Sunny in {location}."

    sdk = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="unused", timeout=600, max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer in one short sentence.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL, openai_client=sdk),
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=300),
        # the 135M model calls the tool again on every turn it may (4 turns of auto did not end): the run's final
        # answer is the tool's, as the SDK's stop_on_first_tool gives it
        tool_use_behavior="stop_on_first_tool",
    )

    async def run() -> Any:
        async with sdk:  # closed before the loop ends: no socket is left for a later test's warnings
            return await Runner.run(agent, "What is the weather in Oslo?", max_turns=4)

    result = asyncio.run(run())
    assert len(ran) == 1 and ran[0].strip(), "the tool ran once, with a location"
    assert result.final_output == f"Sunny in {ran[0]}."


def test_langchain_chat_openai_keeps_working(served: Server) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(location: forced.Location) -> str:  # an enum: the forced call has a bound (tests/forced.py)
        """The weather in a place."""
        return "Sunny"

    for responses_api in (False, True):
        llm = ChatOpenAI(
            base_url=served.url + "/v1",
            api_key="unused",
            model=MODEL,
            temperature=0,
            max_tokens=forced.CALL_TOKENS,  # type: ignore[arg-type]  # one call (named), at most 107 bytes
            use_responses_api=responses_api,
            timeout=600,
            max_retries=0,
        )
        message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Lima?")
        assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather", responses_api
        assert isinstance(message.tool_calls[0]["args"].get("location"), str)


# --- the guide ----------------------------------------------------------------------------------------


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_guides_python_blocks_run() -> None:
    blocks = _blocks("python")
    assert blocks
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr


def _curl_lines() -> list[str]:
    return [
        line for block in _blocks("bash") for line in block.replace("\\\n", " ").splitlines() if line.startswith("curl")
    ]


def _forced(line: str) -> tuple[str, dict[str, Any]] | None:
    """``(path, body)`` of a guide's curl line that forces a tool call, else None."""
    (body_text,) = re.findall(r"-d '(.*?)'", line)
    body = json.loads(body_text)
    choice = body.get("tool_choice")
    if choice == "required" or (isinstance(choice, dict) and choice.get("type") == "any"):
        return line.split()[1].removeprefix("http://127.0.0.1:8000"), body
    return None


def test_the_guides_forced_calls_are_whole_within_their_limit() -> None:
    """Each forced call of the guide's curl lines: one call at a time, greedy, and the longest text the grammar the
    server builds for it admits (tests/forced.py) within its token limit."""
    smol = load_template(default_model_path())
    found = [forced_line for line in _curl_lines() if (forced_line := _forced(line)) is not None]
    assert sorted(path for path, _ in found) == ["/v1/messages", "/v1/responses"]
    for path, body in found:
        if path == "/v1/responses":
            request, limit = parse_responses(body).chat, body["max_output_tokens"]
            assert body["parallel_tool_calls"] is False
        else:
            request, limit = parse_messages(body), body["max_tokens"]
            assert body["tool_choice"]["disable_parallel_tool_use"] is True
        assert body["temperature"] == 0
        bound = forced.longest(served_grammar(smol, request)) + 1
        assert bound == 470 <= limit, (path, bound)  # 470: what the guide says


def test_the_guides_curl_lines_run(served: Server) -> None:
    lines = _curl_lines()
    assert len(lines) >= 4
    for line in lines:
        done = subprocess.run(
            ["bash", "-c", line.replace("http://127.0.0.1:8000", served.url)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (line, done.stderr)
        answer = json.loads(done.stdout)
        assert answer.get("error") is None and answer.get("type") != "error", (line, answer)
        forced_call = _forced(line)
        if forced_call is None:
            continue
        path, body = forced_call
        schema = body["tools"][0].get("parameters") or body["tools"][0]["input_schema"]
        if path == "/v1/responses":  # the one call, whole (not cut by max_output_tokens)
            assert answer["status"] == "completed", answer
            (call,) = [item for item in answer["output"] if item["type"] == "function_call"]
            assert call["name"] == "get_weather" and call["status"] == "completed"
            jsonschema.validate(json.loads(call["arguments"]), schema)
        else:
            assert answer["stop_reason"] == "tool_use", answer
            (call,) = [block for block in answer["content"] if block["type"] == "tool_use"]
            assert call["name"] == "get_weather"
            jsonschema.validate(call["input"], schema)
