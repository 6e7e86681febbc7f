"""The template compiler: a chat template as Python specialized for the plain JSON values it renders.

jinja2 compiles a template into general Python: every name is looked up through a context object, every
attribute through the sandbox, every piece of output is yielded from a generator, every loop that
mentions ``loop`` goes through ``LoopContext``. After preprocessing (:mod:`chatcodec.render`) a chat
template only ever sees plain JSON values, so this module compiles the same syntax tree, with jinja2's
own scoping (its code generator's frames and symbol tables), into Python that takes the short way
whenever a value is plain:

* ``message.content`` and ``message['content']`` are a dict lookup when ``message`` is a dict holding
  that key, else the sandbox's ``getattr``/``getitem`` (which also makes the ``Undefined``);
* ``x.strip('\\n')``, ``x.split(...)``, ``d.get(...)`` call the method directly on a short ``str`` or a
  ``dict``, else go through the sandbox's checked call;
* ``|length``, ``|trim``, ``|string``, ``is defined``, ``is none``, ``is string``... are inline Python;
* ``'<|im_start|>' + role + '\\n' + content`` is one Python expression, after its operands' lengths are
  checked to be small;
* a loop that reads ``loop.index0``, ``loop.first``, ``loop.last``... counts with local variables
  instead of ``LoopContext``;
* output is appended to one list and joined once; names are read from the render's variables.

The sandbox's guarantees stay: anything that is not a plain value goes through the same checked
functions as the generic path, and every budget of :mod:`chatcodec.limits` is paid (loops, macros,
large values, amplifying operators). A compiled render that raises anything but a
:class:`~chatcodec.LimitError` is run again on the generic path, so errors and their messages are
exactly jinja2's; templates with constructs the compiler leaves alone (``extends``, ``include``,
``import``, blocks, ``autoescape``, recursive loops) always take the generic path, and so do renders
that track ``{% generation %}`` spans of a block outside the root's own output (in a macro or a capture).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from threading import get_ident
from types import MethodType
from typing import Any

from jinja2 import nodes
from jinja2.compiler import Frame, MacroRef, find_undeclared, optimizeconst
from jinja2.exceptions import TemplateRuntimeError
from jinja2.filters import do_default
from jinja2.idtracking import VAR_LOAD_ALIAS, VAR_LOAD_PARAMETER, VAR_LOAD_RESOLVE, VAR_LOAD_UNDEFINED
from jinja2.nodes import EvalContext
from jinja2.runtime import Context, Macro, Undefined, identity
from jinja2.utils import Namespace, _PassArg, concat, internalcode, missing
from markupsafe import Markup, escape

from . import footprint, limits, resuming, sandbox
from .exceptions import LimitError
from .sandbox import DICT_ATTRIBUTES, SCALARS

__all__ = ["FastTemplate", "fast_template", "render"]

environment = sandbox.environment
NOT_COMPILED = sandbox.NOT_COMPILED

#: short strings and their methods: nothing to pay for (as in the sandbox's own fast path)
_SHORT = limits.FAST_SIZE
#: a chain of ``+`` (or ``~``, or a run of output) is one f-string while its parts add up to at most this
#: many characters: as with the sandbox's own checks, what is larger is made by limits.add/concat, which pay
_SHORT_CHAIN = limits.FAST_SIZE

#: ``loop`` attributes a fast loop computes from its index and length
_LOOP_ATTRIBUTES = frozenset(
    {"index0", "index", "first", "last", "length", "revindex", "revindex0", "previtem", "nextitem"}
)
#: str methods called directly on a short str (sizes and widths are limits.call_str_method's business)
_STR_METHODS = frozenset(
    {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "lower", "upper", "title",
     "capitalize", "find", "rfind", "count", "isdigit", "isalpha", "isalnum", "isspace", "islower",
     "isupper", "splitlines", "partition", "rpartition", "removeprefix", "removesuffix", "casefold",
     "swapcase", "isnumeric", "isdecimal", "isidentifier", "istitle"}
)  # fmt: skip
#: the ones whose argument is a set of characters: quadratic with a long one, so only a constant is inlined
_STRIP_METHODS = frozenset({"strip", "lstrip", "rstrip"})
#: dict methods called directly on a dict
_DICT_METHODS = frozenset({"get", "items", "keys", "values"})
#: filters that are a str method of their value when it is a short str, and take no argument
_TEXT_FILTERS = {"trim": "strip", "lower": "lower", "upper": "upper", "capitalize": "capitalize"}
#: filters whose result is always text (str or Markup): output needs no str()
_TEXT_RESULTS = frozenset(
    {"trim", "tojson", "string", "lower", "upper", "capitalize", "title", "join", "replace", "indent", "format",
     "striptags", "truncate", "wordwrap", "center", "urlencode", "e", "escape", "forceescape", "safe"}
)  # fmt: skip
#: tests that are a short Python expression of their value (``{}`` is the value)
_INLINE_TESTS = {
    "defined": "(not isinstance({}, Undefined))",
    "undefined": "isinstance({}, Undefined)",
    "none": "({} is None)",
    "string": "isinstance({}, str)",
    "true": "({} is True)",
    "false": "({} is False)",
}
#: tests that are quick for plain values (``{0}`` is the value, kept in a temporary), else jinja2's own
_PLAIN_TESTS = {
    "mapping": "(type({first}) is dict or {test}({value}))",
    "iterable": "(type({first}) in _ITERABLE or {test}({value}))",
    "sequence": "(type({first}) in _SEQUENCE or {test}({value}))",
    "number": "(type({first}) in _NUMBER or {test}({value}))",
}


_RESOLVES = "#resolves#"


class _Unsupported(Exception):
    """A construct the compiler leaves to the generic path."""


#: the variables a render of compiled code has: (other variables, keyword variables or None, and the
#: values of messages, tools, documents, add_generation_prompt or `missing`), as ``root`` takes them
Variables = tuple[Mapping[str, Any], Mapping[str, Any] | None, Any, Any, Any, Any]
#: the names given their own place in :data:`Variables`
FIXED_NAMES = ("messages", "tools", "documents", "add_generation_prompt")


def variables_of(given: Variables) -> dict[str, Any]:
    """The variables of a render as one mapping, as the generic path takes them."""
    variables = {**given[0], **(given[1] or {})}
    for name, value in zip(FIXED_NAMES, given[2:], strict=True):
        if value is not missing:
            variables[name] = value
    return variables


def split_variables(variables: Mapping[str, Any]) -> Variables:
    """``variables`` as compiled code takes them (the inverse of :func:`variables_of`)."""
    get = variables.get
    return (variables, None, get("messages", missing), get("tools", missing), get("documents", missing),
            get("add_generation_prompt", missing))  # fmt: skip


class _Context:
    """What compiled code passes where jinja2 wants a ``Context``: the real one is made on first use.

    Most renders never need it (only ``pass_context`` filters such as ``|map`` and calls of things
    that are not plain do), so it costs one small object per render.
    """

    __slots__ = ("_real", "_variables")
    eval_ctx = EvalContext(environment)
    environment = environment

    def __init__(self, variables: Variables) -> None:
        self._variables = variables
        self._real: Context | None = None

    def __getattr__(self, name: str) -> Any:
        real = self._real
        if real is None:
            globals_ = environment.globals
            variables = {**globals_, **variables_of(self._variables)}
            real = self._real = Context(environment, variables, None, {}, globals_)
        return getattr(real, name)


class _NoContext:
    """What ``context`` is in compiled code: only ``context.eval_ctx`` (autoescape off) is ever read."""

    __slots__ = ()
    eval_ctx = _Context.eval_ctx


def _call(variables: Variables, function: Any, /, *args: Any, **kwargs: Any) -> Any:
    """A template's call of a name (a macro, ``namespace(...)``): directly when it is one of ours."""
    kind = type(function)
    if kind is _CompiledMacro or kind is sandbox._BudgetedMacro or id(function) in environment._trusted:
        return function(*args, **kwargs)
    if type(function) is MethodType and type(function.__self__) is sandbox.GenerationExtension:
        return function(*args, **kwargs)  # {% generation %}
    return environment.call(_Context(variables), function, *args, **kwargs)


def _call_method(variables: Variables, value: Any, name: str, args: tuple[Any, ...]) -> Any:
    """``value.name(*args)`` through the sandbox's checked call (what the inline fast path did not take)."""
    return environment.call_method(_Context(variables), value, name, args, None)


class _CompiledMacro(Macro):
    """A macro of compiled code as a value (``caller``, a macro passed on): its function pays for each call."""


def _select_attribute(items: Any, attribute: str, test: str, keep: bool, *args: Any) -> Any:
    """``|selectattr(attribute, test, ...)`` (``keep``) and ``|rejectattr``: the same items, with dict lookups.

    jinja2 looks every item's attribute up through the sandbox and calls the test by name; here a dict
    item's value is read directly and the environment's test function is called with it.
    """
    if not items:  # as jinja2: nothing (not an error) for none, an undefined or an empty value
        return
    function: Any = environment.tests[test]
    getitem = environment.getitem
    if function is limits.eq and len(args) == 1 and type(args[0]) is str and len(args[0]) <= _SHORT:
        # `selectattr('role', 'equalto', 'user')`: a comparison with a short string costs nothing to pay for
        wanted = args[0]
        for item in limits.counted_input(items, "|selectattr"):
            value = item[attribute] if type(item) is dict and attribute in item else getitem(item, attribute)
            if (value == wanted) is keep:
                yield item
        return
    for item in limits.counted_input(items, "|selectattr"):
        value = item[attribute] if type(item) is dict and attribute in item else getitem(item, attribute)
        if bool(function(value, *args)) is keep:
            yield item


def _output_part(output: list[str], budget: limits.Budget, value: str) -> None:
    """Append a part of any length (a ``{% call %}`` block's, say) to the output, marking a long one."""
    if len(value) > _SHORT_CHAIN:
        budget.long_parts = True
    output.append(value)


def _namespace(attrs: dict[str, Any]) -> sandbox.TemplateNamespace:
    """``namespace(**attrs)`` for names that start with no underscore (the code generator checks them)."""
    for value in attrs.values():
        if value.__class__ not in SCALARS:
            limits.built(attrs)  # it may share containers: they count as often as they occur
            break
    made = _new_namespace(sandbox.TemplateNamespace)
    made.__dict__ = attrs  # a dict made for this call
    return made


_new_namespace = object.__new__


def _sequence(iterable: Any) -> Any:
    """What a fast loop indexes: lists, tuples and strings as they are, anything else as a list."""
    kind = type(iterable)
    return iterable if kind is list or kind is tuple or kind is str else list(iterable)


def _memo_item(recorder: resuming.Recorder, items: Any, key: Any) -> Any:
    """``messages[key]`` in the body of a resumable loop: the item, with the index it read recorded."""
    if type(items) is list and type(key) is int and -len(items) <= key < len(items):
        if key < 0:  # counted from the end: the end moves as the chat grows
            recorder.everything()
        else:
            recorder.see(key, len(items))
        return items[key]
    recorder.everything()
    return environment.fast_getitem(items, key)


def _chain(*parts: Any) -> Any:
    """``a + b + c + ...`` when its operands are long: each sum checked before it allocates (plain strings
    all at once: joined, the result is the largest of the sums)."""
    size = 0
    for part in parts:
        if part.__class__ is not str:
            break
        size += len(part)
    else:
        if size > _SHORT:
            limits.active().big(size, "a string", size)
        return "".join(parts)
    result = parts[0]
    for part in parts[1:]:
        result = limits.add(result, part)
    return result


