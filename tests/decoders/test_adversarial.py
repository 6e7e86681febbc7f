"""Decoders are total: any model output gives a message, and nothing of it is lost.

The adversarial sweep (:mod:`.adversarial`) puts every marker of every format, repeated and nested,
bare or inside the format's own call, through every format. Here each text must decode without an
exception, its trace must account for every character, every valid call must carry JSON arguments,
and a stream cut at a random point must give the same message. ``bench/bench_decode.py --sweep``
runs the same texts at 20 KB and 200 KB and times them (performance is measured there, not here);
the 200 KB nesting below is what would overflow a recursive parser.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from chatcodec import load_template
from chatcodec.decoders import decoder, decoder_for, detect, detect_format, formats
from chatcodec.exceptions import ChatcodecError

from .adversarial import CALL_PREFIXES, SHAPES, all_formats, all_markers, call_prefix, learned, make, texts
from .helpers import as_streamed, rebuild

SWEEP_SIZE = 1000
DEEP_SIZE = 200_000


def check(fmt: str, text: str, seed: int) -> None:
    d = make(fmt)
    stream = d.stream(trace=True)
    stream.feed(text)
    stream.finish()
    message = stream.message
    assert "".join(span.text for span in stream.trace) == text
    for call in message.tool_calls:
        json.loads(call.arguments_json)
    cut = random.Random(seed).randrange(len(text) + 1)
    split = d.stream()
    deltas = split.feed(text[:cut]) + split.feed(text[cut:]) + split.finish()
    assert rebuild(deltas, text) == as_streamed(message, text), cut


def test_every_format_has_a_call_prefix() -> None:
    assert set(CALL_PREFIXES) == set(formats())
    assert len(all_markers()) > 100
    assert len(learned()) >= 8 and all(call_prefix(label) for label in learned())


@pytest.mark.parametrize("fmt", all_formats())
def test_every_marker_repeated_and_nested(fmt: str) -> None:
    for seed, (marker, shape, kind, text) in enumerate(texts(fmt, SWEEP_SIZE)):
        try:
            check(fmt, text, seed)
        except Exception as error:
            raise AssertionError(f"{fmt}: marker {marker!r}, {shape}, {kind}") from error


@pytest.mark.parametrize("fmt", all_formats())
def test_deep_nesting(fmt: str) -> None:
    """200 KB of brackets after the format's own call: no recursion anywhere, nothing lost."""
    deep = SHAPES["deep"]
    for prefix in {"", call_prefix(fmt)}:
        text = (prefix + deep("", DEEP_SIZE))[:DEEP_SIZE]
        stream = make(fmt).stream(trace=True)
        stream.feed(text)
        stream.finish()
        assert sum(len(span.text) for span in stream.trace) == len(text)
        for call in stream.message.tool_calls:
            json.loads(call.arguments_json)


# -- options: anything a caller passes gives a decoder or a DecodeError ---------------------------

_CYCLE: dict[str, object] = {"type": None}
_CYCLE["anyOf"] = [_CYCLE]
_DEEP: dict[str, object] = {"type": "string"}
for _ in range(10_000):
    _DEEP = {"anyOf": [_DEEP]}

ODD_TOOLS: list[object] = [
    [{"type": "function", "function": {"name": "f", "parameters": 5}}],
    [{"type": "function", "function": {"name": "f", "parameters": {"properties": [1, 2]}}}],
    [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": _CYCLE}}}}],
    [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": _DEEP}}}}],
    [{"function": {"name": "f", "parameters": {"properties": {1: {"type": ["integer", 3, None]}}}}}],
    [{"name": "f", "parameters": {"properties": {"a": {"anyOf": "string", "enum": [1]}}}}],
    [{"name": "f", "parameters": {"properties": {"a": {"type": {"nested": "dict"}, "oneOf": 7}}}}],
    ["f", "g"],
    ("f" for _ in range(2)),
]
BAD_OPTIONS: list[dict[str, object]] = [
    {"tools": 5},
    {"tools": "f"},
    {"tools": b"f"},
    {"tools": {"name": "f"}},
    {"tools": [5]},
    {"tools": [None]},
    {"tools": [{"function": {"name": 5}}]},
    {"tools": [{"function": "f"}]},
    {"tools": [{"function": {}}]},
    {"tools_schema": 5},
    {"tools_schema": ["x"]},
    {"reasoning_format": 5},
    {"reasoning_format": ["none"]},
    {"reasoning_format": "deepseek-legacy"},
    {"thinking_forced_open": "yes"},
    {"enable_thinking": 1},
    {"tag": 5},
    {"tag": "<x>"},
    {"template": 5},
    {"template": object()},
    {"template": "no-such-template"},
]


@pytest.mark.parametrize("tools", ODD_TOOLS)
def test_odd_tool_schemas_are_read_or_ignored(tools: object) -> None:
    d = decoder("qwen3_coder", tools=tools, tools_schema={"a": _DEEP, "b": _CYCLE, "c": 5, 3: None})  # type: ignore[arg-type, dict-item]
    message = d.decode("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>")
    (call,) = message.tool_calls
    assert call.name == "f" and json.loads(call.arguments_json) in ({"a": 1}, {"a": "1"})


def _stable_id(value: object) -> str:
    """``repr(value)`` without object addresses, so that every test worker collects the same ids."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


@pytest.mark.parametrize("options", BAD_OPTIONS, ids=_stable_id)
def test_bad_options_raise_decode_errors(options: dict[str, object]) -> None:
    with pytest.raises(ChatcodecError) as caught:
        decoder("hermes", **options)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("template", [5, None, 1.5, ["qwen3"], object(), b"qwen3", "no-such-template"], ids=_stable_id)
def test_template_entry_points_take_templates_names_or_paths(template: object) -> None:
    for entry in (decoder_for, detect, detect_format):
        with pytest.raises(ChatcodecError):
            entry(template)  # type: ignore[arg-type]
    with pytest.raises(ChatcodecError):
        decoder(5)  # type: ignore[arg-type]


def test_template_names_and_paths_are_loaded(tmp_path: Path) -> None:
    assert detect_format("qwen3") == "hermes"
    assert decoder_for("qwen3").format.name == "hermes"
    path = tmp_path / "chat.jinja"
    path.write_text(load_template("qwen3").source, encoding="utf-8")
    assert detect(path).format == "hermes" and decoder_for(str(path)).format.name == "hermes"
