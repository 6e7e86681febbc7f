"""Budgets for one render: time, output size, memory and recursion.

Chat templates come from model files and sometimes from requests, so they are untrusted code. The
sandbox (:mod:`chatcodec.sandbox`) stops them from reaching Python internals; this module stops them
from running forever or filling memory. Every render carries a :class:`Budget` built from
:class:`Limits`, and every operation whose cost grows with its operands pays into it:

* **time**: the budget counts *steps*. A loop iteration costs the size of its body (its number of
  syntax nodes), a macro call the size of the macro, and an operation on a large value (more than
  :data:`FAST_SIZE` characters or items) one step per :data:`CHARS_PER_STEP` characters it touches,
  paid *before* it runs. Every :data:`STEP_CHUNK` steps the clock is read. A step on small values costs
  microseconds, so the clock is read every few milliseconds whatever the template does, and no single
  operation may take long: those that would (sorting, ``|map``, ``|urlize``, big integers, ...) are
  refused beyond a size that keeps them to a small fraction of a second (:attr:`Limits.max_items`);
* **size**: the output, and every string or list built along the way, may not exceed ``max_output``
  characters or items. Operations that can amplify (``*``, ``**``, ``%``, ``str.format``, ``center``,
  ``replace``, ``join``, ``tojson(indent=...)``, ...) are checked *before* they allocate. A container
  the template builds out of others (``[x, x]``, ``l + l``, ``[x] * n``, ``dict.fromkeys``) may not
  reference more than ``max_output`` characters of strings and items in all, counting every shared
  reference as often as it occurs (:func:`expanded_size`), so printing, comparing or serializing a
  value is bounded by construction;
* **memory**: large values are counted as they are made; every ``max_memory / 8`` bytes of them, and
  every :data:`MEMORY_PERIOD` seconds of a long render (many small values add up too), the process's
  memory is read, and a render that grew it by more than ``max_memory`` stops. A reading can cost
  milliseconds in a process with a large heap, so a short render that makes little never pays for one;
* **recursion**: macros and recursive loops (``loop(...)``) may nest at most ``max_depth`` calls deep;
  Python's own ``RecursionError`` is turned into the same :class:`~chatcodec.LimitError`.

``Limits(isolate=True)`` adds hard limits from the operating system on top (:mod:`chatcodec.isolate`).
Checks on the hot path cost a type test and an integer comparison: the active budget is only looked up
when a value passes :data:`FAST_SIZE`.
"""

from __future__ import annotations

import codecs
import gc
import itertools
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from threading import get_ident
from typing import Any

from jinja2.filters import make_attrgetter

from .exceptions import InputError, LimitError, SandboxError

#: values at most this long are never measured (the check is skipped, not the limit)
FAST_SIZE = 1 << 12
#: the clock is read once per this many steps
STEP_CHUNK = 1 << 12
#: an operation on a large value costs one step per this many characters or items
CHARS_PER_STEP = 1 << 8
_CHAR_SHIFT = 8
#: largest integer (in bits) arithmetic may build; Python cannot print one of more than 4300 digits anyway
MAX_INT_BITS = 1 << 18
#: the first memory reading is taken once the render has made this many bytes of large values
_FIRST_MEMORY_CHECK = 1 << 20
#: seconds between memory readings of a render that makes only small values; Python cannot allocate much
#: more than a few hundred MiB in that time, so the reading still stops a runaway well inside 2x max_memory
MEMORY_PERIOD = 0.05

_SIZED = (str, bytes, list, tuple)


