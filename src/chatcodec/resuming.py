"""A render that takes over from the previous render of the same conversation, at its main loop (at the
top of the template, or in an ``if`` there, iterating the messages or a list set from them).

A chat that grows by a turn is rendered again whole: the template's loop over the messages runs once per
message, every time. Most of those iterations write what they wrote the last time. This module lets a
compiled template (:mod:`chatcodec.compiler`) skip them, and is exact by construction:

* **What a loop body can see** is fixed from the template's syntax tree (:func:`plan`): the message of the
  iteration (only its fields, read by constant keys), other messages by index, the loop's counters, and
  names from outside the loop, and the namespaces it sets attributes of. A message may also be tested, used
  as a condition, or set to a name read the same way. The body may call the template's macros that see no
  more: given the message (read field by field there too) or values from it, reading names from outside,
  setting attributes of namespaces from outside. Of several loops over the messages, the one that writes
  the most is resumed (not a scan for the last user turn). A body that calls an unknown function (or
  a macro that does, or calls back, or reads the messages), uses ``break``/``continue``, or reads the
  messages or a message in any other way (iterated, serialized, measured) has no plan: it is always
  rendered in full.
* **What each iteration read** is recorded as it runs: the highest message index it read, through
  ``messages[i]``, ``loop.nextitem`` or ``loop.last`` (which asks whether a next message exists); a read
  from the end (``messages[-1]``), past it, or of ``loop.length`` counts as reading every message.
* **A render resumes** at iteration ``k`` when iterations ``0..k-1`` cannot tell the two renders apart: the
  names from outside the loop hold equal values (compared strictly: ``1``, ``1.0`` and ``True`` differ,
  and so does the order of keys), the messages they read are the very objects the last render saw, which
  the caller vouches it has not changed (``trusted``), and every comparison of a loop counter with an
  outside value (``loop.index0 > ns.last_query_index``, which changes as the chat grows) has the same
  outcome for those iterations. Their output is then copied from the previous render, the namespaces the loop sets
  are put back as they were at the start of iteration ``k``, and the loop goes on from there.

Everything before and after the loop runs as usual, so only the loop's iterations are ever reused.
"""

from __future__ import annotations

import bisect
import itertools
import marshal
import operator
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes

from .limits import FAST_SIZE

__all__ = ["Memo", "Plan", "Record", "Recorder", "plan", "resume"]

#: what an iteration that read the end of the list, or its length, counts as having read
EVERYTHING = sys.maxsize

#: the functions a resumable loop body may call by name: each gives the same result for the same arguments
_PURE_CALLS = frozenset({"raise_exception", "namespace", "range", "dict"})
#: what a body may read of a message (a dict): a field, by attribute or constant key, or ``get``
_DICT_ITERATION = frozenset({"items", "keys", "values", "__iter__", "copy", "__len__"})
#: nodes a resumable body may not hold
_REFUSED = (
    nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.Include, nodes.Import, nodes.FromImport,
    nodes.Extends, nodes.Block, nodes.ContextReference, nodes.DerivedContextReference,
    nodes.EvalContextModifier, nodes.ScopedEvalContextModifier, nodes.OverlayScope, nodes.ExtensionAttribute,
    nodes.ImportedName, nodes.InternalName, nodes.Break, nodes.Continue,
)  # fmt: skip
#: comparisons, and what each becomes with its operands swapped
_FLIPPED = {"eq": "eq", "ne": "ne", "gt": "lt", "lt": "gt", "gteq": "lteq", "lteq": "gteq"}
#: loop counters and their offset from the iteration's index
_COUNTERS = {"index0": 0, "index": 1}
#: a template's macros by name
Macros = dict[str, nodes.Macro]


@dataclass(frozen=True)
class Plan:
    """A template's resumable loop: the loop, the name of what it iterates, the outside values it only
    compares with its counter (``(name, None)`` for a name, ``(name, attribute)`` for ``name.attribute``),
    and the namespaces it sets attributes of (their state is kept at the start of every iteration)."""

    loop: nodes.For
    items: str
    thresholds: tuple[tuple[str, str | None], ...]
    written: tuple[str, ...] = ()
    #: each comparison of the counter with a threshold: ``(op, shift, name, attribute)``, meaning
    #: ``index0 + shift <op> name.attribute`` (or ``name``)
    comparisons: tuple[tuple[str, int, str, str | None], ...] = ()
    #: the template's macros the body calls (a new function at every render: not part of what it sees), and
    #: the names from outside that they read
    macros: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()