#: what generated code finds in its module namespace
_RUNTIME: dict[str, Any] = {
    "environment": environment,
    "missing": missing,
    "undefined": environment.undefined,
    "cond_expr_undefined": Undefined,
    "Undefined": Undefined,
    "_UNDEFINED": Undefined(),
    "_cc_json": sandbox._DEFAULT_JSON,
    "_cc_checked_json": sandbox.checked_json,
    "Namespace": Namespace,
    "_Namespace": sandbox.TemplateNamespace,
    "Markup": Markup,
    "escape": escape,
    "identity": identity,
    "concat": concat,
    "internalcode": internalcode,
    "TemplateRuntimeError": TemplateRuntimeError,
    "Macro": _CompiledMacro,
    "_cc_too_deep": limits.too_deep,
    "LoopContext": sandbox._BudgetedLoop,
    "Mapping": Mapping,
    "_Context": _Context,
    "context": _NoContext(),
    "_cc_call": _call,
    "_cc_namespace": _namespace,
    "_cc_part": _output_part,
    "_cc_state": limits.recorded,
    "_cc_thread": get_ident,
    "_cc_current": limits.current,
    "_cc_method": _call_method,
    "_cc_getattr": environment.fast_getattr,
    "_cc_getitem": environment.fast_getitem,
    "_cc_add": limits.add,
    "_cc_mul": limits.mul,
    "_cc_power": limits.power,
    "_cc_mod": limits.mod,
    "_cc_concat": limits.concat,
    "_cc_call_method": environment.call_method,
    "_cc_slice_of": limits.slice_of,
    "_cc_built": limits.built,
    "_cc_chain": limits.chain,
    "_cc_contains": limits.contains,
    "_cc_not_in": limits.not_in,
    "_cc_in": limits.contains,
    "_cc_notin": limits.not_in,
    "_cc_eq": limits.eq,
    "_cc_ne": limits.ne,
    "_cc_lt": limits.lt,
    "_cc_le": limits.le,
    "_cc_gt": limits.gt,
    "_cc_ge": limits.ge,
    "_cc_counted": limits.counted,
    "_cc_spend": limits.spend,
    "_cc_sequence": _sequence,
    "_cc_selectattr": _select_attribute,
    "_SEARCHED": frozenset({str, list, tuple}),
    "_ITERABLE": frozenset({list, dict, str, tuple}),
    "_SEQUENCE": frozenset({list, dict, str, tuple}),
    "_NUMBER": frozenset({int, float}),
    "_cc_cat": _chain,
    "_cc_resume": resuming.resume,
    "_cc_memo_value": resuming.value,
    "_cc_memo_attr": resuming.attribute,
    "_cc_memo_snapshot": resuming.snapshot,
    "_cc_memo_restore": resuming.restore,
    "_cc_memo_item": _memo_item,
}


