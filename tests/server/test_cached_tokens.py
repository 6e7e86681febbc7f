"""Usage counts the prompt tokens the embedded engine kept from its last evaluation (OpenAI's ``cached_tokens``).

The expected count is computed from the ids the server reports (vLLM's ``return_token_ids``): after a
generation the engine holds its prompt and every sampled token but the last, and the next prompt keeps the
longest common prefix with that, but its own last token (whose logits are needed).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from ..tools.test_conversation_engine import kept_prefix
from .conftest import Server


def post(server: Server, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(server.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_chat_completions_usage_counts_the_kept_prompt_of_the_turn_before(embedded: Server) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    body = {"max_tokens": 6, "temperature": 0, "return_token_ids": True}
    first = post(embedded, "/v1/chat/completions", {**body, "messages": messages})
    held = first["prompt_token_ids"] + first["choices"][0]["token_ids"][:-1]
    messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]}]
    messages += [{"role": "user", "content": "Another one."}]
    second = post(embedded, "/v1/chat/completions", {**body, "messages": messages})
    prompt = second["prompt_token_ids"]
    expected = kept_prefix(held, prompt)
    assert expected >= len(first["prompt_token_ids"]) - 1  # at least the whole first prompt was kept
    usage = second["usage"]
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["prompt_tokens_details"] == {"cached_tokens": expected}


def test_responses_usage_counts_the_kept_prompt(embedded: Server) -> None:
    body = {"input": "Name a colour.", "max_output_tokens": 16, "temperature": 0}
    post(embedded, "/v1/responses", body)
    usage = post(embedded, "/v1/responses", body)["usage"]
    # the same prompt again: all of it is kept but its last token, evaluated for the first token's logits
    assert usage["input_tokens_details"]["cached_tokens"] == usage["input_tokens"] - 1 > 0
