"""Toolbox: schemas, validated calls, error results for the model, concurrency, async, timeouts, result styles."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import json
import threading
from types import ModuleType
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageToolCall
from pydantic import BaseModel

from chatcodec import InputError, SchemaError, Toolbox, decoder, tool_schema
from chatcodec.tools import ToolResult


def tool_call(name: str, arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture
def toolbox(temperature: ModuleType) -> Toolbox:
    return Toolbox(temperature.TOOLS)


# --------------------------------------------------------------------------------------------------
# Schemas


def test_tools_are_the_seed_schemas(toolbox: Toolbox, roundtrip: dict[str, Any]) -> None:
    """The example's functions give exactly the tools of the seed conversation, in both list forms."""
    assert json.dumps(toolbox.tools) == json.dumps(roundtrip["tools"])
    assert toolbox.functions == [tool["function"] for tool in roundtrip["tools"]]
    assert list(toolbox.tools[0]["function"]) == ["name", "description", "parameters"]


def test_tools_lists_are_copies(toolbox: Toolbox) -> None:
    toolbox.tools[0]["function"]["name"] = "changed"
    toolbox.functions[0]["parameters"]["properties"].clear()
    assert toolbox.tools[0]["function"]["name"] == "get_current_temperature"
    assert toolbox.functions[0]["parameters"]["properties"]


def test_decorator_forms_and_names() -> None:
    box = Toolbox()

    @box.tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    @box.tool(name="lookup-v2")
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return key.upper()

    assert ping() == "pong" and lookup("a") == "A"  # the decorator returns the function itself
    assert [tool["function"]["name"] for tool in box.tools] == ["ping", "lookup-v2"]
    assert "lookup-v2" in box and len(box) == 2
    assert box.call(tool_call("lookup-v2", {"key": "x"}))["content"] == "X"
    assert repr(box) == "Toolbox([ping, lookup-v2])"

    with pytest.raises(SchemaError, match="already has a tool named 'ping'"):
        box.add(ping)
    with pytest.raises(SchemaError, match="not one the OpenAI API accepts"):
        box.add(lookup, name="look up")
    with pytest.raises(SchemaError, match="Cannot make a tool schema for undocumented: it has no docstring"):
        box.add(undocumented)


def undocumented(x: int) -> int:
    return x


class Point:
    def __init__(self, x: float, y: float) -> None:
        self.x, self.y = x, y


def test_a_schema_by_hand_for_what_tool_schema_cannot_describe() -> None:
    def distance(a: Point, b: Point) -> float:
        return float(((a.x - b.x) ** 2 + (a.y - b.y) ** 2) ** 0.5)

    point = {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]}
    schema = {
        "name": "distance",
        "description": "Distance between two points.",
        "parameters": {"type": "object", "properties": {"a": point, "b": point}, "required": ["a", "b"]},
    }
    box = Toolbox()
    box.add(lambda a, b: distance(Point(*a), Point(*b)), name="distance", schema=schema)
    assert box.tools == [{"type": "function", "function": schema}]
    assert box.call(tool_call("distance", {"a": [0, 0], "b": [3, 4]}))["content"] == "5.0"
    assert box.call(tool_call("distance", {"a": [0, 0]}))["content"] == (
        "Error: invalid arguments for distance: 'b' is a required property."
    )
    with pytest.raises(SchemaError, match="The parameters schema of broken is not a valid JSON schema"):
        box.add(distance, name="broken", schema={"parameters": {"type": "object", "properties": {"a": {"type": 3}}}})


def test_timeout_must_be_positive() -> None:
    with pytest.raises(InputError, match="timeout must be a positive number"):
        Toolbox(timeout=0)


# --------------------------------------------------------------------------------------------------
# Calls and both result styles


def test_the_seed_calls_give_the_seed_results(toolbox: Toolbox, roundtrip: dict[str, Any]) -> None:
    """The two calls of tools_roundtrip (dict arguments) give its two tool messages, byte for byte."""
    calls = roundtrip["messages"][1]["tool_calls"]
    results = toolbox.call_many(calls)
    assert [result.message for result in results] == roundtrip["messages"][2:4]
    assert all(result.error is None for result in results)
    assert [result.name for result in results] == ["get_current_temperature", "get_temperature_date"]