class _FastGenerator(sandbox._CodeGenerator):
    """jinja2's code generator (through the sandbox's), writing specialized Python for plain values."""

    def __init__(
        self,
        name: str | None,
        uses: dict[tuple[Any, ...], int] | None = None,
        context_names: Iterable[str] | None = None,
    ) -> None:
        super().__init__(environment, name, None, optimized=True)
        #: how often each kept lookup is written, from a first pass over the template (None: this is it);
        #: a lookup written once is not worth keeping
        self._known_uses = uses
        #: the names some frame reads from the render's variables, from the first pass (None: this is it)
        self._context_names = None if context_names is None else frozenset(context_names)
        #: names that only ever hold the render's messages or slices of them (see _message_lists)
        self._message_lists: frozenset[str] = frozenset()
        #: the items of loops over those: dicts (render normalizes every message to one), read with no type check
        self._dict_items: set[str] = set()
        self._dict_markers: set[str] = set()
        self._uses: dict[tuple[Any, ...], int] = {}
        self._scopes = 0
        self._fast_loops: dict[str, tuple[str, str, str]] = {}
        #: the loop a render may resume (chatcodec.resuming), the name of what it iterates, and the `loop`
        #: of it (if the body reads `loop`) while its body is written
        self._plan: resuming.Plan | None = None
        self._memo_items: str | None = None
        self._memo_loop: str | None = None
        #: the tuple (Python source) of the states of the namespaces the resumable loop sets
        self._memo_state = ""
        self._globals: dict[str, str] = {}
        #: names read from the render's variables, each once per render, and what stands for a missing one
        self._resolved: dict[str, str] = {}
        #: a ``{% generation %}`` block outside the root's own output (in a macro, a capture, a filter)
        self._nested_generation = False
        #: macros defined once at the top of the template and never rebound: called without ``Macro``
        self._direct_candidates: set[str] = set()
        self._direct: dict[str, tuple[str, list[str]]] = {}
        #: of those, the ones only ever called that way: they need no Macro object
        self._only_direct: set[str] = set()
        #: identifiers that never hold jinja2's `missing` marker: reading them needs no check
        self._defined: set[str] = set()
        #: lookups kept for reuse: for each identifier whose value cannot change where it is read (a loop's
        #: item during one iteration, a macro's parameter, a name never assigned), the local holding each
        #: path looked up from it (``message.role``, ``message['content']``, ``call.function.name``)
        self._caches: dict[str, dict[Any, Any]] = {}
        #: the lines that start each cache's life (``_c1 = _c2 = missing``), filled in by finish()
        self._cache_lines: dict[str, list[str]] = {}
        #: for a loop's item, the keys read from it, fetched at once when each iteration starts
        self._prefetch: dict[str, list[tuple[str, str, str]]] = {}

    def _temp(self) -> str:
        self._last_identifier += 1
        return f"_x{self._last_identifier}"

    # --- lookups kept for reuse ------------------------------------------------------------------------

    def _open_caches(self, refs: Iterable[str], prefetch: bool = False) -> None:
        """From here, lookups from ``refs`` are kept in locals, which start empty on the line written now.

        Only dict hits are kept: a dict a template sees never changes (the sandbox allows no mutation),
        so while ``ref`` holds the same value, ``ref.key`` does too.
        """
        self._scopes += 1
        refs = [ref for ref in refs if ref not in self._caches]
        if not refs:
            return
        marker = f"#cache {self._last_identifier}#"
        self._last_identifier += 1
        self.writeline(marker)
        self._cache_lines[marker] = []
        if prefetch:
            self._prefetch[marker] = []
        for ref in refs:
            self._caches[ref] = {"#": marker, "##": self._scopes}

    def _close_caches(self, refs: Iterable[str]) -> None:
        for ref in refs:
            cache = self._caches.pop(ref, None)
            if cache is not None:
                marker = cache.pop("#")
                cache.pop("##")
                self._cache_lines[marker] += cache.values()
                if marker in self._prefetch:
                    self._prefetch[marker] += [
                        (ref, path[0][1], ident)
                        for path, ident in cache.items()
                        if len(path) == 1 and path[0][0] == "k"
                    ]

    @contextmanager
    def _new_scope(self) -> Iterator[None]:
        """A nested Python function (a macro, a loop's filter): the enclosing function's caches are not its own."""
        saved, self._caches = self._caches, {}
        try:
            yield
        finally:
            self._caches = saved

    def _cache_path(self, node: nodes.Expr, frame: Frame) -> tuple[Any, ...] | None:
        """``(ref, step, ...)`` for a lookup whose value can be kept (see _open_caches), else None."""
        if isinstance(node, nodes.Name):
            if node.ctx != "load":
                return None
            ref = frame.symbols.find_ref(node.name)
            return (ref,) if ref in self._caches else None
        if isinstance(node, nodes.Getattr):
            if node.attr in DICT_ATTRIBUTES or node.attr.startswith("_"):
                return None
            step: tuple[str, Any] = ("k", node.attr)  # a dict hit: the same value as message['role']
        elif isinstance(node, nodes.Getitem):
            key = _constant(node.arg, frame)
            if type(key) is int and key in (0, -1):
                step = ("n", key)
            elif type(key) is str and key not in DICT_ATTRIBUTES and not key.startswith("_"):
                step = ("k", key)
            else:
                return None
        else:
            return None
        base = self._cache_path(node.node, frame)
        return None if base is None else (*base, step)

    def _cached(self, node: nodes.Getattr | nodes.Getitem, key: Any, frame: Frame, truth: bool = False) -> bool:
        """Write ``node`` (``x.key``, ``x['key']`` of a dict, ``x[0]`` of a list) read through its cache, if it has one.

        ``truth``: only the value's truth is read (an ``if``), so a missing key may read as None.
        """
        path = self._cache_path(node, frame)
        if path is None:
            return False
        cache = self._caches[path[0]]
        use = (cache["##"], *path)
        self._uses[use] = self._uses.get(use, 0) + 1
        if self._known_uses is not None and self._known_uses.get(use, 0) < 2:
            return False
        ident = cache.get(path[1:])
        if ident is None:
            ident = cache[path[1:]] = f"_c{self._last_identifier}"
            self._last_identifier += 1
        value = self._temp()
        if type(key) is int:  # messages[0], messages[-1]: a list's first or last item
            self.write(f"({ident} if {ident} is not missing else ({ident} := {value}[{key}]) if type({value} := ")
            self.visit(node.node, frame)
            self.write(f") is list and {value} else _cc_getitem({value}, {key}))")
            return True
        miss = f"_cc_getattr({value}, {key!r})" if isinstance(node, nodes.Getattr) else f"_cc_getitem({value}, {key!r})"
        absent = "None" if truth else f"undefined(obj={value}, name={key!r})"
        if self._is_dict(node.node, frame):
            self.write(f"({ident} if {ident} is not missing else ({ident} := {value}[{key!r}])")
            self.write(f" if {key!r} in ({value} := ")
            self.visit(node.node, frame)
            self.write(f") else {absent})")
            return True
        self.write(f"({ident} if {ident} is not missing else (({ident} := {value}[{key!r}]) if {key!r} in {value}")
        self.write(f" else {absent}) if type({value} := ")
        self.visit(node.node, frame)
        self.write(f") is dict else {miss})")
        return True

    # --- what stays on the generic path ----------------------------------------------------------------

    def _unsupported(self, node: nodes.Node, *_: Any, **__: Any) -> None:
        raise _Unsupported(type(node).__name__)

    visit_Extends = visit_Block = visit_Include = visit_Import = visit_FromImport = _unsupported
    visit_ScopedEvalContextModifier = visit_EvalContextModifier = _unsupported
    visit_ContextReference = visit_DerivedContextReference = _unsupported

    # --- the module and its one function -------------------------------------------------------------

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        eval_ctx = EvalContext(self.environment, self.name)
        self.pull_dependencies(node.body)  # filters and tests, looked up once, at module level
        bound = [n.name for n in node.find_all(nodes.Name) if n.ctx in ("store", "param")]
        bound += [n.name for n in node.find_all(nodes.Macro)]
        self._direct_candidates = {
            m.name
            for m in node.body
            if isinstance(m, nodes.Macro)
            and bound.count(m.name) == 1
            and not find_undeclared(m.body, ("caller", "kwargs", "varargs"))
        }
        self._only_direct = _only_called(node, self._direct_candidates)
        if self._context_names is not None:
            self._message_lists = _message_lists(node, self._context_names)
        self._plan = resuming.plan(node)
        frame = Frame(eval_ctx)
        frame.symbols.analyze_node(node)
        frame.buffer = "_o"
        for macro in node.body:  # calls by name call the function (from any macro, itself included)
            if isinstance(macro, nodes.Macro) and macro.name in self._direct_candidates:
                self._direct[macro.name] = (f"{frame.symbols.ref(macro.name)}_fn", [a.name for a in macro.args])
        # root(variables, budget) -> the output: the budget made active and its output measured as it grows
        self.writeline("def root(_s, _k, _m, _t, _d, _a, _b, _h=None, _mm=None):", extra=1)
        self.indent()
        self.writeline("_b.output = _o = []")
        self.writeline("_w = _o.append")
        # the budget made active (limits.activate, inline) in this context's record of it (limits.current),
        # which the caller may pass
        self.writeline("if _h is None:")
        self.indent()
        self.writeline("_h = _cc_state(None)")
        self.writeline("if _h is None or _h.thread != _cc_thread():")
        self.indent()
        self.writeline("_h = _cc_current()")
        self.outdent(2)
        self.writeline("_p = _h.budget")
        self.writeline("_h.budget = _b")
        self.writeline("try:")
        self.indent()
        self.writeline(_RESOLVES)  # filled in below, once every frame is known
        self.enter_frame(frame)
        # names the template never assigns keep their value for the whole render: their lookups are kept
        stored = {n.name for n in node.find_all(nodes.Name) if n.ctx in ("store", "param")}
        stable = [
            ref
            for ref, (action, name) in frame.symbols.loads.items()
            if action == VAR_LOAD_RESOLVE and name not in stored
        ]
        self._open_caches(stable)
        self.blockvisit(node.body, frame)
        self._close_caches(stable)
        self.outdent()
        self.writeline("finally:")
        self.indent()
        self.writeline("_h.budget = _p")
        self.outdent()
        # The parts are measured before they are joined, when they could add up to more than the output
        # limit: a part longer than _SHORT_CHAIN characters marks the budget, and the others are too short
        # for that unless there are many (a long string repeated many times would be joined otherwise).
        self.writeline(
            f"if (len(_o) > _b.limits.max_output // {_SHORT_CHAIN} or _b.long_parts)"
            " and sum(map(len, _o)) > _b.limits.max_output:"
        )
        self.indent()
        self.writeline("_b.check_size(sum(map(len, _o)), 'an output')")
        self.outdent()
        self.writeline("return ''.join(_o)")
        self.outdent()

    def _resolve(self, name: str) -> str:
        """The local (``_r_N``) that holds the render's variable ``name``, read once at the start of root."""
        if name not in self._resolved:
            self._resolved[name] = f"_r_{len(self._resolved)}"
        return self._resolved[name]

    def enter_frame(self, frame: Frame) -> None:
        # jinja2's, with names resolved from the render's variables (then the environment's globals)
        undefs = []
        for target, (action, param) in frame.symbols.loads.items():
            if action == VAR_LOAD_ALIAS and param in self._dict_items:
                self._dict_items.add(target)  # a loop's item, read in a frame of its body
            else:
                self._dict_items.discard(target)  # a frame at the same depth before this one may have had it
            if action == VAR_LOAD_PARAMETER:
                pass
            elif action == VAR_LOAD_RESOLVE:
                # the render's variables do not change while it runs: each name is read once, up front
                self.writeline(f"{target} = {self._resolve(param)}")
                self._defined.add(target)
            elif action == VAR_LOAD_ALIAS:
                self.writeline(f"{target} = {param}")
                if param in self._defined:
                    self._defined.add(target)
            elif action == VAR_LOAD_UNDEFINED:
                undefs.append(target)
                self._defined.discard(target)  # a loop at the same depth before this one may have set it
            else:  # pragma: no cover - jinja2 has no other kind
                raise _Unsupported(action)
        if undefs:
            self.writeline(f"{' = '.join(undefs)} = missing")

    def finish(self, code: str) -> str:
        """The generated module, with the names every render resolves read once at the top of ``root``."""
        # the variables: messages, tools, documents, add_generation_prompt have their own parameters; the
        # others are read from the keyword variables and the other variables (special tokens, say)
        lines = ["_g = _s.get if _k is None else {**_s, **_k}.get"]
        if "(_v" in code:  # some call needs the variables (as a context)
            lines.insert(0, "_v = (_s, _k, _m, _t, _d, _a)")
        for name, ident in self._resolved.items():
            default = self._global(name) if name in self.environment.globals else f"_u{ident}"
            if name in FIXED_NAMES:
                given = "_" + "mtda"[FIXED_NAMES.index(name)]
                lines.append(f"{ident} = {default} if {given} is missing else {given}")
            else:
                lines.append(f"{ident} = _g({name!r}, {default})")
        constants = [f"{ident} = environment.globals[{name!r}]" for name, ident in self._globals.items()]
        constants += [
            f"_u{ident} = undefined(name={name!r})"
            for name, ident in self._resolved.items()
            if name not in self.environment.globals
        ]
        code = code.replace(_RESOLVES, "; ".join(lines) or "pass", 1)
        for marker, idents in self._cache_lines.items():
            start = f"{' = '.join(idents)} = missing" if idents else "pass"
            fetched = self._prefetch.get(marker)
            if fetched:
                # a loop's item is a dict (messages always are): the keys the body reads, read at once
                ref = fetched[0][0]
                gets = "; ".join(f"{ident} = {ref}.get({key!r}, missing)" for _, key, ident in fetched)
                indent = code[: code.index(marker)].rsplit("\n", 1)[-1]
                if marker not in self._dict_markers:  # an item that may not be a dict
                    gets = f"if type({ref}) is dict: {gets}\n{indent}else: {start}"
                start = gets
                lazy = [ident for ident in idents if ident not in {i for _, _, i in fetched}]
                if lazy:
                    start += f"\n{indent}{' = '.join(lazy)} = missing"
            code = code.replace(marker, start, 1)
        return code + "\n" + "\n".join(constants) + "\n"

    def blockvisit(self, nodes: Iterable[nodes.Node], frame: Frame) -> None:
        """jinja2's, forgetting at the block's end which names its ``{% set %}`` statements defined: they are
        defined after it only along the paths that ran it (an ``{% if %}``'s body, one iteration of a loop)."""
        defined = set(self._defined)
        try:
            super().blockvisit(nodes, frame)
        finally:
            self._defined = defined

    def visit_Assign(self, node: nodes.Assign, frame: Frame) -> None:
        """jinja2's; a name set by a statement of this block reads without a check for ``missing`` until the
        block ends (``{% set content = ... %}{{ content }}``), as nothing in between can unset it."""
        super().visit_Assign(node, frame)
        if isinstance(node.target, nodes.Name):
            self._defined.add(frame.symbols.ref(node.target.name))

    def visit_Name(self, node: nodes.Name, frame: Frame) -> None:
        if node.ctx == "load":
            ref = frame.symbols.ref(node.name)
            if ref in self._defined:
                self.write(ref)
                return
        super().visit_Name(node, frame)

    def _global(self, name: str) -> str:
        if name not in self.environment.globals:
            return "missing"
        if name not in self._globals:
            self._globals[name] = f"_g_{len(self._globals)}"
        return self._globals[name]

    def pop_assign_tracking(self, frame: Frame) -> None:
        # Nothing reads jinja2's `_loop_vars`/`_block_vars` or a context's exports here.
        self._assign_stack.pop()

    def visit_CallBlock(self, node: nodes.CallBlock, frame: Frame) -> None:
        call = node.call
        if frame.buffer != "_o" and isinstance(call, nodes.Call) and isinstance(call.node, nodes.ExtensionAttribute):
            self._nested_generation = True  # its span would be taken at another moment than jinja2's
        super().visit_CallBlock(node, frame)

    def start_write(self, frame: Frame, node: nodes.Node | None = None) -> None:
        if frame.buffer == "_o":  # `{% call %}`, `{% filter %}`: a part of any size (see _output_part)
            self.writeline("_cc_part(_o, _b, ", node)
        else:
            super().start_write(frame, node)

    def visit_Output(self, node: nodes.Output, frame: Frame) -> None:
        """Output as one f-string per run of ``{{ }}`` and text, when its parts are short; else part by part.

        ``\n    {{ '<|im_start|>' + role + '\n' + content }}\n`` is one append of one string built at once.
        """
        if frame.require_output_check:
            raise _Unsupported("output outside blocks of an extended template")
        finalize = self._make_finalize()
        buffer = frame.buffer
        write = "_w" if buffer == "_o" else f"{buffer}.append"
        # (text, None, "lit"): a literal; (temporary, node, kind): a temporary holding str(node) ("str") or
        # node itself, known to be text ("text"), or an operand of a `+` chain, which must be a str ("add")
        pieces: list[tuple[str, Any, str]] = []
        chains: dict[int, list[tuple[str, nodes.Expr | None]]] = {}  # first piece of a chain -> its pieces
        constant: list[str] = []

        def flush_constant() -> None:
            if constant:
                pieces.append((concat(constant), None, "lit"))
                constant.clear()

        for child in node.nodes:
            try:
                if not (finalize.const or isinstance(child, nodes.TemplateData)):
                    raise nodes.Impossible()
                constant.append(self._output_child_to_const(child, frame, finalize))
                continue
            except (nodes.Impossible, Exception):
                pass
            flush_constant()
            operands = _add_operands(child) if isinstance(child, nodes.Add) else []
            if any(isinstance(o, nodes.Const) and type(o.value) is str for o in operands):
                chain = self._chain_pieces(operands)
                chains[len(pieces)] = chain
                pieces += [(value, operand, "add" if operand is not None else "lit") for value, operand in chain]
            else:
                pieces.append((self._temp(), child, "text" if self._is_text(child, frame) else "str"))
        flush_constant()

        dynamic = [piece for piece in pieces if piece[1] is not None]
        if not dynamic:
            if pieces:
                text = "".join(text for text, _, _ in pieces)
                self.writeline(f"{write}({text!r})")
                if buffer == "_o" and len(text) > _SHORT_CHAIN:
                    self.writeline("_b.long_parts = True")
            return
        if len(pieces) == 1 and not chains:  # `{{ x }}` alone: appended as it is
            temp, child, kind = pieces[0]
            self.writeline(f"{temp} = " + ("" if kind == "text" else "str("), child)
            self.visit(child, frame)
            self.write("" if kind == "text" else ")")
            if buffer == "_o":  # a long part: the output is measured before it is joined
                self.writeline(f"if len({temp}) > {_SHORT_CHAIN}:")
                self.indent()
                self.writeline("_b.long_parts = True")
                self.outdent()
            self.writeline(f"{write}({temp})")
            return
        literal = sum(len(text) for text, _, kind in pieces if kind == "lit")
        self.writeline("if (", node)
        for at, (temp, child, kind) in enumerate(dynamic):
            self.write(f"{' + ' if at else ''}len({temp} := ")
            if kind == "str":
                self.write("str(")
            self.visit(child, frame)
            self.write(")" if kind != "str" else "))")
        self.write(f") <= {_SHORT_CHAIN - literal}")
        for temp, _, kind in dynamic:
            if kind == "add":
                self.write(f" and type({temp}) is str")
        self.write(":")
        self.indent()
        self.writeline(f"{write}({_fstring([(value, child) for value, child, _ in pieces])})")
        self.outdent()
        self.writeline("else:")
        self.indent()
        # as jinja2 would: each part on its own, a `+` chain added with jinja2's semantics and checks
        parts = []
        at = 0
        while at < len(pieces):
            operands_at = chains.get(at)
            if operands_at is not None:
                parts.append(f"_cc_cat({_codes(operands_at)})")
                at += len(operands_at)
            else:
                value, child, _ = pieces[at]
                parts.append(value if child is not None else repr(value))
                at += 1
        self.writeline(f"{buffer}.extend(({', '.join(parts)},))")
        if buffer == "_o":
            self.writeline("_b.long_parts = True")
        self.outdent()

    def _is_text(self, node: nodes.Node, frame: Frame) -> bool:
        """Whether ``node`` always gives a str (or Markup) when it gives anything: its output needs no str()."""
        if isinstance(node, (nodes.TemplateData, nodes.Concat)):
            return True
        if isinstance(node, nodes.Const):
            return isinstance(node.value, str)
        if isinstance(node, nodes.Filter):
            return node.name in _TEXT_RESULTS and node.node is not None
        if isinstance(node, nodes.Add):
            return any(isinstance(o, nodes.Const) and isinstance(o.value, str) for o in _add_operands(node))
        if isinstance(node, nodes.CondExpr):
            return node.expr2 is not None and self._is_text(node.expr1, frame) and self._is_text(node.expr2, frame)
        return False

    def visit_Macro(self, node: nodes.Macro, frame: Frame) -> None:
        ref = frame.symbols.ref(node.name)
        direct = node.name in self._direct_candidates
        macro_frame, macro_ref = self.macro_body(node, frame)
        if direct:
            self.writeline(f"{ref}_fn = macro")
            if node.name in self._only_direct:
                return
        self.writeline(f"{ref} = ")
        self.macro_def(macro_ref, macro_frame)

    def macro_body(self, node: nodes.Macro | nodes.CallBlock, frame: Frame) -> tuple[Frame, MacroRef]:
        """jinja2's, in a scope of its own, with lookups from the parameters the body never assigns kept."""
        frame = frame.inner()
        frame.symbols.analyze_node(node)
        macro_ref = MacroRef(node)
        args = []
        for arg in node.args:
            if arg.name in ("caller", "kwargs", "varargs"):
                raise _Unsupported("a macro parameter named caller, kwargs or varargs")
            args.append(frame.symbols.ref(arg.name))
        undeclared = find_undeclared(node.body, ("caller", "kwargs", "varargs"))
        if "caller" in undeclared:
            args.append(frame.symbols.declare_parameter("caller"))
            macro_ref.accesses_caller = True
        if "kwargs" in undeclared:
            args.append(frame.symbols.declare_parameter("kwargs"))
            macro_ref.accesses_kwargs = True
        if "varargs" in undeclared:
            args.append(frame.symbols.declare_parameter("varargs"))
            macro_ref.accesses_varargs = True
        frame.require_output_check = False
        frame.symbols.analyze_node(node)
        self.writeline(f"{self.func('macro')}({', '.join(args)}):", node)
        self.indent()
        # what a call costs: one level deeper, and the body's weight in steps (its Macro object pays nothing)
        self.writeline("_b.depth += 1")
        self.writeline("if _b.depth > _b.limits.max_depth:")
        self.indent()
        self.writeline("_cc_too_deep(_b)")
        self.outdent()
        self._pay(str(sandbox._weight(node.body)))
        self.writeline("try:")
        self.indent()
        with self._new_scope():
            self.buffer(frame)
            self.enter_frame(frame)
            self.push_parameter_definitions(frame)
            for idx, arg in enumerate(node.args):
                ref = frame.symbols.ref(arg.name)
                self.writeline(f"if {ref} is missing:")
                self.indent()
                try:
                    default = node.defaults[idx - len(node.args)]
                except IndexError:
                    self.writeline(f'{ref} = undefined("parameter {arg.name!r} was not provided", name={arg.name!r})')
                else:
                    self.writeline(f"{ref} = ")
                    self.visit(default, frame)
                self.mark_parameter_stored(ref)
                self.outdent()
            self.pop_parameter_definitions()
            assigned = {n.name for n in _stores(node.body)}
            kept = [frame.symbols.ref(arg.name) for arg in node.args if arg.name not in assigned]
            self._open_caches(kept)
            self.blockvisit(node.body, frame)
            self._close_caches(kept)
            self.return_buffer_contents(frame, force_unescaped=True)
            self.leave_frame(frame, with_python_scope=True)
        self.outdent()
        self.writeline("finally:")
        self.indent()
        self.writeline("_b.depth -= 1")
        self.outdent(2)
        return frame, macro_ref

    def macro_def(self, macro_ref: Any, frame: Frame) -> None:
        arg_tuple = ", ".join(repr(x.name) for x in macro_ref.node.args)
        name = getattr(macro_ref.node, "name", None)
        if len(macro_ref.node.args) == 1:
            arg_tuple += ","
        self.write(
            f"Macro(environment, macro, {name!r}, ({arg_tuple}),"
            f" {macro_ref.accesses_kwargs!r}, {macro_ref.accesses_varargs!r},"
            f" {macro_ref.accesses_caller!r}, False)"
        )

    # --- loops --------------------------------------------------------------------------------------------

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        if self._plan is None or node is not self._plan.loop:
            self._for_loop(node, frame, resumable=False)
            return
        # the loop a render may resume: as it is for a render without a memo, and resumable for one with
        self.writeline("if _mm is None:")
        self.indent()
        self._for_loop(node, frame, resumable=False)
        self.outdent()
        self.writeline("else:")
        self.indent()
        self._for_loop(node, frame, resumable=True)
        self.outdent()

    def _for_loop(self, node: nodes.For, frame: Frame, resumable: bool) -> None:
        if node.recursive or any(block.scoped for block in node.find_all(nodes.Block)):
            raise _Unsupported("recursive loop")
        if node.test is not None and "loop" in find_undeclared([node.test], ("loop",)):
            raise _Unsupported("loop in a loop's filter")
        for name in node.find_all(nodes.Name):
            if name.ctx == "store" and name.name == "loop":
                raise _Unsupported("assignment to loop")
        loop_frame = frame.inner()
        loop_frame.loop_frame = True
        test_frame = frame.inner()
        else_frame = frame.inner()
        uses_loop = "loop" in find_undeclared(node.iter_child_nodes(only=("body",)), ("loop",))
        fast = uses_loop and _reads_only_counters(node.body)
        loop_ref = loop_frame.symbols.declare_parameter("loop") if uses_loop else None
        loop_frame.symbols.analyze_node(node, for_branch="body")
        if node.else_:
            else_frame.symbols.analyze_node(node, for_branch="else")

        loop_filter = None
        if node.test is not None:  # `{% for x in xs if test %}`: a generator over the counted items
            loop_filter = self.temporary_identifier()
            test_frame.symbols.analyze_node(node, for_branch="test")
            self.writeline(f"def {loop_filter}(fiter):", node.test)
            self.indent()
            with self._new_scope():
                self.enter_frame(test_frame)
                self.writeline("for ")
                self.visit(node.target, loop_frame)
                self.write(" in fiter:")
                self.indent()
                self.writeline("if ", node.test)
                self._visit_truth(node.test, test_frame)
                self.write(":")
                self.indent()
                self.writeline("yield ")
                self.visit(node.target, loop_frame)
                self.outdent(3)
                self.leave_frame(test_frame, with_python_scope=True)

        indicator = None
        if node.else_:
            indicator = self.temporary_identifier()
            self.writeline(f"{indicator} = 1")
        if loop_ref is not None:
            self.writeline(f"{loop_ref} = missing")

        items = self.temporary_identifier()
        iterable, weight = _counted_parts(node.iter)  # type: ignore[arg-type]
        memo = resumable and (fast or not uses_loop)
        if memo:
            index, length, weighed = self._resumable_loop(node, frame, loop_frame, items, iterable, weight)
            if loop_ref is not None:
                self._fast_loops[loop_ref] = (index, length, items)
                self._memo_loop = loop_ref
        elif fast:
            assert loop_ref is not None
            index, length = self._temp(), self._temp()
            if loop_filter is not None:
                self.writeline(f"{items} = _cc_sequence({loop_filter}(_cc_counted(", node)
                self.visit(iterable, frame)
                self.write(f", {weight})))")
                self.writeline(f"{length} = len({items})")
                counted = items
            else:
                value = self._temp()
                self.writeline(f"{items} = ({value} if type({value} := ", node)
                self.visit(iterable, frame)
                self.write(f") is list else _cc_sequence({value}))")
                self.writeline(f"{length} = len({items})")
                counted = self._pay_for_items(items, length, weight)
            self.writeline(f"for {index}, ")
            self.visit(node.target, loop_frame)
            self.write(f" in enumerate({counted}):")
            self._fast_loops[loop_ref] = (index, length, items)
        else:
            if loop_ref is not None:  # an earlier loop at the same depth had the same name for `loop`
                self._fast_loops.pop(loop_ref, None)
            if loop_filter is not None:
                self.writeline(f"{items} = {loop_filter}(_cc_counted(", node)
                self.visit(iterable, frame)
                self.write(f", {weight}))")
                counted = items
            else:
                self.writeline(f"{items} = ", node)
                self.visit(iterable, frame)
                counted = self._pay_for_items(items, None, weight)
            self.writeline("for ")
            self.visit(node.target, loop_frame)
            if uses_loop:
                self.write(f", {loop_ref} in LoopContext({counted}, undefined):")
            else:
                self.write(f" in {counted}:")

        self.indent()
        if memo:
            self._resumable_iteration(node, loop_frame, items, index, weighed)
        self.enter_frame(loop_frame)
        # the item stays the same during one iteration, unless the body assigns its name
        target = node.target
        item = [loop_frame.symbols.ref(target.name)] if isinstance(target, nodes.Name) else []
        if isinstance(target, nodes.Name) and any(n.name == target.name for n in _stores(node.body)):
            item = []
        self._open_caches(item, prefetch=True)
        if item and item[0] in self._caches and _lists_messages(iterable, self._message_lists):
            self._dict_items.update(item)
            self._dict_markers.add(self._caches[item[0]]["#"])
        outer_items = self._memo_items  # a loop in the resumable one: its body's reads are recorded too
        if memo:
            self._memo_items = self._plan.items  # type: ignore[union-attr]
        self.blockvisit(node.body, loop_frame)
        self._memo_items = outer_items
        flag = None if memo or node.else_ else _stops_when(node)
        if flag is not None:
            # every later iteration would find the flag false first, and do nothing: stop here
            ref = loop_frame.symbols.find_ref(flag[0])
            if ref is not None:
                self.writeline(f"if type({ref}) is _Namespace and {ref}.__dict__.get({flag[1]!r}, True) is False:")
                self.indent()
                self.writeline("break")
                self.outdent()
        self._close_caches(item)
        self._dict_items.difference_update(item)
        if memo:
            self.writeline("_mq.end()")
        if indicator is not None:
            self.writeline(f"{indicator} = 0")
        self.outdent()
        self.leave_frame(loop_frame)
        if memo:
            self._memo_loop = None
            self.writeline(f"_mq.done(len(_o), ({self._memo_state}))")
        if loop_ref is not None:
            self._fast_loops.pop(loop_ref, None)  # `loop` after the loop is not this one's

        if node.else_:
            self.writeline(f"if {indicator}:")
            self.indent()
            self.enter_frame(else_frame)
            self.blockvisit(node.else_, else_frame)
            self.leave_frame(else_frame)
            self.outdent()
        if self._assign_stack:
            self._assign_stack[-1].difference_update(loop_frame.symbols.stores)

    def _resumable_loop(
        self, node: nodes.For, frame: Frame, loop_frame: Frame, items: str, iterable: nodes.Expr, weight: int
    ) -> tuple[str, str, str]:
        """The head of the loop a render may resume (:mod:`chatcodec.resuming`): the iterations to run, each
        paying for itself, and the record of what each read when the caller passed a memo (``_mm``).

        Returns the names of the index, the length and the charge per iteration (0: paid up front).
        """
        plan = self._plan
        assert plan is not None
        index, length, value, weighed = self._temp(), self._temp(), self._temp(), self._temp()
        self.writeline(f"{items} = ({value} if type({value} := ", node)
        self.visit(iterable, frame)
        self.write(f") is list else _cc_sequence({value}))")
        self.writeline(f"{length} = len({items})")
        most = limits.STEP_CHUNK // weight  # a short list pays up front, a long one per iteration
        self.writeline(f"{weighed} = 0 if {length} < {most} else {weight}")
        self.writeline(f"if not {weighed}:")
        self.indent()
        self._pay(f"({length} + 1) * {weight}")
        self.outdent()
        # what the body sees from outside the loop, as it is when the loop starts
        target = node.target.name  # type: ignore[attr-defined]
        compared = {n: [a for m, a in plan.thresholds if m == n and a is not None] for n, _ in plan.thresholds}
        keys, thresholds = [], []
        seen = [*resuming.names(node.body, {target, plan.items, "loop", *plan.macros}), *plan.reads]
        for name in dict.fromkeys(seen):
            outside = self._outside_value(name, loop_frame)
            if outside is None:
                continue
            if (name, None) not in plan.thresholds:
                keys.append(f"_cc_memo_value({outside}, {tuple(compared.get(name, ()))!r}, _Namespace)")
        for how, shift, name, attr in plan.comparisons:
            outside = self._outside_value(name, loop_frame)
            if outside is not None:
                read = outside if attr is None else f"_cc_memo_attr({outside}, {attr!r}, _Namespace)"
                thresholds.append(f"({how!r}, {shift}, {read})")
        key, compared_values = "".join(f"{k}, " for k in keys), "".join(f"{t}, " for t in thresholds)
        self.writeline(f"_mq = _cc_resume(_mm, root, _m, {items}, ({key}), ({compared_values}), _o)")
        # output copied from the last render (one part) is measured with the rest at the end if it is long
        self.writeline("if _mq.long:")
        self.indent()
        self.writeline("_b.long_parts = True")
        self.outdent()
        # the namespaces the body sets: saved at each iteration's start, and put back where the loop resumes
        written = [ref for ref in (self._outside_value(name, loop_frame) for name in plan.written) if ref is not None]
        self._memo_state = "".join(f"_cc_memo_snapshot({ref}, _Namespace), " for ref in written)
        if written:
            self.writeline("if _mq.state is not None:")
            self.indent()
            for number, ref in enumerate(written):
                self.writeline(f"_cc_memo_restore({ref}, _mq.state[{number}])")
            self.outdent()
        self.writeline(f"for {index} in range(_mq.start, {length}):")
        return index, length, weighed

    def _resumable_iteration(self, node: nodes.For, loop_frame: Frame, items: str, index: str, weighed: str) -> None:
        """The start of an iteration of the loop a render may resume: its item, its payment, its record."""
        self.writeline("")
        self.visit(node.target, loop_frame)
        self.write(f" = {items}[{index}]")
        self.writeline(f"if {weighed}:")
        self.indent()
        self._pay(weighed)
        self.outdent()
        self.writeline(f"_mq.begin({index}, len(_o), ({self._memo_state}))")

    def _outside_value(self, name: str, loop_frame: Frame) -> str | None:
        """The Python expression of ``name``'s value outside a loop (before it starts), or None if it has no
        value there (a name only an inner loop binds) or cannot change between renders (undefined)."""
        ref = loop_frame.symbols.find_ref(name)
        if ref is None:  # read only in an inner loop: the render's variable of that name, to be safe
            return self._resolve(name)
        load = loop_frame.symbols.loads.get(ref)
        if load is None:
            return ref  # a name of an outer frame
        action, param = load
        if action == VAR_LOAD_RESOLVE:
            return self._resolve(param)
        if action == VAR_LOAD_ALIAS:
            return param  # type: ignore[no-any-return]
        return None  # the loop's own item or `loop`, or a name undefined outside it

    def _pay_for_items(self, items: str, length: str | None, weight: int) -> str:
        """What limits.counted does for a loop over ``items``, inline for a short list: the name to iterate.

        A short list pays for all its items up front; anything else is left to limits.counted.
        """
        counted = self._temp()
        most = limits.STEP_CHUNK // weight  # (len + 1) * weight fits in one chunk of steps below this
        if length is None:
            self.writeline(f"if type({items}) is list and len({items}) < {most}:")
            paid = f"(len({items}) + 1) * {weight}"
        else:
            self.writeline(f"if {length} < {most}:")
            paid = f"({length} + 1) * {weight}"
        self.indent()
        self._pay(paid)
        self.writeline(f"{counted} = {items}")
        self.outdent()
        self.writeline("else:")
        self.indent()
        self.writeline(f"{counted} = _cc_counted({items}, {weight})")
        self.outdent()
        return counted

    def _pay(self, steps: str, node: nodes.Node | None = None) -> None:
        """Generated code that pays ``steps`` (Python source) from the budget, checking the clock and memory
        when a chunk of steps is used up."""
        self.writeline(f"_b.steps -= {steps}", node)
        self.writeline("if _b.steps <= 0:")
        self.indent()
        self.writeline("_b.tick()")
        self.outdent()

    def visit_ExprStmt(self, node: nodes.ExprStmt, frame: Frame) -> None:
        if isinstance(node.node, nodes.Filter) and node.node.name == "_cc_spend":
            # a checkpoint: the steps paid here, and the clock read when a chunk is used up
            self._pay(str(node.node.args[0].as_const(frame.eval_ctx)), node)
            return
        super().visit_ExprStmt(node, frame)

    # --- expressions --------------------------------------------------------------------------------------

    @optimizeconst
    def visit_Getattr(self, node: nodes.Getattr, frame: Frame) -> None:
        if self._loop_counter(node, frame):
            return
        attr = node.attr
        if attr in DICT_ATTRIBUTES or attr.startswith("_"):
            super().visit_Getattr(node, frame)
            return
        if self._cached(node, attr, frame):
            return
        value = self._temp()
        if self._is_dict(node.node, frame):
            self._dict_read(node, attr, value, frame)
            return
        if isinstance(node.node, nodes.Name):
            # a name may hold a namespace (`ns.found`): its attributes are read from its own dict
            kind = self._temp()
            self.write(f"(({value}[{attr!r}] if {attr!r} in {value} else undefined(obj={value}, name={attr!r}))")
            self.write(f" if ({kind} := type({value} := ")
            self.visit(node.node, frame)
            self.write(
                f")) is dict else {value}.__dict__[{attr!r}] if {kind} is _Namespace and {attr!r} in {value}.__dict__"
                f" else _cc_getattr({value}, {attr!r}))"
            )
            return
        self.write(f"(({value}[{attr!r}] if {attr!r} in {value} else undefined(obj={value}, name={attr!r}))")
        self.write(" if type(" + value + " := ")
        self.visit(node.node, frame)
        self.write(f") is dict else _cc_getattr({value}, {attr!r}))")

    def _is_dict(self, node: nodes.Node, frame: Frame) -> bool:
        """Whether ``node`` is the item of a loop over the messages (a dict: see _message_lists)."""
        if not isinstance(node, nodes.Name) or node.ctx != "load":
            return False
        return frame.symbols.find_ref(node.name) in self._dict_items

    def _dict_read(self, node: nodes.Getattr | nodes.Getitem, key: str, value: str, frame: Frame) -> None:
        """``message.key`` or ``message['key']`` of a message: its value, or undefined without it."""
        self.write(f"({value}[{key!r}] if {key!r} in ({value} := ")
        self.visit(node.node, frame)
        self.write(f") else undefined(obj={value}, name={key!r}))")

    def visit_NSRef(self, node: nodes.NSRef, frame: Frame) -> None:
        # `{% set ns.found = true %}`: the namespace's own dict, where the sandbox's __setitem__ would put it
        ref = frame.symbols.ref(node.name)
        if node.attr.startswith("_"):
            super().visit_NSRef(node, frame)  # refused by the namespace itself
            return
        self.write(f"({ref}.__dict__ if type({ref}) is _Namespace else {ref})[{node.attr!r}]")

    def _loop_counter(self, node: nodes.Getattr, frame: Frame) -> bool:
        """``loop.index0``, ``loop.last``... of a fast loop, from its counters."""
        target = node.node
        if not (isinstance(target, nodes.Name) and target.name == "loop" and target.ctx == "load"):
            return False
        counters = self._fast_loops.get(frame.symbols.find_ref("loop") or "")
        if counters is None:
            return False
        index, length, items = counters
        if self._memo_loop is not None and frame.symbols.find_ref("loop") == self._memo_loop:
            # whether a next message exists, or the length: what the recorder must know this iteration read
            if node.attr in ("last", "nextitem"):
                self.write(f"(_mq.see({index} + 1, {length}) and ")
            elif node.attr in ("length", "revindex", "revindex0"):
                self.write("(_mq.everything() and ")
            else:
                self.write("(")
            self._memo_loop, memo = None, self._memo_loop
            self._loop_counter(node, frame)
            self._memo_loop = memo
            self.write(")")
            return True
        self.write(
            {
                "index0": index,
                "index": f"({index} + 1)",
                "first": f"({index} == 0)",
                "last": f"({index} == {length} - 1)",
                "length": length,
                "revindex": f"({length} - {index})",
                "revindex0": f"({length} - {index} - 1)",
                "previtem": f"({items}[{index} - 1] if {index} else undefined('there is no previous item'))",
                "nextitem": f"({items}[{index} + 1] if {index} + 1 < {length} else undefined('there is no next item'))",
            }[node.attr]
        )
        return True

    def _reading_every_message(self, visit: Callable[[Any, Frame], None], node: nodes.Expr, frame: Frame) -> None:
        """``node`` read from the list a resumable loop iterates, as it is, recorded as reading every message
        (:mod:`chatcodec.resuming`), as ``loop.length`` is."""
        self.write("(_mq.everything() and ")
        self._memo_items, memo = None, self._memo_items
        visit(node, frame)
        self._memo_items = memo
        self.write(")")

    @optimizeconst
    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        target = node.node
        if self._memo_items is not None and isinstance(target, nodes.Name) and target.name == self._memo_items:
            if isinstance(node.arg, nodes.Slice):  # the messages from an index on
                self._reading_every_message(self.visit_Getitem, node, frame)
                return
            self.write("_cc_memo_item(_mq, ")  # another message, read by index: recorded (chatcodec.resuming)
            self.visit(target, frame)
            self.write(", ")
            self.visit(node.arg, frame)
            self.write(")")
            return
        key = _constant(node.arg, frame)
        value = self._temp()
        if type(key) is str and key not in DICT_ATTRIBUTES:
            if self._cached(node, key, frame):
                return
            if self._is_dict(node.node, frame):
                self._dict_read(node, key, value, frame)
                return
            self.write(f"(({value}[{key!r}] if {key!r} in {value} else undefined(obj={value}, name={key!r}))")
            self.write(" if type(" + value + " := ")
            self.visit(node.node, frame)
            self.write(f") is dict else _cc_getitem({value}, {key!r}))")
        elif isinstance(key, str):
            self.write(f"({value}[{key!r}] if type({value} := ")
            self.visit(node.node, frame)
            self.write(f") is dict and {key!r} in {value} else _cc_getitem({value}, {key!r}))")
        elif type(key) is int and key in (0, -1):
            if self._cached(node, key, frame):
                return
            self.write(f"({value}[{key}] if type({value} := ")
            self.visit(node.node, frame)
            self.write(f") is list and {value} else _cc_getitem({value}, {key}))")
        elif key is missing and not isinstance(node.arg, nodes.Slice):
            # `json_dict[key]`, `messages[loop.index0 - 1]`: both evaluated in order, then a dict lookup, a
            # list's item at an int index within it, or the sandbox's getitem
            index, kind = self._temp(), self._temp()
            self.write(f"({value}[{index}] if (({kind} := type((({value} := ")
            self.visit(node.node, frame)
            self.write(f"), ({index} := ")
            self.visit(node.arg, frame)
            self.write(
                f"))[0])) is dict and {index} in {value}) or ({kind} is list and type({index}) is int"
                f" and -len({value}) <= {index} < len({value})) else _cc_getitem({value}, {index}))"
            )
        else:
            super().visit_Getitem(node, frame)

    def visit_Call(self, node: nodes.Call, frame: Frame, forward_caller: bool = False) -> None:
        method = node.node
        plain = not (forward_caller or node.kwargs or node.dyn_args or node.dyn_kwargs)
        if plain and isinstance(method, nodes.Getattr):
            if self._method_call(node, method, frame):
                return
            # the sandbox's checked call_method
            self.write("_cc_method(_v, ")
            self.visit(method.node, frame)
            self.write(f", {method.attr!r}, (")
            for arg in node.args:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")
            return
        if (
            isinstance(method, nodes.Name)
            and method.name == "namespace"
            and not (forward_caller or node.args or node.dyn_args or node.dyn_kwargs)
            and not any(keyword.key.startswith("_") for keyword in node.kwargs)
        ):
            # `namespace(found=false)`: made directly when the name is the global namespace
            function = self._temp()
            self.write("(_cc_namespace({")
            for keyword in node.kwargs:
                self.write(f"{keyword.key!r}: ")
                self.visit(keyword.value, frame)
                self.write(", ")
            self.write(f"}}) if ({function} := ")
            self.visit(method, frame)
            self.write(f") is {self._global('namespace')} else _cc_call(_v, {function}")
            self.signature(node, frame)
            self.write("))")
            return
        direct = self._direct.get(method.name) if isinstance(method, nodes.Name) else None
        arguments = _direct_arguments(node, direct[1]) if direct is not None and not forward_caller else None
        if direct is not None and arguments is not None:
            # the macro's function, its arguments by position (a keyword's value at its parameter's place;
            # an error in any argument sends the whole render to the generic path, which reports it in order)
            self.write(f"{direct[0]}(")
            for argument in arguments:
                if argument is None:
                    self.write("missing, ")
                else:
                    self.visit(argument, frame)
                    self.write(", ")
            self.write(")")
            return
        # jinja2's sandboxed call, without its `_loop_vars` bookkeeping
        self.write("_cc_call(_v, ")
        self.visit(node.node, frame)
        self.signature(node, frame, {"caller": "caller"} if forward_caller else None)
        self.write(")")

    def _method_call(self, node: nodes.Call, method: nodes.Getattr, frame: Frame) -> bool:
        """``s.strip('x')`` on a short str, ``d.get(k)`` on a dict: the method itself, else the checked call."""
        name = method.attr
        if name in _STR_METHODS and len(node.args) <= 1:
            if name in _STRIP_METHODS and node.args and not isinstance(_constant(node.args[0], frame), str):
                return False
            guard = f" is str and len({{0}}) <= {_SHORT}"
        elif name == "replace" and len(node.args) == 2:
            # a short str, and constant arguments that cannot blow it up (at most 64 characters put in)
            old, new = (_constant(arg, frame) for arg in node.args)
            if not (isinstance(old, str) and isinstance(new, str) and len(new) <= 64):
                return False
            guard = f" is str and len({{0}}) <= {_SHORT}"
        elif name in _DICT_METHODS and len(node.args) <= 2:
            guard = " is dict"
        else:
            return False
        value = self._temp()
        self.write(f"({value}.{name}(")
        for arg in node.args:
            self.visit(arg, frame)
            self.write(", ")
        self.write(f") if type({value} := ")
        self.visit(method.node, frame)
        self.write(f"){guard.format(value)} else _cc_method(_v, {value}, {name!r}, (")
        for arg in node.args:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")
        return True

    @optimizeconst
    def visit_Filter(self, node: nodes.Filter, frame: Frame) -> None:
        name = node.name
        target = node.node
        if self._memo_items is not None and isinstance(target, nodes.Name) and target.name == self._memo_items:
            self._reading_every_message(self.visit_Filter, node, frame)  # `messages|length`
            return
        if node.node is None or node.kwargs or node.dyn_args or node.dyn_kwargs:
            super().visit_Filter(node, frame)
            return
        if name == "_cc_counted":  # a loop's items, outside visit_For (a loop it could not take apart)
            self.write("_cc_counted(")
            self.visit(node.node, frame)
            self.write(f", {node.args[0].as_const(frame.eval_ctx)})")
            return
        if name == "_cc_spend":
            self.write(f"_cc_spend({node.args[0].as_const(frame.eval_ctx)})")
            return
        if name in ("selectattr", "rejectattr") and self._select_attribute(node, frame):
            return
        if name == "default" and len(node.args) == 1 and self.environment.filters.get(name) is do_default:
            fallback = _constant(node.args[0], frame)
            if fallback is not missing and not isinstance(fallback, (list, dict)):
                # `x|default('')` with a constant: x unless it is undefined (jinja2's do_default)
                if self._default_key(node.node, fallback, frame):
                    return
                value = self._temp()
                self.write(f"({fallback!r} if isinstance({value} := ")
                self.visit(node.node, frame)
                self.write(f", Undefined) else {value})")
                return
        if node.args:
            super().visit_Filter(node, frame)
            return
        if name == "tojson" and self.environment.filters.get(name) is sandbox.tojson and sandbox._DEFAULT_JSON:
            # `x|tojson`: the prebuilt C encoder, as sandbox.tojson does with no options
            text = self._temp()
            self.write(f"({text} if len({text} := ''.join(_cc_json(")
            self.visit(node.node, frame)
            self.write(f", 0))) <= {_SHORT} else _cc_checked_json({text}))")
            return
        if name in ("length", "count") and self.environment.filters.get(name) is len:
            self.write("len(")
            self.visit(node.node, frame)
            self.write(")")
            return
        function = self.filters.get(name)
        if name in _TEXT_FILTERS and function is not None:
            value = self._temp()
            self.write(f"({value}.{_TEXT_FILTERS[name]}() if type({value} := ")
            self.visit(node.node, frame)
            self.write(f") is str and len({value}) <= {_SHORT} else {function}({value}))")
            return
        if name == "string" and function is not None:
            value = self._temp()
            self.write(f"({value} if type({value} := ")
            self.visit(node.node, frame)
            self.write(f") is str else {function}({value}))")
            return
        super().visit_Filter(node, frame)

    @contextmanager
    def _filter_test_common(self, node: nodes.Filter | nodes.Test, frame: Frame, is_filter: bool) -> Iterator[None]:
        # jinja2's, passing a context made on demand (most filters and tests take none)
        ident = (self.filters if is_filter else self.tests)[node.name]
        function = (self.environment.filters if is_filter else self.environment.tests).get(node.name)
        if function is None and not frame.soft_frame:
            raise _Unsupported(f"no filter or test named {node.name!r}")  # the generic path reports it
        self.write(f"{ident}(")
        pass_arg = _PassArg.from_obj(function) if function is not None else None  # type: ignore[type-var]
        if pass_arg is _PassArg.context:
            self.write("_Context(_v), ")
        elif pass_arg is _PassArg.eval_context:
            self.write("context.eval_ctx, ")
        elif pass_arg is _PassArg.environment:
            self.write("environment, ")
        yield
        self.signature(node, frame)
        self.write(")")

    def _select_attribute(self, node: nodes.Filter, frame: Frame) -> bool:
        """``xs|selectattr('role', 'equalto', 'system')``: a plain attribute name and a test that needs no context."""
        if len(node.args) < 2 or self.environment.filters.get(node.name) is None:
            return False
        attribute, test = (_constant(arg, frame) for arg in node.args[:2])
        if not (isinstance(attribute, str) and attribute.isidentifier() and isinstance(test, str)):
            return False
        function = self.environment.tests.get(test)
        if function is None or _PassArg.from_obj(function) is not None:  # type: ignore[type-var]
            return False
        self.write("_cc_selectattr(")
        self.visit(node.node, frame)  # type: ignore[arg-type]
        self.write(f", {attribute!r}, {test!r}, {node.name == 'selectattr'}")
        for arg in node.args[2:]:
            self.write(", ")
            self.visit(arg, frame)
        self.write(")")
        return True

    @optimizeconst
    def visit_Test(self, node: nodes.Test, frame: Frame) -> None:
        if node.args or node.kwargs or node.dyn_args or node.dyn_kwargs:
            super().visit_Test(node, frame)
            return
        if node.name in ("defined", "undefined") and self._defined_key(node, frame):
            return
        inline = _INLINE_TESTS.get(node.name)
        if inline is not None:
            before, after = inline.split("{}")
            self.write(before)
            self.visit(node.node, frame)
            self.write(after)
            return
        plain = _PLAIN_TESTS.get(node.name)
        function = self.tests.get(node.name)
        if plain is not None and function is not None:
            value = self._temp()
            head, tail = plain.split("{first}")
            self.write(f"{head}{value} := ")
            self.visit(node.node, frame)
            self.write(tail.format(test=function, value=value))
            return
        super().visit_Test(node, frame)

    def _dict_key(self, target: nodes.Expr, frame: Frame) -> tuple[nodes.Expr, str, str] | None:
        """For ``x.key`` or ``x['key']`` (a plain key), ``(x, key, the sandbox lookup a non-dict x takes)``."""
        if isinstance(target, nodes.Getattr):
            key: Any = target.attr
            miss = "_cc_getattr"
        elif isinstance(target, nodes.Getitem):
            key = _constant(target.arg, frame)
            miss = "_cc_getitem"
        else:
            return None
        base = target.node
        if not (type(key) is str and key not in DICT_ATTRIBUTES and not key.startswith("_")):
            return None
        if isinstance(base, nodes.Name) and base.name == "loop":
            return None
        return base, key, miss

    # --- tests: what is only read for its truth -----------------------------------------------------------

    def visit_If(self, node: nodes.If, frame: Frame) -> None:
        if_frame = frame.soft()
        self.writeline("if ", node)
        self._visit_truth(node.test, if_frame)
        self.write(":")
        self.indent()
        self.blockvisit(node.body, if_frame)
        self.outdent()
        for elif_ in node.elif_:
            self.writeline("elif ", elif_)
            self._visit_truth(elif_.test, if_frame)
            self.write(":")
            self.indent()
            self.blockvisit(elif_.body, if_frame)
            self.outdent()
        if node.else_:
            self.writeline("else:")
            self.indent()
            self.blockvisit(node.else_, if_frame)
            self.outdent()

    def _visit_truth(self, node: nodes.Node, frame: Frame) -> None:
        """``node`` where only its truth is read: a dict's missing key may give None instead of an undefined
        (both are false), which saves making one (``{% if message.tool_calls %}``)."""
        if _constant(node, frame) is not missing:
            self.visit(node, frame)
        elif isinstance(node, nodes.Not):
            self.write("(not ")
            self._visit_truth(node.node, frame)
            self.write(")")
        elif isinstance(node, (nodes.And, nodes.Or)):
            self.write("(")
            self._visit_truth(node.left, frame)
            self.write(" and " if isinstance(node, nodes.And) else " or ")
            self._visit_truth(node.right, frame)
            self.write(")")
        elif isinstance(node, (nodes.Getattr, nodes.Getitem)) and self._truth_key(node, frame):
            pass
        else:
            self.visit(node, frame)

    def _truth_key(self, node: nodes.Getattr | nodes.Getitem, frame: Frame) -> bool:
        found = self._dict_key(node, frame)
        if found is None or (isinstance(node, nodes.Getattr) and self._fast_loops and _is_loop_name(node.node)):
            return False
        base, key, miss = found
        if self._cached(node, key, frame, truth=True):
            return True
        value, kind = self._temp(), self._temp()
        self.write(f"({value}.get({key!r}) if ({kind} := type({value} := ")
        self.visit(base, frame)
        self.write(f")) is dict else {value}.__dict__[{key!r}] if {kind} is _Namespace and {key!r} in {value}.__dict__")
        self.write(f" else {miss}({value}, {key!r}))")
        return True

    def _default_key(self, target: nodes.Expr, fallback: Any, frame: Frame) -> bool:
        """``message.reasoning_content|default('')``: the dict's value, or the constant when it is missing
        (or undefined), with no undefined made for a missing key."""
        found = self._dict_key(target, frame)
        if found is None:
            return False
        base, key, miss = found
        value, item = self._temp(), self._temp()
        self.write(f"(({fallback!r} if isinstance({item} := {value}.get({key!r}, _UNDEFINED), Undefined) else {item})")
        self.write(f" if type({value} := ")
        self.visit(base, frame)
        self.write(
            f") is dict else ({fallback!r} if isinstance({item} := {miss}({value}, {key!r}), Undefined) else {item}))"
        )
        return True

    def _defined_key(self, node: nodes.Test, frame: Frame) -> bool:
        """``message.reasoning_content is defined``: whether a dict has the key (and not an undefined under
        it), with no undefined made for a missing one; anything else as the lookup and the test would."""
        found = self._dict_key(node.node, frame)
        if found is None:
            return False
        base, key, miss = found
        value = self._temp()
        self.write(f"({'not ' if node.name == 'defined' else ''}isinstance({value}.get({key!r}, _UNDEFINED)")
        self.write(f" if type({value} := ")
        self.visit(base, frame)
        self.write(f") is dict else {miss}({value}, {key!r}), Undefined))")
        return True

    @optimizeconst
    def visit_Add(self, node: nodes.BinExpr, frame: Frame) -> None:
        operands = _add_operands(node)
        strings = [o for o in operands if isinstance(o, nodes.Const) and isinstance(o.value, str)]
        if not strings:
            if any(isinstance(o, nodes.Const) and type(o.value) in (int, float) for o in operands):
                self.write("(")  # a number: Python's + as it is (integers stay small, see limits.mul)
                for at, operand in enumerate(operands):
                    self.write(" + " if at else "")
                    self.visit(operand, frame)
                self.write(")")
                return
            # `ns.text + piece`: two short strings added by Python, anything else as jinja2 adds
            left, right = self._temp(), self._temp()
            self.write(f"({left} + {right} if (type({left} := ")
            self.visit(node.left, frame)
            self.write(f") is str) & (type({right} := ")
            self.visit(node.right, frame)
            self.write(f") is str) and len({left}) + len({right}) <= {_SHORT_CHAIN} else _cc_add({left}, {right}))")
            return
        # `'<|im_start|>' + role + '\n' + content`: when every operand is a str and they are short, one
        # f-string builds the sum at once; anything else is added as jinja2 adds (Markup escapes, ...).
        pieces = self._chain_pieces(operands)
        self.write(f"({_fstring(pieces)} if ")
        self._chain_guard(pieces, frame)
        self.write(f" else _cc_cat({_codes(pieces)}))")

    def _chain_pieces(self, operands: list[nodes.Expr]) -> list[tuple[str, nodes.Expr | None]]:
        """The operands of a ``+`` chain as (text, None) for a literal, (temporary, node) for the others."""
        pieces: list[tuple[str, nodes.Expr | None]] = []
        for operand in operands:
            if isinstance(operand, nodes.Const) and type(operand.value) is str:
                pieces.append((operand.value, None))
            else:
                pieces.append((self._temp(), operand))
        return pieces

    def _chain_guard(self, pieces: list[tuple[str, nodes.Expr | None]], frame: Frame, room: int = _SHORT_CHAIN) -> None:
        """``len(a := A) + ... <= room - literals and type(a) is str and ...``: every operand evaluated, in order."""
        literal = sum(len(text) for text, node in pieces if node is None)
        dynamic = [(code, node) for code, node in pieces if node is not None]
        self.write("(")
        for at, (temp, operand) in enumerate(dynamic):
            self.write(f"{' + ' if at else ''}len({temp} := ")
            self.visit(operand, frame)
            self.write(")")
        if not dynamic:
            self.write("0")
        self.write(f") <= {room - literal}")
        for temp, _ in dynamic:
            self.write(f" and type({temp}) is str")

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # `'<' ~ key ~ '>'`: the string forms (jinja2's str_join) in one f-string, after their lengths are
        # checked to be small; else joined by limits.concat, which checks and pays
        pieces: list[tuple[str, nodes.Expr | None]] = []
        for part in node.nodes:
            value = _constant(part, frame)
            pieces.append((value, None) if isinstance(value, str) else (self._temp(), part))
        literal = sum(len(text) for text, part in pieces if part is None)
        self.write(f"({_fstring(pieces)} if (")
        dynamic = [(temp, part) for temp, part in pieces if part is not None]
        for at, (temp, part) in enumerate(dynamic):
            self.write(f"{' + ' if at else ''}len({temp} := ")
            if self._is_text(part, frame):
                self.visit(part, frame)
            else:
                self.write("str(")
                self.visit(part, frame)
                self.write(")")
            self.write(")")
        if not dynamic:
            self.write("0")
        self.write(f") <= {_SHORT_CHAIN - literal} else _cc_concat(({_codes(pieces)},)))")

    @optimizeconst
    def visit_Mod(self, node: nodes.BinExpr, frame: Frame) -> None:
        divisor = _constant(node.right, frame)
        if type(divisor) is not int or not divisor:
            super().visit_Mod(node, frame)
            return
        # `loop.index0 % 2`: an int's remainder; a string on the left is printf formatting (limits.mod)
        if isinstance(node.left, nodes.Getattr) and self._is_counter(node.left, frame):
            self.write("(")
            self.visit(node.left, frame)
            self.write(f" % {divisor})")
            return
        value = self._temp()
        self.write(f"({value} % {divisor} if type({value} := ")
        self.visit(node.left, frame)
        self.write(f") is int else _cc_mod({value}, {divisor}))")

    @optimizeconst
    def visit_Compare(self, node: nodes.Compare, frame: Frame) -> None:
        if len(node.ops) == 1:
            op = node.ops[0]
            if op.op in ("in", "notin"):
                needle = _constant(node.expr, frame)
                if isinstance(needle, str) and not isinstance(_constant(op.expr, frame), (str, list, tuple, dict)):
                    # `'</think>' in content`, `'type' in param`: a search in a dict or a short str or list,
                    # else the paid one
                    hay = self._temp()
                    python = "in" if op.op == "in" else "not in"
                    self.write(f"({needle!r} {python} {hay} if type({hay} := ")
                    self.visit(op.expr, frame)
                    self.write(
                        f") is dict or (type({hay}) in _SEARCHED and len({hay}) <= {_SHORT})"
                        f" else _cc_{op.op}({needle!r}, {hay}))"
                    )
                    return
            elif self._small(node.expr, frame) or self._small(op.expr, frame):
                # a number, a bool or a constant on one side: the comparison takes constant time
                self.write("(")
                self.visit(node.expr, frame)
                self.visit(op, frame)
                self.write(")")
                return
        super().visit_Compare(node, frame)

    def _is_counter(self, node: nodes.Getattr, frame: Frame) -> bool:
        """Whether ``node`` is an integer counter of a fast loop (``loop.index0``, ``loop.length``...)."""
        target = node.node
        return (
            node.attr not in ("first", "last", "previtem", "nextitem")
            and isinstance(target, nodes.Name)
            and target.name == "loop"
            and (frame.symbols.find_ref("loop") or "") in self._fast_loops
        )

    def _small(self, node: nodes.Node, frame: Frame) -> bool:
        """Whether ``node`` gives a number, a bool or a constant (if anything): comparing it costs constant time."""
        if isinstance(node, (nodes.Const, nodes.Compare, nodes.Not, nodes.Test)):
            return True
        if isinstance(node, (nodes.Sub, nodes.Div, nodes.FloorDiv, nodes.Neg, nodes.Pos)):
            return True  # numbers, or an error
        if isinstance(node, nodes.Add):
            return any(isinstance(o, nodes.Const) and type(o.value) in (int, float) for o in _add_operands(node))
        if isinstance(node, nodes.Mod):
            return self._small(node.left, frame)
        if isinstance(node, (nodes.And, nodes.Or)):
            return self._small(node.left, frame) and self._small(node.right, frame)
        if isinstance(node, nodes.CondExpr):
            return node.expr2 is not None and self._small(node.expr1, frame) and self._small(node.expr2, frame)
        if isinstance(node, nodes.Filter):
            return node.name in ("length", "count", "int", "float", "abs", "round", "wordcount")
        if isinstance(node, nodes.Getattr) and node.attr not in ("previtem", "nextitem"):
            target = node.node
            return (
                isinstance(target, nodes.Name)
                and target.name == "loop"
                and (frame.symbols.find_ref("loop") or "") in self._fast_loops
            )
        return False


