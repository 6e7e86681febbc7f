"""chatcodec.schema.function_schema against transformers' get_json_schema (spec §4, §6.1 S1-S28, D24, D38).

Every case checks two things:

* the expected value written out by hand from the spec, compared as a JSON string so key order counts
  (these stand without transformers);
* the differential: ``json.dumps`` of our schema equals ``json.dumps`` of transformers' for the same
  function, and errors carry transformers' message. Skipped when transformers is not installed.
"""

import enum
import functools
import json
import keyword
import subprocess
import sys
import textwrap
import typing
from collections.abc import Callable
from typing import Any, Literal, NewType, Optional, Union

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatcodec.exceptions import SchemaError
from chatcodec.schema import function_schema, parse_google_docstring, type_hint_schema

try:
    from transformers.utils import (
        DocstringParsingException,
        TypeHintParsingException,
        get_json_schema,
    )
except ImportError:  # pragma: no cover - the reference is a dev dependency
    get_json_schema = None
    HF_ERRORS: tuple[type[Exception], ...] = ()
else:
    HF_ERRORS = (DocstringParsingException, TypeHintParsingException)

HAVE_HF = get_json_schema is not None
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="transformers (the reference) is not installed")

Func = Callable[..., Any]


def dumps(value: Any) -> str:
    return json.dumps(value)


def reference(fn: Func) -> dict[str, Any]:
    assert get_json_schema is not None
    result: dict[str, Any] = get_json_schema(fn)
    return result


def check(fn: Func, expected_function: dict[str, Any] | None = None) -> dict[str, Any]:
    """Our schema equals transformers' byte for byte, and (if given) the hand-written expectation."""
    ours = function_schema(fn)
    assert list(ours) == ["type", "function"]
    assert ours["type"] == "function"
    if expected_function is not None:
        assert dumps(ours["function"]) == dumps(expected_function)
    if HAVE_HF:
        assert dumps(ours) == dumps(reference(fn))
    return ours


def check_properties(fn: Func, properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """Like :func:`check`, with the hand-written expectation given as properties and required."""
    ours = check(fn)
    parameters = ours["function"]["parameters"]
    assert dumps(parameters["properties"]) == dumps(properties)
    assert parameters.get("required") == required
    return ours


def check_error(fn: Func, message: str | None = None) -> SchemaError:
    """We raise SchemaError; transformers raises its own exception with the very same message."""
    with pytest.raises(SchemaError) as ours:
        function_schema(fn)
    if message is not None:
        assert str(ours.value) == message
    if HAVE_HF:
        with pytest.raises(HF_ERRORS) as theirs:
            reference(fn)
        assert str(ours.value) == str(theirs.value)
    return ours.value


# --------------------------------------------------------------------------------------------------
# S1-S28: transformers' JsonSchemaGeneratorTest


def test_s01_simple_function() -> None:
    def fn(x: int):
        """
        Test function

        Args:
             x: The input
        """
        return x

    check(
        fn,
        {
            "name": "fn",
            "description": "Test function",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer", "description": "The input"}},
                "required": ["x"],
            },
        },
    )


def test_s02_no_arguments() -> None:
    def fn():
        """
        Test function
        """
        return True

    check(fn, {"name": "fn", "description": "Test function", "parameters": {"type": "object", "properties": {}}})


def test_s03_bare_container_types() -> None:
    def fn(x: list, y: tuple, z: dict):
        """
        Test function

        Args:
            x: The first input
            y: The second input
            z: The third input
        """
        return x

    check_properties(
        fn,
        {
            "x": {"type": "array", "description": "The first input"},
            "y": {"type": "array", "description": "The second input"},
            "z": {"type": "object", "description": "The third input"},
        },
        ["x", "y", "z"],
    )


def test_s04_union() -> None:
    def fn(x: int | float):
        """
        Test function

        Args:
            x: The input
        """
        return x

    def fn_typing(x: Union[int, float]):  # noqa: UP007 - the typing spelling is what is tested
        """
        Test function

        Args:
            x: The input
        """
        return x

    expected = {"x": {"type": ["integer", "number"], "description": "The input"}}
    check_properties(fn, expected, ["x"])
    check_properties(fn_typing, expected, ["x"])


def test_s05_union_with_duplicate_types() -> None:
    def fn(x: list | tuple, y: list | tuple | dict | None = None):
        """
        Test function

        Args:
            x: The first input
            y: The second input
        """
        return x

    check_properties(
        fn,
        {
            "x": {"type": "array", "description": "The first input"},
            "y": {"type": ["array", "object"], "nullable": True, "description": "The second input"},
        },
        ["x"],
    )


