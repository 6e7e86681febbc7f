"""Replay shared/parse-vectors.jsonl: ``decode(output)`` must give ``expected``.

A vector with ``partial: true`` is a streaming snapshot: its output is fed without ``finish()`` and
the message so far is compared. Where chatcodec decides differently from the upstream source, the
vector is listed in ``DEVIATIONS`` with the reason, and the test checks *our* documented answer
instead: the expected values there follow from the policy stated in the reason (they are written
from the input by hand, never copied from the decoder). A listed vector that matches upstream
exactly fails the test, so the table cannot go stale. No vector is skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from chatcodec.decoders import AssistantMessage, decoder

from .helpers import VECTORS, need_vectors, vector_options, vector_params


@dataclass(frozen=True)
class Deviation:
    """Why we differ from a vector's upstream answer, and how our answer is checked.

    ``check``:
    - ``"whitespace"``: the same message up to whitespace at the ends of content and reasoning.
      Our policy: content is verbatim (only whitespace-only content is null), reasoning is stripped.
    - ``"args_prefix"``: a streaming snapshot; upstream heals or re-serializes the partial arguments,
      we stream the model's text verbatim. The upstream prefix (whitespace aside) starts ours.
    - ``"invalid_call"``: the call was announced while streaming (names go out as soon as the
      arguments start) and turned out broken, so it stays a tool call with ``error`` set and its
      text in ``raw``, where upstream turns the text into content. ``raw`` must hold that text.
    - ``"late_id"``: the same message, except that the model's id, written after the arguments, is
      in the call's ``raw`` text and not its ``id``.
    - ``"override"``: our answer is ``message``, stated by the policy in ``reason``.
    """

    reason: str
    check: str = "override"
    message: dict[str, Any] = field(default_factory=dict)
    #: with ``"override"``: the names of the calls that must be in ``invalid_tool_calls``
    invalid: tuple[str, ...] = ()


def _msg(
    content: str | None = None, reasoning: str | None = None, calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"content": content, "reasoning_content": reasoning, "tool_calls": calls or []}


WS = "llama.cpp strips content at both ends; we keep content verbatim (vLLM does too)"
PARTIAL_ARGS = "upstream heals partial arguments and re-serializes them; we stream the model's bytes verbatim"
INVALID = "a broken call stays a flagged tool call (its name was already streamed), its text kept in raw"
LOSSLESS = "lossless policy: text around and between calls stays content; upstream drops it"

LATE_ID = (
    "the id comes after the arguments: the stream announced the call (with an id of its own) when its "
    "arguments began, and an OpenAI client must not receive a second id, so the model's id stays in the "
    "call's raw text and the message keeps the announced one. Same call otherwise"
)

DEVIATIONS: dict[int, Deviation] = {
    5: Deviation(LATE_ID, "late_id"),
    9: Deviation(LATE_ID, "late_id"),
    6: Deviation(PARTIAL_ARGS, "args_prefix"),
    11: Deviation(
        "a call is announced when its arguments begin, so its name can be checked first (and a JSON "
        "object that only has a name is not yet a call); llama.cpp announces it at the name",
        message=_msg(),
    ),
    34: Deviation(
        "llama.cpp quirk: when the prompt opened <think> and the model writes it again, llama.cpp keeps "
        "the literal tag in reasoning; we treat the repeated tag as markup",
        message=_msg("Hello, world!\nWhat's up?", "I'm\nthinking"),
    ),
    46: Deviation(PARTIAL_ARGS, "args_prefix"),
    56: Deviation(PARTIAL_ARGS, "args_prefix"),
    65: Deviation(
        "llama.cpp demotes unclosed reasoning to content and runs the calls in it only in its final "
        "parse; while streaming (vector 66) the same text is all reasoning. Streamed reasoning cannot be "
        "taken back, so decode() gives what streaming gives: vector 66's answer",
        message=VECTORS[66]["expected"] if VECTORS else {},
    ),
    76: Deviation(WS, "whitespace"),
    77: Deviation(WS, "whitespace"),
    78: Deviation(WS, "whitespace"),
    83: Deviation(WS, "whitespace"),
    84: Deviation(WS, "whitespace"),
    99: Deviation(
        "integers stay exact: Python's JSON keeps the 60-digit integer; llama.cpp turns it into 1e+60",
        message=_msg(calls=[{"name": "number_function", "arguments": {"big_int": int("9" * 60)}}]),
    ),
    104: Deviation(WS, "whitespace"),
    112: Deviation(
        "the arguments object is complete and valid; only the call object's closing brace is missing at "
        "the end of the text, so the call is accepted (like vector 111, a missing </tool_call>)",
        message=_msg(calls=[{"name": "final_answer", "arguments": {"trigger": True}}]),
    ),
    117: Deviation(
        "text after [TOOL_CALLS] that is neither a JSON list nor a tool name is not guessed at: the whole "
        "text stays content (vLLM's regex fallback finds the list further on and drops the junk)",
        message=_msg('[TOOL_CALLS]  junk [{"name": "add", "arguments":{"a": 1, "b": 2}}] trail'),
    ),
    122: Deviation(
        "a tool name with no arguments at the end of the text is not a call; lossless policy keeps the "
        "text as content (vLLM returns nothing at all)",
        message=_msg("[TOOL_CALLS]toolname_no_args"),
    ),
    130: Deviation(INVALID, "invalid_call"),
    131: Deviation(
        LOSSLESS,
        message=_msg(
            "some prefix text some suffix text",
            calls=[{"name": "foo", "arguments": {"x": 1}}, {"name": "bar", "arguments": {"y": 2}}],
        ),
    ),
    133: Deviation(
        LOSSLESS,
        message=_msg(
            "Here is the result:  Would you like to know more?",
            calls=[{"name": "getOpenIncidentsTool", "arguments": {}}],
        ),
    ),
    135: Deviation(INVALID, "invalid_call"),
    140: Deviation(
        LOSSLESS,
        message=_msg(" I used {searchTool} for this.", calls=[{"name": "searchTool", "arguments": {"query": "test"}}]),
    ),
    141: Deviation(
        LOSSLESS,
        message=_msg(
            ' The arguments I passed were {"query": "test"}',
            calls=[{"name": "searchTool", "arguments": {"query": "test"}}],
        ),
    ),
    145: Deviation(INVALID, "invalid_call"),
    153: Deviation(
        "a call whose id/name cannot be read is kept as content up to its end marker, with what the "
        "section held before it (its opener: no call had been made yet); the other calls of the section "
        "are unaffected. vLLM drops it",
        message=_msg(
            "Help. <|tool_calls_section_begin|><|tool_call_begin|>functions.invalid.0 "
            '<|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|>',
            calls=[{"name": "valid", "arguments": {"city": "Shanghai"}, "id": "functions.valid:1"}],
        ),
    ),
    158: Deviation(
        LOSSLESS,
        message=_msg(
            "I will help you get the weather info.\n\n\n\nmeaningwhile, I will also check the weather in Shanghai.\n\n",
            calls=[
                {"name": "get_weather", "arguments": {"city": "Beijing", "date": "2025-08-01"}},
                {"name": "get_weather", "arguments": {"city": "Shanghai", "date": "2025-08-01"}},
            ],
        ),
    ),
    159: Deviation(
        "every argument is closed; only </tool_call> is missing at the end of the text (a stop token cut "
        "off), so the call is accepted, as Hermes does in vector 111. vLLM's GLM parser refuses it",
        message=_msg(calls=[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "2025-08-01"}}]),
    ),
    164: Deviation(
        "arguments are JSON in every valid call: a body that is not JSON ('foo') makes the call invalid "
        "(kept in invalid_tool_calls with its text); an empty body is a call without arguments, {}",
        message=_msg(
            reasoning=VECTORS[164]["expected"]["reasoning_content"] if VECTORS else None,
            calls=[
                {"name": "get_current_weather", "arguments": {"location": "Tokyo"}},
                {"name": "no_content_type", "arguments": {"location": "Tokyo"}},
                {"name": "empty_args", "arguments": {}},
                {"name": "no_args", "arguments": {}},
            ],
        ),
        invalid=("not_json_no_content_type",),
    ),
    175: Deviation(
        "a Python call is announced at its first keyword argument, so its name can stream; SGLang holds "
        "the whole list back",
        message=_msg("Let me check the weather: ", calls=[{"name": "get_weather", "arguments": '{"location": '}]),
    ),
    179: Deviation("SGLang strips the space before [TOOL_CALLS]; we keep content verbatim", "whitespace"),
    195: Deviation(
        "reasoning is stripped at both ends (template formatting); vLLM keeps the trailing newlines",
        "whitespace",
    ),
    228: Deviation(
        "lossless policy: markers the model echoes inside content stay in it (Ollama strips them)",
        message=_msg(
            "Here's the weather: <｜tool▁output▁begin｜>Temperature: 22°C, Sunny<｜tool▁output▁end｜> Hope that helps!"
        ),
    ),
}


def run_vector(v: dict[str, Any]) -> AssistantMessage:
    stream = decoder(v["format"], **vector_options(v)).stream()
    stream.feed(v["output"])
    if not v.get("partial"):
        stream.finish()
    return stream.message


def as_expected(message: AssistantMessage, expected: dict[str, Any]) -> dict[str, Any]:
    """Our message in the vectors' shape; ids only where the vector states one (see below)."""
    calls = []
    padded = [*expected["tool_calls"], *[{}] * len(message.tool_calls)]
    for ours, theirs in zip(message.tool_calls, padded, strict=False):
        call = {"name": ours.name, "arguments": ours.arguments}
        # Vectors carry an id only where the source asserted it; llama.cpp's Kimi cases do not,
        # although the output has one (and we keep it).
        if "id" in theirs:
            call["id"] = ours.id
        calls.append(call)
    return {"content": message.content, "reasoning_content": message.reasoning_content, "tool_calls": calls}