def _fstring(pieces: list[tuple[str, Any]]) -> str:
    """An f-string of literals (text, node None) and temporaries holding text (``{t!s}``)."""
    body = []
    for value, node in pieces:
        if node is None:
            escaped = value.encode("unicode_escape").decode("ascii").replace("'", "\\'")
            body.append(escaped.replace("{", "{{").replace("}", "}}"))
        else:
            body.append("{" + value + "!s}")
    return "f'" + "".join(body) + "'"


def _codes(pieces: list[tuple[str, Any]]) -> str:
    """The pieces as Python arguments: literals as their reprs, temporaries by name."""
    return ", ".join(value if node is not None else repr(value) for value, node in pieces)


def _is_loop_name(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Name) and node.name == "loop"


def _direct_arguments(call: nodes.Call, parameters: list[str]) -> list[nodes.Expr | None] | None:
    """The arguments of a call of a macro with ``parameters``, by position (None for one not given), or
    None when the call has more arguments than parameters, a keyword that is not one, or ``*``/``**``."""
    if call.dyn_args or call.dyn_kwargs or len(call.args) > len(parameters):
        return None
    arguments: list[nodes.Expr | None] = [*call.args, *[None] * (len(parameters) - len(call.args))]
    for keyword in call.kwargs:
        if keyword.key not in parameters:
            return None
        at = parameters.index(keyword.key)
        if arguments[at] is not None:
            return None
        arguments[at] = keyword.value
    return arguments


