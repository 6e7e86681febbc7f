"""What a template can see of its messages: the keys it reads, when it reads nothing else.

A render gives the template its messages normalized (:mod:`chatcodec.render`, parity §5): ``None`` values
dropped, values rebuilt from plain types, reasoning aliases added. Most of that is work on keys most
templates never look at: an OpenAI client sends ``"tool_calls": null`` and ``"refusal": null`` with every
assistant message, an agent keeps its tool calls in the history while the template is Llama 2's. When every
use of the messages in a template is a key read (``message.role``, ``message['content']``,
``message.get('name')``), an index, a slice, a loop or a length, the template sees those keys and nothing
else of a message, and only they need the work.

The reading is syntactic and errs one way: any other use of a message (printed, passed to a macro or a
filter, iterated, its ``items()``, a loop's ``previtem``...) gives None, and the render normalizes every key
as before. Reading more keys than a render reaches only costs work.

>>> from jinja2 import Environment
>>> tree = Environment().parse("{% for m in messages %}{{ m.role }}: {{ m['content'] }}{% endfor %}")
>>> sorted(reads(tree, frozenset({"messages"})))
['content', 'role']
>>> print(reads(Environment().parse("{{ messages[0] | tojson }}"), frozenset({"messages"})))
None
"""

from __future__ import annotations

from collections.abc import Iterator

from jinja2 import nodes

from .sandbox import DICT_ATTRIBUTES  # ``message.items`` is the dict's method, not a key

__all__ = ["ALIASED", "reads"]

#: the keys the reasoning aliases add to a message that has any of the three reasoning fields (§5.4)
ALIASED = frozenset({"thinking", "reasoning_content"})
#: uses of a list of messages that see no message: its length, whether it is defined
_COUNTS = frozenset({"length", "count"})
_DEFINED = frozenset({"defined", "undefined"})
#: the filter the sandbox wraps every loop's iterable in, to charge its steps (sandbox.Environment)
_COUNTED = "_cc_counted"
#: what the loop over the messages tells of the items around the current one
_NEIGHBOURS = frozenset({"previtem", "nextitem"})


def reads(tree: nodes.Template, lists: frozenset[str]) -> frozenset[str] | None:
    """The keys of a message the template can read, or None when it may see a message whole.

    ``lists`` are the names that only ever hold the messages or slices of them (the compiler's
    ``_message_lists``); ``messages`` must be one of them.
    """
    if "messages" not in lists or _names_neighbours(tree):
        return None
    reading = _Reading(tree, lists)
    keys: set[str] = set()
    for parent, field, child in reading.edges:
        if reading.is_list(child):
            if not reading.list_use(parent, field):
                return None
        elif reading.is_item(child):
            key = reading.item_use(parent, field)
            if key is None:
                return None
            if key:
                keys.add(key)
    return frozenset(keys)


