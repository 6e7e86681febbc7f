"""Decoding with a response template: chatcodec's decoder against transformers' ``parse_response``.

The same outputs, the same templates: every corpus template whose tool calls chatcodec decodes, with the
response template chatcodec writes for it, and TRL's hand-written templates on the parse vectors of their
formats. Each side decodes every output (with its prompt) once a round, the two sides taking turns, for ``--rounds``
rounds; the figure is the ratio of transformers' fastest round to chatcodec's, which must be at least 10.
Times are CPU time of this process (``time.process_time``), and the fastest round is the one other work on
the machine disturbed least. One run takes under a minute.

    PYTHONPATH=src python bench/bench_response_template.py

Exit status 1 if the ratio is under 10 (needs ../shared and transformers, a dev dependency).

On a busy machine, count instructions instead of time: valgrind's callgrind counts the same total for the same
run whatever else the machine does, once the hash seed is fixed (else the setup's own count moves by more than
the rounds'). One side's instructions per output are the difference between two runs::

    for r in 1 9; do PYTHONHASHSEED=0 PYTHONPATH=src valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/bench_response_template.py --side chatcodec --rounds $r; done

(``Collected`` of the second minus the first, over 8 x 218 outputs; the same with ``--side transformers``.)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.conftest import manifest  # noqa: E402
from tests.decoders.helpers import VECTORS  # noqa: E402
from tests.decoders.test_response_template import TRL, corpus_template, ours, renderings  # noqa: E402
from tests.decoders.test_template_roundtrip import LEFT_OUT  # noqa: E402

from chatcodec import decoder_for, response_template  # noqa: E402
from chatcodec.decoders import decoder_from_response_template  # noqa: E402

TARGET = 10.0


def cases() -> list[tuple[dict[str, Any], str, str, list[Any] | None]]:
    """``(response template, prompt, output, tools)`` for every output both sides decode."""
    found: list[tuple[dict[str, Any], str, str, list[Any] | None]] = []
    for name in sorted(manifest()):
        if name in LEFT_OUT:
            continue
        template = corpus_template(name)
        done = [
            (prompt, text, tools)
            for prompt, text, tools, calls in renderings(template)
            if ours(decoder_for(template, prompt=prompt, tools=tools).decode(text))[0] == calls
        ]
        if done:
            written = response_template(template)
            found += [(written, prompt, text, tools) for prompt, text, tools in done]
    for trl_name, template in TRL["templates"].items():
        formats = TRL["formats"][trl_name]
        found += [(template, "", v["output"], None) for v in VECTORS if v["format"] in formats and not v.get("partial")]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="decodes of every output per side (default 20)")
    parser.add_argument(
        "--side",
        choices=("chatcodec", "transformers"),
        help="run only this side, --rounds times, untimed (for an instruction count: see the module docstring)",
    )
    args = parser.parse_args()
    from transformers.utils.chat_parsing import parse_response

    work = cases()
    decoders = [decoder_from_response_template(rt, prompt=prompt, tools=tools) for rt, prompt, _, tools in work]

    def transformers_side() -> None:
        for rt, prompt, text, tools in work:
            with contextlib.suppress(ValueError):  # a region transformers cannot parse: it gives up
                parse_response(text, rt, prefix=prompt, tools=tools)

    def chatcodec_side() -> None:
        for decoder, (_, _, text, _) in zip(decoders, work, strict=True):
            decoder.decode(text)

    gc.collect()
    gc.freeze()  # the setup's objects (transformers' modules, the corpus) are not walked by every collection
    sides = {"transformers parse_response": transformers_side, "chatcodec": chatcodec_side}
    if args.side is not None:
        side = chatcodec_side if args.side == "chatcodec" else transformers_side
        for _ in range(args.rounds):
            side()
        return 0
    rounds: dict[str, list[float]] = {label: [] for label in sides}
    for side in sides.values():
        side()  # warm: regex caches, imports
    for _ in range(args.rounds):  # the sides take turns, so a busy moment of the machine falls on both
        for label, side in sides.items():
            start = time.process_time()
            side()
            rounds[label].append(time.process_time() - start)
    # each side's fastest round: the least disturbed by other work on the machine
    timings = {label: min(found) / len(work) for label, found in rounds.items()}
    ratio = timings["transformers parse_response"] / timings["chatcodec"]
    print(f"{len(work)} outputs ({sum(len(t) for _, _, t, _ in work):,} characters), {args.rounds} rounds each")
    for label, seconds in timings.items():
        print(f"  {label:28s} {seconds * 1e6:8.1f} us per output")
    print(f"  ratio {ratio:.1f}x (target >= {TARGET:.0f}x)")
    print(json.dumps({"outputs": len(work), "ratio": round(ratio, 2)}))
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
