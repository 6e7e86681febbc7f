"""Reading prompts back into messages (``chatcodec.parse_conversation``) on every corpus golden, against rendering.

There is no reference implementation to compare with (transformers has no inverse of its chat templates), so
the yardstick is the render itself: for each of the 1,600 golden prompts it times reading the prompt (the
template's grammar already learned) and rendering the messages read back, both CPU time, best of
``--repeats``, and reports how many renders a reading costs (it renders at least once: every reading is checked by
rendering it). Learning a template's grammar (its probe renders) is timed once per template and option set,
with the grammar cache emptied. Prompts the template does not read (PromptMismatchError) are counted, with the
time it took to say so.

``--hostile`` times instead the prompts of tests/test_unrender_bounds.py (the review's and their neighbours, up
to 1 MB, each read and refused strictly and not): the CPU time of each, in seconds per MB of prompt, against the
documented bound (0.5 s plus 4 s per MB), and against rendering the prompt's messages where it is read.

Run: ``PYTHONPATH=src python bench/bench_unrender.py [--repeats 3] [--hostile]``. Needs ../shared/corpus beside
the checkout (not for ``--hostile``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from bench_growing import _cpu  # CPU time, the garbage collector off

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
NOW = datetime(2026, 11, 29, 12, 0, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per prompt, best kept (default 3)")
    parser.add_argument("--hostile", action="store_true", help="time the bounds test's prompts instead")
    args = parser.parse_args()
    if args.hostile:
        return _hostile(args.repeats)
    if not CORPUS.is_dir():
        print(f"the corpus is not at {CORPUS}", file=sys.stderr)
        return 2
    from chatcodec import ChatTemplate, PromptMismatchError, parse_conversation, unrender

    manifest = {e["name"]: e for e in json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))["templates"]}
    conversations = {
        c["id"]: c for c in json.loads((CORPUS / "conversations.json").read_text(encoding="utf-8"))["conversations"]
    }
    templates: dict[str, ChatTemplate] = {}
    learned: list[float] = []
    ratios: list[float] = []
    reads: list[float] = []
    refusals: list[float] = []
    seen: set[tuple[str, str]] = set()
    for line in (CORPUS / "goldens.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "error" in record:
            continue
        entry = manifest[record["template"]]
        template = templates.get(entry["name"])
        if template is None:
            source = (CORPUS / entry["file"]).read_text(encoding="utf-8")
            template = templates[entry["name"]] = ChatTemplate(
                source, special_tokens=entry["special_tokens"], name=entry["name"]
            )
        variables: dict[str, Any] = {
            k: v for k, v in record["options"].items() if k not in ("add_generation_prompt", "continue_final_message")
        }
        options = dict(tools=conversations[record["conversation"]]["tools"], now=NOW, **variables)
        given = {k: v for k, v in options.items() if v is not None}
        key = (entry["name"], json.dumps(given, sort_keys=True, default=str))
        if key not in seen:
            seen.add(key)
            learned.append(_cpu(unrender._learn, template, given)[0])
        try:
            parse_conversation(template, record["output"], **options)
        except PromptMismatchError:
            refusals.append(
                min(_timed_refusal(parse_conversation, template, record["output"], options) for _ in range(2))
            )
            continue
        read, parsed = min(_cpu(parse_conversation, template, record["output"], **options) for _ in range(args.repeats))
        render = min(_cpu(template.render, parsed.messages, **parsed.render_options())[0] for _ in range(args.repeats))
        reads.append(read)
        ratios.append(read / render)
    print(f"templates: {len(templates)}; grammars learned: {len(learned)}")
    print(f"learning a grammar: median {statistics.median(learned) * 1e3:.1f} ms, max {max(learned) * 1e3:.1f} ms")
    print(
        f"read back: {len(reads)} of {len(reads) + len(refusals)} prompts; reading one: median"
        f" {statistics.median(reads) * 1e6:.0f} us, {statistics.median(ratios):.1f}x its render"
        f" (90th percentile {statistics.quantiles(ratios, n=10)[-1]:.1f}x)"
    )
    if refusals:
        print(f"not read: {len(refusals)}, each refused in median {statistics.median(refusals) * 1e3:.1f} ms")
    return 0


def _hostile(repeats: int) -> int:
    import importlib.util

    from chatcodec import Limits, PromptMismatchError, load_template, parse_conversation

    path = Path(__file__).resolve().parents[1] / "tests" / "test_unrender_bounds.py"
    spec = importlib.util.spec_from_file_location("unrender_bounds", path)
    assert spec is not None and spec.loader is not None
    bounds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bounds)
    qwen3 = load_template("qwen3")
    qwen3.limits = Limits(timeout=600)
    parse_conversation(qwen3, "<|im_start|>user\nhi<|im_end|>\n")
    print(f"{'prompt':<40} {'strict':>6} {'MB':>6} {'outcome':>8} {'s':>7} {'s/MB':>6} {'bound s':>8} {'x render':>8}")
    worst = 0.0
    for name, make in bounds.PROMPTS.items():
        prompt, _ = make()
        for strict in (True, False):
            seconds, outcome = min((_cpu(_read, qwen3, prompt, strict) for _ in range(repeats)), key=lambda r: r[0])
            bound = 0.5 + 4.0 * len(prompt) / 1e6
            worst = max(worst, seconds / bound)
            versus = ""
            if not isinstance(outcome, PromptMismatchError):
                render = min(
                    _cpu(qwen3.render, outcome.messages, **outcome.render_options())[0] for _ in range(repeats)
                )
                versus = f"{seconds / render:.1f}"
            mb = len(prompt) / 1e6
            print(
                f"{name:<40} {strict!s:>6} {mb:>6.2f} {'refused' if versus == '' else 'read':>8} {seconds:>7.2f}"
                f" {seconds / mb:>6.2f} {bound:>8.2f} {versus:>8}"
            )
    print(f"the slowest is {worst:.2f} of its bound")
    return 0


def _read(template: Any, prompt: str, strict: bool) -> Any:
    from chatcodec import PromptMismatchError, parse_conversation

    try:
        return parse_conversation(template, prompt, strict=strict)
    except PromptMismatchError as exc:
        return exc


def _timed_refusal(parse: Any, template: Any, prompt: str, options: dict[str, Any]) -> float:
    from chatcodec import PromptMismatchError

    def refused() -> None:
        try:
            parse(template, prompt, **options)
        except PromptMismatchError:
            return

    return _cpu(refused)[0]


if __name__ == "__main__":
    sys.exit(main())
