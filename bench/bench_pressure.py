"""The embedded server under pressure (issue 29): ``/health`` latency while ``/tokenize``, ``/detokenize`` and
the grammar builder run at their worst, and resident memory after distinct hostile prompts.

1. **/health under load.** ``/health`` is asked every 20 ms, first idle for ``--idle`` seconds, then for
   ``--seconds`` while four clients keep the server's worst work going, one request after another (``--loads``
   picks some of them by name):

   * ``token-strs``: ``/tokenize`` of 2,000,000 characters of ``<``, ``[``, ``>``, ``]`` with
     ``return_token_strs`` (llama.cpp's tokenizer, then every token's text);
   * ``detokenize``: ``/detokenize`` of 1,500,000 ids;
   * ``chat-tokens``: ``/tokenize`` of a 1 MiB chat message (the template, the injection-safe encoder, and
     llama.cpp per stretch);
   * ``grammar``: a chat whose tool schema is the grammar builder's worst within the model's context (550
     properties and a left-recursive one, refused with a 400 once built).

   Printed: the latency of ``/health`` at p50, p90, p99 and max, idle and loaded, and the share of loaded
   answers within 100 ms.
2. **RSS.** ``--prompts`` distinct chats of ``--mib`` MiB of those characters, each refused with a 400 (the
   prompt fills the context), each also tokenized by ``/tokenize`` (in the server's token process); the VmRSS
   of the server and of each of its worker processes at start and after each, each against the bound in
   docs/security.md: 1.5 x its start plus the caches' 192 MiB.

    python bench/bench_pressure.py                    # both: about 2 minutes on a quiet 2-core machine
    python bench/bench_pressure.py --health-only      # or --rss-only
    python bench/bench_pressure.py --health-only --loads detokenize,grammar
    python bench/bench_pressure.py --src ../main/src  # another checkout's server, side by side

The server listens on 127.0.0.1 and is stopped at the end. Exit status 1 if a request failed or RSS passed
its bound.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

# the memory test's own measures: the hostile text, a process's RSS and its children, and the caches' bound
from tests.server.test_pressure import CACHE_BOUND, children, hostile, rss  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def request(port: int, method: str, path: str, body: bytes | None = None, timeout: float = 600) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body, {"content-type": "application/json"} if body is not None else {})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def quantiles(seconds: list[float]) -> str:
    ordered = sorted(seconds)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    within = sum(s <= 0.1 for s in ordered) / len(ordered)
    return (
        f"p50 {q(0.5):6.1f} ms  p90 {q(0.9):6.1f} ms  p99 {q(0.99):6.1f} ms  max {ordered[-1] * 1000:6.1f} ms"
        f"  within 100 ms {within:6.1%}  ({len(ordered)} asked)"
    )


def watch(port: int, seconds: float) -> list[float]:
    """How long each ``/health`` took, asked every 20 ms for ``seconds``."""
    took: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        status, _ = request(port, "GET", "/health", timeout=30)
        took.append(time.perf_counter() - started)
        if status != 200:
            raise RuntimeError(f"/health answered {status}")
        time.sleep(0.02)
    return took


def grammar_body() -> dict[str, object]:
    """The grammar builder's worst within the model's context (tests/server/test_hardening_embedded.py): 550
    properties, then one that refers to itself first, built whole and refused for its left recursion (a 400)."""
    properties: dict[str, object] = {f"k{i}": {"type": "integer"} for i in range(550)}
    properties["loop"] = {"$ref": "#/$defs/loop"}
    worst = {"type": "object", "properties": properties, "$defs": {"loop": {"anyOf": [{"$ref": "#/$defs/loop"}, {}]}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": worst}}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "tools": [tool], "tool_choice": "required"}
    return {**chat, "max_tokens": 2}


#: the loads, by name: what each client sends, one request after another
LOADS = ("token-strs", "detokenize", "chat-tokens", "grammar")


def health_under_load(port: int, idle: float, seconds: float, names: list[str]) -> bool:
    rng = random.Random(29)
    made = {  # each body made only if its load runs
        "token-strs": lambda: ("/tokenize", {"prompt": hostile(rng, 2_000_000), "return_token_strs": True}),
        "detokenize": lambda: ("/detokenize", {"tokens": [rng.randrange(1000) for _ in range(1_500_000)]}),
        "chat-tokens": lambda: ("/tokenize", {"messages": [{"role": "user", "content": hostile(rng, 1 << 20)}]}),
        "grammar": lambda: ("/v1/chat/completions", grammar_body()),
    }
    loads = [(path, json.dumps(body).encode()) for path, body in (made[name]() for name in names)]
    print(f"/health idle:   {quantiles(watch(port, idle))}", flush=True)
    stop = threading.Event()
    done: list[tuple[str, int]] = []

    def load(path: str, body: bytes) -> None:
        while not stop.is_set():
            done.append((path, request(port, "POST", path, body)[0]))

    threads = [threading.Thread(target=load, args=job, daemon=True) for job in loads]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the bodies are on their way
    busy = watch(port, seconds)
    stop.set()
    for thread in threads:
        thread.join(600)
    print(f"/health loaded: {quantiles(busy)}")
    statuses = sorted({status for _, status in done})
    print(f"load: {len(done)} requests ({', '.join(sorted({p for p, _ in done}))}), statuses {statuses}")
    return set(statuses) <= ({200, 400} if "grammar" in names else {200})


def rss_after_prompts(port: int, pid: int, prompts: int, mib: float) -> bool:
    """Each prompt is posted as a chat (planned in the server's process) and to ``/tokenize`` (worked on in its
    token process); every process of the server is held to the bound on its own: 1.5 x its start + the caches'."""
    rng = random.Random(36)
    pids = [pid, *children(pid)]
    start = {p: rss(p) for p in pids}
    worst = dict(start)
    mib_of = 1 << 20
    print(
        "RSS at start: "
        + ", ".join(f"{'server' if p == pid else f'child {p}'} {start[p] / mib_of:.0f} MiB" for p in pids)
        + f"; each bound to 1.5 x its start + {CACHE_BOUND >> 20} MiB"
    )
    ok = True
    for index in range(prompts):
        content = hostile(rng, int(mib * (1 << 20)) - 200)
        chat = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 1}).encode()
        started = time.perf_counter()
        status, _ = request(port, "POST", "/v1/chat/completions", chat)
        tokenized, _ = request(port, "POST", "/tokenize", json.dumps({"prompt": content}).encode(), timeout=600)
        now = {p: rss(p) for p in pids}
        worst = {p: max(worst[p], now[p]) for p in pids}
        ok = ok and status == 400 and tokenized == 200
        print(
            f"  prompt {index + 1}: chat {status}, /tokenize {tokenized} in {time.perf_counter() - started:5.1f} s,"
            f" RSS {' / '.join(f'{now[p] / mib_of:.0f}' for p in pids)} MiB"
        )
    for p in pids:
        name = "server" if p == pid else f"child {p}"
        print(f"RSS of {name} after {prompts} prompts of {mib:g} MiB: at most {worst[p] / mib_of:.0f} MiB"
              f" ({worst[p] / start[p]:.2f}x start)")  # fmt: skip
        ok = ok and worst[p] <= 1.5 * start[p] + CACHE_BOUND
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--health-only", action="store_true")
    parser.add_argument("--rss-only", action="store_true")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of /health before the load")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of /health under the load")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--mib", type=float, default=8.0, help="MiB of each hostile prompt (the body limit is 8)")
    parser.add_argument(
        "--loads",
        default=",".join(LOADS),
        help=f"the loads /health is asked under, comma-separated (default: all of {', '.join(LOADS)})",
    )
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the chatcodec source the server runs")
    args = parser.parse_args()
    names = [name for name in args.loads.split(",") if name]
    if not names or any(name not in LOADS for name in names):
        parser.error(f"--loads takes names from {', '.join(LOADS)}")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(args.src.resolve()), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "chatcodec", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            for _ in range(720):
                try:
                    request(port, "GET", "/health", timeout=5)
                    break
                except OSError:
                    if server.poll() is not None:
                        raise RuntimeError(f"the server exited with {server.returncode}") from None
                    time.sleep(0.25)
            ok = True
            if not args.rss_only:
                ok = health_under_load(port, args.idle, args.seconds, names) and ok
            if not args.health_only:
                ok = rss_after_prompts(port, server.pid, args.prompts, args.mib) and ok
        finally:
            server.terminate()
            server.wait(30)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
