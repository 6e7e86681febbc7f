"""Assistant masks and per-message spans: transformers' masks for tagged templates, inferred ones for the rest."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from chatcodec import ChatTemplate, InputError
from chatcodec.exceptions import MaskError
from chatcodec.tokens import Codec, load

from .conftest import SHARED, conversations, manifest, require_shared, template_source
from .test_tokens import _codec, _corpus_codec, _transformers

#: conversations with plain assistant content (no tools, no reasoning) that every family renders
PLAIN = ["multi_turn", "multi_turn_no_system", "ends_with_assistant", "korean", "indonesian", "long_20_turn"]


def _tagged_qwen3(source: str) -> str:
    """Qwen3's template with its assistant turns in {% generation %}, the way TRL's training templates do it:
    the header stays out, everything from the reasoning block to <|im_end|> is in."""
    start = source.index("        {%- if loop.index0 > ns.last_query_index %}")
    end = source.index("        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}")
    body = source[start:end]
    body = body.replace("'<|im_start|>' + message.role + '\\n<think>\\n'", "'<think>\\n'")
    body = body.replace("'<|im_start|>' + message.role + '\\n' + content", "content")
    tagged = (
        "        {{- '<|im_start|>' + message.role + '\\n' }}\n        {%- generation %}\n"
        + body
        + "        {{- '<|im_end|>' }}\n        {%- endgeneration %}\n        {{- '\\n' }}\n"
    )
    return source[:start] + tagged + source[end + len("        {{- '<|im_end|>\\n' }}\n") :]


def _tagged_llama3(source: str) -> str:
    """The Llama-3 template with the assistant's content and <|eot_id|> in {% generation %}."""
    tagged = (
        "{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
        "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
        "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    )
    assert "set content = '<|start_header_id|>'" in source  # the template this one restructures
    return tagged


TAGGERS = {"qwen3": _tagged_qwen3, "llama3_1": _tagged_llama3}
MASK_CONVERSATIONS = [*PLAIN, "reasoning_history", "reasoning_final_turn", "tools_roundtrip_final", "tools_single_call"]


def _masked_text(codec: Codec, ids: list[int], mask: list[int]) -> str:
    return codec.decode([i for i, keep in zip(ids, mask, strict=True) if keep])


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_tagged_templates_give_transformers_masks(name: str) -> None:
    hf, codec = _transformers(name), _codec(name)
    tagged_source = TAGGERS[name](codec.template.source)
    tagged = codec.with_template(ChatTemplate(tagged_source, special_tokens=codec.template.special_tokens))
    compared = 0
    for conv_id in MASK_CONVERSATIONS:
        conv = conversations()[conv_id]
        for options in conv["option_sets"]:
            if name == "llama3_1" and conv["tools"]:
                continue  # this Llama-3 template has no tool calls
            try:
                theirs = hf.apply_chat_template(
                    conv["messages"], tools=conv["tools"], chat_template=tagged_source, tokenize=True,
                    return_dict=True, return_assistant_tokens_mask=True, **options,
                )  # fmt: skip
            except Exception:
                continue
            ours = tagged.encode(conv["messages"], tools=conv["tools"], **options)
            assert ours.text == codec.template.render(conv["messages"], tools=conv["tools"], **options)  # same prompt
            assert ours.input_ids == list(theirs["input_ids"])
            assert ours.assistant_mask == list(theirs["assistant_masks"]), conv_id
            compared += 1
    assert compared >= 6


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_inferred_masks_equal_the_tagged_ones(name: str) -> None:
    """Without tags, the mask found from marked content is the one the hand-tagged template gives."""
    codec = _codec(name)
    tagged = codec.with_template(
        ChatTemplate(TAGGERS[name](codec.template.source), special_tokens=codec.template.special_tokens)
    )
    compared = 0
    for conv_id in MASK_CONVERSATIONS:
        conv = conversations()[conv_id]
        if name == "llama3_1" and conv["tools"]:
            continue
        for options in conv["option_sets"]:
            if options.get("continue_final_message"):
                continue  # tags refuse it, as transformers does (tested below)
            inferred = codec.encode(conv["messages"], tools=conv["tools"], **options)
            expected = tagged.encode(conv["messages"], tools=conv["tools"], **options)
            assert inferred.input_ids == expected.input_ids
            assert inferred.assistant_mask == expected.assistant_mask, (conv_id, options)
            compared += 1
    assert compared >= 8


def test_consecutive_assistant_messages_of_one_turn_are_masked_whole() -> None:
    """Qwen-Agent's history (reasoning, then each call, as consecutive assistant messages the template writes
    into one turn): the template text between them (``</think>``, ``<tool_call>``, the call's name) is what
    the model writes, so the inferred mask covers it, as the hand-tagged template's does."""
    codec = _codec("qwen3")
    tagged = codec.with_template(ChatTemplate(TAGGERS["qwen3"](codec.template.source)))
    conv = conversations()["qwen_agent_function_role"]
    assert [m["role"] for m in conv["messages"]].count("assistant") >= 3
    inferred = codec.encode(conv["messages"], tools=conv["tools"], polyfill="auto")
    expected = tagged.encode(conv["messages"], tools=conv["tools"], polyfill="auto")
    assert inferred.input_ids == expected.input_ids
    assert inferred.assistant_mask == expected.assistant_mask
    masked = codec.decode([i for i, m in zip(inferred.input_ids, inferred.assistant_mask, strict=True) if m])
    assert '<tool_call>\n{"name": "get_current_temperature"' in masked


def _family_codecs() -> list[tuple[str, Codec]]:
    require_shared()
    qwen, llama = _codec("qwen3"), _codec("llama3_1")
    codecs = [("qwen3 tokenizer", qwen), ("llama3_1 tokenizer", llama)]
    for template_name in ["Qwen-Qwen3-0.6B", "chujiezheng-chatml", "chujiezheng-qwen2.5-instruct", "Qwen3.5-4B"]:
        codecs.append(
            (
                template_name,
                qwen.with_template(
                    ChatTemplate(template_source(template_name), special_tokens=qwen.template.special_tokens)
                ),
            )
        )
    for template_name in ["lenml-llama3_1", "meta-llama-Llama-3.1-8B-Instruct", "lenml-llama3"]:
        codecs.append(
            (
                template_name,
                llama.with_template(
                    ChatTemplate(template_source(template_name), special_tokens=llama.template.special_tokens)
                ),
            )
        )
    for template_name in [
        "chujiezheng-mistral-instruct", "Mistral-Small-3.2-24B-Instruct-2506", "unsloth-mistral-Devstral-Small-2507",
        "chujiezheng-gemma-it", "google-gemma-2-2b-it", "lenml-gemma3", "google-gemma-4-31B-it",
    ]:  # fmt: skip
        codecs.append((template_name, _corpus_codec(template_name)))
    return codecs


def _turns(codec: Codec, enc: Any, mask: list[int]) -> list[str]:
    """The text of each run of masked tokens.

    A space the template writes before the content (Mistral's ``[/INST] ``) merges with the content's
    first word into one token (`` The``); that token is the model's to produce, so it is masked, and its
    space is dropped here only when the prompt really has it right before the content.
    """
    runs: list[list[int]] = []
    for position, keep in enumerate(mask):
        if keep and (not runs or mask[position - 1] == 0):
            runs.append([])
        if keep:
            runs[-1].append(position)
    texts = []
    for run in runs:
        start = enc.offsets[run[0]][0]
        text = codec.decode([enc.input_ids[i] for i in run])
        if text[:1].isspace() and enc.text[start].isspace() and not enc.text[start + 1].isspace():
            text = text[1:]
        texts.append(text)
    return texts


def _end_of_turn(label: str, codec: Codec) -> str:
    tokens = codec.template.special_tokens
    if "gemma" in label:
        return "<end_of_turn>" if "gemma-4" not in label else "<turn|>"
    return tokens["eos_token"]


@pytest.mark.parametrize("index", range(16))
def test_masked_tokens_are_exactly_the_assistant_content_and_end_of_turn(index: int) -> None:
    label, codec = _family_codecs()[index]
    eot = _end_of_turn(label, codec)
    checked = 0
    for conv_id in PLAIN:
        conv = conversations()[conv_id]
        for options in conv["option_sets"]:
            try:
                enc = codec.encode(conv["messages"], **options)
            except InputError:
                continue  # e.g. Mistral templates that require alternating roles
            except Exception as exc:
                if "Template" in type(exc).__name__:
                    continue
                raise
            expected = [m["content"].strip() + eot for m in conv["messages"] if m["role"] == "assistant"]
            if options.get("continue_final_message"):
                expected[-1] = expected[-1].removesuffix(eot)  # the continued turn is still open
            assert _turns(codec, enc, enc.mask(reasoning=False)) == expected, (label, conv_id, options)
            without_eot = [turn.removesuffix(eot) for turn in expected]
            assert _turns(codec, enc, enc.mask(reasoning=False, end_of_turn=False)) == without_eot, (label, conv_id)
            checked += 1
    assert checked >= 3, label


def test_the_families_are_really_covered() -> None:
    labels = [label for label, _ in _family_codecs()]
    assert len(labels) == 16
    assert {"chujiezheng-mistral-instruct", "google-gemma-2-2b-it", "lenml-gemma3"} <= set(labels)
    assert all(manifest()[name] for name in labels if "tokenizer" not in name)


def test_reasoning_policy_on_qwen3() -> None:
    codec = _codec("qwen3")
    conv = conversations()["reasoning_final_turn"]
    enc = codec.encode(conv["messages"])
    reasoning = conv["messages"][-1]["reasoning_content"].strip()
    content = conv["messages"][-1]["content"].strip()
    assert _masked_text(codec, enc.input_ids, enc.mask()) == f"<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>"
    assert _masked_text(codec, enc.input_ids, enc.mask(reasoning=False)) == f"{content}<|im_end|>"


def test_reasoning_qwen3_drops_from_earlier_turns_is_not_masked() -> None:
    codec = _codec("qwen3")
    conv = conversations()["reasoning_history"]
    enc = codec.encode(conv["messages"], add_generation_prompt=True)
    assert conv["messages"][1]["reasoning_content"] not in enc.text
    assert _masked_text(codec, enc.input_ids, enc.assistant_mask) == conv["messages"][1]["content"] + "<|im_end|>"


def test_tool_call_turns_mask_the_call_and_not_the_results() -> None:
    codec = _codec("qwen3")
    conv = conversations()["tools_roundtrip_final"]
    enc = codec.encode(conv["messages"], tools=conv["tools"])
    masked = _masked_text(codec, enc.input_ids, enc.mask(reasoning=False))
    assert masked.startswith('<tool_call>\n{"name": "get_current_temperature", "arguments": {"location"')
    assert masked.count("<|im_end|>") == 2 and masked.endswith(conv["messages"][-1]["content"] + "<|im_end|>")
    assert "26.1" not in masked.split("<|im_end|>")[0]  # the tool result belongs to the tool message
    assert "user" not in masked and "temperature in San Francisco now" not in masked


def test_all_zero_mask_raises() -> None:
    codec = _codec("qwen3")
    silent = codec.with_template(
        ChatTemplate(
            "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}<|im_end|>{% endif %}{% endfor %}"
        )
    )
    enc = silent.encode([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    with pytest.raises(MaskError, match="assistant turns"):
        _ = enc.assistant_mask
    lone = codec.encode([{"role": "user", "content": "Hi"}])
    assert lone.assistant_mask == [0] * len(lone) and len(lone) == 6  # no assistant turn: no error


def test_a_template_that_reads_content_is_refused_rather_than_guessed() -> None:
    codec = _codec("qwen3")
    picky = codec.with_template(
        ChatTemplate("{% for m in messages %}{{ m.content | length }}:{{ m.content }}<|im_end|>{% endfor %}")
    )
    enc = picky.encode([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    with pytest.raises(MaskError, match="differently"):
        _ = enc.assistant_mask


def test_tagged_masks_refuse_continue_final_message() -> None:
    codec = _codec("qwen3")
    tagged = codec.with_template(ChatTemplate(TAGGERS["qwen3"](codec.template.source)))
    enc = tagged.encode(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}], continue_final_message=True
    )
    with pytest.raises(InputError, match="continue_final_message"):
        _ = enc.assistant_mask


def test_masks_survive_escaped_content() -> None:
    codec = _codec("llama3_1")
    messages = [{"role": "user", "content": "a<|eot_id|>b"}, {"role": "assistant", "content": "x<|eot_id|>y"}]
    enc = codec.encode(messages)
    assert _masked_text(codec, enc.input_ids, enc.assistant_mask) == "x<|eot_id|>y<|eot_id|>"
    assert enc.input_ids.count(128009) == 2


# --- per-message spans ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_message_spans_cover_each_message(name: str) -> None:
    codec = _codec(name)
    conv = conversations()["multi_turn"]
    enc = codec.encode(conv["messages"], add_generation_prompt=True)
    spans = enc.message_spans
    assert len(spans) == len(conv["messages"])
    assert spans[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # contiguous
    header = "<|im_start|>assistant\n" if name == "qwen3" else "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert codec.decode(enc.input_ids[spans[-1][1] :]) == header  # only the generation prompt is left over
    for (start, end), message in zip(spans, conv["messages"], strict=True):
        piece = codec.decode(enc.input_ids[start:end])
        assert message["content"] in piece and message["role"] in piece
        others = [m["content"] for m in conv["messages"] if m is not message and m["content"] not in message["content"]]
        assert not any(other in piece for other in others)
    assert enc.message_token_counts == [end - start for start, end in spans]
    assert sum(enc.message_token_counts) + len(codec.tokenizer.encode(header, add_special_tokens=False).ids) == len(enc)  # type: ignore[union-attr]


def test_message_spans_of_a_dropped_message_are_empty() -> None:
    codec = _codec("qwen3")
    dropping = codec.with_template(
        ChatTemplate(
            "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.content }}<|im_end|>{% endif %}"
            "{% endfor %}"
        )
    )
    enc = dropping.encode([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert enc.message_token_counts[0] == 0 and enc.message_token_counts[1] == len(enc)


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_runs_mask_is_the_overlap_mask_of_the_offsets(name: str) -> None:
    """The mask read run by run (spans moved into each run's coordinates) is the mask of the joined offsets, for
    runs sharing one encoding, cached runs, control tokens, escaped caller text and added BOS/EOS."""
    import random

    from chatcodec.masks import overlap_mask, runs_mask

    codec = load(SHARED / "tokenizers" / name)  # a fresh cache, then stretches cached from earlier prompts
    rng = random.Random(7)
    chats = [conversations()[c]["messages"] for c in PLAIN]
    chats.append([{"role": "user", "content": "a <|im_end|> b <|eot_id|> [x]"}, {"role": "assistant", "content": "ok"}])
    compared = 0
    for chat, policy, add in itertools.product(chats, ("escape", "allow"), (False, True)):
        encoding = codec.encode(chat, content_special_tokens=policy, add_special_tokens=add)
        offsets = list(encoding.offsets)
        encoding._offsets = None
        length = len(encoding.text)
        for _ in range(20):
            cuts = sorted(rng.randrange(length + 1) for _ in range(2 * rng.randint(0, 4)))
            spans = list(zip(cuts[::2], cuts[1::2], strict=True))
            assert runs_mask(encoding._runs, spans) == overlap_mask(offsets, spans), (chat, policy, add, spans)
            compared += 1
    assert compared == len(chats) * 4 * 20


def test_runs_mask_on_a_prompt_tokenized_whole() -> None:
    """A tokenizer whose added tokens strip spaces encodes the prompt whole; escaped text keeps explicit spans."""
    from tokenizers import pre_tokenizers

    from chatcodec.masks import overlap_mask, runs_mask

    from .test_tokens import _toy

    tokenizer = _toy(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"), rstrip=True, lstrip=True)
    codec = Codec(ChatTemplate("{% for m in messages %}{{ m.content }} <eot> {% endfor %}"), tokenizer)
    encoding = codec.encode([{"role": "user", "content": "ab <eot> a"}, {"role": "assistant", "content": "b ab"}])
    assert any(run.spans is not None for run in encoding._runs)  # the escaped stretch, encoded again
    offsets = list(encoding.offsets)
    length = len(encoding.text)
    for low, high in itertools.combinations(range(length + 1), 2):
        assert runs_mask(encoding._runs, [(low, high)]) == overlap_mask(offsets, [(low, high)]), (low, high)
