"""Round trip on every template: what a template writes for tool calls, ``decoder_for(template)`` reads back.

For each template (the corpus, the built-ins, the templates of ``data/templates/`` whose tool-call
syntax no catalog format knows, and mistral-common's own templates for each tokenizer version in
``data/mistral_templates/``), a user turn is rendered with the generation prompt, then the same
conversation with one tool call and with two parallel calls. What the call turn adds after the
generation prompt is the model's continuation; it must decode to exactly those calls.

Where the history turn does not extend the generation prompt (the prompt opens a think block that
history drops, as QwQ does), the continuation is the history turn from where the two part, after a
short reasoning closed with the format's end tag: what a model thinking first would write.

Templates that do not write calls out faithfully (a call's name or argument values missing from the
rendering, or no rendering at all) are left out; ``LEFT_OUT`` lists each with its reason, and the test
checks that list against what the templates actually do, so it cannot silently grow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from chatcodec import ChatTemplate, builtin_templates, load_template
from chatcodec.decoders import decoder_for, detect
from chatcodec.decoders.prompt import end_markers
from chatcodec.exceptions import ChatcodecError

from ..conftest import CORPUS, conversations, manifest, template_source
from .helpers import as_streamed, rebuild

DATA = Path(__file__).parent / "data" / "templates"
MISTRAL = Path(__file__).parent / "data" / "mistral_templates"
NOW = datetime(2026, 1, 1, 12, 0, 0)
USER = {"role": "user", "content": "What are the weather in Paris and the time in Tokyo?"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "A city."},
                    "unit": {"type": "string", "description": "celsius or fahrenheit."},
                    "hours": {"type": "integer", "description": "Hours ahead."},
                },
                "required": ["location"],
            },
        },
    }
    for name, description in (("lookup_weather", "The weather somewhere."), ("lookup_time", "The time somewhere."))
]
ONE = [("lookup_weather", {"location": "Lyon", "unit": "celsius"}, "k7Hq2Zp9W")]
TWO = [*ONE, ("lookup_time", {"location": "Osaka", "hours": 4}, "m3Rt8Yv1B")]

#: templates left out of the round trip, and why (checked below against what they render)
LEFT_OUT: dict[str, str] = {
    # no tool calls in their history turns at all
    **dict.fromkeys(
        [
            "chujiezheng-alpaca",
            "chujiezheng-amberchat",
            "chujiezheng-chatml",
            "chujiezheng-falcon-instruct",
            "chujiezheng-gemma-it",
            "chujiezheng-llama-2-chat",
            "chujiezheng-mistral-instruct",
            "chujiezheng-openchat-3.5",
            "chujiezheng-phi-3",
            "chujiezheng-phi-3-small",
            "chujiezheng-vicuna",
            "chujiezheng-zephyr",
            "google-gemma-2-2b-it",
            "lenml-gemma3",
            "lenml-llama3",
            "lenml-llama3_1",
            "microsoft-Phi-3.5-mini-instruct",
            "HuggingFaceTB-SmolLM3-3B",
            "ibm-granite-granite-3.3-2B-Instruct",
            "builtin:chatml",
            "builtin:llama2",
            "builtin:gemma",
            "builtin:phi-3",
            "new:instructions_only",
            "new:xml_tools_variable",
        ],
        "the template writes no tool calls in a history turn",
    ),
    "Kimi-K2-Instruct": "the template calls list.append, which the sandbox refuses (transformers' does too)",
    "Kimi-K2-Thinking": "the template calls list.append, which the sandbox refuses (transformers' does too)",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "renders calls only when content is None, a key transformers drops",
    "builtin:deepseek-r1": "renders calls only when content is None, a key transformers drops",
}


def all_templates() -> Iterator[tuple[str, ChatTemplate]]:
    if CORPUS.is_dir():
        for name in sorted(manifest()):
            entry = manifest()[name]
            yield name, ChatTemplate(template_source(name), special_tokens=entry["special_tokens"], name=name)
    for name in builtin_templates():
        yield f"builtin:{name}", load_template(name)
    for path in sorted(DATA.glob("*.jinja")):
        yield f"new:{path.stem}", load_template(path)
    for path in sorted(MISTRAL.glob("*.jinja")):
        yield f"mistral-common:{path.stem}", load_template(path)


def message(calls: list[tuple[str, dict[str, Any], str]], content: str | None, as_text: bool) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a) if as_text else a}}
            for n, a, i in calls
        ],
    }


def render(template: ChatTemplate, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    try:
        return template.render(messages, tools=TOOLS, now=NOW, **kwargs)
    except ChatcodecError:
        return None


def faithful(text: str, history: str, calls: list[tuple[str, dict[str, Any], str]]) -> bool:
    """Each call's name and argument values appear in the turn (beyond what the history shows)."""
    turn = text[len(history) :] if text.startswith(history) else text
    return all(name in turn and all(str(v) in turn for v in args.values()) for name, args, _ in calls)