def _only_called(tree: nodes.Template, names: set[str]) -> set[str]:
    """Of the macros ``names``, those the template only calls by name (with arguments it can place:
    never as a value, with ``*``/``**``, or with a ``{% call %}`` block)."""
    blocks = {id(block.call) for block in tree.find_all(nodes.CallBlock)}
    macros = {m.name: [a.name for a in m.args] for m in tree.body if isinstance(m, nodes.Macro) and m.name in names}
    loads: dict[str, int] = dict.fromkeys(names, 0)
    calls: dict[str, int] = dict.fromkeys(names, 0)
    for name in tree.find_all(nodes.Name):
        if name.ctx == "load" and name.name in loads:
            loads[name.name] += 1
    for call in tree.find_all(nodes.Call):
        target = call.node
        if (
            isinstance(target, nodes.Name)
            and target.name in calls
            and id(call) not in blocks
            and target.name in macros
            and _direct_arguments(call, macros[target.name]) is not None
        ):
            calls[target.name] += 1
    return {name for name in names if loads[name] == calls[name]}


def _add_operands(node: nodes.Node) -> list[nodes.Expr]:
    """The operands of a chain of ``+``, left to right: ``a + b + c`` is ``((a + b) + c)``."""
    operands: list[nodes.Expr] = []
    while isinstance(node, nodes.Add):
        operands.append(node.right)
        node = node.left
    operands.append(node)  # type: ignore[arg-type]
    operands.reverse()
    return operands


