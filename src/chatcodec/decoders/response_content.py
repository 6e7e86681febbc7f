"""transformers 5.24's content parsers for response-template regions, and its casts of tool arguments.

The parsers (``text``, ``int``, ``float``, ``bool``, ``json`` with its dialect knobs, ``xml-inline``,
``kv-lines``, ``python-call-list``) and the rule that casts string arguments by a tool's schema are the
format's definition (transformers' ``chat_parsing`` documentation and code); a region parses here to
what it parses to there. A region that does not parse raises ``ValueError``, which the machine turns
into an invalid call.
"""

from __future__ import annotations

import functools
import importlib
import json
import json.scanner
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..exceptions import DecodeError

__all__ = ["PARSERS", "cast_arguments", "content_parser", "parse_content", "regex_module", "tool_params"]

#: transformers 5.24's content parsers; the structured ones parse a region when it closes
PARSERS = ("text", "int", "float", "bool", "json", "xml-inline", "kv-lines", "python-call-list")


def regex_module() -> Any:
    """The ``regex`` module (partial matches, as transformers uses), or a one-line error saying how to get it."""
    try:
        return importlib.import_module("regex")
    except ImportError:
        raise DecodeError(
            "Decoding with a response template needs the regex module (for partial matches of its patterns):"
            " pip install 'chatcodec[response-templates]'."
        ) from None


def parse_content(parser: str, text: str, args: Mapping[str, Any]) -> Any:
    """The value of a region's ``text`` through the content parser ``parser`` with ``args``."""
    if parser == "text":
        return text.strip() if args.get("strip", True) else text
    if parser == "json":
        return _json(text, args)
    if parser == "xml-inline":
        return _xml_inline(text, args)
    if parser == "kv-lines":
        return _kv_lines(text, args)
    if parser == "python-call-list":
        return _python_calls(text)
    stripped = text.strip() if args.get("strip", True) else text
    if parser == "int":
        return int(stripped)
    if parser == "float":
        return float(stripped)
    return stripped.lower() in ("true", "1")


def content_parser(parser: str, args: Mapping[str, Any]) -> Callable[[str], Any]:
    """:func:`parse_content` with ``parser`` and ``args`` fixed: a function of the region's text, with what
    does not depend on the text (which knobs apply, the tag pattern, the value parser) settled once.

    >>> parse = content_parser("json", {"allow_non_json": True})
    >>> parse(' {"a": [1, 2]} '), parse(" hi ")
    ({'a': [1, 2]}, 'hi')
    """
    if parser == "json":
        return _json_reader(args)
    if parser == "xml-inline" and not isinstance(args["tag_pattern"], str):
        return _xml_reader(args)
    if parser == "text":
        return str.strip if args.get("strip", True) else _same_text
    return lambda text: parse_content(parser, text, args)


def _same_text(text: str) -> str:
    return text


#: the C scanner ``json.loads`` runs, called directly: the value at a position and where it ends
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


_NOT_JSON = object()


def _scanned(otherwise: Callable[[str], Any], text: str) -> Any:
    """``json.loads(text)``, or ``otherwise(text)`` when ``text`` is not one JSON value (a text that cannot start
    one is known by its first character, without the parser). ``otherwise`` is a C function where it can be
    (``str.strip``), so that a region's parse is one Python call."""
    rest = text.lstrip(_JSON_SPACE)
    if rest[:1] in _JSON_STARTS:
        try:
            value, end = _scan_json(text, len(text) - len(rest))
        except (json.JSONDecodeError, StopIteration):  # what json.loads reports as a JSONDecodeError
            return otherwise(text)
        if end == len(text) or not text[end:].lstrip(_JSON_SPACE):  # else json.loads' "Extra data"
            return value
    return otherwise(text)


def _not_json(text: str) -> Any:
    return _NOT_JSON


def _not_json_error(text: str) -> Any:
    raise ValueError(f"the region is not JSON: {text[:60]!r}")


#: ``json.loads(text)``, or :data:`_NOT_JSON`
_loaded = functools.partial(_scanned, _not_json)
#: the ``json`` parser with no knobs: the region's one JSON value
_strict_json = functools.partial(_scanned, _not_json_error)


