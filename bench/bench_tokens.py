"""Encoding speed: chatcodec's Codec.encode against transformers' apply_chat_template(tokenize=True).

Both sides load the same local tokenizer folders (../shared/tokenizers) and encode the same corpus
conversations in one run. Three workloads:

* ``corpus``: every corpus conversation the template renders, once each (little reuse: a cold cache);
* ``growing``: a 20-turn chat encoded after each new turn, as a chat server does;
* ``repeat``: the same long conversation over and over (an epoch over a dataset seen before).

Run: ``PYTHONPATH=src python bench/bench_tokens.py [--rounds 5]``. Needs transformers (the reference).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[2] / "shared"


def _best(fn: Callable[[], Any], rounds: int) -> float:
    fn()  # warm up (compiles the template, fills what each side caches between calls)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)  # the least disturbed round: both sides get the same rule


def _runners(hf: Any, codec: Any, calls: list[Any], *, cold: bool) -> tuple[Callable[[], None], Callable[[], None]]:
    def reference() -> None:
        for messages, tools, options in calls:
            hf.apply_chat_template(messages, tools=tools, tokenize=True, **options)

    def chatcodec() -> None:
        if cold:  # every round starts with an empty cache: each conversation is new to the codec
            codec._vocab._cache.clear()
        for messages, tools, options in calls:
            codec.encode(messages, tools=tools, **options)

    return reference, chatcodec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--shared", type=Path, default=SHARED)
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    warnings.simplefilter("ignore")
    from transformers import AutoTokenizer  # the reference, never a dependency of chatcodec

    from chatcodec.tokens import load

    corpus = json.loads((args.shared / "corpus" / "conversations.json").read_text(encoding="utf-8"))["conversations"]
    long_chat = next(c for c in corpus if c["id"] == "long_20_turn")["messages"]
    print(f"{'tokenizer':<10} {'workload':<9} {'calls':>5} {'transformers':>13} {'chatcodec':>10} {'speed-up':>9}")
    ratios = []
    for name in ("qwen3", "llama3_1"):
        folder = args.shared / "tokenizers" / name
        hf = AutoTokenizer.from_pretrained(str(folder))
        codec = load(folder)
        jobs = []
        for conv in corpus:
            for options in conv["option_sets"]:
                try:
                    hf.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=True, **options)
                except Exception:
                    continue
                jobs.append((conv["messages"], conv["tools"], options))
        growing = [(long_chat[:n], None, {"add_generation_prompt": True}) for n in range(2, len(long_chat) + 1, 2)]
        workloads = {"corpus": jobs, "growing": growing, "repeat": [(long_chat, None, {})] * 20}
        for workload, calls in workloads.items():
            for messages, tools, options in calls:  # the same ids, or the comparison means nothing
                ours = codec.encode(messages, tools=tools, content_special_tokens="allow", **options).input_ids
                theirs = hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False, **options)
                assert ours == list(theirs), (name, workload)

            reference, chatcodec = _runners(hf, codec, calls, cold=workload == "corpus")
            theirs_time = _best(reference, args.rounds)
            ours_time = _best(chatcodec, args.rounds)
            ratios.append(theirs_time / ours_time)
            print(
                f"{name:<10} {workload:<9} {len(calls):>5} {theirs_time * 1e3:>10.1f} ms {ours_time * 1e3:>7.1f} ms"
                f" {theirs_time / ours_time:>8.2f}x"
            )
    mean = statistics.geometric_mean(ratios)
    print(f"geometric mean speed-up: {mean:.2f}x (chatcodec with its default content_special_tokens='escape')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
