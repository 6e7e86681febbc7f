"""Unrender's work is bounded and linear: every prompt is read or refused within WORK_BASE + WORK_PER_CHAR
units of work, and a prompt that can be read is read within them. The prompts are the review's (25 turns plus
one character, 400 turns, many empty turns) and their neighbours: glues inside one text, headers alone, one huge
text, reasoning in every turn. What the units cost in seconds (the module's docstring: about 2 s per MB on an
idle core) is measured, not asserted here, by ``bench/bench_unrender.py --hostile`` on these same prompts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import chatcodec.unrender as unrender
from chatcodec import Limits, PromptMismatchError, load_template, parse_conversation

#: the renders these tests make (the prompts of 20,000 turns, and what is read back) are not the subject here:
#: the render's clock, 5 s by default, must not refuse one on a loaded machine
UNHURRIED = Limits(timeout=600)


def _chat(turns: int, user: str = "question {i}", assistant: str = "answer {i}") -> list[dict[str, str]]:
    messages = []
    for i in range(turns):
        messages += [
            {"role": "user", "content": user.format(i=i)},
            {"role": "assistant", "content": assistant.format(i=i)},
        ]
    return messages


def _prompts() -> dict[str, Callable[[], tuple[str, bool]]]:
    """Each prompt (made when its test runs), with whether it must be read (True) or may be refused."""
    qwen3 = load_template("qwen3")
    qwen3.limits = UNHURRIED  # rendering 20,000 turns passed the 5 s clock on a loaded CI machine
    return {
        "25 turns plus one character": lambda: (qwen3.render(_chat(25)) + "x", False),
        "400 turns plus one character": lambda: (qwen3.render(_chat(400)) + "x", False),
        "400 turns": lambda: (qwen3.render(_chat(400)), True),
        "12,000 turns (1 MB)": lambda: (qwen3.render(_chat(12_000)), True),
        "12,000 turns plus one character": lambda: (qwen3.render(_chat(12_000)) + "x", False),
        "20,000 empty turns": lambda: (qwen3.render(_chat(20_000, "", "")), True),
        "20,000 empty turns plus one character": lambda: (qwen3.render(_chat(20_000, "", "")) + "x", False),
        "reasoning in 6,000 turns": lambda: (
            qwen3.render(_chat(6000, assistant="<think>\nr{i}\n</think>\n\na{i}")),
            True,
        ),
        "30,000 glues inside one user text": lambda: (
            "<|im_start|>user\n" + "<|im_end|>\n<|im_start|>assistant\n" * 30_000 + "<|im_end|>\n",
            False,
        ),
        "headers alone, 1 MB": lambda: ("<|im_start|>user\n" * 60_000, False),
        "one 1 MB user text": lambda: (qwen3.render([{"role": "user", "content": "a" * 1_000_000}]), True),
        "one 1 MB reasoning": lambda: (
            qwen3.render(
                [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "<think>" + "a b " * 250_000 + "</think>ok"},
                ]
            ),
            False,
        ),
    }


PROMPTS = _prompts()


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("name", list(PROMPTS))
def test_every_prompt_is_read_or_refused_within_the_bound(
    name: str, strict: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    qwen3 = load_template("qwen3")
    qwen3.limits = UNHURRIED
    parse_conversation(qwen3, "<|im_start|>user\nhi<|im_end|>\n")  # the grammar is learned once, not counted here
    made = _count_work(monkeypatch)
    prompt, readable = PROMPTS[name]()
    refusal = ""
    try:
        parsed = parse_conversation(qwen3, prompt, strict=strict)
    except PromptMismatchError as exc:
        refusal = str(exc)
        assert not readable, f"refused: {refusal}"
        assert refusal.count("\n") == 0
    else:
        assert qwen3.render(parsed.messages, **parsed.render_options()) == prompt
    (work,) = made
    assert ("work budget" in refusal) == work.spent, "refused for the budget exactly when it ran out"
    assert work.budget == unrender.WORK_BASE + unrender.WORK_PER_CHAR * len(prompt)


def _count_work(monkeypatch: pytest.MonkeyPatch) -> list[unrender._Work]:
    """Every work budget made from now on, in order."""
    made: list[unrender._Work] = []
    original = unrender._Work.__init__

    def counting(self: unrender._Work, length: int) -> None:
        original(self, length)
        made.append(self)

    monkeypatch.setattr(unrender._Work, "__init__", counting)
    return made


def test_the_budget_is_linear_and_counts_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """The units spent never pass the budget, the budget grows with the prompt, and decoding is paid for."""
    qwen3 = load_template("qwen3")
    qwen3.limits = UNHURRIED
    made = _count_work(monkeypatch)
    for turns in (100, 1000, 4000):
        prompt = qwen3.render(_chat(turns)) + "x"
        with pytest.raises(PromptMismatchError, match="work budget"):
            parse_conversation(qwen3, prompt, strict=False)
        work = made[-1]
        assert work.budget == unrender.WORK_BASE + unrender.WORK_PER_CHAR * len(prompt)
        assert work.left <= 0  # refused because it was spent, and it stopped there
    reasoning = qwen3.render(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>" + "a b " * 100_000 + "</think>ok"},
        ]
    )
    with pytest.raises(PromptMismatchError, match="work budget"):
        parse_conversation(qwen3, reasoning)  # 400,000 characters to decode cost more than the budget holds
    small = qwen3.render(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>" + "a b " * 1000 + "</think>ok"}]
    )
    parsed = parse_conversation(qwen3, small)  # a small one is read, decoding and all
    assert qwen3.render(parsed.messages, **parsed.render_options()) == small
