"""Response templates: the ones chatcodec writes, read by transformers 5.24's own parser; the ones TRL writes by
hand, read by chatcodec as transformers reads them; streaming; and the errors.

The reference is ``transformers.utils.chat_parsing.parse_response`` (a dev dependency, never imported by the
library). Two normalisations apply to its answers, both deliberate differences kept from chatcodec's other
decoders: arguments the model wrote as a JSON string (``"arguments": "{\\"x\\": 1}"``, which transformers
returns as that string) count as the object they hold, and content is compared as what chatcodec gathers
from every content region, of which transformers keeps the last.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from chatcodec import ChatTemplate, DecodeError, lint, load_template, response_template
from chatcodec.cli.response_template import insert_key
from chatcodec.decoders import decoder_for, decoder_from_response_template
from chatcodec.decoders.format import Format
from chatcodec.decoders.registry import get_format
from chatcodec.decoders.response_reader import load_response_template
from chatcodec.decoders.response_writer import UNSAID, write_response_template
from chatcodec.exceptions import ChatcodecError

from ..cli.test_render import run
from ..conftest import CORPUS, conversations, manifest, require_shared, template_source
from .helpers import VECTORS, as_streamed, need_vectors, rebuild
from .test_template_roundtrip import LEFT_OUT, NOW, continuation

chat_parsing = pytest.importorskip("transformers.utils.chat_parsing")
parse_response = chat_parsing.parse_response

TRL = json.loads((Path(__file__).parent / "data" / "trl_response_templates.json").read_text(encoding="utf-8"))
#: the corpus conversations whose assistant turn makes tool calls
CALL_CONVERSATIONS = (
    "tools_single_call",
    "tools_roundtrip",
    "tools_roundtrip_short_ids",
    "tools_null_content_string_args",
)
#: corpus templates whose calls chatcodec decodes but whose written response template transformers reads otherwise,
#: and why (the test checks this list against what happens, so it cannot silently grow)
WRITTEN_LEFT_OUT: dict[str, str] = {}


def corpus_template(name: str) -> ChatTemplate:
    return ChatTemplate(template_source(name), special_tokens=manifest()[name]["special_tokens"], name=name)


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def theirs(parsed: dict[str, Any]) -> tuple[list[tuple[str, Any]], str | None]:
    """transformers' calls (string-held JSON arguments read) and reasoning, stripped."""
    found = [c.get("function", c) if isinstance(c, dict) else {} for c in parsed.get("tool_calls", [])]
    calls = [(f.get("name"), _args(f.get("arguments"))) for f in found]
    reasoning = parsed.get("reasoning_content", parsed.get("thinking"))
    return calls, (reasoning or "").strip() or None


def ours(message: Any) -> tuple[list[tuple[str, Any]], str | None]:
    return [(c.name, c.arguments) for c in message.tool_calls], message.reasoning_content


def renderings(template: ChatTemplate) -> list[tuple[str, str, list[Any], list[tuple[str, Any]]]]:
    """``(prompt, completion, tools, calls)`` for each corpus call conversation the template renders faithfully:
    its assistant turn in the first form the template takes (content "" or absent, arguments as objects or as
    JSON text), cut to what a model writes after the prompt."""
    found = []
    for conversation_id in CALL_CONVERSATIONS:
        conversation = conversations()[conversation_id]
        tools = conversation["tools"]
        user, assistant = conversation["messages"][:2]
        calls = [(c["function"]["name"], _args(c["function"]["arguments"])) for c in assistant["tool_calls"]]
        try:
            prompt = template.render([user], tools=tools, add_generation_prompt=True, now=NOW)
        except ChatcodecError:
            continue
        for content in ("", None):
            for as_text in (False, True):
                turn = {"role": "assistant", "tool_calls": _calls_as(assistant["tool_calls"], as_text)}
                if content is not None:
                    turn["content"] = content
                try:
                    text = template.render([user, turn], tools=tools, now=NOW)
                except ChatcodecError:
                    continue
                if all(name in text and all(str(v) in text for v in args.values()) for name, args in calls):
                    found.append(
                        (prompt, continuation(template, prompt, text, [(n, a, "") for n, a in calls]), tools, calls)
                    )
                    break
            else:
                continue
            break
    return found


def _calls_as(calls: list[dict[str, Any]], as_text: bool) -> list[dict[str, Any]]:
    out = []
    for call in calls:
        args = _args(call["function"]["arguments"])
        out.append(
            {**call, "function": {"name": call["function"]["name"], "arguments": json.dumps(args) if as_text else args}}
        )
    return out


# -- what chatcodec writes, read by transformers ---------------------------------------------------------------


