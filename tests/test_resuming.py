"""A render that resumes the previous one (chatcodec.resuming): byte for byte a fresh render, always.

Every corpus template renders conversations that grow one message at a time, each render resuming the
last; every output (or error) must equal a fresh render's. Encodes of growing chats on the real tokenizers
must equal a codec's without memory, however the caller changes or rebuilds the messages in between.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from jinja2 import Undefined, nodes

from chatcodec import ChatcodecError, ChatTemplate, History, compiler, injection, limits, resuming, sandbox, tokens
from chatcodec.resuming import Memo

from .conftest import GOLDEN_NOW, SHARED, conversations, manifest, require_shared, template_source

NAMES = sorted(manifest()) if (SHARED / "corpus").is_dir() else []
TOKENIZERS = SHARED / "tokenizers"


def journeys() -> list[tuple[list[dict[str, Any]], Any]]:
    """Long conversations from the corpus ones (and their tools), to grow one message at a time."""
    corpus = conversations()
    reasoning = [
        *corpus["reasoning_history"]["messages"],
        *corpus["reasoning_final_turn"]["messages"],
        *corpus["inline_think_content"]["messages"],
    ]
    tools = corpus["tools_roundtrip_final"]
    return [
        (corpus["long_20_turn"]["messages"], None),
        ([*corpus["multi_turn"]["messages"], *corpus["injection_special_tokens"]["messages"]], None),
        ([*reasoning, *corpus["korean"]["messages"][1:]], None),
        ([*tools["messages"], {"role": "user", "content": "And tomorrow?"}, *tools["messages"][1:]], tools["tools"]),
        (corpus["qwen_agent_function_role"]["messages"], corpus["qwen_agent_function_role"]["tools"]),
    ]


def outcome(call: Any) -> Any:
    try:
        return call()
    except ChatcodecError as exc:
        return ("error", type(exc).__name__, str(exc))


@pytest.mark.parametrize("name", NAMES)
def test_growing_renders_resume_and_equal_fresh_ones(name: str) -> None:
    require_shared()
    entry = manifest()[name]
    template = ChatTemplate(template_source(name), special_tokens=entry["special_tokens"], name=name)
    resumed = compared = 0
    for messages, tools in journeys():
        for generation in (True, False):
            previous, seen = None, None
            for count in range(1, len(messages) + 1):
                chat = copy.deepcopy(messages[:count])
                options = {"tools": tools, "add_generation_prompt": generation, "now": GOLDEN_NOW}
                fresh = outcome(lambda: template.render(chat, **options))  # noqa: B023
                given = chat if seen is None else seen + chat[len(seen) :]
                memo = Memo(previous, len(seen) if seen is not None else 0)
                again = outcome(lambda: template.render_resuming(memo, given, **options))  # noqa: B023
                assert again == fresh, f"{name}: {count} messages, generation prompt {generation}"
                compared += 1
                resumed += memo.resumed
                if isinstance(again, str) and memo.record is not None:
                    previous, seen = memo.record, memo.messages
                else:
                    previous, seen = None, None  # an error, or the generic path: nothing to resume from
    assert compared > 50
    fast = compiler.fast_template(template.source)
    if fast is not None and "_cc_resume" in fast.source:
        assert resumed > 0, f"{name} has a resumable loop, but no render resumed it"


@pytest.mark.parametrize("name", NAMES)
def test_random_growth_with_cuts_equals_fresh_renders(name: str) -> None:
    """Seeded random conversations from the corpus' messages, grown one or two messages at a time and now and
    then cut back and grown otherwise, with and without tools: every render that resumes the last one equals
    a fresh render (or fails the same way)."""
    require_shared()
    entry = manifest()[name]
    template = ChatTemplate(template_source(name), special_tokens=entry["special_tokens"], name=name)
    corpus = conversations()
    pool = [m for c in corpus.values() for m in c["messages"] if m.get("role") != "system"]
    systems = [m for c in corpus.values() for m in c["messages"] if m.get("role") == "system"]
    tools = next(c["tools"] for c in corpus.values() if c.get("tools"))
    rng = random.Random(name)
    for journey in range(6):
        chat: list[Any] = [rng.choice(systems)] if journey % 2 else []
        options = {
            "tools": tools if journey % 3 == 0 else None,
            "add_generation_prompt": journey < 4,
            "now": GOLDEN_NOW,
        }
        previous, seen = None, None
        for _ in range(24):
            if len(chat) > 3 and rng.random() < 0.15:
                chat = chat[: rng.randrange(1, len(chat))]  # an edit: the chat cut back, to grow otherwise
                trusted = len(chat)
            else:
                trusted = len(chat)
                chat = chat + [copy.deepcopy(rng.choice(pool)) for _ in range(rng.randint(1, 2))]
            fresh = outcome(lambda: template.render(chat, **options))  # noqa: B023
            given = chat if seen is None else seen[: min(trusted, len(seen))] + chat[min(trusted, len(seen)) :]
            memo = Memo(previous, min(trusted, len(seen)) if seen is not None else 0)
            again = outcome(lambda: template.render_resuming(memo, given, **options))  # noqa: B023
            if isinstance(fresh, tuple) and isinstance(again, tuple):  # how it explains the messages it saw may
                fresh, again = fresh[:2], again[:2]  # differ: those it kept are normalized (no null field)
            assert again == fresh, f"{name}: journey {journey}, {len(chat)} messages"
            if isinstance(again, str) and memo.record is not None:
                previous, seen = memo.record, memo.messages
            else:
                previous, seen = None, None


def test_the_qwen3_and_llama_templates_resume_their_loop() -> None:
    require_shared()
    for folder, thresholds in (("qwen3", (("ns", "last_query_index"),)), ("llama3_1", ())):
        config = json.loads((TOKENIZERS / folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        plan = resuming.plan(sandbox.environment._parse(config["chat_template"], None, None))
        assert plan is not None and plan.thresholds == thresholds, folder


@pytest.mark.parametrize(
    "source",
    [
        # macros that could tell: they serialize the message, read the messages, set a namespace they were
        # given, call back, call an unknown function; a message passed by keyword; a name also set otherwise
        "{% macro f(m) %}{{ m | tojson }}{% endmacro %}{% for m in messages %}{{ f(m) }}{% endfor %}",
        # a message set to a name, then serialized; a message shown as the value of a condition
        "{% set first = messages[0] %}{{ first | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "{% for m in messages %}{{ m.content and m }}{% endfor %}",
        # messages kept by a field, then serialized
        "{{ messages|selectattr('role', 'equalto', 'user')|list|tojson }}"
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        # the messages after this one, measured rather than looped over
        "{% for m in messages %}{{ m.content }}{{ messages[loop.index:] | length }}{% endfor %}",
        "{% macro f(c) %}{{ messages | length }}{{ c }}{% endmacro %}"
        "{% for m in messages %}{{ f(m.content) }}{% endfor %}",
        "{% set n = namespace(k=0) %}{% macro f(o, c) %}{% set o.k = o.k + 1 %}{{ c }}{% endmacro %}"
        "{% for m in messages %}{{ f(n, m.content) }}{% endfor %}",
        "{% macro f(c) %}{{ caller() if caller }}{{ c }}{% endmacro %}"
        "{% for m in messages %}{{ f(m.content) }}{% endfor %}",
        "{% macro f(c) %}{{ strftime_now('%H') }}{{ c }}{% endmacro %}"
        "{% for m in messages %}{{ f(m.content) }}{% endfor %}",
        "{% macro f(m) %}{{ m.content }}{% endmacro %}{% for m in messages %}{{ f(m=m) }}{% endfor %}",
        "{% macro f(m) %}{{ m.content }}{% endmacro %}{% set f = 1 %}{% for m in messages %}{{ f(m) }}{% endfor %}",
        "{% macro g(c) %}{{ messages[0].content }}{% endmacro %}{% macro f(c) %}{{ g(c) }}{% endmacro %}"
        "{% for m in messages %}{{ f(m.content) }}{% endfor %}",
        # a macro defined twice: which one the loop calls depends on where
        "{% macro f(c) %}A{{ c }}{% endmacro %}{% for m in messages %}{{ f(m.content) }}{% endfor %}"
        "{% macro f(c) %}B{{ c }}{% endmacro %}",
        "{% for m in messages %}{{ m | tojson }}{% endfor %}",
        "{% for m in messages %}{{ m.items() | list }}{% endfor %}",
        "{% for m in messages %}{{ messages | last }}{% endfor %}",
        "{% set first = messages[0] %}{% for m in messages %}{{ m.content }}{{ first }}{% endfor %}",
        "{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}{{ m.content }}{% endfor %}",
        "{% for m in messages %}{{ strftime_now('%H') }}{{ m.content }}{% endfor %}",
        # a list of messages in one branch, something else in the other
        "{% if tools %}{% set items = tools %}{% else %}{% set items = messages %}{% endif %}"
        "{% for m in items %}{{ m.content }}{% endfor %}",
    ],
)
def test_loops_that_could_tell_the_renders_apart_are_not_resumed(source: str) -> None:
    assert resuming.plan(sandbox.environment._parse(source, None, None)) is None


@pytest.mark.parametrize(
    "source",
    [
        # what the loop reads beyond its message: the next one, the length, one counted from the end
        "{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}",
        "{% for m in messages %}{{ m.content }}{{ loop.length }}{% endfor %}",
        "{% for m in messages %}{{ m.content }}{{ messages[loop.index0 + 1] is defined }}{% endfor %}",
        "{% for m in messages %}{{ m.content }}{{ messages[loop.index0 - 1].content }}{% endfor %}",
        "{% for m in messages %}{{ m.content }}{{ messages[-1].content }}{% endfor %}",
        "{% for m in messages %}{% if m.content == 'm2' %}{{ messages|length }}{% endif %}{{ m.content }}{% endfor %}",
        # the same, after a loop of the body's own
        "{% for m in messages %}{% for ch in m.content %}.{% endfor %}{{ m.content }}"
        "{% if messages[loop.index0 + 1] is defined %}+{% endif %};{% endfor %}",
        "{% for m in messages %}{{ m.content }}{{ loop.nextitem.content if loop.nextitem }}{% endfor %}",
        # values from outside the loop, compared with its counter or not
        "{% set n = messages|length %}{% for m in messages %}{{ m.content }}{{ loop.index0 >= n - 2 }}{% endfor %}",
        "{% set n = messages|length %}{% for m in messages %}{{ m.content }}{{ n - 2 <= loop.index }}{% endfor %}",
        "{% set n = messages|length %}{% for m in messages %}{{ m.content }}{{ loop.index0 != n - 3 }}{% endfor %}",
        "{% set n = messages|length %}{% for m in messages %}{{ m.content }}{{ n }}{% endfor %}",
        "{% set ns = namespace(k=messages|length) %}{% for m in messages %}{{ loop.index < ns.k }}{% endfor %}",
        "{% set rest = messages[1:] %}{% for m in rest %}{{ m.content }}{{ loop.index0 }}{% endfor %}",
        # the messages up to some point (Kimi-K2-Thinking's history before its last answer)
        "{% set head = messages[: (messages|length) // 2] %}{% for m in head %}{{ m.content }};{% endfor %}"
        "|{% for m in messages[(messages|length) // 2 :] %}{{ m.content }}{% endfor %}",
        # a message set to a name, read field by field there, in a macro, or as a condition (MiniMax, DeepSeek)
        "{% set first = messages[0] %}{% for m in messages %}{{ m.content }}"
        "{% if first and first.role == 'system' %}*{% endif %}{% endfor %}",
        "{% macro sys(s) %}{% if s and s.content %}[{{ s.content }}]{% endif %}{% endmacro %}"
        "{% set first = messages[0] %}{{ sys(first) }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "{% for m in messages %}{% if not loop.first %}{% set prev = messages[loop.index0 - 1] %}{{ prev.content }}>"
        "{% endif %}{{ m.content }};{% endfor %}",
        # messages counted by a field elsewhere (Apriel)
        "{% if messages|selectattr('role', 'equalto', 'system')|list|length == 0 %}[none]{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        # the messages after this one, looped over (gpt-oss): as if reading every one
        "{% for m in messages %}{{ m.content }}{% if m.content == 'm2' %}{% for later in messages[loop.index:] %}"
        "{{ later.content }}{% endfor %}{% endif %};{% endfor %}",
        # macros: given the message (read by field) or a field, reading names from outside, calling each other,
        # setting a namespace from outside (put back where the render resumes)
        "{% macro f(m) %}{{ m.role }}:{{ m['content'] }}{% endmacro %}{% for m in messages %}{{ f(m) }}{% endfor %}",
        "{% set ns = namespace(n=0) %}{% macro g(c) %}{% set ns.n = ns.n + c|length %}{% endmacro %}"
        "{% macro f(c, sep='|') %}{{ g(c) }}{{ c }}{{ sep }}{{ ns.n }}{% endmacro %}"
        "{% for m in messages %}{{ f(m.content) }}{% endfor %}{{ ns.n }}",
        # a macro with a namespace of its own (Gemma 4), or the one from outside, as it goes
        "{% macro f(c) %}{% set ns = namespace(n=0) %}{% for ch in c %}{% set ns.n = ns.n + 1 %}{% endfor %}"
        "{{ ns.n }}{% endmacro %}{% for m in messages %}{{ f(m.content) }}{% endfor %}",
        "{% set ns = namespace(n=0) %}{% macro f(c) %}{% if c == 'm1' %}{% set ns = namespace(n=100) %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}{{ ns.n }}{% endmacro %}"
        "{% for m in messages %}{{ f(m.content) }};{% endfor %}{{ ns.n }}",
        # a macro reads what the body only compares with the counter: all of it is part of what the loop saw
        "{% set ns = namespace(k=messages|length - 2) %}{% macro f(c) %}{{ c }}{{ ns.k }}{% endmacro %}"
        "{% for m in messages %}{{ f(m.content) }}{{ loop.index0 > ns.k }}{% endfor %}",
        # namespaces the loop sets: put back as they were where the render resumes
        "{% set ns = namespace(n=0, seen='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{% if m.content == 'm3' %}{% set ns.seen = ns.seen + m.content %}{% endif %}{{ ns.n }}{{ ns.seen }}"
        "{% endfor %}{{ ns.n }}",
    ],
)
def test_what_an_iteration_read_decides_where_a_render_resumes(source: str) -> None:
    template = ChatTemplate(source)
    chat = [{"role": "user", "content": f"m{i}"} for i in range(9)]
    previous, seen, resumed = None, None, 0
    for count in range(1, len(chat) + 1):
        given = chat[:count] if seen is None else seen + chat[len(seen) : count]
        memo = Memo(previous, len(seen) if seen is not None else 0)
        assert template.render_resuming(memo, given) == template.render(chat[:count]), (source, count)
        previous, seen, resumed = memo.record, memo.messages, resumed + memo.resumed
    assert previous is not None  # each of these loops is resumable: what it read only limits how far


@pytest.mark.parametrize("step", [1, 2])
@pytest.mark.parametrize(
    "source",
    [
        # the list of messages chosen in an `if` (Mistral, Granite, Gemma 3), the loop in one
        "{% if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% set loop_messages = messages[1:] %}"
        "{% else %}{% set sys = '' %}{% set loop_messages = messages %}{% endif %}[{{ sys }}]"
        "{% for m in loop_messages %}{{ m.content }}{{ loop.index0 }}{% endfor %}",
        "{% if messages %}{% for m in messages %}{{ m.content }}{% if loop.last %}.{% endif %}{% endfor %}{% endif %}",
        # a render runs the resumable loop or the other one, as the chat grows
        "{% if messages|length is even %}{% for m in messages %}<{{ m.content }}>{% endfor %}"
        "{% else %}{% for m in messages %}({{ m.content }}){% endfor %}{% endif %}",
    ],
)
def test_a_loop_in_an_if_resumes_when_the_last_render_ran_it(source: str, step: int) -> None:
    template = ChatTemplate(source)
    chat = [{"role": "system" if i == 0 else "user", "content": f"m{i}"} for i in range(10)]
    template.render(chat)  # compiled on first use: later renders can resume
    previous, seen, resumed = None, None, 0
    for count in range(step, len(chat) + 1, step):
        given = chat[:count] if seen is None else seen + chat[len(seen) : count]
        memo = Memo(previous, len(seen) if seen is not None else 0)
        assert template.render_resuming(memo, given) == template.render(chat[:count]), (source, count)
        previous, seen, resumed = memo.record, memo.messages, resumed + memo.resumed
        if memo.record is None:
            seen = None  # the render did not run the resumable loop: nothing to resume from
    alternating = "is even" in source and step == 1  # each render ran the other loop than the last one
    assert (resumed == 0) if alternating else (resumed > 0), (source, step)


@pytest.mark.parametrize(
    "source",
    [
        "{% macro f(c) %}{{ prefix }}{{ c }}{% endmacro %}{% for m in messages %}{{ f(m.content) }};{% endfor %}",
        # read from outside before the macro sets a name of its own
        "{% macro f(c) %}{{ prefix }}{% set prefix = c %}{{ prefix }}{% endmacro %}"
        "{% for m in messages %}{{ f(m.content) }};{% endfor %}",
    ],
)
def test_a_macro_that_reads_a_name_from_outside_resumes_only_while_it_is_the_same(source: str) -> None:
    template = ChatTemplate(source)
    chat = [{"role": "user", "content": f"m{i}"} for i in range(4)]
    template.render(chat, prefix="")  # compiled on first use: later renders can resume
    memo = Memo()
    template.render_resuming(memo, chat[:3], prefix="a:")
    same = Memo(memo.record, 3)
    assert template.render_resuming(same, chat, prefix="a:") == "a:m0;a:m1;a:m2;a:m3;"
    assert same.resumed == 3
    other = Memo(memo.record, 3)
    assert template.render_resuming(other, chat, prefix="b:") == "b:m0;b:m1;b:m2;b:m3;"
    assert other.resumed == 0


def test_a_render_resumes_only_from_messages_its_caller_vouches_for() -> None:
    template = ChatTemplate("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    chat = [{"role": "user", "content": f"m{i}"} for i in range(4)]
    template.render(chat)  # compiled on first use: later renders can resume
    memo = Memo()
    template.render_resuming(memo, chat)
    chat[1]["content"] = "changed in place"  # the same objects: only `trusted` says they did not change
    vouched = Memo(memo.record, 1)
    assert template.render_resuming(vouched, chat) == "[m0][changed in place][m2][m3]"
    assert vouched.resumed == 1


@pytest.mark.parametrize(
    "source",
    [
        "{% for m in messages %}[{{ m.content }}]{% endfor %}<end>",
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}"
        "{{ m.content }}={{ ns.n }};{% endfor %}{{ ns.n }}",
    ],
)
def test_a_render_resumes_inside_the_output_the_last_one_copied(source: str) -> None:
    template = ChatTemplate(source)
    chat = [{"role": "user", "content": "x" * i} for i in range(12)]
    template.render(chat)  # compiled on first use: later renders can resume
    previous, seen = None, None
    for count in range(1, 11):  # each render copies the output of all but its last iteration
        given = chat[:count] if seen is None else seen + chat[len(seen) : count]
        memo = Memo(previous, len(seen) if seen is not None else 0)
        assert template.render_resuming(memo, given) == template.render(chat[:count])
        previous, seen = memo.record, memo.messages
    assert memo.resumed == 9 and seen is not None
    # the chat cut back to 6 messages, then grown by others: resumed at 6 and 8, inside copied output
    for cut in ([*seen[:6], chat[11]], [*seen[:6], chat[11], chat[1], chat[2]]):
        memo = Memo(previous, 6 if len(cut) == 7 else 7)
        assert template.render_resuming(memo, cut) == template.render(cut)
        assert memo.resumed == (6 if len(cut) == 7 else 7)
        previous = memo.record


OPS = ("eq", "ne", "gt", "gteq", "lt", "lteq")
COMPARE = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "gt": lambda a, b: a > b,
    "gteq": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "lteq": lambda a, b: a <= b,
}


@pytest.mark.parametrize("op", OPS)
def test_first_disagreement_of_a_counter_comparison_is_exact(op: str) -> None:
    for shift, before, after in itertools.product((0, 1), range(-3, 12), range(-3, 12)):
        differ = [i for i in range(40) if COMPARE[op](i + shift, before) != COMPARE[op](i + shift, after)]
        expected = differ[0] if differ else None
        found = resuming._first_disagreement(op, shift, before, after)
        assert (found if found < 40 else None) == expected, (op, shift, before, after)
    assert resuming._first_disagreement("gt", 0, 3, True) == 0  # not both ints: no iteration is known alike
    assert resuming._first_disagreement("gt", 0, "a", "a") == resuming.EVERYTHING


def test_values_are_compared_strictly() -> None:
    assert resuming._same((1, {"a": 1, "b": 2}), (1, {"a": 1, "b": 2}))
    assert not resuming._same((1,), (True,))
    assert not resuming._same((1,), (1.0,))
    assert not resuming._same(({"a": 1, "b": 2},), ({"b": 2, "a": 1},))
    assert not resuming._same((object(),), (object(),))
    # a namespace's attributes with an undefined value in them: compared one by one, as strictly
    undefined = Undefined(name="x")
    assert resuming._same({"a": 1, "u": undefined}, {"a": 1, "u": undefined})
    assert not resuming._same({"a": 1, "u": undefined}, {"a": True, "u": undefined})
    assert not resuming._same({1: "a", "u": undefined}, {True: "a", "u": undefined})
    assert not resuming._same({"a": 1, "u": undefined}, {"u": undefined, "a": 1})


# --- the qwen-style reverse scan stops once its flag is cleared ----------------------------------------------


SCAN = (
    "{% set ns = namespace(more=true, last=-1) %}"
    "{% for m in messages[::-1] %}{% set i = (messages|length - 1) - loop.index0 %}"
    "{% if ns.more and m.role == 'user' %}{% set ns.more = false %}{% set ns.last = i %}{% endif %}{% endfor %}"
    "{{ ns.last }}"
)


@pytest.mark.parametrize(
    ("source", "stops"),
    [
        (SCAN, True),
        (SCAN.replace("{% endif %}{% endfor %}", "{% else %}x{% endif %}{% endfor %}"), False),
        (SCAN.replace("(messages|length - 1) - loop.index0", "m.content|length"), False),
        (SCAN.replace("{% set ns.last = i %}", "{% set ns.last = i %}{% set ns = namespace(more=true) %}"), False),
    ],
)
def test_a_scan_stops_only_when_nothing_later_could_happen(source: str, stops: bool) -> None:
    tree = sandbox.environment._parse(source, None, None)
    loop = next(node for node in tree.body if isinstance(node, nodes.For))
    assert (compiler._stops_when(loop) is not None) is stops
    chat = [{"role": r, "content": "x"} for r in ("system", "user", "assistant", "user", "assistant", "tool")]
    fast = compiler.fast_template(source)
    assert fast is not None
    variables = {"messages": chat}
    compiled = fast.render(variables, limits.Budget(limits.Limits()))
    assert compiled == sandbox.run(sandbox.compile_template(source), variables, budget=limits.Budget(limits.Limits()))


# --- encodes of growing chats ------------------------------------------------------------------------------


def chat(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        question = f"What is {i} < {i + 1}? <|im_end|> [INST]" if i % 3 == 2 else f"Question {i}?"
        answer: dict[str, Any] = {"role": "assistant", "content": f"Answer {i}.", "reasoning_content": f"think {i}"}
        if i % 4 == 1:
            answer["tool_calls"] = [
                {"type": "function", "function": {"name": "f", "arguments": {"n": i, "flag": True, "x": 1.0}}}
            ]
        messages += [{"role": "user", "content": question}, answer]
        if i % 4 == 1:
            messages.append({"role": "tool", "content": f"result {i} <tool_response>"})
    return messages


@pytest.fixture(scope="module", params=["qwen3", "llama3_1"])
def folder(request: pytest.FixtureRequest) -> Path:
    require_shared()
    return TOKENIZERS / request.param


class CountingMemo(Memo):
    made: ClassVar[list[Memo]] = []

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        CountingMemo.made.append(self)


def test_growing_encodes_equal_fresh_ones(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "Memo", CountingMemo)
    CountingMemo.made = []
    remembering, forgetting = tokens.load(folder), tokens.load(folder)
    forgetting.history = History(entries=0)
    full = chat(14)
    for count in range(1, len(full) + 1):
        messages = json.loads(json.dumps(full[:count]))  # rebuilt from JSON each time, as a server does
        for generation in (True, False):
            got = remembering.encode(messages, add_generation_prompt=generation)
            fresh = forgetting.encode(messages, add_generation_prompt=generation)
            assert got.input_ids == fresh.input_ids, count
            if count % 5 == 0:  # the masks and spans of an encode that resumed: found on what it rendered
                assert got.mask(reasoning=True) == fresh.mask(reasoning=True), count
                assert got.message_spans == fresh.message_spans, count
    assert sum(memo.resumed for memo in CountingMemo.made) > 3 * len(full)  # most of each chat was resumed


def test_a_growing_encode_resumes_after_the_shield_walks_the_messages(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under "reject" the shield walks the messages that hold marks (JSON texts are swapped for "escape" only):
    the messages it kept are still the objects the last render saw, so the render resumes, and every encode
    equals a fresh codec's."""
    monkeypatch.setattr(tokens, "Memo", CountingMemo)
    CountingMemo.made = []
    walks = []
    walk = injection.Shield._apply

    def counted(shield: injection.Shield, *args: Any) -> Any:
        walks.append(len(args[0]))
        return walk(shield, *args)

    monkeypatch.setattr(injection.Shield, "_apply", counted)
    remembering, forgetting = tokens.load(folder), tokens.load(folder)
    forgetting.history = History(entries=0)
    full: list[dict[str, Any]] = [{"role": "system", "content": "Be brief; use <b> for bold."}]
    for i in range(12):
        full.append({"role": "user", "content": f"Is {i} < {i + 1} and [{i}] > []?" if i % 2 else f"Question {i}?"})
        full.append({"role": "assistant", "content": f"Yes, <b>{i}</b>.", "reasoning_content": f"{i} < {i + 1}"})
    for count in range(2, len(full) + 1, 2):
        messages = json.loads(json.dumps(full[:count]))  # rebuilt from JSON each time, as a server does
        got = remembering.encode(messages, add_generation_prompt=True, content_special_tokens="reject")
        fresh = forgetting.encode(messages, add_generation_prompt=True, content_special_tokens="reject")
        assert (got.input_ids, got.text) == (fresh.input_ids, fresh.text), count
    assert len(walks) > 10  # the growing encodes walked the messages
    assert sum(memo.resumed for memo in CountingMemo.made) > 3 * 12  # most of each chat was resumed


