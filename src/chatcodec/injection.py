"""Caller text never supplies the marks that open and close a control token.

A control token is written with marks at its ends: ``<`` and ``>`` in ``<|im_end|>``, ``[`` and ``]`` in
``[INST]``. Every string that comes from the caller (the values *and keys* of messages, tools and documents,
roles, content parts, tool schemas and the docstrings they are made from) reaches the template with each of
its mark characters swapped for an inert stand-in, and so does every character the tokenizer normalizes into
a mark (``＜`` under NFKC). Control tokens are then matched in the render with the stand-ins still in place,
and the stand-ins are put back in the text afterwards, where they are encoded as ordinary text.

So whatever a template does with the text (concatenate, replace, lower-case, slice, join parts), a control
token in the ids has its opening and closing marks written by the template itself. Caller text can at most
fill the inside of a token the template opens and closes around it, which is how Phi-3 and Zephyr write
``'<|' + message['role'] + '|>'``.

Stand-ins are Yi syllables (U+A000 up) that the conversation does not hold, one per mark character:
they are printable, so ``repr`` and ``tojson`` keep them as they are; they keep every string's length; and
equal strings stay equal. A template that *looks at* the marks in caller text (``'<' in content``, sorting
keys, ``|escape``) would see the stand-in where the caller wrote the mark: :func:`reads_marks` finds those
templates from their syntax tree, once per template, and :mod:`chatcodec.tokens` renders them a second time
with the caller's text as written, to compare.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from typing import Any

from jinja2 import nodes

from . import sandbox
from .exceptions import InputError, SpecialTokenError
from .render import plain
from .vocab import alternation, swap

__all__ = ["Marks", "Shield", "reads_marks"]

#: stand-ins are taken from the Yi Syllables block: printable letters of no case, rare in any text
STAND_IN_FIRST, STAND_IN_LAST = 0xA000, 0xA48C
STAND_IN_CLASS = "\ua000-\ua48c"
_ATOMS = frozenset({int, float, bool, type(None)})
_STAND_IN_SEARCH = re.compile(f"[{STAND_IN_CLASS}]")
_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False, allow_nan=True)


class Marks:
    """The characters that open and close a set of control tokens, and the stand-ins that replace them.

    ``normalize`` is the tokenizer's normalizer when it matches control tokens after normalization; then a
    character is a mark when its normalized form holds one (``＜`` under NFKC, ``À`` if a token began with
    ``a`` under a lower-casing normalizer).

    >>> marks = Marks(["<|im_end|>", "[INST]"], None)
    >>> sorted(marks.chars)
    ['<', '>', '[', ']']
    """

    def __init__(self, control: Iterable[str], normalize: Callable[[str], str] | None) -> None:
        self.normalize = normalize
        self.control = frozenset(control)
        chars: set[str] = set()
        for token in self.control:
            for form in {token, normalize(token)} if normalize else {token}:
                chars.update(c for c in (_edge(form), _edge(form[::-1])) if c is not None)
        self.chars = frozenset(chars)
        self.ordered = tuple(sorted(chars))
        self._equivalent: dict[str, bool] = {}
        ascii_marks = [chr(c) for c in range(128) if self.is_mark(chr(c))]
        others = sorted(c for c in chars if not c.isascii())
        body = "".join(re.escape(c) for c in ascii_marks + others)
        # a normalizing tokenizer: any non-ASCII character may normalize into a mark, checked one by one
        self.scan = re.compile(f"[{body}{STAND_IN_CLASS}]" + ("|[^\\x00-\\x7f]" if normalize else ""))
        self.ascii = tuple(ascii_marks)
        #: whether marks can be swapped in JSON text (they are not JSON syntax, and need no normalization)
        self.json_safe = normalize is None and not any(c in '{}[]:,"\\' or c.isalnum() or c.isspace() for c in chars)
        self.hit = _hit_function(self.ascii, self.scan.search)
        self.tokens = re.compile(alternation(self.control))
        #: the control tokens as the tokenizer matches them: after its normalization, if it has one
        self._forms = {normalize(t): t for t in self.control} if normalize else {}
        self.normalized_tokens = re.compile(alternation(self._forms)) if normalize else self.tokens
        self._stand_ins: dict[str, str] = {}
        self._next = STAND_IN_FIRST
        self._lock = threading.Lock()
        #: reads_marks answers, per template sources and marked variables
        self.analyses: dict[tuple[tuple[str, ...], frozenset[str]], str | None] = {}

    def is_mark(self, char: str) -> bool:
        """Whether ``char`` is a mark, or normalizes into text that holds one."""
        if char in self.chars:
            return True
        if self.normalize is None:
            return False
        known = self._equivalent.get(char)
        if known is None:
            known = self._equivalent[char] = any(c in self.chars for c in self.normalize(char))
        return known

    def stand_in(self, char: str, avoid: set[str]) -> str:
        """The stand-in for mark ``char``: the same one every time, unless the conversation holds it."""
        chosen = self._stand_ins.get(char)
        if chosen is None:
            with self._lock:
                chosen = self._stand_ins.get(char)
                if chosen is None:
                    chosen = self._stand_ins[char] = self._allocate(set())
        if chosen in avoid:
            chosen = self._allocate(avoid)
        return chosen

    def _allocate(self, avoid: set[str]) -> str:
        taken = set(self._stand_ins.values()) | avoid
        code = STAND_IN_FIRST if avoid else self._next
        while code <= STAND_IN_LAST:
            char = chr(code)
            code += 1
            if char not in taken and not char.isnumeric():
                if not avoid:
                    self._next = code
                return char
        raise InputError("The conversation uses every character chatcodec could escape control-token marks with.")

    def token_spans(self, text: str) -> list[tuple[int, int, str]]:
        """Where ``text`` holds a control token, as the tokenizer would see it (after its normalization)."""
        if self.normalize is None:
            return [(m.start(), m.end(), m.group()) for m in self.tokens.finditer(text)]
        # normalize character by character, remembering where each normalized character came from
        parts, origin = [], []
        for index, char in enumerate(text):
            form = self.normalize(char)
            parts.append(form)
            origin.extend([index] * len(form))
        normalized = "".join(parts)
        origin.append(len(text))
        return [
            (origin[m.start()], origin[m.end() - 1] + 1, self._forms.get(m.group(), m.group()))
            for m in self.normalized_tokens.finditer(normalized)
            if m.end()
        ]


def _hit_function(ascii_marks: tuple[str, ...], search: Callable[[str], Any]) -> Callable[[str], bool]:
    """Whether text may hold a mark or a stand-in: ``in`` tests for ASCII text (ten times faster than a
    regex search), the regex for the rest."""

    def hit(text: str) -> bool:
        if text.isascii():
            for char in ascii_marks:  # noqa: SIM110 - a loop is faster than any() over a generator
                if char in text:
                    return True
            return False
        return search(text) is not None

    return hit


def _edge(token: str) -> str | None:
    """The first character of ``token`` that is neither a letter, a digit nor a space: its opening mark."""
    return next((c for c in token if not (c.isalnum() or c.isspace())), None)


# --- the caller's strings, with marks swapped ----------------------------------------------------------------


class Shield:
    """One conversation's caller strings with their marks swapped for stand-ins.

    :meth:`apply` walks messages, tools and documents and returns them with every mark replaced, the same
    objects where nothing changed. ``restore`` then maps stand-ins back (for :func:`swap`) and
    ``suspects`` lists the strings that held marks, for error messages. With ``reject``, a string that holds
    a whole control token raises :class:`~chatcodec.SpecialTokenError` naming its message and field.
    """

    def __init__(
        self, marks: Marks, reserved: Iterable[str], *, reject: bool, table: dict[str, str] | None = None
    ) -> None:
        self.marks = marks
        self.reject = reject
        self.reserved = set(reserved)
        #: mark character -> its stand-in in this conversation (``table``: the stand-ins to go on with)
        self.table: dict[str, str] = dict(table or {})
        self._seed = dict(table or {})
        #: (owner, path, text) of every caller string that held a mark
        self.suspects: list[tuple[str, tuple[Any, ...], str]] = []
        #: (group, item) of what :meth:`apply` found marks in: messages 0, tools 1, documents 2; item -1 is
        #: the whole group
        self.marked: list[tuple[int, int]] = []
        #: message index -> (its JSON text, what it became), for the messages swapped through JSON
        self.swapped: dict[int, tuple[str, Any]] = {}
        self._only_tokens = False

    @property
    def restore(self) -> dict[str, str]:
        """Stand-in -> the caller's character, for :func:`swap`."""
        return {stand_in: char for char, stand_in in self.table.items()}

    def apply(
        self,
        messages: Any,
        tools: Any,
        documents: Any,
        *,
        clean: tuple[int, Sequence[int], bool, bool] = (0, (), False, False),
        swapped: Mapping[int, tuple[str, Any]] | None = None,
    ) -> tuple[Any, Any, Any]:
        """Messages, tools and documents with the marks of every caller string swapped.

        ``clean`` says what is known already: that the first ``n`` messages hold no mark (nor stand-in, but
        this shield's own in messages that went through it before) but those at the indices listed, and whether
        the tools and the documents hold none. Those messages are returned as they are. ``swapped`` gives,
        for some of those indices, the JSON text a message had and what it became: a message whose JSON text
        is still that becomes that again (JSON text tells ``1`` from ``True``, which ``==`` does not). What this
        call found marks in is :attr:`marked`, and :attr:`swapped` has the same for the messages it swapped.
        """
        given = messages, tools, documents
        hit = self.marks.hit
        marked: list[tuple[int, int]] = []  # (group, item) of what holds marks
        self.marked = marked
        reused: dict[int, Any] = {}  # message index -> what it became before, still valid
        plain_json = True
        known, unclean, known_tools, known_documents = clean
        for number, group in enumerate(given):
            if group is None or (number == 1 and known_tools) or (number == 2 and known_documents):
                continue
            if type(group) is not list:
                marked.append((number, -1))  # a tuple, deque, conversation object: the walk takes it apart
                plain_json = False
                continue
            # messages known to hold no mark are skipped: only the others, and the new ones, are looked at
            indices = itertools.chain(unclean, range(known, len(group))) if number == 0 else range(len(group))
            for index in indices:
                if number == 0 and swapped and index in swapped:
                    before, after = swapped[index]
                    try:
                        same = _ENCODER.encode(group[index]) == before
                    except (TypeError, ValueError):
                        same = False
                    if same:
                        marked.append((0, index))
                        reused[index] = after
                        self.swapped[index] = (before, after)
                        continue
                flags = _survey(group[index], hit)
                if flags & _MARKED:
                    marked.append((number, index))
                    plain_json = plain_json and not flags & _NOT_JSON
        if not marked:
            return given  # no string holds a mark
        if plain_json and not self.reject and self.marks.json_safe:
            result = self._apply_json(given, marked, reused)
            if result is not None:
                return result
        self.swapped = {}
        kept = range(known) if not unclean else set(range(known)).difference(unclean)
        while True:
            reserved = set(self.reserved)
            self.table, self.suspects = dict(self._seed), []
            result = self._apply(*given, kept)
            clashes = self.reserved.intersection(self.table.values())
            if not clashes or clashes <= set(self._seed.values()):
                return result  # the caller sees a clash with the stand-ins it went on with (conflicts())
            if self.reserved == reserved:  # pragma: no cover - a stand-in is never allocated from reserved
                raise InputError("Could not choose stand-ins for control-token marks.")

    def conflicts(self) -> bool:
        """Whether the conversation holds a character used as a stand-in (only possible with a ``table`` to
        go on with: the stand-ins are then chosen again, from scratch)."""
        return not self.reserved.isdisjoint(self.table.values())

    def _apply_json(
        self, given: tuple[Any, Any, Any], marked: list[tuple[int, int]], reused: dict[int, Any]
    ) -> tuple[Any, Any, Any] | None:
        """Plain JSON data whose marks are not JSON syntax: the items that hold marks have them swapped in
        their serialization, several times faster than walking them (the walk is for everything else, and
        names fields for errors)."""
        fresh = [(g, i) for g, i in marked if not (g == 0 and i in reused)]
        try:
            texts = [_ENCODER.encode(given[g][i]) for g, i in fresh]
        except (TypeError, ValueError):
            return None
        dump = "[" + ", ".join(texts) + "]"
        if not dump.isascii():
            self.reserved.update(_STAND_IN_SEARCH.findall(dump))
        table = self.table
        for char in self.marks.ordered:
            if char in dump:
                if char not in table:
                    table[char] = self.marks.stand_in(char, self.reserved.union(table.values()))
                dump = dump.replace(char, table[char])
        try:
            swapped = json.loads(dump)
        except ValueError:  # an integer too long for json.loads
            self.table = dict(self._seed)
            return None
        groups: list[Any] = list(given)
        copied = [False, False, False]
        for (g, i), text, item in zip(fresh, texts, swapped, strict=True):
            if not copied[g]:
                groups[g], copied[g] = list(groups[g]), True
            groups[g][i] = item
            if g == 0:
                self.swapped[i] = (text, item)
        if reused:
            if not copied[0]:
                groups[0] = list(groups[0])
            for i, item in reused.items():
                groups[0][i] = item
        return groups[0], groups[1], groups[2]

    def apply_tokens_only(self, messages: Any, tools: Any, documents: Any) -> tuple[Any, Any, Any]:
        """The same walk, swapping only the marks of whole control tokens: the conversation as the caller
        wrote it, but for the tokens themselves (the comparison render of :mod:`chatcodec.tokens`)."""
        self._only_tokens = True
        try:
            return self._apply(messages, tools, documents)
        finally:
            self._only_tokens = False

    def _apply(self, messages: Any, tools: Any, documents: Any, kept: Container[int] = ()) -> tuple[Any, Any, Any]:
        """The walk of everything, but the messages at the indices ``kept`` (known to hold nothing to swap)."""
        chat = messages if type(messages) is list else getattr(messages, "messages", messages)
        if _is_sequence(chat):
            shielded = []
            for index, message in enumerate(chat):
                if index in kept:
                    shielded.append(message)
                    continue
                if type(message) is not dict:
                    converted = plain(message) if not isinstance(message, (str, bytes)) else message
                    message = converted if type(converted) is dict else message
                if type(message) is dict:
                    message = self.walk(message, _message_owner(index, message.get("role")), ())
                shielded.append(message)
            messages = shielded
        if _is_sequence(tools):
            tools = [self._tool(tool, index) for index, tool in enumerate(tools)]
        if _is_sequence(documents):
            documents = [self.walk(d, f"document {i}", ()) if type(d) is dict else d for i, d in enumerate(documents)]
        return messages, tools, documents

    def _tool(self, tool: Any, index: int) -> Any:
        if type(tool) is dict:
            return self.walk(tool, f"tool {index}", ())
        import inspect

        if inspect.isfunction(tool) or inspect.ismethod(tool):
            from .schema import function_schema  # the docstring becomes text the template prints

            return self.walk(function_schema(tool), f"tool {index} ({getattr(tool, '__name__', '?')})", ())
        return tool  # the render says what is wrong with it

    def walk(self, value: Any, owner: str, path: tuple[Any, ...]) -> Any:
        """``value`` with the marks of its strings swapped; the very same object when none had any."""
        kind = type(value)
        hit = self.marks.hit
        if kind is str:
            return self._string(value, owner, path) if hit(value) else value
        if kind is dict:
            new: dict[Any, Any] | None = None
            for key, item in value.items():
                sort = type(item)
                if sort is str:
                    new_item = self._string(item, owner, (*path, key)) if hit(item) else item
                elif sort in _ATOMS:
                    new_item = item
                else:
                    new_item = self.walk(item, owner, (*path, key))
                if type(key) is str:
                    new_key = self._string(key, owner, (*path, _Key(key))) if hit(key) else key
                else:
                    new_key = plain(key)
                if new is None:
                    if new_key is key and new_item is item:
                        continue
                    new = {}
                    for k, v in value.items():  # the items before this one, unchanged
                        if k is key:
                            break
                        new[k] = v
                new[new_key] = new_item
            return value if new is None else new
        if kind is list or kind is tuple:
            items = [self.walk(item, owner, (*path, i)) for i, item in enumerate(value)]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items if kind is list else tuple(items)
        if kind in _ATOMS:
            return value
        return self.walk(plain(value), owner, path)  # objects, str subclasses: what the template will see

    def _string(self, text: str, owner: str, path: tuple[Any, ...]) -> str:
        marks = self.marks
        if text.isascii():
            chars = [c for c in marks.ascii if c in text]
        else:
            found = set(marks.scan.findall(text))
            for char in found:
                if STAND_IN_FIRST <= ord(char) <= STAND_IN_LAST:
                    self.reserved.add(char)
            chars = [c for c in found if marks.is_mark(c)]
        if not chars:
            return text
        if not self._only_tokens:
            self.suspects.append((owner, path, text))
        table = self.table
        for char in chars:
            if char not in table:
                table[char] = marks.stand_in(char, self.reserved | set(table.values()))
        if self.reject or self._only_tokens:
            spans = marks.token_spans(text)
            if spans and self.reject:
                raise SpecialTokenError(
                    f"{describe(owner, path)} contains the control token {spans[0][2]!r}. Content may not"
                    ' hold control tokens when content_special_tokens="reject"; "escape" encodes them as plain text.'
                )
            if self._only_tokens:
                return _swap_spans(text, spans, table)
        for char in chars:
            text = text.replace(char, table[char])
        return text


