"""The server under the second adversarial review (issue 29, items 1 to 8), in process over httpx's ASGI
transport, with a backend that answers with a script: references in tool schemas are never fetched, bad ones are
400s whole and streamed, error bodies are always JSON, grammar building is linear with a budget, bodies that stall
time out, and chats and tokenize calls each have their own pool."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatcodec import InputError, load_template
from chatcodec.backends import Chunk, Generation, ModelInfo
from chatcodec.server import bodies
from chatcodec.server.app import TOKENIZERS, create_app
from chatcodec.server.chat import ChatService
from chatcodec.server.grammar import MAX_REPEAT, MAX_STEPS, GrammarBuilder

from ..test_refs import ELSEWHERE, PLACES, Watch


class ScriptedBackend:
    """Answers every prompt with ``answer`` (the server's checks are under test, not generation)."""

    info = ModelInfo("scripted", context_length=4096)

    def __init__(self, answer: str = "Hello") -> None:
        self.answer = answer
        self.generated = 0

    async def generate(self, request: Generation) -> AsyncGenerator[Chunk, None]:
        self.generated += 1
        yield Chunk(self.answer, "stop", prompt_tokens=1, completion_tokens=1)

    async def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return [ord(c) for c in text]

    async def detokenize(self, ids: Sequence[int]) -> str:
        return "".join(map(chr, ids))

    async def aclose(self) -> None:
        pass


USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def tool(parameters: Any, name: str = "get_weather") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def post_all(app: Any, requests: list[tuple[str, Any]]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as client:
            out = []
            for path, body in requests:
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                out.append(await client.post(path, content=content, headers={"content-type": "application/json"}))
            return out

    return asyncio.run(run())


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Watch]:
    found = Watch(tmp_path)
    yield found
    found.close()


# --- 1/2: references ---------------------------------------------------------------------------------------


def test_references_elsewhere_are_400s_before_generation_whole_and_streamed(watch: Watch) -> None:
    backend = ScriptedBackend()
    app = create_app(backend, load_template("chatml"))
    requests, expected = [], []
    for ref in [*watch.refs(), *ELSEWHERE, "#/nope"]:
        for _, make, path in PLACES:
            schema = {"type": "object", "properties": {"city": {"type": "string"}}, **make(ref)}
            for stream in (False, True):
                body = {"messages": USER, "tools": [tool(schema)], "tool_choice": "required", "stream": stream}
                requests.append(("/v1/chat/completions", body))
                expected.append(("tools[0].function.parameters", ref, path))
                fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
                requests.append(("/v1/chat/completions", {"messages": USER, "response_format": fmt, "stream": stream}))
                expected.append(("response_format.json_schema.schema", ref, path))
    answers = post_all(app, requests)
    for answer, (param, ref, path) in zip(answers, expected, strict=True):
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == param and f"{ref!r} at {path} " in error["message"], error
    assert backend.generated == 0
    assert watch.untouched(), (watch.requests, watch.opened, watch.urls)


@pytest.mark.parametrize("stream", [False, True])
def test_local_references_where_the_grammar_does_not_look_are_checked_after_generation(stream: bool) -> None:
    """The review's example turned around: the $refs inside ``not`` and ``dependentSchemas`` resolve in the
    document, and the generated call is checked against them."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "not": {"$ref": "#/$defs/secret"}}},
        "required": ["city"],
        "$defs": {"secret": {"enum": ["INTERNAL-SECRET-42"]}},
        "dependentSchemas": {"city": {"if": {"$ref": "#/$defs/secret"}, "then": False}},
    }
    calls = {}
    for city in ("Paris", "INTERNAL-SECRET-42"):
        answer = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": city}}]})
        app = create_app(ScriptedBackend(answer), load_template("chatml"))
        body = {"messages": USER, "tools": [tool(schema)], "tool_choice": "required", "stream": stream}
        (response,) = post_all(app, [("/v1/chat/completions", body)])
        assert response.status_code == 200, response.text
        calls[city] = response.text
    if stream:
        assert "invalid_tool_calls" not in calls["Paris"] and '"get_weather"' in calls["Paris"]
        assert "invalid_tool_calls" in calls["INTERNAL-SECRET-42"]
        assert calls["INTERNAL-SECRET-42"].rstrip().endswith("data: [DONE]")
    else:
        paris = json.loads(calls["Paris"])["choices"][0]["message"]
        secret = json.loads(calls["INTERNAL-SECRET-42"])["choices"][0]["message"]
        assert [c["function"]["arguments"] for c in paris["tool_calls"]] == ['{"city": "Paris"}']
        assert "tool_calls" not in secret
        assert "should not be valid under" in secret["invalid_tool_calls"][0]["error"]


# --- 7: error bodies ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "\\ud800", "content": "Hi"}]}',
        b'{"messages": [{"role": "user", "content": "Hi"}], "tool_choice": "\\ud800\\udfff\\ud800"}',
        b'{"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": '
        b'{"name": "\\ud800", "parameters": {"type": "object"}}}], "tool_choice": {"type": "function", '
        b'"function": {"name": "g\\ud800"}}}',
        b'{"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": '
        b'{"name": "f", "parameters": {"type": "object", "properties": {"\\ud800": {"$ref": "#/\\ud800"}}}}}]}',
    ],
)
def test_error_bodies_that_repeat_a_lone_surrogate_are_json(body: bytes) -> None:
    (answer,) = post_all(create_app(ScriptedBackend(), load_template("chatml")), [("/v1/chat/completions", body)])
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/json"
    text = answer.content.decode("utf-8")  # valid UTF-8
    message = json.loads(text)["error"]["message"]
    assert "\ud800" in message or "\\ud800" in message, message  # the character itself, or its repr


def test_an_unforeseen_error_holding_a_surrogate_is_a_json_500(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: ChatService, req: Any, **options: Any) -> Any:
        raise RuntimeError("lost in \ud800")

    monkeypatch.setattr(ChatService, "plan", broken)
    app = create_app(ScriptedBackend(), load_template("chatml"))
    (answer,) = post_all(app, [("/v1/chat/completions", {"messages": USER})])
    assert answer.status_code == 500
    assert json.loads(answer.content.decode("utf-8"))["error"]["message"].endswith("lost in \ud800")


def test_a_stream_that_fails_unexpectedly_ends_with_an_error_and_done(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("validation broke")

    monkeypatch.setattr(ChatService, "_validate", broken)
    app = create_app(ScriptedBackend(), load_template("chatml"))
    (answer,) = post_all(app, [("/v1/chat/completions", {"messages": USER, "stream": True})])
    events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["message"] == "Internal error: RuntimeError: validation broke"


# --- 6/8: grammars -----------------------------------------------------------------------------------------


def shared_options(depth: int) -> dict[str, Any]:
    """anyOf whose object options share one child: built naively, the child is built twice per level."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"anyOf": [{"type": "object"}, {"type": "object", "required": ["a"]}], "properties": {"a": schema}}
    return schema


def shared_types(depth: int) -> dict[str, Any]:
    """A type list whose object and array share one child."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": ["object", "array"], "properties": {"a": schema}, "items": schema}
    return schema


def nested_refs(depth: int) -> dict[str, Any]:
    """Each definition refers to the next one twice, through anyOf."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(depth)}
    defs[f"d{depth}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


@pytest.mark.parametrize("shape", [shared_options, shared_types, nested_refs])
def test_grammar_building_is_linear_in_nesting(shape: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    schema_method = GrammarBuilder.schema

    def counted(self: GrammarBuilder, *args: Any, **kwargs: Any) -> str:
        calls[0] += 1
        return schema_method(self, *args, **kwargs)

    monkeypatch.setattr(GrammarBuilder, "schema", counted)
    for depth in (10, 40):
        calls[0] = 0
        g = GrammarBuilder()
        root = shape(depth)
        g.build(g.schema(root, "args", root=root))
        assert calls[0] <= 4 * depth + 4, (depth, calls[0])  # 2**depth without the memo


def test_grammar_budget_refuses_what_is_too_large() -> None:
    wide = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(MAX_STEPS + 10)}}
    huge_enum = {"enum": list(range(MAX_STEPS + 10))}
    for schema in (wide, huge_enum):
        g = GrammarBuilder()
        with pytest.raises(InputError, match="too large to constrain"):
            g.schema(schema, "args", root=schema)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "array", "minItems": 100_000}, "minItems 100000"),
        ({"type": "array", "items": {"type": "string", "minLength": MAX_REPEAT + 1}}, f"minLength {MAX_REPEAT + 1}"),
        ({"$ref": "#"}, "left recursion"),
        ({"anyOf": [{"$ref": "#"}, {"type": "null"}]}, "left recursion"),
        (
            {
                "$ref": "#/$defs/a",
                "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"oneOf": [{"$ref": "#/$defs/a"}]}},
            },
            "left recursion",
        ),
    ],
)
def test_schemas_no_grammar_can_follow_are_refused(schema: dict[str, Any], words: str) -> None:
    g = GrammarBuilder()
    with pytest.raises(InputError, match=words):
        g.build(g.schema(schema, "args", root=schema))


