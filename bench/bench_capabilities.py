"""What ``ChatTemplate.capabilities`` costs, the first time and cached, over every corpus template.

    python bench/bench_capabilities.py            # every corpus template
    python bench/bench_capabilities.py --quick    # fewer repetitions

The first access runs every probe render on a template object that has never been probed (its source
compiled, as the constructor does). The reference in the same run is transformers 5.24 rendering one
short conversation with the same template: the ratio says how many such renders the whole probe costs.
A cached access is a property read. Needs the dev extra (transformers) and ../shared/corpus beside the
checkout. Prints figures and ratios, never pass/fail thresholds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
USER = [{"role": "user", "content": "Hello! Who are you?"}]


def reference_tokenizer(special_tokens: dict[str, str]) -> Any:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[[unk]]": 0}, unk_token="[[unk]]"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special_tokens)


def best_of(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    if not CORPUS.is_dir():
        print(f"the corpus is not at {CORPUS}", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    import transformers

    import chatcodec

    repeats = 2 if args.quick else 5
    manifest = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))["templates"]
    print(
        f"chatcodec {chatcodec.__version__} vs transformers {transformers.__version__}; Python {sys.version.split()[0]}"
    )
    print(f"{'template':<45} {'first (ms)':>10} {'1 render, tr. (ms)':>19} {'ratio':>6} {'cached (ns)':>12}")
    firsts, ratios, cached = [], [], []
    for entry in sorted(manifest, key=lambda e: e["name"]):
        source = (CORPUS / entry["file"]).read_text(encoding="utf-8")

        def first(source: str = source, entry: dict[str, Any] = entry) -> None:
            chatcodec.ChatTemplate(source, special_tokens=entry["special_tokens"]).capabilities  # noqa: B018

        # the constructor's compile is cached by source after the first call; what is timed is the probing
        template = chatcodec.ChatTemplate(source, special_tokens=entry["special_tokens"])

        def build(source: str = source, entry: dict[str, Any] = entry) -> None:
            chatcodec.ChatTemplate(source, special_tokens=entry["special_tokens"])

        construct = best_of(build, repeats)
        probe = max(best_of(first, repeats) - construct, 0.0)
        template.capabilities  # noqa: B018
        loops = 100_000
        start = time.perf_counter()
        for _ in range(loops):
            template.capabilities  # noqa: B018
        hit = (time.perf_counter() - start) / loops

        tokenizer = reference_tokenizer(entry["special_tokens"])
        tokenizer.chat_template = source

        def theirs(tok: Any = tokenizer) -> None:
            with contextlib.suppress(Exception):  # a template that needs tools fails quickly: still one render
                tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)

        one = best_of(theirs, repeats)
        firsts.append(probe)
        ratios.append(probe / one)
        cached.append(hit)
        print(
            f"{entry['name'][:45]:<45} {probe * 1e3:>10.1f} {one * 1e3:>19.2f} {probe / one:>6.1f} {hit * 1e9:>12.0f}"
        )
    print(
        f"\n{len(firsts)} templates: capabilities the first time median {statistics.median(firsts) * 1e3:.1f}ms,"
        f" max {max(firsts) * 1e3:.1f}ms (median {statistics.median(ratios):.1f}x one transformers render of"
        f" a one-message chat); cached median {statistics.median(cached) * 1e9:.0f}ns"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
