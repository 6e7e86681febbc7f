"""The one reader of the JSON schemas chatcodec is given: their references, their shape and their size, in one walk.

Schemas come from callers (tool parameters, ``response_format``) and are followed twice: by the grammar that
constrains generation, and by jsonschema, which checks what was generated. Left to itself, jsonschema fetches a
``$ref`` it cannot find in the document (over HTTP, or ``file://``), and its error message then quotes what it
fetched. So every schema goes through :func:`check_schema` first, and is validated only by a validator from
:func:`validator`, whose registry refuses to retrieve anything:

* a reference is local when it is ``#`` or a JSON pointer ``#/...`` that points at something in the document;
* anything else (``http://``, ``file:``, a relative path, an anchor, a pointer to nothing, ``$dynamicRef``, a
  nested ``$id`` that would move the base of later references) is a :class:`~chatcodec.SchemaError` naming
  where the ``$ref`` sits, wherever that is (``not``, ``if``/``then``/``else``, ``dependentSchemas``, ``items``,
  ``$defs``, an unknown keyword...).

>>> check_schema({"properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}})
>>> check_schema({"not": {"$ref": "https://example.com/secret.json"}}, where="parameters")
Traceback (most recent call last):
    ...
chatcodec.SchemaError: parameters: the $ref 'https://example.com/secret.json' at not/$ref is not \
within the schema; only local references (#/...) are followed, and schemas are never fetched.

The same walk checks each keyword's value the way the draft's meta-schema does (``type`` names JSON types,
``required`` lists strings, ``minLength`` is a count, ``pattern`` compiles, a subschema is an object or a
boolean...), so that jsonschema never meets a schema it would fail on. jsonschema's own ``check_schema`` does
the same work by validating against the meta-schema, at about a millisecond per subschema (the 2020-12
meta-schema's dynamic references): a caller's 20,000-property schema held a server thread for tens of seconds
before anything refused it. Here a subschema costs microseconds, and a schema of more than :data:`MAX_PARTS`
objects and lists is refused as it is met.

>>> check_schema({"properties": {"a": {"type": "strng"}}}, where="parameters")
Traceback (most recent call last):
    ...
chatcodec.SchemaError: parameters is not a valid JSON schema: properties/a/type must be one of 'array', \
'boolean', 'integer', 'null', 'number', 'object', 'string' (or a list of them), not 'strng'.

The walk is iterative and visits each object once, so a deep schema cannot exhaust the stack and a schema
that shares subschemas cannot multiply the work; a schema nested deeper than :data:`MAX_DEPTH` is refused (no
validator or grammar would follow it either).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from .exceptions import SchemaError

__all__ = ["MAX_DEPTH", "MAX_PARTS", "check_schema", "resolve_ref", "validator"]

#: how deeply a schema's objects and lists may nest
MAX_DEPTH = 128
#: how many objects and lists one schema may hold (OpenAI's structured outputs take at most 5,000 properties)
MAX_PARTS = 20_000
#: keywords whose values are data, not schemas: a ``$ref`` inside them is a value like any other
_DATA = frozenset({"const", "enum", "default", "examples", "required", "type", "description", "title"})
#: keywords whose values are maps from names to schemas (the names are not keywords)
_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})
#: keywords whose values are one schema
_ONE = frozenset({
    "not", "if", "then", "else", "contains", "additionalProperties", "propertyNames", "unevaluatedItems",
    "unevaluatedProperties", "contentSchema", "additionalItems",
})  # fmt: skip
#: keywords whose values are a non-empty list of schemas
_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
#: reference keywords this resolver does not follow: they look elsewhere than a JSON pointer says
_DYNAMIC = ("$dynamicRef", "$recursiveRef")
#: the JSON types ``type`` may name
_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
#: the draft a ``$schema`` names, by the words in its URI (the newest when there is none, as jsonschema does)
_DRAFTS = (("draft-04", 4), ("draft-06", 6), ("draft-07", 7), ("2019-09", 2019), ("2020-12", 2020))
#: the keywords each draft gives a meaning (as jsonschema's meta-schemas check them); any other is an unknown
#: keyword, whose value only the reference check looks at
_VOCABULARY: dict[int, frozenset[str]] = {}
_words = {
    "type", "enum", "required", "multipleOf", "maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxProperties", "minProperties",
    "items", "additionalItems", "properties", "patternProperties", "additionalProperties", "dependencies", "allOf",
    "anyOf", "oneOf", "not", "definitions", "title", "description", "default", "format", "$schema",
}  # fmt: skip
for _draft_number, _added in (
    (4, ()),
    (6, ("const", "contains", "propertyNames", "examples", "$id")),
    (7, ("if", "then", "else", "$comment", "readOnly", "contentEncoding", "contentMediaType")),
    (2019, ("$defs", "dependentSchemas", "dependentRequired", "maxContains", "minContains", "unevaluatedItems",
            "unevaluatedProperties", "$anchor", "$vocabulary", "deprecated", "writeOnly", "contentSchema")),
    (2020, ("prefixItems", "$dynamicAnchor")),
):  # fmt: skip
    _words |= set(_added)
    _VOCABULARY[_draft_number] = frozenset(_words - ({"additionalItems"} if _draft_number == 2020 else set()))
#: the names ``$anchor`` may give
_ANCHOR = re.compile(r"[A-Za-z_][-A-Za-z0-9._]*")

#: where the walk stands: a schema, a map of names to schemas, or an unknown keyword's value (only its
#: references are looked at: the meta-schema says nothing of it, but a validator might still follow them)
_SCHEMA, _MAP, _LOOSE = 0, 1, 2


def _count(value: Any) -> bool:
    """A non-negative integer, as JSON Schema counts (``2.0`` is one, ``True`` is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value >= 0 and (isinstance(value, int) or value.is_integer())


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _strings(value: Any) -> bool:
    """A list of distinct strings (``required``, ``dependentRequired``'s values)."""
    return isinstance(value, list) and all(isinstance(v, str) for v in value) and len(set(value)) == len(value)


def _regex(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        re.compile(value)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def _type(value: Any) -> bool:
    if isinstance(value, str):
        return value in _TYPES
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, str) and v in _TYPES for v in value)
        and len(set(value)) == len(value)
    )


