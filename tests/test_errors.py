"""Template errors caused by a message's shape name the message and the field, and say what to do."""

from __future__ import annotations

import copy

import pytest

from chatcodec import ChatTemplate, TemplateRaisedError, TemplateRuntimeError

from .conftest import conversations, manifest, require_shared, template_source


def _corpus(name: str) -> ChatTemplate:
    require_shared()
    entry = manifest()[name]
    return ChatTemplate(template_source(name), special_tokens=entry["special_tokens"], name=name)


CASES = [
    # (template, conversation, what the error must say after Jinja's own words)
    (
        "Qwen-QwQ-32B",
        "tools_null_content_string_args",
        "'dict object' has no attribute 'content': message 1 (assistant) has \"content\": null",
    ),
    (
        "HuggingFaceTB-SmolLM3-3B",
        "content_parts",
        "'list object' has no attribute 'replace': message 0 (system) has its content as a list of parts",
    ),
    (
        "GLM-4.7-Flash",
        "tools_null_content_string_args",
        "'str object' has no attribute 'items': message 1 (assistant) tool_calls[0] arguments are a JSON string",
    ),
]


@pytest.mark.parametrize(("template", "conversation", "message"), CASES, ids=[c[0] for c in CASES])
def test_shape_errors_point_at_the_message_and_suggest_the_polyfill(
    template: str, conversation: str, message: str
) -> None:
    chat = _corpus(template)
    conv = conversations()[conversation]
    with pytest.raises(TemplateRuntimeError) as caught:
        chat.render(copy.deepcopy(conv["messages"]), tools=conv["tools"], add_generation_prompt=True)
    text = str(caught.value)
    assert text.startswith(message)
    assert 'or render with polyfill="auto"' in text and f"(template '{template}', line " in text
    assert "\n" not in text
    # the suggestion works
    assert chat.render(conv["messages"], tools=conv["tools"], add_generation_prompt=True, polyfill="auto")


def test_object_arguments_where_a_string_is_wanted() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ 'call: ' + c.function.arguments }}"
        "{% endfor %}{% endfor %}"
    )
    messages = conversations()["tools_single_call"]["messages"]  # arguments as objects, as transformers prefers
    with pytest.raises(TemplateRuntimeError, match=r'\(not "dict"\) to str: message 1 \(assistant\) tool_calls\[0\]'):
        template.render(messages)


def test_errors_the_template_raises_itself_are_left_as_they_are() -> None:
    template = ChatTemplate("{{ raise_exception('No system, please') }}")
    with pytest.raises(TemplateRaisedError) as caught:
        template.render([{"role": "system", "content": None}])
    assert caught.value.message == "No system, please"


def test_a_missing_field_that_is_not_a_shape_problem_is_not_blamed_on_a_message() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.meta.author + '!' }}{% endfor %}")
    with pytest.raises(TemplateRuntimeError) as caught:
        template.render([{"role": "user", "content": "x", "meta": {}}])
    assert caught.value.message == "'dict object' has no attribute 'author'"


def test_content_missing_altogether_is_pointed_at() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.role + ': ' + m.content }}{% endfor %}")
    with pytest.raises(TemplateRuntimeError, match=r'message 1 \(assistant\) has no "content", and this template'):
        template.render([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": []}])