@dataclass(frozen=True)
class Limits:
    """How much one render may cost. Every limit ends the render with a :class:`~chatcodec.LimitError`.

    >>> Limits(timeout=0.5).timeout
    0.5
    >>> Limits().max_memory // 2**20
    256
    """

    #: longest output, and longest string or list built along the way, in characters or items
    max_output: int = 16_000_000
    #: wall-clock seconds a render may take
    timeout: float = 5.0
    #: deepest nesting of macro calls and recursive loops
    max_depth: int = 100
    #: bytes of memory a render may add to the process
    max_memory: int = 256 * 2**20
    #: render in a separate worker process under hard operating-system limits (address space, CPU time)
    isolate: bool = False

    def __post_init__(self) -> None:
        for name in ("max_output", "max_depth", "max_memory"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise InputError(f"Limits({name}=...) must be a positive integer, not {value!r}.")
        if type(self.timeout) not in (int, float) or not 0 < self.timeout < math.inf:
            raise InputError(f"Limits(timeout=...) must be a positive number of seconds, not {self.timeout!r}.")
        if type(self.isolate) is not bool:
            raise InputError(f"Limits(isolate=...) must be True or False, not {self.isolate!r}.")

    @property
    def max_items(self) -> int:
        """Most items (or characters) one slow operation may take: ``|sort``, ``|map``, ``|urlize``, ...

        These run item by item in Python or in a single uninterruptible call, so their size is what
        bounds their time: about 32,768 items per second of ``timeout``, which keeps one such call to a
        small fraction of a second.
        """
        return max(1 << 14, int(self.timeout * (1 << 15)))


DEFAULT_LIMITS = Limits()


class Budget:
    """The state of one render: its limits, what it has spent, and the clock it was given.

    Making one is cheap, as every render makes one: the fields a render always touches are slots, the
    others start as class defaults, and the clock is first read at the first checkpoint (:meth:`tick`,
    after :data:`STEP_CHUNK` steps), which starts the ``timeout``. A render too small to reach a
    checkpoint never reads it; a larger one may run the time of one chunk of steps (a few milliseconds)
    more than its timeout.
    """

    __slots__ = ("__dict__", "limits", "now", "output", "steps")

    #: macro calls and recursive loops currently open
    depth = 0
    #: bytes of large values made so far, and the count at which memory is read next
    alloc = 0
    alloc_check = _FIRST_MEMORY_CHECK
    #: the process's memory before the render (resident; allocated), estimated at the first reading of each
    rss_base: int | None = None
    heap_base: int | None = None
    #: characters the root of the template has produced so far; ``{% generation %}`` spans use it
    emitted = 0
    #: the ``{% generation %}`` spans, when the render tracks them
    spans: list[tuple[int, int]] | None = None
    #: how much of the output list (``output``) has been measured, and whether a compiled render put a
    #: part longer than FAST_SIZE characters in it (it then measures the whole output before joining it)
    measured = 0
    long_parts = False
    #: checkpoints so far; when the render must end, and when memory is read next (set at the first one)
    ticks = 0
    deadline = math.inf
    memory_due = math.inf

    def __init__(self, limits: Limits, now: datetime | None = None, track_generation: bool = False) -> None:
        self.limits = limits
        self.now = now
        #: steps left before the next checkpoint
        self.steps = STEP_CHUNK
        #: the output list a compiled render appends to, measured at each checkpoint
        self.output: list[str] | None = None
        if track_generation:
            self.spans = []

    def renew(self) -> None:
        """Forget what was spent, for the next render of the thread (the caller sets ``limits`` and ``now``)."""
        if self.__dict__:  # a render that reached no checkpoint and made no long part wrote nothing there
            self.__dict__.clear()
        self.steps = STEP_CHUNK
        self.output = None

    def tick(self) -> None:
        """Called when a chunk of steps is used up, or many bytes were made: read the clock and memory.

        Memory is also read every :data:`MEMORY_PERIOD` seconds whatever was counted, as many small values
        add up too.
        """
        self.steps = STEP_CHUNK
        self.ticks += 1
        now = time.monotonic()
        if self.ticks == 1:
            self.deadline = now + self.limits.timeout
            self.memory_due = now + MEMORY_PERIOD
        elif now > self.deadline:
            raise LimitError(
                f"The render took longer than {self.limits.timeout:g} s, the time limit. The template loops"
                " too long for this input; raise Limits(timeout=...) if the input really needs it."
            )
        output = self.output
        if output is not None and len(output) > self.measured:
            self.emitted += sum(map(len, output[self.measured :]))
            self.measured = len(output)
            if self.emitted > self.limits.max_output:
                self.check_size(self.emitted, "an output")
        if self.alloc >= self.alloc_check or now >= self.memory_due:
            self.memory_due = now + MEMORY_PERIOD
            self._check_memory()

    def spend(self, steps: int) -> None:
        self.steps -= steps
        if self.steps <= 0:
            self.tick()

    def check_size(self, size: int, what: str = "a value") -> None:
        if size > self.limits.max_output:
            raise LimitError(
                f"The template tried to build {what} of {size:,} characters or items, over the"
                f" {self.limits.max_output:,} allowed. Raise Limits(max_output=...) if the input really"
                " needs it."
            )

    def big(self, size: int, what: str, nbytes: int) -> None:
        """A value of ``size`` characters or items (``nbytes`` bytes) is about to be made: check and pay."""
        self.check_size(size, what)
        self.steps -= size >> _CHAR_SHIFT
        self.alloc += nbytes
        if self.steps <= 0 or self.alloc >= self.alloc_check:
            self.tick()

    def check_items(self, count: int, what: str) -> None:
        """Refuse a slow operation over more than :attr:`Limits.max_items` items, else pay for it."""
        if count > self.limits.max_items:
            raise LimitError(
                f"The template tried to run {what} over {count:,} items, over the {self.limits.max_items:,}"
                " one such operation may take within the time limit. Raise Limits(timeout=...) if the input"
                " really needs it."
            )
        self.spend(count)

    def _check_memory(self) -> None:
        # Two readings, as each can miss growth: resident memory does not grow while the allocator reuses
        # memory it kept from earlier work, and the allocator's own count misses Python's small-object arenas.
        # The first of each sets what the process held before this render, roughly: then, less what the
        # render had made.
        grown = self.alloc
        rss = _resident_memory()
        if rss is not None:
            if self.rss_base is None:
                self.rss_base = rss - self.alloc
            grown = rss - self.rss_base
        allocated = _allocated()
        if allocated is not None:
            if self.heap_base is None:
                self.heap_base = allocated - self.alloc
            grown = max(grown, allocated - self.heap_base)
        self.alloc_check = self.alloc + self.limits.max_memory // 8
        if grown > self.limits.max_memory:
            raise LimitError(
                f"The render used more than {self.limits.max_memory // 2**20:,} MiB of memory, the memory"
                " limit. Raise Limits(max_memory=...) if the input really needs it."
            )


def _resident_memory() -> int | None:
    """The process's resident memory in bytes (its peak where the current figure is not available)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows: the budget falls back to counting what the render made
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


_MALLINFO: list[Any] = []


def _allocated() -> int | None:
    """Bytes glibc's allocator has handed out and not taken back (``mallinfo2``), or None elsewhere."""
    if not _MALLINFO:
        _MALLINFO.append(_load_mallinfo())
    mallinfo = _MALLINFO[0]
    if mallinfo is None:
        return None
    info = mallinfo()
    return int(info.uordblks + info.hblkhd)


def _load_mallinfo() -> Any:
    try:
        import ctypes

        function = ctypes.CDLL(None).mallinfo2
    except (ImportError, OSError, AttributeError):  # not glibc (or older than 2.33)
        return None

    names = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in names]

    function.restype = Info
    function.argtypes = []
    return function


try:
    import os

    _PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):  # pragma: no cover - not a POSIX system
    _PAGE_SIZE = 4096


