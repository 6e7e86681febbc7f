"""Budgets for one render: output size, wall-clock time and macro recursion.

Chat templates come from model files and sometimes from requests, so they are untrusted code. The
sandbox (:mod:`chatcodec.sandbox`) stops them from reaching Python internals; this module stops them
from running forever or filling memory. Every render carries a :class:`Budget` built from
:class:`Limits`:

* **time**: loop iterations and macro calls spend steps; every :data:`STEP_CHUNK` steps the clock is
  read, so a template that loops 10^9 times stops moments after ``timeout``;
* **size**: the output, and every value the operations that can amplify a string or list produce
  (``*``, ``**``, ``+``, ``~``, ``%``, ``str.format`` widths, ``center``/``indent``/``replace``/``join``
  and friends), may not exceed ``max_output`` characters or items. Amplifying operations are checked
  *before* they allocate;
* **recursion**: macros may nest at most ``max_depth`` calls deep; Python's own ``RecursionError`` is
  turned into the same :class:`~chatcodec.LimitError`.

Checks on the hot path cost a type test and an integer comparison: the active budget is only looked up
when a value passes :data:`FAST_SIZE` characters.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from typing import Any

from .exceptions import LimitError

#: values at most this long are never checked against the budget (the check is skipped, not the limit)
FAST_SIZE = 1 << 16
#: the clock is read once per this many loop iterations and macro calls
STEP_CHUNK = 4096

_SIZED = (str, list, tuple)


@dataclass(frozen=True)
class Limits:
    """How much one render may cost. Every limit ends the render with a :class:`~chatcodec.LimitError`.

    >>> Limits(timeout=0.5).timeout
    0.5
    """

    #: longest output, and longest string or list built along the way, in characters or items
    max_output: int = 16_000_000
    #: wall-clock seconds a render may take
    timeout: float = 5.0
    #: deepest nesting of macro calls
    max_depth: int = 100


DEFAULT_LIMITS = Limits()


class Budget:
    """The state of one render: its limits, what it has spent, and the clock it was given."""

    __slots__ = ("deadline", "depth", "emitted", "limits", "now", "spans", "steps")

    def __init__(self, limits: Limits, now: datetime | None = None, track_generation: bool = False) -> None:
        self.limits = limits
        self.now = now
        self.deadline = time.monotonic() + limits.timeout
        self.steps = STEP_CHUNK
        self.depth = 0
        #: characters the root of the template has produced so far; ``{% generation %}`` spans use it
        self.emitted = 0
        self.spans: list[tuple[int, int]] | None = [] if track_generation else None

    def tick(self) -> None:
        """Called when a chunk of steps is used up: read the clock."""
        self.steps = STEP_CHUNK
        if time.monotonic() > self.deadline:
            raise LimitError(
                f"The render took longer than {self.limits.timeout:g} s, the time limit. The template loops"
                " too long for this input; raise Limits(timeout=...) if the input really needs it."
            )

    def check_size(self, size: int, what: str = "a value") -> None:
        if size > self.limits.max_output:
            raise LimitError(
                f"The template tried to build {what} of {size:,} characters or items, over the"
                f" {self.limits.max_output:,} allowed. Raise Limits(max_output=...) if the input really"
                " needs it."
            )


_ACTIVE: ContextVar[Budget] = ContextVar("chatcodec_budget")


def active() -> Budget:
    """The budget of the render running in this context."""
    return _ACTIVE.get()


def activate(budget: Budget) -> Any:
    """Make ``budget`` the active one; returns a token for :func:`deactivate`."""
    return _ACTIVE.set(budget)


def deactivate(token: Any) -> None:
    _ACTIVE.reset(token)


def check_size(size: int, what: str = "a value") -> None:
    if size > FAST_SIZE:
        _ACTIVE.get().check_size(size, what)


# --- loops and macros -------------------------------------------------------------------------------


def counted(iterable: Iterable[Any]) -> Iterator[Any]:
    """Iterate ``iterable``, spending one step per item (every ``{% for %}`` goes through this)."""
    budget = _ACTIVE.get()
    for item in iterable:
        budget.steps -= 1
        if budget.steps <= 0:
            budget.tick()
        yield item


def enter_macro() -> Budget:
    budget = _ACTIVE.get()
    budget.depth += 1
    if budget.depth > budget.limits.max_depth:
        raise LimitError(
            f"Macros nested more than {budget.limits.max_depth} calls deep, the recursion limit."
            " The template probably recurses without end; raise Limits(max_depth=...) if not."
        )
    budget.steps -= 1
    if budget.steps <= 0:
        budget.tick()
    return budget


# --- operators that can amplify their operands --------------------------------------------------------


def add(left: Any, right: Any) -> Any:
    result = left + right
    # The operands already passed their own checks, so the result is at most twice the limit: checking
    # after the fact is enough and keeps the common small case to one isinstance.
    if isinstance(result, _SIZED) and len(result) > FAST_SIZE:
        _ACTIVE.get().check_size(len(result), "a string or list")
    return result


def mul(left: Any, right: Any) -> Any:
    if isinstance(right, int) and isinstance(left, _SIZED):
        check_size(len(left) * right, "a repeated string or list")
    elif isinstance(left, int) and isinstance(right, _SIZED):
        check_size(len(right) * left, "a repeated string or list")
    return left * right


def power(left: Any, right: Any) -> Any:
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        # decimal digits of the result, roughly: bits * log10(2)
        check_size(right * abs(left).bit_length() * 3 // 10, "a number")
    return left**right


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*\}")
_DIGITS = re.compile(r"\d+")
_NESTED_SPEC = re.compile(r":[^{}]*\{")


def _largest_int(values: Iterable[Any]) -> int:
    return max((v for v in values if isinstance(v, int)), default=0)


def _percent_width(fmt: str, args: Any) -> int:
    widest = 0
    for match in _PERCENT_SPEC.finditer(fmt):
        for part in match.groups():
            if part == "*":
                values = args if isinstance(args, tuple) else (args,)
                widest = max(widest, _largest_int(values))
            elif part:
                widest = max(widest, int(part))
    return widest


def _brace_width(fmt: str, args: Iterable[Any], kwargs: dict[str, Any]) -> int:
    widest = max((int(d) for m in _BRACE_SPEC.finditer(fmt) for d in _DIGITS.findall(m.group())), default=0)
    if _NESTED_SPEC.search(fmt):
        # a nested field such as "{:>{}}" takes its width from the arguments
        widest = max(widest, _largest_int(args), _largest_int(kwargs.values()))
    return widest


def mod(left: Any, right: Any) -> Any:
    if isinstance(left, str):
        check_size(_percent_width(left, right), "a formatted string")
    return left % right


def concat(parts: Iterable[Any]) -> str:
    """The ``~`` operator: join the string forms of ``parts``."""
    result = "".join(map(str, parts))
    if len(result) > FAST_SIZE:
        _ACTIVE.get().check_size(len(result), "a string")
    return result


def guard_format(method: Callable[..., str], fmt: str) -> Callable[..., str]:
    """Wrap a sandboxed ``str.format``/``format_map`` so huge field widths are refused up front."""

    @wraps(method)
    def checked(*args: Any, **kwargs: Any) -> str:
        values = list(args) + [v for a in args if isinstance(a, dict) for v in a.values()]
        check_size(_brace_width(fmt, values, kwargs), "a formatted string")
        return method(*args, **kwargs)

    return checked


# --- str methods and filters that take a size --------------------------------------------------------


def _join_cost(separator: str, items: Sequence[Any]) -> int:
    return len(separator) * len(items) + sum(len(i) for i in items if isinstance(i, _SIZED))


#: str methods whose result can be far longer than the string itself
SIZED_STR_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs", "replace", "join"})


def call_str_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call a bound ``str`` method, refusing widths, tab sizes and replacements that would explode."""
    name = method.__name__
    text: str = method.__self__
    if name in ("ljust", "rjust", "center", "zfill") and args:
        check_size(_largest_int(args[:1]), "a padded string")
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tabsize, int):
            check_size(len(text) + text.count("\t") * tabsize, "a string")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        occurrences = text.count(args[0]) if args[0] else len(text) + 1
        check_size(len(text) + occurrences * len(args[1]), "a string")
    elif name == "join" and args:
        items = list(args[0])
        check_size(_join_cost(text, items), "a joined string")
        return method(items)
    return method(*args, **kwargs)


