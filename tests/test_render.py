"""ChatTemplate.render against transformers' documented behaviour (parity notes §1, §2, §5, §6)."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections import OrderedDict
from typing import Any

import pytest

from chatcodec import ChatTemplate, InputError, SandboxError, TemplateRaisedError, TemplateRuntimeError
from chatcodec.exceptions import TemplateNotFoundError, TemplateSyntaxError

from .reference import reference_render, transformers_available

NOW = datetime.datetime(2026, 11, 29, 12, 0, 0)
USER = [{"role": "user", "content": "hi"}]
CONV = [
    {"role": "system", "content": "system message"},
    {"role": "user", "content": "user message"},
    {"role": "assistant", "content": "assistant message"},
]
SIMPLE = "{% for message in messages %}{{message['role'] + message['content']}}{% endfor %}"
CHATML = """
        {%- for message in messages %}
            {{- "<|im_start|>" + message['role'] + "\n" + message['content'] + "<|im_end|>" + "\n"}}
        {%- endfor %}"""
CHATML_TRIM = CHATML.replace("message['content'] +", "message['content'] | trim +")
QWEN_TOKENS = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def render(source: str, messages: Any = USER, special_tokens: dict[str, str] | None = None, **kwargs: Any) -> str:
    return ChatTemplate(source, special_tokens=special_tokens).render(messages, now=NOW, **kwargs)


# Each case: (template, messages, special tokens, kwargs, expected output). The expected strings are
# the ones the parity notes record for transformers 5.24; the test also re-checks them against
# transformers itself when it is installed.
CASES: dict[str, tuple[str, Any, dict[str, str], dict[str, Any], str]] = {
    "T1 simple": (SIMPLE, CONV, {}, {}, "systemsystem messageuseruser messageassistantassistant message"),
    "D1 one trailing newline dropped": ("a\n", USER, {}, {}, "a"),
    "D1 only one": ("a\n\n", USER, {}, {}, "a\n"),
    "D2 trim and lstrip blocks": ("x\n  {% if true %}\n  y\n  {% endif %}\nz", USER, {}, {}, "x\n  y\nz"),
    "D3 CR normalised in source": ("a\r\nb\rc", USER, {}, {}, "a\nb\nc"),
    "D3 CR kept in variables": ("{{ x }}", USER, {}, {"x": "a\r\nb"}, "a\r\nb"),
    "D4 special tokens as variables": (
        "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token }}|{{ tools }}|{{ documents }}"
        "|{{ add_generation_prompt }}|{{ foo }}",
        USER,
        QWEN_TOKENS,
        {},
        "<|endoftext|>|<|im_end|>|<|endoftext|>||None|None|False|",
    ),
    "D4 kwargs win": (
        "{{ bos_token }}|{{ eos_token }}|{{ foo }}",
        USER,
        QWEN_TOKENS,
        {"foo": [1, "x", None, True], "bos_token": "OVR"},
        "OVR|<|im_end|>|[1, 'x', None, True]",
    ),
    "D5 tojson raw unicode and html": (
        "{{ x|tojson }}",
        USER,
        {},
        {"x": {"a": "é<>&'", "b": [1, 2.0, None, True]}},
        '{"a": "é<>&\'", "b": [1, 2.0, null, true]}',
    ),
    "D6 tojson indent": (
        "{{ x|tojson(indent=2) }}",
        USER,
        {},
        {"x": {"a": [1, {"b": 2}], "c": {}}},
        '{\n  "a": [\n    1,\n    {\n      "b": 2\n    }\n  ],\n  "c": {}\n}',
    ),
    "D7 tojson sort_keys": ("{{ x|tojson(sort_keys=true) }}", USER, {}, {"x": {"b": 1, "a": 2}}, '{"a": 2, "b": 1}'),
    "D7 tojson separators": (
        "{{ x|tojson(separators=(',', ':')) }}",
        USER,
        {},
        {"x": {"b": 1, "a": [1, 2]}},
        '{"b":1,"a":[1,2]}',
    ),
    "D7 tojson positional is ensure_ascii": ("{{ 'é'|tojson(4) }}", USER, {}, {}, '"\\u00e9"'),
    "D8 python reprs": (
        "{{ x }}|{{ y }}|{{ z }}",
        USER,
        {},
        {"x": {"a": 1, "b": [1, "s", None, True, 1.5]}, "y": 1e20, "z": 1.5e-07},
        "{'a': 1, 'b': [1, 's', None, True, 1.5]}|1e+20|1.5e-07",
    ),
    "D9 namespace": (
        "{% set ns = namespace(found=false) %}{% for m in messages %}{% set ns.found = true %}{% endfor %}"
        "{{ ns.found }}",
        USER,
        {},
        {},
        "True",
    ),
    "D15 dict global": (
        "{{ dict.fromkeys(['a','b'], 0) }}|{{ dict(a=1, b=2) }}|{{ dict([('a', 1)]) }}",
        USER,
        {},
        {},
        "{'a': 0, 'b': 0}|{'a': 1, 'b': 2}|{'a': 1}",
    ),
    "D17 None keys dropped": (
        "{{ messages[0] | tojson }}|{{ messages[0].content }}",
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": {"a": None}}}],
                "x": {"y": None},
            }
        ],
        {},
        {},
        '{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": null}}}], '
        '"x": {"y": null}}|',
    ),
    "D19 reasoning alias": (
        "{{ messages[0] | tojson }}",
        [{"role": "assistant", "content": "c", "reasoning": "r"}],
        {},
        {},
        '{"thinking": "r", "role": "assistant", "content": "c", "reasoning": "r", "reasoning_content": "r"}',
    ),
    "D19 own thinking wins": (
        "{{ messages[0] | tojson }}",
        [{"role": "assistant", "content": "c", "thinking": "A", "reasoning_content": "B"}],
        {},
        {},
        '{"thinking": "A", "role": "assistant", "content": "c", "reasoning_content": "B"}',
    ),
    "D19 None reasoning skipped": (
        "{{ messages[0] | tojson }}",
        [{"role": "assistant", "content": "c", "reasoning_content": None, "thinking": "T"}],
        {},
        {},
        '{"thinking": "T", "role": "assistant", "content": "c", "reasoning_content": "T"}',
    ),
    "D23 empty tools list": ("{{ tools }}|{{ tools is none }}", USER, {}, {"tools": []}, "[]|False"),
    "D36 python string methods": (
        "{{ 'a b c'.rsplit(' ', 1) }}|{{ x|indent(4) }}|{{ 'ab' is sequence }}",
        USER,
        {},
        {"x": "a\n\nb\n"},
        "['a b', 'c']|a\n\n    b\n|True",
    ),
    "D26 continue with content parts": (
        "{% for m in messages %}<{{m.role}}>{% for c in m.content %}{% if c.type == 'text' %}{{ c.text }}"
        "{% else %}[{{c.type}}]{% endif %}{% endfor %}</s>{% endfor %}",
        [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "first"},
                    {"type": "text", "text": "It is the sound of"},
                    {"type": "image"},
                ],
            },
        ],
        {},
        {"continue_final_message": True},
        "<user>hi</s><assistant>firstIt is the sound of",
    ),
    "T4 loop controls": (
        '{%- for message in messages %}\n    {{- message.role + " " + message.content }}\n    {%- if loop.first %}\n'
        "        {%- break %}\n    {%- endif %}\n{%- endfor %}",
        [{"role": "system", "content": "1"}, {"role": "user", "content": "2"}, {"role": "assistant", "content": "3"}],
        {},
        {},
        "system 1",
    ),
    "T8 continue final message": (
        CHATML,
        CONV,
        {},
        {"continue_final_message": True},
        "<|im_start|>system\nsystem message<|im_end|>\n<|im_start|>user\nuser message<|im_end|>\n"
        "<|im_start|>assistant\nassistant message",
    ),
    "T9 continue with trim": (
        CHATML_TRIM,
        [*CONV[:2], {"role": "assistant", "content": "assistant message "}],
        {},
        {"continue_final_message": True},
        "<|im_start|>system\nsystem message<|im_end|>\n<|im_start|>user\nuser message<|im_end|>\n"
        "<|im_start|>assistant\nassistant message",
    ),
    "D28 continue keeps the space": (
        CHATML,
        [*CONV[:2], {"role": "assistant", "content": "assistant message "}],
        {},
        {"continue_final_message": True},
        "<|im_start|>system\nsystem message<|im_end|>\n<|im_start|>user\nuser message<|im_end|>\n"
        "<|im_start|>assistant\nassistant message ",
    ),
    "T10 decoy earlier message": (
        CHATML_TRIM,
        [
            {"role": "user", "content": "hi 0"},
            {"role": "assistant", "content": "bye: 0"},
            {"role": "user", "content": "hi 1"},
            {"role": "assistant", "content": "bye: "},
        ],
        {},
        {"continue_final_message": True},
        "<|im_start|>user\nhi 0<|im_end|>\n<|im_start|>assistant\nbye: 0<|im_end|>\n<|im_start|>user\nhi 1<|im_end|>\n"
        "<|im_start|>assistant\nbye:",
    ),
    "D27 continue reasoning": (
        "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
        "{% endif %}{{ m.content }}{% endfor %}",
        [
            {"role": "user", "content": "1+1?"},
            {"role": "assistant", "reasoning_content": "The user wants a simple addition. ", "content": ""},
        ],
        {},
        {"continue_final_message": "reasoning_content"},
        "<user>1+1?<assistant><think>The user wants a simple addition. ",
    ),
    "strftime_now pinned": ("{{ strftime_now('%Y-%m-%d %H:%M') }}", USER, {}, {}, "2026-11-29 12:00"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_documented_behaviour(name: str) -> None:
    source, messages, tokens, kwargs, expected = CASES[name]
    assert render(source, messages, tokens, **kwargs) == expected
    if transformers_available():
        assert reference_render(source, tokens, messages, now=NOW, **kwargs) == (expected, None)


ERRORS: dict[str, tuple[str, Any, dict[str, Any], type[Exception], str]] = {
    "D10 raise_exception verbatim": (
        "{{ raise_exception('Only user and assistant roles are supported!') }}",
        USER,
        {},
        TemplateRaisedError,
        "Only user and assistant roles are supported!",
    ),
    "D11 namespace underscore at construction": (
        "{% set ns = namespace(_x=1) %}",
        USER,
        {},
        SandboxError,
        "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '_x'.",
    ),
    "D11 namespace underscore on set": (
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        USER,
        {},
        SandboxError,
        "but got '_x'",
    ),
    "D12 list mutation": (
        "{{ messages.append(4) }}",
        USER,
        {},
        SandboxError,
        "access to attribute 'append' of 'list' object is unsafe.",
    ),
    "D12 dict mutation": (
        "{% set _ = messages[0].update({'a': 1}) %}",
        USER,
        {},
        SandboxError,
        "access to attribute 'update' of 'dict' object is unsafe.",
    ),
    "D13 no do tag": ("{% do messages.append(1) %}", USER, {}, TemplateSyntaxError, "Encountered unknown tag 'do'."),
    "D13 no include": ("{% include 'x' %}", USER, {}, TemplateRuntimeError, "no loader for this environment specified"),
    "D16 tojson of undefined": (
        "{{ nope|tojson }}",
        USER,
        {},
        TemplateRuntimeError,
        "Object of type Undefined is not JSON serializable",
    ),
    "D16 undefined attribute chain": (
        "{{ x.y.z }}",
        USER,
        {"x": {}},
        TemplateRuntimeError,
        "'dict object' has no attribute 'y'",
    ),
    "D20 non-dict message": (
        SIMPLE,
        ["hello"],
        {},
        InputError,
        "Chat messages should be dicts, dataclasses or pydantic models, but got 'hello'",
    ),
    "D21 empty conversation": (
        SIMPLE,
        [],
        {},
        InputError,
        "Cannot apply chat template to an empty conversation. Provide at least one message.",
    ),
    "D23 tools of the wrong kind": (SIMPLE, USER, {"tools": ["x"]}, InputError, "Tools should either be a JSON schema"),
    "D23 documents of the wrong kind": (
        SIMPLE,
        USER,
        {"documents": ["x"]},
        InputError,
        "Documents should be a list of dicts with 'title' and 'text' keys!",
    ),
    "D25 continue with a generation prompt": (
        CHATML,
        CONV,
        {"continue_final_message": True, "add_generation_prompt": True},
        InputError,
        "continue_final_message and add_generation_prompt are not compatible.",
    ),
    "D25 continue without content": (
        CHATML,
        [*CONV[:2], {"role": "assistant", "content": None}],
        {"continue_final_message": True},
        InputError,
        'continue_final_message is set but the final message has no "content" to continue!',
    ),
    "D25 continue a field the template lacks": (
        "{% for m in messages %}{{ m.role }}{% endfor %}",
        CONV,
        {"continue_final_message": True},
        InputError,
        'continue_final_message is set to "content" but this is not an accepted field in the chat_template',
    ),
    "D25 template drops the content": (
        "{% for m in messages %}{{ m.role }}{{ m.content|upper }}{% endfor %}",
        CONV,
        {"continue_final_message": True},
        InputError,
        "continue_final_message is set but the final message does not appear in the chat",
    ),
    "D26 nothing to continue": (
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        [{"role": "assistant", "content": [{"type": "image"}]}],
        {"continue_final_message": True},
        InputError,
        "continue_final_message is set but we could not find any text to continue in the final message!",
    ),
    "D36 python comparison": ("{{ 'a' < 1 }}", USER, {}, TemplateRuntimeError, "'<' not supported"),
    "range over MAX_RANGE": (
        "{{ range(200000)|length }}",
        USER,
        {},
        Exception,
        "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).",
    ),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_documented_errors(name: str) -> None:
    source, messages, kwargs, error, text = ERRORS[name]
    with pytest.raises(error) as caught:
        render(source, messages, **kwargs)
    assert text in str(caught.value)
    if transformers_available():
        _, reference_error = reference_render(source, {}, messages, now=NOW, **kwargs)
        assert reference_error is not None and text in reference_error


def test_raise_exception_text_is_verbatim_and_located() -> None:
    template = ChatTemplate("line one\n{{ raise_exception('No system role, sorry.') }}", name="strict")
    with pytest.raises(TemplateRaisedError) as caught:
        template.render(USER)
    assert caught.value.message == "No system role, sorry."
    assert caught.value.template_name == "strict" and caught.value.lineno == 2
    assert str(caught.value) == "No system role, sorry. (template 'strict', line 2)"


def test_runtime_errors_name_the_template_line() -> None:
    template = ChatTemplate("a\nb\n{{ messages[0].content + 1 }}", name="adder")
    with pytest.raises(TemplateRuntimeError) as caught:
        template.render(USER)
    assert caught.value.python_type == "TypeError"
    assert caught.value.lineno == 3
    assert 'can only concatenate str (not "int") to str' in str(caught.value)


def test_syntax_errors_surface_when_loading() -> None:
    with pytest.raises(TemplateSyntaxError) as caught:
        ChatTemplate("{% for m in messages %}\n{{ m.content }", name="broken")
    assert caught.value.lineno == 2 and "broken" in str(caught.value)


class Color(str, enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Message:
    role: str
    content: Any


class Dumpable:
    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    def model_dump(self) -> dict[str, Any]:
        return dict(self.fields)


def test_inputs_become_plain_json() -> None:
    """§5.3: objects become dicts, subclasses their base type, anything else a "<Type>" placeholder."""
    messages = [
        Message("user", [{"type": "text", "text": Color.RED}]),
        Dumpable(role="assistant", content=OrderedDict(a=1), extra={1, 2}, when=datetime.date(2024, 1, 2), t=(1, [2])),
    ]
    source = "{% for m in messages %}{{ m }}\n{% endfor %}{{ d }}|{{ f }}|{{ b }}"
    kwargs = {"d": datetime.date(2024, 1, 2), "f": len, "b": b"x"}
    expected = (
        "{'role': 'user', 'content': [{'type': 'text', 'text': 'red'}]}\n"
        "{'role': 'assistant', 'content': {'a': 1}, 'extra': '<set>', 'when': '<date>', 't': (1, [2])}\n"
        "<date>|<builtin_function_or_method>|<bytes>"
    )
    assert render(source, messages, **kwargs) == expected
    if transformers_available():
        assert reference_render(source, {}, messages, now=NOW, **kwargs) == (expected, None)


def test_callers_messages_are_never_changed() -> None:
    messages = [{"role": "assistant", "content": "open ", "reasoning": "r", "gone": None}]
    snapshot = repr(messages)
    render(CHATML, messages, continue_final_message=True)
    assert repr(messages) == snapshot
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "open"}, {"type": "image"}]}]
    snapshot = repr(parts)
    render("{{ messages[0].content[0].text }}", parts, continue_final_message=True)
    assert repr(parts) == snapshot


def test_callable_tools_become_schemas() -> None:
    def get_weather(location: str, unit: str = "celsius"):  # type: ignore[no-untyped-def]  # no return: as in §2.4
        """Get the weather.

        Args:
            location: The city
            unit: The unit (choices: ["celsius", "fahrenheit"])
        """

    expected = (
        '[{"type": "function", "function": {"name": "get_weather", "description": "Get the weather.", "parameters": '
        '{"type": "object", "properties": {"location": {"type": "string", "description": "The city"}, "unit": '
        '{"type": "string", "enum": ["celsius", "fahrenheit"], "description": "The unit"}}, '
        '"required": ["location"]}}}, '
        '{"type": "function", "function": {"name": "x"}}]'
    )
    tools = [get_weather, {"type": "function", "function": {"name": "x"}}]
    assert render("{{ tools|tojson }}", tools=tools) == expected


NAMED = {"default": "D", "tool_use": "T", "rag": "R"}


def test_named_templates_are_chosen_as_transformers_chooses() -> None:
    """D30: default without tools, tool_use with tools (even an empty list), any name on request."""
    template = ChatTemplate(NAMED, name="multi")
    assert template.render(USER) == "D"
    assert template.render(USER, tools=[]) == "T"
    assert template.render(USER, tools=[{"type": "function", "function": {"name": "f"}}]) == "T"
    assert template.render(USER, chat_template="rag") == "R"
    with pytest.raises(TemplateNotFoundError, match="no chat template named 'nonexistent'"):
        template.render(USER, chat_template="nonexistent")
    with pytest.raises(InputError, match=r"Available template names are \['rag', 'tool_use'\]"):
        ChatTemplate({"rag": "R", "tool_use": "T"}).render(USER)


def test_now_defaults_to_local_time() -> None:
    before = datetime.datetime.now()
    rendered = ChatTemplate("{{ strftime_now('%Y-%m-%d %H:%M:%S') }}").render(USER)
    after = datetime.datetime.now()
    stamp = datetime.datetime.strptime(rendered, "%Y-%m-%d %H:%M:%S")
    assert before.replace(microsecond=0) <= stamp <= after


def test_generation_spans_match_transformers_verified_offsets() -> None:
    """§2.8: spans of {% generation %} blocks, including the macro trap transformers has."""
    gen = (
        "{% for message in messages %}{% if (message['role'] != 'assistant') %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% elif (message['role'] == 'assistant')%}{{'<|im_start|>' + message['role'] + '\n'}}"
        "{% generation %}{{message['content'] + '<|im_end|>'}}{% endgeneration %}{{'\n'}}{% endif %}{% endfor %}"
    )
    chat = [
        {"role": "system", "content": "system message"},
        {"role": "user", "content": "user message"},
        {"role": "assistant", "content": "start turn 1 assistant message. end turn 1"},
        {"role": "user", "content": "user message 2"},
        {"role": "assistant", "content": "start turn 2 assistant message. end turn 2"},
    ]
    text, spans = ChatTemplate(gen).render_spans(chat)
    assert spans == [(106, 158), (223, 275)]
    assert text[106:158] == "start turn 1 assistant message. end turn 1<|im_end|>"

    macro = (
        "{% macro turn(m) %}<{{ m.role }}>{% generation %}{{ m.content }}{% endgeneration %}</>{% endmacro %}"
        "{% for m in messages %}{{ turn(m) }}{% endfor %}"
    )
    pair = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]
    assert ChatTemplate(macro).render_spans(pair)[1] == [(0, 5), (14, 19)]


class _Str(str):
    pass


def test_plainness_verdicts_kept_by_marshal_bytes_are_the_walks() -> None:
    """Values marshal writes alike get the same verdict: a plain one and its look-alikes that are not
    (a tuple, a subclass, bytes against bytearray, an int key) each get their own, the second time too."""
    from chatcodec import render

    schema = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": ["a"]}}}
    values = [
        [schema],
        [{**schema, "function": {**schema["function"], "parameters": {"required": ("a",)}}}],
        [{"name": _Str("f")}],
        [{"a": b"x"}],
        [{"a": bytearray(b"x")}],
        [{1: "a"}],
        [{"a": [1, 2.5, None, True, {"b": "c"}]}],
        [{"a": {1, 2}}],
    ]
    expected = [True, False, False, False, False, False, True, False]
    for _ in range(2):  # the second round reads the verdicts kept
        assert [render._known_plain(value) for value in values] == expected
        assert [render._all_plain(value) for value in values] == expected
    rendered = ChatTemplate("{{ tools[0].function.parameters.required }}").render(
        [{"role": "user", "content": "hi"}], tools=values[1]
    )
    assert rendered == "('a',)"  # copied, a tuple still, as transformers' conversion copies it (parity §5.3)