#: what each data keyword's value must be, and how to say so
_VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "type": (_type, f"must be one of {', '.join(map(repr, _TYPES))} (or a list of them)"),
    "enum": (lambda v: isinstance(v, list), "must be a list"),
    "examples": (lambda v: isinstance(v, list), "must be a list"),
    "required": (_strings, "must be a list of distinct strings"),
    "multipleOf": (lambda v: _number(v) and v > 0, "must be a number above 0"),
    "maximum": (_number, "must be a number"),
    "minimum": (_number, "must be a number"),
    "pattern": (_regex, "must be a regular expression"),
    "dependentRequired": (
        lambda v: isinstance(v, dict) and all(_strings(x) for x in v.values()),
        "must map names to lists of distinct strings",
    ),
    "$vocabulary": (
        lambda v: isinstance(v, dict) and all(isinstance(x, bool) for x in v.values()),
        "must map URIs to true or false",
    ),
    "$anchor": (lambda v: isinstance(v, str) and _ANCHOR.fullmatch(v) is not None, "must be a plain name"),
}
for _key in ("maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties", "maxContains",
             "minContains"):  # fmt: skip
    _VALUES[_key] = (_count, "must be a non-negative integer")
for _key in ("uniqueItems", "deprecated", "readOnly", "writeOnly"):
    _VALUES[_key] = (lambda v: isinstance(v, bool), "must be true or false")
for _key in ("title", "description", "$comment", "format", "contentEncoding", "contentMediaType", "$schema", "$id",
             "$dynamicAnchor"):  # fmt: skip
    _VALUES[_key] = (lambda v: isinstance(v, str), "must be a string")


