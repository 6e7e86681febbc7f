"""The call path is total: whatever a model writes or a tool does becomes a result, never an exception
out of call() or run() (issue 29, item 9).

Each class has more members than the review's example: calls that are not calls, nesting of several
shapes 100,000 deep in arguments and in results, schemas that cannot be applied, tools that raise what
is not an Exception, coroutine tools that block, and floats that JSON cannot hold.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import threading
import time
from typing import Any

import pytest

from chatcodec import SchemaError, Toolbox, tool_schema

DEEP = 100_000
TOO_DEEP = "Error: invalid arguments for echo: the arguments are nested too deeply to read."


def tool_call(name: Any, arguments: Any = "{}", call_id: str = "c") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def deep_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def deep_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN and the infinities, as JSON does."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def box() -> Toolbox:
    toolbox = Toolbox(timeout=5)

    @toolbox.tool
    def echo(value: Any = None) -> Any:
        """Echo.

        Args:
            value: Anything.
        """
        return value

    return toolbox


# --------------------------------------------------------------------------------------------------
# Calls that are not calls


@pytest.mark.parametrize(
    ("raw", "content"),
    [
        ("echo", 'Error: tool call 0 is a string, not a tool call object ({"name": ..., "arguments": {...}}).'),
        (42, 'Error: tool call 0 is a number, not a tool call object ({"name": ..., "arguments": {...}}).'),
        (None, 'Error: tool call 0 is null, not a tool call object ({"name": ..., "arguments": {...}}).'),
        (["echo"], 'Error: tool call 0 is an array, not a tool call object ({"name": ..., "arguments": {...}}).'),
        ({"id": "c", "function": "echo"}, "Error: tool call 0 gives its function as a string, not an object."),
        ({"id": "c", "function": {"arguments": "{}"}}, "Error: tool call 0 has no function name."),
        ({"id": "c", "function": {"name": "", "arguments": "{}"}}, "Error: tool call 0 has no function name."),
        ({"id": "c", "function": {"name": 7, "arguments": "{}"}}, "Error: tool call 0 has no function name."),
        ({"id": "c", "function": {"name": None}}, "Error: tool call 0 has no function name."),
    ],
)
def test_calls_that_cannot_be_read_are_error_results(box: Toolbox, raw: Any, content: str) -> None:
    [result] = box.call_many([raw])
    assert result.message["content"] == content
    assert result.error == content[len("Error: ") : -1]
    assert result.name == ""


# --------------------------------------------------------------------------------------------------
# Nesting


@pytest.mark.parametrize(
    "arguments",
    [
        '{"value": ' + "[" * DEEP + "]" * DEEP + "}",
        '{"value": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}",
        '{"value": ' + '[{"a": ' * (DEEP // 2) + "1" + "}]" * (DEEP // 2) + "}",
    ],
    ids=["lists", "objects", "mixed"],
)
def test_arguments_nested_100k_deep_as_text(box: Toolbox, arguments: str) -> None:
    [result] = box.call_many([tool_call("echo", arguments)])
    assert result.message["content"] == TOO_DEEP
    assert result.arguments == arguments


@pytest.mark.parametrize("value", [deep_list(DEEP), deep_dict(DEEP)], ids=["lists", "objects"])
def test_arguments_nested_100k_deep_as_objects(box: Toolbox, value: Any) -> None:
    [result] = box.call_many([tool_call("echo", {"value": value})])
    assert result.message["content"] == TOO_DEEP


@pytest.mark.parametrize(
    ("value", "kind"), [(deep_list(DEEP), "list"), (deep_dict(DEEP), "dict")], ids=["lists", "objects"]
)
def test_results_nested_100k_deep(value: Any, kind: str) -> None:
    toolbox = Toolbox()

    @toolbox.tool
    def deep() -> Any:
        """A value too deep for JSON."""
        return value

    [result] = toolbox.call_many([tool_call("deep")])
    assert result.message["content"] == f"Error: deep returned a {kind} nested too deeply to write as JSON."
    assert isinstance(result.exception, RecursionError)


# --------------------------------------------------------------------------------------------------
# Schemas that cannot be applied


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": {"x": {"$ref": "#/definitions/missing"}}},
        {"type": "object", "not": {"$ref": "#/nope"}},
        {"type": "object", "if": {"$ref": "#/$defs/absent"}, "then": {}},
        {"type": "object", "properties": {"x": {"type": "array", "items": {"$ref": "#/$defs/gone"}}}},
    ],
    ids=["property", "not", "if", "items"],
)
def test_a_schema_with_an_unresolvable_ref_is_refused_when_added(parameters: dict[str, Any]) -> None:
    """The one $ref resolver refuses a reference to nothing when the tool is added, naming where it sits, so no
    call can reach a validator that would look for it."""
    toolbox = Toolbox()
    with pytest.raises(SchemaError, match=r"points at nothing in the schema") as raised:
        toolbox.add(lambda **kwargs: "ran", name="lookup", schema={"name": "lookup", "parameters": parameters})
    assert "\n" not in str(raised.value) and "$ref" in str(raised.value)


# --------------------------------------------------------------------------------------------------
# What tools raise


def raising(exception: BaseException, *, is_async: bool) -> Toolbox:
    toolbox = Toolbox(timeout=10)
    if is_async:

        async def boom() -> str:
            """Raise."""
            await asyncio.sleep(0)
            raise exception

        toolbox.add(boom)
    else:

        def boom() -> str:
            """Raise."""
            raise exception

        toolbox.add(boom)
    return toolbox


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("exception", "content"),
    [
        (SystemExit(3), "Error: boom raised SystemExit: 3."),
        (asyncio.CancelledError("stop"), "Error: boom raised CancelledError: stop."),
        (GeneratorExit(), "Error: boom raised GeneratorExit: ."),
        (RuntimeError("plain"), "Error: boom raised RuntimeError: plain."),
    ],
    ids=["SystemExit", "CancelledError", "GeneratorExit", "Exception"],
)
def test_whatever_a_tool_raises_is_an_error_result(exception: BaseException, content: str, is_async: bool) -> None:
    toolbox = raising(exception, is_async=is_async)
    [result] = toolbox.call_many([tool_call("boom")])
    assert result.message["content"] == content
    assert result.exception is exception


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_keyboard_interrupt_from_a_tool_still_stops_the_program(is_async: bool) -> None:
    """Decided and documented: Ctrl-C must still work, so a KeyboardInterrupt is raised again."""
    toolbox = raising(KeyboardInterrupt(), is_async=is_async)
    with pytest.raises(KeyboardInterrupt):
        toolbox.call(tool_call("boom"))


def test_an_async_tool_blocking_in_time_sleep_still_times_out() -> None:
    toolbox = Toolbox(timeout=0.5)
    release = threading.Event()

    @toolbox.tool
    async def blocker() -> str:
        """Blocks its event loop."""
        time.sleep(3)
        release.set()
        return "late"

    @toolbox.tool
    async def quick() -> str:
        """Returns at once."""
        await asyncio.sleep(0)
        return "fast"

    started = time.monotonic()
    [blocked, fast] = toolbox.call_many([tool_call("blocker", call_id="b"), tool_call("quick", call_id="q")])
    assert time.monotonic() - started < 2.5  # the timeout and the grace, not the 3 s sleep
    assert blocked.message["content"] == "Error: blocker did not finish within 0.5 seconds."
    assert fast.message["content"] == "fast"  # the blocked loop is the tool's own
    assert release.wait(10)


# --------------------------------------------------------------------------------------------------
# Floats JSON cannot hold


@dataclasses.dataclass
class Reading:
    value: float
    spread: list[float]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"v": math.nan}, {"v": "NaN"}),
        ([math.inf, -math.inf, 1.5], ["Infinity", "-Infinity", 1.5]),
        ({"nested": {"deep": [{"x": math.nan}]}}, {"nested": {"deep": [{"x": "NaN"}]}}),
        ({math.inf: "key"}, {"Infinity": "key"}),
        ((math.nan, 2), ["NaN", 2]),
        (Reading(math.nan, [math.inf]), {"value": "NaN", "spread": ["Infinity"]}),
        (math.nan, "NaN"),
    ],
    ids=["dict", "list", "nested", "key", "tuple", "dataclass", "bare"],
)
def test_nan_and_infinity_are_written_as_valid_json(value: Any, expected: Any) -> None:
    toolbox = Toolbox()

    @toolbox.tool
    def measure() -> Any:
        """A measurement."""
        return value

    content = toolbox.call(tool_call("measure"))["content"]
    assert strict_json(content) == expected


# --------------------------------------------------------------------------------------------------
# The loop


class Scripted:
    """A client whose replies are given in advance."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)
        self.requests: list[dict[str, Any]] = []
        self.chat = self
        self.completions = self

    def create(self, **request: Any) -> dict[str, Any]:
        self.requests.append(request)
        return {"choices": [{"message": {"role": "assistant", **self.messages.pop(0)}}]}