def _json_reader(args: Mapping[str, Any]) -> Callable[[str], Any]:
    """The ``json`` parser of ``args``: :func:`_json` with its delimiter expressions compiled once and
    ``json.loads``' own scan called without its wrappers. Arguments it does not read as pairs of strings
    are left to :func:`_json`, which fails on them as it always has, when a region is parsed."""
    delims = args.get("string_delims") or []
    pairs = list(delims) if isinstance(delims, list | tuple) else None
    if pairs is None or not all(
        isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(d, str) for d in pair) for pair in pairs
    ):
        return lambda text: _json(text, args)
    subs = [re.compile(re.escape(open_d) + r"(.*?)" + re.escape(close_d), re.DOTALL) for open_d, close_d in pairs]
    unquoted = bool(args.get("unquoted_keys"))
    allow_non_json, strip = bool(args.get("allow_non_json")), bool(args.get("strip", True))
    if not subs and not unquoted:  # the scan alone, then what a text that is not JSON gives
        if not allow_non_json:
            return _strict_json
        return functools.partial(_scanned, str.strip if strip else _same_text)

    def parse(text: str) -> Any:
        working = text
        if subs:
            if _OPEN_MARK in text or _CLOSE_MARK in text:
                raise ValueError("the text holds the characters \\x01 or \\x02 that string_delims reserves")
            saved: list[str] = []

            def keep(m: re.Match[str]) -> str:
                saved.append(m.group(1))
                return f"{_OPEN_MARK}{len(saved) - 1}{_CLOSE_MARK}"

            for pattern in subs:
                working = pattern.sub(keep, working)
        if unquoted:
            working = _BARE_KEY.sub(_quoted_key, working)
        if subs:
            for i, kept in enumerate(saved):
                working = working.replace(f"{_OPEN_MARK}{i}{_CLOSE_MARK}", json.dumps(kept))
        value = _loaded(working)
        if value is not _NOT_JSON:
            return value
        if allow_non_json:
            return text.strip() if strip else text
        raise ValueError(f"the region is not JSON: {text[:60]!r}")

    return parse


def _quoted_key(m: re.Match[str]) -> str:
    return m.group(0) if m.group(2) is None else f'{m.group(1)}"{m.group(2)}"{m.group(3)}:'


