"""The template compiler: the same output as the generic (jinja2) path, faster, with the same guarantees.

The goldens and the differential tests already run with the compiler on (it is the default path). Here
every corpus template renders every corpus conversation through both paths, with the compiled path
on its own (no fallback), and the outputs, or the errors, must be the same.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from chatcodec import (
    ChatcodecError,
    ChatTemplate,
    LimitError,
    Limits,
    TemplateRaisedError,
    TemplateRuntimeError,
    compiler,
    limits,
    sandbox,
)

from .conftest import CORPUS, GOLDEN_NOW, conversations, manifest, require_shared, template_source

NAMES = sorted(manifest()) if CORPUS.is_dir() else []
USER = [{"role": "user", "content": "hi"}]


def variables_of(template: ChatTemplate, messages: Any, **options: Any) -> dict[str, Any] | None:
    """The variables a render hands to the template (None when preprocessing already refuses the input)."""
    seen: list[Mapping[str, Any]] = []
    fast = compiler.fast_template(template.source)
    assert fast is not None
    original = fast.root

    def spy(*given: Any) -> str:
        seen.append(compiler.variables_of(given[:6]))  # type: ignore[arg-type]
        return original(*given)  # type: ignore[no-any-return]

    fast.root = spy
    try:
        template.render(messages, now=GOLDEN_NOW, **options)
    except ChatcodecError:
        pass
    finally:
        fast.root = original
    return seen[0] if seen else None


def both_paths(source: str, variables: Mapping[str, Any]) -> tuple[Any, Any]:
    """(compiled, generic): each an output or ("error", type, message); the compiled one without fallback."""
    fast = compiler.fast_template(source)
    assert fast is not None, "the template did not compile"
    outcomes = []
    for path in ("compiled", "generic"):
        budget = limits.Budget(Limits(), now=GOLDEN_NOW)
        try:
            if path == "compiled":
                outcomes.append(fast.render(variables, budget))
            else:
                outcomes.append(sandbox.run(sandbox.compile_template(source), variables, budget=budget))
        except ChatcodecError as exc:
            outcomes.append(("error", type(exc).__name__, exc.message))
        except Exception as exc:  # the compiled path raises Python's own errors: the generic one words them
            outcomes.append(("error", type(exc).__name__, str(exc)))
    return outcomes[0], outcomes[1]


@pytest.mark.parametrize("name", NAMES)
def test_every_corpus_template_compiles_and_renders_the_same(name: str) -> None:
    require_shared()
    entry = manifest()[name]
    source = template_source(name)
    template = ChatTemplate(source, special_tokens=entry["special_tokens"], name=name)
    compared = 0
    for conversation in conversations().values():
        for options in conversation["option_sets"]:
            messages = copy.deepcopy(conversation["messages"])
            variables = variables_of(template, messages, tools=conversation["tools"], **options)
            if variables is None:
                continue
            compiled, generic = both_paths(source, variables)
            if isinstance(generic, str):
                assert compiled == generic, f"{conversation['id']} {options}"
                compared += 1
            else:
                # the generic path fails: the compiled one must too (the public render then falls back to
                # the generic path, which words the error exactly as transformers does)
                assert not isinstance(compiled, str), f"{conversation['id']} {options}: compiled path rendered"
    assert compared >= 9  # every template renders at least nine of the corpus cases


CONSTRUCTS = {
    "loop counters": "{% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}"
    "{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}",
    "loop counters with a filter": "{% for x in xs if x != 'b' %}{{ loop.index }}{{ x }}{{ loop.last }}{% endfor %}",
    "loop over a dict and a string": "{% for k in d %}{{ k }}{{ loop.index }}{% endfor %}"
    "{% for c in 'abc' %}{{ c }}{{ loop.revindex }}{% endfor %}",
    "loop else and break": "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"
    "{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "loop object passed on": "{% for x in xs %}{{ loop.cycle('odd', 'even') }}{{ loop }}{% endfor %}",
    "a counted loop, then one that needs its loop object": "{% for x in xs %}{{ loop.index }}{% endfor %}"
    "{% for x in xs %}{{ loop.first }}{{ loop.cycle('a', 'b') }}{% endfor %}"
    "{% for x in xs %}{{ loop.last }}{% endfor %}",
    "loop object in a call block": "{% macro m() %}{{ caller() }}{% endmacro %}{% for x in xs %}{% if not loop.first %}"
    "{% call m() %}{{ loop.index }}{% endcall %}{% endif %}{% endfor %}",
    "nested loops": "{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}",
    "scoping": "{% set a = 1 %}{% for x in xs %}{{ a }}{% set a = 2 %}{{ a }}{% endfor %}{{ a }}"
    "{% for x in xs %}{% if loop.first %}{% set b = 3 %}{% endif %}{{ b }}{% endfor %}",
    "namespaces": "{% set ns = namespace(n=0, l=[]) %}{% for x in xs %}{% set ns.n = ns.n + 1 %}"
    "{% set ns.l = ns.l + [x] %}{% endfor %}{{ ns.n }}{{ ns.l }}{{ ns }}{{ ns.missing is defined }}",
    "macros": "{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{{ varargs }}{% endmacro %}"
    "{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m(1, 2, 3, 4) }}",
    "macro with caller": "{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}in{% endcall %}",
    "recursive macro": "{% macro f(n) %}{{ n }}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
    "set blocks and filter blocks": "{% set x %}a{{ 1 + 1 }}b{% endset %}{{ x }}{% filter upper %}up{% endfilter %}",
    "attributes and items": "{{ d.k }}{{ d['k'] }}{{ d.missing }}{{ d.items()|list }}{{ xs[0] }}{{ xs[-1] }}"
    "{{ xs[1:] }}{{ d[key] }}{{ d.get('k') }}{{ d.get('z', 'dz') }}",
    "string methods and filters": "{{ s.strip() }}{{ s.split(',') }}{{ s|trim }}{{ s|upper }}{{ s|length }}"
    "{{ s|string }}{{ 5|string }}{{ s.replace(',', ';') }}{{ s.startswith(' a') }}",
    "tests": "{{ d is mapping }}{{ xs is iterable }}{{ xs is sequence }}{{ 1 is number }}{{ none is none }}"
    "{{ s is string }}{{ d.z is defined }}{{ d.k is undefined }}{{ true is true }}",
    "arithmetic and comparisons": "{{ 7 % 3 }}{{ '%s-%s' % (1, 2) }}{{ 1 + 2 }}{{ 'a' + s + 'b' }}{{ 2 * 3 }}"
    "{{ 2 ** 3 }}{{ 'x' ~ 1 ~ none }}{{ xs == xs }}{{ 1 < 2 < 3 }}{{ 'a' in s }}{{ 'k' in d }}{{ 3 in xs }}",
    "markup stays markup": "{{ ('<b>'|safe) + '<i>' }}{{ '<' ~ ('<b>'|safe) }}{{ '<b>'|e }}",
    "undefined": "{{ nothing }}{{ nothing is defined }}{{ d.nothing|default('dflt') }}{{ nothing|length }}",
    "selectattr and rejectattr": "{{ ds|selectattr('role', 'equalto', 'user')|list }}"
    "{{ ds|rejectattr('role', 'defined')|list }}{{ ds|selectattr('role')|list }}"
    "{{ ds|selectattr('items', 'defined')|list|length }}{{ none|selectattr('x', 'none')|list }}",
    "globals": "{{ range(3)|list }}{{ dict(a=1) }}{{ strftime_now('%Y') }}{{ lipsum(1)|length > 0 }}",
    "kept lookups": "{% for m in ds %}{{ m.role }}{{ m['role'] }}{{ m.role is defined }}{{ m.x }}{% endfor %}"
    "{{ ds[0].role }}{{ ds[0]['role'] }}{{ ds[-1] }}{{ ds[-1] }}{% set ds = xs %}{{ ds[0] }}{{ ds[0] }}",
    "a loop item assigned in its loop": "{% for m in ds %}{{ m.role }}{% set m = {'role': 'r'} %}{{ m.role }}"
    "{% endfor %}",
    "a macro parameter assigned in its macro": "{% macro f(m) %}{{ m.k }}{% set m = {'k': 2} %}{{ m.k }}{% endmacro %}"
    "{{ f(d) }}{{ f(d) }}",
    "a loop item and a namespace": "{% set ns = namespace(k='n') %}{% for m in [d, ns] %}{{ m.k }}{{ m.k }}"
    "{% endfor %}",
    "keys read for their truth": "{% for m in ds %}{% if m.role %}1{% elif not m.x %}2{% endif %}"
    "{% if m.role and m.x or m.items %}3{% endif %}{{ 'a' if m.role else 'b' }}{% endfor %}"
    "{% for m in ds if m.role %}{{ loop.index }}{% endfor %}",
    "defaults and defined keys": "{% for m in ds %}{{ m.role|default('-') }}{{ m.x|default(none) }}"
    "{{ m.role is defined }}{{ m['x'] is undefined }}{% endfor %}"
    "{{ {'u': nothing}.u|default('u') }}{{ {'u': nothing}.u is defined }}",
    "output runs": "[{{ s }}|{{ 'a' + s + 'b' }}|{{ s ~ 1 }}{{ xs }}{{ none }}{{ d.k + d.k }}]{{ '{x}' + s }}",
    "adding names": "{% set t = s %}{% set t = t + s %}{{ t }}{{ xs + xs }}{{ t + 1 if false else t }}",
    "list items by index": "{% for x in xs %}{{ xs[loop.index0 - 1] }}{{ xs[loop.index0 + 5] }}{% endfor %}"
    "{{ xs[true] }}",
    "namespace calls": "{% set ns = namespace(a=1, b=xs) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}{{ ns.b }}{{ ns }}"
    "{% set namespace = dict %}{{ namespace(c=2) }}",
    "macros called by name": "{% macro f(a, b=2) %}{{ a }}{{ b }}{% if a < 3 %}{{ f(a + 1, b=b) }}{% endif %}"
    "{% endmacro %}{{ f(1) }}{{ f(a=5) }}{{ f(b=0, a=4) }}{% macro g(x) %}<{{ f(x) }}>{% endmacro %}{{ g(2) }}",
    "names set in a block": "{% for x in xs %}{% set c = x ~ '!' %}{{ c }}{% if loop.first %}{% for y in xs %}"
    "{% set c = y %}{% endfor %}{% endif %}{% endfor %}{% for x in xs %}({{ c }}){% set c = x %}{{ c }}{% endfor %}"
    "{% if xs %}{% set top = 1 %}{% endif %}{{ top }}{% set top = top ~ 2 %}{{ top }}"
    "{% macro f() %}<{{ v }}>{% set v = 2 %}{{ v }}{% endmacro %}{{ f() }}",
    "tojson": "{{ d|tojson }}{{ xs|tojson(indent=2) }}{{ ds|tojson(indent='\t', sort_keys=true) }}{{ s|tojson }}",
}
VARIABLES = {
    "xs": ["a", "b", "c"],
    "d": {"k": "v", "n": 1},
    "s": " a,b ",
    "key": "k",
    "ds": [{"role": "user"}, {"role": "system", "x": None}, {}, "text"],
}


@pytest.mark.parametrize("name", list(CONSTRUCTS))
def test_constructs_render_the_same_on_both_paths(name: str) -> None:
    compiled, generic = both_paths(CONSTRUCTS[name], VARIABLES)
    assert isinstance(generic, str), generic  # every construct renders
    assert compiled == generic


MESSAGE_LOOPS = {
    "the messages": "{% for m in messages %}{{ m.role }}{{ m['content'] }}{{ m.missing }}{{ m.role }}"
    "{% for x in [1] %}{{ m.content }}{% endfor %}{% endfor %}",
    "a slice kept under a name": "{% set rest = messages[1:] %}{% set more = rest %}{% for m in more %}{{ m.role }}"
    "{{ m.name is defined }}{% endfor %}",
    "messages bound to other values": "{% set messages = ['a role', 5] %}{% for m in messages %}"
    "{{ m.count|string|length > 0 }}"
    "{{ m['role'] }}{% endfor %}",
    "a name that may come from the variables": "{% if false %}{% set lm = messages %}{% endif %}"
    "{% for m in lm %}{{ m.index|string|length > 0 }}{{ m['count']|string|length > 0 }}{% endfor %}",
    "a name set to a message": "{% set lm = messages[0] %}{% for k in lm %}{{ k }}{% endfor %}",
}


@pytest.mark.parametrize("name", list(MESSAGE_LOOPS))
def test_loops_over_the_messages_render_the_same_on_both_paths(name: str) -> None:
    """Items of a loop over the messages are read as dicts with no type check: only where every value of the
    loop's list is the render's messages (dicts) or a slice of them; elsewhere a str item reads `.count`."""
    variables = {**VARIABLES, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    variables["lm"] = ["role text", "index"]
    compiled, generic = both_paths(MESSAGE_LOOPS[name], variables)
    assert isinstance(generic, str), generic
    assert compiled == generic


def test_what_the_compiler_leaves_alone_takes_the_generic_path() -> None:
    recursive = (
        "{% for x in [[1, [2]]] recursive %}{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}{% endfor %}"
    )
    assert compiler.fast_template(recursive) is None
    assert ChatTemplate(recursive).render(USER) == "12"
    autoescaped = "{% autoescape true %}{{ '<' }}{% endautoescape %}"
    assert compiler.fast_template(autoescaped) is None
    assert ChatTemplate(autoescaped).render(USER) == "&lt;"


def test_errors_are_jinja2s_own() -> None:
    """A compiled render that fails is rendered again on the generic path, which words the error."""
    with pytest.raises(TemplateRuntimeError, match="'dict object' has no attribute 'x'") as failed:
        ChatTemplate("\n{{ messages[0].x.y }}").render(USER)
    assert failed.value.lineno == 2
    with pytest.raises(TemplateRaisedError) as raised:
        ChatTemplate("{% if messages %}{{ raise_exception('no') }}{% endif %}").render(USER)
    assert raised.value.message == "no"
    with pytest.raises(TemplateRuntimeError, match="can only concatenate str"):
        ChatTemplate("{{ 'a' + 1 + undefined_thing.x }}").render(USER)


def test_limits_hold_on_the_compiled_path() -> None:
    """The compiled path pays the same budget (tests/test_runaway.py runs every runaway through it)."""
    assert compiler.fast_template("{% for i in range(10) %}{{ i }}{% endfor %}") is not None
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}"
    with pytest.raises(LimitError, match=r"longer than 0\.2 s") as stopped:
        ChatTemplate("\n" + loop, limits=Limits(timeout=0.2)).render(USER)
    assert stopped.value.lineno == 2
    with pytest.raises(LimitError, match="an output"):
        ChatTemplate(
            "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", limits=Limits(max_output=10**6)
        ).render(USER)


def test_the_compiled_form_is_cached_per_source() -> None:
    source = "{{ messages[0].content }} cached"
    assert compiler.fast_template(source) is compiler.fast_template(source[:-6] + "cached")
    assert "def root" in compiler.fast_template(source).source  # type: ignore[union-attr]


def test_a_render_the_compiled_path_gives_up_on_is_rendered_again_in_full() -> None:
    """An unhashable key fails a dict lookup on the compiled path; jinja2 gives an undefined there instead."""
    source = "{% set k = [1] %}{% for i in range(300) %}{{ 'x' * 1000 }}{% endfor %}[{{ {'a': 1}[k] }}]"
    assert not isinstance(both_paths(source, {})[0], str)
    text = ChatTemplate(source, limits=Limits(max_output=310_000)).render(USER)
    assert text == "x" * 300_000 + "[]"