class _Active:
    """The budget of the render running in a context: one per context and thread.

    Renders in one thread never interleave (they do not wait on anything), so making a budget active is
    two attribute writes on this record rather than a new value of the context variable per render. A
    context copied to another thread (``contextvars.copy_context``, as tools' calls are run) gets its own
    record at its first render there, so two threads never share one.
    """

    __slots__ = ("budget", "spare", "thread")

    def __init__(self) -> None:
        #: the active budget (None between renders)
        self.budget: Budget = None  # type: ignore[assignment]
        #: a budget no render uses, renewed (:meth:`Budget.renew`): the next render of the thread takes it
        self.spare: Budget | None = None
        self.thread = get_ident()


_ACTIVE: ContextVar[_Active] = ContextVar("chatcodec_budget")


#: this context's record of the active budget, or the default given (None): ``current()`` without its checks
recorded = _ACTIVE.get


def current() -> _Active:
    """This context's record of the active budget, made on first use in this thread."""
    state = _ACTIVE.get(None)
    if state is None or state.thread != get_ident():
        state = _Active()
        _ACTIVE.set(state)
    return state


def active() -> Budget:
    """The budget of the render running in this context."""
    return _ACTIVE.get().budget


def activate(budget: Budget) -> Any:
    """Make ``budget`` the active one; returns a token for :func:`deactivate`."""
    state = current()
    previous = state.budget
    state.budget = budget
    return state, previous


def deactivate(token: Any) -> None:
    """Make the budget that was active before :func:`activate` gave ``token`` active again."""
    state, previous = token
    state.budget = previous


def check_size(size: int, what: str = "a value", nbytes: int = 0) -> None:
    """Refuse to build ``what`` of ``size`` characters or items (``nbytes`` bytes) if over the limit; pay if large."""
    if size > FAST_SIZE:
        _ACTIVE.get().budget.big(size, what, nbytes or size)


def check_bytes(nbytes: int, what: str) -> None:
    """Refuse to make ``what`` of about ``nbytes`` bytes if that alone is over the memory limit (before making it:
    one C call that allocates it all is not stopped by the memory readings between steps)."""
    limit = _ACTIVE.get().budget.limits.max_memory
    if nbytes > limit:
        raise LimitError(
            f"The template tried to build {what}, about {nbytes // 2**20:,} MiB, over the {limit // 2**20:,} MiB"
            " memory limit. Raise Limits(max_memory=...) if the input really needs it."
        )


def spend(steps: int) -> None:
    """Pay ``steps`` steps (a checkpoint the sandbox puts in long stretches of template code)."""
    budget = _ACTIVE.get().budget
    budget.steps -= steps
    if budget.steps <= 0:
        budget.tick()


def _touch(size: int) -> None:
    """Pay for reading ``size`` characters or items (called only when ``size > FAST_SIZE``)."""
    budget = _ACTIVE.get().budget
    budget.steps -= size >> _CHAR_SHIFT
    if budget.steps <= 0:
        budget.tick()


def _made(value: Any, what: str) -> Any:
    """Check and pay for a value just made, if it is large; return it."""
    kind = value.__class__
    if kind is str or kind is list or kind is tuple or kind is dict or isinstance(value, _SIZED):
        size = len(value)
        if size > FAST_SIZE:
            _ACTIVE.get().budget.big(size, what, _bytes(value))
    return value


def _bytes(value: Any) -> int:
    return sys.getsizeof(value) if isinstance(value, (str, bytes)) else 8 * len(value)


# --- loops and macros -------------------------------------------------------------------------------


#: iterables whose length is known up front
_SIZED_ITERABLES = frozenset({list, tuple, dict, str, range, type({}.keys()), type({}.values()), type({}.items())})


def counted(iterable: Iterable[Any], weight: int = 1) -> Iterable[Any]:
    """What every ``{% for %}`` iterates: ``iterable``, with ``weight`` steps spent per item.

    A short list, dict, string or range is charged in full when the loop starts and iterated as it is;
    anything longer, and other iterables (filter results), are wrapped to spend as they go, so that the
    clock is read during the loop and not only before it.
    """
    budget = _ACTIVE.get().budget
    if type(iterable) in _SIZED_ITERABLES:
        cost = (len(iterable) + 1) * weight  # type: ignore[arg-type]
        if cost <= STEP_CHUNK:
            budget.steps -= cost
            if budget.steps <= 0:
                budget.tick()
            return iterable
    return _counted_items(iterable, budget, weight)


def _counted_items(iterable: Iterable[Any], budget: Budget, weight: int) -> Iterator[Any]:
    for item in iterable:
        budget.steps -= weight
        if budget.steps <= 0:
            budget.tick()
        yield item


def counted_input(value: Any, what: str) -> Any:
    """The input of a filter that goes over it item by item in Python: refused if too long, else paid for.

    Iterators (the results of other filters) are wrapped to pay per item as they are produced; anything
    else is returned as it is, so the filter behaves exactly as it would on its own.
    """
    budget = _ACTIVE.get().budget
    if isinstance(value, Iterator):
        return _counted_items(value, budget, 1)
    try:
        count = len(value)
    except TypeError:
        return value
    budget.check_items(count, what)
    return value


def too_deep(budget: Budget) -> None:
    """Raise the error of a render whose macros or recursive loops nest deeper than its limit."""
    raise LimitError(
        f"Macros or recursive loops nested more than {budget.limits.max_depth} calls deep, the recursion"
        " limit. The template probably recurses without end; raise Limits(max_depth=...) if not."
    )


def enter_recursion(weight: int = 1) -> Budget:
    """A macro call or a recursive ``loop(...)``: one level deeper, and ``weight`` steps."""
    budget = _ACTIVE.get().budget
    budget.depth += 1
    if budget.depth > budget.limits.max_depth:
        too_deep(budget)
    budget.steps -= weight
    if budget.steps <= 0:
        budget.tick()
    return budget


# --- how much a value holds, counting shared references -----------------------------------------------