def plan(template: nodes.Template) -> Plan | None:
    """The loop over the messages at the top of ``template`` (or in an ``if`` there) that a render may
    resume, if there is one."""
    top = list(_top_level(template.body))
    lists = {"messages"}  # the names of lists of messages: `loop_messages = messages`, or a slice of it
    others: set[str] = set()  # names also set to something else at the top
    for node in top:
        if isinstance(node, nodes.Assign) and isinstance(node.target, nodes.Name):
            value = node.node
            # `messages[1:]` or `messages[:k]`: the messages from some point on, or up to one (a resumed render
            # finds them at the end or the start)
            if isinstance(value, nodes.Getitem) and _end_cut(value.arg):
                value = value.node
            if isinstance(value, nodes.Name) and value.name in lists:
                lists.add(node.target.name)
            else:
                others.add(node.target.name)
    lists -= others
    # the macros defined once, at the top, under names nothing else sets
    assigned = {n.name for n in template.find_all(nodes.Name) if n.ctx in ("store", "param")}
    defined = [n for n in template.body if isinstance(n, nodes.Macro)]
    once = {name for name, count in Counter(n.name for n in defined).items() if count == 1}
    macros = {n.name: n for n in defined if n.name in once and n.name not in assigned}
    loops = []
    for node in top:
        if not isinstance(node, nodes.For):
            continue
        iterable = node.iter
        if isinstance(iterable, nodes.Filter) and iterable.name == "_cc_counted":  # the sandbox's counting
            iterable = iterable.node  # type: ignore[assignment]
        if isinstance(iterable, nodes.Name) and iterable.name in lists:
            loops.append((node, iterable.name))
    if not loops:
        return None
    parents: dict[int, nodes.Node] = {id(child): template for child in template.iter_child_nodes()}
    for parent in template.find_all(nodes.Node):
        for child in parent.iter_child_nodes():
            parents[id(child)] = parent
    if not _messages_read_by_field(template, lists, macros, parents):
        return None
    plans = [found for found in (_check(node, items, macros, lists, parents) for node, items in loops) if found]
    # the loop that writes the prompt, rather than one that only looks for something (the last user turn)
    return max(plans, key=lambda found: _writing(found.loop), default=None)


def _writing(loop: nodes.For) -> int:
    """How many places of the loop's body write something but white space."""
    count = 0
    for output in loop.find_all(nodes.Output):
        for part in output.nodes:
            if not (isinstance(part, nodes.TemplateData) and not part.data.strip()):
                count += 1
    return count


def _end_cut(arg: nodes.Node) -> bool:
    """A slice with a start or a stop but not both, and no step."""
    return isinstance(arg, nodes.Slice) and arg.step is None and (arg.start is None or arg.stop is None)


def _top_level(body: Sequence[nodes.Node]) -> Iterator[nodes.Node]:
    """The nodes of a template's body in order, and those in the branches of its ``if`` blocks: what runs
    once per render, never in a loop or a macro."""
    for node in body:
        yield node
        if isinstance(node, nodes.If):
            yield from _top_level(node.body)
            for branch in node.elif_:
                yield from _top_level([branch])
            yield from _top_level(node.else_)


