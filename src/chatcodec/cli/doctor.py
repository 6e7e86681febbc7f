"""``chatcodec doctor``: this machine, the llama.cpp build, the configuration the engine check chose, and its speed.

chatcodec doctor                      # the default model; the check's cached result when there is one
chatcodec doctor --recheck            # run the engine check again
chatcodec doctor --engine safe        # measure a configuration by hand
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

from ..exceptions import LoadError
from . import common

__all__ = ["configure", "run"]

#: the CPU flags that decide which of llama.cpp's kernels run
_SIMD = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
         "amx_tile", "amx_int8", "amx_bf16", "neon", "asimd", "sve")  # fmt: skip
#: tokens generated for the speed figure
SPEED_TOKENS = 32


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print the machine's facts (CPU, flags that pick llama.cpp's kernels), the llama.cpp build (version,"
        " library, its system info), the configuration the engine check chose for the embedded model and why,"
        " and a short generation speed measured in a child process. Exit 1 when llama.cpp runs in no"
        " configuration here."
    )
    common.add_engine_option(parser)
    parser.add_argument("--model", metavar="PATH.gguf", help="the GGUF to check with (default: SmolLM2-135M)")
    parser.add_argument("--recheck", action="store_true", help="run the engine check again, ignoring its cache")
    parser.add_argument("--json", action="store_true", help="print the facts as one JSON object")


def run(args: argparse.Namespace) -> int:
    from ..backends import probe
    from ..backends.llama import default_model_path

    model = Path(args.model).expanduser() if args.model else default_model_path()
    if not model.is_file():
        raise LoadError(f"No model file at {model}.")
    cpu, build = probe.cpu_facts(), probe.engine_build()
    facts: dict[str, Any] = {
        "machine": f"{cpu['name']}, {cpu['cores']} cores, {platform.system()} {platform.release()} {cpu['machine']}",
        "cpu_flags": [f for f in _SIMD if f in cpu["flags"]],
        "python": f"{platform.python_version()} {sys.executable}",
        "engine": f"llama-cpp-python {build['llama_cpp_python']}, {build['library'] or 'library not found'}",
        "cache": str(probe.cache_dir() / "engine-check.json"),
    }
    try:
        choice = probe.choose_engine(model, force=args.engine, recheck=args.recheck)
    except LoadError as exc:
        facts["chosen"] = None
        facts["error"] = str(exc)
        _print(facts, args.json)
        return 1
    speed = probe.probe(model, choice.config, tokens=SPEED_TOKENS)
    facts["chosen"] = choice.config.name
    facts["why"] = choice.reason
    facts["checks"] = [f"{a.config}: {a.ended}" + (f", {a.tokens_per_second} tokens/s" if a.ok else "")
                       for a in choice.attempts]  # fmt: skip
    facts["build"] = speed.system_info or None
    if speed.ok:
        facts["speed"] = f"{speed.tokens_per_second} tokens/s ({SPEED_TOKENS} tokens greedy, {model.name})"
    else:
        facts["speed"] = f"the measuring child ended with {speed.ended}"
    _print(facts, args.json)
    return 0 if speed.ok else 1


def _print(facts: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(facts, indent=1))
        return
    for key, value in facts.items():
        if value is None or value == []:
            continue
        text = ", ".join(value) if isinstance(value, list) else str(value)
        print(f"{key.replace('_', ' '):<10} {text}")
    common.flush_notes()
