"""A chat that grows one turn at a time: what Codec.encode costs per turn, against tokenizing that turn alone.

Serving and agent loops encode the whole history at every request. This bench grows a chat to 100 turns
(a user question, then the answer; Qwen3 answers with reasoning, which its template drops from earlier
turns; some text holds ``<`` and ``>``) and encodes it before each answer, with the generation prompt, as a
server does. Every text is new to the codec, as in real use. For each turn it reports, in CPU time:

* ``encode``: ``Codec.encode`` of the whole chat, with the codec's memory of the conversation (the default):
  its render resumes the last one (:mod:`chatcodec.resuming`) and its tokens are reused up to the new text;
* ``no memory``: the same with ``History(entries=0)``, everything rendered and encoded again;
* ``render``: a fresh render of the whole chat by the template (what an encode without memory pays first);
* ``turn alone``: the tokenizers library encoding only the text this turn added to the prompt (the
  previous answer and the new question), the least any encoder must pay: the best of five calls in a row,
  the last four on caches the first one warmed;
* ``first call``: the first of those five calls, made as the encode is: once, after the call of the turn before;
* ``turn encode``: ``Codec.encode`` of a chat of this turn's messages alone (the previous answer and the new
  question, with the generation prompt): the same pipeline, on the new turn only;

* ``conversation``: the same turn as RL and agent loops take it, token in and token out
  (:class:`chatcodec.Conversation`, issue 32): ``append`` of the question with the generation prompt, plus
  ``add_completion`` of the answer's ids as the model would have sampled them (the tokenizer's ids of the
  turn the template writes, up to its end-of-turn token): its cost must not grow with the history;

and the ratios ``encode / turn alone``, ``encode / first call`` and ``encode / turn encode``. Every fourth
question holds ``<`` and ``>``, which the escaping works on, so single turns differ in kind (turns 20, 40 and
100 hold them, 10, 30 and 50 do not): the rows ``10-20`` and ``90-100`` (means over those turns, the same mix)
are the ones to compare for growth. With them, ``floor``: what any encode of the whole chat must do whatever
it remembers, timed alone, once per turn as the encode is: compare every message with a copy kept since the
turn it came (the caller may have changed any of them in place) and copy the ids list handed back (the
caller owns it); the last lines give how much the encode grows from 10-20 to 90-100 turns, and how much of
it is left once that floor is taken off.

The same growth read as training or RL rollouts read it (``--masks``, the default; ``--no-masks`` leaves it out):
each chat ends with the answer, encoded with ``return_assistant_tokens_mask=True``:

* ``mask``: with the codec's memory: the mask goes on from the last encode's (:class:`chatcodec.masks.MaskMemory`);
* ``mask, no memory``: the same with ``History(entries=0)``, the mask worked out on the whole chat;
* ``no mask``: the encode of the same chats with memory, without the mask;
* ``turn alone``: the tokenizers library encoding only the text this chat added to the last one's prompt
  (the last question and its answer), best of five calls in a row;

and the ratios ``mask / turn alone``, ``mask / no mask`` and ``no memory / mask``; the masks are checked against
the codec without memory at every turn. Every codec has
its own caches, so each meets every text for the first time. Ids are checked against the codec without
memory at every turn. Each figure is the best of ``--rounds`` growths (each with its own text). As in
``timeit``, the garbage collector does not run during a timed call (``--gc`` lets it): a collection costs
what the whole process holds, and falls at the same turns in every growth.

Each kind of call runs in a pass of its own over the turns, so a timed call follows one of its own kind on
the turn before, as in a server that encodes one request after another: measured between the other
measures, a call at turn 100 followed the encodes and renders of a whole 100-turn chat, which leave less of
the processor's caches than those at turn 10 (the tokenizers library's call on the same text measured
1.2-1.4x slower there). ``--flush MIB`` writes that much memory before every timed call (but the four
repeated tokenizer calls): with more than the last-level cache (64 on this machine's 32 MiB), every call
starts from memory, as in a server where a model's forward pass runs between two requests.

Run: ``PYTHONPATH=src python bench/bench_growing.py [--rounds 5] [--turns 100] [--gc] [--flush MIB] [--no-masks]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[2] / "shared"
REPORTED = (1, 10, 20, 30, 40, 50, 70, 100)


def chat(turns: int, name: str, round_: int) -> list[dict[str, Any]]:
    """A system prompt and ``turns`` question/answer pairs; ``round_`` makes every text new."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a careful assistant (session {round_}). Answer briefly."}
    ]
    for i in range(turns):
        question = f"Question {i} of session {round_}: what is {i} times {i + 3}, and how does it change the plan?"
        if i % 4 == 3:
            question += f" Compare with x < {i} and y > {i + 1}."
        answer: dict[str, Any] = {
            "role": "assistant",
            "content": f"{i * (i + 3)}. Step {i} depends on it, so the running total is {i * i + round_} now.",
        }
        if name == "qwen3":
            answer["reasoning_content"] = f"They ask for {i} times {i + 3}; that is {i * (i + 3)}."
        messages += [{"role": "user", "content": question}, answer]
    return messages