def test_s06_optional() -> None:
    def fn(x: int | None):
        """
        Test function

        Args:
            x: The input
        """
        return x

    check_properties(fn, {"x": {"type": "integer", "nullable": True, "description": "The input"}}, ["x"])


def test_s07_default_arg() -> None:
    def fn(x: int = 42):
        """
        Test function

        Args:
            x: The input
        """
        return x

    check(
        fn,
        {
            "name": "fn",
            "description": "Test function",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer", "description": "The input"}},
            },
        },
    )


def test_s08_nested_list() -> None:
    def fn(x: list[list[str | int]]):
        """
        Test function

        Args:
            x: The input
        """
        return x

    check_properties(
        fn,
        {
            "x": {
                "type": "array",
                "items": {"type": "array", "items": {"type": ["integer", "string"]}},
                "description": "The input",
            }
        },
        ["x"],
    )


def test_s09_multiple_arguments() -> None:
    def fn(x: int, y: str):
        """
        Test function

        Args:
            x: The input
            y: Also the input
        """
        return x

    check_properties(
        fn,
        {
            "x": {"type": "integer", "description": "The input"},
            "y": {"type": "string", "description": "Also the input"},
        },
        ["x", "y"],
    )


def test_s10_multiple_complex_arguments() -> None:
    def fn(x: list[int | float], y: int | str | None = None):
        """
        Test function

        Args:
            x: The input
            y: Also the input
        """
        return x

    check_properties(
        fn,
        {
            "x": {"type": "array", "items": {"type": ["integer", "number"]}, "description": "The input"},
            "y": {"type": ["integer", "string"], "nullable": True, "description": "Also the input"},
        },
        ["x"],
    )


def test_s11_union_of_complex_types() -> None:
    def fn(x: str | list[str], y: Literal["a", "b"] | int | None = None):
        """
        Test function

        Args:
            x: The input
            y: Also the input
        """
        return x

    check_properties(
        fn,
        {
            "x": {
                "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                "description": "The input",
            },
            "y": {
                "anyOf": [{"type": "string", "enum": ["a", "b"]}, {"type": "integer"}],
                "nullable": True,
                "description": "Also the input",
            },
        },
        ["x"],
    )


def test_s12_missing_docstring() -> None:
    def fn(x: int):
        return x

    check_error(fn, "Cannot generate JSON schema for fn because it has no docstring!")


def test_s13_missing_param_docstring() -> None:
    def fn(x: int):
        """
        Test function
        """
        return x

    check_error(fn, "Cannot generate JSON schema for fn because the docstring has no description for the argument 'x'")


def test_s14_missing_type_hint() -> None:
    def fn(x):
        """
        Test function

        Args:
            x: The input
        """
        return x

    check_error(fn, "Argument x is missing a type hint in function fn")


def test_s15_return_value() -> None:
    def fn(x: int) -> int:
        """
        Test function

        Args:
            x: The input
        """
        return x

    check(
        fn,
        {
            "name": "fn",
            "description": "Test function",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer", "description": "The input"}},
                "required": ["x"],
            },
            "return": {"type": "integer"},
        },
    )


def test_s16_return_value_docstring() -> None:
    def fn(x: int) -> int:
        """
        Test function

        Args:
            x: The input


        Returns:
            The output
        """
        return x

    ours = check(fn)
    assert dumps(ours["function"]["return"]) == dumps({"type": "integer", "description": "The output"})


def test_s17_tuple() -> None:
    def fn(x: tuple[int, str]):
        """
        Test function

        Args:
            x: The input
        """
        return x

    check_properties(
        fn,
        {
            "x": {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "description": "The input",
            }
        },
        ["x"],
    )


SINGLE_TUPLE_MESSAGE = (
    "The type hint {} is a Tuple with a single element, which we do not automatically convert to JSON schema "
    "as it is rarely necessary. If this input can contain more than one element, we recommend using a list[] "
    "type instead, or if it really is a single element, remove the tuple[] wrapper and just pass the element "
    "directly."
)
ELLIPSIS_MESSAGE = (
    "Conversion of '...' is not supported in Tuple type hints. Use list[] types for variable-length inputs instead."
)


def test_s18_single_element_tuple_fails() -> None:
    def fn(x: tuple[int]):
        """
        Test function

        Args:
            x: The input
        """
        return x

    def fn_typing(x: typing.Tuple[int]):  # noqa: UP006 - the typing spelling changes the message
        """
        Test function

        Args:
            x: The input
        """
        return x

    check_error(fn, SINGLE_TUPLE_MESSAGE.format("tuple[int]"))
    check_error(fn_typing, SINGLE_TUPLE_MESSAGE.format("Tuple[int]"))


