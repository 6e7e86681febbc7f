"""``chatcodec serve`` tells the truth about itself: its engine, each request, a taken port; and
``chatcodec doctor`` prints the machine, the build, the choice and a speed."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

from chatcodec.backends.probe import choose_engine

from .conftest import Server, gguf


def chat(server: Server, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        server.url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


def log_lines(server: Server, pattern: str, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in server.log.read_text(errors="replace").splitlines() if re.search(pattern, line)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_the_server_says_its_engine_once_at_start(embedded: Server) -> None:
    lines = log_lines(embedded, r"^chatcodec: .*llama\.cpp")
    assert len(lines) == 1, embedded.log.read_text()
    assert lines[0].removesuffix(" (cached)") == choose_engine(gguf()).line.removesuffix(" (cached)")


def test_every_request_is_one_log_line_with_its_tokens(embedded: Server) -> None:
    answer = chat(embedded, {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3, "temperature": 0})
    usage = answer["usage"]
    assert isinstance(usage, dict)
    line = f"POST /v1/chat/completions 200 in={usage['prompt_tokens']} out={usage['completion_tokens']} "
    assert log_lines(embedded, re.escape(line) + r"\d+\.\d{3}s$"), embedded.log.read_text()[-2000:]
    try:
        urllib.request.urlopen(embedded.url + "/v1/nothing", timeout=30)
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
    assert log_lines(embedded, r"GET /v1/nothing 404 in=0 out=0 ")


def test_a_taken_port_is_one_line_and_exit_2_before_anything_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "chatcodec", "serve", "--host", "127.0.0.1", "--port", str(port)],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"chatcodec: error: Port {port} on 127.0.0.1 is already in use: stop what listens there, or pass --port N."
    ]
    assert "serving" not in done.stderr and "loading" not in done.stderr


def test_quiet_serves_without_request_lines(tmp_path_factory: object) -> None:
    from .conftest import chatcodec_serve

    server = chatcodec_serve(tmp_path_factory.mktemp("quiet"), "--quiet", "--ctx-size", "1024", name="quiet")  # type: ignore[attr-defined]
    try:
        chat(server, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert log_lines(server, r"llama\.cpp")  # the engine line stays
        assert not log_lines(server, r"POST /v1/chat/completions", timeout=1.0)
    finally:
        server.stop()


def test_doctor_prints_the_machine_the_build_the_choice_and_a_speed() -> None:
    choose_engine(gguf())  # cached, as on a machine that has served before
    done = subprocess.run([sys.executable, "-m", "chatcodec", "doctor"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    fields = dict(re.split(r"\s+", line, maxsplit=1) for line in done.stdout.splitlines())
    assert {"machine", "engine", "chosen", "why", "build", "speed", "python", "cache"} <= fields.keys(), done.stdout
    assert fields["chosen"] in ("default", "safe")
    assert re.match(r"[\d.]+ tokens/s \(32 tokens greedy, ", fields["speed"])
    assert "llama-cpp-python" in fields["engine"] and "CPU" in fields["build"]
    as_json = json.loads(
        subprocess.run([sys.executable, "-m", "chatcodec", "doctor", "--json"], capture_output=True, timeout=120).stdout
    )
    assert as_json["chosen"] == fields["chosen"]


def test_doctor_and_serve_refuse_a_bad_engine_name() -> None:
    for command in ("doctor", "serve"):
        done = subprocess.run(
            [sys.executable, "-m", "chatcodec", command, "--engine", "turbo"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and "invalid choice: 'turbo'" in done.stderr