def edits() -> list[Any]:
    """Ways a caller changes a conversation between two encodes, each giving the same ``==`` or not."""

    def content(messages: list[Any]) -> None:
        messages[3]["content"] += " (edited)"

    def to_true(messages: list[Any]) -> None:  # 1 == True: equal, but rendered "true" by tojson
        messages[4]["tool_calls"][0]["function"]["arguments"]["n"] = True

    def to_float(messages: list[Any]) -> None:  # 1 == 1.0
        messages[4]["tool_calls"][0]["function"]["arguments"]["n"] = 1.0

    def key_order(messages: list[Any]) -> None:  # equal dicts, keys in another order
        arguments = messages[4]["tool_calls"][0]["function"]["arguments"]
        messages[4]["tool_calls"][0]["function"]["arguments"] = dict(reversed(list(arguments.items())))

    def drop_reasoning(messages: list[Any]) -> None:
        del messages[2]["reasoning_content"]

    def shorter(messages: list[Any]) -> None:
        del messages[6:]

    return [content, to_true, to_float, key_order, drop_reasoning, shorter]


@pytest.mark.parametrize("edit", edits(), ids=lambda f: f.__name__)
def test_a_changed_history_is_encoded_as_it_is_now(folder: Path, edit: Any) -> None:
    remembering, forgetting = tokens.load(folder), tokens.load(folder)
    forgetting.history = History(entries=0)
    messages = chat(6)
    for count in (len(messages) - 4, len(messages) - 2):  # grow twice: the memory holds a resumable render
        remembering.encode(messages[:count], add_generation_prompt=True)
    edit(messages)  # in place, on the caller's own objects
    got = remembering.encode(messages, add_generation_prompt=True)
    assert got.input_ids == forgetting.encode(messages, add_generation_prompt=True).input_ids
    assert got.text == forgetting.encode(messages, add_generation_prompt=True).text


