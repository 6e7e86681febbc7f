"""Render speed and import cost of chatcodec, side by side with transformers 5.24 and jinja2, in one run.

    python bench/bench_render.py            # every corpus template x conversation x option set
    python bench/bench_render.py --quick    # fewer repetitions

Prints ratios (how many times faster chatcodec is), never absolute pass/fail thresholds. Needs the dev
extra (transformers) and ../shared/corpus beside the checkout.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
NOW = datetime(2026, 11, 29, 12, 0, 0)


def per_call(fn: Callable[[], Any], budget_s: float, repeats: int) -> float:
    """Best-of-``repeats`` seconds per call, each repeat running about ``budget_s``."""
    fn()
    start = time.process_time()
    fn()
    once = max(time.process_time() - start, 1e-7)
    loops = max(1, int(budget_s / once))
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(loops):
            fn()
        best = min(best, (time.process_time() - start) / loops)
    return best


def import_cost(module: str, runs: int) -> float:
    """Median wall time of `python -c "import module"` minus that of `python -c "pass"`, in seconds."""

    def median_run(code: str) -> float:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    baseline = median_run("pass")
    return median_run(f"import {module}") - baseline


def reference_tokenizer(special_tokens: dict[str, str]) -> Any:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[[unk]]": 0}, unk_token="[[unk]]"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special_tokens)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing loops")
    args = parser.parse_args()
    if not CORPUS.is_dir():
        print(f"needs the corpus at {CORPUS}", file=sys.stderr)
        return 2
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    import transformers
    import transformers.utils.chat_template_utils as ctu

    import chatcodec

    class Fixed(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return NOW

    ctu.datetime = Fixed  # the reference renders with the same pinned clock
    budget, repeats = (0.004, 2) if args.quick else (0.02, 3)

    manifest = json.loads((CORPUS / "manifest.json").read_text())["templates"]
    conversations = json.loads((CORPUS / "conversations.json").read_text())["conversations"]
    print(
        f"chatcodec {chatcodec.__version__} vs transformers {transformers.__version__}; Python {sys.version.split()[0]}"
    )
    print(f"{'template':<45} {'cases':>5} {'transformers':>13} {'chatcodec':>10} {'speed-up':>9}")

    per_template = []
    all_ratios = []
    for entry in manifest:
        source = (CORPUS / entry["file"]).read_text(encoding="utf-8")
        template = chatcodec.ChatTemplate(source, special_tokens=entry["special_tokens"], name=entry["name"])
        tokenizer = reference_tokenizer(entry["special_tokens"])
        tokenizer.chat_template = source
        ours_times, theirs_times = [], []
        for conv in conversations:
            for options in conv["option_sets"]:
                messages, tools = conv["messages"], conv["tools"]
                try:
                    expected = tokenizer.apply_chat_template(
                        copy.deepcopy(messages), tools=tools, tokenize=False, **options
                    )
                except Exception:  # the template refuses this input; nothing to time
                    continue
                assert template.render(messages, tools=tools, now=NOW, **options) == expected

                def theirs(m: Any = messages, t: Any = tools, o: Any = options, tok: Any = tokenizer) -> Any:
                    return tok.apply_chat_template(m, tools=t, tokenize=False, **o)

                def ours(m: Any = messages, t: Any = tools, o: Any = options, chat: Any = template) -> Any:
                    return chat.render(m, tools=t, now=NOW, **o)

                theirs_times.append(per_call(theirs, budget, repeats))
                ours_times.append(per_call(ours, budget, repeats))
                all_ratios.append(theirs_times[-1] / ours_times[-1])
        if not ours_times:
            continue
        t_theirs, t_ours = statistics.median(theirs_times), statistics.median(ours_times)
        per_template.append(t_theirs / t_ours)
        print(
            f"{entry['name']:<45} {len(ours_times):>5} {t_theirs * 1e6:>11.1f}us {t_ours * 1e6:>8.1f}us"
            f" {t_theirs / t_ours:>8.2f}x"
        )

    print()
    print(f"median speed-up over {len(all_ratios)} renders:        {statistics.median(all_ratios):.2f}x")
    print(f"median speed-up over {len(per_template)} templates:      {statistics.median(per_template):.2f}x")
    print(f"slowest template speed-up:                 {min(per_template):.2f}x")

    # the reference point: the Qwen3 template with a 10-turn chat
    qwen = next(e for e in manifest if e["name"] == "Qwen-Qwen3-0.6B")
    source = (CORPUS / qwen["file"]).read_text(encoding="utf-8")
    chat = [{"role": "system", "content": "You are helpful."}]
    for i in range(5):
        chat += [
            {"role": "user", "content": f"Question {i}: what is {i}+{i}?"},
            {"role": "assistant", "content": f"{2 * i}."},
        ]
    template = chatcodec.ChatTemplate(source, special_tokens=qwen["special_tokens"])
    tokenizer = reference_tokenizer(qwen["special_tokens"])
    tokenizer.chat_template = source
    t_theirs = per_call(lambda: tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True), 0.2, 5)
    t_ours = per_call(lambda: template.render(chat, add_generation_prompt=True), 0.2, 5)
    print(
        f"Qwen3, 10-turn chat:  transformers {t_theirs * 1e6:.1f}us, chatcodec {t_ours * 1e6:.1f}us,"
        f" {t_theirs / t_ours:.2f}x"
    )

    runs = 5 if args.quick else 15
    jinja_s, ours_s = import_cost("jinja2", runs), import_cost("chatcodec", runs)
    transformers_s = import_cost("transformers.utils.chat_template_utils", max(3, runs // 3))
    print(
        f"import cost: jinja2 {jinja_s * 1e3:.0f}ms, chatcodec {ours_s * 1e3:.0f}ms ({ours_s / jinja_s:.2f}x jinja2),"
        f" transformers' chat templating {transformers_s * 1e3:.0f}ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
