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

import json
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from functools import lru_cache
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

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
    """The template's clock: the render's pinned ``now``, or local time as in transformers."""
    now = limits.active().now
    return (now if now is not None else datetime.now()).strftime(format)


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
    if _DEFAULT_JSON is not None and not ensure_ascii and indent is None and separators is None and not sort_keys:
        return "".join(_DEFAULT_JSON(x, 0))
    limits.check_json_layout(x, indent, separators)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class TemplateDict:
    """The ``dict`` global: builds dicts, and nothing else is reachable through it."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(Namespace):
    """``namespace()``, refusing underscore-prefixed attribute names as transformers does."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            if isinstance(name, str) and name.startswith("_"):
                _refuse_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            _refuse_name(name)
        Namespace.__setitem__(self, name, value)


def _refuse_name(name: str) -> None:
    raise SecurityError(
        f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
        "Please rename the attribute."
    )


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    limits.check_size(n * max * 12, "lorem ipsum text")
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
            budget.spans.append((budget.emitted, budget.emitted + len(text)))
        return text


# --- the fast, JSON-typed sandbox -------------------------------------------------------------------

_PLAIN_TYPES = frozenset({dict, list, str, int, float, bool, type(None), tuple})
_STR_FORMAT = frozenset({"format", "format_map"})
_DICT_ATTRIBUTES = frozenset(dir(dict))
_BuiltinMethod = types.BuiltinMethodType


def _safe_attributes(env: ImmutableSandboxedEnvironment) -> dict[type, frozenset[str]]:
    """For each plain type (and ``loop``), the public attributes the sandbox itself allows, asked once."""
    samples: list[Any] = [{}, [], "", 0, 0.0, False, None, (), LoopContext([], env.undefined)]
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


class _CodeGenerator(CodeGenerator):
    """jinja2's code generator, with lookups and amplifying operators as module-level calls."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        super().visit_Template(node, frame)
        # Rebound after jinja's own `from jinja2.runtime import ...` line; looked up at render time.
        self.writeline("Macro = environment.macro_class")
        for name in ("getattr", "getitem", "add", "mul", "power", "mod", "concat"):
            self.writeline(f"_cc_{name} = environment.fast_{name}")
        self.writeline("_cc_call_method = environment.call_method")

    @optimizeconst
    def visit_Getattr(self, node: nodes.Getattr, frame: Frame) -> None:
        self.write("_cc_getattr(")
        self.visit(node.node, frame)
        self.write(f", {node.attr!r})")

    @optimizeconst
    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        if isinstance(node.arg, nodes.Slice):
            super().visit_Getitem(node, frame)  # a slice of a value is the same kind of value
            return
        self.write("_cc_getitem(")
        self.visit(node.node, frame)
        self.write(", ")
        self.visit(node.arg, frame)
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
    """Macros (and ``caller``) count their nesting depth against the render's budget."""

    def _invoke(self, arguments: list[Any], autoescape: bool) -> str:
        budget = limits.enter_macro()
        try:
            return super()._invoke(arguments, autoescape)
        finally:
            budget.depth -= 1


class ChatSandbox(ImmutableSandboxedEnvironment):
    """The environment of :mod:`chatcodec.sandbox`; use :data:`environment`, do not build another."""

    code_generator_class = _CodeGenerator
    macro_class = _BudgetedMacro
    # Declared intercepted so that jinja2 never folds them at compile time (where no budget applies);
    # the code generator routes them to the checked functions in chatcodec.limits.
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    fast_add = staticmethod(limits.add)
    fast_mul = staticmethod(limits.mul)
    fast_power = staticmethod(limits.power)
    fast_mod = staticmethod(limits.mod)
    fast_concat = staticmethod(limits.concat)

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[GenerationExtension, jinja2.ext.loopcontrols],
        )
        self.filters["tojson"] = tojson
        limits.guard_filters(self.filters)
        self.filters["_cc_counted"] = _counted
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
        # Every loop spends one step per item, so a runaway loop meets the time limit.
        for loop in list(tree.find_all(nodes.For)):
            loop.iter = nodes.Filter(loop.iter, "_cc_counted", [], [], None, None, lineno=loop.lineno)
        return tree

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            # what jinja2 does after `getattr(dict, name)` fails, without raising AttributeError first
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if kind is TemplateNamespace and not attribute.startswith("_"):
            attrs = object.__getattribute__(obj, "_Namespace__attrs")
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
                return __obj(*args, **kwargs)
        elif (
            kind is _BudgetedMacro
            or id(__obj) in __self._trusted
            or (kind is types.MethodType and type(__obj.__self__) is LoopContext)
        ):
            kwargs.pop("_loop_vars", None)
            kwargs.pop("_block_vars", None)
            return __obj(*args, **kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def call_method(self, context: Any, obj: Any, name: str, args: tuple[Any, ...], extra: Any) -> Any:
        """``obj.name(*args)`` from a template: ``call(context, getattr(obj, name), *args)`` in one step."""
        kind = type(obj)
        if kind is str:
            method = _STR_METHODS.get(name)
            if method is not None:
                return method(obj, *args)
            if name in limits.SIZED_STR_METHODS:
                return limits.call_str_method(getattr(obj, name), args, {})
        elif (kind is dict or kind is list) and name in self._safe[kind]:
            return getattr(obj, name)(*args)
        return self.call(context, self.getattr(obj, name), *args, **(extra or {}))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        return None if wrapped is None else limits.guard_format(wrapped, value.__self__)


#: str methods a template may call directly: every public one but format/format_map (which the sandbox wraps)
#: and those whose result can be much larger than the string (limits.call_str_method checks those)
_STR_METHODS = {
    name: getattr(str, name)
    for name in dir(str)
    if not name.startswith("_") and name not in _STR_FORMAT and name not in limits.SIZED_STR_METHODS
}


@jinja2.pass_context
def _counted(_context: Any, iterable: Any) -> Iterable[Any]:
    # pass_context keeps jinja2 from evaluating the loop at compile time
    return limits.counted(iterable)


#: The one environment. Its globals are fixed and templates cannot change them, so sharing it is safe.
environment = ChatSandbox()


class Compiled:
    """A compiled template and what every render of it needs, computed once."""

    __slots__ = ("globals", "template")

    def __init__(self, template: jinja2.Template) -> None:
        self.template = template
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