#: string types whose length counts; the sandbox adds Markup
STRINGS: set[type] = {str, bytes}
#: containers whose contents expanded_size walks; the sandbox adds its namespace type
EXPANDABLE: set[type] = {list, tuple, dict, type({}.keys()), type({}.values()), type({}.items())}


def expanded_size(value: Any, limit: int, work: list[int] | None = None) -> int:
    """About how many characters the repr or JSON of ``value`` takes: four per item plus string lengths.

    Every reference counts as often as it occurs, as printing would, so a list holding the same big
    list twice counts it twice. Each distinct container is measured once (its size is remembered), so
    the walk costs the number of distinct containers and their items, however often they are shared;
    it stops as soon as a size passes ``limit``, and a container that holds itself counts as endless.

    >>> expanded_size(["ab", {"k": 1}], 10**6)
    23

    ``work``, when given, gets the number of items looked at added to its first element.
    """
    strings, expandable = STRINGS, EXPANDABLE
    kind = value.__class__
    if kind not in expandable:
        return 4 + (len(value) if kind in strings else 0)
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack = [value]
    seen = 0
    while stack:
        node = stack[-1]
        key = id(node)
        if key in sizes:
            stack.pop()
            continue
        items: Sequence[Any] = _items(node)
        seen += len(items) + 1
        if 4 * len(items) > limit:
            size = 4 * len(items)
            break
        pending = [o for o in items if o.__class__ in expandable and id(o) not in sizes]
        if pending:
            if key in open_:
                size = limit + 1  # it holds itself
                break
            open_.add(key)
            stack += pending
            continue
        lengths: list[int] = [len(o) for o in items if o.__class__ in strings]  # type: ignore[arg-type]
        size = 4 * len(items) + sum(lengths)
        size += sum([sizes[id(o)] for o in items if o.__class__ in expandable])
        if size > limit:
            break
        sizes[key] = size
        stack.pop()
    else:
        size = 4 + sizes[id(value)]
    if work is not None:
        work[0] += seen
    return size


def _items(node: Any) -> Sequence[Any]:
    """What a container refers to: a list's items, a dict's keys and values, a namespace's attributes."""
    kind = node.__class__
    if kind is list or kind is tuple:
        return node  # type: ignore[no-any-return]
    if kind is dict:
        return [*node, *node.values()]
    return gc.get_referents(node)


def check_expanded(value: Any, what: str) -> Any:
    """Refuse ``value`` if it references more than ``max_output`` characters in all; return it."""
    budget = _ACTIVE.get().budget
    limit = budget.limits.max_output
    work = [0]
    size = expanded_size(value, limit, work)
    budget.spend(work[0] >> 4)  # about 16 items looked at per step
    if size > limit:
        raise LimitError(
            f"The template tried to build {what} that holds more than {limit:,} characters and items in all,"
            " counting each shared part as often as it occurs. Raise Limits(max_output=...) if the input"
            " really needs it."
        )
    return value


def _worth_measuring(result: Sequence[Any]) -> bool:
    """Whether a list or tuple just made from others may hold more than its length suggests."""
    return len(result) > FAST_SIZE or _holds_references(result)


def _holds_references(items: Iterable[Any]) -> bool:
    """Whether any of ``items`` is a container or a large string (what makes sharing expensive)."""
    expandable = EXPANDABLE
    for item in items:
        kind = item.__class__
        if kind is str:
            if len(item) > FAST_SIZE:
                return True
        elif kind in expandable:
            if kind not in _EMPTIABLE or item:
                return True
        elif isinstance(item, _SIZED) and len(item) > FAST_SIZE:
            return True
    return False


#: containers that hold nothing when empty (a namespace always counts: it can be filled later)
_EMPTIABLE = frozenset({list, tuple, dict})


def built(value: Any) -> Any:
    """A list, tuple or dict literal the template just built: checked when it holds other containers."""
    items = itertools.chain(value.keys(), value.values()) if value.__class__ is dict else value
    if _holds_references(items):
        check_expanded(value, "a list or dict")
    return value


# --- operators that can amplify their operands --------------------------------------------------------


def add(left: Any, right: Any) -> Any:
    """``left + right``, checked before it allocates."""
    if left.__class__ is str and right.__class__ is str:
        size = len(left) + len(right)
        if size > FAST_SIZE:
            _ACTIVE.get().budget.big(size, "a string", size)
        return left + right
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        check_size(len(left) + len(right), "a list")
        result = left + right  # type: ignore[operator]
        if _worth_measuring(result):
            check_expanded(result, "a list")
        return result
    if isinstance(left, int) and isinstance(right, int):
        return left + right  # at most one bit longer than the (bounded) operands
    if isinstance(left, str) and isinstance(right, str):
        check_size(len(left) + len(right), "a string")
    return _made(left + right, "a string or list")


def mul(left: Any, right: Any) -> Any:
    """``left * right``: repeated strings and lists, and integer products, checked before they allocate."""
    if isinstance(right, int) and isinstance(left, _SIZED):
        return _repeat(left, right)
    if isinstance(left, int) and isinstance(right, _SIZED):
        return _repeat(right, left)
    if isinstance(left, int) and isinstance(right, int):
        _check_bits(abs(left).bit_length() + abs(right).bit_length())
    return left * right


def _repeat(value: Any, times: int) -> Any:
    if times > 1:
        check_size(len(value) * times, "a repeated string or list", _bytes(value) * times)
        if not isinstance(value, (str, bytes)):
            limit = _ACTIVE.get().budget.limits.max_output
            if expanded_size(value, limit // times + 1) * times > limit:
                raise LimitError(
                    f"The template tried to repeat a list that would hold more than {limit:,} characters and items"
                    " in all. Raise Limits(max_output=...) if the input really needs it."
                )
    return value * times


def _check_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise LimitError(
            f"The template tried to build an integer of about {bits:,} bits, over the {MAX_INT_BITS:,} allowed"
            " (Python cannot print one of more than 4300 digits anyway)."
        )


def power(left: Any, right: Any) -> Any:
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        _check_bits(right * (abs(left).bit_length() - 1) + 1)
    return left**right


_PERCENT_SPEC = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)?", re.DOTALL)
_DIGITS = re.compile(r"\d+")


