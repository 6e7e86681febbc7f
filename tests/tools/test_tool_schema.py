"""chatcodec.tool_schema: transformers' get_json_schema cases (parity spec §6.1), pydantic models, and errors
that name everything missing; differential against transformers on generated signatures.

Expected values are written out from the spec and compared as JSON strings, so key order counts. Where
transformers succeeds, tool_schema must return its dict byte for byte; where it fails, tool_schema raises
SchemaError naming the function and what is missing.
"""

from __future__ import annotations

import enum
import inspect
import json
import textwrap
import typing
from typing import Any, Literal, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field
from transformers.utils import DocstringParsingException, TypeHintParsingException, get_json_schema

import chatcodec
from chatcodec import SchemaError, tool_schema

from ..test_schema import hints, identifiers, random_functions, words

HF_ERRORS = (DocstringParsingException, TypeHintParsingException)


def dumps(value: Any) -> str:
    return json.dumps(value)


def same_as_transformers(fn: Any, expected_function: dict[str, Any]) -> None:
    ours = tool_schema(fn)
    assert dumps(ours) == dumps({"type": "function", "function": expected_function})
    assert dumps(ours) == dumps(get_json_schema(fn))


def obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return parameters


def fn_entry(parameters: dict[str, Any], description: str = "Test function", **extra: Any) -> dict[str, Any]:
    return {"name": "fn", "description": description, "parameters": parameters, **extra}


X_INPUT = {"x": {"type": "integer", "description": "The input"}}


# --------------------------------------------------------------------------------------------------
# §6.1 S1-S28, through the public API


def s01(x: int):
    """
    Test function

    Args:
         x: The input
    """


def s02():
    """
    Test function
    """


def s03(x: list, y: tuple, z: dict):
    """
    Test function

    Args:
        x: The first input
        y: The second input
        z: The third input
    """


def s04(x: int | float):
    """
    Test function

    Args:
        x: The input
    """


def s05(x: list | tuple, y: list | tuple | dict | None = None):
    """
    Test function

    Args:
        x: The first input
        y: The second input
    """


def s06(x: int | None):
    """
    Test function

    Args:
        x: The input
    """


def s07(x: int = 42):
    """
    Test function

    Args:
        x: The input
    """


def s08(x: list[list[str | int]]):
    """
    Test function

    Args:
        x: The input
    """


def s09(x: int, y: str):
    """
    Test function

    Args:
        x: The input
        y: Also the input
    """


def s10(x: list[int | float], y: int | str | None = None):
    """
    Test function

    Args:
        x: The input
        y: Also the input
    """


def s11(x: str | list[str], y: Literal["a", "b"] | int | None = None):
    """
    Test function

    Args:
        x: The input
        y: Also the input
    """


def s15(x: int) -> int:
    """
    Test function

    Args:
        x: The input
    """


def s16(x: int) -> int:
    """
    Test function

    Args:
        x: The input


    Returns:
        The output
    """


def s17(x: tuple[int, str]):
    """
    Test function

    Args:
        x: The input
    """


def s20(temperature_format: str):
    """
    Test function

    Args:
        temperature_format: The temperature format to use (Choices: ["celsius", "fahrenheit"])


    Returns:
        The temperature
    """


def s21(rating: int, enabled: bool):
    """
    Test function

    Args:
        rating: The rating to give (choices: [1, 2, 3])
        enabled: Whether it is enabled (choices: [true, false])
    """


def s22(temperature_format: Literal["celsius", "fahrenheit"], booleanish: Literal[True, False, 0, 1, "y", "n"] = False):
    """
    Test function

    Args:
        temperature_format: The temperature format to use
        booleanish: A value that can be regarded as boolean
    """


def s23(x: int, y: int):
    """
    Test function

    Args:
        x: The first input

        y: The second input. This is a longer description
           that spans multiple lines with indentation and stuff.
    """


def s24(x: int) -> None:
    """
    Test function

    Args:
        x: The input
    """


class S25:
    def fn(self, x: int):
        """
        Test function

        Args:
            x: The input
        """


