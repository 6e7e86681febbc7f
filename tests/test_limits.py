"""The budget's mechanics: what pays, what is measured, and the isolated worker process."""

from __future__ import annotations

import contextvars
import os
import signal
import sys
import threading
from datetime import datetime
from typing import Any

import pytest

from chatcodec import ChatTemplate, InputError, LimitError, Limits, TemplateRaisedError, TemplateRuntimeError, sandbox
from chatcodec import limits as budgets

USER = [{"role": "user", "content": "hi"}]


def render(source: str, **limits: Any) -> str:
    return ChatTemplate(source, limits=Limits(**limits)).render(USER)


@pytest.mark.parametrize(
    "options",
    [{"timeout": 0}, {"timeout": -1.0}, {"timeout": float("nan")}, {"timeout": "5"}, {"max_output": 0},
     {"max_memory": 1.5}, {"max_depth": True}, {"isolate": "yes"}],
)  # fmt: skip
def test_bad_limits_are_an_input_error(options: dict[str, Any]) -> None:
    with pytest.raises(InputError, match="Limits"):
        Limits(**options)


def test_expanded_size_counts_shared_parts_as_often_as_they_occur() -> None:
    inner = ["x" * 100]
    assert budgets.expanded_size(inner, 10**6) == 4 + 4 + 100
    twice = [inner, inner]
    assert budgets.expanded_size(twice, 10**6) == 4 + 2 * (4 + 104)
    doubling: Any = ["x"]
    for _ in range(200):  # 2**200 references: measured once per distinct list, and stopped at the limit
        doubling = [doubling, doubling]
    assert budgets.expanded_size(doubling, 10**6) > 10**6


def test_expanded_size_calls_a_container_that_holds_itself_endless() -> None:
    ns = sandbox.TemplateNamespace()
    ns["me"] = [ns]
    assert budgets.expanded_size([ns], 10**6) > 10**6


def test_a_namespace_that_holds_itself_still_prints() -> None:
    """A namespace pointing at itself is not amplification: printing it shows `...`, as transformers does."""
    out = render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns.a }}")
    assert out == "1"


def test_literals_holding_plain_values_are_not_measured() -> None:
    calls = []
    original = budgets.check_expanded

    def spy(value: Any, what: str) -> Any:
        calls.append(value)
        return original(value, what)

    budgets.check_expanded = spy  # type: ignore[assignment]
    try:
        assert render("{{ ['a', 1, none, [], {}]|length }}{{ {'k': 'v'}|length }}") == "51"
        assert calls == []
        assert render("{% set l = [[1], [2]] %}{{ [l, l]|length }}") == "2"
        assert len(calls) == 1  # only the literal holding non-empty lists: [[1], [2]] is a constant
    finally:
        budgets.check_expanded = original  # type: ignore[assignment]


def test_sum_of_lists_is_built_in_one_pass_with_the_same_result() -> None:
    assert render("{{ [[1], [2, 3], []]|sum(start=[]) }}") == "[1, 2, 3]"
    assert render("{{ [(1,), (2,)]|sum(start=()) }}") == "(1, 2)"
    assert render("{{ [{'a': [1]}, {'a': [2]}]|sum(attribute='a', start=[0]) }}") == "[0, 1, 2]"
    with pytest.raises(TemplateRuntimeError, match='can only concatenate list \\(not "tuple"\\) to list'):
        render("{{ [[1], (2,)]|sum(start=[]) }}")


def test_long_straight_templates_get_checkpoints() -> None:
    """A template run once, with no loop, still reads the clock every ~1024 steps."""
    long = "{% set x = y ~ 'a' %}" * 5000  # 10,000 steps: no loop, so no step is paid without checkpoints
    code = sandbox.environment.compile(long, raw=True)
    assert "_cc_spend" in code
    budget = budgets.Budget(Limits(timeout=1e-9))
    with pytest.raises(LimitError, match="longer than"):
        sandbox.run(sandbox.compile_template(long), {}, budget=budget)
    assert "_cc_spend" not in sandbox.environment.compile("{% set x = y ~ 'a' %}" * 100, raw=True)


