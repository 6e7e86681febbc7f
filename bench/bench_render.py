"""Render speed and import cost: chatcodec side by side with transformers 5.24, jinja2 and minijinja, in one run.

    python bench/bench_render.py                 # every corpus template x conversation x option set
    python bench/bench_render.py --quick         # fewer repetitions
    python bench/bench_render.py --before main   # also chatcodec as of a git revision ("before"), same run

For each corpus case every engine renders the same conversation, timed in CPU time, best of a few
repeats, the engines taking turns (:func:`per_calls`): transformers' ``apply_chat_template(tokenize=False)``
(the reference chatcodec reproduces byte for byte), jinja2 alone (the template rendered directly in
transformers' sandboxed environment, with no preprocessing: a floor for any jinja2-based renderer),
minijinja (the Rust engine, when installed; its output differs from transformers' on some templates,
counted as "exact") and chatcodec (``ChatTemplate.render``, compiled path). Prints ratios to
transformers, never pass/fail thresholds.
Import cost is measured with bytecode caches (``PYTHONPYCACHEPREFIX``), as an installed package has, the imports
taking turns as the engines do.
Needs the dev extra (transformers) and ../shared/corpus beside the checkout.
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


def per_calls(runs: dict[str, Callable[[], Any]], budget_s: float, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds per call of each run, each repeat running about ``budget_s``.

    The runs take turns, one repeat each: a host that slows down for a while (another machine on the same
    processor) slows all of them alike, so the ratios hold, where timing one run to the end and then the next
    would compare one run's slow spell with another's fast one.
    """
    loops = {}
    for name, fn in runs.items():
        fn()
        start = time.process_time()
        fn()
        loops[name] = max(1, int(budget_s / max(time.process_time() - start, 1e-7)))
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, fn in runs.items():
            count = loops[name]
            start = time.process_time()
            for _ in range(count):
                fn()
            best[name] = min(best[name], (time.process_time() - start) / count)
    return best


def import_costs(modules: list[str], runs: int) -> list[float]:
    """Median wall time of `python -c "import module"` minus that of `python -c "pass"`, in seconds, for each
    module, the imports taking turns (one run of each in every round), so that a slower spell of the host
    weighs on all of them alike.

    Bytecode is cached in a private folder first (a development checkout may run with
    PYTHONDONTWRITEBYTECODE, which would make every import compile its source).
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "chatcodec-bench-pycache")
    codes = ["pass"] + [f"import {module}" for module in modules]

    def run(code: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        return time.perf_counter() - start

    for code in codes:
        run(code)  # fills the cache
    times: list[list[float]] = [[] for _ in codes]
    for _ in range(runs):
        for spent, code in zip(times, codes, strict=True):
            spent.append(run(code))
    baseline, *medians = map(statistics.median, times)
    return [median - baseline for median in medians]


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


def jinja2_renderer(source: str) -> Any:
    """The template in an environment configured as transformers configures its own, rendered directly."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=NOW.strftime)
    return env.from_string(source)


def minijinja_renderer(source: str) -> Any:
    """The template in minijinja (its Python bindings) with transformers' globals; None when not installed."""
    try:
        import minijinja
    except ImportError:
        return None

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = minijinja.Environment(trim_blocks=True, lstrip_blocks=True)
    env.add_function("raise_exception", raise_exception)
    env.add_function("strftime_now", NOW.strftime)
    env.add_template("t", source)
    return env


