"""Chat completions that tell the truth (issue 30, item 5), on the embedded model:

- ``finish_reason`` is ``"length"`` whenever the token limit ended generation, even when it cut a tool call;
- a ``model`` the server does not serve is a 404 ``model_not_found``; its name and its aliases are answered;
- ``max_tokens`` beyond what the context leaves is a 400 that says how many tokens are left;
- ``--max-tokens-default`` caps a request that sets no limit;
- ``chatcodec tools run`` asks for a bounded number of tokens per round, and says how many.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatcodec.backends import ModelInfo
from chatcodec.server.chat import ChatService, Plan
from chatcodec.server.errors import APIError
from chatcodec.server.protocol import ChatRequest

from .. import forced
from ..conftest import CORPUS
from .conftest import Server, chatcodec_serve, temperature_tools

#: the served name and an alias of the truth server, and its default output cap
NAME, ALIAS, CAP = "smol", "smol-alias", 7
USER = [{"role": "user", "content": "Write a long story about a dragon."}]


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The embedded model served under two names, with a default output cap of :data:`CAP` tokens."""
    server = chatcodec_serve(
        tmp_path_factory.mktemp("truth"),
        "--served-model-name", NAME, ALIAS, "--max-tokens-default", str(CAP), "--responses-store", "none",
        name="truth",
    )  # fmt: skip
    yield server
    server.stop()


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=600)


def test_a_cut_tool_call_finishes_with_length(embedded: Server) -> None:
    body = {"model": "SmolLM2-135M-Instruct", "messages": USER, "tools": temperature_tools()}
    # a whole call takes at least 23 tokens, and 14 write at least '{ "tool_calls"' (tests/forced.py)
    body |= {"tool_choice": "required", "max_tokens": forced.CUT_TOKENS, "temperature": 0}
    answer = post(embedded, "/v1/chat/completions", body).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == forced.CUT_TOKENS
    assert not choice["message"].get("tool_calls")
    kept = choice["message"].get("content") or json.dumps(choice["message"].get("invalid_tool_calls"))
    assert '"tool_calls"' in kept, "the cut call is kept (the generic format's text, or marked invalid)"


def test_a_cut_tool_call_finishes_with_length_in_a_stream(embedded: Server) -> None:
    body = {"model": "SmolLM2-135M-Instruct", "messages": USER, "tools": temperature_tools(), "stream": True}
    body |= {"tool_choice": "required", "max_tokens": forced.CUT_TOKENS, "temperature": 0}  # never a whole call
    with httpx.stream("POST", embedded.url + "/v1/chat/completions", json=body, timeout=600) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"][0]["finish_reason"]]
    assert finishes == ["length"]


def test_a_model_not_served_is_a_404(capped: Server) -> None:
    for path, body in [
        ("/v1/chat/completions", {"model": "gpt-4", "messages": USER, "max_tokens": 2}),
        ("/v1/completions", {"model": "gpt-4", "prompt": "Hi", "max_tokens": 2}),
        ("/v1/responses", {"model": "gpt-4", "input": "Hi", "max_output_tokens": 2}),
    ]:
        response = post(capped, path, body)
        assert response.status_code == 404, path
        error = response.json()["error"]
        assert error["type"] == "model_not_found" and error["param"] == "model"
        assert "'gpt-4'" in error["message"] and f"'{NAME}'" in error["message"]
    anthropic = post(capped, "/v1/messages", {"model": "claude-x", "max_tokens": 2, "messages": USER})
    assert anthropic.status_code == 404
    assert anthropic.json()["error"]["type"] == "not_found_error"


def test_the_name_and_its_aliases_are_served(capped: Server) -> None:
    assert [m["id"] for m in capped.get("/v1/models")["data"]] == [NAME]
    for model in (NAME, ALIAS):
        answer = post(capped, "/v1/chat/completions", {"model": model, "messages": USER, "max_tokens": 2}).json()
        assert answer["model"] == NAME and answer["usage"]["completion_tokens"] <= 2


