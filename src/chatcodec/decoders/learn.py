"""Learn a tool-call format from a template's own renders, when no catalog format reads them back.

The template renders assistant turns that make probe calls, varied one thing at a time: one call,
the same call under another name, a call with two arguments (a string and a number), two calls, a
call without arguments. Each render is cut down to the text the calls add (its *window*), and the
probe's names and ids are replaced by placeholders. What is left is the format's syntax:

- where the arguments are a JSON object (or a Python dict), either inside a bigger JSON object that
  also holds the name (``{"function": NAME, "params": {...}}``: which keys hold what), or after a
  header that holds the name (``<call name="NAME">{...}</call>``);
- otherwise, keys and values written one by one (``<arg:KEY>VALUE</arg>``), or as Python keyword
  arguments (``NAME(key="value")``);
- comparing one call with two gives the per-call markers, the separator and any section around them.

The markers then configure a family machine (:mod:`.tagged_json`, :mod:`.xml_args`,
:mod:`.pythonic`), so a learned format streams exactly like a catalog one. Before it is used, the
learned format must decode every probe window back to its calls.

A template that never renders past calls may still describe the format in its tool instructions
(``{"name": <function-name>, "arguments": <args-json-object>}`` between tags): :func:`from_instructions`
reads that example.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Sink
from .format import Decoder, Format
from .jsonstream import CallKeys
from .machine import MachineBase, Options, ThinkSpec
from .pythonic import PythonicMachine
from .registry import make_decoder
from .tagged_json import Block, JsonMachine, JsonSpec
from .values import py_literal_json, valid_name
from .xml_args import XmlMachine, XmlSpec

__all__ = ["LEARN_TOOLS", "Learned", "from_instructions", "learn"]

NAME_A, NAME_B = "get_weather", "get_time"
KEY_1, KEY_2 = "city", "days"
VALUE_A, VALUE_B, NUMBER = "Paris", "Tokyo", 3
ID_A, ID_B = "a1b2c3d4e", "f5g6h7i8j"
LEARN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    KEY_1: {"type": "string", "description": "The city name."},
                    KEY_2: {"type": "integer", "description": "How many days."},
                },
                "required": [KEY_1],
            },
        },
    }
    for name, description in ((NAME_A, "Get the weather in a city."), (NAME_B, "Get the time in a city."))
]
#: stand-ins for the probe's names and ids once a window is normalized
NAME, ID = "@@NAME@@", "@@ID@@"

Call = tuple[str, dict[str, Any], str]  # name, arguments, id
#: the probe turns: (what varies, the calls)
PROBES: dict[str, list[Call]] = {
    "one": [(NAME_A, {KEY_1: VALUE_A}, ID_A)],
    "other_name": [(NAME_B, {KEY_1: VALUE_A}, ID_A)],
    "two_args": [(NAME_A, {KEY_1: VALUE_A, KEY_2: NUMBER}, ID_A)],
    "two_calls": [(NAME_A, {KEY_1: VALUE_A}, ID_A), (NAME_B, {KEY_1: VALUE_B}, ID_B)],
    "no_args": [(NAME_A, {}, ID_A)],
}

Render = Callable[..., "str | None"]


@dataclass(frozen=True, slots=True)
class Learned:
    """A learned format and what it was learned from (the probe windows, or the instructions)."""

    format: Format
    evidence: str


# -- windows ---------------------------------------------------------------------------------------


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _open_tag_start(text: str, end: int) -> int:
    """``end``, moved back to the start of a tag that is still open there (``<tool_`` of ``<tool_call>``)."""
    for opener, closer in (("<", ">"), ("[", "]")):
        k = text.rfind(opener, max(0, end - 64), end)
        if k >= 0 and text.find(closer, k, end) < 0:
            end = min(end, k)
    return end


def _open_tag_end(text: str, start: int) -> int:
    """``start``, moved forward past the end of a tag that is open there (``<|END_ACTION`` of ``|>``)."""
    for opener, closer in (("<", ">"), ("[", "]")):
        k = text.rfind(opener, max(0, start - 64), start)
        if k >= 0 and text.find(closer, k, start) < 0:
            end = text.find(closer, start, start + 64)
            if end >= 0:
                start = max(start, end + 1)
    return start


def window(with_calls: str, without: str, suffix: bool = True) -> str:
    """The text of ``with_calls`` after the part it shares with ``without`` (and, with ``suffix``,
    before the end they share).

    The cut never falls inside a tag: markers the two renders happen to share a part of stay whole.
    """
    p = _open_tag_start(with_calls, _common_prefix(with_calls, without))
    s = _common_prefix(with_calls[p:][::-1], without[p:][::-1]) if suffix else 0
    return with_calls[p : _open_tag_end(with_calls, len(with_calls) - s)]


def _message(calls: list[Call], content: str | None, as_text: bool) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args) if as_text else args},
            }
            for name, args, call_id in calls
        ],
    }


def _strip_stops(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the first end-of-turn marker after the calls: where a model would stop."""
    anchor = max(text.rfind(word) for word in (NAME_A, NAME_B, KEY_1, KEY_2, VALUE_A, VALUE_B))
    ends = [k for k in (text.find(stop, anchor) for stop in stops if stop) if k >= 0]
    return text[: min(ends)].rstrip() if ends else text


