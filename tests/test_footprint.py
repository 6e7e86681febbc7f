"""What a template reads of its messages (chatcodec.footprint), and renders that normalize only that.

The reading is checked form by form on small templates, and its use end to end: on every corpus template,
conversations loaded with what only full normalization would mend (``None`` values, reasoning fields, tuples,
objects and subclasses in keys the template may or may not read) render exactly as they do with every
message normalized in full, and fail with the same error.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import random
from pathlib import Path
from typing import Any

import pytest

from chatcodec import ChatcodecError, ChatTemplate, compiler, footprint, render
from chatcodec.sandbox import environment

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"


def keys_of(source: str) -> list[str] | None:
    tree = environment._parse(source, None, None)
    found = footprint.reads(tree, compiler._message_lists(tree, frozenset({"messages"})))
    return None if found is None else sorted(found)


@pytest.mark.parametrize(
    ("source", "keys"),
    [
        ("{% for m in messages %}{{ m.role }}{{ m['content'] }}{% endfor %}", ["content", "role"]),
        ("{{ messages[0].content }}{{ (messages | last).role }}{{ messages | length }}", ["content", "role"]),
        ("{% for m in messages[1:] if m.role != 'x' %}{{ m.get('name', '') }}{% endfor %}", ["name", "role"]),
        ("{% set rest = messages[1:] %}{% for m in rest %}{% set n = m %}{{ n.content }}{% endfor %}", ["content"]),
        ("{% for m in messages %}{% if 'tool_calls' in m %}x{% endif %}{% endfor %}", ["tool_calls"]),
        ("{% if not messages %}{{ messages is defined }}{% endif %}{{ 1 if messages else 2 }}", []),
        ("{% for m in messages %}{{ m.tool_calls[0].function.arguments | tojson }}{% endfor %}", ["tool_calls"]),
        ("{% for m in messages %}{{ m is defined }}{{ loop.index }}{% endfor %}", []),
        ("{% for m in messages %}{% if m and not loop.previtem %}{% endif %}{{ 1 if m or m }}{% endfor %}", []),
        ("{% for m in messages %}{% if loop.previtem and loop.previtem.role %}{% endif %}{% endfor %}", ["role"]),
        ("{% for m in messages %}{{ loop.nextitem['content'] if loop.last is false }}{% endfor %}", ["content"]),
        # the neighbours of a loop over tool calls are tool calls, read as they please
        (
            "{% for m in messages %}{% for c in m.tool_calls %}{{ loop.previtem | tojson }}{% endfor %}{% endfor %}",
            ["tool_calls"],
        ),
    ],
)
def test_key_reads_are_found(source: str, keys: list[str]) -> None:
    assert keys_of(source) == keys


SEEING_WHOLE = [
    "{{ messages[0] }}",  # printed whole
    "{{ messages[0] | tojson }}",
    "{% for m in messages %}{{ m | tojson }}{% endfor %}",
    "{% for m in messages %}{% for k in m %}{{ k }}{% endfor %}{% endfor %}",  # its keys
    "{% for m in messages %}{{ m.items() | list }}{% endfor %}",
    "{% for m in messages %}{{ m.get(m.role) }}{% endfor %}",  # a key not known
    "{% for m in messages %}{{ m[m.role] }}{% endfor %}",
    "{% macro show(x) %}{{ x.content }}{% endmacro %}{% for m in messages %}{{ show(m) }}{% endfor %}",
    "{% for m in messages %}{{ loop.previtem if m.role }}{% endfor %}",  # a neighbour printed
    "{% for m in messages %}{{ (loop | attr('nextitem')).role }}{% endfor %}",
    "{% for m in messages %}{{ m or 'none' }}{% endfor %}",  # `or` gives the message as its value
    "{% for m in messages %}{% set m = {'role': 'x'} %}{{ m.role }}{% endfor %}",  # rebound
    "{% macro f(m) %}{{ m }}{% endmacro %}{% for m in messages %}{{ m.role }}{% endfor %}",  # same name
    "{% set ns = namespace(last=none) %}{% for m in messages %}{% set ns.last = m %}{% endfor %}{{ ns.last }}",
    "{{ (messages | selectattr('role', 'equalto', 'user') | first).content }}",
    "{{ (messages and messages[0].role) }}{{ x and messages }}",  # the list as a value
    "{% set messages = messages + [1] %}{{ messages[0].role }}",
    "{% for m in messages %}{{ m == messages[0] }}{% endfor %}",
    "{% for m in messages recursive %}{{ m.role }}{% endfor %}",
    "{% with m = messages[0] %}{{ m.role }}{% endwith %}",
]


@pytest.mark.parametrize("source", SEEING_WHOLE)
def test_any_other_use_of_a_message_reads_everything(source: str) -> None:
    assert keys_of(source) is None


@dataclasses.dataclass
class Meta:
    source: str
    score: float


class Color(str, enum.Enum):
    RED = "red"


def loaded(message: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``message`` with what only full normalization mends: ``None`` values (an OpenAI client's), reasoning
    fields, tuples, dataclasses, subclasses of str and int, in keys templates read and keys they do not."""
    message = copy.deepcopy(message)
    extra: dict[str, Any] = {
        "refusal": None,
        "audio": None,
        "function_call": None,
        "name": None,
        "meta": Meta("corpus", 0.5),
        "labels": ("a", Color.RED),
        "weight": True,
    }
    for key in rng.sample(sorted(extra), rng.randint(1, len(extra))):
        message.setdefault(key, extra[key])
    if message.get("role") == "assistant":
        roll = rng.random()
        if roll < 0.3:
            message.setdefault("reasoning", "Thinking it over.")
        elif roll < 0.5:
            message.setdefault("tool_calls", None)
        elif roll < 0.6:
            message["content"] = None
    if rng.random() < 0.2 and isinstance(message.get("content"), str):
        message["content"] = Color.RED  # a str subclass where templates do read
    return message


