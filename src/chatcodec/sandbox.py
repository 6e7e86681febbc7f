"""The one Jinja environment every chat template runs in: safe, budgeted, and fast.

It reproduces the environment transformers 5.24 builds in ``_cached_compile_jinja_template`` exactly:
``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with ``loopcontrols`` and the
``{% generation %}`` tag, the globals ``raise_exception``, ``strftime_now``, a guarded ``namespace`` and
a limited ``dict``, and ``tojson`` with ``json.dumps`` semantics. Rendering is therefore identical by
construction; what differs is how it gets there:

* **Speed.** jinja2's sandbox checks every attribute access with a chain of ``isinstance`` tests. After
  preprocessing (:mod:`chatcodec.render`) a template only ever sees plain JSON values, so attribute and
  item lookups on ``dict``, ``list`` and ``str`` take a fast path whose answers are precomputed from the
  sandbox's own rules (:func:`_safe_attributes`); everything else falls back to jinja2's checks.
  Attribute and item lookups compile to module-level function calls instead of ``environment.getattr``.
* **Budgets.** Loops and macros spend steps, amplifying operators are checked before they allocate,
  and the output is measured as it streams (:mod:`chatcodec.limits`).
* **Errors.** Whatever goes wrong becomes a :class:`~chatcodec.ChatcodecError` that names the template
  and the line of its source (:func:`run`).
"""

from __future__ import annotations

import builtins
import json
import math
import re
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from functools import lru_cache, update_wrapper
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from json.encoder import encode_basestring_ascii as _ASCII_STRING
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import Namespace
from markupsafe import EscapeFormatter, Markup

from . import limits
from .exceptions import (
    ChatcodecError,
    LimitError,
    SandboxError,
    TemplateError,
    TemplateRaisedError,
    TemplateRuntimeError,
    TemplateSyntaxError,
)

__all__ = ["Compiled", "compile_template", "environment", "run"]


# --- the globals transformers gives every template ---------------------------------------------------


class _Raised(jinja2.TemplateError):
    """What ``raise_exception()`` throws inside the template; :func:`run` reports it verbatim."""


def raise_exception(message: Any) -> None:
    raise _Raised(message)


def strftime_now(format: str) -> str:
    """The template's clock: the render's pinned ``now``, or local time as in transformers.

    With a pinned ``now`` (renders of a dataset, tests) the text of each format is kept: strftime is
    slow, and a pinned clock always gives the same text.
    """
    now = limits.active().now
    key: tuple[Any, ...] | None = None
    if now is not None and format.__class__ is str:
        key = (now, now.tzinfo, now.fold, format)  # equal datetimes may differ in zone or fold
        try:
            text = _DATES.get(key)
        except TypeError:  # a zone that cannot be hashed
            key = None
        else:
            if text is not None:
                return text
    if isinstance(format, str) and (len(format) > 16 or _HAS_DIGIT.search(format)):
        limits.check_strftime(format)
    text = (now if now is not None else datetime.now()).strftime(format)
    if key is not None and len(text) <= limits.FAST_SIZE:
        if len(_DATES) >= 256:
            _DATES.clear()
        _DATES[key] = text
    return text


#: the text of strftime_now for each pinned clock and format (a few of them; cleared when it fills up)
_DATES: dict[tuple[Any, ...], str] = {}


_HAS_DIGIT = re.compile(r"\d")


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


# json.dumps builds an encoder on every call; with the default options one prebuilt C encoder gives the
# same bytes faster. Templates cannot build cycles (they cannot mutate), so no cycle bookkeeping is needed.
_DEFAULT_JSON = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _not_serializable, encode_basestring, None, ": ", ", ", False, False, True)
)


def tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Python's json.dumps, not jinja2's HTML-escaping filter: the prompt must hold "<", ">" and "&" raw.
    # Every container a template can build holds at most max_output characters (limits.expanded_size), so
    # the text is bounded by construction; an indent multiplies it by the nesting depth, checked first.
    if _DEFAULT_JSON is not None and not ensure_ascii and indent is None and separators is None and not sort_keys:
        text = "".join(_DEFAULT_JSON(x, 0))
    else:
        indented = None
        if indent is not None and separators is None and type(indent) in (int, str):
            # counted as it is written (see _indented_json), against the output limit
            layout = indent if type(indent) is str else " " * indent
            if len(layout) <= limits.FAST_SIZE:
                indented = _indented_json(x, layout, ensure_ascii, sort_keys, limits.active().limits.max_output)
        if indented is not None:
            text = indented
        else:
            limits.check_json_layout(x, indent, separators)
            text = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    if len(text) > limits.FAST_SIZE:
        limits.check_size(len(text), "the result of |tojson")
    return text


