"""The chat checks of issue 11, run with the official ``openai`` client against a running server.

:class:`ChatChecks` is subclassed by the embedded and the remote test modules, each of which provides
the ``server`` fixture. Generation is kept short (small ``max_tokens``, greedy sampling). A forced call is one of
tests/forced.py's tools, every argument an enum, one call at a time, with ``max_tokens`` that finish any such call;
a cut call is cut by fewer tokens than any call takes (what the model writes differs with the machine's CPU).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from .. import forced
from .conftest import Server, roundtrip_messages, temperature_tools

#: what SmolLM2's own template (from the GGUF) writes for one user turn, with the generation prompt
SMOL_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
QUESTION = "What's the temperature in San Francisco now? How about tomorrow? Current Date: 2024-09-30."


def client_for(server: Server) -> openai.OpenAI:
    # generous: a busy 2-core machine runs the 135M model at a few tokens per second
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600, max_retries=0)


def schemas() -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"]["parameters"] for t in forced.temperature_tools()}


def assert_valid_call(name: str, arguments: str) -> None:
    """The call names one of the tools and its arguments are valid JSON for that tool's schema."""
    assert name in schemas(), name
    jsonschema.validate(json.loads(arguments), schemas()[name])


def collect(stream: Any) -> dict[str, Any]:
    """Reassemble a streamed answer: role, content, reasoning, tool calls, finish reason, usage."""
    out: dict[str, Any] = {"role": None, "content": "", "calls": {}, "finish": None, "usage": None, "chunks": 0}
    for chunk in stream:
        out["chunks"] += 1
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta.role:
                assert out["role"] is None, "the role comes once, first"
                out["role"] = delta.role
            out["content"] += delta.content or ""
            for call in delta.tool_calls or ():
                entry = out["calls"].setdefault(call.index, {"id": None, "name": None, "arguments": ""})
                if call.id:
                    entry["id"] = entry["id"] or call.id
                if call.function and call.function.name:
                    assert entry["name"] is None, "a tool name arrives once, whole"
                    entry["name"] = call.function.name
                if call.function and call.function.arguments:
                    entry["arguments"] += call.function.arguments
            if choice.finish_reason:
                out["finish"] = choice.finish_reason
    return out


