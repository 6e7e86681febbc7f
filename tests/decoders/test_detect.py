"""Detection over every corpus template: the decoder it picks reads the template's own tool calls back.

For each template, the corpus's tool-call conversations are rendered up to the assistant's tool-call
turn; the text after the generation prompt is what the model would have written. The decoder from
``decoder_for(template)`` must turn it back into exactly those calls. A template that cannot render a
tool-call turn at all is listed in ``NO_RENDERED_CALLS`` with the reason; for those the test checks
that no rendering really shows a call, and that detection fell back to the template source.
"""

from __future__ import annotations

import json
import warnings
from datetime import datetime
from typing import Any

import pytest

from chatcodec import ChatTemplate
from chatcodec.decoders import decoder, formats
from chatcodec.decoders.catalog import DETECTION_ORDER
from chatcodec.decoders.detect import decoder_for, detect, detect_format
from chatcodec.decoders.prompt import prompt_state
from chatcodec.decoders.registry import get_format
from chatcodec.exceptions import ChatcodecError, DecodeWarning

from ..conftest import CORPUS, conversations, manifest, require_shared, template_source

NOW = datetime(2026, 11, 29, 12, 0, 0)
CALL_CONVERSATIONS = ("tools_single_call", "tools_null_content_string_args", "tools_roundtrip_short_ids")

#: templates with no rendering of a tool-call turn, what their instructions or source say instead, and why
NO_RENDERED_CALLS: dict[str, tuple[str, str, str]] = {
    "Kimi-K2-Instruct": (
        "kimi_k2",
        "source",
        "the template calls list.append, which the sandbox refuses (so does "
        "transformers'); its source writes <|tool_calls_section_begin|> sections",
    ),
    "Kimi-K2-Thinking": ("kimi_k2", "source", "as Kimi-K2-Instruct"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": (
        "deepseek_r1",
        "source",
        "renders calls only when content is None, a key transformers drops; its source writes "
        "V3-style fenced calls and handles </think>",
    ),
    "ibm-granite-granite-3.3-2B-Instruct": (
        "granite",
        "instructions",
        "ignores assistant tool_calls; its tool instructions ask for <|tool_call|> and a JSON list",
    ),
}


def corpus_names() -> list[str]:
    if not CORPUS.is_dir():
        return ["no-shared-corpus"]
    return sorted(manifest())


def load(name: str) -> ChatTemplate:
    require_shared()
    entry = manifest()[name]
    return ChatTemplate(template_source(name), special_tokens=entry["special_tokens"], name=name)


def turn_text(template: ChatTemplate, messages: list[dict[str, Any]], tools: Any) -> str | None:
    """The template's rendering of ``messages[-1]`` (an assistant turn), role header included.

    History is not a generation (the generation prompt may open a think block the history never
    shows), so this is decoded from the start of the turn, outside reasoning; the header is content.
    """
    try:
        full = template.render(messages, tools=tools, now=NOW)
        before = template.render(messages[:-1], tools=tools, now=NOW)
    except ChatcodecError:
        return None
    common = 0
    while common < min(len(full), len(before)) and full[common] == before[common]:
        common += 1
    return full[common:]