def _message_owner(index: int, role: Any) -> str:
    """``message 3 (assistant)``; a role that is not a plain word is quoted, on one line."""
    if type(role) is str and _WORD.fullmatch(role):
        return f"message {index} ({role})"
    shown = repr(role[:40] + ("..." if len(role) > 40 else "")) if type(role) is str else "?"
    return f"message {index} (role {shown})"


_WORD = re.compile(r"[A-Za-z_][\w.-]{0,39}")


class _Key(str):
    """A path element that names a key rather than the value under it."""

    __slots__ = ()


def _swap_spans(text: str, spans: list[tuple[int, int, str]], table: dict[str, str]) -> str:
    if not spans:
        return text
    parts, at = [], 0
    for start, end, _ in spans:
        parts.append(text[at:start])
        parts.append(swap(text[start:end], table))
        at = end
    parts.append(text[at:])
    return "".join(parts)


def describe(owner: str, path: Sequence[Any]) -> str:
    """``message 1 (assistant) tool_calls[0].function.arguments``, or ``..., key 'k' in ...,`` for a key."""
    if path and isinstance(path[-1], _Key):
        name, path = str.__str__(path[-1]), path[:-1]
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
        return f"{owner}, key {name!r}{' in ' + field if field else ''},"
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    return f"{owner}{' ' + field if field else ''}"


