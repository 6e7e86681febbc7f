"""What the safe engine configuration costs: generation speed with and without llama.cpp's extra buffer types.

Each run is a fresh probe child (``python -m chatcodec.backends.probe``: the default model loaded, a prompt
evaluated, then N tokens decoded greedily), alternating the two configurations so that both see the same
machine; the figures are tokens per second (min, median, max) and the ratio of the medians. On a machine where
the default configuration crashes, only the safe one is measured and the crash is printed.

    python bench/bench_engine.py [--runs 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics

from chatcodec.backends import default_model_path, probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    model = default_model_path()
    speeds: dict[str, list[float]] = {c.name: [] for c in probe.CONFIGS.values()}
    crashed: dict[str, str] = {}
    for _ in range(args.runs):
        for config in probe.CONFIGS.values():
            if config.name in crashed:
                continue
            attempt = probe.probe(model, config, tokens=args.tokens)
            if not attempt.ok:
                crashed[config.name] = attempt.ended
                continue
            speeds[config.name].append(attempt.tokens_per_second or 0.0)
    cpu = probe.cpu_facts()
    print(f"{cpu['name']}, {cpu['cores']} cores; {model.name}; {args.tokens} tokens a run, {args.runs} runs")
    for name, values in speeds.items():
        if name in crashed:
            print(f"{name:<8} crashed ({crashed[name]})")
        elif values:
            low, mid, high = min(values), statistics.median(values), max(values)
            print(f"{name:<8} {mid:7.1f} tokens/s (min {low:.1f}, max {high:.1f})")
    if all(speeds.values()) and not crashed:
        ratio = statistics.median(speeds["safe"]) / statistics.median(speeds["default"])
        print(f"safe / default: {ratio:.2f}x the default's speed")


if __name__ == "__main__":
    main()
