"""Dataset formatting speed and memory: chatcodec's dataset engines against transformers, in one run.

A dataset of distinct conversations is generated (default 20,000): one shared system prompt and set of
tools, 1 to 4 exchanges each, some with tool calls and results, some with reasoning, varied text. Then:

1. **per process**: rows/s and tokens/s formatting the same rows (ids and assistant mask) with
   transformers' ``apply_chat_template(tokenize=True, return_assistant_tokens_mask=True)`` and with
   chatcodec's ``Formatter``, on the Qwen3 tokenizer with a ``{% generation %}`` training template (what
   transformers needs for a mask), CPU time of this one process; the outputs are checked equal first.
   chatcodec is also timed with the model's own template (masks found without tags), and as the whole
   local pipeline in one process (read JSONL, format, write Parquet);
2. **workers**: the whole dataset with ``--workers 1`` and ``--workers 2`` (wall time);
3. **memory**: peak RSS of one process formatting growing datasets (it should stay flat: rows stream);
4. **Ray**: the same job on a local Ray instance of 2 CPUs against the local engine with 2 workers.

The texts are drawn from 80 words by default; ``--text docs`` cuts them from the repository's README, docs
pages and sources and the shared docs instead (prose and code: a real vocabulary, so caches of text see new pieces).

Run: ``PYTHONPATH=src python bench/bench_dataset.py [--rows 20000] [--sections 1,2,3,4] [--text docs]``. Needs
transformers (the reference), pyarrow and ray. The machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[2] / "shared"
ROOT = Path(__file__).resolve().parents[1]

WORDS = str.split(
    "the a model data train token answer question river mountain city weather price market build test value"
    " function number result error code paper study light energy water music history language table chair"
    " window travel plan budget report summary detail reason method system network memory process thread"
    " quickly carefully small large early late north south green blue red heavy simple complex open closed"
)
SYSTEM = (
    "You are a careful assistant for a travel and finance company. Answer briefly, cite the tools you used,"
    " and never invent numbers. When a tool can answer, call it."
)
TOOLS = [
    {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {arg: {"type": "string", "description": f"the {arg}"}}, "required": [arg]}}}
    for name, description, arg in [
        ("get_weather", "Current weather in a city.", "city"),
        ("get_price", "Latest price of a stock ticker.", "ticker"),
        ("search_flights", "Flights from the user's city to a destination.", "destination"),
    ]
]  # fmt: skip


#: with ``--text docs``: the ASCII of the repository's README, docs pages and sources and the shared docs,
#: which the conversations' texts are cut from (prose and code with a real vocabulary, not 80 words)
DOCS: str | None = None


def _docs(shared: Path) -> str:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "src").rglob("*.py"))]
    files += sorted((shared / "docs").glob("*.md"))
    text = "".join(path.read_text(encoding="utf-8") for path in files if path.is_file())
    return "".join(char for char in text if char.isascii())


def _text(rng: random.Random, low: int, high: int) -> str:
    if DOCS is not None:  # a slice of about as many characters as that many words
        size = rng.randint(low, high) * 6
        at = rng.randrange(len(DOCS) - size)
        return DOCS[at : at + size]
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + rng.choice([".", "?", "!"])


def conversation(index: int) -> dict[str, Any]:
    """A distinct conversation: its index is in the first question, the rest is drawn from a seeded RNG."""
    rng = random.Random(index)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(rng.randint(1, 4)):
        question = _text(rng, 5, 40)
        messages.append({"role": "user", "content": f"({index}.{turn}) {question}"})
        if rng.random() < 0.3:
            tool = rng.choice(TOOLS)["function"]
            argument = next(iter(tool["parameters"]["properties"]))
            call = {"type": "function", "function": {"name": tool["name"], "arguments": {argument: _text(rng, 1, 2)}}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            result = json.dumps({"result": _text(rng, 3, 12)})
            messages.append({"role": "tool", "name": tool["name"], "content": result})
        answer: dict[str, Any] = {"role": "assistant", "content": _text(rng, 10, 120)}
        if rng.random() < 0.25:
            answer["reasoning_content"] = _text(rng, 10, 60)
        messages.append(answer)
    return {"id": f"conv{index}", "messages": messages, "tools": TOOLS}


def write_dataset(path: Path, rows: int) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for index in range(rows):
            f.write(json.dumps(conversation(index)) + "\n")
    return path


def _tagged_template(source: str) -> str:
    sys.path.insert(0, str(ROOT))
    from tests.test_masks import _tagged_qwen3  # the training template the tests check against transformers

    return _tagged_qwen3(source)


def _cpu(fn: Any) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def per_process(folder: Path, rows: list[dict[str, Any]], tokenizer: Path, repeat: int) -> None:
    from transformers import AutoTokenizer

    from chatcodec.dataset import Formatter, format_dataset

    hf = AutoTokenizer.from_pretrained(str(tokenizer))
    plain = Formatter(tokenizer)
    tagged_source = _tagged_template(plain.codec.template.source)
    template_file = folder / "training.jinja"
    template_file.write_text(tagged_source, encoding="utf-8")
    tagged = Formatter(tokenizer, template=template_file, content_special_tokens="allow")

    def reference(chunk: list[dict[str, Any]]) -> list[Any]:
        return [
            hf.apply_chat_template(
                r["messages"], tools=r["tools"], chat_template=tagged_source, tokenize=True, return_dict=True,
                return_assistant_tokens_mask=True,
            )
            for r in chunk
        ]  # fmt: skip

    def ours(formatter: Formatter, chunk: list[dict[str, Any]]) -> list[Any]:
        return [formatter.format(r, r["id"]) for r in chunk]

    for theirs, mine in zip(reference(rows), ours(tagged, rows), strict=True):  # the same output, or no comparison
        assert mine.input_ids == list(theirs["input_ids"]) and mine.mask == list(theirs["assistant_masks"])
    tokens = sum(len(r.input_ids) for r in ours(tagged, rows))
    subset = folder / "subset.jsonl"
    subset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = folder / "subset.parquet"

    def pipeline() -> None:
        format_dataset(subset, out, tokenizer=tokenizer, template=template_file, workers=1, progress=False)

    # The machine is shared: the rows go in chunks of 100, each chunk timed in turns with the three (so that
    # a burst of other work hits one chunk of one of them), `repeat` times; the least time of each chunk is kept.
    chunks = [rows[at : at + 100] for at in range(0, len(rows), 100)]
    least: dict[str, list[float]] = {name: [float("inf")] * len(chunks) for name in ("theirs", "tagged", "plain")}
    pipeline_time = start_up = float("inf")
    for _ in range(repeat):
        # fresh formatters (the codec loaded outside the timing, as transformers' tokenizer is): no row is cached;
        # each formats the chunks in order, as one run would
        runs = {
            "theirs": reference,
            "tagged": partial(ours, Formatter(tokenizer, template=template_file, content_special_tokens="allow")),
            "plain": partial(ours, Formatter(tokenizer)),
        }
        for index, chunk in enumerate(chunks):
            for name, run in runs.items():
                least[name][index] = min(least[name][index], _cpu(partial(run, chunk)))
        pipeline_time = min(pipeline_time, _cpu(pipeline))
        start_up = min(start_up, _cpu(partial(Formatter, tokenizer, template=template_file)))  # the pipeline's load
    theirs_time, tagged_time, plain_time = (sum(least[name]) for name in ("theirs", "tagged", "plain"))
    floor_time, theirs_encode = _tokenizer_floor(tokenizer, template_file, rows, hf, tagged_source)
    print(f"\n1. one process, {len(rows):,} conversations, {tokens:,} tokens (CPU time; per 100, least of {repeat})")
    print(f"{'':<52} {'rows/s':>8} {'tokens/s':>10} {'vs transformers':>16}")
    for label, seconds in [
        ("transformers apply_chat_template (tagged template)", theirs_time),
        ("chatcodec Formatter (tagged template)", tagged_time),
        ("chatcodec Formatter (model template, inferred mask)", plain_time),
        ("chatcodec pipeline: JSONL -> Parquet, with start-up", pipeline_time),  # content escaped (the default)
    ]:
        print(f"{label:<52} {len(rows) / seconds:>8,.0f} {tokens / seconds:>10,.0f} {theirs_time / seconds:>15.2f}x")
    steady = pipeline_time - start_up
    print(
        f"the pipeline's start-up (loading the codec) is {start_up:.2f} s of its {pipeline_time:.2f} s; without it:"
        f" {len(rows) / steady:,.0f} rows/s, {theirs_time / steady:.2f}x (transformers' load is not timed either)"
    )
    print(
        f"the tokenizers library alone: {floor_time:.2f} s encoding the text chatcodec encodes (what its caches of"
        f" stretches and pieces lack; {floor_time / tagged_time:.0%} of the Formatter's time, so at most"
        f" {theirs_time / floor_time:.1f}x), {theirs_encode:.2f} s for the whole prompts transformers encodes"
    )


def _tokenizer_floor(
    tokenizer: Path, template_file: Path, rows: list[dict[str, Any]], hf: Any, source: str
) -> tuple[float, float]:
    """CPU time of the tokenizers library alone: on the texts a fresh Formatter sends it (replayed), and on
    the whole prompts transformers tokenizes."""
    import chatcodec.vocab as vocab
    from chatcodec.dataset import Formatter

    sent: list[tuple[Any, str]] = []
    encode = vocab._encode
    vocab._encode = lambda tok, text: (sent.append((tok, text)), encode(tok, text))[1]  # type: ignore[assignment]
    try:
        formatter = Formatter(tokenizer, template=template_file, content_special_tokens="allow")
        for r in rows:
            formatter.format(r, r["id"])
    finally:
        vocab._encode = encode
    ours = _cpu(lambda: [tok.encode(text, add_special_tokens=False) for tok, text in sent])
    render = hf.apply_chat_template
    prompts = [render(r["messages"], tools=r["tools"], chat_template=source, tokenize=False) for r in rows]
    backend = hf.backend_tokenizer
    theirs = _cpu(lambda: [backend.encode(text, add_special_tokens=False) for text in prompts])
    return ours, theirs


def workers(source: Path, folder: Path, tokenizer: Path, total: int) -> dict[int, float]:
    from chatcodec.dataset import format_dataset

    times = {}
    print(f"\n2. the whole dataset ({total:,} conversations), local engine (wall time; CPU time of all processes)")
    for count in (1, 2):
        start, cpu = time.perf_counter(), _all_cpu()
        summary = format_dataset(source, folder / f"w{count}.parquet", tokenizer=tokenizer, workers=count,
                                 progress=False)  # fmt: skip
        times[count] = time.perf_counter() - start
        cpu = _all_cpu() - cpu
        print(
            f"workers={count}: {times[count]:6.1f} s, {summary.rows_out / times[count]:,.0f} rows/s,"
            f" {summary.tokens / times[count]:,.0f} tokens/s; {cpu:.1f} s of CPU"
        )
    print(f"speed-up from 1 to 2 workers: {times[1] / times[2]:.2f}x (load average now {os.getloadavg()[0]:.2f})")
    return times


def _all_cpu() -> float:
    """CPU time of this process and of its finished worker processes."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# the peak RSS in kB: VmHWM, as ru_maxrss keeps the high-water mark of the process that started this one