def _is_sequence(value: Any) -> bool:
    return type(value) is list or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray, Mapping))
    )


_MARKED, _NOT_JSON = 1, 2


def _survey(value: Any, hit: Callable[[str], bool]) -> int:
    kind = type(value)
    if kind is str:
        return _MARKED if hit(value) else 0
    flags = 0
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                flags |= _NOT_JSON
            elif hit(key):
                flags |= _MARKED
            sort = type(item)
            if sort is str:
                if hit(item):
                    flags |= _MARKED
            elif sort not in _ATOMS:
                flags |= _survey(item, hit)
        return flags
    if kind is list:
        for item in value:
            sort = type(item)
            if sort is str:
                if hit(item):
                    flags |= _MARKED
            elif sort not in _ATOMS:
                flags |= _survey(item, hit)
        return flags
    if kind in _ATOMS:
        return 0
    return _MARKED | _NOT_JSON  # tuples, objects, str subclasses: the walk converts them and looks inside


def culprit(token: str, suspects: list[tuple[str, tuple[Any, ...], str]]) -> str:
    """The caller string that most likely supplied ``token``: the one holding the longest end of it."""
    best, best_length = None, 0
    for owner, path, text in suspects:
        length = max(
            (n for n in range(len(token), 0, -1) if token[:n] in text or token[-n:] in text),
            default=0,
        )
        if length > best_length:
            best, best_length = (owner, path), length
    if best is None:
        return "content"
    return describe(*best)