def checked_json(text: str) -> str:
    """``text``, the JSON :func:`tojson` made, checked and paid for as tojson does with a long one."""
    limits.check_size(len(text), "the result of |tojson")
    return text


def _indented_json(value: Any, indent: str, ensure_ascii: bool, sort_keys: bool, limit: int) -> str | None:
    """``json.dumps(value, indent=..., ensure_ascii=..., sort_keys=...)`` of plain JSON, in one list of parts.

    The standard library writes indented JSON with its Python encoder, a generator per container; this
    writes the same characters directly, counting them as it goes (the layout per container, the text
    per string) and raising LimitError once past ``limit``. None when ``value`` holds anything but exact
    JSON types with string keys, or nests too deeply: json.dumps then does it, errors included.
    """
    string = _ASCII_STRING if ensure_ascii else encode_basestring
    parts: list[str] = []
    add = parts.append
    room = [limit]

    def write(item: Any, newline: str) -> None:
        kind = item.__class__
        if kind is dict or kind is list:
            if not item:
                add("[]" if kind is list else "{}")
                return
            inner = newline + indent
            left = room[0] - len(item) * (len(inner) + 8)  # the layout, and at least a few characters an item
            if left < 0:
                raise _TooLarge
            if kind is dict:
                separator = "{" + inner
                for key in sorted(item) if sort_keys else item:
                    if key.__class__ is not str:
                        raise _NotPlain
                    entry = item[key]
                    add(separator + string(key) + ": ")
                    left -= len(key)
                    if entry.__class__ is str:
                        left -= len(entry)
                        add(string(entry))
                    else:
                        room[0] = left
                        write(entry, inner)
                        left = room[0]
                    separator = "," + inner
                add(newline + "}")
            else:
                separator = "[" + inner
                for entry in item:
                    add(separator)
                    if entry.__class__ is str:
                        left -= len(entry)
                        add(string(entry))
                    else:
                        room[0] = left
                        write(entry, inner)
                        left = room[0]
                    separator = "," + inner
                add(newline + "]")
            if left < 0:
                raise _TooLarge
            room[0] = left
        elif kind is str:
            room[0] -= len(item)
            add(string(item))
        elif item is None:
            add("null")
        elif item is True:
            add("true")
        elif item is False:
            add("false")
        elif kind is int:
            add(int.__repr__(item))
        elif kind is float:
            add(_json_float(item))
        else:
            raise _NotPlain

    try:
        write(value, "\n")
    except (_NotPlain, RecursionError, TypeError):
        return None
    except _TooLarge:
        limits.check_size(limit + 1, "the result of |tojson")
    return "".join(parts)


class _TooLarge(Exception):
    """The JSON :func:`_indented_json` writes passes its limit."""


class _NotPlain(Exception):
    """A value :func:`_indented_json` leaves to json.dumps."""


def _json_float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == math.inf:
        return "Infinity"
    if value == -math.inf:
        return "-Infinity"
    return float.__repr__(value)


