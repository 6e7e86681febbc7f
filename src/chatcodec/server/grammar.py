"""Constrained generation: GBNF grammars (llama.cpp's dialect) from JSON schemas and tool lists.

A grammar is built for three cases:

- ``response_format``: the whole answer is one JSON value for the schema (or any JSON object);
- ``tool_choice`` ``"required"`` or a named function: the answer is a tool call, written in the syntax
  the decoder reads, with arguments valid for the tool's parameter schema;
- ``tool_choice`` ``"auto"``: free text, or a well-formed call.

The calls of the generic format (templates with no tool syntax of their own, whose tools are
polyfilled) are one JSON object, so their constraint is also given as a JSON schema, for engines that
take one::

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]}

and, with ``"auto"``, plain text that does not start with ``{`` (the polyfilled system text tells the
model to "reply normally" when it calls no tool).

Formats that wrap JSON arguments in markers of their own (Hermes' ``<tool_call>``, Llama 3's bare
JSON, Mistral's ``[TOOL_CALLS]``, ...) are learned from the template: one call is rendered, and the
text around the name and the arguments becomes the literal frame of the grammar.

Schemas are followed where a grammar can follow them (types, properties and required keys, enums,
consts, anyOf/oneOf, local ``$ref``, array items and bounds, string lengths, dates); what a grammar
cannot follow (patterns, numeric bounds, ``not``, ``if``/``then``) is left to the jsonschema check after
generation. References are resolved by :mod:`chatcodec.refs`, within the document only.

Building is linear in the schema: each subschema is turned into a rule once (by identity, and each ``$ref``
once), however often it is reached, so nested ``anyOf`` or a ``type`` list over shared children cannot
multiply the work. Past :data:`MAX_STEPS` subschemas, :data:`MAX_DEPTH` levels or :data:`MAX_GRAMMAR`
characters of grammar, the schema is refused (an :class:`~chatcodec.InputError`, a 400 in the server); choices
nested deeper than :data:`MAX_CHOICES` are any JSON value in the grammar (the sampler's work per token would
multiply with each), left to the check after generation. Refused too
is a schema whose grammar llama.cpp would not take: a lower bound over :data:`MAX_REPEAT` (``minItems``,
``minLength``), or a reference that reaches itself before any character is written (left recursion). An upper
bound over :data:`MAX_REPEAT` is left to the check after generation.

>>> g = GrammarBuilder()
>>> print(g.build(g.schema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, "args")))
root ::= args
args ::= "{" ws "\\"n\\"" ws ":" ws integer ws "}"
ws ::= | " "
integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
<BLANKLINE>
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..exceptions import InputError, SchemaError
from ..refs import resolve_ref

__all__ = ["MAX_CHOICES", "MAX_DEPTH", "MAX_GRAMMAR", "MAX_REPEAT", "MAX_STEPS", "GrammarBuilder", "gbnf_literal"]

#: how many subschemas (and enum values) one grammar may be built from
MAX_STEPS = 20_000
#: how deeply subschemas may nest in the grammar (chatcodec.refs refuses deeper schemas first)
MAX_DEPTH = 160
#: the longest grammar text built, in characters
MAX_GRAMMAR = 1 << 20
#: the largest repetition count a grammar writes (llama.cpp refuses counts over 2000)
MAX_REPEAT = 1000
#: how many choices (anyOf, oneOf, type lists) a grammar nests: llama.cpp's sampler follows every alternative that
#: still matches, so choices that overlap, nested, multiply its work per token (shared anyOf 60 deep held the
#: model for minutes); deeper ones are any JSON value in the grammar, checked after generation
MAX_CHOICES = 6

_PRIMITIVES: dict[str, str] = {
    "ws": '| " "',
    "char": '[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" char* "\\""',
    "integer": '"-"? ("0" | [1-9] [0-9]{0,15})',
    "number": 'integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?',
    "boolean": '"true" | "false"',
    "null": '"null"',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"',
    "array": '"[" ws ( value ( ws "," ws value )* )? ws "]"',
    "date": '"\\"" [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( [0-2] [0-9] | "3" [01] ) "\\""',
}
#: which primitives each primitive needs
_NEEDS: dict[str, tuple[str, ...]] = {
    "string": ("char",),
    "number": ("integer",),
    "value": ("object", "array", "string", "number", "boolean", "null"),
    "object": ("ws", "string", "value"),
    "array": ("ws", "value"),
}
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_NAME_CHARS = re.compile(r"[^a-zA-Z0-9-]+")


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal.

    >>> print(gbnf_literal('say "hi"\\n'))
    "say \\"hi\\"\\n"
    """
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class GrammarBuilder:
    """Collects the rules of one grammar; :meth:`schema` turns a JSON schema into a rule name."""

    def __init__(self) -> None:
        self._rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}
        self._refs: dict[str, str] = {}
        self._root_schema: Mapping[str, Any] = {}
        #: id(subschema) -> (the subschema, kept alive so its id stays its own, and its rule)
        self._done: dict[int, tuple[Any, str]] = {}
        self._steps = 0
        self._depth = 0
        self._choices = 0  # how many anyOf/oneOf/type lists the subschema being built is inside

    # --- rules --------------------------------------------------------------------------------------------

    def primitive(self, name: str) -> str:
        if name not in self._rules:
            self._rules[name] = _PRIMITIVES[name]
            for need in _NEEDS.get(name, ()):
                self.primitive(need)
        return name

    def rule(self, hint: str, body: str) -> str:
        """A rule with ``body``, named after ``hint`` (an existing rule with the same body is reused)."""
        found = self._by_body.get(body)
        if found is not None:
            return found
        name = self._fresh(hint)
        self._rules[name] = body
        self._by_body[body] = name
        return name

    def reserve(self, name: str, body: str) -> None:
        """Define the rule ``name`` exactly (for rules that refer to each other by name)."""
        self._rules[name] = body

    def text_without(self, marker: str) -> str:
        """A rule for any text that never holds ``marker`` (and may end with a part of it).

        The rules are the states of a string-matching automaton (Knuth-Morris-Pratt): state ``i`` has read
        text that ends with the marker's first ``i`` characters and holds no marker; each character leads
        to the state of the longest prefix of the marker the text then ends with, and no character leads to
        the whole marker. So markers that repeat their first character (``>>>``, ``<|<``) are handled too.
        """
        if not marker:
            raise ValueError("text_without needs a marker")
        size = len(marker)
        fail = [0] * size  # fail[i]: the longest proper prefix of marker[: i + 1] that is also its suffix
        k = 0
        for i in range(1, size):
            while k and marker[i] != marker[k]:
                k = fail[k - 1]
            if marker[i] == marker[k]:
                k += 1
            fail[i] = k

        def step(state: int, char: str) -> int:
            while state and marker[state] != char:
                state = fail[state - 1]
            return state + 1 if marker[state] == char else 0

        base = self._fresh("free")
        names = [base] + [f"{base}-{i}" for i in range(1, size)]
        alphabet = list(dict.fromkeys(marker))
        for state, name in enumerate(names):
            moves = [f"{gbnf_literal(c)} {names[step(state, c)]}" for c in alphabet if step(state, c) < size]
            moves.append(f"{_not_chars(alphabet)} {base}")
            self._rules[name] = "| " + " | ".join(moves)  # the empty alternative first: the text may end here
        return base

    def _fresh(self, hint: str) -> str:
        base = _NAME_CHARS.sub("-", hint).strip("-").lower() or "r"
        if base in _PRIMITIVES or base == "root":
            base += "-"
        name, n = base, 1
        while name in self._rules:
            n += 1
            name = f"{base}{n}"
        return name

    def build(self, root: str) -> str:
        """The grammar text, whose start rule ``root`` is ``root`` (a rule name or a rule body)."""
        used: list[str] = []
        todo = _references(root)
        while todo:
            name = todo.pop(0)
            if name in self._rules and name not in used:
                used.append(name)
                todo += _references(self._rules[name])
        lines = [f"root ::= {root}"] + [f"{name} ::= {self._rules[name]}" for name in used]
        text = "\n".join(lines) + "\n"
        if len(text) > MAX_GRAMMAR:
            raise InputError(f"The schema makes a grammar of {len(text)} characters; the limit is {MAX_GRAMMAR}.")
        looping = _left_recursive({name: self._rules[name] for name in used})
        if looping is not None:
            raise InputError(
                f"The schema for {looping} refers to itself before any character is written (left recursion):"
                " no grammar can follow it."
            )
        return text

    # --- JSON schemas -------------------------------------------------------------------------------------

    def schema(self, schema: Any, hint: str = "value", *, root: Mapping[str, Any] | None = None) -> str:
        """The rule name for values valid under ``schema`` (as far as a grammar can say)."""
        if root is not None and root is not self._root_schema:
            self._root_schema, self._refs, self._done = root, {}, {}
        elif not self._root_schema and isinstance(schema, Mapping):
            self._root_schema = schema
        done = self._done.get(id(schema))
        if done is not None and done[0] is schema:
            return done[1]
        self._spend(1)
        if self._depth >= MAX_DEPTH:
            raise InputError(f"The schema for {hint} nests deeper than {MAX_DEPTH} levels.")
        self._depth += 1
        try:
            name = self._schema(schema, hint)
        finally:
            self._depth -= 1
        if isinstance(schema, Mapping):
            self._done[id(schema)] = (schema, name)
        return name

    def _spend(self, steps: int) -> None:
        self._steps += steps
        if self._steps > MAX_STEPS:
            raise InputError(f"The schema is too large to constrain generation: over {MAX_STEPS} subschemas.")

    def _schema(self, schema: Any, hint: str) -> str:
        if schema is True or schema == {}:
            return self.primitive("value")
        if schema is False:
            raise InputError(f"The schema for {hint} is false: no value is valid.")
        if not isinstance(schema, Mapping):
            raise InputError(f"The schema for {hint} must be an object, not {type(schema).__name__}.")
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self._ref(ref, hint)
        if "const" in schema:
            return self.rule(hint, gbnf_literal(_json(schema["const"])))
        enum = schema.get("enum")
        if isinstance(enum, list):
            if not enum:
                raise InputError(f"The schema for {hint} has an empty enum: no value is valid.")
            self._spend(len(enum))
            return self.rule(hint, " | ".join(gbnf_literal(_json(v)) for v in enum))
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                if self._choices >= MAX_CHOICES:
                    return self.primitive("value")  # deeper choices are left to the check after generation
                rest = {k: v for k, v in schema.items() if k != key}
                self._choices += 1
                try:
                    names = [
                        self.schema({**rest, **o} if isinstance(o, Mapping) else o, f"{hint}-{i}")
                        for i, o in enumerate(options)
                    ]
                finally:
                    self._choices -= 1
                return self.rule(hint, " | ".join(names))
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of:
            return self.schema(_merge(schema, all_of), hint)
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k in _TYPES]
            if not kinds or self._choices >= MAX_CHOICES:
                return self.primitive("value")
            self._choices += 1
            try:
                names = [self.schema({**schema, "type": k}, f"{hint}-{k}") for k in kinds]
            finally:
                self._choices -= 1
            return self.rule(hint, " | ".join(names))
        if kind is None:
            if "properties" in schema:
                kind = "object"
            elif "items" in schema:
                kind = "array"
            else:
                return self.primitive("value")
        if kind == "object":
            return self._object(schema, hint)
        if kind == "array":
            return self._array(schema, hint)
        if kind == "string":
            return self._string(schema, hint)
        if kind in ("integer", "number", "boolean", "null"):
            return self.primitive(kind)
        raise InputError(f"The schema for {hint} has an unknown type {kind!r}.")

    def _ref(self, ref: str, hint: str) -> str:
        if ref in self._refs:
            return self._refs[ref]
        try:
            target = resolve_ref(self._root_schema, ref, where=f"the schema for {hint}")
        except SchemaError as exc:
            raise InputError(str(exc)) from None
        name = self._fresh(ref.rsplit("/", 1)[-1] or "self")
        self._refs[ref] = name
        self._rules[name] = ""  # reserved while the body is built (recursive schemas)
        body = self.schema(target, name + "-def")
        self._rules[name] = body
        return name

    def _object(self, schema: Mapping[str, Any], hint: str) -> str:
        props = schema.get("properties")
        if not isinstance(props, Mapping) or not props:
            extra = schema.get("additionalProperties")
            if isinstance(extra, Mapping) and extra:
                ws, value = self.primitive("ws"), self.schema(extra, hint + "-value")
                key = self.primitive("string")
                kv = f'{key} {ws} ":" {ws} {value}'
                return self.rule(hint, f'"{{" {ws} ( {kv} ( {ws} "," {ws} {kv} )* )? {ws} "}}"')
            return self.primitive("object")
        required = schema.get("required")
        needed = set(required) if isinstance(required, list) else set()
        ws = self.primitive("ws")
        items = []
        for key, sub in props.items():
            value = self.schema(sub, f"{hint}-{key}")
            items.append((f'{gbnf_literal(_json(str(key)))} {ws} ":" {ws} {value}', key in needed))
        # tail: the keys from i on once a key was written (each after a comma); head: before any was.
        tail = head = ""
        for i in range(len(items) - 1, -1, -1):
            kv, must = items[i]
            step = f'{ws} "," {ws} {kv}'
            new_tail = f"{step} {tail}".strip() if must else f"( {step} )? {tail}".strip()
            first = f"{kv} {tail}".strip()
            new_head = first if must else (f"{first} | {head}" if head else f"( {first} )?")
            tail = self.rule(f"{hint}-tail{i}", new_tail) if i else ""
            head = self.rule(f"{hint}-head{i}", new_head) if i else new_head
        return self.rule(hint, f'"{{" {ws} ( {head} ) {ws} "}}"' if "|" in head else f'"{{" {ws} {head} {ws} "}}"')

    def _array(self, schema: Mapping[str, Any], hint: str) -> str:
        items = schema.get("items")
        item = self.schema(items if items is not None else True, hint + "-item")
        ws = self.primitive("ws")
        min_items, max_items = schema.get("minItems"), schema.get("maxItems")
        low: int = min_items if isinstance(min_items, int) and not isinstance(min_items, bool) else 0
        high: int | None = max_items if isinstance(max_items, int) and not isinstance(max_items, bool) else None
        if high is not None and high < low:
            raise InputError(f"The schema for {hint} has maxItems below minItems.")
        _check_repeat(low, "minItems", hint)
        if high is not None and high > MAX_REPEAT:
            high = None  # left to the check after generation
        if high == 0:
            return self.rule(hint, f'"[" {ws} "]"')
        more = f'( {ws} "," {ws} {item} )'
        rest_low = max(low - 1, 0)
        rest = (
            f"{more}{{{rest_low},{high - 1}}}"
            if high is not None
            else (f"{more}{{{rest_low},}}" if rest_low else f"{more}*")
        )
        body = f"{item} {rest}"
        return self.rule(hint, f'"[" {ws} {body} {ws} "]"' if low else f'"[" {ws} ( {body} )? {ws} "]"')

    def _string(self, schema: Mapping[str, Any], hint: str) -> str:
        if schema.get("format") == "date":
            return self.primitive("date")
        min_length, max_length = schema.get("minLength"), schema.get("maxLength")
        low: int = min_length if isinstance(min_length, int) and not isinstance(min_length, bool) else 0
        high: int | None = max_length if isinstance(max_length, int) and not isinstance(max_length, bool) else None
        _check_repeat(low, "minLength", hint)
        if high is not None and (high > MAX_REPEAT or high < low):
            high = None  # left to the check after generation
        if not low and high is None:
            return self.primitive("string")
        char = self.primitive("char")
        count = f"{{{low},{high}}}" if high is not None else f"{{{low},}}"
        return self.rule(hint, f'"\\"" {char}{count} "\\""')