# --- which templates look at the marks -----------------------------------------------------------------------

#: str methods whose result depends on what the characters are (not just where they are)
_INSPECTING_METHODS = frozenset(
    {
        "split",
        "rsplit",
        "replace",
        "find",
        "rfind",
        "index",
        "rindex",
        "count",
        "startswith",
        "endswith",
        "partition",
        "rpartition",
        "removeprefix",
        "removesuffix",
        "strip",
        "lstrip",
        "rstrip",
        "get",
    }
)
_CHAR_METHODS = frozenset(
    {
        "isalpha",
        "isalnum",
        "isascii",
        "isdecimal",
        "isdigit",
        "isidentifier",
        "isnumeric",
        "isprintable",
        "istitle",
        "translate",
        "encode",
        "maketrans",
    }
)
_CHAR_SET_METHODS = frozenset({"strip", "lstrip", "rstrip"})
#: filters that order or classify characters, whatever their arguments
_CHAR_FILTERS = frozenset(
    {
        "sort",
        "dictsort",
        "groupby",
        "min",
        "max",
        "wordcount",
        "escape",
        "e",
        "forceescape",
        "urlencode",
        "urlize",
        "striptags",
        "xmlattr",
    }
)
#: filters that compare their input with their arguments
_INSPECTING_FILTERS = frozenset({"replace", "select", "reject", "selectattr", "rejectattr", "map", "trim", "unique"})
_COMPARING_TESTS = frozenset(
    {
        "in",
        "eq",
        "equalto",
        "==",
        "ne",
        "!=",
        "sameas",
        "lt",
        "lessthan",
        "<",
        "le",
        "<=",
        "gt",
        "greaterthan",
        ">",
        "ge",
        ">=",
    }
)
_NUMERIC_FILTERS = frozenset({"length", "count", "int", "float", "abs", "round", "sum", "wordcount"})
_PRINTING_FILTERS = frozenset({"string", "tojson", "pprint"})
_ORDERING = frozenset({"lt", "gt", "lteq", "gteq"})
_LOOP_NUMBERS = frozenset({"index", "index0", "revindex", "revindex0", "length", "depth", "depth0"})


