"""The whole read of a response template, in its fast paths: each gives what the general one and the stream give.

A whole decode searches delimiters that cannot match at one place together, searches a lookahead over any text
as one search of what it looks for, parses regions with their parser's arguments settled once, and writes
call ids a batch at a time. Each is checked here against what it stands for: the ``regex`` module's own
search, :func:`parse_content`, the digit-by-digit id, and above all the stream's message.
"""

from __future__ import annotations

import copy
import itertools
import json
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from chatcodec import DecodeError
from chatcodec.decoders import base, decoder_from_response_template, response_reader
from chatcodec.decoders.response_content import content_parser, parse_content, regex_module, tool_params
from chatcodec.decoders.response_reader import _delimiter_search, _literal_starts, load_response_template

from .test_response_template import TRL, whole_is_streamed

rx = pytest.importorskip("regex")

TEXTS = [
    "",
    "plain",
    "abc</think>rest",
    "x<thinking>in</thinking>out",
    "</thinking>",
    "a[BEGIN FINAL RESPONSE]b",
    "<thinking>a</thinking>[BEGIN FINAL RESPONSE]",
    "ab" * 20,
]


@pytest.mark.parametrize(
    "pattern",
    [
        r"(?=[\s\S]*?</think>)",
        r"(?=.*</think>)",
        r"<thinking>|\G(?=[\s\S]*?(?:\[BEGIN\ FINAL\ RESPONSE\]|</thinking>))",
        r"(?=[\s\S]*?a|b)",  # the b must be right there: not one lookahead over any text
        r"(?=a)(?=[\s\S]*?b)",
        r"(?=[\s\S]*?(?P<g>b))",  # a group: left to the engine
        r"(?i)(?=[\s\S]*?B)",  # a flag: left to the engine
        r"\G(?=[\s\S]*?b)",
        # lookahead alternatives, searched with what they look for in their place (_Unwrapped)
        r"```\s*|(?=</think>)",
        r"(?=\[BEGIN|</thinking>)",
        r"(?=</think>)|</thinking>|<thinking>",  # one place where both the lookahead and a longer match hold
        r"(?=a)b|(?=ab)",  # not one lookahead alone: the first is left to the engine
        r"(?=)|ab",
        r"<\|user\|>\s*|$",  # the end: where $ first holds, unless the other is sooner
        r"$|\n",  # one place where both hold: $ is listed first
        r"b\s*|(?=</think>)|$",
    ],
)
def test_a_lookahead_is_found_where_the_engine_finds_it(pattern: str) -> None:
    compiled = rx.compile(pattern, rx.DOTALL)
    search = _delimiter_search(compiled)
    for text in [*TEXTS, "x```  </think>y", "ab</thinking>", "```", "a<|user|> b\n", "\n", "a\nb\n\n", "b\n"]:
        for pos in range(len(text) + 1):
            theirs, ours = compiled.search(text, pos), search.search(text, pos)
            assert (theirs and theirs.span()) == (ours and ours.span()), (pattern, text, pos)


