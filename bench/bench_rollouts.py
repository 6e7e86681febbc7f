"""Multi-turn tool rollouts on the embedded model, token in and token out: are the ids exact? (issue 32)

Runs ``--count`` rollouts (default 64) of the function-calling loop of ``chatcodec rollout`` on the embedded
SmolLM2-135M-Instruct, at temperature 1.0 with fixed seeds, the first generation of each constrained to a
tool call (its tools are rendered into the system text: the template has none). For every generation it
reads what the engine holds once it is done, llama.cpp's own record of the tokens it evaluated (the prompt it
was given, then every sampled token but the last, which is never evaluated), and the ids it reported as
sampled. A rollout is exact when, for every generation, the ids given are ``conv.input_ids`` at that point and
the engine's record is a prefix of the final ``conv.input_ids`` at the same place, and ``sampled_mask`` is 1
exactly on the sampled ids. It also counts the rollouts a fresh ``codec.encode(conv.messages)`` would have
changed, and why (``Conversation.drift``): what re-rendering between turns would have trained on.

Run: ``PYTHONPATH=src python bench/bench_rollouts.py [--count 64] [--rounds 3] [--max-tokens 64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


class Logged:
    """The embedded backend, with llama.cpp's record of the evaluated tokens read after each generation."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.info = backend.info
        self.log: list[tuple[list[int], list[int], list[int]]] = []  # given, sampled, evaluated

    async def generate(self, request: Any) -> Any:
        sampled: list[int] = []
        async for chunk in self.backend.generate(request):
            sampled += chunk.token_ids or ()
            yield chunk
        llama = self.backend._llama  # the engine's own state: what its context holds now
        self.log.append((list(request.prompt), sampled, [int(t) for t in llama.input_ids[: llama.n_tokens]]))


def exact(rollout: Any, log: list[tuple[list[int], list[int], list[int]]]) -> bool:
    ids, mask = rollout.conversation.input_ids, rollout.conversation.sampled_mask
    marked = [0] * len(ids)
    for given, sampled, evaluated in log:
        at = len(given)
        if ids[:at] != given or ids[at : at + len(sampled)] != sampled or evaluated != (given + sampled)[:-1]:
            return False
        marked[at : at + len(sampled)] = [1] * len(sampled)
    return marked == mask


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=32)
    args = parser.parse_args()

    import temperature

    from chatcodec.backends import LlamaBackend
    from chatcodec.cli.rollout import roll
    from chatcodec.tools import LocalClient, Toolbox

    backend = LlamaBackend()
    toolbox = Toolbox(temperature.TOOLS)
    messages = [{"role": "user", "content": temperature.QUESTION}]
    results, drifts, calls, generations, start = [], Counter(), 0, 0, time.perf_counter()
    for index in range(args.count):
        logged = Logged(backend)
        rollout = asyncio.run(
            roll(
                LocalClient(logged, template=backend.codec), toolbox, messages, rounds=args.rounds,
                temperature=1.0, seed=args.seed + index * args.rounds, max_tokens=args.max_tokens,
                tool_choice="required",
            )
        )  # fmt: skip
        results.append(exact(rollout, logged.log))
        drift = rollout.conversation.drift()
        drifts[drift.reason] += 1
        calls += rollout.tool_calls
        generations += len(logged.log)
        print(
            f"rollout {index + 1}/{args.count}: exact {results[-1]}, {len(logged.log)} generations,"
            f" {rollout.tool_calls} tool calls, drift {drift.reason or 'none'}",
            flush=True,
        )
    changed = sum(n for reason, n in drifts.items() if reason is not None)
    print(
        f"{args.count} rollouts, {generations} generations, {calls} tool calls, temperature 1.0,"
        f" {time.perf_counter() - start:.0f} s"
    )
    print(f"exact (ids given and sampled = conv.input_ids, sampled_mask exact): {sum(results)} of {args.count}")
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(drifts.items(), key=str) if reason is not None)
    print(f"a fresh codec.encode(messages) would change {changed} of {args.count} ({reasons or 'none'})")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
