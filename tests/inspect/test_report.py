"""chatcodec.inspect: the report's facts, checked against renders and the real tokenizer."""

from __future__ import annotations

import json

import pytest

import chatcodec
from chatcodec import ChatTemplate, load_template
from chatcodec.inspection import Report, prefix_stability
from chatcodec.inspection.probes import Needles

from ..conftest import require_shared
from .conftest import QWEN3_TOKENIZER, corpus_template


@pytest.mark.parametrize("name", ["qwen3", "Qwen-Qwen3-0.6B"])
def test_qwen3_is_not_prefix_stable_because_history_reasoning_is_dropped(name: str) -> None:
    template = load_template(name) if name == "qwen3" else corpus_template(name)
    stability = prefix_stability(template)
    assert stability.stable is False
    dropped = [c for c in stability.changes if c.kind == "history_reasoning_dropped" and not c.variables]
    assert dropped, stability.explanation
    first = dropped[0]
    # the change is the reasoning block of the first assistant turn, exactly as Qwen3 writes it
    assert first.removed == f"<think>\n{Needles.REASONING[0]}\n</think>\n\n" and first.added == ""
    assert first.role == "assistant"
    assert "history reasoning dropped" in first.explanation and "<think>" in first.explanation
    # and it is true: the two renders really differ there
    one_turn = template.render(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo", "reasoning_content": "R"}]
    )
    two_turns = template.render(
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Yo", "reasoning_content": "R"},
            {"role": "user", "content": "Again"},
        ]
    )
    assert "<think>\nR\n</think>" in one_turn and not two_turns.startswith(one_turn)


def test_qwen3_with_thinking_off_drops_the_empty_think_block() -> None:
    changes = prefix_stability(load_template("qwen3")).changes
    off = [c for c in changes if c.variables == {"enable_thinking": False}]
    assert [c.removed for c in off] == ["<think>\n\n</think>\n\n"]
    assert "empty think block" in off[0].explanation


@pytest.mark.parametrize("name", ["chatml", "chujiezheng-qwen2.5-instruct", "meta-llama-Llama-3.1-8B-Instruct"])
def test_prefix_stable_templates(name: str) -> None:
    template = load_template(name) if name == "chatml" else corpus_template(name)
    stability = prefix_stability(template)
    assert stability.stable is True and stability.changes == ()
    assert stability.checked >= 7


def test_a_template_that_moves_its_ending_is_named() -> None:
    # phi-3 writes EOS after the last message only: the ending changes as the chat grows
    stability = prefix_stability(load_template("phi-3"))
    assert stability.stable is False
    assert [(c.kind, c.removed) for c in stability.changes] == [("ending_not_kept", "<|endoftext|>")]


def test_report_facts_for_qwen3() -> None:
    report = chatcodec.inspect("qwen3")
    assert isinstance(report, Report)
    assert report.output_format == "hermes" and report.format_how == "catalog"
    assert "<tool_call>" in report.tool_call_text
    assert report.stop_markers == ("<|im_end|>",)
    assert report.special_tokens == {"eos_token": "<|im_end|>"}
    assert report.variables == ("enable_thinking",)
    assert report.rejected_roles == {}
    assert report.prefix_stable is False
    assert report.overhead is None  # no tokenizer given


def test_rejected_roles_keep_the_templates_message_and_line() -> None:
    report = chatcodec.inspect(corpus_template("google-gemma-2-2b-it"))
    assert report.rejected_roles["system"] == "System role not supported"
    system = next(r for r in report.roles if r.role == "system")
    assert system.line == 1  # the raise_exception call is on the template's first line
    assert {r.role: r.status for r in report.roles} == {
        "system": "rejected",
        "user": "rendered",
        "assistant": "rendered",
        "tool": "rejected",
    }


def test_a_dropped_role_is_reported_as_dropped() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% if m.role != 'system' %}<{{ m.role }}>{{ m.content }}</s>{% endif %}{% endfor %}"
    )
    statuses = {r.role: r.status for r in chatcodec.inspect(template).roles}
    assert statuses["system"] == "dropped" and statuses["user"] == "rendered"


def test_token_overhead_with_the_real_qwen3_tokenizer() -> None:
    require_shared()
    from tokenizers import Tokenizer

    codec = chatcodec.load(QWEN3_TOKENIZER)
    report = chatcodec.inspect(codec.template, codec=codec)
    assert report.overhead is not None
    tokenizer = Tokenizer.from_file(str(QWEN3_TOKENIZER / "tokenizer.json"))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    # a ChatML turn is <|im_start|>ROLE\n ... <|im_end|>\n around its text
    for role in ("system", "user", "assistant"):
        assert report.overhead.per_role[role] == count(f"<|im_start|>{role}\n") + count("<|im_end|>\n"), role
    assert report.overhead.fixed == 0
    assert report.overhead.generation_prompt == count("<|im_start|>assistant\n")


def test_report_json_keeps_the_capabilities_object() -> None:
    body = json.loads(json.dumps(chatcodec.inspect("gemma").to_dict()))
    assert body["capabilities"] == load_template("gemma").capabilities.to_dict()
    assert body["output_format"]["format"] == "content"
    assert body["prefix_stable"]["stable"] is True
    assert {r["role"] for r in body["roles"]} == {"system", "user", "assistant", "tool"}


def test_report_text_names_every_section() -> None:
    text = str(chatcodec.inspect("qwen3"))
    for label in ("output format", "stop markers", "special tokens", "roles", "variables", "prefix stable"):
        assert f"  {label}" in text
    assert "history reasoning dropped" in text and "\x1b[" not in text