def call_turn(template: ChatTemplate, calls: list[tuple[str, dict[str, Any], str]]) -> str | None:
    """The template's rendering of a conversation ending in the call turn, in the first form it takes."""
    history = render(template, [USER]) or ""
    for content in ("", None):
        for as_text in (False, True):
            text = render(template, [USER, message(calls, content, as_text)])
            if text is not None and faithful(text, history, calls):
                return text
    return None


def continuation(template: ChatTemplate, prompt: str, turn: str, calls: list[tuple[str, Any, str]]) -> str:
    """What the model writes after ``prompt`` to produce ``turn`` (see the module docstring).

    A model stops at its end-of-turn token: whatever the template writes after it (a generation
    header for the tool results, a trailing system turn) is not part of the answer.
    """
    text, header = _after_prompt(template, prompt, turn)
    last = max(text.rfind(str(piece)) for name, args, _ in calls for piece in (name, *args.values()))
    ends = [k + len(end) for end in end_markers(template) if (k := text.find(end, last)) >= 0]
    opener = re.match(r"\s*(<[^<>]+>|\[[^\[\]]+\])", header)
    if opener and (k := text.find(opener.group(1), last)) >= 0:
        ends.append(k)  # the next turn begins: this one has ended
    return text[: min(ends)] if ends else text


def _after_prompt(template: ChatTemplate, prompt: str, turn: str) -> tuple[str, str]:
    """The turn's text after the generation prompt, and the assistant header they share."""
    if turn.startswith(prompt):
        return turn[len(prompt) :], ""
    # The history turn and the generation prompt share the assistant header, not always at the same
    # place (Command R+ puts a system turn before its header in the prompt only).
    start = _common(prompt, turn)
    for opener, closer in (("<", ">"), ("[", "]")):  # never from the middle of a tag
        k = turn.rfind(opener, 0, start)
        if k >= 0 and turn.find(closer, k, start) < 0:
            start = k
    generation, rest = prompt[start:], turn[start:]
    # the header ends the generation prompt, or (a think block opened after it) begins it
    at = next((a for a in range(len(generation)) if rest.startswith(generation[a:])), 0)
    best = len(generation) - at if at else _common(generation, rest)
    for opener, closer in (("<", ">"), ("[", "]")):  # never from the middle of a tag
        k = rest.rfind(opener, 0, best)
        if k >= 0 and rest.find(closer, k, best) < 0:
            best = k
    beyond, header, rest = generation[at + best :], rest[:best], rest[best:]
    before = re.search(r"(<[^<>]+>|\[[^\[\]]+\])$", turn[:start])  # a turn marker the header continues
    header = (before.group(1) if before else "") + header
    think = detect(template).output_format.think
    if think is None:
        return rest, header
    ends = [end for end in think.end if rest.lstrip().startswith(end)]
    if decoder_for(template).options.forced_open:
        if not ends:  # the prompt opened reasoning that history drops: think briefly, then close it
            rest = "Let me look that up." + think.end[0] + "\n\n" + rest
    elif ends and ends[0] in beyond:  # the prompt already closed the block the turn closes
        rest = rest.lstrip()[len(ends[0]) :]
    return rest, header