def test_literal_starts_are_only_what_a_match_must_begin_with() -> None:
    assert _literal_starts(rx.compile("x")) is None  # not the standard library's
    import re

    assert _literal_starts(re.compile(r"</tool_call>\s*|<\|im_end\|>")) == ("</tool_call>", "<|im_end|>")
    assert _literal_starts(re.compile(r"<tool_call>\s*<function=(?P<name>[^\n>]+)>")) == ("<tool_call>",)
    assert _literal_starts(re.compile(r"ab?c")) == ("a",)
    for vague in (r"(?=<a>)", r"\s*<a>", r"$", r"a|(?=b)", r"[ab]c", r"a*", r"(?:a)?", r"ab?|\s*c"):
        assert _literal_starts(re.compile(vague)) is None, vague
    # an optional group: the text before it, then what it or what follows it begins with
    branching = {
        r"<(?:tool_call>\s*<)?function=(?P<name>[^\n>]+)>": ("<tool_call>", "<function="),
        r"<\|(?:tool_calls?_section_begin\|>\s*<\|)?tool_call_begin\|>": ("<|tool_call", "<|tool_call_begin|>"),
        r"x(?:a|\s)?y": ("x", "xy"),
        r"a(?:b)??c|d": ("ab", "ac", "d"),
        r"</s>|x(?:y)?": ("</s>", "xy", "x"),
    }
    texts = ["<tool_call> <function=f>", "<function=g>", "<|tool_call_begin|>", "<|tool_calls_section_begin|>"
             " <|tool_call_begin|>", "x y", "xy", "x\ty", "abc", "ac", "d", "xyz", "</s>"]  # fmt: skip
    for pattern, starts in branching.items():
        compiled = re.compile(pattern)
        assert _literal_starts(compiled) == starts, pattern
        matched = [m for text in texts for at in range(len(text)) if (m := compiled.match(text, at))]
        assert matched and all(m.string.startswith(starts, m.start()) for m in matched), pattern


def _together(spec: dict[str, Any]) -> int:
    """How many delimiters the whole read of ``spec`` searches together outside every region."""
    rt = load_response_template(spec)
    return max((len(tagged) for _, _, _, tagged in rt.idle.watched if tagged), default=0)


#: templates whose delimiters outside every region are searched together, with outputs that reach each one
TOGETHER = [
    (
        TRL["templates"]["qwen3_5"],
        [
            "<think>\nHm.\n</think>\n\nSure.<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n"
            "</tool_call><|im_end|>tail",
            "Before <|im_end|><tool_call>\n<function=g>\n</function>\n</tool_call>",
            "<tool_call>\n<function=f>\n<parameter=x>\n[1, 2]\n</parameter>\n</function>\n</tool_call>"
            "<tool_call>\n<function=g>\n<parameter=y>\nnot json\n</parameter>\n</function>\n</tool_call>",
            "<think>never closed <tool_call>",
            "<|im_end|>",
        ],
    ),
    (
        TRL["templates"]["qwen3"],
        [
            '<think>a</think>b<tool_call>\n{"name": "f", "arguments": {"a": "}"}}\n</tool_call>c<|im_end|>d',
            '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>nope</tool_call>',
            "<tool_call>\n</tool_call><think></think>",
        ],
    ),
    (
        {
            "start_anchor": "A:",
            "fields": {
                "reasoning_content": {"open": ["<t>", "<tt>"], "close": "</t>"},
                "tool_calls": {
                    "open_pattern": r"<c (?P<name>\w+)>",
                    "close": "</c>",
                    "content": "json",
                    "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
                },
                "content": {"close_pattern": r"<end>\s*"},
            },
        },
        ['<tt>x</t>y<c f>{"a": 1}</c><t>z</t><c g>[1]</c><end> rest', "<t><c f>{}</c>", "<c  f>{}</c><end>"],
    ),
    # delimiters searched together only by looking into a group they begin with, or naming groups
    (
        {
            "start_anchor": "A:",
            "fields": {
                "reasoning_content": {"open": "<think>", "close_pattern": r"(?:</think>)\s*"},
                "tool_calls": {
                    "open_pattern": r"<tool_call>(?P<name>\w+)\n?",
                    "close": "</tool_call>",
                    "content": "json",
                    "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
                },
                "content": {"close_pattern": r"(?:<\|eot_id\|>|>>>all\n)\s*"},
            },
        },
        [
            '<think>a</think>  b<tool_call>f\n{"x": 1}</tool_call>c<|eot_id|> d',
            "x>>>all\n y<think>",
            '<tool_call>g{"y": [2]}</tool_call><tool_call>h\nnope</tool_call>>>>all',
            "<|eot_id|>",
            "",
        ],
    ),
]