def _messages_read_by_field(
    template: nodes.Template, lists: set[str], macros: Macros, parents: dict[int, nodes.Node]
) -> bool:
    """Whether the template reads messages only field by field, wherever it reads them: the lists of
    messages (``lists``) indexed, sliced, measured or looped over, and each message only by its fields.

    A resumed render gives the template the messages it saw the last time, which equal the caller's in
    every field but may hold their keys in another order: a template that never iterates or serializes a
    message cannot tell.
    """
    loops: list[nodes.For] = []
    for name in template.find_all(nodes.Name):
        if name.name not in lists or name.ctx != "load":
            continue
        above = parents.get(id(name))
        if isinstance(above, nodes.Getitem) and above.node is name:
            if isinstance(above.arg, nodes.Slice):
                above, name = parents.get(id(above)), above  # type: ignore[assignment]
            elif _field_read(parents.get(id(above)), above) or _aliased(above, parents, macros):
                continue
            else:
                return False
        while _selected(above, name):  # `messages|selectattr('role', 'equalto', 'system')|list`: messages still
            above, name = parents.get(id(above)), above  # type: ignore[assignment]
        if isinstance(above, nodes.Filter) and above.node is name:
            if above.name in ("length", "count"):
                continue
            if above.name == "_cc_counted":
                above, name = parents.get(id(above)), above  # type: ignore[assignment]
        if isinstance(above, nodes.For) and above.iter is name and isinstance(above.target, nodes.Name):
            loops.append(above)
        elif isinstance(above, nodes.Assign) and isinstance(above.target, nodes.Name) and above.target.name in lists:
            continue
        elif not (isinstance(above, nodes.Test) and above.node is name) and not _truth_read(above, name, parents):
            return False
    for loop in loops:
        target = loop.target.name  # type: ignore[attr-defined]
        for top in loop.body:
            for node in [top, *top.find_all(nodes.Name)]:
                is_target = isinstance(node, nodes.Name) and node.name == target and node.ctx == "load"
                if is_target and not _message_read(parents.get(id(node)), node, parents, macros):
                    return False
    return True


def _message_read(above: nodes.Node | None, value: nodes.Node, parents: dict[int, nodes.Node], macros: Macros) -> bool:
    """Whether ``above`` reads ``value`` (a message) field by field: a field, a test, its truth, or passed whole
    to a macro of the template that reads it so."""
    return _field_read(above, value) or _truth_read(above, value, parents) or _passed_whole(above, value, macros)


def _aliased(value: nodes.Getitem, parents: dict[int, nodes.Node], macros: Macros) -> bool:
    """Whether ``value`` (a message read by index) is set to a name (``{% set first = messages[0] %}``) that
    is read, wherever it is read, field by field."""
    above = parents.get(id(value))
    if not (isinstance(above, nodes.Assign) and above.node is value and isinstance(above.target, nodes.Name)):
        return False
    alias = above.target.name
    template: nodes.Node = above
    while id(template) in parents:
        template = parents[id(template)]
    return all(
        _message_read(parents.get(id(node)), node, parents, macros)
        for node in template.find_all(nodes.Name)
        if node.name == alias and node.ctx == "load"
    )


def _selected(above: nodes.Node | None, value: nodes.Node) -> bool:
    """Whether ``above`` keeps some of the messages ``value`` holds, by one field each (``selectattr`` or
    ``rejectattr`` with a constant attribute name), or makes a list of them: it holds messages too."""
    if not isinstance(above, nodes.Filter) or above.node is not value:
        return False
    if above.name == "list":
        return not above.args and not above.kwargs
    return (
        above.name in ("selectattr", "rejectattr")
        and bool(above.args)
        and isinstance(above.args[0], nodes.Const)
        and type(above.args[0].value) is str
    )


def _truth_read(above: nodes.Node | None, name: nodes.Node, parents: dict[int, nodes.Node]) -> bool:
    """Whether ``name`` is read only as a condition (``{% if messages %}``, ``not messages``, ``if m and
    m.content``): its length."""
    if isinstance(above, (nodes.If, nodes.CondExpr)):
        return above.test is name
    if isinstance(above, (nodes.And, nodes.Or)):  # a condition if the whole is one (else its value shows)
        return _truth_read(parents.get(id(above)), above, parents)
    return isinstance(above, nodes.Not) and above.node is name