def guard_filters(filters: dict[str, Callable[..., Any]]) -> None:
    """Replace the jinja filters that take a size argument with checked versions, in place."""

    def guarded(name: str, cost: Callable[..., int]) -> None:
        original = filters[name]

        @wraps(original)
        def checked(*args: Any, **kwargs: Any) -> Any:
            check_size(cost(*args, **kwargs), f"the result of |{name}")
            return original(*args, **kwargs)

        filters[name] = checked

    def width(value: Any, width: Any = 80, *_: Any, **__: Any) -> int:
        return len(str(value)) + (width if isinstance(width, int) else 0)

    def indent(value: Any, width: Any = 4, *_: Any, **__: Any) -> int:
        per_line = width if isinstance(width, int) else len(str(width))
        return len(str(value)) + (str(value).count("\n") + 1) * per_line

    def replace(_ctx: Any, value: Any, old: Any = "", new: Any = "", *_: Any, **__: Any) -> int:
        text, old, new = str(value), str(old), str(new)
        return len(text) + (text.count(old) if old else len(text) + 1) * len(new)

    def join(_ctx: Any, value: Any, d: Any = "", *_: Any, **__: Any) -> int:
        return _join_cost(str(d), value if isinstance(value, (list, tuple)) else [])

    def count_arg(value: Any, count: Any = 0, *_: Any, **__: Any) -> int:
        return count if isinstance(count, int) else 0

    def wordwrap(_env: Any, s: Any, width: Any = 79, _b: Any = True, wrapstring: Any = None, **kw: Any) -> int:
        wrapstring = kw.get("wrapstring", wrapstring)
        return len(str(s)) * (2 + (len(str(wrapstring)) if wrapstring else 1))

    guarded("center", width)
    guarded("indent", indent)
    guarded("replace", replace)
    guarded("join", join)
    guarded("batch", count_arg)
    guarded("slice", count_arg)
    guarded("wordwrap", wordwrap)


def check_json_layout(value: Any, indent: Any, separators: Any) -> None:
    """Refuse ``tojson`` layouts (huge indents or separators) that would blow the output up."""
    per_line = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    per_item = per_line + sum(len(s) for s in separators or () if isinstance(s, str))
    if per_item > 16:  # below that, the output stays within a constant factor of the (bounded) input
        check_size(_json_nodes(value) * (per_item + 1) * _json_depth(value), "the result of |tojson")


def _json_nodes(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(_json_nodes(v) for v in value.values()) + len(value)
    if isinstance(value, (list, tuple)):
        return 1 + sum(_json_nodes(v) for v in value)
    return 1


def _json_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_json_depth(v) for v in value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return 1 + max((_json_depth(v) for v in value), default=0)
    return 1