class S26:
    @staticmethod
    def fn(x: int):
        """
        Test function

        Args:
            x: The input
        """


class S27:
    @classmethod
    def fn(cls, x: int):
        """
        Test function

        Args:
            x: The input
        """


def s28(x: str, y: list[str | int] | None, z: tuple[str | int, str] = (42, "hello")) -> tuple[int, str]:
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


def named(fn: Any) -> Any:
    fn.__name__ = "fn"
    return fn


S_CASES: list[tuple[str, Any, dict[str, Any]]] = [
    ("S1", s01, fn_entry(obj(X_INPUT, ["x"]))),
    ("S2", s02, fn_entry(obj({}))),
    (
        "S3",
        s03,
        fn_entry(
            obj(
                {
                    "x": {"type": "array", "description": "The first input"},
                    "y": {"type": "array", "description": "The second input"},
                    "z": {"type": "object", "description": "The third input"},
                },
                ["x", "y", "z"],
            )
        ),
    ),
    ("S4", s04, fn_entry(obj({"x": {"type": ["integer", "number"], "description": "The input"}}, ["x"]))),
    (
        "S5",
        s05,
        fn_entry(
            obj(
                {
                    "x": {"type": "array", "description": "The first input"},
                    "y": {"type": ["array", "object"], "nullable": True, "description": "The second input"},
                },
                ["x"],
            )
        ),
    ),
    ("S6", s06, fn_entry(obj({"x": {"type": "integer", "nullable": True, "description": "The input"}}, ["x"]))),
    ("S7", s07, fn_entry(obj(X_INPUT))),
    (
        "S8",
        s08,
        fn_entry(
            obj(
                {
                    "x": {
                        "type": "array",
                        "items": {"type": "array", "items": {"type": ["integer", "string"]}},
                        "description": "The input",
                    }
                },
                ["x"],
            )
        ),
    ),
    (
        "S9",
        s09,
        fn_entry(
            obj(
                {
                    "x": {"type": "integer", "description": "The input"},
                    "y": {"type": "string", "description": "Also the input"},
                },
                ["x", "y"],
            )
        ),
    ),
    (
        "S10",
        s10,
        fn_entry(
            obj(
                {
                    "x": {"type": "array", "items": {"type": ["integer", "number"]}, "description": "The input"},
                    "y": {"type": ["integer", "string"], "nullable": True, "description": "Also the input"},
                },
                ["x"],
            )
        ),
    ),
    (
        "S11",
        s11,
        fn_entry(
            obj(
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
        ),
    ),
    ("S15", s15, fn_entry(obj(X_INPUT, ["x"]), **{"return": {"type": "integer"}})),
    ("S16", s16, fn_entry(obj(X_INPUT, ["x"]), **{"return": {"type": "integer", "description": "The output"}})),
    (
        "S17",
        s17,
        fn_entry(
            obj(
                {
                    "x": {
                        "type": "array",
                        "prefixItems": [{"type": "integer"}, {"type": "string"}],
                        "description": "The input",
                    }
                },
                ["x"],
            )
        ),
    ),
    (
        "S20",
        s20,
        fn_entry(
            obj(
                {
                    "temperature_format": {
                        "type": "string",
                        "enum": ["celsius", "fahrenheit"],
                        "description": "The temperature format to use",
                    }
                },
                ["temperature_format"],
            )
        ),
    ),
    (
        "S21",
        s21,
        fn_entry(
            obj(
                {
                    "rating": {"type": "integer", "enum": [1, 2, 3], "description": "The rating to give"},
                    "enabled": {"type": "boolean", "enum": [True, False], "description": "Whether it is enabled"},
                },
                ["rating", "enabled"],
            )
        ),
    ),
    (
        "S22",
        s22,
        fn_entry(
            obj(
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
        ),
    ),
    (
        "S23",
        s23,
        fn_entry(
            obj(
                {
                    "x": {"type": "integer", "description": "The first input"},
                    "y": {
                        "type": "integer",
                        "description": "The second input. This is a longer description that spans multiple lines"
                        " with indentation and stuff.",
                    },
                },
                ["x", "y"],
            )
        ),
    ),
    ("S24", s24, fn_entry(obj(X_INPUT, ["x"]), **{"return": {"type": "null"}})),
    ("S25 unbound", S25.fn, fn_entry(obj(X_INPUT, ["x"]))),
    ("S25 bound", S25().fn, fn_entry(obj(X_INPUT, ["x"]))),
    ("S26 class", S26.fn, fn_entry(obj(X_INPUT, ["x"]))),
    ("S26 instance", S26().fn, fn_entry(obj(X_INPUT, ["x"]))),
    ("S27 class", S27.fn, fn_entry(obj(X_INPUT, ["x"]))),
    ("S27 instance", S27().fn, fn_entry(obj(X_INPUT, ["x"]))),
    (
        "S28",
        s28,
        fn_entry(
            obj(
                {
                    "x": {
                        "type": "string",
                        "enum": ["a", "b", "c"],
                        "description": "The first input. It's got a big multiline description and also contains",
                    },
                    "y": {
                        "type": "array",
                        "items": {"type": ["integer", "string"]},
                        "nullable": True,
                        "description": "The second input. It's a big list with a single-line description.",
                    },
                    "z": {
                        "type": "array",
                        "prefixItems": [{"type": ["integer", "string"]}, {"type": "string"}],
                        "description": "The third input. It's some kind of tuple with a default arg.",
                    },
                },
                ["x", "y"],
            ),
            "Test function with multiple args, and docstring args that we have to strip out.",
            **{
                "return": {
                    "type": "array",
                    "prefixItems": [{"type": "integer"}, {"type": "string"}],
                    "description": "The output. The return description is also a big multiline\n"
                    "    description that spans multiple lines.",
                }
            },
        ),
    ),
]


@pytest.mark.parametrize(("case", "fn", "expected"), S_CASES, ids=[case for case, _, _ in S_CASES])
def test_get_json_schema_cases(case: str, fn: Any, expected: dict[str, Any]) -> None:
    if not case.startswith(("S25", "S26", "S27")):
        fn = named(fn)
    same_as_transformers(fn, expected)


def test_s04_typing_union_spelling() -> None:
    def fn(x: typing.Union[int, float]):  # noqa: UP007 - the typing spelling is what is tested
        """
        Test function

        Args:
            x: The input
        """

    same_as_transformers(fn, fn_entry(obj({"x": {"type": ["integer", "number"], "description": "The input"}}, ["x"])))


# The failing cases: transformers raises; tool_schema raises SchemaError saying what is missing.


def s12(x: int):
    pass


def s13(x: int):
    """
    Test function
    """


def s14(x):
    """
    Test function

    Args:
        x: The input
    """


def s18(x: tuple[int]):
    """
    Test function

    Args:
        x: The input
    """


def s19(x: tuple[int, ...]):
    """
    Test function

    Args:
        x: The input
    """


ERROR_CASES = [
    ("S12", s12, "Cannot make a tool schema for s12: it has no docstring (Google style:"),
    ("S13", s13, "Cannot make a tool schema for s13: the docstring has no Args: block to describe 'x' (Google style:"),
    ("S14", s14, "Cannot make a tool schema for s14: parameter 'x' has no type hint."),
    ("S18", s18, "Cannot make a tool schema for s18: the type hint of 'x' cannot be converted (The type hint"),
    ("S19", s19, "Cannot make a tool schema for s19: the type hint of 'x' cannot be converted (Conversion of '...'"),
]


@pytest.mark.parametrize(("case", "fn", "message"), ERROR_CASES, ids=[case for case, _, _ in ERROR_CASES])
def test_get_json_schema_error_cases(case: str, fn: Any, message: str) -> None:
    with pytest.raises(HF_ERRORS):
        get_json_schema(fn)
    with pytest.raises(SchemaError) as error:
        tool_schema(fn)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


# --------------------------------------------------------------------------------------------------
# Errors that name everything missing


def test_every_missing_piece_is_named_at_once() -> None:
    def book(city: str, nights, guests: int, when: set[str] = frozenset()):  # type: ignore[assignment]
        """Book a hotel.

        Args:
            city: Where.
        """

    with pytest.raises(SchemaError) as error:
        tool_schema(book)
    assert str(error.value) == (
        "Cannot make a tool schema for book: parameter 'nights' has no type hint; the type hint of 'when' holds"
        " set[str], which a tool schema cannot describe (use int, float, str, bool, None, Any, an Enum, a"
        " Literal, a pydantic model, or list, tuple, dict and unions of them); the docstring's Args: block has no"
        " description for 'nights', 'guests', 'when'."
    )


class Point:
    pass


def test_a_custom_class_is_named_with_its_module() -> None:
    def draw(at: list[Point]):
        """Draw.

        Args:
            at: Where.
        """

    with pytest.raises(SchemaError, match=r"the type hint of 'at' holds tests\.tools\.test_tool_schema\.Point, which"):
        tool_schema(draw)


def test_an_annotation_that_does_not_resolve() -> None:
    class Local:
        pass

    def draw(at: Local):
        """Draw.

        Args:
            at: Where.
        """

    # this module's annotations are strings; Local is not a global, so get_type_hints cannot find it
    with pytest.raises(NameError):
        get_json_schema(draw)
    with pytest.raises(
        SchemaError,
        match=r"^Cannot make a tool schema for draw: its type hints cannot be resolved \(name 'Local' is not defined",
    ):
        tool_schema(draw)


def test_numpy_style_docstring_is_recognised_as_not_google() -> None:
    def area(width: float, height: float) -> float:
        """Compute an area.

        Parameters
        ----------
        width : float
            The width.
        height : float
            The height.
        """
        return width * height

    with pytest.raises(HF_ERRORS):
        get_json_schema(area)
    with pytest.raises(SchemaError, match=r"the docstring has no Args: block to describe 'width', 'height'"):
        tool_schema(area)


def test_bad_choices_keep_their_own_message() -> None:
    def pick(color: str):
        """Pick.

        Args:
            color: A color (choices: ['red', 'blue'])
        """

    with pytest.raises(SchemaError, match=r"choices for the argument 'color' are not valid JSON"):
        tool_schema(pick)


def test_public_names() -> None:
    assert chatcodec.tool_schema is tool_schema
    assert "tool_schema" in chatcodec.__all__
    assert "Toolbox" in chatcodec.__all__


# --------------------------------------------------------------------------------------------------
# Pydantic models as parameter types


class Address(BaseModel):
    """A postal address."""

    street: str
    city: str = Field(description="The city")
    zip_code: Optional[str] = None  # noqa: UP045 - the typing spelling pydantic users write


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Order(BaseModel):
    item: str
    quantity: int = 1
    ship_to: Address
    unit: Unit = Unit.CELSIUS
    notes: list[Address] = []


class Tree(BaseModel):
    value: int
    children: list[Tree] = []


def test_pydantic_model_parameter_becomes_its_json_schema() -> None:
    def ship(order: Order, express: bool = False) -> Address:
        """Ship an order.

        Args:
            order: The order to ship.
            express: Whether to hurry.
        """
        return order.ship_to

    schema = tool_schema(ship)
    order = schema["function"]["parameters"]["properties"]["order"]
    expected = Order.model_json_schema()
    definitions = expected.pop("$defs")
    # each $ref replaced by the definition it names; nothing else changes
    expected["properties"]["ship_to"] = definitions["Address"]
    expected["properties"]["unit"] = {**definitions["Unit"], "default": "celsius"}
    expected["properties"]["notes"]["items"] = definitions["Address"]
    expected["description"] = "The order to ship."
    assert order == expected
    assert "$ref" not in json.dumps(schema) and "$defs" not in json.dumps(schema)
    assert schema["function"]["parameters"]["required"] == ["order"]
    assert schema["function"]["return"]["properties"]["city"] == {
        "description": "The city",
        "title": "City",
        "type": "string",
    }


def test_pydantic_models_inside_containers_and_optional() -> None:
    def route(stops: list[Address], fallback: Address | None = None):
        """Route.

        Args:
            stops: Where to stop.
            fallback: Where to go otherwise.
        """

    properties = tool_schema(route)["function"]["parameters"]["properties"]
    address = Address.model_json_schema()
    assert properties["stops"] == {"type": "array", "items": address, "description": "Where to stop."}
    assert properties["fallback"] == {**address, "nullable": True, "description": "Where to go otherwise."}


def test_recursive_pydantic_model_is_a_clear_error() -> None:
    def plant(tree: Tree):
        """Plant.

        Args:
            tree: The tree.
        """

    with pytest.raises(SchemaError, match=r"Tree refers to Tree recursively, which cannot be inlined"):
        tool_schema(plant)


def test_pydantic_models_do_not_change_render_parity() -> None:
    """The core's function_schema (used for callables passed to render) still rejects them, as transformers."""
    from chatcodec.schema import function_schema

    def ship(order: Order):
        """Ship.

        Args:
            order: The order.
        """

    with pytest.raises(TypeHintParsingException) as theirs:
        get_json_schema(ship)
    with pytest.raises(SchemaError) as ours:
        function_schema(ship)
    assert str(ours.value) == str(theirs.value)


# --------------------------------------------------------------------------------------------------
# Differential: generated signatures


def check_against_transformers(fn: Any) -> None:
    """Same JSON where transformers succeeds; where it fails, a one-line SchemaError naming each gap."""
    try:
        expected = dumps(get_json_schema(fn))
    except Exception as theirs:
        with pytest.raises(SchemaError) as ours:
            tool_schema(fn)
        message = str(ours.value)
        assert "\n" not in message
        if isinstance(theirs, HF_ERRORS):
            name = getattr(fn, "__name__", "operation")
            assert message.startswith(f"Cannot make a tool schema for {name}: ") or message == str(theirs)
            missing = ", ".join(repr(name) for name in missing_hints(fn))
            if missing:
                assert f"{missing} {'has no type hint' if ',' not in missing else 'have no type hints'}" in message
            if not inspect.getdoc(fn):
                assert "it has no docstring" in message
    else:
        assert dumps(tool_schema(fn)) == expected


def missing_hints(fn: Any) -> list[str]:
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name in ("self", "cls") and params[0].annotation is inspect.Parameter.empty:
        params = params[1:]
    return [param.name for param in params if param.name not in fn.__annotations__]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_functions())
def test_generated_google_functions_match_transformers(fn: Any) -> None:
    check_against_transformers(fn)


@st.composite
def other_style_functions(draw: st.DrawFn) -> Any:
    """Functions documented in numpy, Sphinx or Google-with-types style, with random hints and defaults."""
    names = draw(st.lists(identifiers, min_size=1, max_size=4, unique=True))
    style = draw(st.sampled_from(["numpy", "sphinx", "google_typed", "epydoc"]))
    summary = draw(words)
    if style == "numpy":
        body = "Parameters\n----------\n" + "".join(f"{n} : int\n    {draw(words)}\n" for n in names)
    elif style == "sphinx":
        body = "".join(f":param {n}: {draw(words)}\n:type {n}: int\n" for n in names)
    elif style == "epydoc":
        body = "".join(f"@param {n}: {draw(words)}\n" for n in names)
    else:
        body = "Args:\n" + "".join(
            f"    {n} ({draw(st.sampled_from(['int', 'str, optional']))}): {draw(words)}\n" for n in names
        )
    doc = f"{summary}\n\n{body}"
    if draw(st.booleans()):
        doc = "\n" + textwrap.indent(doc, "    ")
    n_defaults = draw(st.integers(0, len(names)))
    params = [f"{n}=None" if i >= len(names) - n_defaults else n for i, n in enumerate(names)]
    namespace: dict[str, Any] = {}
    exec(f"def documented({', '.join(params)}):\n    pass\n", namespace)
    fn = namespace["documented"]
    fn.__annotations__ = {n: draw(hints) for n in names}
    fn.__doc__ = doc
    return fn


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(other_style_functions())
def test_other_docstring_styles_match_transformers(fn: Any) -> None:
    check_against_transformers(fn)