class _Reading:
    """One template's tree, read for the uses of its messages."""

    def __init__(self, tree: nodes.Template, lists: frozenset[str]) -> None:
        self.lists = lists
        self.edges = list(_edges(tree))
        #: each node's parent and the parent's field that holds it
        self.parents = {id(child): (parent, field) for parent, field, child in self.edges}
        #: `loop.previtem` and `loop.nextitem` of a loop over messages: a message
        self.neighbours = {
            id(node)
            for node in tree.find_all(nodes.Getattr)
            if node.attr in _NEIGHBOURS and isinstance(node.node, nodes.Name) and node.node.name == "loop"
            and (loop := self._loop_of(node)) is not None and self.is_list(loop.iter)
        }  # fmt: skip
        self.items: frozenset[str] = frozenset()  # set as the names are found (is_item reads it meanwhile)
        self.items = self._item_names(tree)
        #: `message.get('key', ...)`: the Getattr of each such call, and its key; `'key' in message`: the
        #: operand of each such test, and its key
        self.keys_read = {
            id(call.node): call.args[0].value
            for call in tree.find_all(nodes.Call)
            if isinstance(call.node, nodes.Getattr)
            and call.node.attr == "get"
            and call.args
            and isinstance(call.args[0], nodes.Const)
            and isinstance(call.args[0].value, str)
        }
        self.keys_read.update(
            (id(compare.ops[0]), compare.expr.value)
            for compare in tree.find_all(nodes.Compare)
            if len(compare.ops) == 1
            and compare.ops[0].op in ("in", "notin")
            and isinstance(compare.expr, nodes.Const)
            and isinstance(compare.expr.value, str)
        )

    def _loop_of(self, node: nodes.Node) -> nodes.For | None:
        """The loop whose body ``node`` is in, innermost (its ``loop``), or None (a macro's body starts afresh)."""
        while (up := self.parents.get(id(node))) is not None:
            parent, field = up
            if isinstance(parent, nodes.For) and field == "body":
                return parent
            if isinstance(parent, (nodes.Macro, nodes.CallBlock)):
                return None
            node = parent
        return None

    def _item_names(self, tree: nodes.Template) -> frozenset[str]:
        """The names that only ever hold one message: every binding of them is the target of a loop over a
        list of messages, or a ``{% set %}`` of a message."""
        loops: dict[str, list[nodes.For]] = {}
        sets: dict[str, list[nodes.Node]] = {}
        sites = set()
        for loop in tree.find_all(nodes.For):
            if isinstance(loop.target, nodes.Name):
                loops.setdefault(loop.target.name, []).append(loop)
                sites.add(id(loop.target))
        for assign in tree.find_all(nodes.Assign):
            if isinstance(assign.target, nodes.Name):
                sets.setdefault(assign.target.name, []).append(assign.node)
                sites.add(id(assign.target))
        # a macro's parameter, a `{% with %}` name, a name in a tuple target...
        elsewhere = {n.name for n in tree.find_all(nodes.Name) if n.ctx != "load" and id(n) not in sites}
        names = frozenset((set(loops) | set(sets)) - elsewhere - self.lists)
        while True:  # drop the names one binding of which is not a message
            self.items = names
            kept = frozenset(
                name
                for name in names
                if all(self.is_list(loop.iter) and not loop.recursive for loop in loops.get(name, ()))
                and all(self.is_item(value) for value in sets.get(name, ()))
            )
            if kept == names:
                return names
            names = kept

    def is_list(self, node: nodes.Node) -> bool:
        """A list of messages: one of ``lists``, or a slice of one (or either, counted by the sandbox's loop)."""
        if isinstance(node, nodes.Filter) and node.name == _COUNTED:
            node = node.node  # type: ignore[assignment]
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            node = node.node
        return isinstance(node, nodes.Name) and node.ctx == "load" and node.name in self.lists

    def is_item(self, node: nodes.Node) -> bool:
        """One message: a name of ``items``, a list of messages indexed, its first or last, or the item before
        or after in a loop over messages."""
        if isinstance(node, nodes.Name):
            return node.ctx == "load" and node.name in self.items
        if isinstance(node, nodes.Getitem):
            return not isinstance(node.arg, nodes.Slice) and self.is_list(node.node)
        if isinstance(node, nodes.Filter):
            return node.name in ("first", "last") and _plain_filter(node) and self.is_list(node.node)  # type: ignore[arg-type]
        return isinstance(node, nodes.Getattr) and id(node) in self.neighbours

    def list_use(self, parent: nodes.Node, field: str) -> bool:
        """Whether a list of messages, as ``parent``'s ``field``, is used in a way that sees no message but
        through the items it gives (those are checked as items): a loop must give them to a name of ``items``."""
        if field == "iter" and isinstance(parent, nodes.For):
            return not parent.recursive and isinstance(parent.target, nodes.Name) and parent.target.name in self.items
        if self._tested(parent, field):
            return True  # whether there are messages
        if field != "node":
            return False
        if isinstance(parent, nodes.Getitem):
            return True  # a message, or a slice: each checked where it is used
        if isinstance(parent, nodes.Filter):
            if parent.name == _COUNTED:  # a loop's iterable, counted: the loop is checked
                return True
            return parent.name in ("first", "last", *_COUNTS) and _plain_filter(parent)
        if isinstance(parent, nodes.Test):
            return parent.name in _DEFINED and _plain_filter(parent)
        if isinstance(parent, nodes.Assign):
            return isinstance(parent.target, nodes.Name) and parent.target.name in self.lists
        return False

    def item_use(self, parent: nodes.Node, field: str) -> str | None:
        """The key a message, as ``parent``'s ``field``, is read at (or tested for, ``'key' in message``); ""
        for a use that reads none (a test of its truth or of whether it is defined, a ``{% set %}`` of another
        message name); None for any other use.

        A message is true when it has a key: chatcodec.render normalizes in full one that has none of the
        keys read, so that its truth is the normalized message's."""
        if isinstance(parent, nodes.Operand):
            return self.keys_read.get(id(parent))
        if self._tested(parent, field):
            return ""
        if field != "node":
            return None
        if isinstance(parent, nodes.Getattr):
            if parent.attr not in DICT_ATTRIBUTES:
                return parent.attr
            return self.keys_read.get(id(parent))  # `message.get('key')`, else a method of the dict: unknown use
        if isinstance(parent, nodes.Getitem):
            arg = parent.arg
            return arg.value if isinstance(arg, nodes.Const) and isinstance(arg.value, str) else None
        if isinstance(parent, nodes.Test):
            return "" if parent.name in _DEFINED and _plain_filter(parent) else None
        if isinstance(parent, nodes.Assign):
            return "" if isinstance(parent.target, nodes.Name) and parent.target.name in self.items else None
        return None

    def _tested(self, parent: nodes.Node, field: str) -> bool:
        """Whether a value, as ``parent``'s ``field``, is only tested for its truth: the test of an ``if``, a
        loop's filter or a conditional expression, under ``not``, or an operand of ``and``/``or`` (whose
        value is an operand) that is itself only tested."""
        while True:
            if field == "test" and isinstance(parent, (nodes.If, nodes.CondExpr, nodes.For)):
                return True
            if isinstance(parent, nodes.Not):
                return True
            if not isinstance(parent, (nodes.And, nodes.Or)):
                return False
            up = self.parents.get(id(parent))
            if up is None:
                return False
            parent, field = up


def _edges(node: nodes.Node) -> Iterator[tuple[nodes.Node, str, nodes.Node]]:
    """Every (parent, field, child) of the tree."""
    stack = [node]
    while stack:
        parent = stack.pop()
        for field, value in parent.iter_fields():
            for child in value if isinstance(value, list) else (value,):
                if isinstance(child, nodes.Node):
                    yield parent, field, child
                    stack.append(child)


def _names_neighbours(tree: nodes.Template) -> bool:
    """``previtem`` or ``nextitem`` as a constant (``loop | attr('previtem')``): a neighbour read other than
    as ``loop.previtem``."""
    return any(node.value in _NEIGHBOURS for node in tree.find_all(nodes.Const) if isinstance(node.value, str))


def _plain_filter(node: nodes.Filter | nodes.Test) -> bool:
    return not (node.args or node.kwargs or node.dyn_args or node.dyn_kwargs)