def test_arguments_as_json_text(toolbox: Toolbox) -> None:
    message = toolbox.call(tool_call("get_current_temperature", '{"location": "Seoul", "unit": "fahrenheit"}', "c9"))
    assert message == {
        "role": "tool",
        "tool_call_id": "c9",
        "content": '{"temperature": 26.1, "location": "Seoul", "unit": "fahrenheit"}',
    }


def test_legacy_function_call_gives_a_function_result(toolbox: Toolbox) -> None:
    """Qwen-Agent's form: a function_call without an id is answered as role "function" with the name."""
    function_call = {"name": "get_temperature_date", "arguments": '{"location": "Paris", "date": "2024-10-01"}'}
    assert toolbox.call(function_call) == {
        "role": "function",
        "name": "get_temperature_date",
        "content": '{"temperature": 25.9, "location": "Paris", "date": "2024-10-01", "unit": "celsius"}',
    }
    # either style can be asked for explicitly, whatever the call's shape
    assert toolbox.call(function_call, style="tools") == {
        "role": "tool",
        "content": '{"temperature": 25.9, "location": "Paris", "date": "2024-10-01", "unit": "celsius"}',
    }
    assert toolbox.call(tool_call("get_current_temperature", {"location": "Paris"}), style="functions") == {
        "role": "function",
        "name": "get_current_temperature",
        "content": '{"temperature": 26.1, "location": "Paris", "unit": "celsius"}',
    }


def test_sdk_objects_and_decoded_calls(toolbox: Toolbox) -> None:
    sdk_call = ChatCompletionMessageToolCall.model_validate(
        tool_call("get_current_temperature", '{"location": "Oslo"}', "call_sdk")
    )
    assert toolbox.call(sdk_call)["tool_call_id"] == "call_sdk"
    assert json.loads(toolbox.call(sdk_call)["content"])["location"] == "Oslo"

    text = '<tool_call>{"name": "get_current_temperature", "arguments": {"location": "Lima"}}</tool_call>'
    decoded = decoder("hermes").decode(text).tool_calls[0]
    assert toolbox.call(decoded) == {
        "role": "tool",
        "tool_call_id": decoded.id,
        "content": '{"temperature": 26.1, "location": "Lima", "unit": "celsius"}',
    }
    # a call the decoder saw cut off is not run
    message = decoder("hermes").decode('<tool_call>{"name": "get_current_temperature", "arguments": {"loc')
    [cut] = message.invalid_tool_calls
    assert toolbox.call(cut)["content"] == (
        "Error: invalid arguments for get_current_temperature: the call was malformed (the arguments were cut off)."
    )


def test_results_that_are_not_strings_are_json() -> None:
    class Reading(BaseModel):
        value: float
        unit: str

    @dataclasses.dataclass
    class Pair:
        left: int
        right: int

    class Sky(enum.Enum):
        CLEAR = "clear"

    values: dict[str, Any] = {
        "text": "plain text, unquoted",
        "none": None,
        "number": 3.5,
        "listing": [1, "ü", True],
        "model": Reading(value=1.5, unit="C"),
        "dataclass": Pair(1, 2),
        "enum": Sky.CLEAR,
    }
    box = Toolbox()
    for key, value in values.items():
        box.add(lambda value=value: value, name=key, schema={"description": key, "parameters": {"type": "object"}})
    contents = {key: box.call(tool_call(key, "{}"))["content"] for key in values}
    assert contents == {
        "text": "plain text, unquoted",
        "none": "null",
        "number": "3.5",
        "listing": '[1, "ü", true]',
        "model": '{"value": 1.5, "unit": "C"}',
        "dataclass": '{"left": 1, "right": 2}',
        "enum": '"clear"',
    }

    box.add(lambda: object(), name="opaque", schema={"parameters": {"type": "object"}})
    [result] = box.call_many([tool_call("opaque", "{}")])
    assert result.message["content"] == (
        "Error: opaque returned a object, which cannot be written as JSON"
        " (Object of type object is not JSON serializable)."
    )
    assert isinstance(result.exception, TypeError)


# --------------------------------------------------------------------------------------------------
# Errors go back to the model