def test_written_templates_read_the_corpus_calls_as_transformers_does() -> None:
    require_shared()
    decoded: dict[str, list[str]] = {}  # template -> its failures (empty: transformers agrees on every rendering)
    for name in sorted(manifest()):
        if name in LEFT_OUT:  # no faithful tool-call history (the round-trip test checks those reasons)
            continue
        template = corpus_template(name)
        cases = []
        for prompt, completion, tools, calls in renderings(template):
            message = decoder_for(template, prompt=prompt, tools=tools).decode(completion)
            if ours(message)[0] == calls:  # only where chatcodec's own decoder recovers the calls
                cases.append((prompt, completion, tools, message))
        if not cases:
            continue
        try:
            written = response_template(template)
        except DecodeError as exc:
            decoded[name] = [f"not written: {exc}"]
            continue
        chat_parsing.response_templates.load_response_template(written)  # it loads in transformers
        failures = []
        for prompt, completion, tools, message in cases:
            whole_is_streamed(decoder_from_response_template(written, prompt=prompt, tools=tools), completion)
            parsed = parse_response(completion, written, prefix=prompt, tools=tools)
            if theirs(parsed) != ours(message):
                failures.append(f"{completion!r}: transformers {theirs(parsed)}, chatcodec {ours(message)}")
        decoded[name] = failures
    failing = {name: found for name, found in decoded.items() if found}
    assert len(decoded) >= 30, sorted(decoded)  # the public corpus has 34 such templates: it cannot thin out
    assert set(failing) == set(WRITTEN_LEFT_OUT), failing
    assert (len(decoded) - len(failing)) / len(decoded) >= 0.95


def test_the_written_qwen3_template_parses_a_thinking_turn() -> None:
    chat = load_template("qwen3")
    written = response_template(chat)
    prompt = chat.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    text = (
        "<think>\nThe user greets me.\n</think>\n\nHello!"
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>'
    )
    parsed = parse_response(text, written, prefix=prompt)
    assert parsed["reasoning_content"] == "The user greets me."
    assert parsed["content"] == "Hello!"
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]


def test_the_prompts_think_state_carries_over() -> None:
    require_shared()
    chat = corpus_template("Qwen3.5-4B")
    user = {"role": "user", "content": "Hi"}
    written = response_template(chat, enable_thinking=True)
    prompt = chat.render([user], add_generation_prompt=True, enable_thinking=True)
    assert prompt.endswith("<think>\n")  # the prompt opens the block: the answer starts in reasoning
    text = "Short thought.\n</think>\n\nHello!<|im_end|>"
    parsed = parse_response(text, written, prefix=prompt)
    assert (parsed["reasoning_content"], parsed["content"]) == ("Short thought.", "Hello!")
    message = decoder_from_response_template(written, prompt=prompt).decode(text)
    assert (message.reasoning_content, message.content) == ("Short thought.", "Hello!")


def test_a_format_the_language_cannot_say_is_an_error_naming_it() -> None:
    for name in ("pythonic", "generic", "learned"):
        fmt = get_format(name) if name != "learned" else Format("learned", "a learned one", get_format("content").build)
        with pytest.raises(DecodeError, match=f"{name!r} cannot be written as a response template") as caught:
            write_response_template(fmt, prompt="<|assistant|>", end_markers=(), forced_open=False)
        assert UNSAID[name] in str(caught.value)
        assert "\n" not in str(caught.value)


def test_a_template_that_writes_no_answer_cue_has_no_anchor() -> None:
    plain = ChatTemplate("{% for m in messages %}{{ m.content }}\n{% endfor %}", name="plain")
    with pytest.raises(DecodeError, match="'plain' writes nothing to ask for an answer, so a response template has no"):
        response_template(plain)


# -- what TRL writes, read by chatcodec as transformers reads it ----------------------------------------------


def whole_is_streamed(decoder: Any, text: str) -> Any:
    """``decoder.decode(text)``, checked to be exactly the message its stream gives: the one-pass whole read
    (its own delimiter searches, no second parse of the arguments) against the streaming machine. Every field
    of every call is compared; an id only where the model wrote it (a fresh one differs by design)."""
    message = decoder.decode(text)  # never raises on model output
    stream = decoder.stream()
    stream.feed(text)
    stream.finish()
    streamed = stream.message

    def fields(m: Any) -> Any:
        calls = [
            (c.name, c.arguments, c.arguments_json, c.id if c.id in text else None, c.raw, c.error, c.index)
            for c in (*m.tool_calls, *m.invalid_tool_calls)
        ]
        return m.content, m.reasoning_content, calls, len(m.tool_calls)

    assert fields(message) == fields(streamed), text
    return message