def outcome(template: ChatTemplate, messages: list[Any], tools: Any, options: dict[str, Any], full: bool) -> str:
    """The render (the short way, which normalizes what the template reads), or with every message normalized
    in full, one by one (the general way, its shortcuts for plain messages taken out); or the error either
    raises."""
    try:
        if full:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(
                    render, "_normalize_messages", lambda messages, keys=None: render._normalized_copy(messages)
                )
                return template.render_with_report(messages, tools=tools, polyfill=False, **options)[0]
        return template.render(messages, tools=tools, **options)
    except ChatcodecError as error:
        return f"{type(error).__name__}: {error}"


@pytest.mark.parametrize(
    "source",
    [
        *SEEING_WHOLE,
        "{% for m in messages %}{% if 'name' in m %}[{{ m.role }}]{% endif %}{% endfor %}",
        "{% for m in messages %}{{ m.thinking }}|{{ m.get('reasoning_content') }}|{{ m.meta }}{% endfor %}",
        "{% for m in messages %}{% if loop.previtem and loop.previtem.name %}{{ m.role }}{% endif %}{% endfor %}",
    ],
)
def test_templates_that_see_more_render_loaded_messages_as_normalized_ones(source: str) -> None:
    """The readings above, end to end: whatever a template sees of a message is normalized."""
    template = ChatTemplate(source)
    rng = random.Random(source)
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "name": "bot"}]
    for _ in range(20):
        messages = [loaded(m, rng) for m in conversation]
        for full in (True, False, False):  # the short way from the second render on
            if full:
                expected = outcome(template, messages, None, {}, full=True)
            else:
                assert outcome(template, messages, None, {}, full=False) == expected


def test_a_message_with_none_of_the_keys_read_is_true_as_its_normalized_copy() -> None:
    """A message whose keys are all null is empty once normalized, so false: one with none of the keys a
    template reads is normalized in full, so that a template testing its truth sees what transformers shows."""
    template = ChatTemplate("{% for m in messages %}{% if m %}[{{ m.role }}]{% endif %}{% endfor %}")
    messages = [{"refusal": None}, {"role": "user", "content": "x", "audio": None}]
    for _ in range(2):
        assert outcome(template, messages, None, {}, full=False) == "[user]"
    assert outcome(template, messages, None, {}, full=True) == "[user]"


def test_every_corpus_template_renders_loaded_messages_as_their_normalized_copies() -> None:
    manifest = json.loads((CORPUS / "manifest.json").read_text())["templates"]
    conversations = json.loads((CORPUS / "conversations.json").read_text())["conversations"]
    rng = random.Random("footprint")
    reading = compared = 0
    for entry in manifest:
        template = ChatTemplate((CORPUS / entry["file"]).read_text(), special_tokens=entry["special_tokens"])
        for conversation in conversations:
            for options in conversation["option_sets"]:
                for _ in range(2):
                    messages = [loaded(m, rng) for m in conversation["messages"]]
                    expected = outcome(template, messages, conversation["tools"], options, full=True)
                    assert outcome(template, messages, conversation["tools"], options, full=False) == expected, (
                        entry["name"],
                        conversation["id"],
                        options,
                    )
                    compared += 1
        reading += template._fast is not None and template._fast.message_keys is not None
    assert reading >= 45 and compared > 3000  # 47 of the 56 templates read only some keys: the new way is taken