def wire_form(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same turn as an OpenAI client sends it: arguments as JSON strings, content a string."""
    *history, turn = messages
    calls = [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
        if not isinstance(c["function"]["arguments"], str)
        else c
        for c in turn["tool_calls"]
    ]
    return [*history, {**turn, "content": turn.get("content") or "", "tool_calls": calls}]


def tool_turns(template: ChatTemplate) -> list[tuple[str, list[dict[str, Any]]]]:
    """(turn text, expected calls) for each corpus tool-call conversation the template renders.

    Each conversation is tried as written and in OpenAI wire form: some templates only accept
    argument strings (DeepSeek V3.1, Functionary v3.2), and Apriel renders dict arguments with repr().
    """
    found = []
    for conv_id in CALL_CONVERSATIONS:
        conv = conversations()[conv_id]
        end = next(i for i, m in enumerate(conv["messages"]) if m.get("tool_calls")) + 1
        for messages in (conv["messages"][:end], wire_form(conv["messages"][:end])):
            text = turn_text(template, messages, conv["tools"])
            if text is not None:
                found.append((text, _calls(messages)))
    return found


def _calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    calls = []
    for call in messages[-1]["tool_calls"]:
        args = call["function"]["arguments"]
        calls.append(
            {
                "id": call["id"],
                "name": call["function"]["name"],
                "arguments": json.loads(args) if isinstance(args, str) else args,
            }
        )
    return calls


def decodes(fmt_decoder: Any, text: str, calls: list[dict[str, Any]]) -> bool:
    message = fmt_decoder.decode(text)
    got = [(c.name, c.arguments, c.error) for c in message.tool_calls]
    return got == [(c["name"], c["arguments"], None) for c in calls]


@pytest.mark.parametrize("name", corpus_names())
def test_detected_decoder_reads_the_templates_own_calls(name: str) -> None:
    template = load(name)
    found = detect(template)
    assert found.format in formats() or found.how == "learned"
    turns = tool_turns(template)
    showing = [(text, calls) for text, calls in turns if calls[0]["name"] in text]
    if name in NO_RENDERED_CALLS:
        expected, evidence, _reason = NO_RENDERED_CALLS[name]
        assert (found.how, found.evidence, found.format) == ("catalog", evidence, expected)
        assert not showing, "this template does render a call now: remove it from NO_RENDERED_CALLS"
        return
    if found.how == "fallback":
        # No tool-call syntax anywhere: its renderings must not show the calls either.
        assert found.format == "content" and not showing
        return
    assert found.evidence == "rendered"
    d = decoder_for(template, thinking_forced_open=False)
    assert any(decodes(d, text, calls) for text, calls in showing), [t for t, _ in showing]


@pytest.mark.parametrize("name", corpus_names())
def test_generation_prompt_sets_the_reasoning_state(name: str) -> None:
    """The decoder starts in reasoning exactly when the rendered generation prompt left a think block open."""
    template = load(name)
    fmt = detect_format(template)
    user = [{"role": "user", "content": "Hi"}]
    for kwargs in ({}, {"enable_thinking": True}, {"enable_thinking": False}):
        try:
            prompt = template.render(user, add_generation_prompt=True, now=NOW, **kwargs)
            history = template.render(user, now=NOW, **kwargs)
        except ChatcodecError:
            continue
        common = 0
        while common < min(len(prompt), len(history)) and prompt[common] == history[common]:
            common += 1
        state = prompt_state(prompt[common:], get_format(fmt).think)  # the generation prompt itself
        d = decoder_for(template, **kwargs)
        if state is not None:
            assert d.options.forced_open == (state == "open"), (kwargs, prompt[common:])
        assert decoder_for(template, prompt=prompt, **kwargs).options.forced_open == d.options.forced_open


def test_reasoning_turn_round_trip() -> None:
    """A rendered reasoning turn, read after the generation prompt, gives its reasoning back.

    Checked where the rendered turn extends the generation prompt exactly (elsewhere history and
    generation differ, e.g. a prompt that opens <think> and history that drops past reasoning).
    """
    require_shared()
    conv = conversations()["reasoning_final_turn"]
    reasoning = conv["messages"][-1]["reasoning_content"]
    checked = 0
    for name in sorted(manifest()):
        template = load(name)
        try:
            full = template.render(conv["messages"], now=NOW)
            prompt = template.render(conv["messages"][:-1], add_generation_prompt=True, now=NOW)
        except ChatcodecError:
            continue
        if not full.startswith(prompt) or reasoning not in full[len(prompt) :]:
            continue
        if decoder(detect_format(template)).format.think is None:
            continue
        message = decoder_for(template).decode(full[len(prompt) :])
        assert message.reasoning_content == reasoning, (name, full[len(prompt) :])
        checked += 1
    assert checked >= 8


def test_detection_order_lists_known_formats_once() -> None:
    assert len(DETECTION_ORDER) == len(set(DETECTION_ORDER))
    assert set(DETECTION_ORDER) <= set(formats())
    assert {name for name in formats() if get_format(name).rank is not None} == set(DETECTION_ORDER)


def test_decoder_for_uses_the_real_prompt_when_given() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}<tool_call></tool_call>")
    assert decoder_for(template, prompt="<|im_start|>assistant\n<think>\n").options.forced_open
    assert not decoder_for(template, prompt="<|im_start|>assistant\n<think>\n\n</think>\n\n").options.forced_open


def test_builtin_templates_detect() -> None:
    from chatcodec import builtin_templates, load_template

    for name in builtin_templates():
        found = detect(load_template(name))
        assert found.format in formats(), name
        if found.evidence == "rendered":
            assert decoder(found.format).decode(found.rendered).tool_calls, name


TOOLS_ONLY = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"


def test_decoder_for_warns_when_a_template_that_renders_tools_falls_back() -> None:
    """No call syntax, no instructions, no markers: output is content, and the caller is told so."""
    template = ChatTemplate(TOOLS_ONLY, name="tools-only")
    with pytest.warns(DecodeWarning, match="No tool-call format found for template 'tools-only', which renders tools"):
        d = decoder_for(template)
    assert d.format.name == "content" and (detect(template).how, detect(template).evidence) == ("fallback", "none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert decoder_for("chatml").format.name == "content"  # renders no tools: nothing to warn about


def test_detection_reports_how_and_evidence() -> None:
    assert (detect("qwen3").how, detect("qwen3").evidence) == ("catalog", "rendered")
    assert "<tool_call>" in detect("qwen3").rendered