#: whether the garbage collector may run during a timed call (``--gc``); by default it may not, as in timeit:
#: a collection costs what the whole process holds (here three codecs' memories and every chat), and it
#: falls at the same turns in every growth, so that taking the best of several would not remove it
COLLECT = False
#: written before each timed call (--flush): one byte per cache line of it
FLUSH = bytearray()
_ZEROS = b""


def _cold(fn: Callable[..., Any], *args: Any, **options: Any) -> tuple[float, Any]:
    """:func:`_cpu` after ``FLUSH`` is written: on the caches a server's call finds."""
    FLUSH[::64] = _ZEROS
    return _cpu(fn, *args, **options)


def _cpu(fn: Callable[..., Any], *args: Any, **options: Any) -> tuple[float, Any]:
    collecting = gc.isenabled()
    if not COLLECT:
        gc.disable()
    try:
        start = time.process_time()
        result = fn(*args, **options)
        return time.process_time() - start, result
    finally:
        if collecting:
            gc.enable()


def _best_cold(repeats: int, fn: Callable[..., Any], *args: Any, **options: Any) -> float:
    return min(_cold(fn, *args, **options)[0] for _ in range(repeats))


def _first_and_best(repeats: int, fn: Callable[..., Any], *args: Any, **options: Any) -> tuple[float, float]:
    """The first call (cold) and the best of ``repeats`` calls in a row, the later ones on caches the first
    one warmed."""
    first = _cold(fn, *args, **options)[0]
    return first, min([first] + [_cpu(fn, *args, **options)[0] for _ in range(repeats - 1)])


NAMES = ("encode", "plain", "render", "alone", "once", "turn", "floor", "conversation")
#: the mask passes (--masks): with memory, without, the same encodes without the mask, the added text alone
MASK_NAMES = ("mask", "mask_plain", "answer", "mask_alone")
#: whether the mask passes run
MASKS = True


def measure(name: str, folder: Path, rounds: int, turns: int) -> dict[str, list[float]]:
    """The best CPU time of each measure at each turn, over ``rounds`` growths."""
    names = NAMES + MASK_NAMES if MASKS else NAMES
    best: dict[str, list[float]] = {k: [float("inf")] * turns for k in names}
    for round_ in range(rounds):
        figures = grow(name, folder, round_, turns)
        if MASKS:
            figures = [a + b for a, b in zip(figures, grow_masked(folder, chat(turns, name, round_)), strict=True)]
        for turn, values in enumerate(figures):
            for key, value in zip(names, values, strict=True):
                best[key][turn] = min(best[key][turn], value)
    return best


