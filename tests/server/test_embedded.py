"""``chatcodec serve`` with no arguments: the embedded SmolLM2 model, driven by the official client."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from .checks import SMOL_PROMPT, ChatChecks, client_for
from .conftest import Server


class TestEmbedded(ChatChecks):
    @pytest.fixture
    def server(self, embedded: Server) -> Server:
        return embedded


def test_models_and_health(embedded: Server) -> None:
    models = client_for(embedded).models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct"]
    assert httpx.get(embedded.url + "/health", timeout=30).status_code == 200


def test_enable_thinking_reaches_the_template(qwen35_template: Server, vocabulary: object) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    on = httpx.post(qwen35_template.url + "/tokenize", json={"messages": messages}, timeout=30).json()
    off = httpx.post(
        qwen35_template.url + "/tokenize",
        json={"messages": messages, "chat_template_kwargs": {"enable_thinking": False}},
        timeout=30,
    ).json()
    # Qwen3.5's template opens a think block in the prompt, and closes it empty when thinking is off.
    prompt_off = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert off["tokens"] == vocabulary.tokenize(prompt_off.encode(), add_bos=False, special=True)  # type: ignore[attr-defined]
    assert on["tokens"] == off["tokens"][: on["count"]] and on["count"] < off["count"]
    client = client_for(qwen35_template)
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=messages,
        max_tokens=4,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert answer.usage.prompt_tokens == off["count"]


def test_tokenize_and_detokenize(embedded: Server, vocabulary: object) -> None:
    text = SMOL_PROMPT.format("Hello")
    answer = httpx.post(embedded.url + "/tokenize", json={"prompt": text}, timeout=30).json()
    assert answer["tokens"] == vocabulary.tokenize(text.encode(), add_bos=False, special=True)  # type: ignore[attr-defined]
    chat = httpx.post(embedded.url + "/tokenize", json={"messages": [{"role": "user", "content": "Hello"}]}, timeout=30)
    assert chat.json()["tokens"] == answer["tokens"]
    back = httpx.post(embedded.url + "/detokenize", json={"tokens": answer["tokens"]}, timeout=30).json()
    assert back["prompt"] == text


def test_raw_completions(embedded: Server) -> None:
    client = client_for(embedded)
    # both answers compared come from the engine's cached prefix (see ChatChecks.test_streamed_chat_equals_whole)
    client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=SMOL_PROMPT.format("Count to five."), max_tokens=6, temperature=0
    )
    whole = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=SMOL_PROMPT.format("Count to five."), max_tokens=6, temperature=0
    )
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 6
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="SmolLM2-135M-Instruct",
            prompt=SMOL_PROMPT.format("Count to five."),
            max_tokens=6,
            temperature=0,
            stream=True,
        )
        if c.choices
    )
    assert streamed == whole.choices[0].text


def test_disconnect_cancels_generation(embedded: Server) -> None:
    before = embedded.get("/stats")["backend"]["cancelled"]
    body = {
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1500,
        "stream": True,
    }
    with httpx.stream("POST", embedded.url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        seen = [next(lines) for _ in range(6)]
        assert all(not line or line.startswith("data:") for line in seen)
    deadline = time.monotonic() + 60
    while embedded.get("/stats")["backend"]["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert embedded.get("/stats")["backend"]["cancelled"] == before + 1
    # the model is free again at once: a short request completes
    answer = client_for(embedded).chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0
    )
    assert answer.usage.completion_tokens <= 3


def test_concurrent_requests_queue_for_the_model(embedded: Server) -> None:
    import concurrent.futures

    client = client_for(embedded)

    def ask(i: int) -> str:
        answer = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": f"Say the number {i}."}],
            max_tokens=8,
            temperature=0,
        )
        return answer.choices[0].message.content or ""

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, range(4)))
    assert together == [ask(i) for i in range(4)]


def test_the_log_has_no_traceback(embedded: Server) -> None:
    assert "Traceback" not in Path(embedded.log).read_text(errors="replace")
    with pytest.raises(openai.BadRequestError):
        client_for(embedded).chat.completions.create(model="SmolLM2-135M-Instruct", messages=[], max_tokens=3)
    assert json.dumps(embedded.get("/stats"))


def _events(response: httpx.Response) -> list[dict[str, object]]:
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_token_ids_and_prompt_text_come_back_as_vllm_gives_them(embedded: Server) -> None:
    """vLLM's ``return_token_ids`` and ``return_prompt_text``: the prompt's ids are /tokenize's and its text is
    theirs; the generated ids are all the answer's tokens, streamed (each event with those since the last)
    or whole; without the fields, none of it."""
    messages = [{"role": "user", "content": "Name three colors."}]
    body = {"model": "SmolLM2-135M-Instruct", "messages": messages, "max_tokens": 12, "temperature": 0}
    asked = {**body, "return_token_ids": True, "return_prompt_text": True}
    whole = httpx.post(embedded.url + "/v1/chat/completions", json=asked, timeout=60).json()
    prompt = httpx.post(embedded.url + "/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]
    assert whole["prompt_token_ids"] == prompt
    assert whole["prompt_text"] == SMOL_PROMPT.format("Name three colors.")
    generated = whole["choices"][0]["token_ids"]
    assert len(generated) == whole["usage"]["completion_tokens"] > 0
    text = httpx.post(embedded.url + "/detokenize", json={"tokens": generated}, timeout=30).json()["prompt"]
    assert text.startswith(whole["choices"][0]["message"]["content"])  # and the end of turn, if it stopped
    streamed = _events(httpx.post(embedded.url + "/v1/chat/completions", json={**asked, "stream": True}, timeout=60))
    assert (streamed[0]["prompt_token_ids"], streamed[0]["prompt_text"]) == (prompt, whole["prompt_text"])
    assert not any("prompt_token_ids" in event or "prompt_text" in event for event in streamed[1:])
    assert [i for event in streamed for i in event["choices"][0]["token_ids"]] == generated  # type: ignore[index]
    plain = httpx.post(embedded.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert "prompt_token_ids" not in plain and "prompt_text" not in plain and "token_ids" not in plain["choices"][0]
    bad = httpx.post(embedded.url + "/v1/chat/completions", json={**body, "return_token_ids": "yes"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "return_token_ids"


def test_raw_completions_give_token_ids_per_choice(embedded: Server) -> None:
    """On /v1/completions, vLLM puts ``prompt_token_ids`` and ``token_ids`` in the choice (the prompt's in the
    first event of a stream)."""
    prompt = SMOL_PROMPT.format("Count to five.")
    body = {
        "model": "SmolLM2-135M-Instruct",
        "prompt": prompt,
        "max_tokens": 6,
        "temperature": 0,
        "return_token_ids": True,
    }
    whole = httpx.post(embedded.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    tokens = httpx.post(embedded.url + "/tokenize", json={"prompt": prompt}, timeout=30).json()["tokens"]
    assert whole["prompt_token_ids"] == tokens and len(whole["token_ids"]) == 6
    text = httpx.post(embedded.url + "/detokenize", json={"tokens": whole["token_ids"]}, timeout=30).json()["prompt"]
    assert text == whole["text"]
    streamed = _events(httpx.post(embedded.url + "/v1/completions", json={**body, "stream": True}, timeout=60))
    choices = [event["choices"][0] for event in streamed]  # type: ignore[index]
    assert choices[0]["prompt_token_ids"] == tokens and all("prompt_token_ids" not in c for c in choices[1:])
    assert [i for choice in choices for i in choice["token_ids"]] == whole["token_ids"]
    by_ids = httpx.post(embedded.url + "/v1/completions", json={**body, "prompt": tokens}, timeout=60).json()
    assert by_ids["choices"][0]["prompt_token_ids"] == tokens
