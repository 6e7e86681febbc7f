"""Runaway templates: each one ends in a LimitError within the timeout plus 1 s, using under 2x max_memory.

Every template runs in a child process of its own, which reports how long the render took and how far
its resident memory rose above where it stood before the render (the peak, from the kernel's high-water
mark). The table covers every class of runaway the adversarial review found (issue 7) and more: loops
whose iterations are heavy, recursion through ``loop(...)`` and macros, single expensive built-ins,
values that repeat a shared part until printing them would fill memory, and memory kept across a loop.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import pytest

TIMEOUT = 2.0
MAX_MEMORY = 256 * 2**20

RUNAWAYS = {
    # --- time: loops and recursion ---------------------------------------------------------------------
    "billion-step loop": "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
    "{% endfor %}{% endfor %}{% endfor %}",
    "recursive loop, endless": "{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}",
    "recursive loop, exponential": "{% for x in [60] recursive %}{% if x %}{{ loop([x - 1, x - 1]) }}{% endif %}"
    "{% endfor %}",
    "recursive loop called through an alias": "{% for x in [40] recursive %}{% set again = loop %}"
    "{% if x %}{{ again([x - 1, x - 1]) }}{% endif %}{% endfor %}",
    "macro fork": "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "macro recursion without end": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "heavy iterations: upper of 15M": "{% for i in range(4000) %}{% set x = ('a' * 15000000).upper() %}{% endfor %}",
    "heavy iterations: upper of a kept 15M string": "{% set s = '\U0001f600' * 15000000 %}"
    "{% for i in range(4000) %}{% set x = s.upper() %}{% endfor %}",
    "heavy iterations: search in 15M": "{% set s = 'a' * 15000000 %}"
    "{% for i in range(100000) %}{% if 'ab' in s %}{% endif %}{% endfor %}",
    "heavy iterations: chained comparison": "{% set s = 'a' * 15000000 %}"
    "{% for i in range(100000) %}{% if 'ab' in s in s %}{% endif %}{% endfor %}",
    "heavy iterations: compare 15M strings": "{% set a = 'a' * 15000000 %}{% set b = 'a' * 15000000 %}"
    "{% for i in range(100000) %}{% if a == b %}{% endif %}{% endfor %}",
    "heavy iterations: slices of 15M": "{% set s = 'a' * 15000000 %}{% for i in range(100000) %}"
    "{% set t = s[1:] %}{% endfor %}",
    "heavy iterations: is lower": "{% set s = 'a' * 15000000 %}{% for i in range(100000) %}{% if s is lower %}"
    "{% endif %}{% endfor %}",
    "heavy iterations: trim filter": "{% set s = ' ' * 15000000 %}{% for i in range(100000) %}"
    "{% set t = s|trim %}{% endfor %}",
    "heavy iterations: list.count": "{% set l = [1] * 15000000 %}{% for i in range(100000) %}"
    "{% set n = l.count(2) %}{% endfor %}",
    "quadratic strip": "{{ ('a' * 4000000).strip('b' * 4000000 ~ 'a') }}",
    "string sums that triple": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
    "{% set ns.s = ns.s + '-' + ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    # --- time: single expensive built-ins --------------------------------------------------------------
    "sum of lists": "{{ ([[1]] * 1000000)|sum(start=[])|length }}",
    "power": "{{ 7 ** 17000000 }}",
    "repeated squaring": "{% set ns = namespace(x=7) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
    "{% endfor %}",
    "map over 15M items": "{{ ('a' * 15000000)|list|map('upper')|list|length }}",
    "select over 15M items": "{{ ('a' * 15000000)|list|select('lower')|list|length }}",
    "sort 15M items": "{{ ('ab' * 7500000)|list|sort|length }}",
    "unique 15M items": "{{ ('ab' * 7500000)|list|unique|list|length }}",
    "urlize": "{{ ('www.example.com ' * 1000000)|urlize }}",
    "wordwrap": "{{ ('word ' * 3000000)|wordwrap(5) }}",
    "title": "{{ ('word ' * 3000000)|title }}",
    "wordcount": "{{ ('a ' * 7000000)|wordcount }}",
    "pprint": "{{ ([{'a': [1, 2, 3]}] * 100000)|pprint }}",
    "urlencode": "{{ ('\u00e9' * 10000000)|urlencode }}",
    "map over a generator chain": "{{ range(100000)|map('string')|map('upper')|map('lower')|list|length }}"
    "{% for i in range(1000000) %}{{ range(100000)|map('string')|join }}{% endfor %}",
    # --- size: amplification checked before it allocates -----------------------------------------------
    "format filter width": "{{ '%1000000000s'|format('x') }}",
    "format method width": "{{ '{:>1000000000}'.format('x') }}",
    "nested format width as a string": "{{ '{:{}}'.format('x', '1000000000') }}",
    "format precision": "{{ '{:.1000000000f}'.format(1.5) }}",
    "format repeats a field": "{{ ('{0}' * 1000000).format('x' * 1000) }}",
    "percent repeats a key": "{{ ('%(a)s' * 1000000) % {'a': 'x' * 1000} }}",
    "tojson indent over deep nesting": "{% set ns = namespace(x=[]) %}{% for i in range(900) %}"
    "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|tojson(indent=100) }}",
    "tojson ensure_ascii": "{{ ('\U0001f600' * 15000000)|tojson(ensure_ascii=true) }}",
    "strftime_now long format": "{{ strftime_now('%c' * 5000000) }}",
    "strftime_now width": "{{ strftime_now('%1000000000Y') }}",
    "bytes center": "{{ 'x'.encode().center(1000000000) }}",
    "to_bytes": "{{ (1).to_bytes(1000000000, 'big') }}",
    "batch fill": "{{ [1]|batch(1000000, 'x' * 100000)|list|length }}",
    "lipsum": "{{ lipsum(10000000) }}",
    "lipsum with a negative max": "{{ lipsum(10000000, min=-2, max=-1) }}",
    "lipsum of empty paragraphs": "{{ lipsum(3000000, min=0, max=1) }}",
    "lipsum of long paragraphs": "{{ lipsum(2000, min=5000, max=5001) }}",
    "lipsum inside a loop": "{% for i in range(100000) %}{{ lipsum(100, min=-2, max=-1) }}{% endfor %}",
    "translate table that amplifies": "{{ ('a' * 100000).translate({97: 'b' * 100000}) }}",
    "translate a short string by a long value": "{{ 'aaaa'.translate({97: 'b' * 10000000}) }}",
    "translate by a maketrans table": "{{ ('a' * 10000).translate(''.maketrans({'a': 'b' * 10000})) }}",
    "translate by a list table": "{{ ('a' * 100000).translate(['c' * 10000] * 128) }}",
    "unicode_escape of 3M characters": "{{ ('\U0010ffff' * 3000000).encode('unicode_escape') }}",
    "encode with namereplace": "{{ ('\u00e9' * 1000000).encode('ascii', 'namereplace') }}",
    "encode with xmlcharrefreplace": "{{ ('\u00e9' * 5000000).encode('ascii', 'xmlcharrefreplace') }}",
    "decode with backslashreplace": "{{ ('\u00e9' * 5000000).encode('latin-1').decode('ascii', 'backslashreplace') }}",
    "split into 8M pieces": "{{ ('a,' * 8000000).split(',')|length }}",
    "split on whitespace": "{{ ('a ' * 8000000).split()|length }}",
    "splitlines of 15M lines": "{{ ('\n' * 15000000).splitlines()|length }}",
    # --- size: shared parts repeated until printing them would fill memory ------------------------------
    "doubling a list": "{% set ns = namespace(l=['x' * 1000]) %}{% for i in range(60) %}"
    "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l }}",
    "nested literal doubling": "{% set ns = namespace(a=['x' * 1000]) %}{% for i in range(60) %}"
    "{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}",
    "tuple doubling, then hashed": "{% set ns = namespace(t=(1,)) %}{% for i in range(80) %}"
    "{% set ns.t = (ns.t, ns.t) %}{% endfor %}{{ {ns.t: 1} }}",
    "repeat a list of a big string": "{{ ['x' * 1000000] * 1000 }}",
    "repeat a list of a medium string": "{{ ['x' * 4000] * 16000000 }}",
    "map returns a shared default": "{{ ([none] * 50000)|map('default', 'x' * 100000, true)|list }}",
    "dict.fromkeys shares a value": "{{ dict.fromkeys(range(50000), 'x' * 10000) }}",
    "namespace filled after it was repeated": "{% set ns = namespace(v='') %}{% set l = [ns] * 100000 %}"
    "{% set ns.v = 'x' * 100000 %}{{ l }}",
    # --- memory: kept across a loop --------------------------------------------------------------------
    "namespace keeps 100 strings of 60 MB": "{% set ns = namespace(l=[]) %}{% for i in range(100) %}"
    "{% set ns.l = ns.l + [('\U0001f600' * 15000000)[i:]] %}{% endfor %}",
    "namespace keeps 100 lists": "{% set ns = namespace(l=[]) %}{% for i in range(100) %}"
    "{% set ns.l = ns.l + [('a' * 10000000)|list] %}{% endfor %}",
    "macro recursion keeps slices": "{% macro f(s, n) %}{% if n %}{{ f(s[1:], n - 1) }}{% endif %}{% endmacro %}"
    "{{ f('\U0001f600' * 15000000, 90) }}",
    "recursive loop keeps slices": "{% for s in ['\U0001f600' * 15000000] recursive %}{{ loop([s[1:]]) }}{% endfor %}",
    "output bomb": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{{ 'y' * 15000000 }}",
    "namespace keeps many short strings": "{% set ns = namespace(l=[]) %}{% for i in range(10000000) %}"
    "{% set ns.l = ns.l + [('\U0001f600' * 1000) ~ i] %}{% endfor %}",
}

CHILD = r"""
import json, resource, sys, time
from chatcodec import ChatTemplate, ChatcodecError, Limits

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

