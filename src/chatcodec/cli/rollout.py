"""``chatcodec rollout``: multi-turn tool rollouts, token in and token out, written as training rows.

chatcodec rollout examples/temperature.py -p "How warm is it in Paris?" --rounds 3 -n 8 -o rollouts.parquet

Each rollout is a :class:`chatcodec.Conversation` on the model's codec: the model is given
``conv.input_ids`` and its sampled ids go back in verbatim with ``add_completion``; the tool calls it makes
run with the given functions (:class:`chatcodec.Toolbox`) and their results are appended, until it answers
or ``--rounds`` generations are spent. The rows hold the ids, the sampled mask and the logprobs (null: the
embedded engine does not report them), and the end says how many rollouts a fresh re-encode of their
messages would have changed (the drift the conversation prevents).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..conversation import Conversation
from ..exceptions import BackendError, InputError, LoadError
from ..tokens import Codec
from ..tools import Toolbox
from . import common
from .tools import load_functions

__all__ = ["Rollout", "configure", "roll", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the function-calling loop on a model token in, token out: the ids the model was given and sampled,"
        " kept exactly (chatcodec.Conversation), written as training rows (Parquet, or JSON lines for .jsonl)."
    )
    parser.add_argument("functions", metavar="FUNCTIONS", help="FILE.py[:NAME,...] or package.module[:NAME,...]")
    parser.add_argument("--prompt", "-p", metavar="TEXT", required=True, help="the user's message")
    parser.add_argument("--system", metavar="TEXT", help="a system message before it")
    parser.add_argument("--rounds", type=common.positive_int, default=4, metavar="N", help="generations per rollout")
    parser.add_argument("--count", "-n", type=common.positive_int, default=1, metavar="N", help="rollouts (default 1)")
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T", help="sampling temperature (1.0)")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="the first generation's seed (then +1)")
    parser.add_argument("--max-tokens", type=common.positive_int, default=128, metavar="N", help="per generation")
    parser.add_argument(
        "--tool-choice",
        choices=["auto", "required"],
        default="auto",
        help="required: the first generation of each rollout must call a tool (constrained); auto: the model's",
    )
    parser.add_argument("--model", "-m", metavar="PATH.gguf", help="a GGUF to run (default: the embedded SmolLM2)")
    parser.add_argument("--output", "-o", metavar="PATH", required=True, help="rows to write: .parquet or .jsonl")


def run(args: argparse.Namespace, stdout: IO[str] | None = None) -> int:
    out = stdout or sys.stdout
    output = Path(args.output).expanduser()
    if output.suffix not in (".parquet", ".jsonl"):
        raise InputError(f"--output must end in .parquet or .jsonl, not {output.name!r}.")
    toolbox = Toolbox(load_functions(args.functions))
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    backend = _backend(args.model)
    common.flush_notes()
    rollouts: list[Rollout] = []
    try:
        for index in range(args.count):
            rollouts.append(
                asyncio.run(
                    roll(
                        backend,
                        backend.codec,
                        toolbox,
                        messages,
                        rounds=args.rounds,
                        temperature=args.temperature,
                        seed=args.seed + index * args.rounds,
                        max_tokens=args.max_tokens,
                        tool_choice=args.tool_choice,
                    )
                )
            )
            _progress(index + 1, args.count, rollouts)
    finally:
        print(file=sys.stderr)
    _write(output, [r.conversation.to_row() for r in rollouts])
    drifts = Counter(r.conversation.drift().reason for r in rollouts)
    changed = sum(count for reason, count in drifts.items() if reason is not None)
    reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(drifts.items()) if reason is not None)
    out.write(
        f"{len(rollouts)} rollouts, {sum(len(r.conversation) for r in rollouts)} tokens"
        f" ({sum(sum(r.conversation.sampled_mask) for r in rollouts)} sampled),"
        f" {sum(r.tool_calls for r in rollouts)} tool calls -> {output}\n"
        f"drift: a fresh encode of the messages would change {changed} of {len(rollouts)}"
        + (f" ({reasons})" if reasons else "")
        + "\n"
    )
    return 0


@dataclass
class Rollout:
    """One rollout: its conversation, and each generation as the engine had it: the ids it was given and the
    ids it sampled (the end-of-generation token included)."""

    conversation: Conversation
    generations: list[tuple[list[int], list[int]]] = field(default_factory=list)
    tool_calls: int = 0


async def roll(
    backend: Any,
    codec: Codec,
    toolbox: Toolbox,
    messages: Sequence[Any],
    *,
    rounds: int,
    temperature: float = 1.0,
    seed: int = 0,
    max_tokens: int = 128,
    tool_choice: str = "auto",
) -> Rollout:
    """Generate, run the tool calls, append their results, and generate again, at most ``rounds`` times; every
    generation is given ``conv.input_ids`` and its sampled ids go back verbatim."""
    from ..backends.base import Generation

    tools = toolbox.tools
    conv = codec.conversation(messages[:-1], tools=tools, polyfill="auto")
    conv.append(messages[-1], add_generation_prompt=True)
    rollout = Rollout(conv)
    constraint = _forced(codec, tools) if tool_choice == "required" else None
    for round_ in range(rounds):
        given = conv.input_ids
        sampled: list[int] = []
        request = Generation(
            given,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed + round_,
            constraint=constraint if round_ == 0 else None,
        )
        async for chunk in backend.generate(request):
            if chunk.token_ids is None:
                raise BackendError("The engine does not report the ids it sampled, which a rollout keeps.")
            sampled += chunk.token_ids
        rollout.generations.append((given, sampled))
        message = conv.add_completion(sampled)
        if not message.tool_calls:
            break
        rollout.tool_calls += len(message.tool_calls)
        results = await toolbox.acall_many([call.to_openai() for call in message.tool_calls])
        conv.append([result.message for result in results], add_generation_prompt=round_ + 1 < rounds)
    return rollout


def _forced(codec: Codec, tools: list[Any]) -> Any:
    """The constraint that makes a generation call one of ``tools``, in the template's format."""
    from ..decoders import decoder_for
    from ..server.constrain import learn_frame, tool_constraint

    name = decoder_for(codec.template, polyfill="auto").name
    frame = None if name == "generic" else learn_frame(codec.template)
    constraint = tool_constraint(name, tools, "required", parallel=False, frame=frame)
    if constraint is None:
        raise InputError(
            f"Cannot constrain template {codec.template.name or 'unnamed'!r} to a tool call; use --tool-choice auto."
        )
    return constraint


