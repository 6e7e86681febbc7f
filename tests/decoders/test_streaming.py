"""Split invariance: streaming any vector, cut anywhere, gives exactly ``decode()``.

Every split point (str and UTF-8 bytes, so cuts fall inside multi-byte characters and inside tags),
one character or one byte at a time, the vector's own chunks, and random chunkings. The deltas are
accumulated like an OpenAI client (:func:`helpers.rebuild`, which also checks the delta contract).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from chatcodec.decoders import Decoder, decoder

from .helpers import Streamed, as_streamed, need_vectors, rebuild, vector_options, vector_params


def stream_all(d: Decoder, chunks: list[str] | list[bytes], source: str) -> Streamed:
    stream = d.stream()
    deltas = []
    for chunk in chunks:
        deltas += stream.feed(chunk)
    deltas += stream.finish()
    assert stream.finish() == []
    return rebuild(deltas, source)


def chunkings(text: str, seed: int) -> list[list[str] | list[bytes]]:
    data = text.encode("utf-8")
    cases: list[list[str] | list[bytes]] = [[text], list(text), [data[k : k + 1] for k in range(len(data))]]
    cases += [[text[:k], text[k:]] for k in range(len(text) + 1)]
    cases += [[data[:k], data[k:]] for k in range(len(data) + 1)]
    rng = random.Random(seed)
    for _ in range(25):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
        cases.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return cases


@pytest.mark.parametrize(("index", "vector"), vector_params())
def test_split_invariance(index: int | None, vector: dict[str, Any] | None) -> None:
    need_vectors()
    assert index is not None and vector is not None
    d = decoder(vector["format"], **vector_options(vector))
    want = as_streamed(d.decode(vector["output"]), vector["output"])
    cases = chunkings(vector["output"], seed=index)
    if "chunks" in vector:
        cases.append(vector["chunks"])
    for chunks in cases:
        got = stream_all(d, chunks, vector["output"])
        assert got == want, f"chunks: {chunks[:8]!r}"


@pytest.mark.parametrize(("index", "vector"), vector_params())
def test_snapshots_only_grow(index: int | None, vector: dict[str, Any] | None) -> None:
    """After each character, the message so far extends the previous one: nothing is taken back."""
    need_vectors()
    assert index is not None and vector is not None
    stream = decoder(vector["format"], **vector_options(vector)).stream()
    before = as_streamed(stream.message)
    for ch in vector["output"]:
        stream.feed(ch)
        now = as_streamed(stream.message)
        assert (now.content or "").startswith(before.content or "")
        assert (now.reasoning_content or "").startswith(before.reasoning_content or "")
        assert len(now.calls) >= len(before.calls)
        for (name0, _, args0), (name1, _, args1) in zip(before.calls, now.calls, strict=False):
            assert name1 == name0 and args1.startswith(args0)
        before = now


def test_tool_names_are_never_split() -> None:
    """``say_hello`` must not go out while ``say_hello_world`` is still arriving (ollama's collision test)."""
    d = decoder("hermes", tools=["say_hello", "say_hello_world"])
    text = '<tool_call>{"name": "say_hello_world", "arguments": {}}</tool_call>'
    for k in range(len(text) + 1):
        stream = d.stream()
        deltas = stream.feed(text[:k]) + stream.feed(text[k:]) + stream.finish()
        names = [dl.tool_call.name for dl in deltas if dl.tool_call is not None and dl.tool_call.name]
        assert names == ["say_hello_world"]
        assert [c[0] for c in rebuild(deltas).calls] == ["say_hello_world"]


def test_deltas_stream_arguments_before_the_call_ends() -> None:
    d = decoder("hermes")
    stream = d.stream()
    out = rebuild(stream.feed('<tool_call>{"name": "write", "arguments": {"text": "hello wor'))
    assert out.calls == [("write", None, '{"text": "hello wor')]


def test_split_marker_is_held_not_leaked() -> None:
    stream = decoder("deepseek_v3_1", thinking_forced_open=True).stream()
    assert [d.reasoning_content for d in stream.feed("Thinking</th")] == ["Thinking"]
    assert stream.feed("ink>Answer")[0].content == "Answer"