#: schemas the grammar follows loosely or recursively, which llama.cpp must take
TAKEN = [
    {"type": "array", "maxItems": 100_000},
    {"type": "array", "minItems": MAX_REPEAT, "maxItems": 100_000},
    {"type": "string", "maxLength": 1_000_000},
    {"type": "string", "minLength": 5, "maxLength": 2},
    {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}},
    shared_options(30),
    shared_types(30),
    nested_refs(30),
]


@pytest.mark.parametrize("schema", TAKEN, ids=[str(i) for i in range(len(TAKEN))])
def test_llama_cpp_takes_every_grammar_that_is_built(schema: dict[str, Any]) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    from chatcodec.backends import default_model_path
    from chatcodec.backends.tokenizer import GGUFTokenizer

    g = GrammarBuilder()
    text = g.build(g.schema(schema, "args", root=schema))
    tokenizer = GGUFTokenizer(default_model_path())
    sampler = llama_cpp.llama_sampler_init_grammar(tokenizer._vocab, text.encode(), b"root")
    assert sampler, text[:2000]
    llama_cpp.llama_sampler_free(sampler)


def test_a_schema_llama_cpp_cannot_take_is_a_400_naming_it() -> None:
    backend = ScriptedBackend()
    app = create_app(backend, load_template("chatml"))
    schema = {"type": "object", "properties": {"cities": {"type": "array", "minItems": 100_000}}}
    body = {"messages": USER, "tools": [tool(schema)], "tool_choice": "required"}
    (answer,) = post_all(app, [("/v1/chat/completions", body), ("/v1/chat/completions", {**body, "stream": True})])[:1]
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "tools" and "minItems 100000" in answer.json()["error"]["message"]
    assert backend.generated == 0