def test_s19_ellipsis_type_fails() -> None:
    def fn(x: tuple[int, ...]):
        """
        Test function

        Args:
            x: The input
        """
        return x

    check_error(fn, ELLIPSIS_MESSAGE)


def test_s20_enum_extraction() -> None:
    def fn(temperature_format: str):
        """
        Test function

        Args:
            temperature_format: The temperature format to use (Choices: ["celsius", "fahrenheit"])

        Returns:
            The temperature
        """
        return -40.0

    ours = check_properties(
        fn,
        {
            "temperature_format": {
                "type": "string",
                "enum": ["celsius", "fahrenheit"],
                "description": "The temperature format to use",
            }
        },
        ["temperature_format"],
    )
    assert "return" not in ours["function"]


def test_s21_enum_extraction_non_string_choices() -> None:
    def fn(rating: int, enabled: bool):
        """
        Test function

        Args:
            rating: The rating to give (choices: [1, 2, 3])
            enabled: Whether it is enabled (choices: [true, false])
        """
        return rating

    check_properties(
        fn,
        {
            "rating": {"type": "integer", "enum": [1, 2, 3], "description": "The rating to give"},
            "enabled": {"type": "boolean", "enum": [True, False], "description": "Whether it is enabled"},
        },
        ["rating", "enabled"],
    )


def test_s22_literal() -> None:
    def fn(
        temperature_format: Literal["celsius", "fahrenheit"],
        booleanish: Literal[True, False, 0, 1, "y", "n"] = False,
    ):
        """
        Test function

        Args:
            temperature_format: The temperature format to use
            booleanish: A value that can be regarded as boolean
        """
        return temperature_format

    check_properties(
        fn,
        {
            "temperature_format": {
                "type": "string",
                "enum": ["celsius", "fahrenheit"],
                "description": "The temperature format to use",
            },
            "booleanish": {
                "type": ["boolean", "integer", "string"],
                "enum": [True, False, 0, 1, "y", "n"],
                "description": "A value that can be regarded as boolean",
            },
        },
        ["temperature_format"],
    )


def test_s23_multiline_docstring_with_types() -> None:
    def fn(x: int, y: int):
        """
        Test function

        Args:
            x: The first input

            y: The second input. This is a longer description
               that spans multiple lines with indentation and stuff.

        Returns:
            God knows what
        """
        return x

    check_properties(
        fn,
        {
            "x": {"type": "integer", "description": "The first input"},
            "y": {
                "type": "integer",
                "description": "The second input. This is a longer description that spans multiple lines "
                "with indentation and stuff.",
            },
        },
        ["x", "y"],
    )


def test_s24_return_none() -> None:
    def fn(x: int) -> None:
        """
        Test function

        Args:
            x: The first input
        """
        return None

    ours = check(fn)
    assert dumps(ours["function"]["return"]) == dumps({"type": "null"})


S1_FUNCTION = {
    "name": "fn",
    "description": "Test function",
    "parameters": {
        "type": "object",
        "properties": {"x": {"type": "integer", "description": "The input"}},
        "required": ["x"],
    },
}


def test_s25_instance_method() -> None:
    class Tool:
        def fn(self, x: int):
            """
            Test function

            Args:
                x: The input
            """
            return x

    check(Tool.fn, S1_FUNCTION)
    check(Tool().fn, S1_FUNCTION)


def test_s26_static_method() -> None:
    class Tool:
        @staticmethod
        def fn(x: int):
            """
            Test function

            Args:
                x: The input
            """
            return x

    check(Tool.fn, S1_FUNCTION)
    check(Tool().fn, S1_FUNCTION)


def test_s27_class_method() -> None:
    class Tool:
        @classmethod
        def fn(cls, x: int):
            """
            Test function

            Args:
                x: The input
            """
            return x

    check(Tool.fn, S1_FUNCTION)
    check(Tool().fn, S1_FUNCTION)


