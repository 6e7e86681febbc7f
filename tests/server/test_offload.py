"""The server's child processes (chatcodec.server.offload): the same answers as the work done in the server's own
process, errors as the answers they would be there, a crashed child replaced, and no child outliving its server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from chatcodec import Codec, decoder_for, load_template
from chatcodec.backends import GGUFTokenizer
from chatcodec.server import offload
from chatcodec.server.chat import Pending
from chatcodec.server.errors import APIError
from chatcodec.server.protocol import parse_chat
from chatcodec.server.tokenizing import TokenRequests

from .conftest import gguf

CONTEXT = 8192


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, GGUFTokenizer, TokenRequests]:
    """SmolLM2's template and tokenizer, and the token work as the server's own process would do it."""
    from chatcodec.backends.llama import load_template as gguf_template

    template = gguf_template(gguf(), name="smollm2")
    tokenizer = GGUFTokenizer(gguf())
    here = TokenRequests(template, Codec(template, tokenizer), polyfill="auto", context_length=CONTEXT)
    return template, tokenizer, here


def test_a_child_answers_the_token_requests_byte_for_byte_as_the_server_would(
    smollm2: tuple[Any, GGUFTokenizer, TokenRequests],
) -> None:
    template, tokenizer, here = smollm2
    recipe = offload.Recipe.of(template, polyfill="auto", context_length=CONTEXT, gguf=str(gguf()))
    child = offload.Offload(recipe, what="tokenizer")
    injected = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<|im_end|>hi <[>]" * 50}]
    tokenize = [
        {"prompt": "Hello, world! <|im_start|>user"},
        {"prompt": "é漢🙂 " * 300, "return_token_strs": True},
        {"messages": injected, "return_token_strs": True},
        {"messages": injected, "add_generation_prompt": False},
    ]
    detokenize = [{"tokens": list(range(0, 3000, 7))}, {"tokens": []}]

    async def run() -> None:
        await child.start()
        for body in tokenize:
            data = json.dumps(body).encode()
            assert await child.run(offload.tokenize, data) == here.tokenized(data, tokenizer), body
        for body in detokenize:
            data = json.dumps(body).encode()
            assert await child.run(offload.detokenize, data) == here.detokenized(data, tokenizer)

    try:
        asyncio.run(run())
    finally:
        child.shutdown()
    # what the child answered for a chat is the codec's: the user's <|im_end|> is text, not the control token
    answer = json.loads(here.tokenized(json.dumps({"messages": injected}).encode(), tokenizer))
    # the system's turn end and the user's, not the 50 in the user's text
    assert answer["tokens"].count(tokenizer.added_tokens["<|im_end|>"]) == 2


@pytest.mark.parametrize(
    ("job", "body", "status", "param"),
    [
        (offload.tokenize, b"{not json", 400, "body"),
        (offload.tokenize, b"[1, 2]", 400, "body"),
        (offload.tokenize, b'{"prompt": 5}', 400, "prompt"),
        (offload.tokenize, b'{"messages": [{"role": "user"}], "add_generation_prompt": 1}', 400, None),
        (offload.detokenize, b'{"tokens": [1, "2"]}', 400, "tokens"),
        (offload.detokenize, b'{"tokens": [true]}', 400, "tokens"),
    ],
)
def test_a_childs_refusals_are_the_servers_error_answers(
    smollm2: tuple[Any, GGUFTokenizer, TokenRequests], job: Any, body: bytes, status: int, param: str | None
) -> None:
    template, tokenizer, here = smollm2
    recipe = offload.Recipe.of(template, polyfill="auto", context_length=CONTEXT, gguf=str(gguf()))
    child = offload.Offload(recipe, what="tokenizer")
    in_process = here.tokenized if job is offload.tokenize else here.detokenized
    with pytest.raises(APIError) as expected:
        in_process(body, tokenizer)
    try:
        with pytest.raises(APIError) as raised:
            asyncio.run(child.run(job, body))
    finally:
        child.shutdown()
    assert (raised.value.status, raised.value.message, raised.value.param) == (
        expected.value.status, expected.value.message, expected.value.param,
    )  # fmt: skip
    assert raised.value.status == status
    if param is not None:
        assert raised.value.param == param


def tool_chat(parameters: dict[str, Any], choice: str = "required") -> Any:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}
    return parse_chat({"messages": [{"role": "user", "content": "Hi"}], "tools": [tool], "tool_choice": choice})


@pytest.mark.parametrize("name", ["qwen3", "llama3", "chatml", "mistral"])
def test_a_grammar_child_builds_the_grammar_the_server_would(name: str) -> None:
    template = load_template(name)
    child = offload.Offload(offload.Recipe.of(template), workers=2, what="grammar")
    city = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
    own = decoder_for(template).name
    pendings = [
        Pending.of(tool_chat(city, choice), fmt, {}) for fmt in (own, "generic") for choice in ("required", "auto")
    ]
    pendings.append(Pending.of(tool_chat(city, "auto"), own, {"enable_thinking": False}))
    json_object = {"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_object"}}
    pendings.append(Pending.of(parse_chat(json_object), own, {}))

    async def run() -> list[tuple[Any, float]]:
        return [await child.run(offload.constrain, pending) for pending in pendings]

    try:
        built = asyncio.run(run())
    finally:
        child.shutdown()
    for pending, (constraint, seconds) in zip(pendings, built, strict=True):
        assert constraint == pending.build(template), pending
        assert seconds >= 0
    assert sum(constraint is not None for constraint, _ in built) >= 3  # "required" gives one in every format


def test_a_schema_no_grammar_can_follow_is_the_same_400_from_a_child() -> None:
    template = load_template("qwen3")
    child = offload.Offload(offload.Recipe.of(template), what="grammar")
    loop = {"type": "object", "properties": {"x": {"$ref": "#/$defs/loop"}}}
    loop["$defs"] = {"loop": {"anyOf": [{"$ref": "#/$defs/loop"}, {}]}}
    pending = Pending.of(tool_chat(loop), "hermes", {})
    with pytest.raises(APIError) as expected:
        pending.build(template)
    try:
        with pytest.raises(APIError) as raised:
            asyncio.run(child.run(offload.constrain, pending))
    finally:
        child.shutdown()
    assert raised.value.status == 400 and raised.value.param == "tools"
    assert raised.value.message == expected.value.message
    assert "recursi" in raised.value.message


def test_a_child_that_dies_fails_its_request_with_a_500_and_the_next_one_starts_anew() -> None:
    child = offload.Offload(offload.Recipe.of(load_template("chatml")), what="grammar")

    async def run() -> tuple[list[int], str, list[int]]:
        (first,) = await child.start()
        with pytest.raises(APIError) as died:
            await child.run(os.abort)  # a native crash: SIGABRT in the child
        assert died.value.status == 500
        (second,) = await child.start()
        return [first], died.value.message, [second]

    try:
        first, message, second = asyncio.run(run())
    finally:
        child.shutdown()
    assert "grammar process ended unexpectedly" in message
    assert first != second
    assert gone_within(first[0], 10)


def test_shutdown_stops_a_child_in_the_middle_of_a_job() -> None:
    child = offload.Offload(offload.Recipe.of(load_template("chatml")), what="grammar")

    async def run() -> int:
        (pid,) = await child.start()
        busy = asyncio.ensure_future(child.run(time.sleep, 60))
        await asyncio.sleep(0.5)
        child.shutdown()
        with pytest.raises(APIError):
            await asyncio.wait_for(busy, 30)
        return pid

    started = time.monotonic()
    pid = asyncio.run(run())
    assert gone_within(pid, 10)
    assert time.monotonic() - started < 30


def test_a_child_exits_when_its_server_is_killed(tmp_path: Any) -> None:
    """The server's process dies with no chance to stop its children (SIGKILL, a native crash): they go too."""
    script = textwrap.dedent(
        """
        import asyncio, os, sys
        from chatcodec import load_template
        from chatcodec.server import offload

        child = offload.Offload(offload.Recipe.of(load_template("chatml")), what="grammar")
        (pid,) = asyncio.run(child.start())
        print(pid, flush=True)
        os._exit(0)  # no shutdown, no atexit
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    assert gone_within(pid, 10)