def _largest_int(values: Iterable[Any]) -> int:
    return max((v for v in values if isinstance(v, int)), default=0)


def _shown_size(value: Any) -> int:
    """About how long ``str(value)`` is, without building it."""
    if isinstance(value, str):
        return len(value)
    if value.__class__ in EXPANDABLE:
        return expanded_size(value, _ACTIVE.get().budget.limits.max_output + 1)
    return 24


def percent_size(fmt: str, args: Any, limit: int = sys.maxsize) -> int:
    """About how long ``fmt % args`` is: its text, the widths it asks for, and the values it shows.

    Stops counting once past ``limit``.
    """
    if "%" not in fmt:
        return len(fmt)
    positional = list(args) if isinstance(args, tuple) else [args]
    mapping = args if isinstance(args, dict) else None
    size = len(fmt)
    at = 0
    shown: dict[int, int] = {}  # a value named by many fields is measured once
    for match in _PERCENT_SPEC.finditer(fmt):
        key, width, precision, conversion = match.groups()
        if conversion == "%":
            continue
        for part in (width, precision):
            if part == "*":
                size += _largest_int(positional[at : at + 1])
                at += 1
            elif part:
                size += int(part)
        if key is not None and mapping is not None:
            value = mapping.get(key)
        else:
            value = positional[at] if at < len(positional) else None
            at += 1
        length = shown.get(id(value))
        if length is None:
            length = shown[id(value)] = _shown_size(value)
        size += length
        if conversion == "r" or conversion == "a":
            size += 4 * length  # escapes
        if size > limit:
            break
    return size


def mod(left: Any, right: Any) -> Any:
    """``left % right``: printf-style formatting checked for widths and repeated values before it runs."""
    if isinstance(left, (str, bytes)):
        text = left if isinstance(left, str) else left.decode("latin-1")
        if "%" in text:
            check_size(percent_size(text, right, _ACTIVE.get().budget.limits.max_output), "a formatted string")
    elif isinstance(left, int) and isinstance(right, int):
        pass  # the result is no longer than the operands
    return left % right


def concat(parts: Iterable[Any]) -> str:
    """The ``~`` operator: join the string forms of ``parts``."""
    result = "".join(map(str, parts))
    if len(result) > FAST_SIZE:
        _ACTIVE.get().budget.big(len(result), "a string", sys.getsizeof(result))
    return result


def slice_of(value: Any, start: Any, stop: Any, step: Any) -> Any:
    """``value[start:stop:step]``, paying for the copy when the value is large."""
    kind = value.__class__
    if (kind is str or kind is list or kind is tuple) and len(value) > FAST_SIZE:
        result = value[start:stop:step]
        return _made(result, "a slice")
    return value[start:stop:step]


def contains(needle: Any, haystack: Any) -> bool:
    """``needle in haystack``, paying for the scan when the haystack is large."""
    kind = haystack.__class__
    if (kind is str or kind is list or kind is tuple or isinstance(haystack, _SIZED)) and len(haystack) > FAST_SIZE:
        _touch(len(haystack))
    return needle in haystack


def _compared(left: Any, right: Any) -> None:
    if isinstance(left, _SIZED) and isinstance(right, _SIZED):
        size = min(len(left), len(right))
        if size > FAST_SIZE:
            _touch(size)


def eq(left: Any, right: Any) -> Any:
    _compared(left, right)
    return left == right


def ne(left: Any, right: Any) -> Any:
    _compared(left, right)
    return left != right


def lt(left: Any, right: Any) -> Any:
    _compared(left, right)
    return left < right


def le(left: Any, right: Any) -> Any:
    _compared(left, right)
    return left <= right


def gt(left: Any, right: Any) -> Any:
    _compared(left, right)
    return left > right


def ge(left: Any, right: Any) -> Any:
    _compared(left, right)
    return left >= right


def not_in(needle: Any, haystack: Any) -> bool:
    return not contains(needle, haystack)


#: the comparison functions by jinja's operator names
COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "eq": eq,
    "ne": ne,
    "lt": lt,
    "lteq": le,
    "gt": gt,
    "gteq": ge,
    "in": contains,
    "notin": not_in,
}


def chain(first: Any, *rest: tuple[str, Callable[[], Any]]) -> Any:
    """A chained comparison ``a < b < c``, operands evaluated lazily as Python does."""
    left = first
    result: Any = True
    for op, operand in rest:
        right = operand()
        result = COMPARISONS[op](left, right)
        if not result:
            return result
        left = right
    return result


def format_field(value: Any, spec: str) -> Any:
    """One field of ``str.format``: its width and precision checked before it is formatted."""
    if spec:
        widest = max(map(int, _DIGITS.findall(spec)), default=0)
        if widest > FAST_SIZE:
            check_size(widest, "a formatted field")
    result = format(value, spec)
    if len(result) > FAST_SIZE:
        _ACTIVE.get().budget.big(len(result), "a formatted field", sys.getsizeof(result))
    return result


class FormatTally:
    """The running size of one ``str.format`` call, so that ``'{0}{0}{0}…'`` cannot repeat a value unchecked."""

    __slots__ = ("size",)

    def __init__(self) -> None:
        self.size = 0

    def add(self, text: str) -> None:
        self.size += len(text)
        if self.size > FAST_SIZE:
            check_size(self.size, "a formatted string")


# --- str methods --------------------------------------------------------------------------------------


def _join_cost(separator: str, items: Sequence[Any]) -> int:
    try:
        text = sum(map(len, items))
    except TypeError:
        text = sum(len(i) if isinstance(i, str) else 0 for i in items)
    return len(separator) * len(items) + text