def reads_marks(sources: Iterable[str], marks: Marks, variables: Iterable[str] = ()) -> str | None:
    """Why the template's result may depend on the mark characters of caller text, or None if it cannot.

    A template cannot tell a stand-in from the mark it replaces unless it compares caller text with text
    of its own that holds a mark (``content.split('<br>')``), orders or classifies characters (``|sort``,
    ``|escape``, ``isalpha()``), or looks values up by such text. Text of its own that holds marks only
    inside whole control tokens does not count: caller text never holds those (they are escaped).
    ``variables`` are the template variables whose value holds a mark outside a control token.

    >>> marks = Marks(["<think>", "</think>"], None)
    >>> reads_marks(["{{ messages[0].content.split('</think>')[-1] }}"], marks) is None
    True
    >>> reads_marks(["{{ messages[0].content.replace('<br>', ' ') }}"], marks)
    "compares text with '<br>' (line 1)"
    """
    key = (tuple(sources), frozenset(variables))
    if key not in marks.analyses:
        marks.analyses[key] = _reads_marks(key[0], marks, key[1])
    return marks.analyses[key]


def _reads_marks(sources: tuple[str, ...], marks: Marks, variables: frozenset[str]) -> str | None:
    def marked_text(text: str) -> bool:
        if not any(marks.is_mark(c) for c in text):
            return False
        return any(marks.is_mark(c) for c in marks.tokens.sub("", text))

    for source in sources:
        try:
            tree = sandbox.environment.parse(source)
        except Exception:  # the render reports syntax errors; nothing to analyse here
            continue
        reason = _Analysis(tree, marked_text, marks.chars, variables).reason()
        if reason is not None:
            return reason
    return None