def _draft(schema: Any) -> int:
    uri = schema.get("$schema") if isinstance(schema, Mapping) else None
    if isinstance(uri, str):
        if "draft-03" in uri:
            raise SchemaError(f"JSON Schema draft 3 ({uri}) is not supported; use draft 4 or later.")
        for words, draft in _DRAFTS:
            if words in uri:
                return draft
    return 2020


def check_schema(schema: Any, *, where: str = "schema") -> None:
    """Refuse ``schema`` unless each of its references points within it, each keyword holds what the
    meta-schema allows, and it is within :data:`MAX_DEPTH` and :data:`MAX_PARTS` (see the module docstring).

    ``where`` names the schema in the message (``tools[0].function.parameters``); the path of the offending
    keyword inside it follows.
    """
    try:
        draft = _draft(schema)
    except SchemaError as exc:
        raise SchemaError(f"{where}: {exc}") from None
    invalid = f"{where} is not a valid JSON schema: "
    vocabulary = _VOCABULARY[draft]
    stack: list[tuple[Any, tuple[str, ...], int]] = [(schema, (), _SCHEMA)]
    seen: set[tuple[int, int]] = set()  # a subschema shared in a Python schema is walked once, not once per use
    parts = 0
    while stack:
        node, path, kind = stack.pop()
        if isinstance(node, (Mapping, list)):
            if (id(node), kind) in seen:
                continue
            seen.add((id(node), kind))
            parts += 1
            if parts > MAX_PARTS:
                raise SchemaError(f"{where}: the schema holds more than {MAX_PARTS} objects and lists; refused.")
        if len(path) > MAX_DEPTH:
            raise SchemaError(f"{where}: the schema nests deeper than {MAX_DEPTH} levels (at {_path(path[:8])}/...).")
        if kind == _MAP:
            if not isinstance(node, Mapping):
                raise SchemaError(f"{invalid}{_path(path)} must be an object of schemas, not {_kind(node)}.")
            if path[-1:] == ("patternProperties",) and draft > 4:
                bad = next((k for k in node if not _regex(k)), None)
                if bad is not None:
                    raise SchemaError(f"{invalid}{_path(path)} has a key that is not a regular expression: {bad!r}.")
            for key, value in node.items():
                inner = (*path, str(key))
                if path[-1:] == ("dependencies",) and _strings(value):
                    continue  # draft 7's other form: the names a property requires
                stack.append((value, inner, _SCHEMA))
            continue
        if kind == _LOOSE:
            if isinstance(node, list):
                stack.extend((item, (*path, str(i)), _LOOSE) for i, item in enumerate(node))
            elif isinstance(node, Mapping):
                _check_references(schema, node, path, where)
                stack.extend((value, (*path, str(key)), _LOOSE) for key, value in node.items())
            continue
        if isinstance(node, bool) and draft > 4:
            continue
        if not isinstance(node, Mapping):
            allowed = "an object" if draft == 4 else "an object or true/false"
            raise SchemaError(f"{invalid}{_path(path)} must be a schema ({allowed}), not {_kind(node)}.")
        _check_references(schema, node, path, where)
        for key, value in node.items():
            inner = (*path, str(key))
            if key not in vocabulary:
                if key != "$ref":
                    stack.append((value, inner, _LOOSE))
                continue
            rule = _VALUES.get(key)
            if rule is not None:
                if not rule[0](value) or (draft == 4 and not _draft4_value(key, value)):
                    raise SchemaError(f"{invalid}{_path(inner)} {rule[1]}, not {_shown(value)}.")
            elif key in ("exclusiveMaximum", "exclusiveMinimum"):
                if draft == 4 and not (isinstance(value, bool) and key.replace("exclusiveM", "m") in node):
                    limit = key.replace("exclusiveM", "m")
                    raise SchemaError(f"{invalid}{_path(inner)} must be true or false beside {limit} in draft 4.")
                if draft > 4 and not _number(value):
                    raise SchemaError(f"{invalid}{_path(inner)} must be a number, not {_shown(value)}.")
            elif draft == 4 and key in ("additionalProperties", "additionalItems") and isinstance(value, bool):
                continue
            elif key in _MAPS:
                stack.append((value, inner, _MAP))
            elif key in _ONE:
                stack.append((value, inner, _SCHEMA))
            elif key in _LISTS or (key == "items" and isinstance(value, list) and draft < 2020):
                if not isinstance(value, list) or not value:
                    raise SchemaError(f"{invalid}{_path(inner)} must be a non-empty list of schemas, not"
                                      f" {_shown(value)}.")  # fmt: skip
                stack.extend((item, (*inner, str(i)), _SCHEMA) for i, item in enumerate(value))
            elif key == "items":
                stack.append((value, inner, _SCHEMA))