def _constant(node: nodes.Node, frame: Frame) -> Any:
    """The value of a constant expression, or the ``missing`` marker."""
    try:
        return node.as_const(frame.eval_ctx)  # type: ignore[attr-defined]
    except (nodes.Impossible, AttributeError, Exception):
        return missing


def _stores(body: Iterable[nodes.Node]) -> Iterator[nodes.Name]:
    """The names ``body`` assigns (``set``, loop targets, ``with``), at any depth."""
    for top in body:
        for name in [top, *top.find_all(nodes.Name)]:
            if isinstance(name, nodes.Name) and name.ctx in ("store", "param"):
                yield name


def _message_lists(tree: nodes.Template, context_names: frozenset[str]) -> frozenset[str]:
    """The names that only ever hold the render's messages, or slices of them: lists of dicts.

    ``messages`` is the render's (every message a dict: chatcodec.render normalizes them) unless the template
    binds it otherwise; ``loop_messages`` is one if every ``{% set %}`` of it is ``messages`` or a slice of
    one of these, and no frame reads it from the render's variables (a path that left it unset would).

    >>> tree = environment.parse("{% set rest = messages[1:] %}{% set other = messages[0] %}{% set m2 = rest %}")
    >>> sorted(_message_lists(tree, frozenset({"messages"})))
    ['m2', 'messages', 'rest']
    """
    values: dict[str, list[nodes.Node | None]] = {"messages": []}
    targets = set()
    for assign in tree.find_all(nodes.Assign):
        if isinstance(assign.target, nodes.Name):
            values.setdefault(assign.target.name, []).append(assign.node)
            targets.add(id(assign.target))
    # a loop's target, a macro's parameter, a `{% with %}` name...
    bound_otherwise = {n.name for n in tree.find_all(nodes.Name) if n.ctx != "load" and id(n) not in targets}
    lists = {n for n in values if n not in bound_otherwise and (n == "messages" or n not in context_names)}
    while True:  # drop the names some value of which is not one of the others
        kept = {n for n in lists if all(_lists_messages(value, lists) for value in values[n])}
        if kept == lists:
            return frozenset(lists)
        lists = kept