def _check_repeat(low: int, keyword: str, hint: str) -> None:
    if low > MAX_REPEAT:
        raise InputError(
            f"The schema for {hint} has {keyword} {low}: a grammar repeats at most {MAX_REPEAT} times,"
            " so generation cannot be constrained to it."
        )


_LITERALS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')
_WORDS = re.compile(r"[a-zA-Z0-9-]+")


def _not_chars(chars: Sequence[str]) -> str:
    """A character class for any character but ``chars``."""
    special = {"\\": "\\\\", "]": "\\]", "^": "\\^", "-": "\\-", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return "[^" + "".join(special.get(c, c) for c in dict.fromkeys(chars)) + "]"


def _references(body: str) -> list[str]:
    """The rule names a rule body refers to."""
    return _WORDS.findall(_LITERALS.sub(" ", body))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _merge(schema: Mapping[str, Any], parts: Sequence[Any]) -> dict[str, Any]:
    """allOf of object schemas as one object schema (properties and required keys joined)."""
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    props: dict[str, Any] = dict(merged.get("properties") or {})
    required: list[str] = list(merged.get("required") or [])
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        for key, value in part.items():
            if key == "properties" and isinstance(value, Mapping):
                props.update(value)
            elif key == "required" and isinstance(value, list):
                required += [r for r in value if r not in required]
            elif key not in merged:
                merged[key] = value
    if props:
        merged["properties"] = props
    if required:
        merged["required"] = required
    return merged


# --- left recursion -----------------------------------------------------------------------------------------
# A rule that can reach itself before reading a character never ends: llama.cpp refuses such a grammar. The
# bodies are read back as alternatives of sequences of items (a literal, a character class, a rule name or a
# group, each with its repetition), to find which rules each one can begin with.

_TOKEN = re.compile(
    r'\s*(?:("(?:[^"\\]|\\.)*")|(\[(?:[^\]\\]|\\.)*\])|([a-zA-Z0-9-]+)|([()|])|([?*+]|\{\d+(?:,\d*)?\}))'
)

#: an item: (kind, value, may be absent); kind "lit" (value: its text is empty), "class", "name", "group"
_Item = tuple[str, Any, bool]


def _parse_alternatives(tokens: list[tuple[str, str]], at: int) -> tuple[list[list[_Item]], int]:
    alternatives: list[list[_Item]] = [[]]
    while at < len(tokens):
        kind, text = tokens[at]
        if kind == "op" and text == ")":
            break
        at += 1
        if kind == "op" and text == "|":
            alternatives.append([])
            continue
        item: _Item
        if kind == "op":  # "(": a group
            inner, at = _parse_alternatives(tokens, at)
            at += 1  # its ")"
            item = ("group", inner, False)
        elif kind == "lit":
            item = ("lit", text == '""', False)
        else:
            item = (kind, text, False)
        if at < len(tokens) and tokens[at][0] == "rep":
            rep = tokens[at][1]
            at += 1
            optional = rep in ("?", "*") or rep.startswith(("{0}", "{0,"))
            item = (item[0], item[1], optional)
        alternatives[-1].append(item)
    return alternatives, at


def _tokens(body: str) -> list[tuple[str, str]]:
    out = []
    for match in _TOKEN.finditer(body):
        lit, cls, name, op, rep = match.groups()
        if lit is not None:
            out.append(("lit", lit))
        elif cls is not None:
            out.append(("class", cls))
        elif name is not None:
            out.append(("name", name))
        elif op is not None:
            out.append(("op", op))
        elif rep is not None:
            out.append(("rep", rep))
    return out


def _left_recursive(rules: Mapping[str, str]) -> str | None:
    """A rule of ``rules`` that can begin with itself without reading a character, or None."""
    parsed = {name: _parse_alternatives(_tokens(body), 0)[0] for name, body in rules.items()}
    nullable: set[str] = set()

    def item_nullable(item: _Item) -> bool:
        kind, value, optional = item
        if optional:
            return True
        if kind == "lit":
            return bool(value)
        if kind == "name":
            return value in nullable
        if kind == "group":
            return any(all(item_nullable(i) for i in seq) for seq in value)
        return False

    def names(alternatives: list[list[_Item]]) -> Iterator[str]:
        for seq in alternatives:
            for kind, value, _ in seq:
                if kind == "name":
                    yield value
                elif kind == "group":
                    yield from names(value)

    # which rules can match nothing: a rule is looked at again only when a rule it names has just been found
    # to, so the work is linear in the grammar (passes over every rule until nothing changes were quadratic in
    # a chain of optional properties: 15 s for 1,000 of them)
    users: dict[str, set[str]] = {}
    for name, alternatives in parsed.items():
        for used in names(alternatives):
            users.setdefault(used, set()).add(name)
    unsure = list(parsed)
    while unsure:
        name = unsure.pop()
        if name not in nullable and any(all(item_nullable(i) for i in seq) for seq in parsed[name]):
            nullable.add(name)
            unsure.extend(users.get(name, ()))

    def first_names(alternatives: list[list[_Item]]) -> set[str]:
        found: set[str] = set()
        for seq in alternatives:
            for item in seq:
                if item[0] == "name" and item[1] in parsed:
                    found.add(item[1])
                elif item[0] == "group":
                    found |= first_names(item[1])
                if not item_nullable(item):
                    break
        return found

    edges = {name: first_names(alternatives) for name, alternatives in parsed.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: finished
    for start in edges:
        if start in state:
            continue
        stack = [(start, iter(edges[start]))]
        state[start] = 1
        while stack:
            name, todo = stack[-1]
            nxt = next(todo, None)
            if nxt is None:
                state[name] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return nxt
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(edges[nxt])))
    return None