def probe_windows(render: Render, user: dict[str, Any], stops: Sequence[str] = ()) -> dict[str, str]:
    """The window of each probe turn that renders and shows its calls (``"one"`` always, if any).

    A window is what the model would write after the generation prompt to make those calls: the turn
    as the template renders it, from where it leaves the generation prompt, without the end-of-turn
    markers ``stops``. Where the history turn does not extend the generation prompt at all, the
    window is what the calls add to a turn without them.
    """
    found: dict[str, str] = {}
    prompt = render([user], add_generation_prompt=True)
    for content in ("", None, "Checking."):
        for as_text in (False, True):
            one = render([user, _message(PROBES["one"], content, as_text)])
            if one is None:
                continue
            base = prompt
            if base is None or len(base) - _common_prefix(base, one) > 64 or NAME_A not in window(one, base, False):
                # the history turn does not continue the generation prompt: compare with a turn without calls
                base = render([user, {"role": "assistant", "content": content or ""}])
            if base is None:
                continue
            suffix = base is not prompt
            if NAME_A not in window(one, base, suffix):
                continue
            for probe, calls in PROBES.items():
                text = render([user, _message(calls, content, as_text)])
                if text is not None:
                    cut = _strip_stops(window(text, base, suffix), stops)
                    if all(name in cut for name, _, _ in calls) and (probe != "two_args" or KEY_2 in cut):
                        found[probe] = cut
            return found
    return found


def normalize(text: str) -> str:
    """The window with the probe's names and ids replaced by placeholders."""
    for name in (NAME_A, NAME_B):
        text = text.replace(name, NAME)
    for call_id in (ID_A, ID_B):
        text = text.replace(call_id, ID)
    return text


# -- reading the arguments ---------------------------------------------------------------------------

_decoder = json.JSONDecoder()


def _balanced_end(text: str, i: int) -> int:
    """The end of the bracketed value at ``text[i]``, skipping quoted strings; -1 if it never closes."""
    depth, quote, k = 0, "", i
    while k < len(text):
        c = text[k]
        if quote:
            if c == "\\":
                k += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return k + 1
        k += 1
    return -1


def objects(text: str) -> list[tuple[int, int, Any]]:
    """Every JSON object (or Python dict) in ``text``: ``(start, end, value)``, in order of start."""
    found: list[tuple[int, int, Any]] = []
    start = text.find("{")
    while start >= 0 and len(found) < 64:
        try:
            value, end = _decoder.raw_decode(text, start)
        except ValueError:
            end = _balanced_end(text, start)
            converted = py_literal_json(text[start:end]) if end > 0 else None
            value = json.loads(converted) if converted is not None else None
        if isinstance(value, dict):
            found.append((start, end, value))
        start = text.find("{", start + 1)
    return found


def _args_value(value: Any) -> Any:
    """Arguments as a template writes them: an object, or a JSON string holding one."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


# -- markers from one call and from two -----------------------------------------------------------


def _common_suffix(a: str, b: str) -> str:
    n = _common_prefix(a[::-1], b[::-1])
    return a[len(a) - n :] if n else ""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a call's pieces sit: ``section_open call_open HEAD BODY call_close [sep call...] section_close``."""

    section_open: str
    call_open: str
    call_close: str
    section_close: str


