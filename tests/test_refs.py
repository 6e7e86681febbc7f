"""chatcodec.refs: the one $ref resolver. Local references are followed wherever they sit; anything else is
refused, naming where it sits, and nothing is ever fetched or read: a real HTTP server on 127.0.0.1 counts
the requests it gets, and an audit hook records every file opened and every URL asked for."""

from __future__ import annotations

import http.server
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatcodec.exceptions import SchemaError
from chatcodec.refs import MAX_DEPTH, MAX_PARTS, check_schema, resolve_ref, validator

#: every keyword that holds a schema, and the path to the $ref placed there: (keyword, schema with the ref, path)
PLACES: list[tuple[str, Any, str]] = [
    ("not", lambda r: {"not": {"$ref": r}}, "not/$ref"),
    ("if", lambda r: {"if": {"$ref": r}, "then": {}}, "if/$ref"),
    ("then", lambda r: {"if": {}, "then": {"$ref": r}}, "then/$ref"),
    ("else", lambda r: {"if": {}, "else": {"$ref": r}}, "else/$ref"),
    ("dependentSchemas", lambda r: {"dependentSchemas": {"a": {"$ref": r}}}, "dependentSchemas/a/$ref"),
    ("dependencies", lambda r: {"dependencies": {"a": {"$ref": r}}}, "dependencies/a/$ref"),
    ("items", lambda r: {"items": {"$ref": r}}, "items/$ref"),
    ("prefixItems", lambda r: {"prefixItems": [{}, {"$ref": r}]}, "prefixItems/1/$ref"),
    ("contains", lambda r: {"contains": {"$ref": r}}, "contains/$ref"),
    ("additionalProperties", lambda r: {"additionalProperties": {"$ref": r}}, "additionalProperties/$ref"),
    ("patternProperties", lambda r: {"patternProperties": {"^a": {"$ref": r}}}, "patternProperties/^a/$ref"),
    ("propertyNames", lambda r: {"propertyNames": {"$ref": r}}, "propertyNames/$ref"),
    ("unevaluatedProperties", lambda r: {"unevaluatedProperties": {"$ref": r}}, "unevaluatedProperties/$ref"),
    ("anyOf", lambda r: {"anyOf": [{"type": "string"}, {"$ref": r}]}, "anyOf/1/$ref"),
    ("oneOf", lambda r: {"oneOf": [{"$ref": r}]}, "oneOf/0/$ref"),
    ("allOf", lambda r: {"allOf": [{}, {}, {"$ref": r}]}, "allOf/2/$ref"),
    ("$defs", lambda r: {"$defs": {"x": {"$ref": r}}}, "$defs/x/$ref"),
    ("definitions", lambda r: {"definitions": {"x": {"$ref": r}}}, "definitions/x/$ref"),
    (
        "deep properties",
        lambda r: {"properties": {"a": {"properties": {"b": {"not": {"$ref": r}}}}}},
        "properties/a/properties/b/not/$ref",
    ),
    ("a property named $ref", lambda r: {"properties": {"$ref": {"$ref": r}}}, "properties/$ref/$ref"),
    ("an unknown keyword", lambda r: {"x-extension": {"$ref": r}}, "x-extension/$ref"),
]

#: references that are not within the document
ELSEWHERE = [
    "https://example.com/secret.json",
    "file:///etc/passwd",
    "other.json",
    "other.json#/a",
    "//example.com/x",
    "#anchor",
    "urn:uuid:deadbeef-1234-0000-0000-4321feedbeef",
]


class Watch:
    """A real HTTP server on 127.0.0.1 that counts the requests it is sent, a real file, and an audit hook that
    records every open of that file and every URL opened (the hook cannot be removed: it records only while
    ``on``)."""

    def __init__(self, tmp: Path) -> None:
        self.requests: list[str] = []
        self.opened: list[str] = []
        self.urls: list[str] = []
        self.file = tmp / "secret.json"
        self.file.write_text('{"enum": ["INTERNAL-SECRET-42"]}', encoding="utf-8")
        watch = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                watch.requests.append(self.path)
                body = b'{"enum": ["INTERNAL-SECRET-42"]}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/secret.json"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.on = True
        _HOOKS.append(self)

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.on:
            return
        if event == "open" and args and str(args[0]).endswith(self.file.name):
            self.opened.append(str(args[0]))
        elif event == "urllib.Request":
            self.urls.append(str(args[0]))

    def refs(self) -> list[str]:
        return [self.url, self.file.as_uri()]

    def untouched(self) -> bool:
        return not self.requests and not self.opened and not self.urls

    def close(self) -> None:
        self.on = False
        _HOOKS.remove(self)
        self.server.shutdown()
        self.server.server_close()


_HOOKS: list[Watch] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    for watch in list(_HOOKS):
        watch.audit(event, args)


sys.addaudithook(_audit)


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Watch]:
    found = Watch(tmp_path)
    yield found
    found.close()