class TemplateDict:
    """The ``dict`` global: builds dicts, and nothing else is reachable through it."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        if args:
            args = (limits.counted_input(args[0], "dict()"), *args[1:])
        return limits.built(dict(*args, **kwargs))  # type: ignore[no-any-return]

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        if args:
            args = (limits.counted_input(args[0], "dict.fromkeys()"), *args[1:])
        return limits.built(dict.fromkeys(*args, **kwargs))  # type: ignore[no-any-return]


#: the types of JSON's scalars, as Python reads them
SCALARS = frozenset({str, int, float, bool, type(None)})


class TemplateNamespace(Namespace):
    """``namespace()``, refusing underscore-prefixed attribute names as transformers does.

    The attributes live in the instance's own ``__dict__`` and are read with plain attribute access,
    not through jinja2's ``Namespace.__getattribute__`` (Python code run for every read, ``__class__``
    included); the sandbox keeps templates away from the underscore names, so templates see the same
    object: the same attributes, the same ``<Namespace {...}>`` text.
    """

    __getattribute__ = object.__getattribute__

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs) if args else kwargs
        shared = False
        for name, value in attrs.items():
            if isinstance(name, str) and name.startswith("_"):
                _refuse_name(name)
            if value.__class__ not in SCALARS:
                shared = True
        if shared:
            limits.built(attrs)
        self.__dict__.update(attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            _refuse_name(name)
        self.__dict__[name] = value

    def __repr__(self) -> str:
        # A namespace can change after a list holding it was checked, so its text is paid for each time
        # it is shown: printing a list that repeats it stops at the budget instead of filling memory.
        attrs = self.__dict__
        limits.check_expanded(attrs, "a namespace")
        return _made_text(f"<Namespace {attrs!r}>")


def _made_text(text: str) -> str:
    if len(text) > limits.FAST_SIZE:
        limits.active().big(len(text), "a namespace", len(text))
    return text


limits.EXPANDABLE.add(TemplateNamespace)
limits.STRINGS.add(Markup)


def _refuse_name(name: str) -> None:
    raise SecurityError(
        f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
        "Please rename the attribute."
    )


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """jinja2's ``lipsum``, paid for before it runs: ``n`` paragraphs of up to ``max`` words (``min`` when it is
    the larger), each word up to 12 characters; a paragraph costs its overhead even when it has no words."""
    for name, value in (("n", n), ("min", min), ("max", max)):
        if type(value) is not int:
            raise TypeError(f"lipsum({name}=...) takes a whole number, not {type(value).__name__}")
    paragraphs, words = builtins.max(n, 0), builtins.max(min, max, 0)
    limits.check_size(paragraphs * (words * 12 + 16), "lorem ipsum text")
    limits.active().check_items(paragraphs * (words + 1), "lipsum")  # a random draw per word, in Python
    return str(jinja2.utils.generate_lorem_ipsum(n=n, html=html, min=min, max=max))


# --- {% generation %} --------------------------------------------------------------------------------


class GenerationExtension(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}``: marks text the model generates (assistant masks).

    The body renders in place. When the render tracks generation, the block's character span is
    recorded, measured (as transformers does) from what the template's root has produced so far.
    """

    tags = {"generation"}  # noqa: RUF012 - jinja2's own class attribute

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation(self, caller: Callable[[], str]) -> str:
        text = caller()
        budget = limits.active()
        if budget.spans is not None:
            start = budget.emitted
            output = budget.output  # a compiled render's root output, measured up to `measured`
            if output is not None and len(output) > budget.measured:
                start += sum(map(len, output[budget.measured :]))
            budget.spans.append((start, start + len(text)))
        return text


# --- the fast, JSON-typed sandbox -------------------------------------------------------------------

_PLAIN_TYPES = frozenset({dict, list, str, int, float, bool, type(None), tuple})
_STR_FORMAT = frozenset({"format", "format_map"})
#: the names of a dict's own attributes (its methods), which are not keys
DICT_ATTRIBUTES = frozenset(dir(dict))
_BuiltinMethod = types.BuiltinMethodType


def _safe_attributes(env: ImmutableSandboxedEnvironment) -> dict[type, frozenset[str]]:
    """For each plain type (and ``loop``), the public attributes the sandbox itself allows, asked once."""
    samples: list[Any] = [{}, [], "", 0, 0.0, False, None, (), _BudgetedLoop([], env.undefined)]
    table = {}
    for sample in samples:
        table[type(sample)] = frozenset(
            name
            for name in dir(sample)
            # dunders stay on the slow path; str.format must be wrapped by the sandbox
            if not name.startswith("_")
            and not (isinstance(sample, str) and name in _STR_FORMAT)
            and ImmutableSandboxedEnvironment.is_safe_attribute(env, sample, name, getattr(sample, name))
        )
    return table


# --- what a render pays for: the weight of template code -----------------------------------------------

#: nodes that cost nothing on their own: a step is one node that does work
_FREE_NODES = (nodes.Const, nodes.Name, nodes.TemplateData, nodes.Keyword, nodes.Pair, nodes.Slice, nodes.Output)
#: a straight stretch of template code gets a checkpoint every this many steps
_CHECKPOINT_STEPS = 1024


