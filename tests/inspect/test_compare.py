"""chatcodec.inspection.compare: two templates on the same chats, and formatted samples against a template."""

from __future__ import annotations

import chatcodec
from chatcodec import load_template
from chatcodec.inspection.compare import check_samples, compare, probe_conversations

from .conftest import LLAMA31_TOKENIZER, QWEN3_TOKENIZER, corpus_template


def test_qwen3_thinking_on_against_off() -> None:
    qwen3 = load_template("qwen3")
    found = {c.name: c for c in compare(qwen3, qwen3, variables_a={"enable_thinking": True},
                                        variables_b={"enable_thinking": False})}  # fmt: skip
    # every prompt that asks for an answer differs by the empty think block thinking-off writes, and only by it
    for name in ("user", "roles", "tools"):
        comparison = found[name]
        assert not comparison.same
        assert comparison.b.text == comparison.a.text + "<think>\n\n</think>\n\n"
        diff = comparison.text_diff(color=False)
        assert "+<think>\n+\n+</think>\n" in diff and "\n-" not in diff
    assert found["reasoning"].same  # no generation prompt: history renders alike


def test_llama3_against_llama31_in_text_and_tokens() -> None:
    llama3 = corpus_template("lenml-llama3")
    llama31 = corpus_template("meta-llama-Llama-3.1-8B-Instruct")
    codec = chatcodec.load(LLAMA31_TOKENIZER)
    found = {
        c.name: c
        for c in compare(llama3, llama31, codec_a=codec.with_template(llama3), codec_b=codec.with_template(llama31))
    }
    user = found["user"]
    assert not user.same
    diff = user.text_diff(color=False)
    # Llama 3.1 adds a system header with its knowledge cutoff and a (hard-coded) date
    assert "+Cutting Knowledge Date: December 2023\n" in diff and "+Today Date: 26 Jul 2024\n" in diff
    tokens = user.token_diff(color=False)
    assert "+   38766 'Cut'" in tokens  # the token ids of the added header, from the real tokenizer
    assert user.a.ids is not None and user.b.ids is not None and len(user.b.ids) > len(user.a.ids)
    # Llama 3's template opens an assistant turn even without add_generation_prompt (transformers #30893)
    assert found["reasoning"].a.text is not None
    assert found["reasoning"].a.text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert found["reasoning"].b.text is not None and found["reasoning"].b.text.endswith("68.<|eot_id|>")


def test_a_side_that_raises_is_shown_with_its_message() -> None:
    gemma2 = corpus_template("google-gemma-2-2b-it")
    roles = next(c for c in compare(gemma2, load_template("gemma")) if c.name == "roles")
    assert roles.a.text is None and roles.a.error == "System role not supported"
    assert "-(raised: System role not supported)" in roles.text_diff(color=False)


def _samples(template: chatcodec.ChatTemplate) -> list[tuple[int, dict[str, object]]]:
    rows = []
    for line, conv in enumerate(probe_conversations(), 1):
        if conv.options.get("add_generation_prompt"):
            continue
        rows.append((line, {"messages": conv.messages, "text": template.render(conv.messages, **conv.options)}))
    rows += [
        (10, {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}),
        (11, {"messages": [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Ciao"}]}),
    ]
    for _, row in rows[-2:]:
        row["text"] = template.render(row["messages"])  # type: ignore[arg-type]
    return rows


def test_a_planted_text_mismatch_is_found_on_its_line() -> None:
    qwen3 = load_template("qwen3")
    rows = _samples(qwen3)
    assert all(check.same for check in check_samples(qwen3, rows))
    planted = dict(rows[-1][1])
    planted["text"] = str(planted["text"]).replace("<|im_start|>assistant\n", "<|im_start|>assistant\n\n")
    rows[-1] = (11, planted)
    checks = check_samples(qwen3, rows)
    assert [c.line for c in checks if not c.same] == [11]
    diff = next(c for c in checks if not c.same).diff(color=False)
    assert " <|im_start|>assistant\n+\n <think>\n" in diff


def test_a_planted_token_mismatch_is_found() -> None:
    codec = chatcodec.load(QWEN3_TOKENIZER)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    ids = codec.encode(messages).input_ids
    im_end = ids[-2]
    assert codec.decode([im_end]) == "<|im_end|>"
    rows = [(1, {"messages": messages, "input_ids": ids}), (2, {"messages": messages, "input_ids": [*ids[:-2], 198]})]
    checks = check_samples(codec.template, rows, codec=codec)
    assert [c.same for c in checks] == [True, False]
    assert f"-{im_end:>8} '<|im_end|>'" in checks[1].diff(color=False)