def _draft4_value(key: str, value: Any) -> bool:
    """What draft 4's meta-schema asks beyond the later drafts: counts are integers, ``required`` and ``enum``
    are not empty and ``enum`` repeats nothing."""
    if key in ("maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties"):
        return isinstance(value, int)
    if key == "required":
        return bool(value)
    if key == "enum":
        return bool(value) and all(a != b for i, a in enumerate(value) for b in value[i + 1 :])
    return True


def _check_references(root: Any, node: Mapping[str, Any], path: tuple[str, ...], where: str) -> None:
    """Refuse the references in one object that this resolver does not follow (see the module docstring)."""
    for key in _DYNAMIC:
        if key in node:
            raise SchemaError(f"{where}: {key} at {_path((*path, key))} is not supported; use a local $ref (#/...).")
    if path and isinstance(node.get("$id"), str):
        raise SchemaError(
            f"{where}: the $id at {_path((*path, '$id'))} would move where references inside it point;"
            " only one document is read, so an $id may stand only at the top of the schema."
        )
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str):
            raise SchemaError(f"{where}: the $ref at {_path((*path, '$ref'))} must be a string.")
        target = resolve_ref(root, ref, where=where, at=(*path, "$ref"))
        if not isinstance(target, (Mapping, bool)):
            raise SchemaError(
                f"{where}: the $ref {ref!r} at {_path((*path, '$ref'))} points at a value that is not a schema."
            )


def resolve_ref(root: Any, ref: str, *, where: str = "schema", at: tuple[str, ...] = ("$ref",)) -> Any:
    """What the local reference ``ref`` points at in ``root`` (a :class:`~chatcodec.SchemaError` if nothing)."""
    if ref != "#" and not ref.startswith("#/"):
        raise SchemaError(
            f"{where}: the $ref {ref!r} at {_path(at)} is not within the schema; only local references (#/...)"
            " are followed, and schemas are never fetched."
        )
    target = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, Mapping) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise SchemaError(f"{where}: the $ref {ref!r} at {_path(at)} points at nothing in the schema.")
    return target


def validator(schema: Any, *, where: str = "schema") -> Any:
    """A jsonschema validator for ``schema`` that never fetches: the schema is checked first
    (:func:`check_schema`: its references, its shape, its size), and the validator's registry refuses any
    retrieval, so a reference the walk did not see fails as unresolvable instead of being fetched. An invalid
    schema is a :class:`~chatcodec.SchemaError`."""
    check_schema(schema, where=where)
    import jsonschema
    from referencing import Registry
    from referencing.exceptions import NoSuchResource

    def refuse(uri: str) -> Any:
        raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, registry=Registry(retrieve=refuse))  # type: ignore[call-arg]


def _path(parts: tuple[str, ...]) -> str:
    return "/".join(parts) or "(the top)"


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if _number(value) else type(value).__name__
    )


def _shown(value: Any) -> str:
    """``value`` for a one-line message: short scalars as they are, anything else by its kind."""
    if isinstance(value, (str, int, float, bool)) and len(repr(value)) <= 40:
        return repr(value)
    return _kind(value)