def _weight(body: Iterable[nodes.Node]) -> int:
    """The steps one run of ``body`` costs: its nodes that do work (at least 1)."""
    work = 0
    for node in body:
        work += not isinstance(node, _FREE_NODES)
        work += sum(1 for n in node.find_all(nodes.Node) if not isinstance(n, _FREE_NODES))
    return max(work, 1)


def _checkpoint(steps: int, lineno: int) -> nodes.Stmt:
    """A statement that pays ``steps`` steps (and reads the clock when a chunk is used up)."""
    call = nodes.Filter(nodes.Const(None), "_cc_spend", [nodes.Const(steps)], [], None, None, lineno=lineno)
    return nodes.ExprStmt(call, lineno=lineno)


def _add_checkpoints(node: nodes.Node) -> None:
    """Put a checkpoint before every ~1024 steps of straight code, in every statement list of ``node``.

    Loops and macros pay for their bodies when they run; this covers long templates run once, which
    would otherwise run to their end before the clock is read.
    """
    for field in ("body", "else_", "elif_"):
        statements = getattr(node, field, None)
        if not isinstance(statements, list):
            continue
        done: list[nodes.Node] = []
        pending = 0
        for statement in statements:
            _add_checkpoints(statement)
            weight = _weight([statement])
            if pending + weight > _CHECKPOINT_STEPS and pending:
                done.append(_checkpoint(pending, statement.lineno))
                pending = 0
            pending += weight
            done.append(statement)
        statements[:] = done


#: where single-operator comparisons go when an operand may be large (see visit_Compare)
_COMPARE_FUNCTIONS = {
    "eq": "_cc_eq",
    "ne": "_cc_ne",
    "lt": "_cc_lt",
    "lteq": "_cc_le",
    "gt": "_cc_gt",
    "gteq": "_cc_ge",
    "in": "_cc_in",
    "notin": "_cc_notin",
}