def test_s28_everything_all_at_once() -> None:
    def fn(x: str, y: list[str | int] | None, z: tuple[str | int, str] = (42, "hello")) -> tuple[int, str]:
        """
        Test function with multiple args, and docstring args that we have to strip out.

        Args:
            x: The first input. It's got a big multiline
               description and also contains
               (choices: ["a", "b", "c"])

            y: The second input. It's a big list with a single-line description.

            z: The third input. It's some kind of tuple with a default arg.

        Returns:
            The output. The return description is also a big multiline
            description that spans multiple lines.
        """
        return 1, "a"

    expected = (
        '{"name": "fn", "description": "Test function with multiple args, and docstring args that we '
        'have to strip out.", "parameters": {"type": "object", "properties": {"x": {"type": "string", '
        '"enum": ["a", "b", "c"], "description": "The first input. It\'s got a big multiline description '
        'and also contains"}, "y": {"type": "array", "items": {"type": ["integer", "string"]}, '
        '"nullable": true, "description": "The second input. It\'s a big list with a single-line '
        'description."}, "z": {"type": "array", "prefixItems": [{"type": ["integer", "string"]}, '
        '{"type": "string"}], "description": "The third input. It\'s some kind of tuple with a default '
        'arg."}}, "required": ["x", "y"]}, "return": {"type": "array", "prefixItems": [{"type": '
        '"integer"}, {"type": "string"}], "description": "The output. The return description is also a '
        'big multiline\\n    description that spans multiple lines."}}'
    )
    assert dumps(check(fn)["function"]) == expected


# --------------------------------------------------------------------------------------------------
# D24: a callable tool, as the template sees it through tojson


def test_d24_callable_tool_json() -> None:
    def get_weather(location: str, unit: str = "celsius"):
        """Get the weather.

        Args:
            location: The city
            unit: The unit (choices: ["celsius", "fahrenheit"])
        """
        return location

    tools = [function_schema(get_weather), {"type": "function", "function": {"name": "x"}}]
    assert dumps(tools) == (
        '[{"type": "function", "function": {"name": "get_weather", "description": "Get the weather.", '
        '"parameters": {"type": "object", "properties": {"location": {"type": "string", "description": '
        '"The city"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": '
        '"The unit"}}, "required": ["location"]}}}, {"type": "function", "function": {"name": "x"}}]'
    )
    check(get_weather)


# --------------------------------------------------------------------------------------------------
# D38: get_json_schema extras


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class MixedEnum(enum.Enum):
    ONE = 1
    B = "b"


class EmptyEnum(enum.Enum):
    pass


class TupleEnum(enum.Enum):
    A = (1, 2)


class Custom:
    pass


def one_arg(hint: object, desc: str = "The input", returns: object = None, name: str = "fn") -> Func:
    """A function ``name(x: hint)`` (and ``-> returns`` if given) with a one-argument docstring."""

    def fn(x):
        return x

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Test function\n\nArgs:\n    x: {desc}\n"
    fn.__annotations__ = {"x": hint} if returns is None else {"x": hint, "return": returns}
    return fn


def x_schema(fn: Func) -> dict[str, Any]:
    schema: dict[str, Any] = check(fn)["function"]["parameters"]["properties"]["x"]
    return schema


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (Color, {"type": "string", "enum": ["red", "green"]}),
        (MixedEnum, {"type": ["integer", "string"], "enum": [1, "b"]}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (Any, {}),
        (list[Color], {"type": "array", "items": {"type": "string", "enum": ["red", "green"]}}),
        (
            float | list[int] | None,
            {
                "anyOf": [{"type": "number"}, {"type": "array", "items": {"type": "integer"}}],
                "nullable": True,
            },
        ),
        (
            Literal["a"] | Literal[1],
            {"anyOf": [{"type": "string", "enum": ["a"]}, {"type": "integer", "enum": [1]}]},
        ),
        (None, {"type": "null"}),
        ("int", {"type": "integer"}),
    ],
    ids=repr,
)
def test_d38_hints(hint: object, expected: dict[str, Any]) -> None:
    assert dumps(x_schema(one_arg(hint))) == dumps({**expected, "description": "The input"})


UNSUPPORTED = (
    "Couldn't convert the type hint {} to a JSON schema, likely because it is a custom class or object. "
    "Supported type hints are basic types like int, float, str and bool, Enum classes, typing.Literal, "
    "and list, tuple, dict and Union types containing those. If you need a more complex schema than that, "
    "you can write the JSON schema for your tool by hand and pass that instead of the function."
)


@pytest.mark.parametrize(
    ("hint", "message"),
    [
        (EmptyEnum, "The Enum EmptyEnum has no members, so no value could ever match it."),
        (set, UNSUPPORTED.format("<class 'set'>")),
        (Custom, UNSUPPORTED.format(repr(Custom))),
        (
            TupleEnum,
            "The Enum TupleEnum has member values that cannot be written as JSON scalars.\nValues: [(1, 2)]\n"
            "Enum member values must be int, float, str, bool or None to be converted to a JSON schema.",
        ),
        (Literal[b"x"], "Only the valid python literals can be listed in typing.Literal."),
        (Literal[Color.RED], "Only the valid python literals can be listed in typing.Literal."),
        (list[None], UNSUPPORTED.format("None")),
        (NewType("UserId", int), None),
        (
            set[int],
            '("Couldn\'t parse this type hint, likely due to a custom class or object: ", set[int])',
        ),
        (
            typing.Callable[[int], int],
            '("Couldn\'t parse this type hint, likely due to a custom class or object: ", typing.Callable[[int], int])',
        ),
    ],
    ids=repr,
)
def test_d38_unsupported_hints(hint: object, message: str | None) -> None:
    check_error(one_arg(hint), message)


