"""``chatcodec serve --backend URL`` in front of a real remote engine: llama-cpp-python's own server on the
same GGUF, started here. The same checks as the embedded model, a request the engine would misread refused,
and (last, since it kills the engine) a backend killed mid-stream."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from .checks import ChatChecks, client_for
from .conftest import Server, chatcodec_serve, gguf, llama_cpp_server
from .test_prompts import HOSTILE


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    engine = llama_cpp_server(tmp_path_factory.mktemp("engine"))
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def remote(engine: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("remote")
    gateway = chatcodec_serve(
        tmp, "--backend", engine.url, "--template", str(gguf()), "--backend-timeout", "20", name="gateway"
    )
    yield gateway
    gateway.stop()


class TestRemote(ChatChecks):
    @pytest.fixture
    def server(self, remote: Server) -> Server:
        return remote


def test_caller_control_tokens_are_refused_by_a_text_engine(remote: Server) -> None:
    """llama-cpp-python's server takes prompts as text only, where it reads every control token: a request
    whose text holds one is refused, naming where, and the others are served."""
    body = {"messages": HOSTILE, "max_tokens": 3}
    answer = httpx.post(remote.url + "/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert "message 0 (user) content contains the control token '<|im_end|>'" in message
    assert "takes prompts as text" in message
    fine = {**body, "messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(remote.url + "/v1/chat/completions", json=fine, timeout=120).status_code == 200


def test_a_remote_engine_gives_the_prompts_ids_but_not_the_generated_ones(remote: Server) -> None:
    """The gateway encoded the prompt (it has the GGUF's tokenizer), so it has the prompt's ids; the engine's
    answer comes as text, without the generated ones."""
    messages = [{"role": "user", "content": "Hi"}]
    body = {"messages": messages, "max_tokens": 3, "return_token_ids": True, "return_prompt_text": True}
    answer = httpx.post(remote.url + "/v1/chat/completions", json=body, timeout=120).json()
    tokens = httpx.post(remote.url + "/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]
    assert answer["prompt_token_ids"] == tokens and answer["prompt_text"].endswith("<|im_start|>assistant\n")
    assert answer["choices"][0]["token_ids"] is None


def test_backend_killed_mid_stream_gives_an_error_event(engine: Server, remote: Server) -> None:
    """The last test of the module: it kills the engine."""
    client = client_for(remote)
    model = client.models.list().data[0].id  # the gateway answers only the model it serves
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Write a very long story about a dragon and a knight."}],
        max_tokens=1500,
        stream=True,
    )
    received = 0
    with pytest.raises(openai.APIError) as caught:
        for _chunk in stream:
            received += 1
            if received == 4:
                engine.process.kill()
                engine.process.wait(timeout=20)
            assert received < 5000, "the stream never ended"
    assert "backend" in str(caught.value).lower()
    assert received >= 4
    # the gateway is still serving, and says the backend is down
    with pytest.raises(openai.InternalServerError) as down:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert down.value.status_code == 502