def _check(loop: nodes.For, items: str, macros: Macros, lists: set[str], parents: dict[int, nodes.Node]) -> Plan | None:
    if loop.else_ or loop.test is not None or loop.recursive or not isinstance(loop.target, nodes.Name):
        return None
    target = loop.target.name
    everything = [n for top in loop.body for n in [top, *top.find_all(nodes.Node)]]
    stored = {n.name for n in everything if isinstance(n, nodes.Name) and n.ctx in ("store", "param")}
    if target in stored or items in stored or "loop" in stored:
        return None
    inner = {id(n) for f in everything if isinstance(f, nodes.For) for top in f.body for n in top.find_all(nodes.Node)}
    compared: dict[int, tuple[str, int, nodes.Expr]] = {}  # id of an outside value -> (how, shift, it)
    called: list[str] = []
    for node in everything:
        if isinstance(node, _REFUSED) or (isinstance(node, nodes.Filter) and node.name == "random"):
            return None
        if isinstance(node, nodes.Call) and not _pure_call(node):
            if _macro_call(node, macros) is None:
                return None
            called.append(node.node.name)  # type: ignore[attr-defined]
        if isinstance(node, nodes.Compare) and id(node) not in inner and len(node.ops) == 1:
            left, right, op = node.expr, node.ops[0].expr, node.ops[0].op
            for counter, other, how in ((left, right, op), (right, left, _FLIPPED.get(op))):
                shift = _counter(counter)
                if shift is not None and how in _FLIPPED and _outside(other):
                    compared[id(other)] = (how, shift, other)
                    break
    uses: dict[tuple[str, str | None], list[bool]] = {}  # (name, attribute) -> compared only, per use
    for node in everything:
        if not (isinstance(node, nodes.Name) and node.ctx == "load"):
            continue
        above = parents.get(id(node))
        if node.name == target and not _message_read(above, node, parents, macros):
            return None
        if node.name == items and not _items_read(above, node, parents, macros):
            return None
        if node.name in (target, items, "loop") or node.name in stored:
            continue
        if isinstance(above, nodes.Getattr) and above.node is node:
            uses.setdefault((node.name, above.attr), []).append(id(above) in compared)
        uses.setdefault((node.name, None), []).append(id(node) in compared)
    seen_by_macros = _macro_reads(called, macros)
    if seen_by_macros is None:
        return None
    reads, macro_written = seen_by_macros
    if not reads.isdisjoint({target, items, "loop", *lists, *stored}):
        return None  # a macro that reads the messages, or a name the body sets: it is not resumed
    for name in reads:  # a macro may read any attribute of them: none is only compared with the counter
        uses.setdefault((name, None), [])
    for (name, _), compared_only in uses.items():
        if name in reads:
            compared_only.append(False)
    written = tuple(sorted({n.name for n in everything if isinstance(n, nodes.NSRef)} | macro_written))
    if target in written or items in written:
        return None
    thresholds: list[tuple[str, str | None]] = []
    for (name, attribute), compared_only in uses.items():
        if name in written or not all(compared_only):
            continue
        if attribute is not None or not any(k[0] == name and k[1] for k in uses):
            thresholds.append((name, attribute))
    comparisons = []
    for how, shift, other in compared.values():
        if isinstance(other, nodes.Name):
            name, attribute = other.name, None
        else:
            name, attribute = other.node.name, other.attr  # type: ignore[attr-defined]
        if (name, attribute) in thresholds:
            comparisons.append((how, shift, name, attribute))
    return Plan(
        loop, items, tuple(thresholds), written, tuple(comparisons), tuple(dict.fromkeys(called)), tuple(sorted(reads))
    )


def _items_read(above: nodes.Node | None, items: nodes.Name, parents: dict[int, nodes.Node], macros: Macros) -> bool:
    """Whether the loop's body reads the list it iterates as it may: a message by index (read field by field,
    or set to a name read so), the messages from an index on (looped over), or their number (as if reading
    every message, as ``loop.length`` does)."""
    if isinstance(above, nodes.Filter) and above.node is items:
        return above.name in ("length", "count")
    if not (isinstance(above, nodes.Getitem) and above.node is items):
        return False
    return (
        _field_read(parents.get(id(above)), above)
        or _looped_over_from(above, parents)
        or _aliased(above, parents, macros)
    )


def _macro_call(call: nodes.Call, macros: Macros) -> nodes.Macro | None:
    """The template's macro ``call`` calls, with plain arguments (no ``*args``, ``**kwargs``)."""
    function = call.node
    if not isinstance(function, nodes.Name) or call.dyn_args is not None or call.dyn_kwargs is not None:
        return None
    return macros.get(function.name)