def prepared(template: Any, messages: Any, tools: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The variables chatcodec hands the template for this call: what jinja2 and minijinja render too."""
    from chatcodec import compiler

    seen: list[dict[str, Any]] = []
    fast = compiler.fast_template(template.source)
    original = fast.root

    def spy(*given: Any) -> str:
        seen.append(compiler.variables_of(given[:6]))
        return original(*given)  # type: ignore[no-any-return]

    fast.root = spy
    try:
        template.render(messages, tools=tools, now=NOW, **options)
    finally:
        fast.root = original
    return seen[0]


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
    engines = ["transformers", "jinja2", "minijinja", "chatcodec"] + (["before"] if before else [])
    print(
        f"chatcodec {chatcodec.__version__}, transformers {transformers.__version__}; Python {sys.version.split()[0]}"
        + (f"; 'before' is chatcodec at {args.before}" if before else "")
    )
    columns = "".join(f" {e:>10}" for e in engines[1:])
    print(f"{'template':<42} {'cases':>5} {'transformers':>12}{columns}  (x faster than transformers)")

    ratios: dict[str, list[float]] = {e: [] for e in engines[1:]}  # per template, median over its cases
    case_ratios: dict[str, list[float]] = {e: [] for e in engines[1:]}
    changes: list[float] = []  # chatcodec time / before, per template
    minijinja_exact = minijinja_cases = 0
    for entry in manifest:
        source = (CORPUS / entry["file"]).read_text(encoding="utf-8")
        tokens = entry["special_tokens"]
        template = chatcodec.ChatTemplate(source, special_tokens=tokens, name=entry["name"])
        old = before.ChatTemplate(source, special_tokens=tokens) if before else None
        tokenizer = reference_tokenizer(tokens)
        tokenizer.chat_template = source
        raw = jinja2_renderer(source)
        try:
            mini = minijinja_renderer(source)
        except Exception:  # minijinja cannot parse this template
            mini = None
        times: dict[str, list[float]] = {e: [] for e in engines}
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
                context = prepared(template, messages, tools, options)
                runs: dict[str, Callable[[], Any]] = {
                    "transformers": lambda m=messages, t=tools, o=options, r=tokenizer: r.apply_chat_template(
                        m, tools=t, tokenize=False, **o
                    ),
                    "chatcodec": lambda m=messages, t=tools, o=options, r=template: r.render(m, tools=t, now=NOW, **o),
                }
                try:
                    if raw.render(**context) == expected:
                        runs["jinja2"] = lambda c=context, r=raw: r.render(**c)
                except Exception:  # jinja2 without transformers' globals cannot render this case
                    pass
                if mini is not None:
                    try:
                        minijinja_exact += mini.render_template("t", **context) == expected
                        minijinja_cases += 1
                        runs["minijinja"] = lambda c=context, r=mini: r.render_template("t", **c)
                    except Exception:  # minijinja fails on this case: not timed
                        minijinja_cases += 1
                if old is not None:
                    runs["before"] = lambda m=messages, t=tools, o=options, r=old: r.render(m, tools=t, now=NOW, **o)
                measured = per_calls(runs, budget, repeats)
                for name, seconds in measured.items():
                    times[name].append(seconds)
                for name in ratios:
                    if name in measured and name != "before":
                        case_ratios[name].append(measured["transformers"] / measured[name])
        if not times["chatcodec"]:
            continue
        reference = statistics.median(times["transformers"])
        line = f"{entry['name'][:42]:<42} {len(times['chatcodec']):>5} {reference * 1e6:>10.1f}us"
        for name in engines[1:]:
            if times[name]:
                ratio = reference / statistics.median(times[name])
                line += f" {ratio:>9.2f}x"
                if name != "before":
                    ratios[name].append(ratio)
            else:
                line += f" {'-':>10}"
        if times.get("before"):
            changes.append(statistics.median(times["chatcodec"]) / statistics.median(times["before"]))
        print(line)

    print()
    for name in engines[1:]:
        if name == "before" or not ratios[name]:
            continue
        print(
            f"{name:<10} median speed-up over transformers: {statistics.median(ratios[name]):6.2f}x over"
            f" {len(ratios[name])} templates, {statistics.median(case_ratios[name]):6.2f}x over"
            f" {len(case_ratios[name])} renders; slowest template {min(ratios[name]):.2f}x"
        )
    if minijinja_cases:
        print(f"minijinja output equal to transformers' in {minijinja_exact} of {minijinja_cases} renders")
    if changes:
        print(
            f"chatcodec render time now / before ({args.before}): median over templates"
            f" {statistics.median(changes):.3f}, worst template {max(changes):.3f}"
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
    tenturn: dict[str, Callable[[], Any]] = {
        "transformers": lambda: tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
        "chatcodec": lambda: template.render(chat, add_generation_prompt=True),
    }
    mini = minijinja_renderer(source)
    if mini is not None:
        context = {**qwen["special_tokens"], "messages": chat, "add_generation_prompt": True}
        tenturn["minijinja"] = lambda: mini.render_template("t", **context)
    if before:
        old = before.ChatTemplate(source, special_tokens=qwen["special_tokens"])
        tenturn["before"] = lambda: old.render(chat, add_generation_prompt=True)
    best = per_calls(tenturn, 0.2, 5)
    t_theirs, t_ours = best["transformers"], best["chatcodec"]
    line = (
        f"Qwen3, 10-turn chat:  transformers {t_theirs * 1e6:.1f}us, chatcodec {t_ours * 1e6:.1f}us,"
        f" {t_theirs / t_ours:.2f}x"
    )
    if "minijinja" in best:
        line += f"; minijinja {best['minijinja'] * 1e6:.1f}us ({t_theirs / best['minijinja']:.2f}x)"
    if "before" in best:
        line += f"; before {best['before'] * 1e6:.1f}us"
    print(line)

    runs = 5 if args.quick else 15
    jinja_s, ours_s = import_costs(["jinja2", "chatcodec"], runs)
    (transformers_s,) = import_costs(["transformers.utils.chat_template_utils"], max(3, runs // 3))
    print(
        f"import cost: jinja2 {jinja_s * 1e3:.0f}ms, chatcodec {ours_s * 1e3:.0f}ms ({ours_s / jinja_s:.2f}x jinja2),"
        f" transformers' chat templating {transformers_s * 1e3:.0f}ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
