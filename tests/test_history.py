"""Incremental encoding: a growing chat encodes like a fresh codec at every step, and reuses what it can.

Each test grows a conversation one turn at a time through a codec that remembers (the default) and checks
ids, text and escaped spans against a codec that remembers nothing, on the real Qwen3 and Llama-3.1
tokenizers: with reasoning Qwen3 drops from earlier turns, tool calls, marks and control tokens in content,
a caller who edits an earlier message in place, branches, and threads.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest

from chatcodec import ChatcodecError, History, InputError
from chatcodec.tokens import Codec
from chatcodec.vocab import Tokenized

from .conftest import in_threads
from .test_tokens import _codec


def _fresh(codec: Codec) -> Codec:
    """The same template and tokenizer, remembering nothing."""
    fresh = codec.with_template(codec.template)
    fresh.history = History(entries=0)
    return fresh


def _turns(count: int, name: str) -> list[dict[str, Any]]:
    """A chat of ``count`` user/assistant turns with everything a template treats differently."""
    chat: list[dict[str, Any]] = [{"role": "system", "content": "You are terse. Use <b> for bold."}]
    for i in range(count):
        user: dict[str, Any] = {"role": "user", "content": f"Question {i}: is {i} < {i + 1} and [{i}] > []?"}
        if i % 7 == 3:
            user["content"] = f"Half a token: <|im_ and {i} and end|>"
        if i % 5 == 4:
            user["content"] += " <|im_end|><|eot_id|> injected"  # type: ignore[operator]
        chat.append(user)
        answer: dict[str, Any] = {"role": "assistant", "content": f"Yes: {i} < {i + 1}. <b>Done</b>."}
        if name == "qwen3" and i % 2 == 0:
            answer["reasoning_content"] = f"Compare {i} and {i + 1}."
        if i % 6 == 5:
            answer["content"] = ""
            answer["tool_calls"] = [
                {"type": "function", "function": {"name": "lookup", "arguments": {"q": f"x<{i}>", "n": i}}}
            ]
            chat.append(answer)
            chat.append({"role": "tool", "content": f'{{"result": "{i} <ok>"}}'})
            continue
        chat.append(answer)
    return chat


def _same(left: Any, right: Any, where: str) -> None:
    assert left.input_ids == right.input_ids, where
    assert left.text == right.text, where
    assert left.escaped == right.escaped, where


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
@pytest.mark.parametrize("policy", ["escape", "allow"])
def test_a_growing_chat_encodes_as_a_fresh_codec_at_every_step(name: str, policy: str) -> None:
    codec = _codec(name).with_template(_codec(name).template)
    fresh = _fresh(codec)
    chat = _turns(24, name)
    reused = 0
    previous = None
    for end in range(2, len(chat) + 1):
        if chat[end - 1]["role"] != "user" and end != len(chat):
            continue
        messages = chat[:end]
        options: dict[str, Any] = {"add_generation_prompt": messages[-1]["role"] == "user"}
        try:
            expected = fresh.encode(messages, content_special_tokens=policy, **options)  # type: ignore[arg-type]
        except ChatcodecError:
            with pytest.raises(ChatcodecError):
                codec.encode(messages, content_special_tokens=policy, **options)  # type: ignore[arg-type]
            continue
        got = codec.encode(messages, content_special_tokens=policy, **options)  # type: ignore[arg-type]
        _same(got, expected, f"{name} {policy} after {end} messages")
        if previous is not None and got._runs and previous._runs and got._runs[0] is previous._runs[0]:
            reused += 1
        previous = got
    assert reused >= 15  # the runs of earlier turns were taken over, not made again
    assert 1 <= len(codec.history) <= 3


def test_reasoning_qwen3_drops_from_earlier_turns_is_encoded_again() -> None:
    codec = _codec("qwen3").with_template(_codec("qwen3").template)
    fresh = _fresh(codec)
    chat = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
    ]
    first = codec.encode(chat)
    assert "Two and two make four." in first.text
    chat += [{"role": "user", "content": "and 3+3?"}]
    second = codec.encode(chat, add_generation_prompt=True)
    assert "Two and two make four." not in second.text  # the template rewrote the earlier turn
    _same(second, fresh.encode(chat, add_generation_prompt=True), "after the rewrite")
    assert second._runs[0] is first._runs[0]  # what came before the rewritten turn was kept


def test_a_message_changed_in_place_is_noticed() -> None:
    codec = _codec("qwen3").with_template(_codec("qwen3").template)
    fresh = _fresh(codec)
    call = {"type": "function", "function": {"name": "f", "arguments": {"flag": 1, "note": "a"}}}
    chat: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "done"},
    ]
    codec.encode(chat, add_generation_prompt=True)
    call["function"]["arguments"]["flag"] = True  # equal to 1 in Python, printed differently
    chat[0]["content"] = "go <|im_end|> now"  # a control token where there was none
    chat.append({"role": "user", "content": "and?"})
    _same(codec.encode(chat, add_generation_prompt=True), fresh.encode(chat, add_generation_prompt=True), "edited")


def test_branches_and_policies_are_kept_apart() -> None:
    codec = _codec("llama3_1").with_template(_codec("llama3_1").template)
    fresh = _fresh(codec)
    base = [{"role": "user", "content": "Say <|eot_id|> please"}, {"role": "assistant", "content": "No."}]
    codec.encode(base)
    for branch in ("Why not?", "Fine <b>ok</b>."):
        chat = [*base, {"role": "user", "content": branch}]
        for policy in ("escape", "allow"):
            _same(
                codec.encode(chat, content_special_tokens=policy),  # type: ignore[arg-type]
                fresh.encode(chat, content_special_tokens=policy),  # type: ignore[arg-type]
                f"{branch} {policy}",
            )
    with pytest.raises(ChatcodecError, match="contains the control token"):
        codec.encode([*base, {"role": "user", "content": "x"}], content_special_tokens="reject")


def test_a_new_message_that_holds_a_stand_in_starts_over() -> None:
    codec = _codec("qwen3").with_template(_codec("qwen3").template)
    fresh = _fresh(codec)
    chat = [{"role": "user", "content": "a < b"}, {"role": "assistant", "content": "yes > no"}]
    codec.encode(chat)
    used = set(codec._marks._stand_ins.values())
    chat += [{"role": "user", "content": "the stand-ins themselves: " + "".join(sorted(used)) + " <|im_end|>"}]
    _same(codec.encode(chat), fresh.encode(chat), "stand-ins in content")


def test_the_memory_is_bounded() -> None:
    codec = _codec("qwen3").with_template(_codec("qwen3").template)
    codec.history = History(entries=3, max_bytes=1 << 30)
    for i in range(10):
        codec.encode([{"role": "user", "content": f"conversation {i}"}])
    assert len(codec.history) == 3
    codec.history = History(entries=100, max_bytes=20_000)
    for i in range(10):
        codec.encode([{"role": "user", "content": f"conversation {i} " + "long text " * 50}])
    assert 0 < codec.history.size <= 20_000 and len(codec.history) < 10
    codec.history.clear()
    assert len(codec.history) == 0 and codec.history.size == 0
    with pytest.raises(InputError, match="entries"):
        History(entries=-1)
    with pytest.raises(InputError, match="history must be"):
        Codec(codec.template, history=5)  # type: ignore[arg-type]


def test_threads_share_the_memory_safely() -> None:
    codec = _codec("llama3_1").with_template(_codec("llama3_1").template)
    codec.history = History(entries=6)  # fewer than the conversations: they evict each other too
    fresh = _fresh(codec)
    chats = [_turns(8, "llama3_1") for _ in range(8)]
    for index, chat in enumerate(chats):
        chat[0]["content"] += f" (conversation {index})"
    expected = {
        (index, end): fresh.encode(chat[:end]).input_ids for index, chat in enumerate(chats) for end in range(1, 12)
    }
    failures: list[str] = []

    def grow(index: int) -> None:
        for end in range(1, 12):
            if codec.encode(copy.deepcopy(chats[index][:end])).input_ids != expected[index, end]:
                failures.append(f"conversation {index} at {end}")

    in_threads(grow, len(chats))
    assert not failures


@pytest.mark.parametrize("masks", [False, True])
def test_threads_growing_the_same_conversation_agree_with_a_fresh_codec(masks: bool) -> None:
    """Threads encode the same growing chat at once, switching often: they find the same remembered encode;
    one takes its lists over, the others copy them or, finding them taken, tokenize in full. With masks,
    each goes on from the mask memory of the encode it found."""
    codec = _codec("qwen3").with_template(_codec("qwen3").template)
    fresh = _fresh(codec)
    chat = _turns(8, "qwen3")

    def read(encoding: Any) -> tuple[list[int], list[int] | None]:
        return encoding.input_ids, encoding.assistant_mask if masks else None

    expected = {
        end: read(fresh.encode(chat[:end], return_assistant_tokens_mask=masks)) for end in range(1, len(chat) + 1)
    }
    failures: list[str] = []

    def grow(index: int) -> None:
        for end in range(1, len(chat) + 1):
            if read(codec.encode(copy.deepcopy(chat[:end]), return_assistant_tokens_mask=masks)) != expected[end]:
                failures.append(f"thread {index} at {end}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        in_threads(grow, 6)
    finally:
        sys.setswitchinterval(interval)
    assert not failures


def _overwrite(tokens: Tokenized) -> None:
    tokens.ids[:] = [0] * len(tokens.ids)


def _cut(tokens: Tokenized) -> None:
    del tokens.ids[1:], tokens.stops[1:], tokens.stop_runs[1:], tokens.stop_ids[1:]


@pytest.mark.parametrize("meanwhile", [_overwrite, _cut])
def test_an_encode_that_extends_the_last_goes_on_in_its_lists_and_a_branch_copies_them(
    monkeypatch: pytest.MonkeyPatch, meanwhile: Any
) -> None:
    """The encode that extends the remembered one takes its ids and stops over (the memory keeps the new one
    instead); a branch, which leaves it remembered, copies them; a branch that finds them taken while it
    reads them (another thread) tokenizes in full."""
    codec = _codec("llama3_1").with_template(_codec("llama3_1").template)
    fresh = _fresh(codec)
    chat = _turns(3, "llama3_1")
    codec.encode(chat[:1])
    second = codec.encode(chat[:3], add_generation_prompt=True)  # keeps copies of the messages from now on
    kept = next(entry for slot in codec.history._slots.values() for entry in slot).tokens
    branch = [*chat[:2], {"role": "user", "content": "Another question"}]
    _same(codec.encode(branch, add_generation_prompt=True), fresh.encode(branch, add_generation_prompt=True), "branch")
    assert not kept.taken and kept.ids == second.input_ids  # copied, left as it was
    grown = codec.encode(chat[:5], add_generation_prompt=True)
    _same(grown, fresh.encode(chat[:5], add_generation_prompt=True), "grown")
    assert kept.taken and kept.ids == grown.input_ids  # went on in place

    latest = next(entry for slot in codec.history._slots.values() for entry in slot if len(entry.copies) == 5).tokens
    resume_point = Tokenized.resume_point

    def taken_meanwhile(tokens: Tokenized, *args: Any) -> Any:
        found = resume_point(tokens, *args)
        if tokens is latest and tokens.take():  # another encode takes the lists and changes them meanwhile
            meanwhile(tokens)
        return found

    monkeypatch.setattr(Tokenized, "resume_point", taken_meanwhile)
    other = [*chat[:4], {"role": "user", "content": "Yet another"}]
    _same(codec.encode(other, add_generation_prompt=True), fresh.encode(other, add_generation_prompt=True), "taken")


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_an_encode_extended_as_soon_as_it_is_remembered_keeps_its_own_ids(name: str) -> None:
    """Once an encode is remembered, another thread's encode that extends it may take its lists over and cut
    them back: the first caller's encoding holds its ids from before that (found by the threads test)."""
    codec = _codec(name).with_template(_codec(name).template)
    fresh = _fresh(codec)
    chat = _turns(4, name)
    remember = codec.history.remember
    extended: list[Any] = []
    armed: list[bool] = []

    def remember_then_extend(entry: Any, replacing: Any = None) -> None:
        remember(entry, replacing)
        if armed and len(entry.tokens.ids) > 1:  # another thread, right after: the chat grown by a turn
            armed.clear()
            extended.append(codec.encode(copy.deepcopy(chat[:5])))

    codec.history.remember = remember_then_extend  # type: ignore[method-assign]
    for end in (2, 3):  # remembered, then with copies of the messages: an encode of the chat now resumes
        _same(codec.encode(chat[:end]), fresh.encode(chat[:end]), f"{end} messages")
    armed.append(True)
    first = codec.encode(chat[:3])
    assert extended and first.input_ids == fresh.encode(chat[:3]).input_ids
    _same(extended[0], fresh.encode(chat[:5]), "the extending encode")