def _macro_reads(called: Sequence[str], macros: Macros) -> tuple[set[str], set[str]] | None:
    """What the macros ``called`` (and the macros they call) read from outside them, and the namespaces from
    outside they set attributes of; None if one of them may do anything else: call an unknown function or
    ``caller``, define or import anything, or set an attribute of a namespace it was given.

    A macro is called with the values its call passes (checked with the loop body) and sees the rest of the
    render through the names it reads: with those names, it writes the same output every time.
    """
    reads: set[str] = set()
    written: set[str] = set()
    pending, done = list(called), set()
    while pending:
        name = pending.pop()
        if name in done:
            continue
        done.add(name)
        macro = macros[name]
        body = [*macro.defaults, *macro.body]
        everything = [n for top in body for n in [top, *top.find_all(nodes.Node)]]
        params = {argument.name for argument in macro.args} | {"loop", "varargs", "kwargs"}  # `loop`: its own
        bound = _bound_by_loops(everything)
        for node in everything:
            if isinstance(node, _REFUSED) or (isinstance(node, nodes.Filter) and node.name == "random"):
                return None
            if isinstance(node, nodes.Call) and not _pure_call(node):
                inner = _macro_call(node, macros)
                if inner is None:
                    return None
                pending.append(inner.name)
            elif isinstance(node, nodes.NSRef):
                if node.name in params:
                    return None  # a namespace it was given: whose, the plan cannot tell
                written.add(node.name)  # one from outside, or its own: the outside one is kept either way
            elif isinstance(node, nodes.Name) and node.ctx == "load" and node.name not in params:
                if node.name == "caller":
                    return None
                if node.name not in macros and id(node) not in bound:  # a name it sets counts: it may read it first
                    reads.add(node.name)
    return reads, written


def _bound_by_loops(everything: Sequence[nodes.Node]) -> set[int]:
    """The names read in the body of a loop among ``everything`` that binds them (``for key, value in ...``):
    the loop's own, not the render's."""
    bound: set[int] = set()
    for loop in everything:
        if isinstance(loop, nodes.For):
            targets = {n.name for n in [loop.target, *loop.target.find_all(nodes.Name)] if isinstance(n, nodes.Name)}
            for top in [*loop.body, *([loop.test] if loop.test is not None else [])]:
                for node in [top, *top.find_all(nodes.Name)]:
                    if isinstance(node, nodes.Name) and node.ctx == "load" and node.name in targets:
                        bound.add(id(node))
    return bound


def _looped_over_from(cut: nodes.Getitem, parents: dict[int, nodes.Node]) -> bool:
    """Whether ``cut`` is a slice of the messages that an inner loop iterates (``for later in
    messages[loop.index:]``): reading it counts as reading every message, and the template reads the inner
    loop's messages field by field (checked with the whole template)."""
    iterated: nodes.Node = cut
    above = parents.get(id(cut))
    if isinstance(above, nodes.Filter) and above.name == "_cc_counted":  # the sandbox's counting
        iterated, above = above, parents.get(id(above))
    return isinstance(cut.arg, nodes.Slice) and isinstance(above, nodes.For) and above.iter is iterated


def _passed_whole(above: nodes.Node | None, value: nodes.Node, macros: Macros) -> bool:
    """Whether ``above`` passes ``value`` (a message) to a macro of the template, as a positional argument
    that the macro reads only field by field."""
    macro = _macro_call(above, macros) if isinstance(above, nodes.Call) else None
    if macro is None:
        return False
    position = next((i for i, argument in enumerate(above.args) if argument is value), len(macro.args))  # type: ignore[union-attr]
    if position >= len(macro.args):
        return False
    param = macro.args[position].name
    parents = {id(child): parent for parent in macro.find_all(nodes.Node) for child in parent.iter_child_nodes()}
    return all(
        _field_read(parents.get(id(node)), node) or _truth_read(parents.get(id(node)), node, parents)
        for node in macro.find_all(nodes.Name)
        if node.name == param and node.ctx == "load"
    )


