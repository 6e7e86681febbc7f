"""Streaming cost of a tool call with a huge string argument, delivered one character per delta.

chatcodec's decoders consume each delta in O(len(delta)), so the total is linear in the output: the
check below requires 200 KB to cost at most 13x what 20 KB costs. Side by side, the approach several
servers use: on every delta, re-parse all the text so far with partial-json-parser, re-serialize
the arguments and diff them against what was sent. That is quadratic.

    PYTHONPATH=src python bench/bench_decode.py            # about a minute
    PYTHONPATH=src python bench/bench_decode.py --full     # also re-parses 20 KB (slow, by design)
    PYTHONPATH=src python bench/bench_decode.py --adversarial  # flood every vector, cut anywhere
    PYTHONPATH=src python bench/bench_decode.py --sweep  # every marker of every format (about 45 min)

``--sweep`` decodes the texts of ``tests/decoders/adversarial.py`` (every marker of every format,
repeated and nested, bare and inside the format's own call) at 20 KB and 200 KB, whole and fed in
64-character chunks, and requires each 200 KB / 20 KB ratio to stay under 13. Times are CPU time of
this process (``time.process_time``), so other work on the machine does not skew the ratios.

Exit status 1 if the linearity check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from chatcodec.decoders import decoder
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from chatcodec.decoders import decoder

KB = 1000
SWEEP_LIMIT = 25
#: (prefix, suffix) around the argument string, per format
CALLS: dict[str, tuple[str, str]] = {
    "hermes": ('<tool_call>{"name": "write_file", "arguments": {"content": "', '"}}</tool_call>'),
    "qwen3_coder": (
        "<tool_call>\n<function=write_file>\n<parameter=content>\n",
        "\n</parameter>\n</function>\n</tool_call>",
    ),
    "kimi_k2": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0"
        '<|tool_call_argument_begin|>{"content": "',
        '"}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    "gpt_oss": (
        '<|channel|>commentary to=functions.write_file <|constrain|>json<|message|>{"content": "',
        '"}<|call|>',
    ),
    "deepseek_v3_1": (
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write_file<｜tool▁sep｜>{"content": "',
        '"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    ),
    "pythonic": ("[write_file(content='", "')]"),
    "glm45": ("<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>", "</arg_value>\n</tool_call>"),
    # formats learned from templates no catalog format reads (tests/decoders/data/templates/)
    "learned:named_section": ('<calls>\n<call name="write_file">{"content": "', '"}</call>\n</calls>'),
    "learned:xml_colon": ("<invoke:write_file><arg:content>", "</arg></invoke>"),
}
JSON_BODIES = ("hermes", "kimi_k2", "gpt_oss", "deepseek_v3_1", "learned:named_section")
#: the payload: prose with quotes, backslashes and non-ASCII, as code or documents have
PAYLOAD = 'The "quick" brown fox \\ jumps over the lazy dog; naïve café, 東京 🌍. '


def completion(fmt: str, size: int) -> str:
    prefix, suffix = CALLS[fmt]
    body = (PAYLOAD * (size // len(PAYLOAD) + 1))[:size]
    if fmt in JSON_BODIES:
        body = json.dumps(body, ensure_ascii=False)[1:-1][:size]
        body = body.rstrip("\\")  # never end inside an escape
    elif fmt == "pythonic":
        body = body.replace("\\", "\\\\").replace("'", "\\'")[:size].rstrip("\\")
    return prefix + body + suffix


def best_of(runs: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(runs))


def _decoder(fmt: str) -> Any:
    """A catalog format by name, or a ``learned:NAME`` format learned from a test template."""
    if not fmt.startswith("learned:"):
        return decoder(fmt)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.decoders.adversarial import make

    return make(fmt)


def stream_chatcodec(fmt: str, text: str) -> float:
    """Feed ``text`` one character per delta; return the total time in seconds."""
    stream = _decoder(fmt).stream()
    start = time.process_time()
    for ch in text:
        stream.feed(ch)
    stream.finish()
    elapsed = time.process_time() - start
    (call,) = stream.message.tool_calls
    assert call.error is None and call.name == "write_file", call
    return elapsed


def stream_reparse(text: str) -> float:
    """The re-parse-and-diff server loop (Hermes style) over the same deltas, with partial-json-parser."""
    import partial_json_parser
    from partial_json_parser import Allow

    marker = "<tool_call>"
    seen = ""
    sent = ""
    start = time.process_time()
    for ch in text:
        seen += ch
        at = seen.find(marker)
        if at < 0:
            continue
        body = seen[at + len(marker) :].removesuffix("</tool_call>")
        if not body.strip():
            continue
        try:
            obj = partial_json_parser.loads(body, Allow.ALL)
        except Exception:  # the servers swallow partial-parse errors too
            continue
        if not isinstance(obj, dict) or "arguments" not in obj:
            continue
        args = json.dumps(obj["arguments"], ensure_ascii=False)
        # Send the part of the re-serialized arguments not sent yet (the closing brace is held back,
        # since the healed prefix may still change it).
        stable = args[:-1] if args.endswith("}") else args
        if stable.startswith(sent):
            sent = stable
    return time.process_time() - start


def adversarial() -> float:
    """Cut every parse vector at several points and flood it one character at a time.

    Returns the worst growth from 1,000 to 10,000 flood characters: linear is about 10x (small sizes
    are noisy), a quadratic path would be about 100x, so the sweep fails above ``SWEEP_LIMIT``.
    """
    shared = Path(__file__).resolve().parents[2] / "shared" / "parse-vectors.jsonl"
    if not shared.is_file():
        print(f"(no parse vectors at {shared}: adversarial sweep skipped)")
        return 0.0

    def flood(d: Any, prefix: str, n: int, filler: str) -> float:
        stream = d.stream()
        stream.feed(prefix)
        start = time.perf_counter()
        for _ in range(n):
            stream.feed(filler)
        stream.finish()
        return time.perf_counter() - start

    worst, where = 0.0, ""
    for index, line in enumerate(shared.read_text(encoding="utf-8").splitlines()):
        vector = json.loads(line)
        d = decoder(vector["format"], **{k: v for k, v in vector.get("options", {}).items() if k != "template"})
        out = vector["output"]
        for cut in sorted({len(out) // 4, len(out) // 2, 3 * len(out) // 4}):
            for filler in (" ", "a", "{", '"', "\\", "<", "\n"):
                small = flood(d, out[:cut], 1000, filler)
                if small < 0.002:  # too fast to time reliably, and so not the worst case
                    continue
                ratio = flood(d, out[:cut], 10000, filler) / small
                if ratio > worst:
                    worst, where = ratio, f"vector {index} ({vector['format']}) cut at {cut}, flood {filler!r}"
    print(f"adversarial sweep: worst growth {worst:.1f}x for 10x the flood ({where})")
    return worst


SWEEP_SIZES = (20 * KB, 200 * KB)
SWEEP_CHUNK = 64


def _cpu(fmt: str, text: str, chunk: int | None) -> float:
    from tests.decoders.adversarial import make

    stream = make(fmt).stream()
    start = time.process_time()
    if chunk is None:
        stream.feed(text)
    else:
        for k in range(0, len(text), chunk):
            stream.feed(text[k : k + chunk])
    stream.finish()
    stream.message  # noqa: B018  (building the message is part of the cost)
    return time.process_time() - start


def _best_cpu(fmt: str, text: str, chunk: int | None, budget: float = 0.2) -> float:
    """The best of several runs, as many as fit in ``budget`` seconds (at least 5)."""
    best, spent, runs = float("inf"), 0.0, 0
    while runs < 5 or spent < budget:
        took = _cpu(fmt, text, chunk)
        best, spent, runs = min(best, took), spent + took, runs + 1
        if runs >= 200:
            break
    return best


def sweep(only: list[str] | None = None) -> float:
    """Every adversarial text at 20 KB and 200 KB: the worst 200 KB / 20 KB CPU-time ratio."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.decoders.adversarial import all_formats, texts

    small_size, big_size = SWEEP_SIZES
    worst, where, count = 0.0, "", 0
    for fmt in only or all_formats():
        start = time.perf_counter()
        fmt_worst = 0.0
        bigs = {(marker, shape, kind): text for marker, shape, kind, text in texts(fmt, big_size)}
        for marker, shape, kind, small in texts(fmt, small_size):
            big = bigs[marker, shape, kind]
            for chunk in (None, SWEEP_CHUNK):
                count += 1
                t_small = min(_cpu(fmt, small, chunk) for _ in range(2))
                t_big = _cpu(fmt, big, chunk)
                for _ in range(3):  # measure again before believing it (tiny times are noisy)
                    if t_big <= 13 * t_small:
                        break
                    t_small = min(t_small, _best_cpu(fmt, small, chunk))
                    t_big = min(t_big, _best_cpu(fmt, big, chunk))
                ratio = t_big / max(t_small, 1e-6)
                fmt_worst = max(fmt_worst, ratio)
                if ratio > worst:
                    mode = "whole" if chunk is None else f"{chunk}-char chunks"
                    worst, where = ratio, f"{fmt}: {marker!r} {shape} {kind}, {mode} ({t_big * 1e3:.0f} ms at 200 KB)"
        flag = "ok" if fmt_worst <= 13 else "FAIL"
        print(f"{fmt:<24} worst {fmt_worst:5.1f}x  ({time.perf_counter() - start:.0f}s)  {flag}", flush=True)
    print(f"sweep: {count} decodes x 2 sizes; worst 200 KB / 20 KB ratio {worst:.1f}x ({where})")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also run the quadratic baseline at 20 KB")
    parser.add_argument("--runs", type=int, default=3, help="best of N runs for chatcodec (default 3)")
    parser.add_argument(
        "--adversarial", action="store_true", help="also flood every parse vector, cut anywhere (a few minutes)"
    )
    parser.add_argument(
        "--sweep",
        nargs="*",
        metavar="FORMAT",
        help="also time every marker of every format (or of the formats named) at 20 KB and 200 KB (long)",
    )
    args = parser.parse_args(argv)

    print("chatcodec: one tool call, argument string of N bytes, fed one character per delta\n")
    print(f"{'format':<24}{'20 KB':>10}{'200 KB':>11}{'ratio':>8}{'us/char':>9}   (limit: 13x)")
    ok = True
    for fmt in CALLS:
        small = best_of(args.runs, lambda fmt=fmt: stream_chatcodec(fmt, completion(fmt, 20 * KB)))
        big = best_of(args.runs, lambda fmt=fmt: stream_chatcodec(fmt, completion(fmt, 200 * KB)))
        ratio = big / small
        ok = ok and ratio <= 13
        per_char = big / len(completion(fmt, 200 * KB)) * 1e6
        flag = "ok" if ratio <= 13 else "FAIL"
        print(f"{fmt:<24}{small * 1e3:>8.0f}ms{big * 1e3:>9.0f}ms{ratio:>7.2f}x{per_char:>9.2f}   {flag}")

    print("\nSide by side, Hermes: chatcodec vs re-parsing the text so far at every delta (partial-json-parser)\n")
    sizes = [1 * KB, 2 * KB, 5 * KB, 10 * KB] + ([20 * KB] if args.full else [])
    print(f"{'size':>7}{'chatcodec':>12}{'re-parse':>12}{'slower':>9}")
    measured: list[tuple[int, float]] = []
    for size in sizes:
        text = completion("hermes", size)
        ours = best_of(args.runs, lambda text=text: stream_chatcodec("hermes", text))
        theirs = stream_reparse(text)
        measured.append((size, theirs))
        print(f"{size // KB:>5} KB{ours * 1e3:>10.1f}ms{theirs * 1e3:>10.0f}ms{theirs / ours:>8.0f}x")
    # Quadratic fit through the largest measurement: t(n) = t(m) * (n / m)^2.
    m, t = measured[-1]
    for size in (20 * KB, 200 * KB):
        if size > m:
            ours = best_of(1, lambda size=size: stream_chatcodec("hermes", completion("hermes", size)))
            guess = t * (size / m) ** 2
            row = f"{size // KB:>5} KB{ours * 1e3:>10.1f}ms{guess:>10.0f}s {guess / ours:>7.0f}x"
            print(row + "   (re-parse extrapolated)")
    print(
        f"\nre-parse growth {measured[0][0] // KB} KB -> {m // KB} KB: {t / measured[0][1]:.0f}x for "
        f"{m // measured[0][0]}x the text (quadratic); chatcodec grows linearly."
    )
    if args.adversarial:
        print()
        ok = adversarial() <= SWEEP_LIMIT and ok
    if args.sweep is not None:
        print()
        ok = sweep(args.sweep) <= 13 and ok
    print("\nlinearity:", "ok" if ok else "FAILED (200 KB cost over 13x 20 KB, or a flood grew superlinearly)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
