"""The server decodes with a model's own ``response_template`` (issue 31, item 4): a model folder whose
``tokenizer_config.json`` carries one, served over the embedded model's weights, answers through it, and
``--tool-call-parser`` still overrides it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatcodec import load_template, response_template
from chatcodec.server.chat import ChatService
from chatcodec.server.protocol import ChatRequest

from .. import forced
from ..conftest import CORPUS, require_shared

pytest.importorskip("regex")
pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    from chatcodec.backends import LlamaBackend

    found = LlamaBackend(n_threads=1)
    yield found
    asyncio.run(found.aclose())


def _folder(tmp_path: Path) -> Path:
    """A model folder: the corpus' Qwen3 template and the response template chatcodec writes for it."""
    require_shared()
    source = (CORPUS / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    config = {"chat_template": source, "eos_token": "<|im_end|>", "response_template": response_template("qwen3")}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return tmp_path


def test_the_server_answers_through_the_shipped_response_template(backend: Any, tmp_path: Path) -> None:
    template = load_template(str(_folder(tmp_path)))
    assert template.response_template is not None
    tools = forced.temperature_tools()
    chosen = tools[0]["function"]["name"]
    req = ChatRequest(
        messages=[{"role": "user", "content": "What is the temperature in Paris?"}],
        tools=tools,
        tool_choice=chosen,
        max_tokens=forced.CALL_TOKENS,
        temperature=0.0,
        chat_template_kwargs={"enable_thinking": False},  # no thought first: a thought has no bound
    )
    service = ChatService(backend, template, model="shipped")
    plan = service.plan(req)
    assert plan.decoder.name == "response_template"  # the model's own says how its output is parsed
    # every argument an enum, one call: whatever the model writes, the call ends within max_tokens
    assert plan.generation.constraint is not None
    assert forced.longest(plan.generation.constraint.grammar) + 1 <= forced.CALL_TOKENS
    answer = asyncio.run(service.complete(plan))
    message = answer["choices"][0]["message"]
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == [chosen], message
    assert isinstance(json.loads(calls[0]["function"]["arguments"]), dict)

    hermes = ChatService(backend, template, model="shipped", tool_parser="hermes")
    assert hermes.plan(req).decoder.name == "hermes"  # --tool-call-parser overrides the shipped template