def _pure_call(call: nodes.Call) -> bool:
    """A method of a value (``content.split(...)``), or a function of :data:`_PURE_CALLS`."""
    function = call.node
    if isinstance(function, nodes.Getattr):
        return not (isinstance(function.node, nodes.Name) and function.node.name == "loop")
    return isinstance(function, nodes.Name) and function.name in _PURE_CALLS


def _counter(node: nodes.Node) -> int | None:
    if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop":
        return _COUNTERS.get(node.attr)
    return None


def _outside(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Name) or (isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name))


def _field_read(above: nodes.Node | None, value: nodes.Node) -> bool:
    """Whether ``above`` reads one field of ``value`` (a message): ``m.role``, ``m['role']``, ``m.get(...)``,
    ``'role' in m``, or tests it (``m is mapping``); nothing that depends on the order or the number of its
    keys."""
    if isinstance(above, nodes.Getattr) and above.node is value:
        return above.attr not in _DICT_ITERATION
    if isinstance(above, nodes.Getitem) and above.node is value:
        return isinstance(above.arg, nodes.Const) and type(above.arg.value) is str
    if isinstance(above, nodes.Operand):  # `'tool_calls' in message`: whether it has a key
        return above.op in ("in", "notin") and above.expr is value
    return isinstance(above, nodes.Test) and above.node is value


# --- at run time ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Record:
    """What one render kept of its resumable loop: what it iterated and saw from outside, the render's
    ``text`` and where the loop's output starts in it (``at``), where each iteration's output starts
    (``offsets``, from ``at``, and the end), the highest message index iterations ``0..i`` read (``reach``),
    and the state of the namespaces the loop sets at the start of each iteration, and at the end
    (``states``). Without ``text`` (the caller sets it once the render returns) nothing is resumed."""

    function: Any
    items: list[Any]
    key: tuple[Any, ...]
    thresholds: tuple[tuple[str, int, Any], ...]
    at: int
    offsets: list[int]
    reach: list[int]
    states: list[tuple[Any, ...]]
    text: str | None = None
    #: where the loop's items start in the render's messages, when they are a cut of them (else -1)
    origin: int = -1


class Memo:
    """What a caller gives a render to resume from: the ``previous`` render's record, and how many leading
    messages it vouches for (``trusted``: the very objects the previous render saw, at the same places, and
    unchanged since); the render leaves its own record in ``record``.

    A loop over the messages, or over a cut of them (``messages[1:]``) that starts where the last one did,
    takes the vouched-for ones as they are."""

    __slots__ = ("messages", "previous", "record", "resumed", "trusted")

    def __init__(self, previous: Record | None = None, trusted: int = 0) -> None:
        self.previous = previous
        self.trusted = trusted
        self.record: Record | None = None
        #: the messages the render saw (normalized), which a caller may pass again as the trusted ones
        self.messages: list[Any] | None = None
        #: how many iterations the render took over (for tests and benchmarks)
        self.resumed = 0