@pytest.mark.parametrize("policy", ["escape", "allow"])
def test_random_growing_encodes_with_edits_equal_fresh_ones(folder: Path, policy: str) -> None:
    """Seeded random chats of corpus messages (control tokens and marks in some), grown a message or two at a
    time, with the caller now and then changing an earlier message in place, dropping the last ones, or
    passing copies: every encode equals a codec's without memory, ids and text."""
    remembering, forgetting = tokens.load(folder), tokens.load(folder)
    forgetting.history = History(entries=0)
    for chat in random_growth(f"{folder.name}-{policy}", ("user", "assistant"), chats=4, steps=16):
        options = {"add_generation_prompt": chat[-1]["role"] == "user", "content_special_tokens": policy}
        got = outcome(lambda: remembering.encode(chat, **options))  # noqa: B023
        want = outcome(lambda: forgetting.encode(chat, **options))  # noqa: B023
        if isinstance(want, tuple):
            assert isinstance(got, tuple) and got[:2] == want[:2]
        else:
            assert isinstance(got, tokens.Encoding)
            assert (got.input_ids, got.text) == (want.input_ids, want.text), len(chat)


def random_growth(seed: str, roles: tuple[str, ...], *, chats: int, steps: int) -> Iterator[list[Any]]:
    """Seeded random chats of corpus messages (of ``roles``; control tokens and marks in some), each grown
    ``steps`` times by a message or two, the caller now and then changing an earlier message in place,
    dropping the last ones, or passing copies: the chat after each step."""
    corpus = conversations()
    pool = [m for c in corpus.values() for m in c["messages"] if m.get("role") in roles]
    rng = random.Random(seed)
    for _ in range(chats):
        chat: list[Any] = [{"role": "system", "content": "Be brief [INST] <|im_end|>."}]
        for _ in range(steps):
            roll = rng.random()
            if roll < 0.1 and len(chat) > 2:
                message = rng.choice(chat[1:])
                message["content"] = f"{message.get('content') or ''} edited <|eot_id|> [/INST]"  # in place
            elif roll < 0.2 and len(chat) > 3:
                del chat[rng.randrange(2, len(chat)) :]
            elif roll < 0.3:
                chat = copy.deepcopy(chat)  # the same conversation in new objects
            chat += [copy.deepcopy(rng.choice(pool)) for _ in range(rng.randint(1, 2))]
            yield chat