def _same(name: str, template: dict[str, Any], text: str, prompt: str, tools: list[Any] | None) -> str | None:
    """None when chatcodec's decoder from ``template`` reads ``text`` as transformers does, else the difference."""
    decoder = decoder_from_response_template(template, prompt=prompt, tools=tools)
    message = whole_is_streamed(decoder, text)
    assert as_streamed(message, text) == rebuild(
        _deltas(decoder, [text[: len(text) // 2], text[len(text) // 2 :]]), text
    )
    try:
        parsed = parse_response(text, template, prefix=prompt, tools=tools)
    except ValueError:  # transformers gives up on a region that does not parse: chatcodec keeps it as invalid
        return None if not message.tool_calls or message.invalid_tool_calls else f"{name}: {text!r} gave calls"
    content = (parsed.get("content") or "").strip()
    if theirs(parsed) != ours(message) or not (message.content or "").strip().endswith(content):
        return (
            f"{name}: {text!r}: transformers {theirs(parsed)} {content!r},"
            f" chatcodec {ours(message)} {message.content!r}"
        )
    return None


@pytest.mark.parametrize("name", sorted(TRL["templates"]))
def test_trl_templates_read_the_parse_vectors_as_transformers(name: str) -> None:
    need_vectors()
    template = TRL["templates"][name]
    vectors = [v for v in VECTORS if v["format"] in TRL["formats"][name] and not v.get("partial")]
    assert len(vectors) >= 3 or not TRL["formats"][name]
    wrong = [d for v in vectors if (d := _same(name, template, v["output"], "", None)) is not None]
    assert not wrong, wrong


@pytest.mark.parametrize("name", sorted(n for n, found in TRL["corpus"].items() if found))
def test_trl_templates_read_the_corpus_renderings_as_transformers(name: str) -> None:
    require_shared()
    template = TRL["templates"][name]
    checked = 0
    for corpus_name in TRL["corpus"][name]:
        for prompt, completion, tools, _ in renderings(corpus_template(corpus_name)):
            assert _same(name, template, completion, prompt, tools) is None
            checked += 1
    assert checked >= 1


def test_trl_lfm2_template_reads_python_calls() -> None:
    template = TRL["templates"]["lfm2_2_5"]
    text = (
        "<think>Plan.</think><|tool_call_start|>[get_weather(city='Paris', days=3), ping()]<|tool_call_end|><|im_end|>"
    )
    assert _same("lfm2_2_5", template, text, "<|im_start|>assistant\n", None) is None
    message = decoder_from_response_template(template, prompt="<|im_start|>assistant\n").decode(text)
    assert [(c.name, c.arguments) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("ping", {}),
    ]


def test_arguments_are_cast_by_the_tools_schemas_as_transformers_casts_them() -> None:
    template = TRL["templates"]["qwen3_5"]
    types = {"n": "integer", "s": "string", "b": "boolean", "o": "object"}
    properties = {key: {"type": kind} for key, kind in types.items()}
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": properties}}}
    ]
    text = (
        "<tool_call>\n<function=f>\n<parameter=n>\n3.0\n</parameter>\n<parameter=s>\nhello\n</parameter>\n"
        '<parameter=b>\nTrue\n</parameter>\n<parameter=o>\n{"k": 1}\n</parameter>\n</function>\n</tool_call>'
    )
    assert _same("qwen3_5", template, text, "", tools) is None
    call = decoder_from_response_template(template, prompt="", tools=tools).decode(text).tool_calls[0]
    assert call.arguments == {"n": 3, "s": "hello", "b": True, "o": {"k": 1}}
    assert json.loads(call.arguments_json) == call.arguments


# -- streaming ---------------------------------------------------------------------------------------------------


def _stream_cases() -> list[tuple[str, dict[str, Any], str, str]]:
    cases = [
        (
            "qwen3",
            TRL["templates"]["qwen3"],
            "",
            '<think>\nHm.\n</think>\n\nSure.<tool_call>\n{"name": "f", "arguments": {"a": [1, {"b": "}"}]}}\n'
            '</tool_call>\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call><|im_end|>',
        ),
        (
            "nemotron_3",
            TRL["templates"]["nemotron_3"],
            "<|im_start|>assistant\n<think>\n",
            "Thinking it over.</think>\nI will call."
            "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
        ),
        (
            "gptoss",
            TRL["templates"]["gptoss"],
            "",
            "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather"
            '<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        ),
        (
            "lfm2_2_5",
            TRL["templates"]["lfm2_2_5"],
            "",
            "Ok.<|tool_call_start|>[f(a='x, y', b=[1, 2])]<|tool_call_end|><|im_end|>",
        ),
    ]
    return cases


@pytest.mark.parametrize(
    ("label", "template", "prompt", "text"),
    _stream_cases(),
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else "",
)
def test_a_stream_gives_at_every_split_what_the_whole_decode_gives(
    label: str, template: dict[str, Any], prompt: str, text: str
) -> None:
    decoder = decoder_from_response_template(template, prompt=prompt)
    whole = rebuild(_deltas(decoder, [text]), text)
    assert whole.calls, label
    assert as_streamed(decoder.decode(text), text) == whole  # the one-pass whole read gives what the stream gives
    for cut in range(len(text) + 1):
        assert rebuild(_deltas(decoder, [text[:cut], text[cut:]]), text) == whole, (label, cut)
    assert rebuild(_deltas(decoder, list(text)), text) == whole, label  # a character at a time


def test_written_templates_stream_alike_at_every_split() -> None:
    require_shared()
    for name in (
        "Qwen3.5-4B",
        "GLM-4.6",
        "moonshotai-Kimi-K2",
        "mistralai-Ministral-3-14B-Reasoning-2512",
        "openai-gpt-oss-120b",
    ):
        template = corpus_template(name)
        written = response_template(template)
        for prompt, completion, tools, _ in renderings(template)[:1]:
            decoder = decoder_from_response_template(written, prompt=prompt, tools=tools)
            whole = rebuild(_deltas(decoder, [completion]), completion)
            assert whole.calls, name
            assert as_streamed(decoder.decode(completion), completion) == whole
            for cut in range(0, len(completion) + 1, 3):
                assert rebuild(_deltas(decoder, [completion[:cut], completion[cut:]]), completion) == whole, (name, cut)


def _deltas(decoder: Any, chunks: list[str]) -> list[Any]:
    stream = decoder.stream()
    out = []
    for chunk in chunks:
        out += stream.feed(chunk)
    return out + stream.finish()


def test_nothing_the_model_wrote_is_lost() -> None:
    text = (
        'Hi <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> then <tool_call>not json</tool_call><|im_end|>'
    )
    stream = decoder_from_response_template(TRL["templates"]["qwen3"], prompt="").stream(trace=True)
    stream.feed(text)
    stream.finish()
    assert "".join(span.text for span in stream.trace) == text
    message = stream.message
    assert [c.name for c in message.tool_calls] == ["f"]
    assert message.invalid_tool_calls[0].raw == "not json"
    assert "does not parse" in (message.invalid_tool_calls[0].error or "")


# -- shipped templates: loading, decoder_for, lint -------------------------------------------------------------


def _folder(tmp_path: Path, rt: dict[str, Any] | None) -> Path:
    config = {"chat_template": load_template("qwen3").sources["default"], "eos_token": "<|im_end|>"}
    if rt is not None:
        config["response_template"] = rt
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return tmp_path


def test_decoder_for_uses_a_shipped_response_template(tmp_path: Path) -> None:
    shipped = json.loads(json.dumps(TRL["templates"]["qwen3"]))
    shipped["fields"]["tool_calls"]["open"] = "<call>"  # not what chatcodec's own format reads
    shipped["fields"]["tool_calls"]["close_pattern"] = r"</call>\s*"
    chat = load_template(str(_folder(tmp_path, shipped)))
    assert chat.response_template == shipped
    decoder = decoder_for(chat)
    assert decoder.name == "response_template"
    message = decoder.decode('<call>{"name": "f", "arguments": {"x": 1}}</call>')
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("f", {"x": 1})]
    codes = [f.code for f in lint(chat)]
    assert "response-template-misreads" in codes  # the template itself renders <tool_call>, which it misses


def test_a_shipped_template_that_agrees_is_not_linted(tmp_path: Path) -> None:
    chat = load_template(str(_folder(tmp_path, TRL["templates"]["qwen3"])))
    assert "response-template-misreads" not in [f.code for f in lint(chat)]
    assert decoder_for(load_template(str(_folder(tmp_path, None)))).name == "hermes"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "A response template is a JSON object, not list"),
        ({"fields": {"content": {}}}, "needs a start_anchor"),
        ({"start_anchor": "x", "fields": {}}, "fields must be a non-empty object"),
        ({"start_anchor": "x", "fields": {"content": {}}, "extra": 1}, "Unknown keys in the response template: extra"),
        ({"start_anchor": "x", "fields": {"refusal": {}}}, "field 'refusal' has no place in a chatcodec message"),
        ({"start_anchor": "x", "fields": {"content": {"content": "yaml"}}}, "unknown content parser 'yaml'"),
        ({"start_anchor": "x", "fields": {"content": {"open_pattern": "("}}}, "not a valid regular expression"),
        (
            {"start_anchor": "x", "fields": {"content": {}, "reasoning_content": {}}},
            "At most one response-template field",
        ),
        (
            {"start_anchor": "x", "fields": {"tool_calls": {"open_pattern": "<(?P<n>x)>", "content": "json"}}},
            "captures n",
        ),
    ],
)
def test_a_bad_response_template_is_a_one_line_error(spec: Any, message: str) -> None:
    with pytest.raises(DecodeError, match=message.replace("(", r"\(")) as caught:
        load_response_template(spec)
    assert "\n" not in str(caught.value)


