"""The project's own parse vectors (``data/vectors.jsonl``): the cases the second round of decoding added.

Each vector names its ``source`` (the model documentation, the serving stack or the issue the case
comes from), the output and the expected message, written by hand. Interleaved reasoning for every
format that reasons, Llama 3.1 built-in tools, the Granite 3.1 prefix and 3.2 markers, fenced calls,
stop markers, Python-literal arguments and invalid calls. Each is decoded whole and streamed cut at
every point (as text and as UTF-8 bytes); both must give the expected message, and the trace must
account for every character.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chatcodec.decoders import decoder

from .helpers import as_streamed, rebuild

VECTORS = [
    json.loads(line) for line in (Path(__file__).parent / "data" / "vectors.jsonl").read_text("utf-8").splitlines()
]


def params() -> list[Any]:
    return [pytest.param(v, id=f"{i:02d}-{v['format']}") for i, v in enumerate(VECTORS)]


def test_every_vector_names_its_source() -> None:
    assert len(VECTORS) >= 40
    assert all(v["source"] for v in VECTORS)


@pytest.mark.parametrize("vector", params())
def test_own_vector(vector: dict[str, Any]) -> None:
    d = decoder(vector["format"], **vector.get("options", {}))
    out = vector["output"]
    stream = d.stream(trace=True)
    stream.feed(out)
    stream.finish()
    message = stream.message
    expected = vector["expected"]
    got = {
        "content": message.content,
        "reasoning_content": message.reasoning_content,
        "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls],
    }
    if "invalid_tool_calls" in expected:
        got["invalid_tool_calls"] = [{"name": c.name} for c in message.invalid_tool_calls]
    else:
        assert not message.invalid_tool_calls
    assert got == expected, vector.get("note")
    assert "".join(span.text for span in stream.trace) == out
    for call in message.tool_calls:
        json.loads(call.arguments_json)
    want = as_streamed(message, out)
    data = out.encode()
    for k in range(len(out) + 1):
        s = d.stream()
        assert rebuild(s.feed(out[:k]) + s.feed(out[k:]) + s.finish(), out) == want, k
    for k in range(len(data) + 1):
        s = d.stream()
        assert rebuild(s.feed(data[:k]) + s.feed(data[k:]) + s.finish(), out) == want, k
