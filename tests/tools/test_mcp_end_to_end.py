"""MCP tools on the embedded model (SmolLM2-135M-Instruct): examples/temperature_mcp.py's server, configured
the way Qwen-Agent is, runs through ``toolbox.run`` with LocalClient() and against ``chatcodec serve``.

A forced first round (``tool_choice="required"``) must call one of the server's tools with schema-valid
arguments; the MCP server executes it, its result is in the next round's request, and the model answers.
The server serves the example's functions with every argument an enum (tests/tools/forced_mcp.py) and the
call is made one at a time, so that the forced call ends within max_tokens whatever the model writes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import jsonschema
import openai
import pytest

from chatcodec import Toolbox
from chatcodec.tools import LocalClient, Round

from .. import forced
from ..server.conftest import Server, chatcodec_serve
from . import forced_mcp

#: the example's server with tests/forced.py's functions, configured as the example configures its own
CONFIG = {"mcpServers": {"temperature": {"command": sys.executable, "args": [forced_mcp.__file__, "serve"]}}}
#: one call at a time, every argument an enum: the longest call is 164 bytes, so CALL_TOKENS always finish it
PARAMS: dict[str, Any] = {"temperature": 0, "max_tokens": forced.CALL_TOKENS, "parallel_tool_calls": False}


class Recording:
    """Keeps each request a client is sent (the sync openai client, or LocalClient's async create)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.requests: list[dict[str, Any]] = []
        self.chat = self
        self.completions = self

    def create(self, **request: Any) -> Any:
        self.requests.append(json.loads(json.dumps(request)))
        return self.client.chat.completions.create(**request)


class AsyncRecording(Recording):
    async def create(self, **request: Any) -> Any:  # type: ignore[override]
        self.requests.append(json.loads(json.dumps(request)))
        return await self.client.chat.completions.create(**request)


def check_forced_round(
    transcript: list[dict[str, Any]], rounds: list[Round], requests: list[dict[str, Any]], toolbox_tools: list[Any]
) -> None:
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in toolbox_tools}
    assert set(schemas) == {"get_current_temperature", "get_temperature_date"}
    first = rounds[0]
    assert first.results, "the forced round made no call"
    for result in first.results:
        assert result.error is None, result
        jsonschema.validate(result.arguments, schemas[result.name])
        value = json.loads(result.message["content"])  # what the MCP server's function returned
        assert value["location"] == result.arguments["location"]
        assert value["temperature"] == (26.1 if result.name == "get_current_temperature" else 25.9)
    assert requests[0]["tool_choice"] == "required"
    results = [result.message for result in first.results]
    assert requests[1]["messages"][2 : 2 + len(results)] == results  # the results reached the next round
    final = transcript[-1]
    assert final["role"] == "assistant" and not final.get("tool_calls")
    assert isinstance(final["content"], str) and final["content"].strip()


def test_a_forced_call_on_the_embedded_model_runs_the_mcp_tool(temperature: ModuleType) -> None:
    local = LocalClient()
    try:
        client = AsyncRecording(local)
        rounds: list[Round] = []
        with Toolbox.from_mcp_config(CONFIG) as toolbox:
            tools = toolbox.tools
            transcript = toolbox.run(
                client,
                [{"role": "user", "content": temperature.QUESTION}],
                model="local",
                tool_choice="required",
                max_rounds=2,
                on_round=rounds.append,
                **PARAMS,
            )
    finally:
        import asyncio

        asyncio.run(local.aclose())
    check_forced_round(transcript, rounds, client.requests, tools)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = chatcodec_serve(tmp_path_factory.mktemp("mcp-e2e"))
    yield server
    server.stop()


def test_the_mcp_example_against_chatcodec_serve(temperature: ModuleType, served: Server) -> None:
    client = Recording(openai.OpenAI(base_url=served.url + "/v1", api_key="none", timeout=300, max_retries=0))
    rounds: list[Round] = []
    with Toolbox.from_mcp_config(CONFIG) as toolbox:
        tools = toolbox.tools
        transcript = toolbox.run(
            client,
            [{"role": "user", "content": temperature.QUESTION}],
            model="SmolLM2-135M-Instruct",
            tool_choice="required",
            max_rounds=2,
            on_round=rounds.append,
            **PARAMS,
        )
    check_forced_round(transcript, rounds, client.requests, tools)