# -- the command line --------------------------------------------------------------------------------------------


def test_write_adds_the_template_and_keeps_every_other_byte(tmp_path: Path) -> None:
    require_shared()
    original = (CORPUS.parent / "tokenizers" / "qwen3" / "tokenizer_config.json").read_bytes()
    (tmp_path / "tokenizer_config.json").write_bytes(original)
    code, out, err = run(["response-template", str(tmp_path), "--write"])
    assert code == 0, err
    assert out == b""
    updated = (tmp_path / "tokenizer_config.json").read_bytes()
    written = json.loads(updated)["response_template"]
    assert written == response_template(load_template("qwen3"))
    # the new file is the old one with one piece inserted: the rest is byte for byte the file's own
    head = next(i for i, (a, b) in enumerate(zip(original, updated, strict=False)) if a != b)
    tail = len(original) - head
    assert updated[:head] == original[:head] and updated[len(updated) - tail :] == original[head:]
    inserted = updated[head : len(updated) - tail].decode("utf-8")
    assert inserted.startswith(',\n  "response_template": {')
    assert json.loads("{" + inserted.lstrip(",") + "}")["response_template"] == written
    chat = load_template(str(tmp_path))  # the folder now ships it: transformers' parser and decoder_for read it
    assert chat.response_template == written
    chat_parsing.response_templates.load_response_template(written)
    prompt = chat.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    text = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>'
    assert theirs(parse_response(text, written, prefix=prompt))[0] == [("f", {"x": 1})]
    assert decoder_for(chat).name == "response_template"
    again = run(["response-template", str(tmp_path), "--write"])  # replaced in place: the file is unchanged
    assert again[0] == 0 and (tmp_path / "tokenizer_config.json").read_bytes() == updated


