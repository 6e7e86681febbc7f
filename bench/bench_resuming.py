"""A growing chat rendered on every corpus template: a render that resumes the last one against a fresh one.

``Codec.encode`` of a conversation it has seen resumes the template's last render (``chatcodec.resuming``):
the iterations of its loop over the messages that cannot come out differently are copied, not run again.
For each corpus template this bench grows a chat one question and answer at a time (a system prompt, then
user and assistant turns, the assistant's with reasoning) and renders it after each question, with the
generation prompt, twice: fresh (``ChatTemplate.render``) and resuming the previous render of the same
growth (``ChatTemplate.render_resuming``, given the messages that render saw, as the codec does). Both
outputs are checked equal. It prints, per template, whether it resumed, and the CPU time of both at 10,
30-40 and 90-100 turns (best of ``--rounds`` growths, garbage collector off during timed calls), and the
medians over the templates that resume. Templates that refuse the chat (it has no tools, images or other
roles they require) are listed as such.

Run: ``PYTHONPATH=src python bench/bench_resuming.py [--rounds 3] [--turns 100]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from bench_growing import _cpu  # CPU time, the garbage collector off

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
NOW = datetime(2026, 11, 29, 12, 0, 0)
SPANS = {"10": range(10, 11), "30-40": range(30, 41), "90-100": range(90, 101)}


def chat(turns: int, round_: int) -> list[dict[str, Any]]:
    """A system prompt and ``turns`` exchanges, every text new in each round."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are careful (session {round_})."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i} of session {round_}: what is {i} times 7?"})
        messages.append(
            {"role": "assistant", "content": f"It is {i * 7}.", "reasoning_content": f"{i} times 7 is {i * 7}."}
        )
    return messages


def grow(template: Any, turns: int, round_: int) -> tuple[list[float], list[float], int]:
    """Fresh and resumed render times at each turn of one growth, and how many iterations were resumed."""
    from chatcodec.resuming import Memo

    full = chat(turns, round_)
    fresh_times, resumed_times, resumed = [], [], 0
    previous, seen = None, None
    for turn in range(1, turns + 1):
        messages = full[: 2 * turn]  # the system prompt, the turns before, this question
        spent, fresh = _cpu(template.render, messages, add_generation_prompt=True, now=NOW)
        given = messages if seen is None else seen + messages[len(seen) :]
        memo = Memo(previous, len(seen) if seen is not None else 0)
        spent_again, again = _cpu(template.render_resuming, memo, given, add_generation_prompt=True, now=NOW)
        assert again == fresh, (template.name, turn)
        fresh_times.append(spent)
        resumed_times.append(spent_again)
        resumed += memo.resumed
        previous, seen = (memo.record, memo.messages) if memo.record is not None else (None, None)
    return fresh_times, resumed_times, resumed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=100)
    args = parser.parse_args()
    import chatcodec
    from chatcodec import ChatcodecError

    entries = json.loads((CORPUS / "manifest.json").read_text())["templates"]
    spans = {label: turns for label, turns in SPANS.items() if turns.stop - 1 <= args.turns}
    print(f"CPU time of a render in microseconds, best of {args.rounds} growths; fresh / resumed (x faster)")
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"{'template':<48} " + " ".join(f"{label + ' turns':>24}" for label in spans))
    speedups: dict[str, list[float]] = {label: [] for label in spans}
    refused, unresumed = [], []
    for entry in entries:
        source = (CORPUS / entry["file"]).read_text(encoding="utf-8")
        template = chatcodec.ChatTemplate(source, special_tokens=entry["special_tokens"], name=entry["name"])
        fresh = [float("inf")] * args.turns
        again = [float("inf")] * args.turns
        try:
            for round_ in range(args.rounds):
                times, resumed_times, resumed = grow(template, args.turns, round_)
                fresh = [min(a, b) for a, b in zip(fresh, times, strict=True)]
                again = [min(a, b) for a, b in zip(again, resumed_times, strict=True)]
        except ChatcodecError as exc:
            refused.append(f"{entry['name']} ({type(exc).__name__})")
            continue
        if not resumed:
            unresumed.append(entry["name"])
            continue
        cells = []
        for label, turns in spans.items():
            before = statistics.mean(fresh[t - 1] for t in turns) * 1e6
            after = statistics.mean(again[t - 1] for t in turns) * 1e6
            speedups[label].append(before / after)
            cells.append(f"{before:7.0f} / {after:5.0f} ({before / after:4.1f}x)")
        print(f"{entry['name']:<48} " + " ".join(f"{cell:>24}" for cell in cells))
    resumed_count = len(speedups[next(iter(spans))])
    print(f"resumed: {resumed_count} of {len(entries)} templates; median speed-up " + ", ".join(
        f"{label} turns {statistics.median(values):.1f}x" for label, values in speedups.items() if values
    ))  # fmt: skip
    print(f"rendered in full every time: {', '.join(unresumed) or 'none'}")
    print(f"refuse this chat: {', '.join(refused) or 'none'}")
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
