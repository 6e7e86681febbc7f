"""Constrained generation speed on the embedded model: llama-cpp-python's grammar sampling beside chatcodec's.

The reference (what ``LlamaBackend`` did before) is llama-cpp-python's own ``Llama.generate(grammar=...)``,
which applies the grammar to all 49,152 tokens of SmolLM2's vocabulary at every step. chatcodec's backend
checks the grammar on the token the model chose first (``chatcodec.backends.sampling``). Both run the same
GGUF, prompt ids and grammar in this process, greedy, one after the other; the texts must be the same
(greedy decoding under a grammar has one answer), and each row gives tokens per second and the ratio.
Unconstrained generation of the same prompt is the ceiling.

    python bench/bench_constrain.py            # about a minute on 2 cores
    python bench/bench_constrain.py --tokens 40 --repeats 3

Constraints: ``tool_choice`` "required" and a named function with the seed's temperature tools (the
generic JSON format SmolLM2's polyfilled template asks for), ``tool_choice`` "none" (plain text that does
not open a call), and ``response_format`` json_schema. Prints figures and ratios, never pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from chatcodec.backends import Constraint, Generation, LlamaBackend  # noqa: E402
from chatcodec.server.constrain import response_constraint, text_constraint, tool_constraint  # noqa: E402
from chatcodec.server.protocol import ResponseFormat  # noqa: E402

CONVERSATIONS = ROOT.parent / "shared" / "corpus" / "conversations.json"
QUESTION = "What's the temperature in San Francisco now? How about tomorrow? Current Date: 2024-09-30."
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}, "landmarks": {"type": "array"}},
    "required": ["city", "population", "landmarks"],
}


def tools() -> list[dict[str, Any]]:
    data = json.loads(CONVERSATIONS.read_text(encoding="utf-8"))
    found: list[dict[str, Any]] = next(c for c in data["conversations"] if c["id"] == "tools_roundtrip")["tools"]
    return found


def cases(backend: LlamaBackend) -> list[tuple[str, list[int], Constraint | None]]:
    codec = backend.codec
    toolset = tools()
    question = [{"role": "user", "content": QUESTION}]
    with_tools = codec.encode(question, tools=toolset, add_generation_prompt=True, polyfill="auto").input_ids
    city = [{"role": "user", "content": "Describe the largest city of France as JSON."}]
    plain = codec.encode(city, add_generation_prompt=True).input_ids
    named = tool_constraint("generic", toolset, "get_current_temperature", parallel=False, frame=None)
    required = tool_constraint("generic", toolset, "required", parallel=True, frame=None)
    return [
        ("unconstrained (tools prompt)", with_tools, None),
        ('tool_choice "required"', with_tools, required),
        ("tool_choice named", with_tools, named),
        ('tool_choice "none"', with_tools, text_constraint()),
        ("unconstrained (city prompt)", plain, None),
        ("response_format json_schema", plain, response_constraint(ResponseFormat("json_schema", SCHEMA, "city"))),
    ]


def reference(backend: LlamaBackend, ids: list[int], constraint: Constraint | None, tokens: int) -> tuple[str, int]:
    """llama-cpp-python's own generation with its grammar over the whole vocabulary, greedy: the text, and the
    tokens sampled (the end-of-generation one included)."""
    import llama_cpp

    llama = backend._llama
    grammar = llama_cpp.LlamaGrammar.from_string(constraint.grammar, verbose=False) if constraint else None
    out: list[int] = []
    steps = 0
    for token in llama.generate(
        ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, grammar=grammar, reset=True
    ):  # fmt: skip
        steps += 1
        if llama_cpp.llama_vocab_is_eog(backend._vocab, token):
            break
        out.append(token)
        if steps >= tokens:
            break
    return llama.detokenize(out).decode("utf-8", errors="replace"), steps


async def ours(backend: LlamaBackend, ids: list[int], constraint: Constraint | None, tokens: int) -> tuple[str, int]:
    """chatcodec's backend: the text, and the tokens sampled (the end-of-generation one included, as above)."""
    text, steps = "", 0
    async for chunk in backend.generate(Generation(ids, max_tokens=tokens, temperature=0, constraint=constraint)):
        text += chunk.text
        steps = chunk.completion_tokens or steps
    return text, steps


def timed(fn: Any, repeats: int, *args: Any) -> tuple[Any, float]:
    """``fn(*args)``'s result and its median time; an argument that is a function is called anew each time."""
    times = []
    result = None
    for _ in range(repeats):
        given = [a() if callable(a) else a for a in args]
        start = time.perf_counter()
        result = fn(*given)
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=60, help="tokens to generate per run (default 60)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure, the median is kept (default 3)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    backend = LlamaBackend(n_threads=args.threads)
    loop = asyncio.new_event_loop()
    print(f"SmolLM2-135M-Instruct Q4_1, greedy, up to {args.tokens} tokens, median of {args.repeats}")
    print(f"{'':32} {'llama-cpp-python':>17} {'chatcodec':>10} {'ratio':>6}  same text")
    for name, ids, constraint in cases(backend):
        # the prompt is evaluated once before timing, for both (each run then reuses it from the context)
        reference(backend, ids, constraint, 1)
        (ref_text, ref_count), ref_time = timed(reference, args.repeats, backend, ids, constraint, args.tokens)
        (our_text, our_count), our_time = timed(
            loop.run_until_complete,
            args.repeats,
            lambda: ours(backend, ids, constraint, args.tokens),  # noqa: B023
        )
        ref_rate, our_rate = ref_count / ref_time, our_count / our_time
        same = our_text == ref_text
        print(f"{name:32} {ref_rate:12.1f} tok/s {our_rate:6.1f} tok/s {our_rate / ref_rate:5.2f}x  {same}")
        if not same:
            print(f"    llama-cpp-python: {ref_text!r}\n    chatcodec:        {our_text!r}")
    counts = backend.grammar_counts
    total = sum(counts.values())
    print(
        f"chatcodec's constrained steps: {counts['checked']} taken at the first try, {counts['rescued']} found by"
        f" checking tokens one at a time, {counts['full']} over the whole vocabulary (of {total})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