@pytest.mark.parametrize(
    ("name", "arguments", "content"),
    [
        (
            "get_weather",
            "{}",
            "Error: unknown function 'get_weather'; the functions are: get_current_temperature, get_temperature_date.",
        ),
        (
            "get_temperature_date",
            {"location": "Paris"},
            "Error: invalid arguments for get_temperature_date: 'date' is a required property.",
        ),
        (
            "get_current_temperature",
            {"location": "Paris", "unit": "kelvin"},
            "Error: invalid arguments for get_current_temperature: at ['unit']: 'kelvin' is not one of"
            " ['celsius', 'fahrenheit'].",
        ),
        (
            "get_current_temperature",
            {"location": 7},
            "Error: invalid arguments for get_current_temperature: at ['location']: 7 is not of type 'string'.",
        ),
        (
            "get_current_temperature",
            '{"location": "Paris"',
            "Error: invalid arguments for get_current_temperature: the arguments are not valid JSON"
            " (Expecting ',' delimiter: line 1 column 21 (char 20)).",
        ),
        (
            "get_current_temperature",
            '["Paris"]',
            "Error: invalid arguments for get_current_temperature: the arguments must be a JSON object, not an array.",
        ),
        (
            "get_current_temperature",
            {"location": "Paris", "country": "FR"},
            "Error: invalid arguments for get_current_temperature: got an unexpected keyword argument 'country'.",
        ),
    ],
    ids=["unknown", "missing", "enum", "type", "json", "not-object", "unexpected"],
)
def test_bad_calls_become_error_results(toolbox: Toolbox, name: str, arguments: Any, content: str) -> None:
    [result] = toolbox.call_many([tool_call(name, arguments, "call_x")])
    assert result.message == {"role": "tool", "tool_call_id": "call_x", "content": content}
    assert result.error == content.removeprefix("Error: ").removesuffix(".")
    assert result.exception is None


def test_an_exception_in_the_function_is_reported() -> None:
    box = Toolbox()

    @box.tool
    def divide(a: int, b: int) -> float:
        """Divide.

        Args:
            a: Numerator.
            b: Denominator.
        """
        return a / b

    [ok, failed] = box.call_many(
        [tool_call("divide", {"a": 1, "b": 4}, "a"), tool_call("divide", {"a": 1, "b": 0}, "b")]
    )
    assert ok.message["content"] == "0.25"
    assert failed.message == {
        "role": "tool",
        "tool_call_id": "b",
        "content": "Error: divide raised ZeroDivisionError: division by zero.",
    }
    assert isinstance(failed.exception, ZeroDivisionError)


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str = "FR"


def test_optional_arguments_accept_null_and_convert_types() -> None:
    seen: list[Any] = []
    box = Toolbox()

    @box.tool
    def record(place: Place, unit: Unit, when: tuple[int, int] | None = None, tags: list[Unit] | None = None) -> str:
        """Record.

        Args:
            place: Where.
            unit: Which unit.
            when: Hour and minute.
            tags: More units.
        """
        seen.append((place, unit, when, tags))
        return "ok"

    message = box.call(
        tool_call("record", {"place": {"city": "Nice"}, "unit": "celsius", "when": [9, 30], "tags": ["fahrenheit"]})
    )
    assert message["content"] == "ok"
    assert seen[-1] == (Place(city="Nice"), Unit.C, (9, 30), [Unit.F])
    assert (
        box.call(tool_call("record", {"place": {"city": "Nice"}, "unit": "fahrenheit", "when": None}))["content"]
        == "ok"
    )
    assert seen[-1] == (Place(city="Nice"), Unit.F, None, None)
    bad = box.call(tool_call("record", {"place": {"town": "Nice"}, "unit": "celsius"}))["content"]
    assert bad == "Error: invalid arguments for record: at ['place']: 'city' is a required property."


def test_bad_tool_call_shapes_are_error_results(toolbox: Toolbox) -> None:
    """What the model writes is a result (more shapes in test_total.py); the list itself is the caller's."""
    assert toolbox.call("get_current_temperature")["content"] == (
        'Error: tool call 0 is a string, not a tool call object ({"name": ..., "arguments": {...}}).'
    )
    assert toolbox.call({"id": "x", "function": {"arguments": "{}"}}) == {
        "role": "tool",
        "tool_call_id": "x",
        "content": "Error: tool call 0 has no function name.",
    }
    with pytest.raises(InputError, match="tool_calls must be a list"):
        toolbox.call_many(tool_call("get_current_temperature", "{}"))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Concurrency, async and timeouts