def test_a_growing_encode_that_fails_says_what_a_fresh_one_says(folder: Path) -> None:
    """The error of a render that would resume names the caller's messages as they are (a null field), not the
    normalized copies the resumed render was given."""
    source = (
        "{% for m in messages %}{{ m.role }}"
        "{% if loop.last and m.role == 'user' %}{{ messages[0].content.strip() }}{% endif %}{% endfor %}"
    )
    said = []
    for entries in (256, 0):
        codec = tokens.load(folder).with_template(ChatTemplate(source))
        codec.history = History(entries=entries)
        messages = [{"role": "assistant", "content": None}, {"role": "assistant", "content": "x"}]
        for count in (1, 2):
            codec.encode(messages[:count])
        with pytest.raises(ChatcodecError) as caught:
            codec.encode([*messages, {"role": "user", "content": "a"}])
        said.append(str(caught.value))
    assert said[0] == said[1] and '"content": null' in said[0]


def test_a_growing_encode_over_its_budget_is_not_rendered_again(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed render that ends in a LimitError is the encode's error: the usual encode would spend the
    whole budget again to end the same way."""
    template = ChatTemplate(
        "{% for m in messages %}{{ m.content }}{% endfor %}", limits=limits.Limits(max_output=20_000)
    )
    codec = tokens.load(folder).with_template(template)
    chat = [{"role": "user", "content": "x" * 9_000}, {"role": "user", "content": "y" * 9_000}]
    for count in (1, 2):
        codec.encode(chat[:count])
    renders: list[Any] = []
    original = ChatTemplate.render
    monkeypatch.setattr(ChatTemplate, "render", lambda self, *a, **k: renders.append(a) or original(self, *a, **k))
    with pytest.raises(limits.LimitError):
        codec.encode([*chat, {"role": "user", "content": "z" * 3_000}])
    assert renders == []


def test_a_template_that_cannot_resume_copies_each_message_once(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Growing encodes with a template whose loop has a macro serialize each message: no render to resume, so
    no copy of the whole conversation for one (each message is copied once, when it is new)."""
    copies: list[Any] = []
    original = tokens.copy_of
    monkeypatch.setattr(tokens, "copy_of", lambda value: copies.append(value) or original(value))
    source = "{% macro line(m) %}{{ m | tojson }}\n{% endmacro %}{% for m in messages %}{{ line(m) }}{% endfor %}"
    codec = tokens.load(folder).with_template(ChatTemplate(source))
    full = chat(10)
    for count in range(1, len(full) + 1):
        codec.encode(full[:count])
    assert not codec.template.resumable
    assert len(copies) <= len(full) + 1


def test_a_resumed_render_keeps_the_output_limit() -> None:
    """Output copied from the last render counts toward Limits(max_output) like the rest: two long parts
    copied and one short new one, 21,000 characters against a limit of 20,000."""
    template = ChatTemplate(
        "{% for m in messages %}{{ m.content }}{% endfor %}", limits=limits.Limits(max_output=20_000)
    )
    chat = [{"role": "user", "content": "x" * 9_000}, {"role": "user", "content": "y" * 9_000}]
    template.render(chat[:1])  # compiled on first use
    memo = Memo()
    template.render_resuming(memo, chat)
    longer = [*chat, {"role": "user", "content": "z" * 3_000}]
    resumed = Memo(memo.record, 2)
    with pytest.raises(limits.LimitError):
        template.render_resuming(resumed, [*memo.messages, longer[2]])
    assert resumed.resumed == 2
    with pytest.raises(limits.LimitError):
        template.render(longer)


def test_a_cut_of_the_messages_is_found_where_it_starts() -> None:
    """A loop over a cut of the messages takes the vouched-for messages as they are only where the cut starts
    where the last one did; the same message object twice leaves that unsure, and the items are compared."""
    a, b, c = ({"role": "user", "content": t} for t in "abc")
    assert resuming._origin([a, b, c], [b, c]) == 1  # messages[1:]
    assert resuming._origin([a, b, c], [a, b]) == 0  # messages[:-1]
    assert resuming._origin([a, b, c], [a, b, c][:]) == 0
    assert resuming._origin([a, b, c], [c, a]) == -1  # not a cut
    assert resuming._origin([a, b, a, c], [b, a, c]) == 1  # a repeated message, the cut still sure
    assert resuming._origin([a, b, a, b], [a, b]) == -1  # messages[:2] or messages[2:]
    assert resuming._origin([a, a, b, a, a], [a, b, a, a]) == -1  # messages[1:], or [:4] by its ends


def test_a_loop_over_a_cut_resumes_exactly_when_a_message_object_repeats() -> None:
    template = ChatTemplate(
        "{% set rest = messages[1:] %}{{ messages[0].content }}|{% for m in rest %}[{{ m.content }}]{% endfor %}"
    )
    one, two = {"role": "user", "content": "one"}, {"role": "user", "content": "two"}
    template.render([one, two])  # compiled on first use: later renders can resume
    chats = [[one, two], [one, two, one], [one, two, one, two], [one, two, one, two, one]]
    previous, seen = None, None
    for chat in chats:
        given = chat if seen is None else seen + chat[len(seen) :]
        memo = Memo(previous, len(seen) if seen is not None else 0)
        assert template.render_resuming(memo, given) == template.render(chat)
        previous, seen = memo.record, memo.messages
    assert memo.resumed > 0
