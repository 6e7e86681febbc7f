"""Toolbox.run and arun: the loop's logic against scripted replies, through the real openai client.

The model here is a script (a function of the request) behind the official openai client, with
httpx's mock transport in place of the network: every request the loop makes goes through the SDK's
own serialization and parsing. The end-to-end tests against `chatcodec serve` and its embedded model
are in test_end_to_end.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

import openai
import pytest

from chatcodec import ChatcodecError, InputError, Toolbox
from chatcodec.tools import Round

try:  # the HTTP library under the openai client: httpx2 from openai 3, httpx before
    import httpx2
except ImportError:  # pragma: no cover - older openai releases
    import httpx as httpx2  # type: ignore[no-redef]

Reply = dict[str, Any]
Script = Callable[[dict[str, Any]], Reply]

QUESTION = "What's the temperature in San Francisco now? How about tomorrow? Current Date: 2024-09-30."
ANSWER = "It is 26.1°C now and will be 25.9°C tomorrow."


def completion(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def calls(*pairs: tuple[str, dict[str, Any]]) -> Reply:
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        for i, (name, arguments) in enumerate(pairs)
    ]
    return completion({"content": None, "tool_calls": tool_calls}, "tool_calls")


def answer(text: str = ANSWER) -> Reply:
    return completion({"content": text})


SF = "San Francisco, CA, USA"
BOTH = (("get_current_temperature", {"location": SF}), ("get_temperature_date", {"location": SF, "date": "2024-10-01"}))


class Server:
    """The scripted model behind an openai client: records each request body, answers with the script."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/chat/completions"
        body = json.loads(request.content)
        self.requests.append(body)
        return httpx2.Response(200, json=self.script(body))

    def client(self) -> openai.OpenAI:
        http = httpx2.Client(transport=httpx2.MockTransport(self.handle))
        return openai.OpenAI(base_url="http://model.test/v1", api_key="none", http_client=http, max_retries=0)

    def async_client(self) -> openai.AsyncOpenAI:
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(self.handle))
        return openai.AsyncOpenAI(base_url="http://model.test/v1", api_key="none", http_client=http, max_retries=0)


def seed_script(body: dict[str, Any]) -> Reply:
    """Calls both tools while there are no results in the conversation, then answers."""
    if any(m["role"] in ("tool", "function") for m in body["messages"]):
        return answer()
    return calls(*BOTH)


@pytest.fixture
def toolbox(temperature: ModuleType) -> Toolbox:
    return Toolbox(temperature.TOOLS)


def test_the_seed_round_trip_in_the_tools_style(toolbox: Toolbox, roundtrip: dict[str, Any]) -> None:
    server = Server(seed_script)
    rounds: list[Round] = []
    transcript = toolbox.run(
        server.client(),
        [{"role": "user", "content": QUESTION}],
        model="scripted",
        tool_choice="required",
        temperature=0,
        on_round=rounds.append,
    )

    # the whole transcript, results in the seed's exact form, ending with the answer
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "tool", "assistant"]
    assert transcript[0] == {"role": "user", "content": QUESTION}
    assert [c["function"]["name"] for c in transcript[1]["tool_calls"]] == [n for n, _ in BOTH]
    assert [m["content"] for m in transcript[2:4]] == [m["content"] for m in roundtrip["messages"][2:4]]
    assert [m["tool_call_id"] for m in transcript[2:4]] == ["call_0", "call_1"]
    assert transcript[-1] == {"role": "assistant", "content": ANSWER}

    # what the model was sent: tools each round, required then auto, the transcript so far, the extra params
    first, second = server.requests
    assert first["tools"] == second["tools"] == roundtrip["tools"]
    assert (first["tool_choice"], second["tool_choice"]) == ("required", "auto")
    assert first["messages"] == transcript[:1] and second["messages"] == transcript[:4]
    assert first["temperature"] == second["temperature"] == 0
    assert "functions" not in first and "function_call" not in first

    assert [(r.index, r.final, len(r.results)) for r in rounds] == [(0, False, 2), (1, True, 0)]
    assert rounds[0].messages == tuple(transcript[1:4]) and rounds[1].messages == (transcript[4],)
    assert rounds[0].results[1].arguments == {"location": SF, "date": "2024-10-01"}


def test_the_qwen_agent_style(toolbox: Toolbox) -> None:
    """functions=[...] and function_call; parallel calls become one assistant message each, results role function."""
    server = Server(seed_script)
    transcript = toolbox.run(
        server.client(),
        [{"role": "user", "content": QUESTION}],
        model="scripted",
        style="functions",
        tool_choice="auto",
    )
    assert [m["role"] for m in transcript] == ["user", "assistant", "assistant", "function", "function", "assistant"]
    assert [m["function_call"]["name"] for m in transcript[1:3]] == [n for n, _ in BOTH]
    assert all("tool_calls" not in m for m in transcript)
    assert transcript[3] == {
        "role": "function",
        "name": "get_current_temperature",
        "content": '{"temperature": 26.1, "location": "San Francisco, CA, USA", "unit": "celsius"}',
    }
    assert transcript[4]["name"] == "get_temperature_date"
    first = server.requests[0]
    assert first["functions"] == toolbox.functions and "tools" not in first
    assert first["function_call"] == "auto"