def test_d38_unsupported_return_hint_is_dropped() -> None:
    ours = check(one_arg(int, returns=Custom))
    assert "return" not in ours["function"]
    ours = check(one_arg(int, returns=set[int]))
    assert "return" not in ours["function"]


def test_d38_typed_docstring_form() -> None:
    def fn(x: int, y: str = "a"):
        """Test function

        Args:
            x (int): The input
            y (str, optional): The other
                input, continued.
        """
        return x

    check_properties(
        fn,
        {
            "x": {"type": "integer", "description": "The input"},
            "y": {"type": "string", "description": "The other input, continued."},
        },
        ["x"],
    )


def test_d38_choices_are_json_and_stripped() -> None:
    schema = x_schema(one_arg(Any, 'The input (choices: [" a ", 1, null])'))
    assert dumps(schema) == dumps({"enum": ["a", 1, None], "description": "The input"})


def test_d38_choices_must_end_the_description() -> None:
    schema = x_schema(one_arg(str, 'The input (choices: ["a", "b"]) trailing'))
    assert dumps(schema) == dumps({"type": "string", "description": 'The input (choices: ["a", "b"]) trailing'})


# --------------------------------------------------------------------------------------------------
# Further edge cases: compared with transformers, plus the hand-checked value where it is instructive


def test_choices_replace_a_literal_enum_in_place() -> None:
    schema = x_schema(one_arg(Optional[Literal["a", "b"]], 'The input (CHOICES: ["c"])'))  # noqa: UP045
    assert dumps(schema) == dumps({"type": "string", "enum": ["c"], "nullable": True, "description": "The input"})


def test_choices_string_and_object_are_iterated_like_transformers() -> None:
    assert x_schema(one_arg(str, 'The input (choices: "a b")'))["enum"] == ["a", "", "b"]
    assert x_schema(one_arg(str, 'The input (choices: {" k ": 1})'))["enum"] == ["k"]


@pytest.mark.parametrize("choices", ["['a', 'b']", "[1,", "5", "null"])
def test_bad_choices_raise_schema_error(choices: str) -> None:
    fn = one_arg(str, f"The input (choices: {choices})")
    with pytest.raises(SchemaError, match="choices for the argument 'x'"):
        function_schema(fn)
    if HAVE_HF:  # transformers fails too, with json.JSONDecodeError or TypeError
        with pytest.raises((ValueError, TypeError)):
            reference(fn)


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (typing.List, {"type": "array"}),  # noqa: UP006
        (typing.Dict, {"type": "object"}),  # noqa: UP006
        (typing.Tuple, {"type": "array"}),  # noqa: UP006
        (typing.Dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),  # noqa: UP006
        (dict[str], {"type": "object"}),
        (tuple[()], {"type": "array"}),
        (list[int, str], {"type": "array", "items": {"type": "integer"}}),
        (Optional[Any], {"nullable": True}),  # noqa: UP045
        (Union[int, Any], {"anyOf": [{"type": "integer"}, {}]}),  # noqa: UP007
        (Literal[None], {"type": "null", "enum": [None]}),
        (Literal[1.5, True], {"type": ["number", "boolean"], "enum": [1.5, True]}),
        (
            list[int | None] | None,
            {"type": "array", "items": {"type": "integer", "nullable": True}, "nullable": True},
        ),
        (
            "list[Color] | None",
            {"type": "array", "items": {"type": "string", "enum": ["red", "green"]}, "nullable": True},
        ),
        ("Optional[Literal['a']]", {"type": "string", "enum": ["a"], "nullable": True}),
    ],
    ids=repr,
)
def test_more_hints(hint: object, expected: dict[str, Any]) -> None:
    assert dumps(x_schema(one_arg(hint))) == dumps({**expected, "description": "The input"})


class IntChoice(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    R = 4
    W = 2
    RW = 6


class Scalars(enum.Enum):
    F = 1.5
    N = None
    T = True
    ALIAS = 1.5


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (IntChoice, {"type": "integer", "enum": [1, 2]}),
        (Perm, None),
        (Scalars, {"type": ["number", "null", "boolean"], "enum": [1.5, None, True]}),
    ],
    ids=repr,
)
def test_enum_flavours(hint: object, expected: dict[str, Any] | None) -> None:
    schema = x_schema(one_arg(hint))
    if expected is not None:
        assert dumps(schema) == dumps({**expected, "description": "The input"})