#: str methods whose result can be far longer than the string itself, or that cost more than its length
#: (a codec): never called without :func:`check_str_method`, however short the string
SIZED_STR_METHODS = frozenset(
    {"ljust", "rjust", "center", "zfill", "expandtabs", "replace", "join", "encode", "translate"}
)


def check_str_method(text: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a ``str`` (or ``bytes``) method call whose widths, tab sizes or replacements would explode.

    Pays for reading a large string and large arguments before the call.
    """
    size = len(text)
    for arg in args:
        if isinstance(arg, (str, bytes, list, tuple, dict)):
            size += len(arg)
    if size > FAST_SIZE:
        _touch(size)
    if name in ("strip", "lstrip", "rstrip") and args and isinstance(args[0], (str, bytes)) and len(args[0]) > 64:
        # each character of the text is looked up in the characters to strip: quadratic in the worst case
        _ACTIVE.get().budget.check_items(len(text) * len(args[0]) >> 14, f"str.{name} with {len(args[0]):,} characters")
    elif name in ("ljust", "rjust", "center", "zfill") and args:
        check_size(_largest_int(args[:1]), "a padded string")
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tabsize, int):
            check_size(len(text) + text.count("\t" if isinstance(text, str) else b"\t") * tabsize, "a string")
    elif name == "replace" and len(args) >= 2 and all(isinstance(a, (str, bytes)) for a in args[:2]):
        try:
            occurrences = text.count(args[0]) if args[0] else len(text) + 1
        except TypeError:  # str against bytes: the call itself will say so
            return
        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
            occurrences = min(occurrences, args[2])
        check_size(len(text) + occurrences * len(args[1]), "a string")
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        check_size(_join_cost(text, args[0]), "a joined string")
    elif name == "maketrans":
        check_size(sum(len(a) for a in args if isinstance(a, (str, dict))), "a translation table")
    elif name == "translate" and args:
        check_size(len(text) * _longest_mapping(args[0]), "a translated string")
    elif name in ("encode", "decode"):
        _check_codec(text, name, args, kwargs)
    elif name in ("split", "rsplit", "splitlines") and size > FAST_SIZE:
        # a list of up to a piece per character, each a string object of about 64 bytes
        pieces = _pieces(text, name, args, kwargs)
        check_bytes(pieces * 64, f"the list of str.{name} ({pieces:,} pieces)")
        _ACTIVE.get().budget.big(pieces, f"the list of str.{name}", pieces * 64)


def _longest_mapping(table: Any) -> int:
    """The most characters one character can become under ``str.translate(table)`` (at least 1); pays for
    reading the table."""
    values = table.values() if isinstance(table, dict) else table if isinstance(table, (list, tuple)) else ()
    if len(values) > FAST_SIZE:
        _touch(len(values))
    return max((len(v) for v in values if isinstance(v, (str, bytes))), default=1) or 1


def _pieces(text: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """How many pieces ``str.split``/``rsplit``/``splitlines`` can make of ``text``, at most."""
    sep = args[0] if args else kwargs.get("sep")
    if name != "splitlines" and isinstance(sep, (str, bytes)) and sep:
        return int(text.count(sep)) + 1
    return len(text) + 1


#: codecs a template may use, each with the most bytes (encode) or characters (decode) one character or byte
#: can become, by their canonical names (``codecs.lookup(name).name``). Others are refused: some are
#: quadratic (punycode, idna), some are not text codecs at all (rot13, base64, zlib: ``codecs.encode`` only).
CODECS: dict[str, int] = {
    "utf-8": 4,
    "utf-16": 4,
    "utf-16-le": 4,
    "utf-16-be": 4,
    "utf-32": 4,
    "utf-32-le": 4,
    "utf-32-be": 4,
    "ascii": 1,
    "latin-1": 1,
    "iso8859-1": 1,
    "cp1252": 1,
    "unicode-escape": 10,
    "raw-unicode-escape": 10,
}

#: what an error handler may write for one character it cannot encode or one byte it cannot decode
_ERROR_GROWTH = {"xmlcharrefreplace": 10, "backslashreplace": 10, "namereplace": 100, "surrogatepass": 4}


def _check_codec(value: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``str.encode`` and ``bytes.decode``: only the codecs of :data:`CODECS`, paid for before they run."""
    encoding = args[0] if args else kwargs.get("encoding", "utf-8")
    errors = args[1] if len(args) > 1 else kwargs.get("errors", "strict")
    if not isinstance(encoding, str) or not isinstance(errors, str):
        return  # the call itself says what is wrong
    try:
        canonical = codecs.lookup(encoding).name
    except LookupError:
        return  # an unknown codec: the call raises LookupError
    growth = CODECS.get(canonical)
    if growth is None:
        allowed = ", ".join(CODECS)
        raise SandboxError(
            f"Chat templates cannot {name} with the {encoding!r} codec (it is not a text codec, or costs more than"
            f" its input); the codecs allowed are {allowed}."
        )
    growth = max(growth, _ERROR_GROWTH.get(errors, 1))
    if isinstance(value, str) and value.isascii() and growth == 4:
        growth = 1 if canonical == "utf-8" else 4
    check_size(len(value) * growth, f"a {'bytes value' if name == 'encode' else 'string'} ({canonical})")


def call_str_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call a bound ``str`` method after :func:`check_str_method`; check the size of what it returns."""
    name = method.__name__
    if name == "join" and args:
        args = (list(counted_input(args[0], "str.join")), *args[1:])
    # str.maketrans is a static method: it has no string of its own
    check_str_method("" if method.__self__ is None else method.__self__, name, args, kwargs)
    return _made(method(*args, **kwargs), "a string")


# --- filters and tests ----------------------------------------------------------------------------------


def _value_index(function: Callable[..., Any]) -> int:
    """Where a filter's value is among its arguments: after the context jinja passes, if it asks for one."""
    return 1 if getattr(function, "jinja_pass_arg", None) is not None else 0


def _guard(original: Callable[..., Any], name: str, pre: Callable[..., None] | None = None) -> Callable[..., Any]:
    """A filter that pays for reading a large value, runs ``pre`` checks, and checks the size of its result."""
    at = _value_index(original)
    what = f"the result of |{name}"

    @wraps(original)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if len(args) > at:
            value = args[at]
            if isinstance(value, _SIZED) and len(value) > FAST_SIZE:
                _touch(len(value))
        if pre is not None:
            pre(*args[at:], **kwargs)
        return _made(original(*args, **kwargs), what)

    return checked


def _item_guard(original: Callable[..., Any], name: str, pre: Callable[..., None] | None = None) -> Callable[..., Any]:
    """A filter that goes over its value item by item in Python: refused over ``max_items``, paid per item."""
    at = _value_index(original)
    what = f"|{name}"

    @wraps(original)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if len(args) > at:
            args = (*args[:at], counted_input(args[at], what), *args[at + 1 :])
            if pre is not None:
                pre(*args[at:], **kwargs)
        return _made(original(*args, **kwargs), f"the result of {what}")

    return checked


def _text_guard(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A filter that works through its text slowly (regular expressions and Python loops per word)."""
    at = _value_index(original)
    what = f"|{name}"

    @wraps(original)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if len(args) > at:
            value = args[at]
            size = len(value) if isinstance(value, str) else _shown_size(value)
            if size > FAST_SIZE:
                _ACTIVE.get().budget.check_items(size, what)
        return _made(original(*args, **kwargs), f"the result of {what}")

    return checked


def _fill_cost(fill: Any, count: int) -> None:
    if fill is not None and count > 1 and (fill.__class__ in EXPANDABLE or isinstance(fill, _SIZED)):
        limit = _ACTIVE.get().budget.limits.max_output
        if _shown_size(fill) * count > limit:
            raise LimitError(f"The template tried to repeat a fill value more than {limit:,} characters in all.")


#: filters that are str methods on str values (the common case), with how many arguments the method takes
_FAST_TEXT: dict[str, tuple[Callable[..., str], int]] = {
    "trim": (str.strip, 1),
    "lower": (str.lower, 0),
    "upper": (str.upper, 0),
    "capitalize": (str.capitalize, 0),
}


def _fast_text(guarded: Callable[..., Any], method: Callable[..., str], arity: int) -> Callable[..., Any]:
    """``|trim``, ``|lower``...: the str method itself on a short str, the checked filter otherwise."""

    @wraps(guarded)
    def fast(value: Any, *args: Any, **kwargs: Any) -> Any:
        if value.__class__ is str and len(value) <= FAST_SIZE and len(args) <= arity and not kwargs:
            return method(value, *args)
        return guarded(value, *args, **kwargs)

    return fast


def guard_filters(filters: dict[str, Callable[..., Any]]) -> None:
    """Replace every jinja filter whose cost grows with its input by a checked version, in place."""
    original = dict(filters)

    def width(value: Any, width: Any = 80, *_: Any, **__: Any) -> None:
        if isinstance(width, int):
            check_size(_shown_size(value) + width, "the result of |center")

    def indent(value: Any, width: Any = 4, *_: Any, **__: Any) -> None:
        per_line = width if isinstance(width, int) else len(str(width))
        text = value if isinstance(value, str) else ""
        check_size(_shown_size(value) + (text.count("\n") + 1) * per_line, "the result of |indent")

    def replace(value: Any, old: Any = "", new: Any = "", count: Any = None, *_: Any, **__: Any) -> None:
        if isinstance(value, str) and isinstance(old, str) and isinstance(new, str):
            occurrences = value.count(old) if old else len(value) + 1
            if isinstance(count, int) and count >= 0:
                occurrences = min(occurrences, count)
            check_size(len(value) + occurrences * len(new), "the result of |replace")

    def batch(value: Any, linecount: Any = 0, fill_with: Any = None, *_: Any, **__: Any) -> None:
        if isinstance(linecount, int):
            check_size(linecount, "a batch")
            _fill_cost(fill_with, linecount)

    def slices(value: Any, slices: Any = 0, fill_with: Any = None, *_: Any, **__: Any) -> None:
        if isinstance(slices, int):
            _ACTIVE.get().budget.check_items(slices, "|slice")
            _fill_cost(fill_with, slices)

    def wordwrap(s: Any, width: Any = 79, _b: Any = True, wrapstring: Any = None, *_: Any, **kw: Any) -> None:
        wrapstring = kw.get("wrapstring", wrapstring)
        check_size(_shown_size(s) * (2 + (len(str(wrapstring)) if wrapstring else 1)), "the result of |wordwrap")

    def urlencode(value: Any, *_: Any, **__: Any) -> None:
        check_size(12 * _shown_size(value), "the result of |urlencode")  # %XX per UTF-8 byte

    def format_args(value: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(value, str):
            limit = _ACTIVE.get().budget.limits.max_output
            check_size(percent_size(value, kwargs or args, limit), "the result of |format")

    original_join = original["join"]

    @wraps(original_join)
    def checked_join(eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> str:
        items = list(counted_input(value, "|join"))  # a generator (from |map, say) is counted before it is joined
        strings = items if attribute is None else [None] * len(items)  # attribute values: sized after
        check_size(_join_cost(str(d), strings), "the result of |join")
        return str(_made(original_join(eval_ctx, items, d, attribute), "the result of |join"))

    original_sum = original["sum"]

    @wraps(original_sum)
    def checked_sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
        iterable = counted_input(iterable, "|sum")
        if type(start) not in (list, tuple):
            return original_sum(environment, iterable, attribute, start)
        # sum() over lists copies the running total at every step (quadratic); build the same result in one
        # pass, and let Python raise its own error at the first item of another type
        if attribute is not None:
            iterable = map(make_attrgetter(environment, attribute), iterable)
        items = list(iterable)
        kind = type(start)
        same = next((at for at, item in enumerate(items) if type(item) is not kind), len(items))
        check_size(len(start) + sum(map(len, items[:same])), "the result of |sum")
        result = start + kind(itertools.chain.from_iterable(items[:same]))
        if same < len(items):
            return sum(items[same:], result)
        if _worth_measuring(result):
            check_expanded(result, "the result of |sum")
        return result

    original_map = original["map"]

    @wraps(original_map)
    def checked_map(context: Any, value: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        budget = _ACTIVE.get().budget
        limit = budget.limits.max_output
        held = 0
        for item in original_map(context, counted_input(value, "|map"), *args, **kwargs):
            if item.__class__ in EXPANDABLE or (isinstance(item, str) and len(item) > FAST_SIZE):
                # a filter that returns one of its arguments (default, sum(start=...)) repeats it per item
                held += _shown_size(item)
                if held > limit:
                    raise LimitError(f"The result of |map holds more than {limit:,} characters in all.")
            yield item

    original_tojson = original.get("tojson")

    def pprint(value: Any) -> None:
        size = _shown_size(value)
        if size > FAST_SIZE:
            budget = _ACTIVE.get().budget
            budget.check_items(size // 4, "|pprint")

    for name, plain in original.items():
        if name in ("abs", "attr", "count", "d", "default", "first", "last", "length", "random", "round", "int"):
            continue  # constant time, and they make nothing large
        if name in ("map", "join", "sum", "tojson"):
            continue
        if name in ("sort", "unique", "groupby", "dictsort", "min", "max", "select", "reject", "selectattr",
                    "rejectattr", "xmlattr"):  # fmt: skip
            filters[name] = _item_guard(plain, name)
        elif name == "batch":
            filters[name] = _item_guard(plain, name, batch)
        elif name == "slice":
            filters[name] = _item_guard(plain, name, slices)
        elif name in ("urlize", "wordwrap", "title", "wordcount"):
            pre = wordwrap if name == "wordwrap" else None
            filters[name] = _guard(_text_guard(plain, name), name, pre)
        elif name == "pprint":
            filters[name] = _guard(plain, name, pprint)
        elif name == "center":
            filters[name] = _guard(plain, name, width)
        elif name == "indent":
            filters[name] = _guard(plain, name, indent)
        elif name == "replace":
            filters[name] = _guard(plain, name, replace)
        elif name == "urlencode":
            filters[name] = _guard(_text_guard(plain, name), name, urlencode)
        elif name == "format":
            filters[name] = _guard(plain, name, format_args)
        elif name in _FAST_TEXT:
            filters[name] = _fast_text(_guard(plain, name), *_FAST_TEXT[name])
        else:
            filters[name] = _guard(plain, name)
    filters["join"] = checked_join
    filters["sum"] = checked_sum
    filters["map"] = checked_map
    if original_tojson is not None:
        filters["tojson"] = original_tojson


def guard_tests(tests: dict[str, Any]) -> None:
    """Replace the jinja tests whose cost grows with their input by checked versions, in place."""

    def lower(value: Any) -> bool:
        text = str(value)
        if len(text) > FAST_SIZE:
            _touch(len(text))
        return text.islower()

    def upper(value: Any) -> bool:
        text = str(value)
        if len(text) > FAST_SIZE:
            _touch(len(text))
        return text.isupper()

    tests["lower"] = lower
    tests["upper"] = upper
    tests["in"] = contains
    for names, function in (
        (("==", "eq", "equalto"), eq),
        (("!=", "ne"), ne),
        ((">", "gt", "greaterthan"), gt),
        ((">=", "ge"), ge),
        (("<", "lt", "lessthan"), lt),
        (("<=", "le"), le),
    ):
        for name in names:
            tests[name] = function


# --- tojson and the clock ---------------------------------------------------------------------------


def check_json_layout(value: Any, indent: Any, separators: Any) -> None:
    """Refuse ``tojson`` layouts (indents, separators) that would blow the output up."""
    per_line = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    per_item = per_line + sum(len(s) for s in separators or () if isinstance(s, str))
    if per_item:
        budget = _ACTIVE.get().budget
        check_size(_json_layout_size(value, per_item, budget.limits.max_output), "the result of |tojson")


def _json_layout_size(value: Any, per_item: int, limit: int) -> int:
    """About how long the JSON of ``value`` is with ``per_item`` characters of layout per item and level.

    Its strings, four characters per item, and the layout: each item is indented once per level it is
    nested in. Walked level by level (no recursion), every reference counted as often as it occurs,
    and stopped once past ``limit``.
    """
    nodes = depth = chars = size = 0
    level: list[Any] = [value]
    while level:
        depth += 1
        nodes += len(level)
        nested: list[Any] = []
        for item in level:
            if isinstance(item, str):
                chars += len(item)
            elif isinstance(item, dict):
                nested += item.values()
                nodes += len(item)
                chars += sum([len(key) for key in item if isinstance(key, str)])
            elif isinstance(item, (list, tuple)):
                nested += item
        size = chars + 4 * nodes + nodes * (per_item + 1) * depth
        if size > limit:
            return size
        level = nested
    return size


_STRFTIME_WIDTH = re.compile(r"%[-_0^#]*(\d+)")


def check_strftime(fmt: Any) -> None:
    """Refuse ``strftime`` formats whose output would be huge (long formats, field widths)."""
    if isinstance(fmt, str):
        widest = max(map(int, _STRFTIME_WIDTH.findall(fmt)), default=0)
        # the longest directive (%c, %A, %B, ...) writes about 30 characters for 2
        check_size(16 * len(fmt) + widest, "a formatted date")