def _common(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def cases() -> list[Any]:
    return [pytest.param(name, template, id=name) for name, template in all_templates()]


@pytest.mark.parametrize(("name", "template"), cases())
def test_round_trip(name: str, template: ChatTemplate) -> None:
    prompt = render(template, [USER], add_generation_prompt=True)
    turns = [(calls, call_turn(template, calls)) for calls in (ONE, TWO)]
    shown = [(calls, turn) for calls, turn in turns if turn is not None]
    check_conversations(name, template)
    if name in LEFT_OUT:
        assert not shown, f"{name} writes its calls now: take it out of LEFT_OUT"
        return
    assert prompt is not None and shown, f"{name} writes no call faithfully: list it in LEFT_OUT with the reason"
    d = decoder_for(template)
    for calls, turn in shown:
        assert turn is not None
        text = continuation(template, prompt, turn, calls)
        decoded = d.decode(text)
        assert [(c.name, c.arguments) for c in decoded.tool_calls] == [(n, a) for n, a, _ in calls], text
        assert not decoded.invalid_tool_calls, text
        assert decoded.content is None, text  # the end-of-turn markers are markup, not content
        want = as_streamed(decoded, text)
        for cut in range(len(text) + 1):  # streamed, cut anywhere: the same message
            stream = d.stream()
            assert rebuild(stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish(), text) == want, cut


def test_novel_templates_are_learned() -> None:
    """The templates of ``data/templates`` write syntaxes no catalog format reads: each is learned."""
    catalog = {"python_dict_args": "hermes", "xml_tools_variable": "hermes"}
    for path in sorted(DATA.glob("*.jinja")):
        found = detect(load_template(path))
        if path.stem in catalog:
            assert (found.how, found.format) == ("catalog", catalog[path.stem]), path.stem
        else:
            assert found.how == "learned" and found.learned is not None, path.stem


# -- the corpus conversations: real calls, through every template ------------------------------------

_GPT_OSS = "the template writes only the first call of a turn (tool_calls[0])"
_GEMMA4 = (
    "string arguments are written as they are inside the call's braces, where the template expects its "
    "own key:value syntax: JSON text there is no Gemma 4 call"
)
#: templates that leave out calls of a corpus conversation they render, and why (beyond ``LEFT_OUT``)
NOT_WRITTEN: dict[str, str] = {"openai-gpt-oss-120b": _GPT_OSS, "builtin:gpt-oss": _GPT_OSS}
#: (template, conversation) pairs written out whose turn does not decode to its calls, and why
NOT_DECODED: dict[tuple[str, str], str] = {
    ("google-gemma-4-31B-it", "tools_null_content_string_args"): _GEMMA4,
    ("moonshotai-Kimi-K2", "tools_null_content_string_args"): (
        "the template writes string arguments through tojson, as one JSON string literal holding the JSON "
        "text: a string where Kimi K2 writes the arguments object, read as a string and rejected"
    ),
}


def _arguments(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def conversation_round_trips(template: ChatTemplate) -> Iterator[tuple[str, str, str | None]]:
    """Each corpus conversation with tool calls, in each option set, through ``template``:
    (conversation, outcome, the continuation). The outcome is ``ok``, ``refused`` (the template raises
    for the conversation), ``not written`` (a call's name or values missing) or ``wrong``."""
    d = None
    for conv in conversations().values() if CORPUS.is_dir() else ():
        messages = [{k: v for k, v in m.items() if v is not None} for m in conv["messages"]]  # as transformers
        at = next((i for i, m in enumerate(messages) if m.get("tool_calls")), None)
        if at is None:
            continue
        calls = [(c["function"]["name"], _arguments(c["function"]["arguments"]), c.get("id", ""))
                 for c in messages[at]["tool_calls"]]  # fmt: skip
        for options in conv["option_sets"]:
            kwargs = {k: v for k, v in options.items() if k != "add_generation_prompt"}
            try:
                prompt = template.render(messages[:at], tools=conv["tools"], add_generation_prompt=True, **kwargs)
                history = template.render(messages[:at], tools=conv["tools"], **kwargs)
                turn = template.render(messages[: at + 1], tools=conv["tools"], **kwargs)
            except ChatcodecError:
                yield conv["id"], "refused", None
                continue
            if not faithful(turn, history, calls):
                yield conv["id"], "not written", None
                continue
            text = continuation(template, prompt, turn, calls)
            d = d or decoder_for(template)
            decoded = d.decode(text)
            want = [(n, a) for n, a, _ in calls]
            ok = [(c.name, c.arguments) for c in decoded.tool_calls] == want and not decoded.invalid_tool_calls
            if ok:
                stream = d.stream()  # streamed in pieces of 7 characters: the same message
                deltas = [x for k in range(0, len(text), 7) for x in stream.feed(text[k : k + 7])]
                assert rebuild(deltas + stream.finish(), text) == as_streamed(decoded, text), text
            yield conv["id"], "ok" if ok else "wrong", text


def check_conversations(name: str, template: ChatTemplate) -> None:
    """The corpus conversations' calls come back through ``template``, but for the named exceptions."""
    results = list(conversation_round_trips(template))
    unwritten = [conv for conv, outcome, _ in results if outcome == "not written"]
    if name in LEFT_OUT:
        assert {outcome for _, outcome, _ in results} <= {"refused", "not written"}, results
    elif name in NOT_WRITTEN:
        assert unwritten, f"{name} writes every call now: take it out of NOT_WRITTEN"
    else:
        assert not unwritten, f"{name} leaves out calls of {unwritten}: name the reason in NOT_WRITTEN"
    wrong = {conv: text for conv, outcome, text in results if outcome == "wrong"}
    assert set(wrong) == {conv for n, conv in NOT_DECODED if n == name}, wrong