def grow_masked(folder: Path, full: list[dict[str, Any]]) -> list[tuple[float, ...]]:
    """The growth read for training: every chat ends with the answer and asks for the assistant mask. Each kind
    of call in a pass of its own, each codec with caches of its own; masks checked against the codec without
    memory."""
    from chatcodec import History
    from chatcodec.tokens import load

    masking, forgetting, answering = load(folder), load(folder), load(folder)
    forgetting.history = History(entries=0)
    tokenizer = masking.tokenizer
    assert tokenizer is not None
    answered = [full[: 2 * turn + 1] for turn in range(1, (len(full) - 1) // 2 + 1)]
    masks, additions, digests = _growth(
        masking, answered, lambda e: hash((tuple(e.input_ids), tuple(e.assistant_mask))),
        return_assistant_tokens_mask=True,
    )  # fmt: skip
    plain = []
    for messages, digest in zip(answered, digests, strict=True):
        spent, fresh = _cold(forgetting.encode, messages, return_assistant_tokens_mask=True)
        assert hash((tuple(fresh.input_ids), tuple(fresh.assistant_mask))) == digest, len(messages)
        plain.append(spent)
    answers = [_cold(answering.encode, messages)[0] for messages in answered]
    alone = [_first_and_best(5, tokenizer.encode, added, add_special_tokens=False)[1] for added in additions]
    return list(zip(masks, plain, answers, alone, strict=True))


def _growth(
    codec: Any, chats: list[list[dict[str, Any]]], digest: Callable[[Any], int], **options: Any
) -> tuple[list[float], list[str], list[int]]:
    """Each chat encoded in turn, in a pass of its own: the times, what each text added to the last one's, and a
    digest of each encoding (a server keeps no old encoding: holding them all would grow the heap the later
    encodes run in)."""
    from chatcodec.vocab import common_prefix

    times, additions, digests, previous = [], [], [], ""
    for messages in chats:
        spent, encoding = _cold(codec.encode, messages, **options)
        times.append(spent)
        additions.append(encoding.text[common_prefix(previous, encoding.text) :])
        digests.append(digest(encoding))
        previous = encoding.text
    return times, additions, digests


def grow(name: str, folder: Path, round_: int, turns: int) -> list[tuple[float, ...]]:
    """One growth from an empty chat: the figures of every turn, each codec with caches of its own.

    Each kind of call runs in a pass of its own, turn after turn, so that what comes before a timed call is
    a call of the same kind on the turn before, not the other measures' work on the whole chat.
    """
    from chatcodec import History
    from chatcodec.tokens import load

    remembering, forgetting, single = load(folder), load(folder), load(folder)
    forgetting.history = History(entries=0)
    tokenizer = remembering.tokenizer
    assert tokenizer is not None
    full = chat(turns, name, round_)
    chats = [full[: 2 * turn] for turn in range(1, turns + 1)]  # the system prompt, the turns, the question
    encodes, additions, digests = _growth(
        remembering, chats, lambda e: hash(tuple(e.input_ids)), add_generation_prompt=True
    )
    plain, renders = [], []
    for messages, digest in zip(chats, digests, strict=True):
        spent_plain, fresh = _cold(forgetting.encode, messages, add_generation_prompt=True)
        assert hash(tuple(fresh.input_ids)) == digest, (name, len(messages))
        plain.append(spent_plain)
        renders.append(_best_cold(3, remembering.template.render, messages, add_generation_prompt=True))
    alone, once = [], []
    for added in additions:
        # the first call, as the encode makes its own, and the warm floor
        first, best = _first_and_best(5, tokenizer.encode, added, add_special_tokens=False)
        once.append(first)
        alone.append(best)
    # the previous answer and this question, alone
    turn_encodes = [
        _cold(single.encode, full[max(2 * turn - 2, 1) : 2 * turn], add_generation_prompt=True)[0]
        for turn in range(1, turns + 1)
    ]
    # last, not to hold every encoding while the others run: what an encode of the whole chat cannot avoid, timed
    # once as the encode is, with copies made as the chat grew (as a memory's are: not all fresh in the caches)
    floors, kept = [], []
    for messages in chats:
        ids = forgetting.encode(messages, add_generation_prompt=True).input_ids
        kept += [dict(m) for m in messages[len(kept) :]]
        floors.append(_cold(_read_and_write, messages, kept, ids)[0])
    rollout = roll(load(folder), full, turns)
    return [
        (encodes[i], plain[i], renders[i], alone[i], once[i], turn_encodes[i], floors[i], rollout[i])
        for i in range(turns)
    ]


def roll(codec: Any, full: list[dict[str, Any]], turns: int) -> list[float]:
    """The growth as a rollout: per turn, ``Conversation.append`` of the question (with the generation prompt)
    plus ``add_completion`` of the answer's sampled ids, in a pass of their own on a codec of its own. The
    sampled ids are made first: the tokenizer's ids of the answer's turn as the template writes it after the
    generation prompt, up to its end-of-turn token (what a model trained on the template samples)."""
    tokenizer = codec.tokenizer
    render = codec.template.render
    control = {tokenizer.token_to_id(t) for t in codec.control_tokens} - {None}
    sampled = []
    for turn in range(1, turns + 1):
        prompt = render(full[: 2 * turn], add_generation_prompt=True)
        answered = render(full[: 2 * turn + 1])
        assert answered.startswith(prompt)
        ids = tokenizer.encode(answered[len(prompt) :], add_special_tokens=False).ids
        while ids and ids[-1] not in control:
            ids.pop()  # the glue after the end of turn is the template's, the next append's
        sampled.append(ids)
    conv = codec.conversation(full[:1])
    times = []
    for turn in range(1, turns + 1):
        asked = _cold(conv.append, full[2 * turn - 1], add_generation_prompt=True)[0]
        answered_in = _cold(conv.add_completion, sampled[turn - 1])[0]
        times.append(asked + answered_in)
    assert conv.sampled_mask.count(1) == sum(map(len, sampled))
    # the sampled ids are the tokenizer's own: only a template that rewrites history (Qwen3 drops the earlier
    # reasoning, which the conversation keeps as the model saw it) makes a fresh encode differ
    drift = conv.drift()
    assert drift.equal == ("reasoning_content" not in full[2]), drift
    assert drift.equal or drift.reason == "rewritten", drift
    return times


def _read_and_write(messages: list[dict[str, Any]], kept: list[dict[str, Any]], ids: list[int]) -> list[int]:
    """The floor: every message compared with the copy kept of it, and the ids copied for the caller."""
    if messages != kept:
        raise AssertionError("the copies differ")
    return list(ids)


def _mean(best: dict[str, list[float]], turns: range) -> Callable[[str], float]:
    """The mean over ``turns`` of a measure's best times, in microseconds."""
    return lambda key: statistics.mean(best[key][t - 1] for t in turns) * 1e6


def _per_alone(best: dict[str, list[float]], turns: range) -> float:
    """The mean over ``turns`` of the encode's best time over the turn alone's."""
    return statistics.mean(best["encode"][t - 1] / best["alone"][t - 1] for t in turns)


def report(name: str, label: str, best: dict[str, list[float]], turns: range) -> None:
    mean = _mean(best, turns)
    encode, alone, render, single_turn = mean("encode"), mean("alone"), mean("render"), mean("turn")
    once = mean("once")
    print(
        f"{name:<9} {label:>6} {encode:>7.0f} {mean('plain'):>10.0f} {render:>7.0f}"
        f" {alone:>11.0f} {once:>10.0f} {single_turn:>12.0f} {encode / alone:>12.2f}x {encode / once:>11.2f}x"
        f" {encode / single_turn:>11.2f}x {mean('floor'):>7.1f} {mean('conversation'):>13.0f}"
    )


def report_masks(name: str, label: str, best: dict[str, list[float]], turns: range) -> None:
    mean = _mean(best, turns)
    mask, plain, answer, alone = mean("mask"), mean("mask_plain"), mean("answer"), mean("mask_alone")
    print(
        f"{name:<9} {label:>6} {mask:>7.0f} {plain:>16.0f} {answer:>8.0f} {alone:>11.0f}"
        f" {mask / alone:>11.2f}x {mask / answer:>12.2f}x {plain / mask:>15.2f}x"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument("--gc", action="store_true", help="let the garbage collector run during timed calls")
    parser.add_argument(
        "--flush", type=int, default=0, metavar="MIB", help="memory written before each timed call, evicting caches"
    )
    parser.add_argument(
        "--masks", action=argparse.BooleanOptionalAction, default=True, help="the growth read with assistant masks"
    )
    args = parser.parse_args()
    global COLLECT, FLUSH, _ZEROS, MASKS
    COLLECT = args.gc
    MASKS = args.masks
    FLUSH = bytearray(max(args.flush, 0) << 20)
    _ZEROS = bytes(len(FLUSH[::64]))
    print(
        f"CPU time per call in microseconds, best of {args.rounds} growths; ratios against 'turn alone';"
        f" garbage collector {'on' if COLLECT else 'off'} during timed calls; {args.flush} MiB written before"
        " each timed call."
    )
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    header = (
        f"{'model':<9} {'turn':>6} {'encode':>7} {'no memory':>10} {'render':>7} {'turn alone':>11}"
        f" {'first call':>10} {'turn encode':>12} {'encode/alone':>13} {'encode/first':>12} {'encode/turn':>12}"
        f" {'floor':>7} {'conversation':>13}"
    )
    print(header)
    measured = {}
    for name in ("qwen3", "llama3_1"):
        best = measured[name] = measure(name, args.shared / "tokenizers" / name, args.rounds, args.turns)
        for turn in REPORTED:
            if turn <= args.turns:
                report(name, str(turn), best, range(turn, turn + 1))
        for first, last in ((10, 20), (30, 40), (90, 100)):
            if last <= args.turns:
                report(name, f"{first}-{last}", best, range(first, last + 1))
        if args.turns >= 100:
            early_turns, late_turns = range(10, 21), range(90, 101)
            early, late = _mean(best, early_turns), _mean(best, late_turns)
            growth_per_alone = _per_alone(best, late_turns) / _per_alone(best, early_turns)
            beyond_early, beyond_late = early("encode") - early("floor"), late("encode") - late("floor")
            print(
                f"{name:<9} encode at 90-100 turns / at 10-20 turns: {late('encode') / early('encode'):.2f}x;"
                f" encode/alone: {growth_per_alone:.2f}x; encode less the floor:"
                f" {beyond_late:.0f} / {beyond_early:.0f} us = {beyond_late / beyond_early:.2f}x"
                f" (floor {early('floor'):.1f} -> {late('floor'):.1f} us)"
            )
            print(
                f"{name:<9} conversation (append + add_completion) at 90-100 turns / at 10-20 turns:"
                f" {late('conversation'):.0f} / {early('conversation'):.0f} us"
                f" = {late('conversation') / early('conversation'):.2f}x"
            )
    if MASKS:
        print("\nThe same growth, each chat ending with the answer, encoded with return_assistant_tokens_mask=True:")
        print(
            f"{'model':<9} {'turns':>6} {'mask':>7} {'mask, no memory':>16} {'no mask':>8} {'turn alone':>11}"
            f" {'mask/alone':>12} {'mask/no mask':>13} {'no memory/mask':>16}"
        )
        for name, best in measured.items():
            for first, last in ((1, 1), (10, 10), (30, 40), (90, 100), (100, 100)):
                if last <= args.turns:
                    label = str(first) if first == last else f"{first}-{last}"
                    report_masks(name, label, best, range(first, last + 1))
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
