"""Render speed and import cost of chatcodec, side by side with transformers 5.24 and jinja2, in one run.

    python bench/bench_render.py                 # every corpus template x conversation x option set
    python bench/bench_render.py --quick         # fewer repetitions
    python bench/bench_render.py --before main   # also chatcodec as of a git revision ("before"), same run

Prints ratios (how many times faster chatcodec is), never absolute pass/fail thresholds. Needs the dev
extra (transformers) and ../shared/corpus beside the checkout.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
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


def load_revision(revision: str) -> Any:
    """chatcodec as of git ``revision``, imported beside the current one as the package ``chatcodec_before``."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", revision, "src/chatcodec"], check=True, capture_output=True
    ).stdout
    target = Path(tempfile.mkdtemp(prefix="chatcodec-before-"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    package = target / "src" / "chatcodec"
    spec = importlib.util.spec_from_file_location(
        "chatcodec_before", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chatcodec_before"] = module
    spec.loader.exec_module(module)
    return module


def reference_tokenizer(special_tokens: dict[str, str]) -> Any:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[[unk]]": 0}, unk_token="[[unk]]"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special_tokens)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing loops")
    parser.add_argument("--before", metavar="REV", help="also time chatcodec as of this git revision")
    args = parser.parse_args()
    if not CORPUS.is_dir():
        print(f"needs the corpus at {CORPUS}", file=sys.stderr)
        return 2
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    import transformers
    import transformers.utils.chat_template_utils as ctu

    import chatcodec

    before = load_revision(args.before) if args.before else None

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
        + (f"; 'before' is chatcodec at {args.before}" if before else "")
    )
    header = f"{'template':<45} {'cases':>5} {'transformers':>13} {'chatcodec':>10} {'speed-up':>9}"
    print(header + (f" {'before':>10} {'now/before':>10}" if before else ""))

    per_template = []
    all_ratios = []
    per_template_change = []
    all_changes = []
    for entry in manifest:
        source = (CORPUS / entry["file"]).read_text(encoding="utf-8")
        template = chatcodec.ChatTemplate(source, special_tokens=entry["special_tokens"], name=entry["name"])
        old = before.ChatTemplate(source, special_tokens=entry["special_tokens"]) if before else None
        tokenizer = reference_tokenizer(entry["special_tokens"])
        tokenizer.chat_template = source
        ours_times, theirs_times, old_times = [], [], []
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
                if old is not None:

                    def older(m: Any = messages, t: Any = tools, o: Any = options, chat: Any = old) -> Any:
                        return chat.render(m, tools=t, now=NOW, **o)

                    old_times.append(per_call(older, budget, repeats))
                    all_changes.append(ours_times[-1] / old_times[-1])
        if not ours_times:
            continue
        t_theirs, t_ours = statistics.median(theirs_times), statistics.median(ours_times)
        per_template.append(t_theirs / t_ours)
        line = (
            f"{entry['name']:<45} {len(ours_times):>5} {t_theirs * 1e6:>11.1f}us {t_ours * 1e6:>8.1f}us"
            f" {t_theirs / t_ours:>8.2f}x"
        )
        if old_times:
            t_old = statistics.median(old_times)
            per_template_change.append(t_ours / t_old)
            line += f" {t_old * 1e6:>8.1f}us {t_ours / t_old:>9.3f}x"
        print(line)

    print()
    print(f"median speed-up over {len(all_ratios)} renders:        {statistics.median(all_ratios):.2f}x")
    print(f"median speed-up over {len(per_template)} templates:      {statistics.median(per_template):.2f}x")
    print(f"slowest template speed-up:                 {min(per_template):.2f}x")
    if per_template_change:
        print(
            f"render time now / before: median over renders {statistics.median(all_changes):.3f},"
            f" over templates {statistics.median(per_template_change):.3f},"
            f" worst template {max(per_template_change):.3f}"
        )

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
    line = (
        f"Qwen3, 10-turn chat:  transformers {t_theirs * 1e6:.1f}us, chatcodec {t_ours * 1e6:.1f}us,"
        f" {t_theirs / t_ours:.2f}x"
    )
    if before:
        old = before.ChatTemplate(source, special_tokens=qwen["special_tokens"])
        t_old = per_call(lambda: old.render(chat, add_generation_prompt=True), 0.2, 5)
        line += f"; before {t_old * 1e6:.1f}us (now/before {t_ours / t_old:.3f})"
    print(line)

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