class _CodeGenerator(CodeGenerator):
    """jinja2's code generator, with lookups, comparisons and amplifying operators as budgeted calls."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        super().visit_Template(node, frame)
        # Rebound after jinja's own `from jinja2.runtime import ...` line; looked up at render time.
        self.writeline("Macro = environment.macro_class")
        self.writeline("LoopContext = environment.loop_class")
        for name in ("getattr", "getitem", "add", "mul", "power", "mod", "concat"):
            self.writeline(f"_cc_{name} = environment.fast_{name}")
        self.writeline("_cc_call_method = environment.call_method")
        for name in ("slice_of", "built", "chain", "contains", "not_in", "eq", "ne", "lt", "le", "gt", "ge"):
            self.writeline(f"_cc_{name} = environment.budget.{name}")
        self.writeline("_cc_in = _cc_contains")
        self.writeline("_cc_notin = _cc_not_in")

    def _is_const(self, node: nodes.Expr, frame: Frame) -> bool:
        try:
            node.as_const(frame.eval_ctx)
        except nodes.Impossible:
            return False
        return True

    @optimizeconst
    def visit_Getattr(self, node: nodes.Getattr, frame: Frame) -> None:
        self.write("_cc_getattr(")
        self.visit(node.node, frame)
        self.write(f", {node.attr!r})")

    @optimizeconst
    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        if isinstance(node.arg, nodes.Slice):
            # `x[a:b]` copies: limits.slice_of pays for it when x is large
            self.write("_cc_slice_of(")
            self.visit(node.node, frame)
            for part in (node.arg.start, node.arg.stop, node.arg.step):
                self.write(", ")
                if part is None:
                    self.write("None")
                else:
                    self.visit(part, frame)
            self.write(")")
            return
        self.write("_cc_getitem(")
        self.visit(node.node, frame)
        self.write(", ")
        self.visit(node.arg, frame)
        self.write(")")

    @optimizeconst
    def visit_Compare(self, node: nodes.Compare, frame: Frame) -> None:
        # `a in b` scans b, `a == b` compares two values of any size: those go through limits, which pays
        # for large operands. Against a constant (`x == 'user'`, `x in ['a', 'b']`) the cost is bounded by
        # the template text, so the plain Python operator stays.
        def routed(left: nodes.Expr, operand: nodes.Operand) -> bool:
            if operand.op in ("in", "notin"):
                return not self._is_const(operand.expr, frame)
            return not self._is_const(left, frame) and not self._is_const(operand.expr, frame)

        if len(node.ops) == 1:
            if routed(node.expr, node.ops[0]):
                self.write(_COMPARE_FUNCTIONS[node.ops[0].op] + "(")
                self.visit(node.expr, frame)
                self.write(", ")
                self.visit(node.ops[0].expr, frame)
                self.write(")")
                return
        else:
            lefts = [node.expr] + [op.expr for op in node.ops[:-1]]
            if any(routed(left, op) for left, op in zip(lefts, node.ops, strict=True)):
                self.write("_cc_chain(")
                self.visit(node.expr, frame)
                for op in node.ops:
                    self.write(f", ({op.op!r}, lambda: ")
                    self.visit(op.expr, frame)
                    self.write(")")
                self.write(")")
                return
        self.write("(")
        self.visit(node.expr, frame)
        for op in node.ops:
            self.visit(op, frame)
        self.write(")")

    @optimizeconst
    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        # a literal can repeat a value (`[x, x]`); limits.built checks lists holding other containers
        self.write("_cc_built(")
        super().visit_List(node, frame)
        self.write(")")

    @optimizeconst
    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":
            super().visit_Tuple(node, frame)
            return
        self.write("_cc_built(")
        super().visit_Tuple(node, frame)
        self.write(")")

    @optimizeconst
    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("_cc_built(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Call(self, node: nodes.Call, frame: Frame, forward_caller: bool = False) -> None:
        method = node.node
        if forward_caller or not isinstance(method, nodes.Getattr) or node.kwargs or node.dyn_args or node.dyn_kwargs:
            super().visit_Call(node, frame, forward_caller=forward_caller)
            return
        # `x.strip('\n')`: look the method up and call it in one step (environment.call_method)
        self.write("_cc_call_method(context, ")
        self.visit(method.node, frame)
        self.write(f", {method.attr!r}, (")
        for arg in node.args:
            self.visit(arg, frame)
            self.write(", ")
        self.write("), ")
        extra = [
            f"{k!r}: {k}" for k, on in (("_loop_vars", frame.loop_frame), ("_block_vars", frame.block_frame)) if on
        ]
        self.write("{" + ", ".join(extra) + "})" if extra else "None)")

    def macro_def(self, macro_ref: Any, frame: Frame) -> None:
        """jinja2's ``Macro(...)`` construction, with the macro's weight in steps as a last argument."""
        arg_tuple = ", ".join(repr(x.name) for x in macro_ref.node.args)
        name = getattr(macro_ref.node, "name", None)
        if len(macro_ref.node.args) == 1:
            arg_tuple += ","
        self.write(
            f"Macro(environment, macro, {name!r}, ({arg_tuple}),"
            f" {macro_ref.accesses_kwargs!r}, {macro_ref.accesses_varargs!r},"
            f" {macro_ref.accesses_caller!r}, context.eval_ctx.autoescape, {_weight(macro_ref.node.body)})"
        )

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("_cc_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def _call_binop(self, function: str, node: nodes.BinExpr, frame: Frame) -> None:
        self.write(f"{function}(")
        self.visit(node.left, frame)
        self.write(", ")
        self.visit(node.right, frame)
        self.write(")")

    @optimizeconst
    def visit_Add(self, node: nodes.BinExpr, frame: Frame) -> None:
        self._call_binop("_cc_add", node, frame)

    @optimizeconst
    def visit_Mul(self, node: nodes.BinExpr, frame: Frame) -> None:
        self._call_binop("_cc_mul", node, frame)

    @optimizeconst
    def visit_Pow(self, node: nodes.BinExpr, frame: Frame) -> None:
        self._call_binop("_cc_power", node, frame)

    @optimizeconst
    def visit_Mod(self, node: nodes.BinExpr, frame: Frame) -> None:
        self._call_binop("_cc_mod", node, frame)


class _BudgetedMacro(Macro):
    """Macros (and ``caller``) count their nesting depth and their weight against the render's budget."""

    def __init__(
        self,
        environment: Any,
        func: Callable[..., str],
        name: str,
        arguments: list[str],
        catch_kwargs: bool,
        catch_varargs: bool,
        caller: bool,
        default_autoescape: bool | None = None,
        weight: int = 1,
    ) -> None:
        super().__init__(environment, func, name, arguments, catch_kwargs, catch_varargs, caller, default_autoescape)
        self._cc_weight = weight

    def _invoke(self, arguments: list[Any], autoescape: bool) -> str:
        budget = limits.enter_recursion(self._cc_weight)
        try:
            return super()._invoke(arguments, autoescape)
        finally:
            budget.depth -= 1