def test_legacy_function_call_replies_one_per_round(toolbox: Toolbox) -> None:
    """A server that answers the legacy way: one function_call per reply, two rounds of calls."""

    def script(body: dict[str, Any]) -> Reply:
        done = [m["name"] for m in body["messages"] if m["role"] == "function"]
        if len(done) == 2:
            return answer()
        name, arguments = BOTH[len(done)]
        return completion(
            {"content": None, "function_call": {"name": name, "arguments": json.dumps(arguments)}}, "function_call"
        )

    server = Server(script)
    transcript = toolbox.run(
        server.client(),
        [{"role": "user", "content": QUESTION}],
        model="scripted",
        style="functions",
        tool_choice="get_current_temperature",
    )
    assert [m["role"] for m in transcript] == ["user", "assistant", "function", "assistant", "function", "assistant"]
    assert [m.get("name") for m in transcript if m["role"] == "function"] == [n for n, _ in BOTH]
    choices = [r["function_call"] for r in server.requests]
    assert choices == [{"name": "get_current_temperature"}, "auto", "auto"]


def test_named_choice_and_reset_off(toolbox: Toolbox) -> None:
    server = Server(seed_script)
    toolbox.run(
        server.client(),
        [{"role": "user", "content": QUESTION}],
        model="scripted",
        tool_choice={"type": "function", "function": {"name": "get_temperature_date"}},
        reset_tool_choice=False,
    )
    named = {"type": "function", "function": {"name": "get_temperature_date"}}
    assert [r["tool_choice"] for r in server.requests] == [named, named]


def test_no_tool_choice_is_not_sent(toolbox: Toolbox) -> None:
    server = Server(seed_script)
    toolbox.run(server.client(), [{"role": "user", "content": QUESTION}], model="scripted")
    assert ["tool_choice" in r for r in server.requests] == [False, False]


def test_the_last_round_asks_for_an_answer(toolbox: Toolbox) -> None:
    """A model that would call tools forever gets tool_choice none in the last allowed round."""

    def script(body: dict[str, Any]) -> Reply:
        if body.get("tool_choice") == "none":
            return answer("Giving up on more calls.")
        return calls(BOTH[0])

    server = Server(script)
    transcript = toolbox.run(server.client(), [{"role": "user", "content": QUESTION}], model="scripted", max_rounds=3)
    assert [r.get("tool_choice") for r in server.requests] == [None, None, "none"]
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert transcript[-1]["content"] == "Giving up on more calls."


def test_calls_made_in_the_last_round_anyway_are_run(toolbox: Toolbox) -> None:
    server = Server(lambda body: calls(BOTH[0]))  # ignores tool_choice none
    rounds: list[Round] = []
    transcript = toolbox.run(
        server.client(), [{"role": "user", "content": QUESTION}], model="scripted", max_rounds=2, on_round=rounds.append
    )
    assert len(server.requests) == 2
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "assistant", "tool"]
    assert rounds[-1].final and rounds[-1].results[0].error is None


def test_errors_reach_the_model_and_the_loop_goes_on(toolbox: Toolbox) -> None:
    def script(body: dict[str, Any]) -> Reply:
        results = [m for m in body["messages"] if m["role"] == "tool"]
        if not results:
            return calls(("get_weather", {"city": "Paris"}), ("get_temperature_date", {"location": SF}))
        return answer("Sorry: " + " / ".join(m["content"] for m in results))

    server = Server(script)
    rounds: list[Round] = []
    transcript = toolbox.run(
        server.client(), [{"role": "user", "content": "hi"}], model="scripted", on_round=rounds.append
    )
    assert [r.error for r in rounds[0].results] == [
        "unknown function 'get_weather'; the functions are: get_current_temperature, get_temperature_date",
        "invalid arguments for get_temperature_date: 'date' is a required property",
    ]
    assert transcript[-1]["content"].startswith("Sorry: Error: unknown function 'get_weather'")


def test_async_client_with_run_and_arun(toolbox: Toolbox) -> None:
    server = Server(seed_script)
    transcript = toolbox.run(server.async_client(), [{"role": "user", "content": QUESTION}], model="scripted")
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "tool", "assistant"]

    seen: list[int] = []

    async def on_round(r: Round) -> None:
        await asyncio.sleep(0)
        seen.append(r.index)

    async def main() -> list[dict[str, Any]]:
        return await toolbox.arun(
            server.async_client(), [{"role": "user", "content": QUESTION}], model="scripted", on_round=on_round
        )

    assert asyncio.run(main()) == transcript
    assert seen == [0, 1]


def test_arun_drives_a_sync_client_too(toolbox: Toolbox) -> None:
    server = Server(seed_script)
    transcript = asyncio.run(toolbox.arun(server.client(), [{"role": "user", "content": QUESTION}], model="scripted"))
    assert transcript[-1] == {"role": "assistant", "content": ANSWER}