def test_insert_key_replaces_a_value_in_place() -> None:
    text = '{"a": 1, "response_template": {"old": true}, "z": [1,2]}'
    assert (
        insert_key(text, "response_template", {"n": 1}) == '{"a": 1, "response_template": {\n  "n": 1\n}, "z": [1,2]}'
    )
    with pytest.raises(ChatcodecError, match="not valid JSON"):
        insert_key('{"a": 1,, }', "b", 1)


def test_the_command_prints_it_and_fails_in_one_line() -> None:
    code, out, err = run(["response-template", "qwen3"])
    assert code == 0, err
    assert json.loads(out) == response_template("qwen3")
    code, out, err = run(["inspect", "qwen3", "--response-template"])
    assert code == 0 and json.loads(out) == response_template("qwen3")
    code, _, err = run(["response-template", "qwen3", "--write"])
    assert code == 2 and err.count("\n") == 1 and "needs a model folder with a tokenizer_config.json" in err
    code, _, err = run(["response-template", str(Path(__file__).parent / "data" / "templates" / "python_calls.jinja")])
    assert code == 2 and err.count("\n") == 1


# -- the guide ---------------------------------------------------------------------------------------------------

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "response-templates.md"


def test_the_guide_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(GUIDE), "exec"), namespace)


def test_every_catalog_format_is_written_or_says_why() -> None:
    need_vectors()
    from chatcodec.decoders.catalog import CATALOG

    said = []
    for name, fmt in sorted(CATALOG.items()):
        try:
            written = write_response_template(
                fmt, prompt="<|assistant|>\n", end_markers=("<|end|>",), forced_open=False
            )
        except DecodeError as exc:
            assert UNSAID[name] in str(exc)
            said.append(name)
            continue
        chat_parsing.response_templates.load_response_template(written)
        outputs = [v["output"] for v in VECTORS if v["format"] == name and not v.get("partial")]
        wrong = [d for text in outputs if (d := _same(name, written, text, "", None)) is not None]
        assert not wrong, wrong  # chatcodec reads the written template as transformers reads it
    assert sorted(said) == sorted(set(UNSAID) - {"learned"})  # a learned format is not in the catalog
