"""Templates are untrusted code: no way out of the sandbox, and no way to run forever or fill memory."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from chatcodec import ChatcodecError, ChatTemplate, LimitError, Limits
from chatcodec.sandbox import environment

USER = [{"role": "user", "content": "hi"}]

# Payloads of the server-side template injections behind CVE-2024-34359 (llama-cpp-python), CVE-2026-5760
# (SGLang) and GHSA-46cm-pfwv-cgf8 (LiteLLM), and the jinja2 sandbox escapes fixed in 3.1.5/3.1.6
# (CVE-2024-56326 str.format, CVE-2025-27516 |attr to format). Each tries to run `touch MARKER`.
PAYLOADS = [
    "{{ self.__init__.__globals__.__builtins__.__import__('os').system('touch MARKER') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__()[0].__init__.__globals__['os'].system('touch MARKER') }}",
    "{{ lipsum.__globals__['os'].system('touch MARKER') }}",
    "{{ lipsum.__globals__.os.popen('touch MARKER').read() }}",
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ joiner.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ namespace.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ raise_exception.__globals__['os'].system('touch MARKER') }}",
    "{{ strftime_now.__globals__['os'].system('touch MARKER') }}",
    "{{ dict.__class__.__init__.__globals__['os'].system('touch MARKER') }}",
    "{{ messages.__class__.__base__.__subclasses__()[0]('touch MARKER') }}",
    "{{ messages[0].__class__.__base__.__subclasses__() }}{{ x() }}",
    "{{ ('{0.__class__.__base__.__subclasses__}'.format)(messages) }}",
    "{{ '{0.__init__.__globals__[os]}'.format(self) }}",
    "{{ ('{0.__init__.__globals__}'|attr('format'))(lipsum) }}",
    "{% set f = '{0.__init__.__globals__}'|attr('format') %}{{ f(lipsum) }}",
    "{{ (messages|attr('__class__')).__subclasses__() }}",
    "{{ range.__self__.__import__('os').system('touch MARKER') }}",
    "{{ tojson.__globals__.os.system('touch MARKER') }}",
    "{{ (messages|map(attribute='__class__')|first).__init__.__globals__ }}{{ x() }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c('touch MARKER') }}{% endfor %}",
    "{{ cycler('a').__class__.__init__.__globals__.os.system('touch MARKER') }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "{{ messages.pop() }}",
    "{{ messages[0].clear() }}",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_injection_payloads_end_in_a_chatcodec_error(payload: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    template = ChatTemplate(payload.replace("MARKER", str(marker)), name="payload")
    with pytest.raises(ChatcodecError):
        template.render(USER)
    assert not marker.exists()


@pytest.mark.parametrize(
    "probe",
    ["{{ messages.__class__ }}", "{{ ''.__class__ }}", "{{ lipsum.__globals__ }}", "{{ self.__dict__ }}"],
)
def test_reading_internals_yields_nothing(probe: str) -> None:
    """As in transformers, an unsafe attribute prints as an empty string; using it raises (above)."""
    assert ChatTemplate(probe).render(USER) == ""


def test_a_billion_step_loop_stops_at_the_time_limit() -> None:
    loop = (
        "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
        "{% endfor %}{% endfor %}{% endfor %}done"
    )
    template = ChatTemplate(loop, limits=Limits(timeout=0.5))
    started = time.monotonic()
    with pytest.raises(LimitError, match=r"longer than 0\.5 s"):
        template.render(USER)
    elapsed = time.monotonic() - started
    assert elapsed < 0.5 + 1.5, f"stopped only after {elapsed:.2f}s"


def test_runaway_macro_calls_without_loops_stop_too() -> None:
    """Exponential recursion stays under the depth limit; the time limit still catches it."""
    fork = "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}"
    with pytest.raises(LimitError, match="longer than"):
        ChatTemplate(fork, limits=Limits(timeout=0.3)).render(USER)


def test_recursion_limit() -> None:
    endless = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
    with pytest.raises(LimitError, match="nested more than 20"):
        ChatTemplate(endless, limits=Limits(max_depth=20)).render(USER)
    with pytest.raises(LimitError):
        ChatTemplate(endless, limits=Limits(max_depth=100_000)).render(USER)  # Python's own limit, reported


OUTPUT_BOMBS = {
    "repeat": "{{ 'a' * 1000000000 }}",
    "repeat a list": "{{ ([1] * 1000000000)|length }}",
    "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s+ns.s %}{% endfor %}",
    "recursive doubling": "{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ f('x', 80) }}",
    "power": "{{ 10 ** 1000000000 }}",
    "percent width": "{{ '%1000000000s' % 'x' }}",
    "percent star width": "{{ '%*s' % (1000000000, 'x') }}",
    "format width": "{{ '{:>1000000000}'.format('x') }}",
    "nested format width": "{{ '{:>{}}'.format('x', 1000000000) }}",
    "ljust": "{{ 'x'.ljust(1000000000) }}",
    "center filter": "{{ 'x'|center(1000000000) }}",
    "indent filter": "{{ ('a\n' * 1000)|indent(1000000) }}",
    "replace filter": "{{ ('a' * 10000)|replace('a', 'b' * 100000) }}",
    "replace method": "{{ ('a' * 10000).replace('', 'b' * 100000) }}",
    "join": "{{ range(100000)|map('string')|join('x' * 1000) }}",
    "join method": "{{ ('x' * 10000).join(range(100000)|map('string')) }}",
    "expandtabs": "{{ ('\t' * 100000).expandtabs(100000) }}",
    "batch": "{{ [1]|batch(1000000000, 'x')|list|length }}",
    "tojson indent": "{{ (range(1000)|list)|tojson(indent=100000) }}",
    "tojson indent, nested": "{% set ns = namespace(x=[1]) %}{% for i in range(300) %}"
    "{% set ns.x = [ns.x, 1] %}{% endfor %}{{ ns.x|tojson(indent=1000) }}",
    "lipsum": "{{ lipsum(10000000) }}",
    "long output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "long parts made in a loop": "{% set s = 'x' * 500000 %}{% for i in range(100000) %}{{ s ~ 'y' }}{{ '<' + s }}"
    "{% endfor %}",
}


@pytest.mark.parametrize("name", list(OUTPUT_BOMBS))
def test_output_bombs_stop_before_they_allocate(name: str) -> None:
    limits = Limits(max_output=5_000_000, timeout=10)
    template = ChatTemplate(OUTPUT_BOMBS[name], limits=limits)
    tracemalloc.start()
    try:
        with pytest.raises(LimitError):
            template.render(USER)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # at most a few strings of max_output characters (4 bytes each at worst) ever existed
    assert peak < 64 * 2**20, f"the render allocated up to {peak // 2**20} MiB"


def test_the_process_stays_healthy_after_every_limit() -> None:
    for source in OUTPUT_BOMBS.values():
        with pytest.raises(LimitError):
            ChatTemplate(source, limits=Limits(max_output=1_000_000)).render(USER)
    assert ChatTemplate("{{ messages[0].content }}!").render(USER) == "hi!"


def test_limits_allow_what_they_should() -> None:
    """A limit is not a ban: big but legitimate outputs pass when the caller raises it."""
    template = ChatTemplate("{{ 'a' * 2000000 }}", limits=Limits(max_output=3_000_000))
    assert len(template.render(USER)) == 2_000_000
    with pytest.raises(LimitError, match="over the 1,000,000 allowed"):
        ChatTemplate("{{ 'a' * 2000000 }}", limits=Limits(max_output=1_000_000)).render(USER)


def test_constant_expressions_are_not_folded_at_compile_time() -> None:
    """jinja2 folds constants while compiling, where no budget applies; the amplifying ones must wait."""
    started = time.monotonic()
    template = ChatTemplate("{{ 'a' * 1000000000 }}")
    assert time.monotonic() - started < 1
    with pytest.raises(LimitError):
        template.render(USER)


def test_the_environment_matches_transformers_configuration() -> None:
    assert environment.trim_blocks and environment.lstrip_blocks
    assert not environment.keep_trailing_newline and not environment.autoescape
    assert {"raise_exception", "strftime_now", "namespace", "dict", "range", "lipsum", "cycler", "joiner"} <= set(
        environment.globals
    )


def test_indented_json_is_json_dumps() -> None:
    """tojson with an indent writes plain JSON itself (faster than json.dumps' Python encoder): the same text."""
    import json
    import random

    from chatcodec import sandbox

    rng = random.Random(7)
    leaves = ["a", 'é\n"x\u2028', "", "\ud800", 0, -5, 2.5, 1e300, float("nan"), float("inf"), -0.0, True, False, None]

    def value(depth: int = 0) -> object:
        roll = rng.random()
        if depth > 4 or roll < 0.4:
            return rng.choice(leaves)
        if roll < 0.7:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {
            rng.choice(["k", "b", "a", "é", "z z", "<"]) + str(rng.randint(0, 3)): value(depth + 1) for _ in range(4)
        }

    for _ in range(2000):
        data = value()
        for indent in (4, 0, "\t"):
            for ensure_ascii in (False, True):
                for sort_keys in (False, True):
                    layout = indent if isinstance(indent, str) else " " * indent
                    expected = json.dumps(data, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)
                    assert sandbox._indented_json(data, layout, ensure_ascii, sort_keys, 10**9) == expected
    # what it leaves to json.dumps: keys that are not strings, tuples, objects
    assert sandbox._indented_json({1: "a"}, " ", False, False, 10**9) is None
    assert sandbox._indented_json([(1,)], " ", False, False, 10**9) is None
    assert ChatTemplate("{{ {1: (2, 3)}|tojson(indent=1) }}").render(USER) == '{\n "1": [\n  2,\n  3\n ]\n}'