class _Analysis:
    """One template's syntax tree: which values may hold marks of the template's own, and where they meet
    caller text. Names are tracked flow-insensitively (a name assigned a marked value anywhere is marked)."""

    def __init__(
        self,
        tree: nodes.Template,
        marked_text: Callable[[str], bool],
        chars: frozenset[str],
        variables: frozenset[str],
    ) -> None:
        self.tree = tree
        self.marked_text = marked_text
        self.chars = chars
        self.names: set[str] = set(variables)
        self.attrs: set[str] = set()
        self.macros: set[str] = set()
        self.numbers: set[str] = set()
        self._cache: dict[int, bool] = {}

    def reason(self) -> str | None:
        self._fixed_point()
        for node in self.tree.find_all(nodes.Expr):
            why = self._site(node)
            if why is not None:
                return f"{why} (line {node.lineno})"
        return None

    # --- which values hold marks -----------------------------------------------------------------------

    def _fixed_point(self) -> None:
        while True:
            before = (len(self.names), len(self.attrs), len(self.macros), len(self.numbers))
            self._cache.clear()
            for node in self.tree.find_all((nodes.Assign, nodes.AssignBlock, nodes.For, nodes.With)):
                if isinstance(node, nodes.Assign):
                    self._bind(node.target, self.marked(node.node), self._numeric(node.node))
                elif isinstance(node, nodes.AssignBlock):
                    self._bind(node.target, self._body_marked(node.body), False)
                elif isinstance(node, nodes.For):
                    self._bind(node.target, self.marked(node.iter), False)
                elif isinstance(node, nodes.With):
                    for target, value in zip(node.targets, node.values, strict=False):
                        self._bind(target, self.marked(value), self._numeric(value))
            for macro in self.tree.find_all(nodes.Macro):
                if self._body_marked(macro.body):
                    self.macros.add(macro.name)
                called = [
                    call
                    for call in self.tree.find_all(nodes.Call)
                    if isinstance(call.node, nodes.Name) and call.node.name == macro.name
                ]
                if any(self.marked(a) for call in called for a in [*call.args, *(k.value for k in call.kwargs)]):
                    for arg in macro.args:
                        self.names.add(arg.name)
                for default in macro.defaults:
                    if self.marked(default):
                        self.names.update(a.name for a in macro.args)
            for block in self.tree.find_all(nodes.CallBlock):
                if self._body_marked(block.body):
                    self.names.add("caller")
                    self.macros.add("caller")
            if (len(self.names), len(self.attrs), len(self.macros), len(self.numbers)) == before:
                return

    def _bind(self, target: nodes.Node, marked: bool, numeric: bool) -> None:
        for name in target.find_all(nodes.Name) if not isinstance(target, nodes.Name) else [target]:
            if marked:
                self.names.add(name.name)
            if numeric:
                self.numbers.add(name.name)
        if isinstance(target, nodes.NSRef):
            if marked:
                self.attrs.add(target.attr)
            if numeric:
                self.numbers.add("." + target.attr)
        for ref in target.find_all(nodes.NSRef):
            if marked:
                self.attrs.add(ref.attr)

    def _body_marked(self, body: list[nodes.Node]) -> bool:
        for statement in body:
            for node in statement.find_all((nodes.TemplateData, nodes.Output)):
                if isinstance(node, nodes.TemplateData) and self.marked_text(node.data):
                    return True
                if isinstance(node, nodes.Output) and any(self.marked(child) for child in node.nodes):
                    return True
        return False

    def marked(self, node: nodes.Node) -> bool:
        """Whether the value of ``node`` may hold a mark the template wrote (outside whole control tokens)."""
        key = id(node)
        known = self._cache.get(key)
        if known is None:
            self._cache[key] = False  # cycles cannot occur in a tree, but be safe
            known = self._cache[key] = self._marked(node)
        return known

    def _marked(self, node: nodes.Node) -> bool:
        if isinstance(node, nodes.Const):
            return isinstance(node.value, str) and self.marked_text(node.value)
        if isinstance(node, nodes.TemplateData):
            return self.marked_text(node.data)
        if isinstance(node, nodes.Name):
            return node.name in self.names
        if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.attr in self.attrs:
            return True
        if isinstance(node, (nodes.Compare, nodes.Test, nodes.Not)):
            return False
        if isinstance(node, nodes.Filter) and node.name in _NUMERIC_FILTERS:
            return False
        if isinstance(node, nodes.Filter) and node.name in _PRINTING_FILTERS:
            return True  # brackets of a printed list
        if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name in self.macros:
            return True
        return any(self.marked(child) for child in node.iter_child_nodes())

    def _numeric(self, node: nodes.Node) -> bool:
        """Whether ``node`` is surely a number (so ordering it compares no text)."""
        if isinstance(node, nodes.Const):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        if isinstance(node, nodes.Filter):
            return node.name in _NUMERIC_FILTERS
        if isinstance(node, nodes.Getattr):
            if isinstance(node.node, nodes.Name) and node.node.name == "loop":
                return node.attr in _LOOP_NUMBERS
            return "." + node.attr in self.numbers
        if isinstance(node, nodes.Name):
            return node.name in self.numbers
        if isinstance(node, (nodes.Add, nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv, nodes.Pow)):
            return self._numeric(node.left) or self._numeric(node.right)
        if isinstance(node, (nodes.Neg, nodes.Pos)):
            return self._numeric(node.node)
        return False

    # --- where caller text could be told apart from stand-ins -------------------------------------------

    def _site(self, node: nodes.Expr) -> str | None:
        if isinstance(node, nodes.Compare):
            operands = [node.expr, *(op.expr for op in node.ops)]
            if self._meets(operands):
                return f"compares text with {self._shown(operands)}"
            if any(op.op in _ORDERING for op in node.ops) and not any(self._numeric(o) for o in operands):
                return "orders text with < or >"
        elif isinstance(node, nodes.Test):
            if node.name in _COMPARING_TESTS and self._meets([node.node, *node.args]):
                return f"tests text against {self._shown([node.node, *node.args])}"
        elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
            method = node.node.attr
            operands = [node.node.node, *node.args, *(k.value for k in node.kwargs)]
            if method in _CHAR_METHODS:
                return f"calls .{method}()"
            if method in _CHAR_SET_METHODS and any(self._holds_mark(a) for a in operands[1:]):
                return f"strips the characters {self._shown(operands[1:])}"
            if method in _INSPECTING_METHODS and self._meets(operands):
                return f"compares text with {self._shown(operands)}"
        elif isinstance(node, nodes.Filter):
            arguments = [*node.args, *(k.value for k in node.kwargs)]
            if node.name in _CHAR_FILTERS:
                return f"uses |{node.name}"
            if node.name == "tojson" and (
                node.args or any(k.key in ("ensure_ascii", "sort_keys") and not _false(k.value) for k in node.kwargs)
            ):
                return "uses |tojson with ensure_ascii or sort_keys"
            if node.name == "format" and node.node is not None and self._format_ascii(node.node):
                return "formats with %a"
            if node.name == "trim" and any(self._holds_mark(a) for a in arguments):
                return f"trims the characters {self._shown(arguments)}"
            operands = [node.node, *arguments] if node.node is not None else arguments
            if node.name in _INSPECTING_FILTERS and self._meets(operands):
                return f"compares text with {self._shown(operands)} in |{node.name}"
        elif isinstance(node, nodes.Getitem) and not isinstance(node.arg, nodes.Slice):
            # a key that holds marks, or a table of the template's whose keys do, looked up by caller text
            if self.marked(node.arg) and not _constant(node.node):
                return f"looks up {self._shown([node.arg])}"
            if self.marked(node.node) and not _constant(node.arg) and not isinstance(node.node, nodes.Call):
                return f"looks up caller text in {self._shown([node.node])}"
        elif isinstance(node, nodes.Mod) and self._format_ascii(node.left):
            return "formats with %a"
        return None

    def _meets(self, operands: Sequence[nodes.Node]) -> bool:
        """Whether text the template marked meets other text that may come from the caller.

        Only then can a stand-in and its mark compare differently: the template's own marks are the same
        in both renders, and the caller's are compared with characters that are not marks either way.
        """
        for index, operand in enumerate(operands):
            if self.marked(operand) and any(not _constant(o) for i, o in enumerate(operands) if i != index):
                return True
        return False

    def _holds_mark(self, node: nodes.Node) -> bool:
        """Any mark character at all, even inside a control token: ``strip('<think>')`` strips ``<``."""
        if isinstance(node, nodes.Const):
            return isinstance(node.value, str) and any(c in self.chars for c in node.value)
        return self.marked(node)

    @staticmethod
    def _format_ascii(node: nodes.Node) -> bool:
        return isinstance(node, nodes.Const) and isinstance(node.value, str) and "%a" in node.value

    def _shown(self, operands: list[Any]) -> str:
        for operand in operands:
            if isinstance(operand, nodes.Const) and isinstance(operand.value, str) and self.marked(operand):
                text = operand.value
                return repr(text if len(text) <= 30 else text[:27] + "...")
        for operand in operands:
            if isinstance(operand, nodes.Name) and self.marked(operand):
                return f"the variable {operand.name}"
        return "text that holds marks"


