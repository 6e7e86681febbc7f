"""``chatcodec dataset``: format a chat dataset for training, or print the summary of a formatted one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..dataset import REASONS, SHAREGPT_ROLES, format_dataset, read_summary
from ..dataset.engines import one_thread_each
from ..dataset.jobs import check_outputs, default_rejects_path
from ..exceptions import InputError
from ..polyfills import Polyfill
from . import common

__all__ = ["EXIT_REJECTED", "configure", "run"]

#: the exit code of a run that finished but sent rows to the rejects file
EXIT_REJECTED = 1


def configure(parser: argparse.ArgumentParser) -> None:
    roles = ", ".join(f"{k}={v}" for k, v in SHAREGPT_ROLES.items())
    parser.description = (
        "Format a chat dataset for training: INPUT (a .jsonl, .json or .parquet file, or a folder of them) with"
        " rows in OpenAI form (messages, tools, documents, chat_template_kwargs), ShareGPT form (conversations"
        f" of from/value; speakers: {roles}) or prompt/completion form, into OUT.parquet with input_ids,"
        " attention_mask, assistant_masks (or labels), num_tokens and id. Rows that cannot be formatted go to"
        " the rejects file with their id, reason and error; the exit code is 1 when any was rejected."
        " `chatcodec dataset stats OUT.parquet` prints the summary of a formatted file."
    )
    parser.add_argument("input", metavar="INPUT", help="the dataset (or `stats` followed by a formatted file)")
    parser.add_argument("stats_file", nargs="?", metavar="OUT.parquet", help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", metavar="OUT.parquet", help="the Parquet file to write")
    common.add_template_options(parser, default_note="default: the template beside --tokenizer")
    common.add_variable_options(parser, tools=False)
    supervision = parser.add_argument_group("what is supervised")
    supervision.add_argument("--no-reasoning", action="store_true", help="leave the reasoning out of the mask")
    supervision.add_argument(
        "--no-end-of-turn", action="store_true", help="leave each turn's end-of-turn token out of the mask"
    )
    supervision.add_argument("--last-turn-only", action="store_true", help="supervise only the last assistant turn")
    supervision.add_argument(
        "--labels", action="store_true", help="write labels (the ids, -100 where unsupervised), not assistant_masks"
    )
    length = parser.add_argument_group("length and packing")
    length.add_argument("--max-length", type=_positive, metavar="N", help="the longest row, in tokens")
    length.add_argument(
        "--overlong",
        choices=["drop", "truncate", "keep"],
        default="drop",
        help="what becomes of a row over --max-length: drop it to the rejects (default), keep its start, or keep it",
    )
    length.add_argument(
        "--pack",
        type=_positive,
        metavar="LENGTH",
        help="pack rows into sequences of LENGTH tokens (best-fit decreasing), with position_ids and seq_lengths",
    )
    parser.add_argument(
        "--content-special-tokens",
        choices=["escape", "reject", "allow"],
        default="escape",
        help="a control token inside content: plain text (escape, the default), a reject, or the token (allow)",
    )
    parser.add_argument(
        "--text-template",
        metavar="NAME|PATH",
        help="rows kept as rendered text (a 'text' column, no messages) were rendered with this template: read each"
        " back into its messages first (a text it does not render is a bad_row reject)",
    )
    parser.add_argument(
        "--polyfill",
        metavar="auto|NAME,...",
        help="rewrite what the template cannot render: 'auto' (what it lacks, see chatcodec inspect) or rewrites"
        " by name (see chatcodec render --help); by default a row the template refuses is a reject",
    )
    run_group = parser.add_argument_group("the run")
    run_group.add_argument("--engine", choices=["local", "ray"], default="local", help="local processes or Ray Data")
    run_group.add_argument("--workers", type=_positive, metavar="N", help="local worker processes (default: all cores)")
    run_group.add_argument(
        "--shard-rows", type=_positive, default=1024, metavar="N", help="rows per shard (the unit of work and packing)"
    )
    run_group.add_argument("--rejects", metavar="PATH", help="the rejects file (default: OUT.rejects.jsonl)")
    run_group.add_argument("--report", metavar="PATH", help="write a self-contained HTML report there")
    run_group.add_argument(
        "--no-progress", action="store_true", help="no progress bar (there is none off a terminal anyway)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    if args.input == "stats" and not Path("stats").exists():
        if args.stats_file is None:
            raise InputError("dataset stats needs the formatted file: chatcodec dataset stats OUT.parquet")
        if args.output is not None:
            raise InputError("dataset stats prints the summary of OUT.parquet: it writes nothing, so -o is not for it")
        summary = read_summary(args.stats_file)
        print(summary.to_json() if args.json else summary.text())
        return 0
    if args.stats_file is not None:
        raise InputError(f"unexpected argument {args.stats_file!r}: give one INPUT and -o OUT.parquet")
    if args.output is None:
        raise InputError("the dataset command needs -o OUT.parquet")
    if args.tokenizer is None:
        raise InputError("the dataset command needs --tokenizer PATH: a model folder with tokenizer.json")
    tokenizer = Path(args.tokenizer).expanduser()
    outputs = {"-o": args.output, "--rejects": args.rejects or default_rejects_path(args.output)}
    if args.report is not None:
        outputs["--report"] = args.report
    check_outputs(args.input, outputs, tokenizer=tokenizer, templates=(args.template, args.text_template))
    one_thread_each()  # this process formats too, with --workers 1 or a single shard
    common.flush_notes()
    summary = format_dataset(
        args.input,
        args.output,
        tokenizer=tokenizer.parent if tokenizer.is_file() else tokenizer,
        template=args.template,
        pack=args.pack,
        rejects=args.rejects,
        report=args.report,
        engine=args.engine,
        workers=args.workers,
        shard_rows=args.shard_rows,
        progress=False if args.no_progress else None,
        reasoning=not args.no_reasoning,
        end_of_turn=not args.no_end_of_turn,
        last_turn_only=args.last_turn_only,
        labels=args.labels,
        max_length=args.max_length,
        overlong=args.overlong,
        content_special_tokens=args.content_special_tokens,
        template_kwargs=common.variables_from(args) or None,
        polyfill=_polyfill(args.polyfill),
        text_template=args.text_template,
    )
    if args.json:
        print(json.dumps({**summary.to_dict(), "reasons": {k: REASONS[k] for k in summary.rejected}}))
    else:
        print(summary.text())
    return EXIT_REJECTED if summary.rejected_total else 0


def _polyfill(value: str | None) -> Polyfill:
    if value is None or value == "auto":
        return "auto" if value else False
    names = frozenset(name.strip() for name in value.split(",") if name.strip())
    if not names:
        raise InputError("--polyfill needs 'auto' or rewrite names separated by commas")
    return names


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, not {text!r}")
    return value
