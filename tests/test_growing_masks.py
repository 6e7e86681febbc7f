"""The assistant mask of a growing chat goes on from the last encode's, and equals a fresh codec's at every step.

``Codec.encode(messages, return_assistant_tokens_mask=True)`` on a conversation that grew from one the codec
remembers resumes the marked render and keeps the anchors, turns and mask bits that did not change
(:class:`chatcodec.masks.MaskMemory`). Every corpus template, on the real Qwen3 and Llama-3.1 tokenizers,
grows the corpus conversations one message at a time and random ones with in-place edits, cuts and copies:
the mask, its variants and the per-message spans (or the error) must be those of a codec without memory.
"""

from __future__ import annotations

import copy
import gc
import weakref
from typing import Any

import pytest

from chatcodec import ChatcodecError, ChatTemplate, History, masks, tokens

from .conftest import GOLDEN_NOW, SHARED, in_threads, manifest, require_shared, template_source
from .test_resuming import journeys, random_growth

NAMES = sorted(manifest()) if (SHARED / "corpus").is_dir() else []
TOKENIZERS = ("qwen3", "llama3_1")


def _codecs(tokenizer: str, name: str | None = None) -> tuple[tokens.Codec, tokens.Codec]:
    """A codec that remembers and one that does not, with the corpus template ``name`` (or the model's own)."""
    require_shared()
    remembering, forgetting = (tokens.load(SHARED / "tokenizers" / tokenizer) for _ in range(2))
    if name is not None:
        entry = manifest()[name]
        template = ChatTemplate(template_source(name), special_tokens=entry["special_tokens"], name=name)
        remembering, forgetting = remembering.with_template(template), forgetting.with_template(template)
    forgetting.history = History(entries=0)
    return remembering, forgetting


def _seen(encode: Any) -> Any:
    """What an encode with the mask gives: ids, text, the mask and its variants, the message spans; or its error."""
    try:
        encoding = encode()
    except ChatcodecError as exc:
        return ("error", type(exc).__name__)
    variants = []
    for reasoning, end_of_turn in ((False, True), (True, False), (False, False)):
        try:
            variants.append(encoding.mask(reasoning=reasoning, end_of_turn=end_of_turn))
        except ChatcodecError as exc:
            variants.append(("error", type(exc).__name__))
    try:
        spans: Any = encoding.message_spans
    except ChatcodecError as exc:
        spans = ("error", type(exc).__name__)
    return encoding.input_ids, encoding.text, encoding.assistant_mask, variants, spans


class Tally:
    """How many encodes went on from the last one's mask: anchors kept, turns kept, mask bits kept."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.anchors = self.turns = self.bits = 0
        finish = masks.MaskMemory.finish

        def counting(memory: masks.MaskMemory) -> None:
            previous = memory.previous
            self.anchors += memory.at > 0
            self.turns += memory.kept_spans > 0
            self.bits += previous is not None and previous.mask is not None and memory.mask is not None
            finish(memory)

        monkeypatch.setattr(masks.MaskMemory, "finish", counting)


def _compare(remembering: tokens.Codec, forgetting: tokens.Codec, chat: list[Any], options: dict[str, Any]) -> None:
    messages = copy.deepcopy(chat)  # rebuilt at every request, as a server does
    got = _seen(lambda: remembering.encode(messages, return_assistant_tokens_mask=True, **options))
    want = _seen(lambda: forgetting.encode(chat, return_assistant_tokens_mask=True, **options))
    assert got == want, f"{len(chat)} messages, {options.get('add_generation_prompt')}"


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("name", NAMES)
def test_corpus_conversations_grown_have_a_fresh_codecs_masks(
    name: str, tokenizer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every corpus template grows the corpus journeys (reasoning, tools, marks and control tokens in content,
    Qwen-Agent's calls) one message at a time, with and without the generation prompt."""
    tally = Tally(monkeypatch)
    remembering, forgetting = _codecs(tokenizer, name)
    for number, (messages, tools) in enumerate(journeys()):
        remembering.history.clear()
        options = {"tools": tools, "add_generation_prompt": number % 2 == 0, "now": GOLDEN_NOW}
        for count in range(1, len(messages) + 1):
            _compare(remembering, forgetting, messages[:count], options)
    if remembering.template.resumable:  # 50 of the 56 templates: the mask went on from the last one's
        assert tally.anchors, name
    if tally.anchors >= 3:  # gemma-2 refuses most of these chats (a system message)
        assert tally.turns and tally.bits, (tally.anchors, tally.turns, tally.bits)


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("name", NAMES)
def test_random_growth_with_edits_has_a_fresh_codecs_masks(name: str, tokenizer: str) -> None:
    """Seeded random chats of corpus messages grown a message or two at a time, the caller now and then
    editing an earlier message in place (marks and control tokens added), cutting the chat back, or passing
    copies."""
    remembering, forgetting = _codecs(tokenizer, name)
    for chat in random_growth(f"{name}-{tokenizer}", ("user", "assistant", "tool"), chats=2, steps=12):
        _compare(remembering, forgetting, chat, {"add_generation_prompt": chat[-1]["role"] == "user"})