def _xml_reader(args: Mapping[str, Any]) -> Callable[[str], dict[str, Any]]:
    """The ``xml-inline`` parser of a compiled ``tag_pattern``: :func:`_xml_inline` with its value parser
    and the pattern's groups looked up once."""
    pattern = args["tag_pattern"]
    merge = bool(args.get("merge_duplicates"))
    value_parser = args.get("value_parser")
    sub = _value_parser(value_parser) if isinstance(value_parser, Mapping) else None
    if "key" not in pattern.groupindex or "value" not in pattern.groupindex or merge:
        return lambda text: _xml_inline(text, args)

    def parse(text: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for m in pattern.finditer(text):
            key, raw = m.group("key", "value")
            if key is None:
                raise ValueError("the tag_pattern has no group named 'key'")
            raw = raw or ""
            out[key] = raw if sub is None else sub(raw)
        return out

    return parse


def _value_parser(spec: Mapping[str, Any]) -> Callable[[str], Any]:
    """What :func:`_sub` does with a ``value_parser`` spec, settled once when it is plain (else :func:`_sub`
    itself, its errors at parse time as before)."""
    name, args = spec.get("name", "text"), spec.get("args", {})
    if isinstance(args, Mapping) and name in ("text", "json") and not (set(args) - {"strip", "allow_non_json"}):
        return content_parser(name, args)
    return lambda raw: _sub(raw, spec)


_OPEN_MARK, _CLOSE_MARK = "\x01", "\x02"
#: what ``json.loads`` skips before a value, and the characters a value can start with (NaN and Infinity too)
_JSON_SPACE = " \t\n\r"
_JSON_STARTS = frozenset('{["-0123456789tfnNI')
_BARE_KEY = re.compile(r'"(?:\\.|[^"\\])*"|(?<=[{,])(\s*)(\w+)(\s*):')


def _json(text: str, args: Mapping[str, Any]) -> Any:
    delims = args.get("string_delims") or []
    working = text
    saved: list[str] = []
    if delims and (_OPEN_MARK in text or _CLOSE_MARK in text):
        raise ValueError("the text holds the characters \\x01 or \\x02 that string_delims reserves")
    for open_d, close_d in delims:

        def keep(m: re.Match[str]) -> str:
            saved.append(m.group(1))
            return f"{_OPEN_MARK}{len(saved) - 1}{_CLOSE_MARK}"

        working = re.sub(re.escape(open_d) + r"(.*?)" + re.escape(close_d), keep, working, flags=re.DOTALL)
    if args.get("unquoted_keys"):
        working = _BARE_KEY.sub(
            lambda m: m.group(0) if m.group(2) is None else f'{m.group(1)}"{m.group(2)}"{m.group(3)}:', working
        )
    for i, s in enumerate(saved):
        working = working.replace(f"{_OPEN_MARK}{i}{_CLOSE_MARK}", json.dumps(s))
    if working.lstrip(_JSON_SPACE)[:1] in _JSON_STARTS:  # else plain text, known without the parser
        try:
            return json.loads(working)
        except json.JSONDecodeError:
            pass
    if args.get("allow_non_json"):
        return text.strip() if args.get("strip", True) else text
    raise ValueError(f"the region is not JSON: {text[:60]!r}")


def _sub(raw: str, value_parser: Any) -> Any:
    if not isinstance(value_parser, Mapping):
        return raw
    return parse_content(str(value_parser.get("name", "text")), raw, value_parser.get("args", {}))


def _xml_inline(text: str, args: Mapping[str, Any]) -> dict[str, Any]:
    merge = bool(args.get("merge_duplicates"))
    out: dict[str, Any] = {}
    merged: set[str] = set()
    pattern = args["tag_pattern"]
    if isinstance(pattern, str):
        pattern = regex_module().compile(pattern, regex_module().DOTALL)
    for m in pattern.finditer(text):
        groups = m.groupdict()
        key = groups.get("key")
        if key is None:
            raise ValueError("the tag_pattern has no group named 'key'")
        value = _sub(groups.get("value") or "", args.get("value_parser"))
        if key in out and merge:
            if key not in merged:
                out[key] = [out[key]]
                merged.add(key)
            out[key].append(value)
        else:
            out[key] = value
    return out


def _kv_lines(text: str, args: Mapping[str, Any]) -> dict[str, Any]:
    strip = args.get("strip", True)
    kv_sep = args.get("kv_sep", ":")
    out: dict[str, Any] = {}
    for line in text.split(args.get("line_sep", "\n")):
        line = line.strip() if strip else line
        if not line or kv_sep not in line:
            continue
        key, value = line.split(kv_sep, 1)
        if strip:
            key, value = key.strip(), value.strip()
        out[key] = _sub(value, args.get("value_parser"))
    return out


_PY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[-.][A-Za-z0-9_]+)*")
_PY_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_PY_STRING = re.compile(r"""'((?:[^'\\\n\r]|\\.)*)'|"((?:[^"\\\n\r]|\\.)*)\"""", re.DOTALL)
_PY_CONSTANTS = {"True": True, "true": True, "False": False, "false": False, "None": None, "null": None}
_PY_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _python_calls(text: str) -> list[dict[str, Any]]:
    """transformers' strict ``python-call-list`` grammar: ``[f(a="x"), g()]``, keyword arguments of
    Python or JSON literals."""
    reader = _CallList(text)
    calls = reader.items("[", "]", reader.call)
    reader.space()
    if reader.at < len(text):
        raise ValueError("unexpected text after the closing ']'")
    return calls


class _CallList:
    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def space(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t\n\r":
            self.at += 1

    def peek(self, char: str) -> bool:
        self.space()
        return self.text.startswith(char, self.at)

    def expect(self, char: str) -> None:
        if not self.peek(char):
            raise ValueError(f"expected {char!r} at position {self.at}")
        self.at += 1

    def items(self, open_c: str, close_c: str, item: Any) -> list[Any]:
        self.expect(open_c)
        out: list[Any] = []
        if self.peek(close_c):
            self.at += 1
            return out
        while True:
            out.append(item())
            if self.peek(close_c):
                self.at += 1
                return out
            self.expect(",")

    def name(self) -> str:
        self.space()
        m = _PY_NAME.match(self.text, self.at)
        if m is None:
            raise ValueError(f"expected a name at position {self.at}")
        self.at = m.end()
        return m.group()

    def call(self) -> dict[str, Any]:
        name = self.name()

        def argument() -> tuple[str, Any]:
            key = self.name()
            self.expect("=")
            return key, self.value(0)

        return {"name": name, "arguments": _unique(self.items("(", ")", argument))}

    def string(self) -> str:
        m = _PY_STRING.match(self.text, self.at)
        if m is None:
            raise ValueError(f"invalid string at position {self.at}")
        self.at = m.end()
        body = m.group(1) if m.group(1) is not None else m.group(2)
        out, i = [], 0
        while (j := body.find("\\", i)) >= 0:
            out.append(body[i:j])
            code = body[j + 1]
            if code in _PY_ESCAPES:
                out.append(_PY_ESCAPES[code])
                i = j + 2
            elif code == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[j + 2 : j + 6]):
                out.append(chr(int(body[j + 2 : j + 6], 16)))
                i = j + 6
            else:
                raise ValueError(f"unsupported escape \\{code}")
        return "".join(out) + body[i:]

    def value(self, depth: int) -> Any:
        if self.peek("'") or self.peek('"'):
            return self.string()
        if self.peek("["):
            if depth >= 100:
                raise ValueError("lists and dicts nested too deeply")
            return self.items("[", "]", lambda: self.value(depth + 1))
        if self.peek("{"):
            if depth >= 100:
                raise ValueError("lists and dicts nested too deeply")
            return _unique(self.items("{", "}", lambda: self.pair(depth + 1)))
        m = _PY_NUMBER.match(self.text, self.at)
        if m is not None:
            self.at = m.end()
            whole = m.group(1) is None and m.group(2) is None
            if whole and (len(m.group()) > 17 or abs(int(m.group())) > 2**53 - 1):
                raise ValueError("an integer outside the range of -(2^53 - 1) to 2^53 - 1")
            return int(m.group()) if whole else float(m.group())
        m = _PY_NAME.match(self.text, self.at)
        if m is not None and m.group() in _PY_CONSTANTS:
            self.at = m.end()
            return _PY_CONSTANTS[m.group()]
        raise ValueError(f"expected a value at position {self.at}")

    def pair(self, depth: int) -> tuple[str, Any]:
        if not (self.peek("'") or self.peek('"')):
            raise ValueError("dict keys must be strings")
        key = self.string()
        self.expect(":")
        return key, self.value(depth)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"repeated name {key!r}")
        out[key] = value
    return out