def test_sync_calls_of_one_batch_run_concurrently() -> None:
    """Each call waits at a barrier for the others: they can only pass if they run at the same time."""
    barrier = threading.Barrier(3, timeout=10)
    box = Toolbox()

    @box.tool
    def meet(who: str) -> str:
        """Meet.

        Args:
            who: Name.
        """
        barrier.wait()
        return who

    results = box.call_many([tool_call("meet", {"who": w}, w) for w in "abc"])
    assert [r.message["content"] for r in results] == ["a", "b", "c"]
    assert all(r.error is None for r in results)


def test_async_functions_run_concurrently_with_sync_ones() -> None:
    box = Toolbox()
    started = threading.Event()
    finished: list[str] = []

    @box.tool
    async def waiter(n: int) -> int:
        """Wait for the sync call to start.

        Args:
            n: A number.
        """
        while not started.is_set():
            await asyncio.sleep(0.005)
        finished.append("async")
        return n * 2

    @box.tool
    def starter(n: int) -> int:
        """Start.

        Args:
            n: A number.
        """
        started.set()
        finished.append("sync")
        return n + 1

    results = box.call_many([tool_call("waiter", {"n": 5}, "w"), tool_call("starter", {"n": 5}, "s")])
    assert [r.message["content"] for r in results] == ["10", "6"]  # in the order of the calls
    assert finished == ["sync", "async"]


def test_async_api_inside_a_running_loop() -> None:
    box = Toolbox()

    @box.tool
    async def echo(text: str) -> str:
        """Echo.

        Args:
            text: The text.
        """
        await asyncio.sleep(0)
        return text

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        awaited = await box.acall(tool_call("echo", {"text": "hi"}))
        blocking = box.call(tool_call("echo", {"text": "there"}))  # the sync API also works inside a loop
        return awaited, blocking

    awaited, blocking = asyncio.run(main())
    assert awaited["content"] == "hi" and blocking["content"] == "there"


def test_a_sync_call_that_overruns_is_reported_as_timed_out() -> None:
    release = threading.Event()
    box = Toolbox(timeout=0.2)

    @box.tool
    def stuck() -> str:
        """Never returns until released."""
        release.wait(30)
        return "late"

    @box.tool
    def quick() -> str:
        """Returns at once."""
        return "fast"

    try:
        [slow, fast] = box.call_many([tool_call("stuck", "{}", "s"), tool_call("quick", "{}", "q")])
    finally:
        release.set()
    assert slow.message == {
        "role": "tool",
        "tool_call_id": "s",
        "content": "Error: stuck did not finish within 0.2 seconds.",
    }
    assert fast.message["content"] == "fast"


def test_an_async_call_that_overruns_is_cancelled() -> None:
    cancelled = threading.Event()
    box = Toolbox(timeout=0.2)

    @box.tool
    async def sleepy() -> str:
        """Sleeps too long."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    assert box.call(tool_call("sleepy", "{}"))["content"] == "Error: sleepy did not finish within 0.2 seconds."
    assert cancelled.is_set()


def test_context_variables_reach_sync_tools() -> None:
    user: contextvars.ContextVar[str] = contextvars.ContextVar("user", default="nobody")
    box = Toolbox()

    @box.tool
    def whoami() -> str:
        """The current user."""
        return user.get()

    user.set("ada")
    assert box.call(tool_call("whoami", "{}"))["content"] == "ada"


def test_results_are_tool_results(toolbox: Toolbox) -> None:
    [result] = toolbox.call_many([tool_call("get_current_temperature", {"location": "Rome"})])
    assert isinstance(result, ToolResult)
    assert result.arguments == {"location": "Rome"}
    assert result.seconds >= 0


def test_tool_schema_matches_toolbox(temperature: ModuleType, toolbox: Toolbox) -> None:
    assert toolbox.tools == [tool_schema(f) for f in temperature.TOOLS]


def test_decorated_coroutine_functions_are_awaited() -> None:
    """A sync-looking wrapper (functools.wraps, or none at all) that returns a coroutine still gives its value."""
    import functools

    def logged(function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

        return wrapper

    async def double(n: int) -> int:
        """Double.

        Args:
            n: A number.
        """
        await asyncio.sleep(0)
        return 2 * n

    box = Toolbox()
    box.add(logged(double), name="wrapped")
    box.add(lambda n: double(n), name="bare", schema=tool_schema(double))
    results = box.call_many([tool_call("wrapped", {"n": 2}), tool_call("bare", {"n": 5})])
    assert [r.message["content"] for r in results] == ["4", "10"]