def _bench_chat(turns: int, reasoning: bool) -> list[dict[str, Any]]:
    chat: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        answer: dict[str, Any] = {"role": "assistant", "content": f"{i * (i + 3)}, so x < {i} holds."}
        if reasoning:
            answer["reasoning_content"] = f"{i} times {i + 3}"
        chat += [{"role": "user", "content": f"What is {i} times {i + 3}? [{i}]"}, answer]
    return chat


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_a_growing_chat_finds_only_its_new_turns(tokenizer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the model's own template, each encode of a chat growing by a turn finds the turns of its new
    messages only (and of the last answer, whose end was the prompt's end, and whose reasoning Qwen3 drops),
    and keeps the earlier anchors and mask bits."""
    remembering, forgetting = _codecs(tokenizer)
    found: list[int] = []
    regions = masks._turn_regions

    def counting(*args: Any) -> list[tuple[int, int]]:
        result = regions(*args)
        if len(args) == 6:  # a growing mask's turns (with their details)
            found.append(len(args[5]))
        return result

    monkeypatch.setattr(masks, "_turn_regions", counting)
    tally = Tally(monkeypatch)
    chat = _bench_chat(24, reasoning=tokenizer == "qwen3")
    for end in range(3, len(chat) + 1, 2):
        got = remembering.encode(chat[:end], return_assistant_tokens_mask=True)
        assert got.assistant_mask == forgetting.encode(chat[:end], return_assistant_tokens_mask=True).assistant_mask
    # the first encode is not a growing one, the second has nothing to go on from, the others all went on
    assert tally.anchors == tally.turns == tally.bits == 22
    assert found[0] == 2 and max(found[1:]) <= 2 and len(found) == 23, found


def test_the_masks_memory_is_counted_and_bounded() -> None:
    """The mask's memory counts in the history's bytes, and is not kept where it would not fit."""
    remembering, _ = _codecs("llama3_1")
    chat = _bench_chat(12, reasoning=False)
    for end in range(3, len(chat) + 1, 2):
        remembering.encode(chat[:end], return_assistant_tokens_mask=True)
    history = remembering.history
    entries = [entry for slot in history._slots.values() for entry in slot]
    assert any(entry.mask is not None for entry in entries)
    assert history.size == sum(entry.size for entry in entries)
    kept = next(entry for entry in entries if entry.mask is not None)
    assert kept.mask is not None and kept.mask.size > 0 and kept.mask.previous is None  # memories do not chain
    small = History(entries=8, max_bytes=history.size - kept.mask.size // 2)
    remembering.history = small
    for end in range(3, len(chat) + 1, 2):
        remembering.encode(chat[:end], return_assistant_tokens_mask=True)
        assert small.size <= small.max_bytes
        assert small.size == sum(entry.size for slot in small._slots.values() for entry in slot)


def test_threads_growing_masks_share_the_memory_safely() -> None:
    remembering, forgetting = _codecs("qwen3")
    remembering.history = History(entries=5)  # fewer than the conversations: they evict each other too
    chats = [_bench_chat(8, reasoning=True) for _ in range(6)]
    for index, chat in enumerate(chats):
        chat[0]["content"] += f" (conversation {index})"
    expected = {
        (index, end): forgetting.encode(chat[:end], return_assistant_tokens_mask=True).assistant_mask
        for index, chat in enumerate(chats)
        for end in range(3, len(chat) + 1, 2)
    }
    failures: list[str] = []

    def grow(index: int) -> None:
        for end in range(3, len(chats[index]) + 1, 2):
            mask = remembering.encode(
                copy.deepcopy(chats[index][:end]), return_assistant_tokens_mask=True
            ).assistant_mask
            if mask != expected[index, end]:
                failures.append(f"conversation {index} at {end}")

    in_threads(grow, len(chats))
    assert not failures


def test_a_mask_read_later_goes_on_from_the_last_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mask not asked for in encode but read from the encoding afterwards goes on from the last encode's too,
    and is kept for the next; reading the default mask twice gives the same list (the memory, once kept, is
    never changed)."""
    remembering, forgetting = _codecs("qwen3")
    tally = Tally(monkeypatch)
    chat = _bench_chat(6, reasoning=True)
    for end in range(3, len(chat) + 1, 2):
        later = remembering.encode(chat[:end])
        assert later.assistant_mask == forgetting.encode(chat[:end], return_assistant_tokens_mask=True).assistant_mask
    # the first encode is not a growing one, the second has no mask to go on from, the other four went on
    assert tally.anchors == tally.turns == tally.bits == 4
    grown = remembering.encode([*chat, {"role": "user", "content": "more?"}])
    again = grown.mask()
    assert again == grown.assistant_mask and again is not grown.assistant_mask


def test_an_encoding_read_late_does_not_hold_the_historys_entries() -> None:
    """An encoding whose mask is not read yet holds the last encode's mask memory, not its own history entry:
    once the history lets the entry go, it is gone, and the mask read then is still a fresh codec's."""
    remembering, forgetting = _codecs("qwen3")
    chat = _bench_chat(4, reasoning=True)
    assert remembering.encode(chat[:3]).assistant_mask
    assert remembering.encode(chat[:5]).assistant_mask  # the memory the next one goes on from
    grown = remembering.encode(chat[:7])
    assert grown._growing is not None and grown._growing.previous is not None
    entries = [weakref.ref(entry) for slot in remembering.history._slots.values() for entry in slot]
    assert entries
    remembering.history.clear()
    gc.collect()
    assert all(entry() is None for entry in entries)
    assert grown.assistant_mask == forgetting.encode(chat[:7], return_assistant_tokens_mask=True).assistant_mask


def _grow_with(source: str, chats: list[list[dict[str, Any]]]) -> None:
    """Encode ``chats`` in turn with the mask through a codec that remembers, each as a fresh codec would."""
    remembering, forgetting = _codecs("qwen3")
    template = ChatTemplate(source, special_tokens={"eos_token": "<|im_end|>"})
    remembering, forgetting = remembering.with_template(template), forgetting.with_template(template)
    forgetting.history = History(entries=0)
    for chat in chats:
        _compare(remembering, forgetting, chat, {"add_generation_prompt": chat[-1]["role"] == "user"})
    assert remembering.template.resumable


def test_markers_that_are_another_messages_now_are_read_again() -> None:
    """A chat cut back and grown otherwise can render as before, character for character and marker for marker,
    while the markers belong to another message (the template skips empty messages and prints no role): the
    anchors of the messages not seen as before are read again, with their new owners."""
    source = (
        "{% for m in messages %}{% if m.content %}{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}]  # where the memory is found
    before = [*first, {"role": "assistant", "content": ""}, {"role": "user", "content": "X"}]
    after = [*first, {"role": "assistant", "content": "X"}]
    _grow_with(source, [first, before, after])


def test_a_prompt_that_changed_where_the_marked_render_did_not_is_read_again() -> None:
    """A template whose text depends on the last message's content (compared with a word, which marked content
    never equals) changes its prompt where the marked render does not: the marked render then no longer gives
    the prompt, and the mask is found as a fresh codec finds it (assistant content only)."""
    source = (
        "{% if messages[-1].content == 'yes' %}A{% else %}B{% endif %}\n"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": "yes"},
    ]
    _grow_with(source, [chat[:1], chat[:3], chat])


def test_a_message_that_became_the_assistants_in_place_is_masked_anew() -> None:
    """A caller who changes an earlier message's role in place, with a template that prints no role: the prompt
    and its tokens are the same up to the new messages, but that message is now an assistant turn, and its
    tokens are masked although the tokenizer kept them."""
    source = (
        "{% for m in messages %}{% if m.content %}{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    chat = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    grown = [*chat, {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]
    edited = copy.deepcopy(grown)
    edited[3]["role"] = "assistant"
    _grow_with(source, [chat[:2], chat, grown, edited])


def test_generation_spans_move_by_the_stand_ins_before_them() -> None:
    """A tagged template's spans are moved to the restored text by bisection: as far as the stand-ins before
    each edge grow (stand-ins for one character move nothing, and are not looked for)."""
    rendered = "aXbYYcXd"
    escapes = {"X": "<<", "Y": "[[["}
    expand = masks._expander(rendered, escapes)
    restored = rendered.replace("X", "<<").replace("Y", "[[[")
    for position in range(len(rendered) + 1):
        grown = sum(len(escapes[c]) - 1 for c in rendered[:position] if c in escapes)
        assert expand(position) == position + grown
        assert restored[: expand(position)].replace("<<", "X").replace("[[[", "Y") == rendered[:position]
