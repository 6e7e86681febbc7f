"""Round trips: calls written in a format's own syntax decode back to exactly those calls.

Hypothesis draws the calls: names, ids, and arguments with nested objects and lists, numbers, and
strings full of quotes, backslashes, newlines, non-ASCII and other formats' markers. Each writer
below produces what a model trained on the format writes. The decoder must return the same names,
arguments (and ids where the format carries them), with text before and after kept as content; a
random chunking must give the same result.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatcodec.decoders import decoder

from .helpers import as_streamed, rebuild
from .test_fuzz import FUZZ

Call = tuple[str, dict[str, Any], str]  # name, arguments, id

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
IDS = st.from_regex(r"[A-Za-z0-9]{9}", fullmatch=True)
NASTY = ['"', "\\", "\n", "\t", "é", "🌍", "</tool_call>", "<|tool_call_end|>", "[TOOL_CALLS]", "{", "}", "]", ">>>"]
TEXT = st.lists(st.sampled_from([*NASTY, "a", "b", " ", "0", "x y"]), max_size=12).map("".join)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12), TEXT,
                    st.floats(allow_nan=False, allow_infinity=False, width=32))  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(NAMES, inner, max_size=3)),
    max_leaves=8,
)
ARGS = st.dictionaries(NAMES, VALUES, max_size=4)
CALLS = st.lists(st.tuples(NAMES, ARGS, IDS), min_size=1, max_size=3)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def obj(call: Call, args_key: str = "arguments", with_id: bool = False) -> str:
    name, args, call_id = call
    fields = {"name": name, args_key: args, **({"id": call_id} if with_id else {})}
    return dumps(fields)


WRITERS: dict[str, Callable[[list[Call]], str]] = {
    "hermes": lambda cs: "".join(f"<tool_call>\n{obj(c)}\n</tool_call>" for c in cs),
    "hermes_call_id": lambda cs: "".join(f"<tool_call>{c[2]}\n{obj(c)}\n</tool_call>" for c in cs),
    "llama3_json": lambda cs: "; ".join(obj(c, "parameters") for c in cs),
    "json_list": lambda cs: "[" + ", ".join(obj(c) for c in cs) + "]",
    "mistral_pre_v11": lambda cs: "[TOOL_CALLS][" + ", ".join(obj(c, with_id=True) for c in cs) + "]",
    "mistral_v11": lambda cs: "".join(f"[TOOL_CALLS]{n}[ARGS]{dumps(a)}" for n, a, _ in cs),
    "mistral_v13": lambda cs: "".join(f"[TOOL_CALLS]{n}[CALL_ID]{i}[ARGS]{dumps(a)}" for n, a, i in cs),
    "granite": lambda cs: "<|tool_call|>[" + ", ".join(obj(c) for c in cs) + "]",
    "phi4_mini": lambda cs: "functools[" + ", ".join(obj(c) for c in cs) + "]",
    "nemotron_v2": lambda cs: "<TOOLCALL>[" + ", ".join(obj(c) for c in cs) + "]</TOOLCALL>",
    "lfm2": lambda cs: "<|tool_call_start|>[" + ", ".join(obj(c) for c in cs) + "]<|tool_call_end|>",
    "apriel": lambda cs: "<tool_calls>[" + ", ".join(obj(c) for c in cs) + "]</tool_calls>",
    "apertus": lambda cs: "<|tools_prefix|>[" + ", ".join(dumps({n: a}) for n, a, _ in cs) + "]<|tools_suffix|>",
    "command_r7b": lambda cs: (
        "<|START_ACTION|>["
        + ", ".join(dumps({"tool_call_id": i, "tool_name": n, "parameters": a}) for n, a, i in cs)
        + "]<|END_ACTION|>"
    ),
    "deepseek_v3_1": lambda cs: (
        "<｜tool▁calls▁begin｜>"
        + "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{dumps(a)}<｜tool▁call▁end｜>" for n, a, _ in cs)
        + "<｜tool▁calls▁end｜>"
    ),
    "deepseek_v3": lambda cs: (
        "<｜tool▁calls▁begin｜>"
        + "".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{dumps(a)}\n```<｜tool▁call▁end｜>"
            for n, a, _ in cs
        )
        + "<｜tool▁calls▁end｜>"
    ),
    "kimi_k2": lambda cs: (
        "<|tool_calls_section_begin|>"
        + "".join(
            f"<|tool_call_begin|>functions.{n}:{k}<|tool_call_argument_begin|>{dumps(a)}<|tool_call_end|>"
            for k, (n, a, _) in enumerate(cs)
        )
        + "<|tool_calls_section_end|>"
    ),
    "gpt_oss": lambda cs: "".join(
        f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{dumps(a)}<|call|>"
        for n, a, _ in cs
    ),
    "functionary_v3_1": lambda cs: "".join(f"<function={n}>{dumps(a)}</function>" for n, a, _ in cs),
    "functionary_v3_2": lambda cs: ">>>".join(f"{n}\n{dumps(a)}" for n, a, _ in cs),
    "generic": lambda cs: dumps({"tool_calls": [{"name": n, "arguments": a, "id": i} for n, a, i in cs]}),
}
#: how each format writes visible text before its calls (default: plain text); None: it cannot
PREAMBLE: dict[str, str | None] = {
    "functionary_v3_2": "all\nBefore. >>>",
    "gpt_oss": "<|channel|>commentary<|message|>Before. <|end|>",
    "generic": None,
}
#: formats whose output carries the model's own call ids before the arguments (an id written after
#: them comes too late for the stream, which announced the call with an id of its own)
WITH_IDS = {"hermes_call_id", "mistral_v13", "command_r7b"}


def check(fmt: str, text: str, calls: list[Call], seed: int) -> None:
    d = decoder(fmt)
    message = d.decode(text)
    got = [(c.name, c.arguments, c.error) for c in message.tool_calls]
    assert got == [(n, a, None) for n, a, _ in calls], text
    if fmt in WITH_IDS:
        assert [c.id for c in message.tool_calls] == [i for _, _, i in calls]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 12)))
    stream = d.stream()
    deltas = [x for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) for x in stream.feed(text[a:b])]
    assert rebuild(deltas + stream.finish(), text) == as_streamed(message, text)


@FUZZ
@given(st.sampled_from(sorted(WRITERS)), CALLS, st.integers(0, 2**16))
def test_json_family_round_trip(fmt: str, calls: list[Call], seed: int) -> None:
    text = WRITERS[fmt](calls)
    check(fmt, text, calls, seed)
    preamble = PREAMBLE.get(fmt, "Before. ")
    if preamble is not None:
        check(fmt, preamble + text, calls, seed)


# -- formats that re-serialize: XML-style values, Python literals, Gemma ---------------------------

XML_TEXT = st.lists(st.sampled_from(['"', "\\", "\n", "é", "&&", "a < b", "x", " ", "{", "1"]), max_size=10).map(
    lambda parts: "".join(parts).strip()
)
XML_VALUES = st.one_of(st.integers(-(10**9), 10**9), st.booleans(), XML_TEXT, st.lists(st.integers(), max_size=3))
XML_ARGS = st.dictionaries(NAMES, XML_VALUES, max_size=4)


def xml_value(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)


def xml_types(args: dict[str, Any]) -> dict[str, str]:
    kinds = {bool: "boolean", int: "integer", str: "string", list: "array"}
    return {k: kinds[type(v)] for k, v in args.items()}


XML_WRITERS: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "qwen3_coder": lambda n, a: (
        f"<tool_call>\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{xml_value(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>"
    ),
    "seed_oss": lambda n, a: (
        f"<seed:tool_call>\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{xml_value(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</seed:tool_call>"
    ),
    "glm45": lambda n, a: (
        f"<tool_call>{n}\n"
        + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{xml_value(v)}</arg_value>\n" for k, v in a.items())
        + "</tool_call>"
    ),
    "minimax_m2": lambda n, a: (
        f'<minimax:tool_call>\n<invoke name="{n}">\n'
        + "".join(f'<parameter name="{k}">{xml_value(v)}</parameter>\n' for k, v in a.items())
        + "</invoke>\n</minimax:tool_call>"
    ),
}


@FUZZ
@given(st.sampled_from(sorted(XML_WRITERS)), NAMES, XML_ARGS, st.integers(0, 2**16))
def test_xml_round_trip_with_schema(fmt: str, name: str, args: dict[str, Any], seed: int) -> None:
    text = "Sure. " + XML_WRITERS[fmt](name, args)
    d = decoder(fmt, tools_schema=xml_types(args))
    message = d.decode(text)
    assert [(c.name, c.arguments, c.error) for c in message.tool_calls] == [(name, args, None)], text


PY_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)


@settings(FUZZ, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(NAMES, st.dictionaries(NAMES, PY_VALUES, max_size=3)), min_size=1, max_size=3))
def test_pythonic_round_trip(calls: list[tuple[str, dict[str, Any]]]) -> None:
    body = ", ".join(f"{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")" for n, a in calls)
    for fmt, text in (("pythonic", f"[{body}]"), ("llama4_pythonic", f"<|python_start|>[{body}]<|python_end|>")):
        message = decoder(fmt).decode("Here: " + text)
        assert [(c.name, c.arguments, c.error) for c in message.tool_calls] == [(n, a, None) for n, a in calls]


GEMMA_TEXT = st.lists(st.sampled_from(['"', "\\", "\n", "é", "{", "}", ",", ":", "x", " "]), max_size=8).map("".join)
GEMMA_VALUES = st.recursive(
    st.one_of(st.booleans(), st.integers(), GEMMA_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(NAMES, inner, max_size=3)),
    max_leaves=6,
)


def gemma(value: Any, esc: str) -> str:
    if isinstance(value, str):
        return esc + value + esc
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma(v, esc)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma(v, esc) for v in value) + "]"
    return str(value)


@FUZZ
@given(NAMES, st.dictionaries(NAMES, GEMMA_VALUES, max_size=3))
def test_gemma_round_trip(name: str, args: dict[str, Any]) -> None:
    for fmt, (start, end, esc) in {
        "function_gemma": ("<start_function_call>", "<end_function_call>", "<escape>"),
        "gemma4": ("<|tool_call>", "<tool_call|>", '<|"|>'),
    }.items():
        text = f"{start}call:{name}{gemma(args, esc)}{end}"
        (call,) = decoder(fmt).decode(text).tool_calls
        assert (call.name, call.arguments, call.error) == (name, args, None), text