_MEMORY_CHILD = """
import resource, sys
from chatcodec.dataset import format_dataset
format_dataset(sys.argv[1], sys.argv[2], tokenizer=sys.argv[3], workers=1, progress=False)
try:
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    print(int(status.split()[0]))
except OSError:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def memory(folder: Path, tokenizer: Path, sizes: list[int]) -> None:
    print("\n3. peak memory of one process (workers=1) as the dataset grows")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for size in sizes:
        source = write_dataset(folder / f"m{size}.jsonl", size)
        done = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, str(source), str(folder / "m.parquet"), str(tokenizer)],
            capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip
        megabytes = int(done.stdout.split()[-1]) / 1024
        size_mb = source.stat().st_size / 1e6
        print(f"{size:>7,} conversations ({size_mb:6.1f} MB of JSONL): peak RSS {megabytes:6.0f} MB")
        source.unlink()


def ray_overhead(source: Path, folder: Path, tokenizer: Path, local_time: float) -> None:
    import ray

    from chatcodec.dataset import format_dataset

    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    started = time.perf_counter() - start
    try:
        start = time.perf_counter()
        format_dataset(source, folder / "ray.parquet", tokenizer=tokenizer, engine="ray", progress=False)
        elapsed = time.perf_counter() - start
    finally:
        ray.shutdown()
    import pyarrow.parquet as pq

    same = pq.read_table(folder / "ray.parquet").equals(pq.read_table(folder / "w2.parquet"))
    print("\n4. Ray Data on a local instance of 2 CPUs (wall time)")
    print(f"ray.init: {started:.1f} s; the job: {elapsed:.1f} s against {local_time:.1f} s with 2 local workers")
    print(f"Ray's overhead: {elapsed / local_time:.2f}x the local engine's time; output identical: {same}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="conversations in the generated dataset")
    parser.add_argument("--sample", type=int, default=2_000, help="conversations for the per-process comparison")
    parser.add_argument("--repeat", type=int, default=3, help="section 1's timings, in turns: the least is kept")
    parser.add_argument("--memory-sizes", default="5000,20000,80000")
    parser.add_argument("--sections", default="1,2,3,4", help="which parts to run (1 to 4)")
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument(
        "--text", choices=("words", "docs"), default="words",
        help="the conversations' text: drawn from 80 words, or cut from the repository's docs and sources",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    warnings.simplefilter("ignore")
    tokenizer = args.shared / "tokenizers" / "qwen3"
    global DOCS
    DOCS = _docs(args.shared) if args.text == "docs" else None
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = write_dataset(folder / "data.jsonl", args.rows)
        sample = [conversation(i) for i in range(args.sample)]
        print(f"generated {args.rows:,} distinct conversations ({source.stat().st_size / 1e6:.1f} MB of JSONL)")
        sections = set(args.sections.split(","))
        if "1" in sections:
            per_process(folder, sample, tokenizer, args.repeat)
        if "2" in sections or "4" in sections:
            times = workers(source, folder, tokenizer, args.rows)
        if "3" in sections:
            memory(folder, tokenizer, [int(s) for s in args.memory_sizes.split(",")])
        if "4" in sections:
            ray_overhead(source, folder, tokenizer, times[2])
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