def test_a_loop_reads_the_clock_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long loop over a list is paid for as it goes, so the clock is read during it, not only before."""
    ticks = []
    original = budgets.Budget.tick
    monkeypatch.setattr(budgets.Budget, "tick", lambda self: (ticks.append(self.steps), original(self)))
    template = sandbox.compile_template("{% for x in items %}{{ x }}{% endfor %}")
    sandbox.run(template, {"items": list(range(50000))}, budget=budgets.Budget(Limits()))
    assert len(ticks) >= 50000 // budgets.STEP_CHUNK - 1
    ticks.clear()
    heavy = sandbox.compile_template("{% for x in items %}{{ (x ~ 'a')|upper|lower|trim|length }}{% endfor %}")
    sandbox.run(heavy, {"items": list(range(50000))}, budget=budgets.Budget(Limits()))
    assert len(ticks) >= 5 * 50000 // budgets.STEP_CHUNK - 1  # five operations per item weigh five steps


def test_renders_in_threads_sharing_a_context_each_use_their_own_budget() -> None:
    # Each render's budget carries its clock (what strftime_now reads). Threads that run copies of one
    # context (as tools' calls do) render at once, switching threads as often as Python can: a render
    # that found another thread's budget active would write that thread's year.
    template = ChatTemplate("{% for m in messages %}{{ strftime_now('%Y') }}{% endfor %}")
    chat = USER * 50
    assert template.render(chat, now=datetime(1999, 1, 1)) == "1999" * 50  # this thread's record exists now
    context = contextvars.copy_context()
    wrong: list[str] = []

    def renders(year: int) -> None:
        for _ in range(200):
            text = template.render(chat, now=datetime(year, 1, 1))
            if text != str(year) * 50:
                wrong.append(text)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=context.copy().run, args=(renders, year)) for year in (2001, 2002)]
        threads.append(threading.Thread(target=context.run, args=(renders, 2003)))
        for thread in threads:
            thread.start()
        renders(2004)
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not wrong
    assert budgets.current().budget is None  # nothing left active here after the renders


def test_str_methods_refuse_what_would_explode() -> None:
    with pytest.raises(LimitError):
        render("{{ ('a' * 100000).strip('b' * 100000 ~ 'a') }}", timeout=0.1)
    with pytest.raises(LimitError):
        render("{{ 'x'.encode().ljust(1000000000) }}")
    with pytest.raises(LimitError):
        render("{{ (7).to_bytes(1000000000, 'big') }}")
    assert render("{{ 'abc'.strip('c') }}{{ 'a,b'.split(',')|length }}") == "ab2"


def test_markup_methods_are_checked_too() -> None:
    with pytest.raises(LimitError):
        render("{{ ('x'|safe).center(1000000000) }}")
    assert render("{{ ('<b>'|safe).center(5) }}") == " <b> "


def test_memory_budget_counts_what_the_render_keeps() -> None:
    """Values a render keeps alive (here in recursion) count against max_memory, not each one alone."""
    keep = "{% macro f(s, n) %}{% if n %}{{ f(s[1:], n - 1) }}{% endif %}{% endmacro %}{{ f('ab' * 2000000, 60) }}"
    # the clock out of the way (a loaded CI machine took over 5 s for the second render): memory is the point
    with pytest.raises(LimitError, match="more than 64 MiB of memory"):
        render(keep, max_memory=64 * 2**20, timeout=300)
    assert render(keep, max_memory=2**30, timeout=300) == ""


# --- Limits(isolate=True) ------------------------------------------------------------------------------

posix_only = pytest.mark.skipif(os.name != "posix", reason="isolation uses POSIX process limits")


@posix_only
def test_isolated_renders_match_in_process_renders() -> None:
    source = "{% for m in messages %}<{{ m.role }}>{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    chat = [{"role": "user", "content": "hi é"}, {"role": "assistant", "content": "yo \udc80"}]
    plain, isolated = ChatTemplate(source), ChatTemplate(source, limits=Limits(isolate=True))
    assert isolated.render(chat) == plain.render(chat)
    assert isolated.render_spans(chat) == plain.render_spans(chat)


@posix_only
def test_isolated_errors_keep_their_type_and_place() -> None:
    isolated = Limits(isolate=True)
    with pytest.raises(TemplateRaisedError, match="nope") as raised:
        ChatTemplate("\n{{ raise_exception('nope') }}", limits=isolated, name="t").render(USER)
    assert raised.value.template_name == "t" and raised.value.lineno == 2
    with pytest.raises(TemplateRuntimeError) as failed:
        ChatTemplate("{{ x.y }}", limits=isolated).render(USER)
    assert failed.value.python_type == "UndefinedError"
    with pytest.raises(LimitError, match=r"longer than 0\.5 s"):
        ChatTemplate("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
                     limits=Limits(isolate=True, timeout=0.5)).render(USER)  # fmt: skip


@posix_only
def test_the_operating_system_stops_what_the_budget_does_not_see() -> None:
    """The JSON encoder allocates its text in one call, before any budget can see it: the address-space
    limit of the worker stops it, the render is a LimitError, and the next render gets a working worker."""
    bomb = "{{ (['x' * 1000000] * 15)|tojson }}"
    with pytest.raises(LimitError, match="memory"):
        ChatTemplate(bomb, limits=Limits(isolate=True, max_memory=4 * 2**20)).render(USER)
    assert ChatTemplate("ok", limits=Limits(isolate=True)).render(USER) == "ok"


@posix_only
def test_a_worker_that_stops_answering_is_killed() -> None:
    from chatcodec import isolate

    template = ChatTemplate("{{ messages[0].content }}", limits=Limits(isolate=True, timeout=0.2))
    assert template.render(USER) == "hi"  # a worker is now idle in the pool
    worker = isolate._IDLE[-1]
    os.kill(worker.process.pid, signal.SIGSTOP)  # as if it hung in the middle of a render
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            template.render(USER)
        except LimitError as exc:
            errors.append(exc)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(30)
    assert errors and "longer than 0.2 s" in str(errors[0])
    assert worker.process.poll() is not None  # killed, not left behind
    assert template.render(USER) == "hi"
