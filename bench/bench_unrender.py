"""Reading prompts back into messages (``chatcodec.parse_conversation``) on every corpus golden, against rendering.

There is no reference implementation to compare with (transformers has no inverse of its chat templates), so
the yardstick is the render itself: for each of the 1,600 golden prompts it times reading the prompt (the
template's grammar already learned) and rendering the messages read back, both CPU time, best of
``--repeats``, and reports how many renders a reading costs (it renders at least once: every reading is checked by
rendering it). Learning a template's grammar (its probe renders) is timed once per template and option set,
with the grammar cache emptied. Prompts the template does not read (PromptMismatchError) are counted, with the
time it took to say so.

Run: ``PYTHONPATH=src python bench/bench_unrender.py [--repeats 3]``. Needs ../shared/corpus beside the checkout.
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
    args = parser.parse_args()
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