class ChatChecks:
    """Every chat check; ``server`` is a fixture of the module that runs them."""

    @pytest.fixture
    def client(self, server: Server) -> openai.OpenAI:
        return client_for(server)

    def model(self, client: openai.OpenAI) -> str:
        return client.models.list().data[0].id

    def test_plain_chat(self, client: openai.OpenAI) -> None:
        answer = client.chat.completions.create(
            model=self.model(client), messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0
        )
        choice = answer.choices[0]
        assert choice.message.role == "assistant"
        assert isinstance(choice.message.content, str) and choice.message.content.strip()
        assert choice.finish_reason in ("stop", "length")
        assert not choice.message.tool_calls

    def test_streamed_chat_equals_whole(self, client: openai.OpenAI) -> None:
        params: dict[str, Any] = {
            "model": self.model(client),
            "messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": 16,
            "temperature": 0,
        }
        # the first request evaluates the prompt in one batch, later ones from the engine's cached prefix, and
        # llama.cpp's logits differ in their last bits between the two (a near tie can then flip a greedy token):
        # the whole answer compared is one on the cached path, as the stream's is
        client.chat.completions.create(**params)
        whole = client.chat.completions.create(**params)
        streamed = collect(
            client.chat.completions.create(**params, stream=True, stream_options={"include_usage": True})
        )
        assert streamed["role"] == "assistant"
        assert streamed["content"] == whole.choices[0].message.content
        assert streamed["finish"] == whole.choices[0].finish_reason
        assert streamed["usage"] is not None
        assert streamed["usage"].completion_tokens == whole.usage.completion_tokens
        assert streamed["usage"].prompt_tokens == whole.usage.prompt_tokens

    def test_required_gives_schema_valid_calls(self, client: openai.OpenAI) -> None:
        answer = client.chat.completions.create(
            model=self.model(client),
            messages=[{"role": "user", "content": QUESTION}],
            tools=forced.temperature_tools(),
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=forced.CALL_TOKENS,  # every argument an enum: the longest call is 164 bytes
            temperature=0,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:
            assert call.id and call.type == "function"
            assert_valid_call(call.function.name, call.function.arguments)

    def test_required_streamed_gives_schema_valid_calls(self, client: openai.OpenAI) -> None:
        params: dict[str, Any] = {
            "model": self.model(client),
            "messages": [{"role": "user", "content": QUESTION}],
            "tools": forced.temperature_tools(),
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_tokens": forced.CALL_TOKENS,  # every argument an enum: the longest call is 164 bytes
            "temperature": 0,
        }
        # both answers compared come from the engine's cached prefix (see test_streamed_chat_equals_whole)
        client.chat.completions.create(**params)
        streamed = collect(client.chat.completions.create(**params, stream=True))
        assert streamed["finish"] == "tool_calls"
        assert streamed["calls"]
        for entry in streamed["calls"].values():
            assert entry["id"]
            assert_valid_call(entry["name"], entry["arguments"])
        whole = client.chat.completions.create(**params)
        assert [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls] == [
            (e["name"], e["arguments"]) for _, e in sorted(streamed["calls"].items())
        ]

    def test_tool_results_give_a_final_answer(self, client: openai.OpenAI) -> None:
        # SmolLM2 (135M) calls the tools again under "auto"; "none" asks for the answer.
        answer = client.chat.completions.create(
            model=self.model(client),
            messages=roundtrip_messages(),
            tools=temperature_tools(),
            tool_choice="none",
            max_tokens=40,
            temperature=0,
        )
        choice = answer.choices[0]
        assert not choice.message.tool_calls, choice.message.tool_calls
        assert choice.finish_reason in ("stop", "length")
        assert isinstance(choice.message.content, str) and choice.message.content.strip()

    def test_named_tool_choice(self, client: openai.OpenAI) -> None:
        for name in ("get_temperature_date", "get_current_temperature"):
            answer = client.chat.completions.create(
                model=self.model(client),
                messages=[{"role": "user", "content": QUESTION}],
                tools=forced.temperature_tools(),
                tool_choice={"type": "function", "function": {"name": name}},
                max_tokens=forced.CALL_TOKENS,  # every argument an enum: the longest call is 164 bytes
                temperature=0,
            )
            calls = answer.choices[0].message.tool_calls
            assert calls and [c.function.name for c in calls] == [name]
            assert_valid_call(name, calls[0].function.arguments)

    def test_legacy_functions(self, client: openai.OpenAI) -> None:
        functions = [t["function"] for t in forced.temperature_tools()]
        answer = client.chat.completions.create(
            model=self.model(client),
            messages=[{"role": "user", "content": QUESTION}],
            functions=functions,
            function_call={"name": "get_current_temperature"},
            max_tokens=forced.CALL_TOKENS,  # every argument an enum: the longest call is 164 bytes
            temperature=0,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "function_call"
        assert choice.message.function_call is not None
        assert_valid_call(choice.message.function_call.name, choice.message.function_call.arguments)
        # Qwen-Agent's result turn: role "function" with the function's name.
        history = [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "", "function_call": choice.message.function_call.model_dump()},
            {"role": "function", "name": "get_current_temperature", "content": '{"temperature": 26.1}'},
        ]
        final = client.chat.completions.create(
            model=self.model(client),
            messages=history,
            functions=functions,
            function_call="none",
            max_tokens=30,
            temperature=0,
        )
        assert final.choices[0].message.function_call is None
        assert (final.choices[0].message.content or "").strip()

    def test_response_format_json_schema(self, client: openai.OpenAI) -> None:
        schema = forced.CITY  # a city of at most 24 characters: the longest answer is 194 bytes
        answer = client.chat.completions.create(
            model=self.model(client),
            messages=[{"role": "user", "content": "Give the largest city of France and its population as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
            max_tokens=forced.CITY_TOKENS,
            temperature=0,
        )
        content = answer.choices[0].message.content
        assert answer.choices[0].finish_reason == "stop", content
        jsonschema.validate(json.loads(content or ""), schema)

    def test_usage_counts_real_tokens(self, client: openai.OpenAI, vocabulary: Any) -> None:
        answer = client.chat.completions.create(
            model=self.model(client), messages=[{"role": "user", "content": "Hello there"}], max_tokens=5, temperature=0
        )
        expected = vocabulary.tokenize(SMOL_PROMPT.format("Hello there").encode(), add_bos=False, special=True)
        assert answer.usage.prompt_tokens == len(expected)
        assert answer.choices[0].finish_reason == "length"
        assert answer.usage.completion_tokens == 5
        assert answer.usage.total_tokens == len(expected) + 5
        generated = vocabulary.tokenize(
            (answer.choices[0].message.content or "").encode(), add_bos=False, special=False
        )
        assert len(generated) <= 5

    def test_cut_off_call_is_never_a_call(self, client: openai.OpenAI) -> None:
        """A call cut off by max_tokens is not sent as a call, and its text is kept: in content, or in
        ``invalid_tool_calls`` with the reason (the last stream event names it too)."""
        params: dict[str, Any] = {
            "model": self.model(client),
            "messages": [{"role": "user", "content": QUESTION}],
            "tools": temperature_tools(),
            "tool_choice": "required",
            "max_tokens": forced.CUT_TOKENS,  # a whole call takes at least 23 tokens: never finished
            "temperature": 0,
        }
        # both answers compared come from the engine's cached prefix (see test_streamed_chat_equals_whole)
        client.chat.completions.create(**params)
        choice = client.chat.completions.create(**params).choices[0]
        assert choice.finish_reason == "length"
        assert not choice.message.tool_calls
        invalid = (choice.message.model_extra or {}).get("invalid_tool_calls") or []
        kept = (choice.message.content or "") + "".join(entry["raw"] for entry in invalid)
        assert '"tool_calls"' in kept
        for entry in invalid:
            assert entry["name"] in schemas() and entry["error"]
        last = None
        content = ""
        for chunk in client.chat.completions.create(**params, stream=True):
            for streamed in chunk.choices:
                content += streamed.delta.content or ""
                if streamed.finish_reason:
                    last = streamed
        assert last is not None and last.finish_reason == "length"
        notices = (last.delta.model_extra or {}).get("invalid_tool_calls") or []
        assert [n["index"] for n in notices] == [e["index"] for e in invalid]
        assert content == (choice.message.content or "")