#: _message_lists's view of a template for chatcodec.footprint: a name that may also come from the render's
#: variables still holds messages on the other paths (what it holds from the variables is not a message)
_MESSAGES = frozenset({"messages"})


def _lists_messages(node: nodes.Node | None, lists: Iterable[str]) -> bool:
    """Whether ``node`` is one of ``lists`` (see _message_lists), or a slice of one."""
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        node = node.node
    return isinstance(node, nodes.Name) and node.name in lists


def _counted_parts(iterable: nodes.Expr) -> tuple[nodes.Expr, int]:
    """A loop's iterable without the sandbox's counting filter, and the weight that filter charges."""
    if isinstance(iterable, nodes.Filter) and iterable.name == "_cc_counted":
        return iterable.node, iterable.args[0].value  # type: ignore[return-value, attr-defined]
    return iterable, 1


def _stops_when(loop: nodes.For) -> tuple[str, str] | None:
    """``(ns, flag)`` when ``loop`` does nothing once ``ns.flag`` is false: its body sets loop-local names
    to values that cannot fail (numbers from constants, lengths and the loop's counters), then holds one
    ``{% if ns.flag and ... %}`` and nothing else, and ``ns`` is not assigned in it.

    Qwen's templates find the last user query so, walking the messages from the end: once the flag is
    cleared, the rest of the walk is idle, and the loop can stop (the flag read is the same dict lookup
    the next test would make first).
    """
    if loop.test is not None or loop.recursive or not loop.body:
        return None
    *assigns, last = [n for n in loop.body if not _is_checkpoint(n)]
    if not isinstance(last, nodes.If) or last.elif_ or last.else_:
        return None
    test = last.test
    while isinstance(test, nodes.And):
        test = test.left
    if not (isinstance(test, nodes.Getattr) and isinstance(test.node, nodes.Name) and test.node.ctx == "load"):
        return None
    name = test.node.name
    for assign in assigns:
        if not (isinstance(assign, nodes.Assign) and isinstance(assign.target, nodes.Name)):
            return None
        if assign.target.name in (name, "loop") or not _cannot_fail(assign.node):
            return None
    if any(n.name == name for n in _stores(loop.body)):
        return None
    return name, test.attr