@pytest.mark.parametrize(("spec", "texts"), TOGETHER, ids=["qwen3_5", "qwen3", "literals", "through-groups"])
def test_delimiters_searched_together_read_as_the_stream_reads(spec: dict[str, Any], texts: list[str]) -> None:
    assert _together(spec) >= 2
    decoder = decoder_from_response_template(spec, prompt="")
    for text in texts:
        whole_is_streamed(decoder, text)


def test_a_leading_group_and_named_groups_do_not_keep_delimiters_apart() -> None:
    spec, _ = TOGETHER[-1]
    assert _together(spec) == 4  # <think>, <tool_call>(?P<name>...), and the two starts of (?:<|eot_id|>|>>>all\n)


def test_a_region_that_never_closes_runs_to_the_end() -> None:
    spec = {"start_anchor": "A:", "fields": {"reasoning_content": {"open": "<r>"}, "content": {}}}
    decoder = decoder_from_response_template(spec, prompt="")
    message = whole_is_streamed(decoder, "before <r> all the rest </r> too")
    assert (message.content, message.reasoning_content) == ("before ", "all the rest </r> too")


#: delimiters that can match at one place (one's literal start begins another's), with texts where they do
CLASHING = [
    (  # the longer wins
        {
            "reasoning_content": {"open": "<t>", "close": "</t>"},
            "tool_calls": {"open": "<t>call", "close": "</tool>", "content": "json"},
            "content": {},
        },
        ['<t>a</t><t>call{"name": "f", "arguments": {}}</tool>b', "<t>callx</t>", "<t>cal</t>", "x<t>"],
    ),
    (  # one length: an open before a close, then the first listed
        {
            "reasoning_content": {"open": "<x>", "close": "</x>"},
            "tool_calls": {
                "open_pattern": r"<x(?P<name>\w*)>",
                "close": "</c>",
                "content": "json",
                "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
            },
            "content": {"close_pattern": r"<x>|<e>"},
        },
        ["a<x>b</x>c<e>d", "<x>b</x><xf>{}</c>", "<e>rest", "<xg>[1]</c><x>", "a<x"],
    ),
    (  # a pattern whose literal start is one character
        {
            "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*"},
            "tool_calls": {
                "open_pattern": r"<[a-z]*fn=(?P<name>[^>\n]+)>",
                "close": "</fn>",
                "content": "json",
                "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
            },
            "content": {"close_pattern": r"(?:<\|im_end\|>|\[EOS\])\s*"},
        },
        [
            '<think>hm</think> a <callfn=f>{"x": 1}</fn><fn=g>{}</fn><|im_end|>tail',
            "<|im_end|>rest",
            "a < b <| c <thin <|im_end <fn=f>[]</fn>",
            "<think><fn=f></think>[EOS]",
        ],
    ),
]


@pytest.mark.parametrize(("fields", "texts"), CLASHING, ids=["longest", "open-then-listed", "one-character-start"])
def test_delimiters_that_could_match_at_one_place_are_settled_as_the_stream_settles_them(
    fields: dict[str, Any], texts: list[str]
) -> None:
    spec = {"start_anchor": "A:", "fields": fields}
    assert _together(spec) >= 2
    assert load_response_template(spec).idle.clash
    decoder = decoder_from_response_template(spec, prompt="")
    for text in texts:
        whole_is_streamed(decoder, text)


@pytest.mark.parametrize(
    "spec",
    [
        {
            "start_anchor": "A:",
            "fields": {
                "reasoning_content": {"open_pattern": r"(?=[\s\S]*?</think>)", "close": "</think>"},
                "content": {},
            },
        },
        {
            "start_anchor": "A:",
            "fields": {
                "thinking": {
                    "open_pattern": r"<thinking>|\G(?=[\s\S]*?(?:\[BEGIN\ FINAL\ RESPONSE\]|</thinking>))",
                    "close_pattern": r"(?:\[BEGIN\ FINAL\ RESPONSE\]|</thinking>)\s*",
                },
                "content": {},
            },
        },
    ],
    ids=["ahead", "here-or-ahead"],
)
def test_a_lookahead_open_reads_as_the_stream_reads(spec: dict[str, Any]) -> None:
    decoder = decoder_from_response_template(spec, prompt="")
    for text in [*TEXTS, "a</think>b</think>c", "x</thinking>y<thinking>z</thinking>"]:
        whole_is_streamed(decoder, text)