class Recorder:
    """The running loop's record: compiled code calls :meth:`begin` and :meth:`end` around each iteration."""

    __slots__ = (
        "base", "copied", "current", "function", "items", "key", "long", "memo", "offsets", "origin",
        "pieces", "reach", "start", "starts", "state", "states", "thresholds", "top",
    )  # fmt: skip

    def __init__(
        self, memo: Memo, function: Any, items: list[Any], key: tuple[Any, ...], thresholds: Any, output: list[str]
    ) -> None:
        self.memo = memo
        self.function = function
        self.items = items
        self.key = key
        self.thresholds = thresholds
        self.start = 0
        self.current = 0
        self.top = -1
        #: the render's output, and its length (in parts) where the loop starts
        self.pieces = output
        self.base = len(output)
        #: where each iteration this render runs starts in ``pieces``
        self.starts: list[int] = []
        #: where each iteration starts in the loop's text: those copied from the last render, then the others
        self.offsets: list[int] = []
        #: the characters copied from the last render (one part of ``pieces``)
        self.copied = 0
        self.reach: list[int] = []
        self.states: list[tuple[Any, ...]] = []
        #: the namespaces' state the loop goes on from (None: as they are)
        self.state: tuple[Any, ...] | None = None
        #: whether the copied output is longer than the compiled code's short parts (then measured at the end)
        self.long = False
        #: where the loop's items start in the messages (-1: not a cut of them)
        self.origin = -1

    def begin(self, index: int, at: int, state: tuple[Any, ...] = ()) -> None:
        self.starts.append(at)
        self.current = index
        if state:
            self.states.append(state)

    def see(self, index: int, length: int) -> bool:
        """Iteration reads whether message ``index`` exists (``loop.last``) or what it is (``loop.nextitem``)."""
        if index >= length:
            self.current = EVERYTHING
        elif index > self.current:
            self.current = index
        return True

    def everything(self) -> bool:
        """The iteration read the length of the list (``loop.length``, ``loop.revindex``)."""
        self.current = EVERYTHING
        return True

    def end(self) -> None:
        if self.current > self.top:
            self.top = self.current
        self.reach.append(self.top)

    def done(self, at: int, state: tuple[Any, ...] = ()) -> None:
        """The loop ended with ``at`` parts in the output: the record, with the offsets of the iterations this
        render ran measured from their parts' sizes."""
        starts = self.starts
        starts.append(at)
        if state:
            self.states.append(state)
        pieces = self.pieces
        first = starts[0]
        sizes = list(itertools.accumulate(map(len, pieces[first:at]), initial=self.copied))
        self.offsets += [sizes[start - first] for start in starts]
        self.memo.record = Record(
            self.function, self.items, self.key, self.thresholds, sum(map(len, pieces[: self.base])),
            self.offsets, self.reach, self.states, origin=self.origin,
        )  # fmt: skip


def resume(
    memo: Memo,
    function: Any,
    messages: Any,
    items: Any,
    key: tuple[Any, ...],
    thresholds: tuple[tuple[str, int, Any], ...],
    output: list[str],
) -> Recorder:
    """At the loop's start: a recorder, with the output of the iterations that need not run again copied to
    ``output`` (one part, cut from the previous render's text) and :attr:`Recorder.start` the first one to
    run."""
    recorder = Recorder(memo, function, items, key, thresholds, output)
    previous = memo.previous
    if type(items) is not list:
        return recorder
    recorder.origin = origin = _origin(messages, items)
    if previous is None or previous.text is None or previous.function is not function:
        return recorder
    start = _agreeing(previous, messages, items, memo.trusted, origin)
    if start and not _same(previous.key, key):
        start = 0
    for (op, shift, value), (_, _, before) in zip(thresholds, previous.thresholds, strict=True):
        if start:
            start = min(start, _first_disagreement(op, shift, before, value))
    if start:
        copied = previous.text[previous.at : previous.at + previous.offsets[start]]
        output.append(copied)
        recorder.copied = len(copied)
        recorder.long = len(copied) > FAST_SIZE
        recorder.offsets = previous.offsets[:start]
        recorder.reach = previous.reach[:start]
        if previous.states:
            recorder.states = previous.states[:start]
            recorder.state = previous.states[start]
        recorder.top = previous.reach[start - 1]
        recorder.start = memo.resumed = start
    return recorder


def _origin(messages: Any, items: list[Any]) -> int:
    """Where ``items`` start in ``messages``, when they are the messages or a cut of them (the plan lets a
    loop over nothing else resume: the messages, ``messages[k:]`` or ``messages[:k]``); -1 when that is not
    sure (a cut from either end would fit: the same object twice in the messages)."""
    if items is messages:
        return 0
    if type(messages) is not list or not items or len(items) > len(messages):
        return -1
    last = len(items) - 1
    first = items[0] is messages[0] and items[last] is messages[last]  # messages[:k]
    end = len(messages) - len(items)  # messages[k:]
    if items[0] is messages[end] and items[last] is messages[-1]:
        return end if not first or not end else -1
    return 0 if first else -1