def _false(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Const) and node.value is False


def _constant(node: nodes.Node) -> bool:
    """A literal, or a list, tuple or dict of literals: text that cannot come from the caller."""
    if isinstance(node, (nodes.Const, nodes.TemplateData)):
        return True
    if isinstance(node, (nodes.Neg, nodes.Pos)):
        return _constant(node.node)
    if isinstance(node, (nodes.List, nodes.Tuple)):
        return all(_constant(item) for item in node.items)
    if isinstance(node, nodes.Dict):
        return all(_constant(pair.key) and _constant(pair.value) for pair in node.items)
    return False


def template_variables_with_marks(variables: Mapping[str, Any], marks: Marks) -> Iterator[str]:
    """The names of template variables whose text holds a mark outside a whole control token."""
    for name, value in variables.items():
        if type(value) is str and marks.scan.search(value) is not None:
            bare = marks.tokens.sub("", value)
            if any(marks.is_mark(c) for c in set(marks.scan.findall(bare))):
                yield name


def stand_ins_in(value: Any) -> set[str]:
    """The characters of the stand-in range that ``value`` (text, or JSON-like data) holds."""
    if type(value) is str:
        return set(_STAND_IN_SEARCH.findall(value)) if _STAND_IN_SEARCH.search(value) else set()
    found: set[str] = set()
    if isinstance(value, Mapping):
        for key, item in value.items():
            found |= stand_ins_in(key) | stand_ins_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            found |= stand_ins_in(item)
    return found