def _backend(model: str | None) -> Any:
    from ..backends import LlamaBackend, default_model_path

    path = Path(model).expanduser() if model else default_model_path()
    if not path.is_file():
        raise LoadError(f"No model file at {path}.")
    print("chatcodec: loading the model ...", file=sys.stderr, flush=True)
    return LlamaBackend(path) if model else LlamaBackend()


def _progress(done: int, total: int, rollouts: list[Rollout]) -> None:
    width = 30
    filled = width * done // total
    calls = sum(r.tool_calls for r in rollouts)
    sys.stderr.write(f"\rrollouts [{'#' * filled}{'.' * (width - filled)}] {done}/{total}, {calls} tool calls")
    sys.stderr.flush()


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    """The rows as Parquet (ids as int32 lists, masks int8, logprobs float lists, messages as JSON text)."""
    if path.suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise LoadError("Writing Parquet needs pyarrow: pip install 'chatcodec[dataset]', or write .jsonl.") from None
    columns = {
        "input_ids": pa.array([r["input_ids"] for r in rows], pa.list_(pa.int32())),
        "attention_mask": pa.array([r["attention_mask"] for r in rows], pa.list_(pa.int8())),
        "assistant_masks": pa.array([r["assistant_masks"] for r in rows], pa.list_(pa.int8())),
        "num_tokens": pa.array([r["num_tokens"] for r in rows], pa.int32()),
        "error": pa.array([r["error"] for r in rows], pa.string()),
        "sampled_mask": pa.array([r["sampled_mask"] for r in rows], pa.list_(pa.int8())),
        "logprobs": pa.array([r["logprobs"] for r in rows], pa.list_(pa.float32())),
        "messages": pa.array([json.dumps(r["messages"], ensure_ascii=False) for r in rows], pa.string()),
    }
    try:
        pq.write_table(pa.table(columns), path)
    except OSError as exc:
        raise LoadError(f"Cannot write {path}: {exc}.") from None