class _BudgetedLoop(LoopContext):
    """``loop``: a recursive call, ``loop(children)``, counts its depth against the render's budget."""

    def __call__(self, iterable: Iterable[Any]) -> str:
        budget = limits.enter_recursion()
        try:
            return super().__call__(iterable)
        finally:
            budget.depth -= 1


class _SandboxedFormatter(SandboxedFormatter):
    """``str.format`` inside templates: fields looked up by the sandbox, widths and sizes checked."""

    def __init__(self, env: Any, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        self._cc_tally = limits.FormatTally()

    def format_field(self, value: Any, format_spec: str) -> Any:
        text = limits.format_field(value, format_spec)
        self._cc_tally.add(text)
        return text


class _SandboxedEscapeFormatter(_SandboxedFormatter, EscapeFormatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        text = EscapeFormatter.format_field(self, value, format_spec)
        self._cc_tally.add(text)
        return text


class ChatSandbox(ImmutableSandboxedEnvironment):
    """The environment of :mod:`chatcodec.sandbox`; use :data:`environment`, do not build another."""

    code_generator_class = _CodeGenerator
    macro_class = _BudgetedMacro
    loop_class = _BudgetedLoop
    # Declared intercepted so that jinja2 never folds them at compile time (where no budget applies);
    # the code generator routes them to the checked functions in chatcodec.limits.
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    fast_add = staticmethod(limits.add)
    fast_mul = staticmethod(limits.mul)
    fast_power = staticmethod(limits.power)
    fast_mod = staticmethod(limits.mod)
    fast_concat = staticmethod(limits.concat)
    #: the module whose checked functions generated code calls (limits.slice_of, limits.contains, ...)
    budget = limits

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[GenerationExtension, jinja2.ext.loopcontrols],
        )
        self.filters["tojson"] = tojson
        limits.guard_filters(self.filters)
        limits.guard_tests(self.tests)
        self.filters["_cc_counted"] = _counted
        self.filters["_cc_spend"] = _spend
        self.globals.update(
            raise_exception=raise_exception,
            strftime_now=strftime_now,
            dict=TemplateDict(),
            namespace=TemplateNamespace,
            lipsum=_lipsum,
        )
        self._safe = _safe_attributes(self)
        # the globals that are safe to call directly; they live as long as the environment, so ids stay unique
        self._trusted = {id(v) for v in self.globals.values() if not isinstance(v, (TemplateDict, type))}
        self._trusted.add(id(TemplateNamespace))
        self.fast_getattr = self.getattr
        self.fast_getitem = self.getitem

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        # Every loop pays its body's weight per item (limits.counted), so a runaway loop meets the time
        # limit; a recursive loop pays again each time its body runs, as loop(...) re-enters it.
        for loop in list(tree.find_all(nodes.For)):
            weight = _weight(loop.body) + (loop.test is not None)
            if loop.recursive:
                loop.body.insert(0, _checkpoint(weight, loop.lineno))
            loop.iter = nodes.Filter(
                loop.iter, "_cc_counted", [nodes.Const(weight)], [], None, None, lineno=loop.lineno
            )
        _add_checkpoints(tree)
        return tree

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in DICT_ATTRIBUTES:
            # what jinja2 does after `getattr(dict, name)` fails, without raising AttributeError first
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if kind is TemplateNamespace and not attribute.startswith("_"):
            attrs = obj.__dict__
            if attribute in attrs:
                return attrs[attribute]
        elif attribute in self._safe.get(kind, ()):
            return getattr(obj, attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if type(obj) in _PLAIN_TYPES:
            try:
                return obj[argument]
            except (TypeError, LookupError):
                pass
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        kind = type(__obj)
        # Methods of plain values were vetted when they were looked up (mutators never get this far);
        # macros, `loop` methods and our own globals are safe and take no context. Anything else gets
        # jinja2's full checks.
        if kind is _BuiltinMethod:
            owner = type(__obj.__self__)
            if owner in _PLAIN_TYPES:
                kwargs.pop("_loop_vars", None)
                kwargs.pop("_block_vars", None)
                if owner is str:
                    return limits.call_str_method(__obj, args, kwargs)
                return _plain_method(__obj, args, kwargs)
        elif (
            kind is _BudgetedMacro
            or id(__obj) in __self._trusted
            or (kind is types.MethodType and type(__obj.__self__) is _BudgetedLoop)
        ):
            kwargs.pop("_loop_vars", None)
            kwargs.pop("_block_vars", None)
            return __obj(*args, **kwargs)
        if kind is _BuiltinMethod or kind is types.MethodType:
            bound = __obj.__self__
            if isinstance(bound, (str, bytes)):
                # str subclasses (Markup) and bytes: the same checks as str methods, then jinja2's call
                if __obj.__name__ == "join" and args:
                    args = (list(limits.counted_input(args[0], "str.join")), *args[1:])
                limits.check_str_method(bound, __obj.__name__, args, kwargs)
                return limits._made(super().call(__context, __obj, *args, **kwargs), "a string")
        return super().call(__context, __obj, *args, **kwargs)

    def call_method(self, context: Any, obj: Any, name: str, args: tuple[Any, ...], extra: Any) -> Any:
        """``obj.name(*args)`` from a template: ``call(context, getattr(obj, name), *args)`` in one step."""
        kind = type(obj)
        if kind is str:
            method = _STR_METHODS.get(name)
            if method is not None and len(obj) <= limits.FAST_SIZE:
                # a short string, with no argument or one short one: nothing to pay for
                if not args:
                    return method(obj)
                if len(args) == 1 and args[0].__class__ is str and len(args[0]) <= 64:
                    return method(obj, args[0])
            if method is not None or name in limits.SIZED_STR_METHODS:
                return limits.call_str_method(getattr(obj, name), args, {})
        elif (kind is dict or kind is list) and name in self._safe[kind]:
            if name in _PRICED_METHODS:
                return _plain_method(getattr(obj, name), args, {})
            return getattr(obj, name)(*args)  # get, keys, items...: constant time
        return self.call(context, self.getattr(obj, name), *args, **(extra or {}))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """jinja2's sandboxed ``str.format``, with a formatter that checks every field it writes."""
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or value.__name__ not in _STR_FORMAT:
            return None
        f_self: Any = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type: type[str] = type(f_self)
        is_format_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            formatter: _SandboxedFormatter
            if isinstance(f_self, Markup):
                formatter = _SandboxedEscapeFormatter(self, escape=f_self.escape)
            else:
                formatter = _SandboxedFormatter(self)
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs = args[0]
                args = ()
            return str_type(formatter.vformat(f_self, args, kwargs))

        return update_wrapper(wrapper, value)


#: methods of plain values whose cost or result grows with the value or an argument
_PRICED_METHODS = frozenset({"copy", "count", "index", "fromkeys", "to_bytes"})


def _plain_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A vetted method of a dict, list, tuple or number (``get``, ``items``, ``count``...), paid for when large."""
    owner = method.__self__
    name = method.__name__
    if isinstance(owner, (list, tuple, dict)):
        if len(owner) > limits.FAST_SIZE and name in ("copy", "count", "index"):
            limits.active().spend(len(owner) >> 8)
        if name == "fromkeys" and args:
            args = (limits.counted_input(args[0], "dict.fromkeys()"), *args[1:])
            return limits.built(method(*args, **kwargs))
    elif name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        if isinstance(length, int):
            limits.check_size(length, "a bytes value")
    return method(*args, **kwargs)


#: str methods a template may call directly: every public one but format/format_map (which the sandbox wraps)
#: and those whose result can be much larger than the string (limits.call_str_method checks those)
_STR_METHODS = {
    name: getattr(str, name)
    for name in dir(str)
    if not name.startswith("_") and name not in _STR_FORMAT and name not in limits.SIZED_STR_METHODS
}


@jinja2.pass_context
def _counted(_context: Any, iterable: Any, weight: int = 1) -> Iterable[Any]:
    # pass_context keeps jinja2 from evaluating the loop at compile time
    return limits.counted(iterable, weight)


@jinja2.pass_context
def _spend(_context: Any, _value: Any, steps: int) -> str:
    limits.spend(steps)
    return ""


#: what Compiled.fast holds before the compiler has looked at the template
NOT_COMPILED: Any = object()

#: The one environment. Its globals are fixed and templates cannot change them, so sharing it is safe.
environment = ChatSandbox()


class Compiled:
    """A compiled template and what every render of it needs, computed once.

    ``fast`` is the compiled form :mod:`chatcodec.compiler` makes of it on the first render (None
    when it has none), kept here so that a render finds it without a lookup.
    """

    __slots__ = ("fast", "globals", "template")

    def __init__(self, template: jinja2.Template) -> None:
        self.template = template
        self.fast: Any = NOT_COMPILED
        # jinja2 keeps globals in a ChainMap and copies it on every render; ours never change, so flatten once
        self.globals = dict(template.globals)

    def new_context(self, variables: Mapping[str, Any]) -> Context:
        template = self.template
        return Context(environment, {**self.globals, **variables}, template.name, template.blocks, self.globals)


@lru_cache(maxsize=256)
def _compile(source: str) -> Compiled:
    return Compiled(environment.from_string(source))


def compile_template(source: str, name: str | None = None) -> Compiled:
    """Compile ``source`` once; later calls with the same text reuse the compiled template."""
    try:
        return _compile(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateSyntaxError(exc.message or str(exc), template_name=name, lineno=exc.lineno) from None
    except RecursionError:
        raise TemplateSyntaxError("The template nests too deeply to compile.", template_name=name) from None


# --- running a template -----------------------------------------------------------------------------


def run(compiled: Compiled, variables: Mapping[str, Any], *, name: str | None = None, budget: limits.Budget) -> str:
    """Render ``compiled`` with ``variables`` under ``budget``; every failure is a ChatcodecError."""
    token = limits.activate(budget)
    try:
        chunks = compiled.template.root_render_func(compiled.new_context(variables))
        if budget.spans is None:
            return _join_limited(chunks, budget)
        parts = []
        for chunk in chunks:  # {% generation %} spans are measured against what was emitted so far
            budget.emitted += len(chunk)
            if budget.emitted > budget.limits.max_output:
                budget.check_size(budget.emitted, "an output")
            parts.append(chunk)
        return "".join(parts)
    except ChatcodecError as exc:
        if isinstance(exc, TemplateError) and exc.lineno is None:
            exc.template_name, exc.lineno = name, _template_line(exc)
        raise
    except Exception as exc:  # every failure inside a template becomes a TemplateError
        raise _translate(exc, name) from exc
    finally:
        limits.deactivate(token)


def _join_limited(chunks: Iterator[str], budget: limits.Budget) -> str:
    limit = budget.limits.max_output
    size = 0
    parts = []
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            budget.check_size(size, "an output")
        parts.append(chunk)
    return "".join(parts)


def _template_line(exc: BaseException) -> int | None:
    """The template source line of the innermost template frame in ``exc``'s traceback."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        compiled = tb.tb_frame.f_globals.get("__jinja_template__")
        if compiled is not None:
            line = compiled.get_corresponding_lineno(tb.tb_lineno)
        tb = tb.tb_next
    return line


def _translate(exc: Exception, name: str | None) -> TemplateError:
    line = _template_line(exc)
    if isinstance(exc, _Raised):
        return TemplateRaisedError(str(exc), python_type="TemplateError", template_name=name, lineno=line)
    if isinstance(exc, SecurityError):
        return SandboxError(str(exc), template_name=name, lineno=line)
    if isinstance(exc, (RecursionError, MemoryError)):
        what = "recursed too deeply" if isinstance(exc, RecursionError) else "ran out of memory"
        return LimitError(f"The template {what}.", template_name=name, lineno=line)
    if isinstance(exc, OverflowError) and "MAX_RANGE" in str(exc):
        return LimitError(str(exc), template_name=name, lineno=line)
    return TemplateRuntimeError(str(exc), python_type=type(exc).__name__, template_name=name, lineno=line)