@pytest.mark.parametrize(
    ("parser", "args"),
    [
        ("json", {}),
        ("json", {"allow_non_json": True}),
        ("json", {"allow_non_json": True, "strip": False}),
        ("json", {"string_delims": [["'", "'"]]}),
        ("json", {"unquoted_keys": True, "string_delims": [['<|"|>', '<|"|>']]}),
        ("json", {"string_delims": [["'"]]}),  # not a pair: an error when a region is parsed, as before
        ("text", {}),
        ("text", {"strip": False}),
        ("kv-lines", {"value_parser": {"name": "json", "args": {"allow_non_json": True}}}),
    ],
)
def test_a_settled_content_parser_parses_as_parse_content(parser: str, args: dict[str, Any]) -> None:
    parse = content_parser(parser, args)
    for text in [
        ' {"a": [1, 2.5, null]} ',
        "[1] x",
        "tru",
        "",
        "  ",
        "NaN",
        "{'a': 'b c'}",
        '{a:<|"|>x, y<|"|>,b:1}',
        "k: 1\nv: two",
        "\x01",
        "9" * 5000,  # past int's digit limit: a ValueError either way
    ]:
        assert _outcome(parse, text) == _outcome(lambda t: parse_content(parser, t, args), text), (parser, text)


def test_a_settled_xml_parser_parses_as_parse_content() -> None:
    args = dict(TRL["templates"]["qwen3_5"]["fields"]["tool_calls"]["content_args"])
    args["tag_pattern"] = regex_module().compile(args["tag_pattern"], regex_module().DOTALL)
    parse = content_parser("xml-inline", args)
    for text in ["<parameter=a>\n1\n</parameter><parameter=b>\nx y\n</parameter>", "", "<parameter=a></parameter>"]:
        assert parse(text) == parse_content("xml-inline", text, args)


def _outcome(parse: Any, text: str) -> Any:
    try:
        return "ok", json.dumps(parse(text), sort_keys=True, default=repr)
    except ValueError as exc:
        return "error", str(exc)[:40]


def test_tool_params_lists_only_what_casting_changes() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "properties": {
                        "s": {"type": "string"},
                        "e": {"type": "string", "enum": ["a", "b"]},
                        "n": {"anyOf": [{"type": "string"}, {"type": "number"}]},
                        "u": {},
                    }
                },
            },
        }
    ]
    assert tool_params(tools) == {"f": {"n": ("string", "number")}}


