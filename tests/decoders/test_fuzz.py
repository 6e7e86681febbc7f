"""Fuzzing: random text and corrupted vectors never raise and never lose a character.

The lossless check uses the stream's trace, which records where every consumed piece of input went:

- the pieces, in order, are exactly the input;
- ``content`` is exactly the text routed to content (``None`` when that is only whitespace), and
  ``reasoning_content`` the text routed to reasoning, stripped;
- each call's ``raw`` is exactly the text routed to that call;
- markup is only syntax: once the format's markers, whitespace and JSON punctuation are removed from
  a markup piece, nothing is left.

Every case is also streamed in random chunks, which must give the same message as ``decode()``.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatcodec.decoders import decoder, formats
from chatcodec.decoders.format import Format
from chatcodec.decoders.registry import get_format, make_decoder

from .adversarial import learned
from .helpers import VECTORS, as_streamed, need_vectors, rebuild, vector_options, vector_params

FORMATS = formats()
#: formats whose markup includes free text: harmony headers (role, channel) and the generic envelope
#: (the JSON-encoded response string, decoded into content)
HEADER_MARKUP = {"gpt_oss", "generic"}
PUNCTUATION = "[]{},;:"
#: end-of-turn markers the random texts mix in, and some decoders are given
STOPS = ["<|im_end|>", "</s>", "<|eot_id|>"]

#: CHATCODEC_FUZZ_EXAMPLES=20000 for a long run
FUZZ = settings(
    max_examples=int(os.environ.get("CHATCODEC_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _format(fmt: str) -> Format:
    return learned()[fmt][0] if fmt in learned() else get_format(fmt)


def check_lossless(fmt: str, text: str, options: dict[str, Any], seed: int) -> None:
    d = make_decoder(_format(fmt), **options)
    stream = d.stream(trace=True)
    stream.feed(text)
    stream.finish()
    message, trace = stream.message, stream.trace

    assert "".join(span.text for span in trace) == text
    content = "".join(s.text for s in trace if s.kind == "content")
    if fmt != "generic":
        assert message.content == (content if content.strip() else None)
    reasoning = "".join(s.text for s in trace if s.kind == "reasoning").strip()
    assert message.reasoning_content == (reasoning or None)
    for call in (*message.tool_calls, *message.invalid_tool_calls):
        assert call.raw == "".join(s.text for s in trace if s.kind == "call" and s.index == call.index)
        assert call.name
    for call in message.tool_calls:
        json.loads(call.arguments_json)  # the arguments contract: every valid call's arguments are JSON
    if fmt not in HEADER_MARKUP:
        markers = sorted((*_format(fmt).markers, *options.get("stop_markers", ())), key=len, reverse=True)
        for span in trace:
            if span.kind == "markup":
                residue = span.text
                for marker in markers:
                    residue = residue.replace(marker, "")
                residue = "".join(c for c in residue if not c.isspace() and c not in PUNCTUATION)
                assert not residue, f"markup {span.text!r} holds text"

    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 30)))) if len(text) > 1 else []
    stream = d.stream()
    deltas = []
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        deltas += stream.feed(text[a:b])
    deltas += stream.finish()
    assert rebuild(deltas, text) == as_streamed(message, text)


def pieces(fmt: str) -> st.SearchStrategy[str]:
    """Text biased towards what breaks parsers: the format's markers, cut or whole, and JSON bits."""
    markers = list(_format(fmt).markers) or ["<tool_call>"]
    json_bits = [
        '{"name": "f", "arguments": {',
        '"',
        "\\",
        "}",
        "]",
        "[",
        ",",
        ":",
        '"x"',
        "1",
        "true",
        "null",
    ]
    markers += STOPS
    return st.one_of(
        st.sampled_from(markers),
        st.sampled_from(markers).flatmap(lambda m: st.integers(1, len(m)).map(lambda k: m[:k])),
        st.sampled_from([*json_bits, "\n", " ", "é", "🌍", "x=", "'", "(", ")", "<", ">", "name", "f("]),
        st.text(max_size=6),
    )


def options() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "reasoning_format": st.sampled_from(["none", "auto"]),
            "thinking_forced_open": st.booleans(),
            "tools": st.sampled_from([["f"], ["f", "get_weather"]]),
            "tools_schema": st.sampled_from([{"x": "integer"}, {"x": "string", "a": "anyOf[integer,null]"}]),
            "stop_markers": st.sampled_from([STOPS[:1], STOPS]),
        },
    )


@FUZZ
@given(st.data())
def test_random_text(data: st.DataObject) -> None:
    fmt = data.draw(st.sampled_from([*FORMATS, *learned()]), label="format")
    text = "".join(data.draw(st.lists(pieces(fmt), max_size=40), label="pieces"))
    check_lossless(fmt, text, data.draw(options(), label="options"), data.draw(st.integers(0, 2**16)))


def corrupt(text: str, rng: random.Random, markers: list[str]) -> str:
    for _ in range(rng.randint(1, 4)):
        n = len(text)
        a, b = sorted((rng.randint(0, n), rng.randint(0, n)))
        op = rng.choice(["truncate", "delete", "insert", "duplicate", "replace"])
        if op == "truncate":
            text = text[:a]
        elif op == "delete":
            text = text[:a] + text[b:]
        elif op == "insert":
            text = text[:a] + rng.choice([*markers, '"', "}", "{", "\\", "\n", "]"]) + text[a:]
        elif op == "duplicate":
            text = text[:b] + text[a:b] + text[b:]
        elif a < n:
            text = text[:a] + rng.choice("<>{}[]\"'\\:,x\n") + text[a + 1 :]
    return text


@FUZZ
@given(st.integers(0, max(0, len(VECTORS) - 1)), st.integers(0, 2**32))
def test_corrupted_vectors(index: int, seed: int) -> None:
    if not VECTORS:
        return  # the vector-replay tests report the missing data; random text still runs above
    vector = VECTORS[index]
    fmt = vector["format"]
    rng = random.Random(seed)
    text = corrupt(vector["output"], rng, list(get_format(fmt).markers))
    check_lossless(fmt, text, vector_options(vector), seed)


@FUZZ
@given(st.text(max_size=200), st.sampled_from(FORMATS))
def test_any_text_any_format(text: str, fmt: str) -> None:
    check_lossless(fmt, text, {}, len(text))


@FUZZ
@given(st.binary(max_size=120), st.sampled_from(FORMATS), st.integers(1, 7))
def test_bytes_never_raise(data: bytes, fmt: str, step: int) -> None:
    """Arbitrary bytes, including invalid UTF-8, fed in small pieces: no exception."""
    stream = decoder(fmt).stream()
    for k in range(0, len(data), step):
        stream.feed(data[k : k + step])
    stream.finish()
    assert stream.message is not None


@pytest.mark.parametrize(("index", "vector"), vector_params())
def test_arguments_are_json_wherever_the_output_is_cut(index: int | None, vector: dict[str, Any] | None) -> None:
    """The arguments contract: cut a vector anywhere, and every valid call of the final message
    carries arguments that ``json.loads`` accepts (a call cut off is invalid, not a call)."""
    need_vectors()
    assert vector is not None
    d = decoder(vector["format"], **vector_options(vector))
    out = vector["output"]
    for k in range(len(out) + 1):
        message = d.decode(out[:k])
        for call in message.tool_calls:
            json.loads(call.arguments_json)
        assert all(call.error for call in message.invalid_tool_calls)