def peak():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

source, timeout, max_memory = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
template = ChatTemplate(source, limits=Limits(timeout=timeout, max_memory=max_memory))
ChatTemplate("{{ messages[0].content }}").render([{"role": "user", "content": "warm up"}])
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak, so that it measures the render only
except OSError:
    pass
before = rss()
started = time.monotonic()
try:
    template.render([{"role": "user", "content": "hi"}])
    error = None
except ChatcodecError as exc:
    error = [type(exc).__name__, str(exc)]
except BaseException as exc:
    error = ["not a ChatcodecError: " + type(exc).__name__, str(exc)[:300]]
elapsed = time.monotonic() - started
print(json.dumps({"error": error, "elapsed": elapsed, "grown": peak() - before}))
"""


def run_child(source: str, timeout: float = TIMEOUT, max_memory: int = MAX_MEMORY) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, source, str(timeout), str(max_memory)],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )
    assert done.returncode == 0, f"the child process failed: {done.stderr[-2000:]}"
    return json.loads(done.stdout)  # type: ignore[no-any-return]


#: built-ins that are refused outright (a SandboxError), at any size: codecs that are quadratic (punycode, idna)
#: or not text codecs. Each must be refused as fast and as small as a runaway is stopped.
REFUSED = {
    "punycode of 20k distinct characters": "{% set s %}{% for i in range(256, 20256) %}{{ '%c' % i }}{% endfor %}"
    "{% endset %}{{ s.encode('punycode') }}",
    "punycode of a short string": "{{ 'b\u00fccher'.encode('punycode') }}",
    "idna of a long label": "{{ ('\u00e9' * 20000).encode('idna') }}",
    "utf-7": "{{ ('\u00e9' * 100).encode('utf-7') }}",
    "rot13": "{{ 'abc'.encode('rot13') }}",
    "hex codec": "{{ 'abc'.encode('hex') }}",
    "punycode decode of bytes": "{{ 'abc-xyz'.encode().decode('punycode') }}",
    "codec named by an alias": "{{ 'abc'.encode('PUNYCODE') }}",
}


@cache
def outcomes() -> dict[str, dict[str, Any]]:
    """Every runaway, rendered in child processes two at a time (the machine has two cores)."""
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(RUNAWAYS, pool.map(run_child, RUNAWAYS.values()), strict=True))


@cache
def refusals() -> dict[str, dict[str, Any]]:
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(REFUSED, pool.map(run_child, REFUSED.values()), strict=True))


@pytest.mark.parametrize("name", list(RUNAWAYS))
def test_runaway_template_ends_in_a_limit_error(name: str) -> None:
    outcome = outcomes()[name]
    assert outcome["error"] is not None, "the render finished"
    kind, message = outcome["error"]
    assert kind == "LimitError", f"{kind}: {message}"
    assert outcome["elapsed"] < TIMEOUT + 1, f"stopped after {outcome['elapsed']:.2f} s: {message}"
    grown = outcome["grown"]
    assert grown < 2 * MAX_MEMORY, f"memory grew by {grown / 2**20:.0f} MiB: {message}"


@pytest.mark.parametrize("name", list(REFUSED))
def test_costly_or_foreign_codecs_are_refused(name: str) -> None:
    outcome = refusals()[name]
    assert outcome["error"] is not None, "the render finished"
    kind, message = outcome["error"]
    assert kind == "SandboxError", f"{kind}: {message}"
    assert "codec" in message and "utf-8" in message, message
    assert outcome["elapsed"] < TIMEOUT + 1, f"stopped after {outcome['elapsed']:.2f} s: {message}"
    assert outcome["grown"] < 2 * MAX_MEMORY


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ 'h\u00e9llo'.encode('utf-8') }}", "b'h\\xc3\\xa9llo'"),
        ("{{ 'abc'.encode('utf-16-le') }}", "b'a\\x00b\\x00c\\x00'"),
        ("{{ 'h\u00e9'.encode('ascii', 'xmlcharrefreplace') }}", "b'h&#233;'"),
        ("{{ 'h\u00e9llo'.encode().decode('utf-8') }}", "h\u00e9llo"),
        ("{{ 'abc'.translate({97: 'xy'}) }}", "xybc"),
        ("{{ 'a,b,c'.split(',')|length }}", "3"),
        ("{{ lipsum(2, html=false, min=3, max=4).split('\n\n')|length }}", "2"),
    ],
)
def test_the_same_built_ins_at_ordinary_sizes_still_work(source: str, expected: str) -> None:
    from chatcodec import ChatTemplate

    assert ChatTemplate(source).render([{"role": "user", "content": "hi"}]) == expected