def layout(before: str, after: str, between: str | None) -> Layout:
    """Split the text before and after one call's core, using the text between two calls' cores.

    ``between`` is what separates the first call's core from the second's: the first call's close,
    any separator, then the second call's open.
    """
    if between is None:
        return Layout("", before, after, "")
    call_open = before[_split_before(before, len(before) - len(_common_suffix(before, between))) :]
    call_close = after[: _split_after(after, _common_prefix(after, between))]
    if len(call_open) + len(call_close) > len(between):
        call_close = call_close[: max(0, len(between) - len(call_open))]
    return Layout(before[: len(before) - len(call_open)], call_open, call_close, after[len(call_close) :])


def _boundary(text: str, k: int) -> bool:
    """Whether ``text`` may be split at ``k`` without cutting a word or a tag (``<calls|>`` stays whole)."""
    if k <= 0 or k >= len(text):
        return True
    left, right = text[k - 1], text[k]
    return left.isspace() or right.isspace() or left in ">]" or right in "<["


def _split_before(text: str, k: int) -> int:
    """``k``, moved forward to the nearest boundary (a common suffix that starts mid-tag loses that part)."""
    while not _boundary(text, k):
        k += 1
    return k


def _split_after(text: str, k: int) -> int:
    """``k``, moved back to the nearest boundary."""
    while not _boundary(text, k):
        k -= 1
    return k


# -- the families ----------------------------------------------------------------------------------