@pytest.mark.parametrize(("place", "make", "path"), PLACES, ids=[p[0] for p in PLACES])
@pytest.mark.parametrize("ref", ELSEWHERE)
def test_a_reference_elsewhere_is_refused_wherever_it_sits(place: str, make: Any, path: str, ref: str) -> None:
    with pytest.raises(SchemaError) as caught:
        check_schema(make(ref), where="parameters")
    message = str(caught.value)
    assert message.startswith("parameters: ") and f"{ref!r} at {path} " in message, message
    assert "never fetched" in message


@pytest.mark.parametrize(("place", "make", "path"), PLACES, ids=[p[0] for p in PLACES])
def test_a_local_reference_to_nothing_is_refused_wherever_it_sits(place: str, make: Any, path: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(f"'#/nope' at {path} points at nothing")):
        check_schema(make("#/nope"))


@pytest.mark.parametrize(("place", "make", "path"), PLACES, ids=[p[0] for p in PLACES])
def test_local_references_pass_wherever_they_sit(place: str, make: Any, path: str) -> None:
    schema = make("#/$defs/ok")
    schema.setdefault("$defs", {})["ok"] = {"type": "string"}
    check_schema(schema)
    validator(schema)  # a valid schema with its references resolvable: a validator is built


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"not": {"$dynamicRef": "#meta"}}, "$dynamicRef at not/$dynamicRef is not supported"),
        ({"items": {"$recursiveRef": "#"}}, "$recursiveRef at items/$recursiveRef"),
        ({"properties": {"a": {"$id": "https://example.com/a.json", "$ref": "#/x"}}}, "$id at properties/a/$id"),
        ({"not": {"$ref": 5}}, "$ref at not/$ref must be a string"),
        ({"$defs": {"s": "text"}, "not": {"$ref": "#/$defs/s"}}, "points at a value that is not a schema"),
        ({"$defs": {"a": {}}, "not": {"$ref": "#/$defs/a/b"}}, "points at nothing"),
        ({"prefixItems": [{}], "not": {"$ref": "#/prefixItems/3"}}, "points at nothing"),
    ],
)
def test_references_the_resolver_does_not_follow(schema: Any, words: str) -> None:
    with pytest.raises(SchemaError) as caught:
        check_schema(schema)
    assert words in str(caught.value)


def test_data_keywords_are_values_not_schemas() -> None:
    # a $ref inside const, enum, default or examples is data that jsonschema compares, never follows
    schema = {
        "const": {"$ref": "https://example.com/a"},
        "enum": [{"$ref": "file:///etc/passwd"}],
        "default": {"$ref": "x"},
        "examples": [{"$ref": "y"}],
    }
    check_schema(schema)
    assert validator(schema).is_valid({"$ref": "https://example.com/a"}) is False  # not also in the enum


def test_pointers_resolve_with_escapes_and_indexes() -> None:
    root = {"$defs": {"a/b": {"c~d": {"type": "integer"}}}, "prefixItems": [{"type": "null"}]}
    assert resolve_ref(root, "#/$defs/a~1b/c~0d") == {"type": "integer"}
    assert resolve_ref(root, "#/prefixItems/0") == {"type": "null"}
    assert resolve_ref(root, "#") is root


def test_local_references_are_honoured_where_the_grammar_does_not_look() -> None:
    """The review's example, resolved locally: the city must not be the secret; jsonschema follows the $ref
    inside ``not`` within the document."""
    schema = {
        "type": "object",
        "properties": {"city": {"not": {"$ref": "#/$defs/secret"}}},
        "$defs": {"secret": {"enum": ["INTERNAL-SECRET-42"]}},
        "dependentSchemas": {"city": {"if": {"$ref": "#/$defs/secret"}, "then": False}},
    }
    check = validator(schema)
    assert check.is_valid({"city": "Paris"})
    errors = list(check.iter_errors({"city": "INTERNAL-SECRET-42"}))
    assert [list(e.absolute_path) for e in errors] == [["city"]]


def test_recursive_local_references_validate() -> None:
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    check = validator(tree)
    assert check.is_valid({"kids": [{"kids": []}, {}]})
    assert not check.is_valid({"kids": [{"kids": 3}]})


def test_the_references_elsewhere_are_never_fetched_nor_read(watch: Watch) -> None:
    for ref in watch.refs():
        for _, make, path in PLACES:
            with pytest.raises(SchemaError, match=re.escape(f"at {path} is not within the schema")):
                validator(make(ref), where="parameters")
    assert watch.untouched(), (watch.requests, watch.opened, watch.urls)


def test_the_validators_registry_refuses_to_retrieve(watch: Watch) -> None:
    """Behind the walk, the validator itself: given a schema with remote references anyway (evolve skips the
    walk), it fails as unresolvable and asks for nothing."""
    from referencing.exceptions import Unresolvable

    check = validator({"type": "object"})
    for ref in watch.refs():
        remote = check.evolve(schema={"properties": {"a": {"not": {"$ref": ref}}}})
        with pytest.raises(Unresolvable):
            remote.is_valid({"a": "Paris"})
    assert watch.untouched(), (watch.requests, watch.opened, watch.urls)


