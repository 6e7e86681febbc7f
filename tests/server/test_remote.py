"""``chatcodec serve --backend URL`` in front of a real remote engine: llama-cpp-python's own server
on the same GGUF, started here. The same checks as the embedded model, plus a backend killed mid-stream."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from .checks import ChatChecks, client_for
from .conftest import Server, chatcodec_serve, gguf, llama_cpp_server


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("remote")
    engine = llama_cpp_server(tmp)
    try:
        gateway = chatcodec_serve(tmp, "--backend", engine.url, "--template", str(gguf()), name="gateway")
    except BaseException:
        engine.stop()
        raise
    yield gateway
    gateway.stop()
    engine.stop()


class TestRemote(ChatChecks):
    @pytest.fixture
    def server(self, remote: Server) -> Server:
        return remote


def test_backend_killed_mid_stream_gives_an_error_event(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("killed")
    engine = llama_cpp_server(tmp, name="doomed-engine")
    gateway = chatcodec_serve(
        tmp, "--backend", engine.url, "--template", str(gguf()), "--backend-timeout", "20", name="gateway"
    )
    try:
        client = client_for(gateway)
        stream = client.chat.completions.create(
            model="x",
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
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
        assert down.value.status_code == 502
    finally:
        gateway.stop()
        engine.stop()