def _json_format(spec: JsonSpec, think: ThinkSpec | None, summary: str, markers: Sequence[str]) -> Format:
    def build(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
        return JsonMachine(out, opts, spec, think)

    return _format(build, think, summary, markers)


def _format(build: Any, think: ThinkSpec | None, summary: str, markers: Sequence[str]) -> Format:
    syntax = tuple(dict.fromkeys(m for m in markers if m))
    summary = "learned: " + summary.replace(NAME, "NAME").replace(ID, "ID")
    return Format("learned", summary, build, think, syntax=syntax)


def _strip(marker: str) -> str:
    return marker.strip()


def _object_family(norm: dict[str, str], think: ThinkSpec | None) -> list[Format]:
    """``OPEN {"name-key": NAME, "args-key": {...}} CLOSE``, one object per call or a list of them."""
    one = norm["one"]
    found = objects(one)
    inner = [o for o in found if o[2] == {KEY_1: VALUE_A}]
    outer = [o for o in found if any(_args_value(v) == {KEY_1: VALUE_A} for v in o[2].values())]
    outer = [o for o in outer if NAME in o[2].values()]
    if not outer:
        return []
    start, end, obj = outer[-1]  # the innermost object holding both the name and the arguments
    name_key = next(k for k, v in obj.items() if v == NAME)
    args_key = next(k for k, v in obj.items() if _args_value(v) == {KEY_1: VALUE_A} and k != name_key)
    id_keys = tuple(k for k, v in obj.items() if v == ID)
    tolerated = tuple(k for k in obj if k not in (name_key, args_key, *id_keys))
    keys = CallKeys((name_key,), (args_key,), id_keys or ("id",), tolerated)
    del inner
    before, after = one[:start], one[end:]
    candidates: list[Format] = []
    listed = before.rstrip().endswith("[") and after.lstrip().startswith("]")
    if listed:
        opener = before.rstrip()[:-1].strip()
        closer = after.lstrip()[1:].strip()
        block = Block("list", (closer,) if closer else (), keys=keys)
        spec = JsonSpec({opener or "[": block})
        summary = f"a JSON list of {{{name_key!r}, {args_key!r}}} objects after {opener or '['!r}"
        candidates.append(_json_format(spec, think, summary, [opener or "[", closer]))
        return candidates
    opener, closer = before.strip(), after.strip()
    between = None
    if "two_calls" in norm:
        two = objects(norm["two_calls"])
        holders = [o for o in two if NAME in o[2].values()]
        if len(holders) >= 2:
            between = norm["two_calls"][holders[0][1] : holders[1][0]]
    lay = layout(before, after, between)
    bare_keys = CallKeys((name_key,), (args_key,), id_keys or ("id",), tolerated, need_args=True)
    call_open, call_close = lay.call_open.strip(), lay.call_close.strip()
    section = [m for m in (lay.section_open.strip(), lay.section_close.strip()) if m]
    summary = f"{{{name_key!r}: name, {args_key!r}: arguments}} objects"
    if call_open:
        spec = JsonSpec(
            {call_open: Block("object", (call_close,) if call_close else (), keys=keys)}, strip=tuple(section)
        )
        candidates.append(
            _json_format(spec, think, f"{summary} in {call_open!r}...{call_close!r}", [call_open, call_close, *section])
        )
    if opener and opener != call_open:
        # one section, objects inside it one after the other
        spec = JsonSpec(
            {opener: Block("object", (closer,) if closer else (), keys=keys), "{": Block("object", keys=bare_keys)},
            strip=(closer,) if closer else (),
        )
        candidates.append(_json_format(spec, think, f"{summary} after {opener!r}", [opener, closer]))
    if not opener:
        spec = JsonSpec({"{": Block("object", keys=bare_keys)})
        candidates.append(_json_format(spec, think, f"bare {summary}", []))
    return candidates


class _Header:
    """Reads a learned call header: the text between the call's opener and its arguments.

    The pattern is the normalized header with :data:`NAME` (and maybe :data:`ID`) in it; its literal
    pieces must appear in order (whitespace around them is free).
    """

    def __init__(self, pattern: str) -> None:
        self.slots: list[str] = []
        self.pieces: list[str] = []
        rest = pattern
        while True:
            at = [(rest.find(slot), slot) for slot in (NAME, ID) if slot in rest]
            if not at:
                self.pieces.append(rest.strip())
                break
            k, slot = min(at)
            self.pieces.append(rest[:k].strip())
            self.slots.append(slot)
            rest = rest[k + len(slot) :]

    def __call__(self, text: str) -> tuple[str, str | None] | None:
        values: dict[str, str] = {}
        pos = 0
        text = text.strip()
        if not text.startswith(self.pieces[0]):
            return None
        pos = len(self.pieces[0])
        for slot, piece in zip(self.slots, self.pieces[1:], strict=True):
            end = text.find(piece, pos) if piece else len(text)
            if end < 0 or (not piece and slot != self.slots[-1]):
                return None
            values[slot] = text[pos:end].strip().strip("\"'")
            pos = end + len(piece)
        if text[pos:].strip():
            return None
        name = values.get(NAME, "")
        return (name, values.get(ID) or None) if valid_name(name) else None


def _named_family(norm: dict[str, str], think: ThinkSpec | None) -> list[Format]:
    """``OPEN NAME HEAD {arguments} CLOSE``: a header with the name, then a JSON object."""
    one = norm["one"]
    args = [o for o in objects(one) if o[2] == {KEY_1: VALUE_A}]
    if not args or NAME not in one[: args[0][0]]:
        return []
    start, end, _ = args[0]
    name_at = one.rfind(NAME, 0, start)
    # the call's own opener ends where its header's placeholders begin
    head_start = min(k for k in (one.rfind(ID, 0, name_at), name_at) if k >= 0)
    before, header, after = one[:head_start], one[head_start:start], one[end:]
    between = None
    two = norm.get("two_calls")
    if two is not None:
        found = [o for o in objects(two) if o[2] in ({KEY_1: VALUE_A}, {KEY_1: VALUE_B})]
        if len(found) >= 2:
            second_name = two.rfind(NAME, found[0][1], found[1][0])
            if second_name >= 0:
                second_head = min(k for k in (two.rfind(ID, found[0][1], second_name), second_name) if k >= 0)
                between = two[found[0][1] : second_head]
    lay = layout(before, after, between)
    header_parser = _Header(header)
    call_open, call_close = lay.call_open.strip(), lay.call_close.strip()
    section_open, section_close = lay.section_open.strip(), lay.section_close.strip()
    summary = f"a header {header.strip()!r} then JSON arguments"
    candidates = []
    if section_open and call_open:
        block = Block(
            "section",
            (section_close,) if section_close else (),
            header=header_parser,
            call_open=(call_open,),
            call_close=(call_close,) if call_close else (),
        )
        spec = JsonSpec({section_open: block})
        marks = [section_open, section_close, call_open, call_close]
        candidates.append(_json_format(spec, think, f"{summary}, calls in {section_open!r}", marks))
    opener = call_open or section_open
    if opener:
        closer = call_close or section_close
        spec = JsonSpec({opener: Block("named", (closer,) if closer else (), header=header_parser)})
        candidates.append(_json_format(spec, think, f"{summary} after {opener!r}", [opener, closer]))
    return candidates


def _keyed_family(norm: dict[str, str], think: ThinkSpec | None) -> list[Format]:
    """Arguments written key by key: ``<arg:KEY>VALUE</arg>``, or Python's ``NAME(key="value")``."""
    text = norm.get("two_args")
    if text is None:
        return []
    name_at = text.find(NAME)
    k1 = text.find(KEY_1, name_at + len(NAME))
    v1 = text.find(VALUE_A, k1 + len(KEY_1))
    k2 = text.find(KEY_2, v1 + len(VALUE_A))
    v2 = text.find(str(NUMBER), k2 + len(KEY_2))
    if min(name_at, k1, v1, k2, v2) < 0:
        return []
    mid_and_open = text[name_at + len(NAME) : k1]
    key_sep = text[k1 + len(KEY_1) : v1]
    key_sep_2 = text[k2 + len(KEY_2) : v2]
    close_and_open = text[v1 + len(VALUE_A) : k2]
    tail = text[v2 + len(str(NUMBER)) :]
    start = _split_before(mid_and_open, len(mid_and_open) - len(_common_suffix(mid_and_open, close_and_open)))
    empty = norm.get("no_args")
    if empty is not None and NAME in empty:
        # what follows the name in a call without arguments is its header's end, not an argument
        after_name = empty[empty.find(NAME) + len(NAME) :]
        start = max(start, _split_after(mid_and_open, _common_prefix(mid_and_open, after_name)))
    elif start < len(mid_and_open) and mid_and_open[start] in ">]" and "<" in mid_and_open[start:]:
        start = mid_and_open.index("<", start)  # an argument tag opens with "<"; the ">" closed the name
    param_open = mid_and_open[start:]
    param_close = tail[: _split_after(tail, _common_prefix(tail, close_and_open))]
    mid = mid_and_open[:start]
    before = text[:name_at]
    one = norm["one"]
    after = one[one.rfind(VALUE_A) + len(VALUE_A) :]
    after = after[len(param_close) :] if after.startswith(param_close) else after
    between = None
    two = norm.get("two_calls")
    if two is not None:
        first_value = two.find(VALUE_A)
        second_name = two.find(NAME, first_value)
        if first_value >= 0 and second_name >= 0:
            between = two[first_value + len(VALUE_A) : second_name]
            between = between[len(param_close) :] if between.startswith(param_close) else between
    lay = layout(before, after, between)
    candidates: list[Format] = []
    if mid.strip() == "(" and key_sep.strip().startswith("=") and key_sep_2.strip() == "=":
        opened = (lay.section_open.strip() or lay.call_open.strip()).removesuffix("[").strip()
        closed = one[one.rfind(")") + 1 :].strip().removeprefix("]").strip()
        if not opened and not closed:
            return []  # plain Python calls in content: the catalog's pythonic format
        begin, end = opened or None, closed or None

        def build(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
            return PythonicMachine(out, opts, think, start=begin, end=end)

        summary = f"Python calls NAME(key=value) between {begin!r} and {end!r}"
        candidates.append(_format(build, think, summary, [begin or "", end or "", "[", "]"]))
        return candidates
    if key_sep != key_sep_2 or not param_open.strip() or not param_close.strip():
        return []
    key_close, value_open = _split_gap(key_sep)
    section_open, section_close = lay.section_open.strip(), lay.section_close.strip()
    call_open, call_close = lay.call_open.strip(), lay.call_close.strip()
    if not call_open and not section_open:
        return []
    name_close = mid.strip() or None
    spec = XmlSpec(
        (section_open,) if section_open else (),
        (section_close,) if section_close else (),
        call_open if name_close is not None else None,
        call_close or None,
        param_open.strip(),
        param_close.strip(),
        key_close=key_close or ">",
        value_open=value_open,
        bare_call=not section_open,
        many_calls=True,
        name_close=name_close,
    )
    if spec.call_open is None and not section_open:
        spec = XmlSpec(
            (call_open,), (call_close,) if call_close else (), None, None, spec.param_open, spec.param_close,
            key_close=spec.key_close, value_open=value_open,
        )  # fmt: skip

    def build_xml(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
        return XmlMachine(out, opts, spec, think)

    marks = [*spec.block_open, *spec.block_close, spec.call_open or "", spec.call_close or "", spec.param_open]
    marks += [spec.param_close, spec.key_close or "", spec.value_open or "", spec.name_close or ""]
    summary = f"arguments key by key: {spec.param_open}KEY{key_sep.strip()}VALUE{spec.param_close}"
    candidates.append(_format(build_xml, think, summary, marks))
    return candidates


def _split_gap(between: str) -> tuple[str, str | None]:
    """``</arg_key>\\n<arg_value>`` -> ``("</arg_key>", "<arg_value>")``; ``>`` -> ``(">", None)``."""
    parts = between.split()
    if len(parts) >= 2:
        return parts[0], parts[-1]
    return between.strip(), None


# -- checking ---------------------------------------------------------------------------------------


def reads_back(fmt: Format, windows: dict[str, str]) -> bool:
    """Whether ``fmt`` decodes every probe window to exactly its calls."""
    decoders = [make_decoder(fmt, tools=LEARN_TOOLS, thinking_forced_open=state) for state in (False, True)]
    return all(any(_reads(d, text, PROBES[probe]) for d in decoders) for probe, text in windows.items())


def _reads(d: Decoder, text: str, calls: list[Call]) -> bool:
    """``text`` decodes to exactly ``calls``, and none of its syntax is left as text.

    Either think state may apply: a history turn may drop the reasoning its generation prompt opened.
    """
    message = d.decode(text)
    got = [(c.name, c.arguments) for c in message.tool_calls]
    return (
        not message.invalid_tool_calls and got == [(n, a) for n, a, _ in calls] and not (message.content or "").strip()
    )


def learn(windows: dict[str, str], think: ThinkSpec | None) -> Learned | None:
    """A format that decodes the probe windows back (see :func:`probe_windows`), or None."""
    if "one" not in windows:
        return None
    norm = {probe: normalize(text) for probe, text in windows.items()}
    for family in (_object_family, _named_family, _keyed_family):
        for fmt in family(norm, think):
            if reads_back(fmt, windows):
                return Learned(fmt, windows["one"])
    return None


# -- tool instructions ------------------------------------------------------------------------------

_EXAMPLE = re.compile(r'\{\s*"name"\s*:[^{}\n]{0,80}"(arguments|parameters)"\s*:')
_TAG = re.compile(r"(<[^<>\s]{1,40}>|\[[A-Z_]{2,40}\])\s*$")
_TAG_AFTER = re.compile(r"^\s*(<[^<>\s]{1,40}>|\[[A-Z_/]{2,40}\])")


def from_instructions(text: str, think: ThinkSpec | None) -> Learned | None:
    """The call format a template's tool instructions show by example: a ``{"name": ..., "arguments":
    ...}`` object between tags (``<tool_call>``, ``[TOOL]``), one object per call."""
    for found in _EXAMPLE.finditer(text):
        before = _TAG.search(text, 0, found.start())
        if before is not None and NAME_A not in found.group() and NAME_B not in found.group():
            break  # an example between tags, not one of the tool definitions
    else:
        return None
    opener = before.group(1)
    rest = text[found.end() :]
    line_end = rest.find("\n}")
    close_at = rest.find("}")
    tail = rest[close_at + 1 :] if close_at >= 0 else ""
    after = _TAG_AFTER.match(tail)
    closer = after.group(1) if after else ""
    del line_end
    keys = CallKeys(("name",), (found.group(1), "arguments", "parameters"))
    spec = JsonSpec({opener: Block("object", (closer,) if closer else (), keys=keys)})
    summary = f'{{"name", "{found.group(1)}"}} objects in {opener!r}...{closer!r}, as the tool instructions show'
    fmt = _json_format(spec, think, summary, [opener, closer])
    example = f'{opener}{{"name": "{NAME_A}", "{found.group(1)}": {{"{KEY_1}": "{VALUE_A}"}}}}{closer}'
    if not reads_back(fmt, {"one": example}):
        return None
    return Learned(fmt, text[before.start() : found.end() + close_at + 1 + (after.end() if after else 0)])
