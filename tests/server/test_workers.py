"""``chatcodec serve --workers 2`` in front of a remote engine (the session's embedded server): both workers
answer on the one port, each sees the responses the other stored, a remote engine's stop string reaches
Anthropic's ``stop_sequence``, and the workers die with their parent."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server, chatcodec_serve, gguf
from .test_messages import client as anthropic_client
from .test_messages import stop_sequence_checks

#: bounded loops: tries for both workers to answer, and seconds for the workers to stop
TRIES = 60
STOP_SECONDS = 20.0


@pytest.fixture(scope="module")
def gateway(embedded: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("workers")
    argv = ["--backend", embedded.url, "--template", str(gguf()), "--workers", "2"]
    server = chatcodec_serve(tmp, *argv, "--responses-store", str(tmp / "store.sqlite3"), name="workers")
    yield server
    server.stop()


def workers(server: Server) -> set[int]:
    """The pids the gateway's request lines name."""
    return {int(pid) for pid in re.findall(r"^chatcodec\[(\d+)\]: ", server.log.read_text(), re.M)}


def test_two_workers_share_the_port_and_the_store(gateway: Server) -> None:
    answered = set()
    for _ in range(TRIES):  # a new connection each time: the kernel spreads them over the workers
        answered.add(httpx.get(gateway.url + "/stats", timeout=30).json()["pid"])
        if len(answered) == 2:
            break
    assert len(answered) == 2 and os.getpid() not in answered
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(gateway.process.pid)], capture_output=True, text=True)
    assert answered == {int(pid) for pid in children.stdout.split()}
    body = {"model": _model(gateway), "input": "Hi", "max_output_tokens": 1}
    ids = []
    for _ in range(TRIES):  # until each worker has stored some (the kernel picks the worker of each connection)
        response = httpx.post(gateway.url + "/v1/responses", json=body, timeout=120)
        assert response.status_code == 200, response.text
        ids.append(response.json()["id"])
        if len(ids) >= 6 and _served(gateway, "POST /v1/responses") == answered:
            break
    readers: set[int] = set()
    for _ in range(TRIES):  # every stored response is read on each worker, whichever stored it
        for rid in ids:
            got = httpx.get(f"{gateway.url}/v1/responses/{rid}", timeout=30)
            assert got.status_code == 200 and got.json()["id"] == rid
        readers = _served(gateway, "GET /v1/responses/")
        if len(readers) == 2 and len(_served(gateway, "POST /v1/responses")) == 2:
            break
    assert readers == answered and _served(gateway, "POST /v1/responses") == answered
    follow = {"model": _model(gateway), "input": "More", "max_output_tokens": 1, "previous_response_id": ids[0]}
    second = httpx.post(gateway.url + "/v1/responses", json=follow, timeout=120).json()
    items = httpx.get(f"{gateway.url}/v1/responses/{second['id']}/input_items?order=asc", timeout=30).json()
    first = items["data"][0]
    assert (first["role"], first["content"][0]["text"]) == ("user", "Hi"), "the stored first turn, from either worker"
    assert items["data"][-1]["content"][0]["text"] == "More"


def _model(server: Server) -> str:
    model: str = server.get("/v1/models")["data"][0]["id"]
    return model


def _served(server: Server, request: str) -> set[int]:
    """The workers whose request lines hold ``request``."""
    text = server.log.read_text()
    return {int(pid) for pid in re.findall(rf"^chatcodec\[(\d+)\]: {re.escape(request)}", text, re.M)}


def test_a_remote_engines_stop_string_is_named(gateway: Server) -> None:
    """The engine (chatcodec serve) names the stop string met in vLLM's ``stop_reason``; the gateway's Messages
    dialect gives it as ``stop_sequence``."""
    stop_sequence_checks(anthropic_client(gateway), model=_model(gateway))


def test_the_embedded_model_takes_one_worker() -> None:
    argv = [sys.executable, "-m", "chatcodec", "serve", "--workers", "2", "--port", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers 2 needs --backend URL" in lines[0], done.stderr


def test_the_workers_die_with_their_parent(gateway: Server) -> None:
    """The last test of the module: it kills the gateway's parent process, without a chance to stop its children."""
    pids = workers(gateway) | {httpx.get(gateway.url + "/stats", timeout=30).json()["pid"]}
    assert pids
    gateway.process.send_signal(signal.SIGKILL)
    gateway.process.wait(timeout=30)
    deadline = time.monotonic() + STOP_SECONDS
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if _alive(pid)}
        time.sleep(0.1)
    assert not alive, f"workers {sorted(alive)} outlived their parent"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie (ended, not yet reaped by init) is gone too
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