def _is_checkpoint(node: nodes.Node) -> bool:
    return isinstance(node, nodes.ExprStmt) and isinstance(node.node, nodes.Filter) and node.node.name == "_cc_spend"


def _cannot_fail(node: nodes.Node) -> bool:
    """An int expression of constants, ``x|length`` and the loop's counters, with ``+``, ``-`` and ``*``."""
    if isinstance(node, nodes.Const):
        return type(node.value) is int
    if isinstance(node, (nodes.Add, nodes.Sub, nodes.Mul)):
        return _cannot_fail(node.left) and _cannot_fail(node.right)
    if isinstance(node, nodes.Filter):  # `name|length`: 0 for an undefined name, never an error
        plain = not (node.args or node.kwargs or node.dyn_args or node.dyn_kwargs)
        return node.name == "length" and plain and isinstance(node.node, nodes.Name)
    return _is_loop_name(node.node) and node.attr in ("index0", "index") if isinstance(node, nodes.Getattr) else False


def _reads_only_counters(body: Iterable[nodes.Node]) -> bool:
    """Whether a loop body uses ``loop`` only as ``loop.index0``, ``loop.last``... (not passed on, not called)."""
    parents: dict[int, nodes.Node] = {}
    for top in body:
        for parent in [top, *top.find_all(nodes.Node)]:
            for child in parent.iter_child_nodes():
                parents[id(child)] = parent
            if isinstance(parent, (nodes.Macro, nodes.CallBlock)) and "loop" in find_undeclared(
                parent.iter_child_nodes(), ("loop",)
            ):
                return False
    inner_loops = [n for top in body for n in top.find_all(nodes.For) if "loop" in find_undeclared(n.body, ("loop",))]
    shadowed = {id(n) for loop in inner_loops for top in loop.body for n in [top, *top.find_all(nodes.Node)]}
    for top in body:
        for name in [top, *top.find_all(nodes.Name)]:
            if not (isinstance(name, nodes.Name) and name.name == "loop") or id(name) in shadowed:
                continue
            above = parents.get(id(name))
            if not (isinstance(above, nodes.Getattr) and above.node is name and above.attr in _LOOP_ATTRIBUTES):
                return False
    return True


class FastTemplate:
    """A template compiled by :mod:`chatcodec.compiler`: ``root(variables, budget)`` gives the output.

    ``names`` are the variables it reads (a template cannot reach any other: it has no access to its
    context as a whole).
    """

    __slots__ = ("_lines", "message_keys", "names", "resumable", "root", "source", "spans")

    def __init__(
        self,
        root: Any,
        source: str,
        debug_info: list[tuple[int, int]],
        names: frozenset[str],
        resumable: bool = False,
        spans: bool = False,
        message_keys: frozenset[str] | None = None,
    ) -> None:
        self.root = root
        self.source = source  # the generated Python, for reading
        self.names = names
        #: the keys of a message the template can read, or None when it may see a message whole
        #: (:mod:`chatcodec.footprint`): a render normalizes only those (chatcodec.render)
        self.message_keys = message_keys
        #: whether a render can resume the previous one (it has a loop chatcodec.resuming can take over)
        self.resumable = resumable
        #: whether it tracks ``{% generation %}`` spans as the generic path does: every block writes to the
        #: root's output, whose length so far is the span's start (GenerationExtension._generation)
        self.spans = spans
        self._lines = sorted(debug_info, key=lambda pair: pair[1])

    def get_corresponding_lineno(self, lineno: int) -> int:
        """The template line of a line of the generated Python (what sandbox._template_line asks)."""
        for template_line, code_line in reversed(self._lines):
            if code_line <= lineno:
                return template_line
        return 1

    def render(self, variables: Mapping[str, Any], budget: limits.Budget) -> str:
        """The output for ``variables`` under ``budget``, or Python's own error (see :func:`render`)."""
        return self.root(*split_variables(variables), budget)  # type: ignore[no-any-return]


@lru_cache(maxsize=256)
def fast_template(source: str) -> FastTemplate | None:
    """``source`` compiled for plain values, or None when it uses what only the generic path handles."""
    try:
        tree = environment._parse(source, None, None)
        counting = _FastGenerator(None)  # a first pass counts how often each lookup is read
        counting.visit(tree)
        generator = _FastGenerator(None, counting._uses, counting._resolved)
        generator.visit(tree)
        code = generator.finish(generator.stream.getvalue())  # type: ignore[attr-defined]
        namespace = dict(_RUNTIME)
        exec(compile(code, "<chatcodec compiled template>", "exec"), namespace)
    except (_Unsupported, RecursionError):
        return None
    except Exception:  # jinja2 refuses it (an unknown filter at compile time...): the generic path reports it
        return None
    template = FastTemplate(
        namespace["root"], code, generator.debug_info, frozenset(generator._resolved), "_cc_resume" in code,
        not generator._nested_generation, footprint.reads(tree, _message_lists(tree, _MESSAGES)),
    )  # fmt: skip
    namespace["__jinja_template__"] = template
    return template


def render(
    compiled: sandbox.Compiled,
    source: str,
    variables: Mapping[str, Any],
    name: str | None = None,
    budget: limits.Budget | None = None,
) -> str:
    """Render ``source`` with its compiled form when it has one, else (or on any error) as sandbox.run does."""
    assert budget is not None
    fast = _fast(compiled, source)
    if fast is not None and (budget.spans is None or fast.spans):
        try:
            text: str = fast.render(variables, budget)
        except Exception as exc:
            return recover(exc, compiled, variables, name, budget)
        return text
    return sandbox.run(compiled, variables, name=name, budget=budget)


def message_keys(compiled: sandbox.Compiled, source: str) -> frozenset[str] | None:
    """The keys of a message the compiled form of ``source`` can read (:mod:`chatcodec.footprint`), or None
    (it may see a message whole, or ``source`` takes the generic path)."""
    fast = _fast(compiled, source)
    return None if fast is None else fast.message_keys


def _fast(compiled: sandbox.Compiled, source: str) -> FastTemplate | None:
    """The compiled form of ``source`` (``compiled``'s), made on first use."""
    fast = compiled.fast
    if fast is NOT_COMPILED:
        fast = compiled.fast = fast_template(source)
    return fast  # type: ignore[no-any-return]


def recover(
    error: Exception, compiled: sandbox.Compiled, variables: Mapping[str, Any], name: str | None, budget: limits.Budget
) -> str:
    """After a compiled render of ``compiled`` raised ``error``: a LimitError (with its template line) or
    a recursion or memory error stands; anything else is rendered again on the generic path, which
    raises jinja2's own error or gives the text."""
    if isinstance(error, LimitError):
        if error.lineno is None:
            error.template_name, error.lineno = name, sandbox._template_line(error)
        raise error
    if isinstance(error, (RecursionError, MemoryError)):
        raise sandbox._translate(error, name) from error
    budget.output, budget.measured, budget.emitted = None, 0, 0  # the generic path starts over, same budget
    if budget.spans:
        budget.spans.clear()
    return sandbox.run(compiled, variables, name=name, budget=budget)