def test_the_watch_sees_what_jsonschema_fetches_by_itself(watch: Watch) -> None:
    """The watch can fail: jsonschema's own default resolution fetches the remote reference, the server sees
    the request and the error quotes the fetched secret. chatcodec never builds a validator this way."""
    import jsonschema

    schema = {"properties": {"city": {"$ref": watch.url}}}
    with pytest.warns(DeprecationWarning):
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors({"city": "Paris"}))
    assert watch.requests == ["/secret.json"]
    assert "INTERNAL-SECRET-42" in errors[0].message


def test_deep_schemas_are_refused_before_anything_recurses() -> None:
    schema: Any = {"type": "string"}
    for _ in range(5000):  # far past the recursion limit: the walk is iterative
        schema = {"not": schema}
    with pytest.raises(SchemaError, match=f"deeper than {MAX_DEPTH} levels"):
        check_schema(schema)
    shallow: Any = {"type": "string"}
    for _ in range(MAX_DEPTH - 1):
        shallow = {"items": shallow}
    check_schema(shallow)


def test_the_toolbox_uses_the_same_resolver(watch: Watch) -> None:
    from chatcodec import Toolbox

    def get_weather(city: str) -> str:
        """Get the weather.

        Args:
            city: the city
        """
        return "sunny"

    for ref in watch.refs():
        box = Toolbox()
        bad = {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"not": {"$ref": ref}}}},
            },
        }
        with pytest.raises(SchemaError, match=r"The parameters schema of get_weather: the \$ref .* at properties/city"):
            box.add(get_weather, schema=bad)
    assert watch.untouched(), (watch.requests, watch.opened, watch.urls)

    box = Toolbox()
    local = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"not": {"$ref": "#/$defs/secret"}}},
                "$defs": {"secret": {"enum": ["Atlantis"]}},
            },
        },
    }
    box.add(get_weather, schema=local)

    def call(city: str) -> str:
        content: str = box.call({"name": "get_weather", "arguments": {"city": city}})["content"]
        return content

    assert call("Paris") == "sunny"
    assert call("Atlantis").startswith("Error: invalid arguments for get_weather: at ['city']: ")


#: keywords of every draft, and values of every JSON kind for them (right for some keywords, wrong for others)
KEYWORDS = [
    "type", "enum", "const", "required", "multipleOf", "maximum", "exclusiveMaximum", "minLength", "pattern",
    "minItems", "uniqueItems", "maxContains", "items", "prefixItems", "contains", "additionalProperties",
    "additionalItems", "properties", "patternProperties", "dependentSchemas", "dependentRequired", "dependencies",
    "propertyNames", "if", "allOf", "anyOf", "not", "unevaluatedItems", "$defs", "definitions", "title", "examples",
    "deprecated", "writeOnly", "format", "contentSchema", "$anchor", "$vocabulary",
]  # fmt: skip
VALUES: list[Any] = [5, -1, 2.0, 1.5, "string", "[", [], ["a", "a"], ["string", "null"], {}, {"a": 5}, {"a": ["b"]},
                     {"[": {}}, None, True, {"type": "string"}, [{"type": "string"}]]  # fmt: skip
DRAFTS = [
    None, "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-06/schema#",
    "http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2019-09/schema",
]  # fmt: skip


@pytest.mark.parametrize("draft", DRAFTS)
def test_the_walk_accepts_what_each_drafts_meta_schema_accepts(draft: str | None) -> None:
    """The oracle is jsonschema's own ``check_schema`` (validation against the draft's meta-schema): over every
    keyword x every kind of value, at the top and inside a property, the walk refuses exactly what it refuses."""
    import warnings

    import jsonschema

    disagree = []
    for key in KEYWORDS:
        for value in VALUES:
            for nested in (False, True):
                schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}}
                (schema["properties"]["a"] if nested else schema)[key] = value
                if draft is not None:
                    schema["$schema"] = draft
                cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        cls.check_schema(schema)
                        theirs = True
                    except jsonschema.SchemaError:
                        theirs = False
                try:
                    check_schema(schema)
                    ours = True
                except SchemaError:
                    ours = False
                if ours != theirs:
                    disagree.append((key, value, nested, ours))
    assert disagree == []


def test_a_schema_past_the_parts_budget_is_refused_by_the_walk() -> None:
    """The review's worst schema (25,000 properties) is refused as the walk meets it, before jsonschema or the
    grammar builder sees it; one part fewer than the budget passes."""
    huge = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(25_000)}}
    with pytest.raises(SchemaError, match=f"more than {MAX_PARTS} objects and lists"):
        check_schema(huge, where="parameters")
    within = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(MAX_PARTS - 2)}}
    check_schema(within)  # the top, its properties object, and MAX_PARTS - 2 property schemas
    with pytest.raises(SchemaError, match="properties/k3/type must be one of"):
        check_schema({"type": "object", "properties": {f"k{i}": {"type": "integer" if i != 3 else "int"}
                                                        for i in range(10)}})  # fmt: skip