def _strip(value: str | None) -> str | None:
    return (value or "").strip() or None


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize(("index", "vector"), vector_params())
def test_vector(index: int | None, vector: dict[str, Any] | None) -> None:
    need_vectors()
    assert index is not None and vector is not None
    message = run_vector(vector)
    expected = vector["expected"]
    got = as_expected(message, expected)
    deviation = DEVIATIONS.get(index)
    if deviation is None:
        assert got == expected, f"note: {vector.get('note')}"
        if not vector.get("partial"):
            assert all(c.error is None for c in message.tool_calls), [c.error for c in message.tool_calls]
        return
    assert got != expected, f"vector {index} now matches upstream: remove it from DEVIATIONS"
    if deviation.check == "whitespace":
        for key in ("content", "reasoning_content"):
            assert _strip(got[key]) == _strip(expected[key])
        assert got["tool_calls"] == expected["tool_calls"]
    elif deviation.check == "args_prefix":
        assert vector.get("partial")
        (ours,), (theirs,) = got["tool_calls"], expected["tool_calls"]
        assert ours["name"] == theirs["name"]
        assert _squash(message.tool_calls[0].arguments_json).startswith(_squash(theirs["arguments"]))
    elif deviation.check == "late_id":
        ours = [{k: v for k, v in c.items() if k != "id"} for c in got["tool_calls"]]
        assert ours == [{k: v for k, v in c.items() if k != "id"} for c in expected["tool_calls"]]
        assert (got["content"], got["reasoning_content"]) == (expected["content"], expected["reasoning_content"])
        for call, theirs in zip(message.tool_calls, expected["tool_calls"], strict=True):
            assert call.id != theirs["id"] and theirs["id"] in call.raw
    elif deviation.check == "invalid_call":
        assert expected["tool_calls"] == [] and expected["content"]
        assert not message.tool_calls
        (call,) = message.invalid_tool_calls
        assert call.error is not None
        assert call.raw and call.raw in expected["content"]
        assert message.content is None or message.content in expected["content"]
    else:
        assert got == as_expected_override(deviation.message), deviation.reason
        assert [c.name for c in message.invalid_tool_calls] == list(deviation.invalid)


def as_expected_override(message: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(message))


def test_every_deviation_is_a_vector() -> None:
    need_vectors()
    assert all(0 <= i < len(VECTORS) for i in DEVIATIONS)


def test_notes_that_mark_quirks_are_decided() -> None:
    """Every vector whose note flags an upstream quirk or a proposed policy passes or is listed."""
    need_vectors()
    flagged = re.compile(r"quirk|drops|xfail|inconsisten|better parser|lossless|MALFORMED|TRUNCATED", re.I)
    undecided = []
    for i, v in enumerate(VECTORS):
        if flagged.search(v.get("note", "")) and i not in DEVIATIONS:
            message = run_vector(v)
            if as_expected(message, v["expected"]) != v["expected"]:
                undecided.append(i)
    assert not undecided