def test_docstring_sections() -> None:
    def fn(a: int, b: str) -> int:
        """Summary line.

        More description here.

        Args:
            a: First.
            b: Second, with a colon: inside
              and a continuation.
            a: A later duplicate wins.

        Returns:
            Something
              indented.

        Raises:
            ValueError: never.
        """
        return a

    ours = check(fn)["function"]
    assert ours["description"] == "Summary line.\n\nMore description here."
    assert ours["parameters"]["properties"]["a"]["description"] == "A later duplicate wins."
    assert ours["parameters"]["properties"]["b"]["description"] == "Second, with a colon: inside and a continuation."
    assert ours["return"]["description"] == "Something\n      indented."  # indentation is kept


def test_parse_google_docstring_directly() -> None:
    doc = "Describe.\n\nArgs:\n    x: The x\n      more\n\nReturns:\n    out"
    assert parse_google_docstring(doc) == ("Describe.", {"x": "The x more"}, "out")
    assert parse_google_docstring("Only a summary") == ("Only a summary", {}, None)


@pytest.mark.parametrize(
    "doc",
    [
        "Args:\n    x: no summary, no newline before Args",
        "Summary Args: inline\n\nArgs:\n    x: The input",
        "Summary\nArgs:\n    x: The input\nReturns: same line",
        "Summary\n\n  Args:\n\tx: tab indented\n\ty (int, optional): other\n",
        "Summary\n\nArgs:\n    x: one\n    x_2: two\n  y: shallower\n",
        'Summary\n\nArgs:\n    x: The input (choices: ["a)", "b"])   ',
        "Summary\n\nRaises:\n    E: x\nArgs:\n    x: after raises",
    ],
)
def test_docstring_corner_cases(doc: str) -> None:
    def fn(x: str):
        return x

    fn.__doc__ = doc
    compare(fn)


def test_variadic_and_keyword_only_parameters() -> None:
    def fn(a: int, *args: str, b: bool = True, c: float, **kwargs: int):
        """Test function

        Args:
            a: A
            args: Extra
            b: B
            c: C
            kwargs: More
        """
        return a

    # Variadic parameters have no default, so transformers lists them as required.
    check_properties(
        fn,
        {
            "a": {"type": "integer", "description": "A"},
            "args": {"type": "string", "description": "Extra"},
            "b": {"type": "boolean", "description": "B"},
            "c": {"type": "number", "description": "C"},
            "kwargs": {"type": "integer", "description": "More"},
        },
        ["a", "args", "c", "kwargs"],
    )


def test_receiver_only_skipped_when_first_and_unannotated() -> None:
    class Tool:
        def fn(self: Custom, x: int):
            """Test function

            Args:
                self: The tool
                x: The input
            """
            return x

    def fn(x: int, self):
        """Test function

        Args:
            x: The input
            self: Not a receiver
        """
        return x

    # An annotated self is a real parameter, and Custom is not convertible.
    check_error(Tool.fn, UNSUPPORTED.format(repr(Custom)))
    check_error(fn, "Argument self is missing a type hint in function fn")


class Base:
    def fn(self, x: int) -> int:
        """Test function

        Args:
            x: The input
        """
        return x

    @staticmethod
    def st(x: int):
        """Test function

        Args:
            x: The input
        """
        return x


class Child(Base):
    def fn(self, x: int) -> int:  # no docstring: inspect.getdoc finds Base.fn's (module-level classes only)
        return x


def test_raw_descriptors_partials_and_inherited_docstrings() -> None:
    check(Child.fn)
    check(Child().fn)
    compare(Base.__dict__["st"])
    compare(functools.partial(Base.st, 1))


def test_media_hints_without_importing_pil_or_torch() -> None:
    image = type("Image", (), {"__module__": "PIL.Image"})
    tensor = type("Tensor", (), {"__module__": "torch"})
    assert type_hint_schema(image) == {"type": "image"}
    assert type_hint_schema(tensor) == {"type": "audio"}
    assert type_hint_schema(list[image]) == {"type": "array", "items": {"type": "image"}}