# --- 8: body timeout ---------------------------------------------------------------------------------------


def test_a_stalled_body_times_out_with_a_408() -> None:
    import uvicorn

    app = create_app(ScriptedBackend(), load_template("chatml"), body_timeout=1.0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            sock.sendall(head + b"content-length: 1000\r\n\r\n" + b'{"messages": [')  # and then nothing
            started = time.monotonic()
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                piece = sock.recv(65536)
                if not piece:
                    break
                reply += piece
            waited = time.monotonic() - started
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["param"] == "body" and "within 1 s" in error["message"]
        assert 0.9 <= waited < 8
        # a body that arrives in time is read as before
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request(
            "POST", "/v1/chat/completions", json.dumps({"messages": USER}), {"content-type": "application/json"}
        )
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.should_exit = True
        thread.join(10)


# --- 4/5: pools --------------------------------------------------------------------------------------------


def test_tokenize_work_cannot_starve_chats_nor_chats_tokenize_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """More /detokenize calls than there are planners, each waiting inside: a chat still answers; then every planner
    held by a chat that waits: /tokenize still answers. On one shared pool, either would wait for the release."""
    from chatcodec import ChatTemplate
    from chatcodec.server.app import PLANNERS

    release_tokens, release_chats = threading.Event(), threading.Event()
    held: list[str] = []
    parse = bodies.parse
    render = ChatTemplate.render

    def waiting_parse(data: bytearray) -> Any:
        if b"hold-tokens" in data:
            held.append("detokenize")
            release_tokens.wait(30)
        return parse(data)

    def waiting_render(self: ChatTemplate, messages: Any, **options: Any) -> str:
        if messages and messages[0].get("content") == "hold-chat":
            held.append("chat")
            release_chats.wait(30)
        return render(self, messages, **options)

    monkeypatch.setattr(bodies, "parse", waiting_parse)
    monkeypatch.setattr(ChatTemplate, "render", waiting_render)
    app = create_app(ScriptedBackend(), load_template("chatml"))

    async def run() -> tuple[int, int, list[int]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as client:
            detokenize = {"tokens": [104, 105], "x": "hold-tokens"}
            held_tokens = [asyncio.create_task(client.post("/detokenize", json=detokenize)) for _ in range(PLANNERS)]
            while held.count("detokenize") < TOKENIZERS:
                await asyncio.sleep(0.01)
            chat = await asyncio.wait_for(client.post("/v1/chat/completions", json={"messages": USER}), 20)
            release_tokens.set()
            hold = {"messages": [{"role": "user", "content": "hold-chat"}]}
            held_chats = [asyncio.create_task(client.post("/v1/chat/completions", json=hold)) for _ in range(PLANNERS)]
            while held.count("chat") < PLANNERS:
                await asyncio.sleep(0.01)
            tokens = await asyncio.wait_for(client.post("/tokenize", json={"prompt": "hi"}), 20)
            release_chats.set()
            done = [r.status_code for r in await asyncio.gather(*held_tokens, *held_chats)]
            return chat.status_code, tokens.status_code, done

    try:
        chat, tokens, done = asyncio.run(run())
    finally:
        release_tokens.set()
        release_chats.set()
    assert chat == 200 and tokens == 200
    assert done == [200] * (2 * PLANNERS)
    assert held.count("detokenize") == PLANNERS


# --- bodies ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        {"tokens": list(range(-3, 300_000))},
        {"model": "m", "tokens": list(range(100_000)), "nested": [{"a": list(range(90_000))}, [1, 2]], "s": "[1,2]"},
        {"prompt": "<[>]" * 200_000, "list": [[5] * 70_000, "x"]},
        {"floats": [1.5] * 100_000, "ints": [7] * 100_000},
        {"prompt": 'é"\\\n\t漢🙂\x00' * 60_000},  # a long text is written a slice at a time: escapes at every cut
    ],
)
def test_bodies_read_and_write_as_json_does(value: dict[str, Any]) -> None:
    data = json.dumps(value).encode()
    assert bodies.loads(data) == json.loads(data)
    assert bodies.dumps(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def test_a_long_text_with_lone_surrogates_is_written_as_valid_json() -> None:
    text = ("a\ud800b" + "x" * 1000 + "\udfff") * 600  # a lone surrogate in some slices, not in others
    written = bodies.dumps({"prompt": text})
    written.decode("utf-8")  # valid UTF-8
    assert json.loads(written) == {"prompt": text}


@pytest.mark.parametrize(
    "data",
    [
        b'{"tokens": [' + b"1," * 200_000 + b"]}",
        b'{"tokens": [' + b"01," * 200_000 + b"1]}",
        b'{"tokens": [' + b"1," * 200_000 + b",1]}",
        b'{"tokens": [' + b"1 2," * 200_000 + b"1]}",
        b'{"tokens": [' + b"1," * 200_000 + b"1",
    ],
)
def test_bodies_refuse_what_json_refuses_with_its_message(data: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(data)
    with pytest.raises(ValueError) as found:
        bodies.loads(data)
    assert str(found.value) == str(expected.value)