def test_run_survives_every_shape_and_keeps_the_transcript_valid(box: Toolbox) -> None:
    raw_calls = [
        "echo",
        {"id": "f", "function": "echo"},
        {"id": "n", "function": {"arguments": "{}"}},
        tool_call("echo", '{"value": ' + "[" * DEEP + "]" * DEEP + "}", "deep"),
        tool_call("echo", {"value": deep_dict(DEEP)}, "deeper"),
        tool_call("echo", '{"value": 1}', "ok"),
    ]
    client = Scripted({"content": None, "tool_calls": raw_calls}, {"content": "done"})
    transcript = box.run(client, [{"role": "user", "content": "go"}], model="m", max_rounds=2)
    assistant, *results, final = transcript[1:]
    ids = [entry["id"] for entry in assistant["tool_calls"]]
    assert ids == ["call_0_0", "f", "n", "deep", "deeper", "ok"]
    assert [result["tool_call_id"] for result in results] == ids  # every entry answered under its id
    assert all(isinstance(entry["function"]["arguments"], str) for entry in assistant["tool_calls"])
    assert [result["content"].startswith("Error: ") for result in results] == [True] * 5 + [False]
    assert results[-1]["content"] == "1"
    assert final == {"role": "assistant", "content": "done"}
    json.dumps(client.requests[1]["messages"])  # the next request is plain JSON


def test_a_reply_whose_tool_calls_is_not_a_list(box: Toolbox) -> None:
    client = Scripted({"content": None, "tool_calls": tool_call("echo", '{"value": 2}', "one")}, {"content": "ok"})
    transcript = box.run(client, [{"role": "user", "content": "go"}], model="m")
    assert transcript[2] == {"role": "tool", "tool_call_id": "one", "content": "2"}


def test_tool_schema_still_describes_the_functions() -> None:
    def measure(unit: str) -> float:
        """A measurement.

        Args:
            unit: The unit.
        """
        return math.nan

    assert Toolbox([measure]).tools == [tool_schema(measure)]
    assert Toolbox([measure]).call(tool_call("measure", {"unit": "K"}))["content"] == '"NaN"'