def test_call_ids_are_a_counter_through_a_bijection_written_digit_by_digit() -> None:
    ids = base._CallIds("call_", prefix_width=12)

    def one_at_a_time(n: int) -> str:
        """The id of number ``n``: its high six base-62 digits, then its low six, each lowest digit first."""
        digits = []
        for half in (n // 62**6, n % 62**6):
            for _ in range(6):
                half, d = divmod(half, 62)
                digits.append(base._ALNUM[d])
        return ids._prefix + "".join(digits)

    last = 62**12 // ids.BATCH - 1
    for batch in (0, 1, 62**6 // ids.BATCH - 1, 62**6 // ids.BATCH, last):
        ids._batches = itertools.count(batch)
        ids._ready = []
        made = [ids() for _ in range(ids.BATCH)]
        assert made == [one_at_a_time(ids.number(k)) for k in range(batch * ids.BATCH, (batch + 1) * ids.BATCH)]
    assert ids._prefix.startswith("call_") and len(made[0]) == 29
    # a bijection of [0, 62**12): no two of these counters write one number
    sample = [*range(3000), *range(62**6 - 1500, 62**6 + 1500), *range(62**12 - 3000, 62**12)]
    numbers = {ids.number(k) for k in sample}
    assert len(numbers) == len(sample) and min(numbers) >= 0 and max(numbers) < 62**12
    assert len({base.new_call_id() for _ in range(3 * ids.BATCH)}) == 3 * ids.BATCH


def _spec(close: str = "</c>") -> dict[str, Any]:
    """A response template with one kind of call region, closed by ``close``."""
    return {"start_anchor": "A:", "fields": {
        "tool_calls": {"open": "<c>", "close": close, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"content": "text"}}}  # fmt: skip


def test_a_whole_reads_call_ids_are_made_when_first_read_and_then_kept() -> None:
    """A whole read leaves a call's fresh id unmade (a decode spends nothing on ids nobody reads); the first read
    makes it, and every later read, a copy, a pickle and equality see that one."""
    decoder = decoder_from_response_template(_spec(), prompt="A:")
    text = '<c>{"name": "f", "arguments": {"x": 1}}</c><c>{"name": "g", "arguments": {}}</c>'
    first, second = decoder.decode(text).tool_calls
    with pytest.raises(AttributeError):
        base._ID_SLOT.__get__(first, base.ToolCall)  # not made yet
    made = first.id
    assert made.startswith("call_") and len(made) == 29 and first.id is made
    assert base._ID_SLOT.__get__(first, base.ToolCall) is made
    assert copy.copy(first).id == made and pickle.loads(pickle.dumps(first)) == first
    assert first.to_openai()["id"] == made and second.id not in (made, "")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        first.nope  # noqa: B018 (other missing attributes are missing as before)
    assert len({decoder.decode(text).tool_calls[0].id for _ in range(500)}) == 500


def test_threads_reading_a_late_id_first_at_once_read_one_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads read a call's unmade id at once, its making slowed: all read one id (it is made under a lock)."""
    made = base.next_call_id

    def slow() -> str:  # widen the window between seeing no id and setting one
        time.sleep(0.01)
        return made()

    monkeypatch.setattr(base, "next_call_id", slow)
    call = object.__new__(base.ToolCall)  # as the whole read builds a call: its id slot unset
    start = threading.Barrier(8)

    def read(_: int) -> str:
        start.wait()
        return call.id

    with ThreadPoolExecutor(8) as pool:
        assert len(set(pool.map(read, range(8)))) == 1


def test_a_compiled_template_is_kept_by_its_json_and_never_shared_with_another() -> None:
    """load_response_template compiles a template once (decoder_for builds a decoder per request); what it keeps is
    bounded, holds a copy of the spec, and is never given for a spec that only writes the same JSON."""
    spec = _spec()
    first = load_response_template(spec)
    assert load_response_template(_spec()) is first and first.spec == spec and first.spec is not spec
    spec["fields"]["tool_calls"]["close"] = "</d>"  # the caller's dict changes: what was compiled does not
    assert first.fields[0].close is not None and first.fields[0].close.literals == ("</c>",)
    assert load_response_template(spec).fields[0].close.literals == ("</d>",)  # type: ignore[union-attr]
    # the same JSON, not the same template: a tuple is no list to transformers, so chatcodec refuses it
    tupled = _spec()
    tupled["fields"]["tool_calls"]["open"] = ("<c>",)
    with pytest.raises(DecodeError, match="open must be a non-empty string or a list"):
        load_response_template(tupled)
    # the fields' order is the last tie-break: two orders are two templates
    swapped = _spec()
    swapped["fields"] = dict(reversed(list(swapped["fields"].items())))
    assert load_response_template(swapped) is not first
    assert [f.name for f in load_response_template(swapped).fields] == ["content", "tool_calls"]
    # bounded: 16 templates, and none whose JSON is over 64 KiB
    for n in range(40):
        load_response_template(_spec(f"</c{n}>"))
    assert len(response_reader._COMPILED) == response_reader._COMPILED_SIZE == 16
    huge = _spec("</" + "c" * 70_000 + ">")
    assert load_response_template(huge) is not load_response_template(huge)
    assert all(len(key) <= 1 << 16 for key in response_reader._COMPILED)


def test_an_implicit_tool_call_field_reads_only_its_own_text_after_a_region() -> None:
    """The text outside every region is the implicit field's; after a region closes, its body starts there
    (the whole read once took the closed region's text too, and the call failed to parse)."""
    spec = {
        "start_anchor": "A:",
        "fields": {
            "reasoning_content": {"open": "<think>", "close": "</think>"},
            "tool_calls": {"content": "json", "transform": {"type": "function", "function": "{content}"}},
        },
    }
    decoder = decoder_from_response_template(spec, prompt="")
    message = whole_is_streamed(decoder, '<think>hm</think>{"name": "f", "arguments": {"x": 1}}')
    assert message.reasoning_content == "hm"
    assert [(call.name, call.arguments, call.raw) for call in message.tool_calls] == [
        ("f", {"x": 1}, '{"name": "f", "arguments": {"x": 1}}')
    ]


#: transforms of a tool-call field, with the shapes a compiled reading settles from how they are written
TRANSFORMS = [
    {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
    {"type": "function", "function": "{content}"},
    {"type": "function", "function": "{content}", "id": "{id}"},
    {"function": {"name": "{name}", "parameters": "{content.args}"}, "id": "{content.id}"},
    {"name": "{name}", "arguments": "{content}"},  # no "function": the value itself is the function
    {"function": {"name": "{name}"}},  # no arguments: {}
    {"function": "fixed"},  # not an object
    {"function": {"name": ["{name}"], "arguments": {"x": "{content}"}}},  # a name that is not a string
    {"type": "{kind}", "function": {"name": "{name}", "arguments": "{content}"}},  # a lookup only to fail on
]
EACH = [
    {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}},
    {"function": {"name": "{tool_name}", "arguments": "{parameters}"}, "id": "{tool_call_id}"},
    {"function": "{content}"},
    {"type": "function"},
]
BODIES = [
    '{"x": 1}',
    '{"name": "g", "arguments": {"n": "2"}, "id": "c1", "args": {"n": "3"}}',
    '{"name": "g", "arguments": "{\\"n\\": \\"2\\"}"}',
    '{"name": "g", "arguments": "not json"}',
    '{"name": "", "arguments": {}}',
    '[{"name": "a", "arguments": {"n": "1"}, "tool_name": "b", "parameters": {}, "tool_call_id": 7}, {"name": "c"}]',
    "[1, 2]",
    '"text"',
    "not json at all",
    "[]",
]


@pytest.mark.parametrize(("transform", "each"), [(t, False) for t in TRANSFORMS] + [(t, True) for t in EACH])
def test_a_transform_read_as_written_gives_what_its_built_value_gives(transform: dict[str, Any], each: bool) -> None:
    """The compiled reading of a tool-call region takes the name, arguments and id from where an object transform
    puts them; the general one builds the transform's value and searches it. Both must give the same calls, the
    same invalid ones and the same errors, on every body and captures."""
    spec = {
        "start_anchor": "A:",
        "fields": {
            "tool_calls": {
                "open_pattern": r"<c(?: (?P<name>\w+))?>",
                "close": "</c>",
                "content": "json",
                "transform": transform,
                "transform_each": each,
            }
        },
    }
    field = load_response_template(spec).fields[0]
    written, built = response_reader._calls_source(field, True), response_reader._calls_source(field, False)
    params = {"g": {"n": ("integer",)}, "a": {"n": ("integer",)}}
    for body in BODIES:
        for captures in ({}, {"name": "g"}, {"name": "g", "kind": "function", "id": "i9"}):
            assert written(body, captures, params) == built(body, captures, params), (body, captures)