def test_max_tokens_beyond_the_context_is_a_400_that_says_what_is_left(capped: Server) -> None:
    context = capped.get("/v1/models")["data"][0]["max_model_len"]
    prompt = post(capped, "/tokenize", {"messages": USER}).json()["count"]
    response = post(capped, "/v1/chat/completions", {"model": NAME, "messages": USER, "max_tokens": 100_000})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "max_tokens"
    assert f"leaves {context - prompt}" in error["message"] and str(context) in error["message"]
    # one past what is left is refused too (what is left itself would generate thousands of tokens here)
    over = post(capped, "/v1/chat/completions", {"model": NAME, "messages": USER, "max_tokens": context - prompt + 1})
    assert over.status_code == 400 and f"leaves {context - prompt}" in over.json()["error"]["message"]


def test_the_default_cap_holds_a_request_without_a_limit(capped: Server) -> None:
    answer = post(capped, "/v1/chat/completions", {"model": NAME, "messages": USER, "temperature": 0}).json()
    assert answer["usage"]["completion_tokens"] == CAP
    assert answer["choices"][0]["finish_reason"] == "length"
    # a limit the request sets wins over the default
    longer = post(capped, "/v1/chat/completions", {"model": NAME, "messages": USER, "max_tokens": CAP + 3})
    assert longer.json()["usage"]["completion_tokens"] == CAP + 3


def test_tools_run_bounds_each_round_and_says_so(embedded: Server, tmp_path: Path) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text(
        'def get_time(city: str) -> str:\n    """The time in a city.\n\n    Args:\n        city: the city\n    """\n'
        '    return "12:00"\n',
        encoding="utf-8",
    )
    argv = [sys.executable, "-m", "chatcodec", "tools", "run", str(tools), "--url", embedded.url + "/v1"]
    argv += ["--prompt", "What time is it in Paris?", "--max-rounds", "2", "--tool-choice", "required"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "each round asked for at most 512 tokens" in done.stderr
    transcript = json.loads(done.stdout)
    assert transcript, "the loop ran"


# --- reasoning effort, one meaning for every template (issue 30, item 3) -------------------------------


class _Quiet:
    """A backend that is never asked to generate: planning is under test."""

    info = ModelInfo("quiet", context_length=32768)


def _plan(template: str, **fields: Any) -> Plan:
    from chatcodec import load_template

    service = ChatService(_Quiet(), load_template(str(CORPUS / "templates" / f"{template}.jinja")), model="quiet")  # type: ignore[arg-type]
    return service.plan(ChatRequest(messages=[{"role": "user", "content": "Hi"}], **fields))


def test_effort_sets_enable_thinking() -> None:
    off = _plan("Qwen-Qwen3-0.6B", reasoning_effort="none")
    on = _plan("Qwen-Qwen3-0.6B", reasoning_effort="high")
    assert off.prompt.endswith("<think>\n\n</think>\n\n") and not on.prompt.endswith("</think>\n\n")
    assert off.reasoning_ignored is None
    # the caller's own switch stands
    kept = _plan("Qwen-Qwen3-0.6B", reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
    assert kept.prompt == on.prompt


def test_effort_and_budget_set_reasoning_effort() -> None:
    assert "Reasoning: high" in _plan("openai-gpt-oss-120b", reasoning_effort="high").prompt
    assert "Reasoning: low" in _plan("openai-gpt-oss-120b", reasoning_effort="low", thinking_budget=2048).prompt
    with pytest.raises(APIError) as caught:
        _plan("openai-gpt-oss-120b", reasoning_effort="minimal", reasoning_field="reasoning.effort")
    assert caught.value.status == 400 and caught.value.param == "reasoning.effort"
    assert "low, medium, high" in caught.value.message


def test_a_template_without_a_switch_says_it_ignored_the_effort(capped: Server) -> None:
    assert "no reasoning switch" in (_plan("chujiezheng-chatml", reasoning_effort="high").reasoning_ignored or "")
    body = {"model": NAME, "messages": USER, "max_tokens": 1, "reasoning_effort": "high"}
    response = post(capped, "/v1/chat/completions", body)
    assert response.status_code == 200 and response.headers["chatcodec-reasoning"].startswith("ignored: ")
    assert "chatcodec-reasoning" not in post(capped, "/v1/chat/completions", {**body, "reasoning_effort": None}).headers
    bad = post(capped, "/v1/chat/completions", {**body, "reasoning_effort": "extreme"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
