"""The one ``$ref`` resolver for every JSON schema chatcodec reads: references within the document, nothing else.

Schemas come from callers (tool parameters, ``response_format``) and are followed twice: by the grammar that
constrains generation, and by jsonschema, which checks what was generated. Left to itself, jsonschema fetches a
``$ref`` it cannot find in the document (over HTTP, or ``file://``), and its error message then quotes what it
fetched. So every schema goes through :func:`check_refs` first, and is validated only by a validator from
:func:`validator`, whose registry refuses to retrieve anything:

* a reference is local when it is ``#`` or a JSON pointer ``#/...`` that points at something in the document;
* anything else (``http://``, ``file:``, a relative path, an anchor, a pointer to nothing, ``$dynamicRef``, a
  nested ``$id`` that would move the base of later references) is a :class:`~chatcodec.SchemaError` naming
  where the ``$ref`` sits, wherever that is (``not``, ``if``/``then``/``else``, ``dependentSchemas``, ``items``,
  ``$defs``, an unknown keyword...).

>>> check_refs({"properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}})
>>> check_refs({"not": {"$ref": "https://example.com/secret.json"}}, where="parameters")
Traceback (most recent call last):
    ...
chatcodec.SchemaError: parameters: the $ref 'https://example.com/secret.json' at not/$ref is not \
within the schema; only local references (#/...) are followed, and schemas are never fetched.

The walk is iterative and visits each object once, so a deep schema cannot exhaust the stack and a schema
that shares subschemas cannot multiply the work; a schema nested deeper than :data:`MAX_DEPTH` is refused (no
validator or grammar would follow it either).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .exceptions import SchemaError

__all__ = ["MAX_DEPTH", "check_refs", "resolve_ref", "validator"]

#: how deeply a schema's objects and lists may nest
MAX_DEPTH = 128
#: keywords whose values are data, not schemas: a ``$ref`` inside them is a value like any other
_DATA = frozenset({"const", "enum", "default", "examples", "required", "type", "description", "title"})
#: keywords whose values are maps from names to schemas (the names are not keywords)
_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})
#: reference keywords this resolver does not follow: they look elsewhere than a JSON pointer says
_DYNAMIC = ("$dynamicRef", "$recursiveRef")


def check_refs(schema: Any, *, where: str = "schema") -> None:
    """Refuse ``schema`` unless each of its references points within it (see the module docstring).

    ``where`` names the schema in the message (``tools[0].function.parameters``); the path of the offending
    ``$ref`` inside it follows.
    """
    stack: list[tuple[Any, tuple[str, ...], bool]] = [(schema, (), True)]
    seen: set[tuple[int, bool]] = set()  # a subschema shared in a Python schema is walked once, not once per use
    while stack:
        node, path, is_schema = stack.pop()
        if isinstance(node, (Mapping, list)):
            if (id(node), is_schema) in seen:
                continue
            seen.add((id(node), is_schema))
        if len(path) > MAX_DEPTH:
            raise SchemaError(f"{where}: the schema nests deeper than {MAX_DEPTH} levels (at {_path(path[:8])}/...).")
        if isinstance(node, list):
            stack.extend((item, (*path, str(i)), is_schema) for i, item in enumerate(node))
            continue
        if not isinstance(node, Mapping):
            continue
        if not is_schema:  # a map of names to schemas
            stack.extend((value, (*path, str(key)), True) for key, value in node.items())
            continue
        for key in _DYNAMIC:
            if key in node:
                raise SchemaError(
                    f"{where}: {key} at {_path((*path, key))} is not supported; use a local $ref (#/...)."
                )
        if path and isinstance(node.get("$id"), str):
            raise SchemaError(
                f"{where}: the $id at {_path((*path, '$id'))} would move where references inside it point;"
                " only one document is read, so an $id may stand only at the top of the schema."
            )
        ref = node.get("$ref")
        if "$ref" in node:
            if not isinstance(ref, str):
                raise SchemaError(f"{where}: the $ref at {_path((*path, '$ref'))} must be a string.")
            target = resolve_ref(schema, ref, where=where, at=(*path, "$ref"))
            if not isinstance(target, (Mapping, bool)):
                raise SchemaError(
                    f"{where}: the $ref {ref!r} at {_path((*path, '$ref'))} points at a value that is not a schema."
                )
        for key, value in node.items():
            if key in _DATA or key == "$ref":
                continue
            stack.append((value, (*path, str(key)), key not in _MAPS))


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
    """A jsonschema validator for ``schema`` that never fetches: its references are checked first
    (:func:`check_refs`), and its registry refuses any retrieval, so a reference the walk did not see fails
    as unresolvable instead of being fetched. An invalid schema is a :class:`~chatcodec.SchemaError`."""
    check_refs(schema, where=where)
    import jsonschema
    from referencing import Registry
    from referencing.exceptions import NoSuchResource

    def refuse(uri: str) -> Any:
        raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaError(f"{where} is not a valid JSON schema: {exc.message}") from None
    return cls(schema, registry=Registry(retrieve=refuse))  # type: ignore[call-arg]


def _path(parts: tuple[str, ...]) -> str:
    return "/".join(parts) or "(the top)"