def test_import_is_cheap() -> None:
    code = (
        "import sys, chatcodec.schema\n"
        "heavy = {'PIL', 'torch', 'numpy', 'transformers'} & set(sys.modules)\n"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_schema_error_is_value_error() -> None:
    def fn(x: int):
        return x

    with pytest.raises(ValueError, match="has no docstring"):
        function_schema(fn)


def test_results_are_fresh_objects() -> None:
    fn = one_arg(int)
    first = function_schema(fn)
    first["function"]["parameters"]["properties"]["x"]["type"] = "changed"
    assert function_schema(fn)["function"]["parameters"]["properties"]["x"]["type"] == "integer"


# --------------------------------------------------------------------------------------------------
# Differential property test: random functions, random hints, random docstrings


def compare(fn: Any) -> None:
    """Both succeed with the same JSON, or both fail (transformers' own errors with the same message)."""
    if not HAVE_HF:
        pytest.skip("transformers (the reference) is not installed")
    try:
        expected = dumps(reference(fn))
    except Exception as theirs:
        with pytest.raises(Exception) as ours:
            function_schema(fn)
        if isinstance(theirs, HF_ERRORS):
            assert isinstance(ours.value, SchemaError)
            assert str(ours.value) == str(theirs)
        elif isinstance(theirs, (json.JSONDecodeError, TypeError)) and "choices" in str(ours.value):
            assert isinstance(ours.value, SchemaError)  # bad (choices: ...) JSON: our own message
        else:
            assert type(ours.value) is type(theirs)
            assert str(ours.value) == str(theirs)
    else:
        assert dumps(function_schema(fn)) == expected


class Mixed2(enum.Enum):
    A = "a"
    B = 2
    C = None


STRING_HINTS = [
    "int",
    "list[str]",
    "Optional[int]",
    "int | None",
    "Color",
    "Literal['a', 'b']",
    "dict[str, list[float]]",
    "tuple[int, str] | None",
]
NAMESPACE: dict[str, Any] = {
    "Any": Any,
    "Color": Color,
    "Literal": Literal,
    "Optional": Optional,
    "Union": Union,
    "typing": typing,
}


def rarely(n: int) -> st.SearchStrategy[bool]:
    """True about once in n draws (shrinking towards False, the path with fewer errors)."""
    return st.sampled_from([False] * (n - 1) + [True])


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Pick one of the strategies with the given relative weights."""
    pool = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.sampled_from(pool).flatmap(lambda strategy: strategy)


scalars = st.one_of(
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False, width=16),
    st.booleans(),
    st.none(),
    st.text(alphabet="ab ", max_size=3),
)
literals = st.lists(scalars, min_size=1, max_size=4).map(lambda values: Literal[tuple(values)])
good_leaves = st.one_of(
    st.sampled_from(
        [int, float, str, bool, type(None), list, tuple, dict, Any, typing.List, typing.Dict, typing.Tuple]  # noqa: UP006
    ),
    st.sampled_from([Color, MixedEnum, IntChoice, Scalars, Mixed2]),
    literals,
)
bad_leaves = st.sampled_from([set, Custom, EmptyEnum, TupleEnum, set[int], Literal[b"x"], None])
leaves = weighted((30, good_leaves), (1, bad_leaves))


def pipe_union(members: list[Any]) -> Any:
    """``a | b | ...`` where Python allows it, typing.Union otherwise."""
    result = members[0]
    for member in members[1:]:
        try:
            result = result | member
        except TypeError:
            result = Union[result, member]  # noqa: UP007
    return result


def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return weighted(
        (4, children.map(lambda x: list[x])),
        (2, children.map(lambda x: typing.List[x])),  # noqa: UP006
        (4, st.lists(children, min_size=2, max_size=3).map(lambda xs: tuple[tuple(xs)])),
        (1, children.map(lambda x: tuple[x])),  # error: a single-element tuple
        (1, children.map(lambda x: tuple[x, ...])),  # error: an ellipsis
        (4, st.tuples(st.sampled_from([str, int]), children).map(lambda kv: dict[kv[0], kv[1]])),
        (4, st.lists(children, min_size=2, max_size=3).map(lambda xs: Union[tuple(xs)])),  # noqa: UP007
        (4, st.lists(children, min_size=2, max_size=3).map(pipe_union)),
        (4, children.map(lambda x: Optional[x])),  # noqa: UP045
    )


hints = st.recursive(leaves, extend, max_leaves=6)
identifiers = st.from_regex(r"[a-zé_][a-z0-9_]{0,6}", fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name) and name not in {"self", "cls", "return"} and name.isidentifier()
)
words = st.text(alphabet="abcXYZ019 .,-'\"()[]:é", min_size=1, max_size=12)
json_choices = st.lists(scalars, min_size=1, max_size=4).map(json.dumps)
defaults = st.one_of(scalars, st.lists(st.integers(0, 3), max_size=2))
indents = st.sampled_from(["", "  ", "    ", "\t", "      "])


@st.composite
def arg_entry(draw: st.DrawFn, name: str, indent: str) -> str:
    """``name (type): text``, continued on deeper lines, maybe ending in a ``(choices: ...)`` clause."""
    typed = draw(st.sampled_from(["", "", " (int)", "(str, optional)", " (list[int])"]))
    lines = draw(st.lists(words, min_size=1, max_size=3))
    deeper = indent + draw(st.sampled_from([" ", "  ", "    ", "\t"]))
    text = f"{indent}{name}{typed}: " + f"\n{deeper}".join(lines)
    if draw(rarely(3)):
        keyword_form = draw(st.sampled_from(["choices", "Choices", "CHOICES"]))
        spacer = draw(st.sampled_from([" ", f"\n{deeper}"]))
        text += f"{spacer}({keyword_form}: {draw(json_choices)})"
        text += draw(st.sampled_from(["", "", "", "  ", " trailing"]))
    elif draw(rarely(25)):
        text += " (choices: ['a', 'b'])"  # not JSON: both fail
    return text


@st.composite
def docstrings(draw: st.DrawFn, names: list[str]) -> str:
    parts = ["\n".join(draw(st.lists(words, max_size=3)))]
    if not draw(rarely(20)):
        described = [name for name in names if not draw(rarely(30))]  # now and then one is missing
        if draw(rarely(4)):
            described.insert(draw(st.integers(0, len(described))), draw(identifiers))  # for no parameter
        indent = draw(indents)
        entries = [draw(arg_entry(name, draw(indents) if draw(rarely(12)) else indent)) for name in described]
        separator = draw(st.sampled_from(["\n", "\n", "\n\n"]))
        parts.append(draw(st.sampled_from(["\n", "\n\n", "\n  \n"])) + "Args:\n" + separator.join(entries))
    if draw(st.booleans()):
        body = draw(st.lists(words, min_size=1, max_size=3))
        indent = draw(st.sampled_from(["    ", "  ", ""]))
        parts.append("\n\nReturns:\n" + "\n".join(indent + line for line in body))
    if draw(rarely(5)):
        parts.append("\n\nRaises:\n    ValueError: " + draw(words))
    doc = "".join(parts)
    if draw(st.booleans()):  # the shape of a real docstring: a first newline and common indentation
        doc = "\n" + textwrap.indent(doc, "    ") + "\n    "
    return doc


@st.composite
def random_functions(draw: st.DrawFn) -> Func:
    """A function with random parameters, defaults, keyword-only parameters, hints and docstring."""
    names = draw(st.lists(identifiers, max_size=5, unique=True))
    receiver = draw(st.sampled_from([None, None, None, "self", "cls"]))
    n_defaults = draw(st.integers(0, len(names)))
    kwonly = [f"{name}_kw" for name in draw(st.lists(identifiers, max_size=2, unique=True))]
    kwonly = [name for name in kwonly if name not in names]

    namespace = dict(NAMESPACE)
    params: list[str] = [receiver] if receiver else []
    for index, name in enumerate(names):
        if index >= len(names) - n_defaults:
            namespace[f"_default_{index}"] = draw(defaults)
            params.append(f"{name}=_default_{index}")
        else:
            params.append(name)
    if kwonly:
        params.append("*")
        for index, name in enumerate(kwonly):
            if draw(st.booleans()):
                namespace[f"_kwdefault_{index}"] = draw(defaults)
                params.append(f"{name}=_kwdefault_{index}")
            else:
                params.append(name)
    func_name = draw(identifiers)
    exec(f"def {func_name}({', '.join(params)}):\n    return None\n", namespace)
    fn: Func = namespace[func_name]

    annotations: dict[str, Any] = {}
    for name in [*names, *kwonly]:
        if draw(rarely(40)):
            continue  # a missing type hint
        annotations[name] = draw(st.sampled_from(STRING_HINTS)) if draw(rarely(8)) else draw(hints)
    if draw(st.booleans()):
        annotations["return"] = draw(hints)
        if draw(rarely(5)):  # the return hint first, as a hand-made __annotations__ may have it
            annotations = {"return": annotations.pop("return"), **annotations}
    fn.__annotations__ = annotations
    fn.__doc__ = "" if draw(rarely(40)) else draw(docstrings([*names, *kwonly]))
    return fn


@needs_hf
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_functions())
def test_random_functions_match_transformers(fn: Func) -> None:
    compare(fn)


@needs_hf
@settings(max_examples=500, deadline=None)
@given(hints)
def test_random_hints_match_transformers(hint: Any) -> None:
    compare(one_arg(hint))