def test_input_messages_are_not_changed_and_may_be_sdk_objects(toolbox: Toolbox) -> None:
    from openai.types.chat import ChatCompletionMessage

    history = [
        {"role": "system", "content": "Be brief."},
        ChatCompletionMessage(role="assistant", content="Hello."),
        {"role": "user", "content": QUESTION},
    ]
    before = json.dumps(history[0]), json.dumps(history[2])
    server = Server(seed_script)
    transcript = toolbox.run(server.client(), history, model="scripted")
    assert (json.dumps(history[0]), json.dumps(history[2])) == before and len(history) == 3
    assert transcript[1]["role"] == "assistant" and transcript[1]["content"] == "Hello."
    assert server.requests[0]["messages"][1]["content"] == "Hello."


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"style": "legacy"}, "style must be 'tools' or 'functions'"),
        ({"max_rounds": 0}, "max_rounds must be a positive integer"),
        ({"tool_choice": "get_weather"}, "tool_choice 'get_weather' is neither auto, none, required nor a tool"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "does not name a tool of this toolbox"),
        ({"tools": []}, "run() sets 'tools' itself"),
        ({"stream": True}, "run() sets 'stream' itself"),
    ],
)
def test_bad_loop_options(toolbox: Toolbox, kwargs: dict[str, Any], message: str) -> None:
    server = Server(seed_script)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        toolbox.run(server.client(), [{"role": "user", "content": "hi"}], model="scripted", **kwargs)
    assert server.requests == []


def test_bad_clients_messages_and_replies(toolbox: Toolbox) -> None:
    with pytest.raises(InputError, match="The client must be OpenAI-compatible"):
        toolbox.run(object(), [{"role": "user", "content": "hi"}], model="m")
    server = Server(seed_script)
    with pytest.raises(InputError, match="messages must be a list of message dicts, not str"):
        toolbox.run(server.client(), "hi", model="m")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="Message 0 is not a chat message with a role"):
        toolbox.run(server.client(), [{"content": "hi"}], model="m")
    with pytest.raises(InputError, match="This toolbox has no tools"):
        Toolbox().run(server.client(), [{"role": "user", "content": "hi"}], model="m")

    class Empty:
        class chat:  # the shape of the SDK: client.chat.completions.create
            class completions:
                @staticmethod
                def create(**request: Any) -> dict[str, Any]:
                    return {"choices": []}

    with pytest.raises(ChatcodecError, match="The model's reply has no choices"):
        toolbox.run(Empty(), [{"role": "user", "content": "hi"}], model="m")


def each_tool_once(names: list[str]) -> Callable[[int, list[dict[str, Any]]], Any]:
    """required first; then, by name, each tool not called yet; then none."""

    def policy(index: int, transcript: list[dict[str, Any]]) -> Any:
        if index == 0:
            return "required"
        called = {c["function"]["name"] for m in transcript for c in m.get("tool_calls") or ()}
        called |= {m["function_call"]["name"] for m in transcript if m.get("function_call")}
        missing = [name for name in names if name not in called]
        return missing[0] if missing else "none"

    return policy


def test_a_tool_choice_policy_per_round(toolbox: Toolbox) -> None:
    """A model that only ever picks one tool under required is led to the other by name, then asked to answer."""

    def script(body: dict[str, Any]) -> Reply:
        choice = body.get("tool_choice", body.get("function_call"))
        if choice == "none":
            return answer()
        if choice == "required":
            return calls(BOTH[1])
        name = choice["function"]["name"] if "function" in choice else choice["name"]
        return calls(next(pair for pair in BOTH if pair[0] == name))

    names = ["get_current_temperature", "get_temperature_date"]
    server = Server(script)
    transcript = toolbox.run(
        server.client(), [{"role": "user", "content": QUESTION}], model="m", tool_choice=each_tool_once(names)
    )
    assert [r["tool_choice"] for r in server.requests] == [
        "required",
        {"type": "function", "function": {"name": "get_current_temperature"}},
        "none",
    ]
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert transcript[-1] == {"role": "assistant", "content": ANSWER}

    # the legacy form has no "required": name the tools in turn
    legacy = Server(script)
    toolbox.run(
        legacy.client(),
        [{"role": "user", "content": QUESTION}],
        model="m",
        style="functions",
        tool_choice=lambda index, transcript: names[index] if index < len(names) else "none",
    )
    assert [r["function_call"] for r in legacy.requests] == [
        {"name": "get_current_temperature"},
        {"name": "get_temperature_date"},
        "none",
    ]
    with pytest.raises(InputError, match="The legacy functions style has no tool_choice 'required'"):
        toolbox.run(
            legacy.client(),
            [{"role": "user", "content": QUESTION}],
            model="m",
            style="functions",
            tool_choice="required",
        )
    assert len(legacy.requests) == 3


def test_a_policy_naming_an_unknown_tool_is_an_input_error(toolbox: Toolbox) -> None:
    server = Server(seed_script)
    with pytest.raises(InputError, match="tool_choice 'nope' is neither"):
        toolbox.run(server.client(), [{"role": "user", "content": "hi"}], model="m", tool_choice=lambda i, t: "nope")