def _agreeing(previous: Record, messages: Any, items: list[Any], trusted: int, origin: int) -> int:
    """How many iterations read only messages that are the same, vouched-for objects as the last time."""
    if type(messages) is not list:
        return 0
    if origin >= 0 and origin == previous.origin:
        # items[i] is messages[origin + i], which the caller vouches is what the last render saw at that place:
        # the last items[i]
        bound = min(trusted - origin, len(items), len(previous.items))
        return min(bisect.bisect_left(previous.reach, bound), bound) if bound > 0 else 0
    # `messages[:k]` starts where the messages do, `messages[1:]` ends where they do (checked below, item by item)
    offset = 0 if items is messages or (items and messages and items[0] is messages[0]) else len(messages) - len(items)
    bound = min(trusted - offset, len(items), len(previous.items))
    if offset < 0 or bound <= 0:
        return 0
    # the usual growth: the items so far are the previous ones, and the rest new (map stops at the shorter), in
    # one short-circuiting pass (two for `messages[1:]`: its items are the messages too)
    usual = (
        len(previous.items) == bound
        and all(map(operator.is_, items, previous.items))
        and (not offset or all(map(operator.is_, items, messages[offset : offset + bound])))
    )
    if not usual:
        same = list(map(operator.is_, items[:bound], previous.items[:bound]))
        if offset:
            same = list(map(operator.and_, same, map(operator.is_, items[:bound], messages[offset : offset + bound])))
        if False in same:
            bound = same.index(False)
    return min(bisect.bisect_left(previous.reach, bound), bound)


def _first_disagreement(op: str, shift: int, before: Any, after: Any) -> int:
    """The first index ``i >= 0`` where ``i + shift <op> before`` and ``i + shift <op> after`` differ."""
    if type(before) is not int or type(after) is not int:
        return EVERYTHING if _same(before, after) else 0
    if before == after:
        return EVERYTHING
    if op in ("eq", "ne"):
        points = [v - shift for v in (before, after) if v - shift >= 0]
        return min(points, default=EVERYTHING)
    edge = {"gt": 1, "gteq": 0, "lt": 0, "lteq": 1}[op]  # the outcome flips at i = value - shift + edge
    flips = max(0, before - shift + edge), max(0, after - shift + edge)
    return EVERYTHING if flips[0] == flips[1] else min(flips)


def _same(a: Any, b: Any) -> bool:
    """Strict equality of plain values: types and the order of keys count (``1 == True`` does not)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(map(_same, a, b))
    try:
        return marshal.dumps(a, 2) == marshal.dumps(b, 2)  # version 2: no references, one text per value
    except ValueError:  # not plain data (an undefined value is the same object in every render, or not same)
        if type(a) is dict:  # a namespace's attributes (value()), one of them not plain data
            return len(a) == len(b) and all(map(_same, a, b)) and all(map(_same, a.values(), b.values()))
        return False


def value(item: Any, thresholds: Sequence[str], namespace: type) -> Any:
    """What a name from outside the loop contributes to the key: a namespace's attributes (without those
    only compared with the counter), anything else as it is."""
    if type(item) is namespace:
        attributes = item.__dict__
        if not thresholds:
            return dict(attributes)
        return {k: v for k, v in attributes.items() if k not in thresholds}
    return item


def snapshot(item: Any, namespace: type) -> Any:
    """A namespace's attributes as they are now (a copy), for :func:`restore`."""
    return dict(item.__dict__) if type(item) is namespace else None


def restore(item: Any, state: dict[str, Any] | None) -> None:
    """Put a namespace's attributes back as :func:`snapshot` saw them."""
    if state is not None:
        item.__dict__.clear()
        item.__dict__.update(state)


def attribute(item: Any, name: str, namespace: type) -> Any:
    """A namespace's (or dict's) attribute compared with the counter, or the item itself if it has none."""
    if type(item) is namespace:
        return item.__dict__.get(name, item)
    if type(item) is dict:
        return item.get(name, item)
    return item


def names(body: Sequence[nodes.Node], skip: set[str]) -> Iterator[str]:
    """The names a loop body reads, in order, each once, but ``skip``."""
    seen = set(skip)
    for top in body:
        for node in [top, *top.find_all(nodes.Name)]:
            if isinstance(node, nodes.Name) and node.ctx == "load" and node.name not in seen:
                seen.add(node.name)
                yield node.name