# -- casting arguments by the tools' schemas (transformers' rules) -------------------------------------------


#: the parameter types :func:`_cast` reads a string as; a parameter of none of them (a string, an enum of
#: strings, an untyped one) is never changed by casting, so it is not listed at all
_CASTS = frozenset({"integer", "number", "boolean", "null", "object", "array"})


def tool_params(tools: Iterable[Any] | None) -> dict[str, Mapping[str, tuple[str, ...]]]:
    """Each tool's parameter types by name (``{tool: {parameter: types}}``), read from its schema once, so
    that casting a call's arguments looks nothing up in the schema again. Only the parameters casting can
    change are listed: a tool whose entry is empty casts nothing, and a call to it is not copied.

    >>> tool_params([{"name": "f", "parameters": {"properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}}])
    {'f': {'n': ('integer',)}}
    """
    found: dict[str, Mapping[str, tuple[str, ...]]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, Mapping) else None
            typed = {key: _types(schema) for key, schema in props.items()} if isinstance(props, Mapping) else {}
            found[fn["name"]] = {key: types for key, types in typed.items() if _CASTS.intersection(types)}
    return found


def _types(schema: Any) -> tuple[str, ...]:
    if not isinstance(schema, Mapping):
        return ()
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else [t for t in declared or () if isinstance(t, str)]
    for union in ("anyOf", "oneOf"):
        for choice in schema.get(union) or ():
            types.extend(_types(choice))
    if schema.get("nullable") and "null" not in types:
        types.append("null")
    return tuple(types)


def cast_arguments(arguments: dict[str, Any], types: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """String arguments cast to their parameter's types (the first type that reads them), as transformers
    casts; ``types`` is one tool's entry of :func:`tool_params`."""
    out = dict(arguments)
    for key, value in arguments.items():
        kinds = types.get(key)
        if not kinds:
            continue
        if isinstance(value, str):
            out[key] = _cast(value, kinds)
        elif isinstance(value, list) and "array" not in kinds:
            out[key] = [_cast(v, kinds) if isinstance(v, str) else v for v in value]
    return out


def _cast(raw: str, types: Sequence[str]) -> Any:
    for kind in types:
        try:
            if kind == "integer":
                try:
                    return int(raw)
                except ValueError:
                    number = float(raw)
                    if number.is_integer():
                        return int(number)
                    continue
            if kind == "number":
                number = float(raw)
                if number != number or number in (float("inf"), float("-inf")):
                    continue
                return int(number) if number.is_integer() and "." not in raw else number
            if kind == "boolean" and raw.strip().lower() in ("true", "1", "false", "0"):
                return raw.strip().lower() in ("true", "1")
            if kind == "null" and raw.strip() in ("null", "None"):
                return None
            if kind in ("object", "array"):
                decoded = json.loads(raw)
                if isinstance(decoded, dict if kind == "object" else list):
                    return decoded
        except (ValueError, OverflowError):
            continue
    return raw
