"""Python callables to tool JSON schemas, exactly as transformers' ``get_json_schema`` builds them.

Chat templates print tool schemas with ``tojson``, so the result must match transformers 5.24.0 byte
for byte: the same keys, in the same order, with the same strings. The rules (spec §4):

* The docstring is Google style. Its first part is the tool description; the ``Args:`` block gives one
  description per argument (``name: text`` or ``name (type): text``, continued on deeper-indented
  lines); an optional ``Returns:`` block describes the return value. A description may end with
  ``(choices: [...])`` in JSON syntax, which becomes the argument's ``enum``.
* Every argument needs a type hint (an unannotated leading ``self``/``cls`` is skipped, so methods
  work). Hints map to JSON schema as in :func:`type_hint_schema`.

Errors transformers reports as ``DocstringParsingException`` or ``TypeHintParsingException`` are
raised as :class:`~chatcodec.exceptions.SchemaError` with the same message.

A caller may extend the mapping with ``fallback``, a function asked for the schema of a class that
transformers cannot convert (``chatcodec.tool_schema`` uses it for pydantic models); without one the
output is exactly transformers'.

Importing this module stays cheap: images (``PIL.Image.Image``) and audio (``torch.Tensor``) hints are
recognised by the class's module and name, so neither package is ever imported here.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import typing
from collections.abc import Callable
from typing import Any

from .exceptions import SchemaError

__all__ = ["HintFallback", "function_schema", "parse_google_docstring", "type_hint_schema"]

JsonSchema = dict[str, Any]
#: Asked for the schema of a class transformers cannot convert; ``None`` keeps transformers' error.
HintFallback = Callable[[type], "JsonSchema | None"]

_NoneType = type(None)
# ``int | str`` builds a types.UnionType; taking its type avoids importing ``types`` just for the name.
_UnionType = type(int | str)

# The docstring regexes, verbatim from the spec (§4.2): their quirks are part of the output.
_DESCRIPTION_RE = re.compile(r"^(.*?)[\n\s]*(Args:|Returns:|Raises:|\Z)", re.DOTALL)
_ARGS_BLOCK_RE = re.compile(r"\n\s*Args:\n(.*?)[\n\s]*(Returns:|Raises:|\Z)", re.DOTALL)
_RETURNS_RE = re.compile(r"\n\s*Returns:\n\s*(.*?)[\n\s]*(Raises:|\Z)", re.DOTALL)
_ARG_ENTRY_RE = re.compile(
    r"""
    (?:^|\n)                                  # the start of the block, or of a line
    ([ \t]*)(\w+)(?:[ \t]*\([^()\n]*\))?:\s*  # indentation, the name, an optional "(type)", the colon
    (.*?)\s*                                  # the description, possibly over several lines
    (?=\n(?!\1[ \t])[ \t]*\w+(?:[ \t]*\([^()\n]*\))?:|\Z)  # up to the next entry not indented deeper
    """,
    re.DOTALL | re.VERBOSE,
)
_LINE_BREAKS_RE = re.compile(r"\s*\n+\s*")
_CHOICES_RE = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)

# Hints without type arguments that map to a fixed schema, compared by identity.
_PLAIN_HINTS: tuple[tuple[object, JsonSchema], ...] = (
    (int, {"type": "integer"}),
    (float, {"type": "number"}),
    (str, {"type": "string"}),
    (bool, {"type": "boolean"}),
    (_NoneType, {"type": "null"}),
    (list, {"type": "array"}),
    (tuple, {"type": "array"}),
    (dict, {"type": "object"}),
    (Any, {}),
)
# Media classes, by (module, qualified name), so their packages need not be imported.
_MEDIA_HINTS: dict[tuple[str, str], str] = {
    ("PIL.Image", "Image"): "image",
    ("torch", "Tensor"): "audio",
}
# The Python types whose values a JSON "enum" can hold, and their JSON type names. Exact types only.
_JSON_SCALARS: dict[type, str] = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    _NoneType: "null",
}

_UNSUPPORTED_HINT = (
    "Couldn't convert the type hint {hint!r} to a JSON schema, likely because it is a custom class "
    "or object. Supported type hints are basic types like int, float, str and bool, Enum classes, "
    "typing.Literal, and list, tuple, dict and Union types containing those. If you need a more complex "
    "schema than that, you can write the JSON schema for your tool by hand and pass that instead "
    "of the function."
)
_UNSUPPORTED_GENERIC = "Couldn't parse this type hint, likely due to a custom class or object: "
_SINGLE_TUPLE = (
    "The type hint {hint} is a Tuple with a single element, which we do not automatically convert to JSON "
    "schema as it is rarely necessary. If this input can contain more than one element, we recommend using a "
    "list[] type instead, or if it really is a single element, remove the tuple[] wrapper and just pass the "
    "element directly."
)
_ELLIPSIS_TUPLE = (
    "Conversion of '...' is not supported in Tuple type hints. Use list[] types for variable-length inputs instead."
)


# --------------------------------------------------------------------------------------------------
# The entry point


def function_schema(func: Callable[..., object], *, fallback: HintFallback | None = None) -> JsonSchema:
    """The tool schema transformers' ``get_json_schema(func)`` returns, key order included.

    ``{"type": "function", "function": {"name", "description", "parameters"[, "return"]}}``; the
    ``return`` entry is present only when the return annotation can be converted. ``fallback``
    converts classes transformers rejects (see the module's docstring).
    """
    name = getattr(func, "__name__", "operation")
    doc = inspect.getdoc(func)
    if not doc:
        raise SchemaError(f"Cannot generate JSON schema for {name} because it has no docstring!")
    description, arg_docs, returns_doc = parse_google_docstring(doc.strip())

    parameters, returns = _signature_schemas(func, name, fallback)
    if returns is not None and returns_doc is not None:
        returns["description"] = returns_doc
    for arg, schema in parameters["properties"].items():
        if arg not in arg_docs:
            raise SchemaError(
                f"Cannot generate JSON schema for {name} because the docstring has no description "
                f"for the argument '{arg}'"
            )
        _describe(schema, arg_docs[arg], name, arg)

    function: JsonSchema = {"name": name, "description": description, "parameters": parameters}
    if returns is not None:
        function["return"] = returns
    return {"type": "function", "function": function}


# --------------------------------------------------------------------------------------------------
# Docstrings


def parse_google_docstring(doc: str) -> tuple[str, dict[str, str], str | None]:
    """Split a Google-style docstring into (description, {argument: description}, returns description).

    Argument descriptions are joined onto one line; the returns description keeps its line breaks and
    indentation, as transformers does. A missing ``Args:`` block gives ``{}``, a missing ``Returns:``
    block ``None``.
    """
    description_match = _DESCRIPTION_RE.search(doc)
    description = description_match.group(1).strip() if description_match else ""
    args_match = _ARGS_BLOCK_RE.search(doc)
    arg_docs = _parse_args_block(args_match.group(1)) if args_match else {}
    returns_match = _RETURNS_RE.search(doc)
    returns = returns_match.group(1).strip() if returns_match else None
    return description, arg_docs, returns


def _parse_args_block(block: str) -> dict[str, str]:
    """``{name: description}`` for each entry of an ``Args:`` block; a later duplicate name wins."""
    lines = [line for line in block.split("\n") if line.strip()]
    return {
        name: _LINE_BREAKS_RE.sub(" ", text.strip()) for _indent, name, text in _ARG_ENTRY_RE.findall("\n".join(lines))
    }


def _describe(schema: JsonSchema, text: str, func_name: object, arg: str) -> None:
    """Add an argument's description to its schema, taking a trailing ``(choices: [...])`` as its enum."""
    match = _CHOICES_RE.search(text)
    if match:
        schema["enum"] = _parse_choices(match.group(1), func_name, arg)
        text = text[: match.start()].strip()
    schema["description"] = text


def _parse_choices(source: str, func_name: object, arg: str) -> list[Any]:
    """The values of a ``(choices: ...)`` clause, which is JSON; strings are stripped of spaces.

    transformers iterates whatever the JSON holds, so a string gives its characters and an object its
    keys; these are kept for parity. JSON that does not parse, or a scalar, is a :class:`SchemaError`.
    """
    try:
        loaded = json.loads(source)
    except json.JSONDecodeError as exc:
        raise SchemaError(
            f"Cannot generate JSON schema for {func_name} because the choices for the argument '{arg}' "
            f"are not valid JSON ({exc}): {source}"
        ) from exc
    if not isinstance(loaded, (list, str, dict)):
        raise SchemaError(
            f"Cannot generate JSON schema for {func_name} because the choices for the argument '{arg}' "
            f"are not a JSON list: {source}"
        )
    return [value.strip() if isinstance(value, str) else value for value in loaded]


# --------------------------------------------------------------------------------------------------
# Signatures


def _signature_schemas(
    func: Callable[..., object], func_name: object, fallback: HintFallback | None
) -> tuple[JsonSchema, JsonSchema | None]:
    """The ``parameters`` schema (without descriptions) and the return schema, if it converts."""
    hints = typing.get_type_hints(func)
    params = list(inspect.signature(func).parameters.values())
    receiver = _implicit_receiver(params)

    required: list[str] = []
    for param in params:
        if param.name == receiver:
            continue
        if param.annotation is inspect.Parameter.empty:
            raise SchemaError(f"Argument {param.name} is missing a type hint in function {func_name}")
        if param.default is inspect.Parameter.empty:
            required.append(param.name)

    properties: dict[str, JsonSchema] = {}
    returns: JsonSchema | None = None
    for name, hint in hints.items():
        if name == receiver:
            continue
        if name == "return":
            returns = _return_schema(hint, fallback)
        else:
            properties[name] = type_hint_schema(hint, fallback=fallback)

    parameters: JsonSchema = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return parameters, returns


def _implicit_receiver(params: list[inspect.Parameter]) -> str | None:
    """The name of an unannotated first ``self``/``cls`` parameter, which is not part of the tool."""
    if params and params[0].name in ("self", "cls") and params[0].annotation is inspect.Parameter.empty:
        return params[0].name
    return None


def _return_schema(hint: object, fallback: HintFallback | None) -> JsonSchema | None:
    """The return value's schema; a return hint that cannot be converted is left out, not an error."""
    try:
        return type_hint_schema(hint, fallback=fallback)
    except SchemaError:
        return None


# --------------------------------------------------------------------------------------------------
# Type hints


def type_hint_schema(hint: object, *, fallback: HintFallback | None = None) -> JsonSchema:
    """The JSON schema for one (already resolved) type hint, as transformers maps it.

    ``int``/``float``/``str``/``bool``/``None`` → ``integer``/``number``/``string``/``boolean``/``null``;
    bare ``list``/``tuple`` → ``array``, ``dict`` → ``object``; ``Any`` → ``{}``; Enum classes and
    ``Literal`` → ``enum``; ``list[X]`` → ``items``; ``tuple[X, Y]`` → ``prefixItems``; ``dict[K, V]`` →
    ``additionalProperties``; unions → a list of type names or ``anyOf``, plus ``nullable``. Other
    classes go to ``fallback``, if given.
    """
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is None:
        return _plain_hint_schema(hint, fallback)
    if origin is typing.Union or origin is _UnionType:
        return _union_schema(args, fallback)
    if origin is typing.Literal and args:
        return _literal_schema(args)
    if origin is list:
        return _list_schema(args, fallback)
    if origin is tuple:
        return _tuple_schema(hint, args, fallback)
    if origin is dict:
        return _dict_schema(args, fallback)
    raise SchemaError(repr((_UNSUPPORTED_GENERIC, hint)))


def _plain_hint_schema(hint: object, fallback: HintFallback | None) -> JsonSchema:
    """A hint without type arguments: an Enum class, a basic or media type, a class ``fallback``
    converts, or an unsupported class."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_schema(hint)
    for known, schema in _PLAIN_HINTS:
        if hint is known:
            return dict(schema)
    media = _media_type(hint)
    if media is not None:
        return {"type": media}
    if fallback is not None and isinstance(hint, type):
        converted = fallback(hint)
        if converted is not None:
            return converted
    raise SchemaError(_UNSUPPORTED_HINT.format(hint=hint))


def _media_type(hint: object) -> str | None:
    """``"image"`` for ``PIL.Image.Image``, ``"audio"`` for ``torch.Tensor``, else ``None``."""
    if not isinstance(hint, type):
        return None
    return _MEDIA_HINTS.get((hint.__module__, hint.__qualname__))


def _enum_schema(enum_class: type[enum.Enum]) -> JsonSchema:
    values = [member.value for member in enum_class]
    if not values:
        raise SchemaError(f"The Enum {enum_class.__name__} has no members, so no value could ever match it.")
    if not _all_json_scalars(values):
        raise SchemaError(
            f"The Enum {enum_class.__name__} has member values that cannot be written as JSON scalars.\n"
            f"Values: {values}\n"
            "Enum member values must be int, float, str, bool or None to be converted to a JSON schema."
        )
    return _enum_values_schema(values)


def _literal_schema(args: tuple[Any, ...]) -> JsonSchema:
    values = list(args)
    if not _all_json_scalars(values):
        raise SchemaError("Only the valid python literals can be listed in typing.Literal.")
    return _enum_values_schema(values)


def _all_json_scalars(values: list[Any]) -> bool:
    return all(type(value) in _JSON_SCALARS for value in values)


def _enum_values_schema(values: list[Any]) -> JsonSchema:
    """``{"type": ..., "enum": values}``; the type is a list of the distinct JSON types if they differ."""
    type_names = list(dict.fromkeys(_JSON_SCALARS[type(value)] for value in values))
    return {"type": type_names[0] if len(type_names) == 1 else type_names, "enum": values}


def _union_schema(args: tuple[Any, ...], fallback: HintFallback | None) -> JsonSchema:
    """Members other than ``None``: one is used as is, plain ``{"type": name}`` members merge into one
    sorted list of names, anything else becomes ``anyOf``. ``None`` as a member adds ``nullable``."""
    members = [type_hint_schema(arg, fallback=fallback) for arg in args if arg is not _NoneType]
    schema: JsonSchema
    if len(members) == 1:
        schema = members[0]
    elif all(list(member) == ["type"] and isinstance(member["type"], str) for member in members):
        names = sorted({member["type"] for member in members})
        schema = {"type": names[0] if len(names) == 1 else names}
    else:
        schema = {"anyOf": members}
    if _NoneType in args:
        schema["nullable"] = True
    return schema


def _list_schema(args: tuple[Any, ...], fallback: HintFallback | None) -> JsonSchema:
    if not args:
        return {"type": "array"}
    return {"type": "array", "items": type_hint_schema(args[0], fallback=fallback)}


def _tuple_schema(hint: object, args: tuple[Any, ...], fallback: HintFallback | None) -> JsonSchema:
    if not args:
        return {"type": "array"}
    if len(args) == 1:
        raise SchemaError(_SINGLE_TUPLE.format(hint=str(hint).replace("typing.", "")))
    if ... in args:
        raise SchemaError(_ELLIPSIS_TUPLE)
    return {"type": "array", "prefixItems": [type_hint_schema(arg, fallback=fallback) for arg in args]}


def _dict_schema(args: tuple[Any, ...], fallback: HintFallback | None) -> JsonSchema:
    """``object``; with both type arguments, the value type becomes ``additionalProperties``."""
    if len(args) != 2:
        return {"type": "object"}
    return {"type": "object", "additionalProperties": type_hint_schema(args[1], fallback=fallback)}
