"""Forced tool calls that finish on any CPU, and cut ones that never do.

llama.cpp's floating-point results depend on the CPU's SIMD paths, so what the embedded model samples (and, at a
near tie, what it picks greedily) differs between machines: a test cannot count on the model writing a short call.
It can count on the grammar. Under the grammar of a forced call every generated token is at least one byte of the
call's text (llama.cpp's grammar refuses empty pieces) and the end token is allowed only once the call is whole, so:

- a forced call finishes within ``max_tokens`` when ``max_tokens`` >= :func:`longest` (the longest text the grammar
  admits, in UTF-8 bytes) + 1 (the end token, which the embedded engine counts);
- a forced call is cut whatever the CPU when ``max_tokens`` < :func:`fewest_tokens` (the fewest tokens of the
  vocabulary that write any whole call).

:func:`longest` is finite only when every string is bounded: the tools here take enums (``typing.Literal``) for
their strings. Parallel calls (``parallel_tool_calls``, Anthropic's ``disable_parallel_tool_use``) let the model
write call after call, so a forced call is bounded only with one call at a time (a named tool choice is).
tests/server/test_constrain.py checks :data:`CALL_TOKENS`, :data:`CITY_TOKENS` and :data:`CUT_TOKENS` against the
grammars the server builds.

This file is also a tools module for the command line (``chatcodec rollout tests/forced.py``, ``chatcodec tools run
tests/forced.py``): :data:`TOOLS` are examples/temperature.py's two functions with bounded arguments.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

#: the places the tests' prompts ask about
Location = Literal["San Francisco, CA, USA", "Paris, France", "Rome, Italy", "Oslo, Norway", "Lima, Peru"]
#: the days examples/temperature.py's question asks about ("now" and "tomorrow", its current date 2024-09-30)
Day = Literal["2024-09-30", "2024-10-01"]
Unit = Literal["celsius", "fahrenheit"]

#: max_tokens for one forced call of :data:`TOOLS` or :func:`get_weather`, one call at a time: the longest call the
#: grammar admits is 164 bytes (get_temperature_date, San Francisco, fahrenheit), then the end token
CALL_TOKENS = 176
#: an answer as JSON for a schema: a city of at most 24 characters and its population
CITY: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
#: max_tokens for an answer for :data:`CITY`: 24 characters of at most 6 bytes (an escape) and an integer of at
#: most 17 make the longest answer 194 bytes, then the end token
CITY_TOKENS = 195
#: max_tokens that cuts any forced call of the seed's tools (tests/server/conftest.py's temperature_tools(), strings
#: free): a whole call takes at least 23 tokens, and 14 tokens are at least the 14 bytes of '{ "tool_calls"'
CUT_TOKENS = 14


@cache
def _example() -> Any:
    path = Path(__file__).resolve().parents[1] / "examples" / "temperature.py"
    spec = importlib.util.spec_from_file_location("temperature_forced", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_current_temperature(location: Location, unit: Unit = "celsius") -> dict[str, Any]:
    result: dict[str, Any] = _example().get_current_temperature(location, unit)
    return result


def get_temperature_date(location: Location, date: Day, unit: Unit = "celsius") -> dict[str, Any]:
    result: dict[str, Any] = _example().get_temperature_date(location, date, unit)
    return result


# the example's own docstrings, which the tools' schemas are read from: only the argument types differ
get_current_temperature.__doc__ = _example().get_current_temperature.__doc__
get_temperature_date.__doc__ = _example().get_temperature_date.__doc__

#: examples/temperature.py's functions, every argument an enum
TOOLS: list[Callable[..., Any]] = [get_current_temperature, get_temperature_date]


def get_weather(location: Location) -> str:
    """The weather in a place.

    Args:
        location: The place.
    """
    return f"Sunny in {location}."


def temperature_tools() -> list[dict[str, Any]]:
    """:data:`TOOLS` as OpenAI tool dicts."""
    from chatcodec import tool_schema

    return [tool_schema(function) for function in TOOLS]


def weather_parameters() -> dict[str, Any]:
    """The parameters of :func:`get_weather`: a location, one of :data:`Location`."""
    from chatcodec import tool_schema

    parameters: dict[str, Any] = tool_schema(get_weather)["function"]["parameters"]
    return parameters


# --- bounds of a GBNF grammar ------------------------------------------------------------------------------
# The grammars chatcodec builds (chatcodec.server.grammar) are read back as rules of alternatives of sequences of
# items: a literal, a character class, a rule name or a group, each repeated {low, high} times (high None: no
# bound).

_TOKEN = re.compile(
    r'\s*(?:("(?:[^"\\]|\\.)*")|(\[(?:[^\]\\]|\\.)*\])|([a-zA-Z0-9-]+)|([()|])|([?*+]|\{\d+(?:,\d*)?\}))'
)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "]": "]", "[": "[", "-": "-", "^": "^", "/": "/"}

Item = tuple[str, Any, int, "int | None"]  # kind, value, low, high


def _unescape(text: str) -> list[tuple[str, bool]]:
    """The characters of a literal's or a class's inside, each with whether it was escaped."""
    out, at = [], 0
    while at < len(text):
        if text[at] != "\\":
            out.append((text[at], False))
            at += 1
        elif text[at + 1] in "xu":
            size = 2 if text[at + 1] == "x" else 4
            out.append((chr(int(text[at + 2 : at + 2 + size], 16)), True))
            at += 2 + size
        else:
            out.append((_ESCAPES[text[at + 1]], True))
            at += 2
    return out


def _class(text: str) -> tuple[bool, list[tuple[int, int]]]:
    """A character class: whether it is negated, and its ranges of code points."""
    chars = _unescape(text[1:-1])
    negated = bool(chars) and chars[0] == ("^", False)
    if negated:
        chars = chars[1:]
    ranges, at = [], 0
    while at < len(chars):
        if at + 2 < len(chars) and chars[at + 1] == ("-", False):
            ranges.append((ord(chars[at][0]), ord(chars[at + 2][0])))
            at += 3
        else:
            ranges.append((ord(chars[at][0]), ord(chars[at][0])))
            at += 1
    return negated, ranges


def _alternatives(tokens: list[tuple[str, str]], at: int) -> tuple[list[list[Item]], int]:
    alternatives: list[list[Item]] = [[]]
    while at < len(tokens) and tokens[at] != ("op", ")"):
        kind, text = tokens[at]
        at += 1
        if (kind, text) == ("op", "|"):
            alternatives.append([])
            continue
        value: Any
        if (kind, text) == ("op", "("):
            value, at = _alternatives(tokens, at)
            kind, at = "group", at + 1
        elif kind == "lit":
            value = "".join(char for char, _ in _unescape(text[1:-1]))
        elif kind == "class":
            value = _class(text)
        else:
            value = text
        low: int = 1
        high: int | None = 1
        if at < len(tokens) and tokens[at][0] == "rep":
            rep = tokens[at][1]
            at += 1
            if rep in "?*+":
                low, high = (0 if rep != "+" else 1), (1 if rep == "?" else None)
            else:
                bounds = rep[1:-1].split(",")
                low = int(bounds[0])
                high = low if len(bounds) == 1 else (int(bounds[1]) if bounds[1] else None)
        alternatives[-1].append((kind, value, low, high))
    return alternatives, at


def parse(grammar: str) -> dict[str, list[list[Item]]]:
    """The rules of ``grammar``, one ``name ::= body`` a line."""
    rules = {}
    for line in grammar.splitlines():
        if not line.strip():
            continue
        name, body = line.split(" ::= ", 1)
        tokens = []
        for match in _TOKEN.finditer(body):
            lit, cls, word, op, rep = match.groups()
            tokens += [(k, t) for k, t in (("lit", lit), ("class", cls), ("name", word), ("op", op), ("rep", rep)) if t]
        rules[name.strip()], _ = _alternatives(tokens, 0)
    return rules


def _widest(negated: bool, ranges: Sequence[tuple[int, int]]) -> int:
    """The most UTF-8 bytes one character of a class takes."""
    if negated:
        return 4
    return max(len(chr(high).encode("utf-8", "surrogatepass")) for _, high in ranges)


def longest(grammar: str) -> float:
    """The most UTF-8 bytes of any text ``grammar`` admits (``math.inf`` when there is no bound)."""
    rules = parse(grammar)
    done: dict[str, float] = {}
    busy: set[str] = set()

    def rule(name: str) -> float:
        if name in busy:
            return math.inf  # a rule inside itself: as deep as the model likes
        if name not in done:
            busy.add(name)
            done[name] = alternatives(rules[name])
            busy.discard(name)
        return done[name]

    def alternatives(options: Iterable[Sequence[Item]]) -> float:
        return max(sum((item(i) for i in seq), 0.0) for seq in options)

    def item(entry: Item) -> float:
        kind, value, _, high = entry
        one = (
            float(len(value.encode("utf-8")))
            if kind == "lit"
            else float(_widest(*value))
            if kind == "class"
            else rule(value)
            if kind == "name"
            else alternatives(value)
        )
        if one == 0:
            return 0.0
        return math.inf if high is None else one * high

    return rule("root")


# The fewest tokens: the grammar as an automaton over bytes (a character class taking more bytes than it does, so
# that the count is never more than the true one), walked a token of the vocabulary at a time, breadth first.

_State = int


class _Bytes:
    """A nondeterministic automaton over bytes: ``moves[state]`` is a list of (byte set, next state), ``free[state]``
    the states reached reading nothing."""

    def __init__(self) -> None:
        self.moves: list[list[tuple[frozenset[int], _State]]] = []
        self.free: list[list[_State]] = []

    def state(self) -> _State:
        self.moves.append([])
        self.free.append([])
        return len(self.moves) - 1

    def closure(self, states: Iterable[_State]) -> frozenset[_State]:
        seen = set(states)
        todo = list(seen)
        while todo:
            for nxt in self.free[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)


_CONTINUATION = frozenset(range(0x80, 0xC0))
_LEADS = frozenset(range(0xC0, 0x100))


def _automaton(grammar: str) -> tuple[_Bytes, _State, _State]:
    rules = parse(grammar)
    nfa = _Bytes()
    busy: set[str] = set()

    def chars(start: _State, negated: bool, ranges: Sequence[tuple[int, int]]) -> _State:
        end = nfa.state()
        inside = [any(low <= c <= high for low, high in ranges) for c in range(128)]
        ascii_ = frozenset(c for c in range(128) if inside[c] != negated)
        if ascii_:
            nfa.moves[start].append((ascii_, end))
        if negated or any(high >= 128 for _, high in ranges):  # any character past ASCII: 2 to 4 bytes
            lead, one, two = nfa.state(), nfa.state(), nfa.state()
            nfa.moves[start].append((_LEADS, lead))
            nfa.moves[lead].append((_CONTINUATION, one))
            nfa.moves[one].append((_CONTINUATION, two))
            nfa.moves[two].append((_CONTINUATION, end))
            nfa.free[one].append(end)
            nfa.free[two].append(end)
        return end

    def once(start: _State, kind: str, value: Any) -> _State:
        if kind == "lit":
            for byte in value.encode("utf-8"):
                nxt = nfa.state()
                nfa.moves[start].append((frozenset((byte,)), nxt))
                start = nxt
            return start
        if kind == "class":
            return chars(start, *value)
        if kind == "name":
            if value in busy:
                raise ValueError(f"the rule {value} refers to itself: count its tokens another way")
            busy.add(value)
            try:
                return alternatives(start, rules[value])
            finally:
                busy.discard(value)
        return alternatives(start, value)

    def alternatives(start: _State, options: Sequence[Sequence[Item]]) -> _State:
        end = nfa.state()
        for seq in options:
            at = start
            for kind, value, low, high in seq:
                for _ in range(low):
                    at = once(at, kind, value)
                if high is None:
                    loop = nfa.state()
                    nfa.free[at].append(loop)
                    back = once(loop, kind, value)
                    nfa.free[back].append(loop)
                    at = loop
                else:
                    for _ in range(high - low):
                        nxt = once(at, kind, value)
                        nfa.free[at].append(nxt)
                        at = nxt
            nfa.free[at].append(end)
        return end

    start = nfa.state()
    return nfa, start, alternatives(start, rules["root"])


def fewest_tokens(grammar: str, pieces: Sequence[bytes]) -> int:
    """The fewest of ``pieces`` (the vocabulary's tokens as text, the end-of-generation ones left out) that write a
    whole text of ``grammar``: fewer tokens never finish it, whatever the model picks."""
    nfa, start, end = _automaton(grammar)
    steps: dict[tuple[frozenset[_State], int], frozenset[_State]] = {}

    def step(states: frozenset[_State], byte: int) -> frozenset[_State]:
        key = (states, byte)
        found = steps.get(key)
        if found is None:
            found = nfa.closure(nxt for s in states for allowed, nxt in nfa.moves[s] if byte in allowed)
            steps[key] = found
        return found

    by_first: dict[int, list[bytes]] = {}
    for piece in pieces:
        if piece:
            by_first.setdefault(piece[0], []).append(piece)
    level = {nfa.closure([start])}
    seen = set(level)
    count = 0
    while level:
        if any(end in states for states in level):
            return count
        reached: set[frozenset[_State]] = set()
        for states in level:
            firsts = {b for s in states for allowed, _ in nfa.moves[s] for b in allowed if b in by_first}
            for first in firsts:
                for piece in by_first[first]:
                    at = states
                    for byte in piece:
                        at = step(at, byte)
                        if not at:
                            break
                    if at and at not in seen:
                        seen.add(at)
                        reached.add(at)
        level = reached
        count += 1
    raise ValueError("no text of the grammar can be written with these tokens")


def pieces(llama: Any) -> list[bytes]:
    """The text of each token of ``llama``'s vocabulary (a ``llama_cpp.Llama``) as llama.cpp's grammar reads it,
    the end-of-generation tokens left out."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    return [
        llama.detokenize([i], special=True)
        for i in range(llama.n_vocab())
        if not llama_cpp.llama_vocab_is_eog(vocab, i)
    ]
