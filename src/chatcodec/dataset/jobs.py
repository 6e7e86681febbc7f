"""``format_dataset``: a dataset in, a Parquet file of training rows out, with its rejects and a report.

>>> summary = format_dataset("data.jsonl", "train.parquet", tokenizer="../shared/tokenizers/qwen3")  # doctest: +SKIP
>>> print(summary.text())  # doctest: +SKIP
rows: 1000 in, 998 out, 2 rejected (template_error 2), 0 truncated
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from ..exceptions import InputError
from ..render import ChatTemplate
from .engines import ENGINES, local_results, ray_results
from .formatting import Formatted, Formatter
from .readers import Shard, plan
from .shards import ShardResult, output_schema
from .summary import SUMMARY_KEY, Summary, require_pyarrow

__all__ = ["check_outputs", "default_rejects_path", "format_dataset"]

#: the files of a model folder that loading a tokenizer and its template may read
_MODEL_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
    "generation_config.json",
)


def default_rejects_path(output: str | Path) -> Path:
    """``train.parquet`` -> ``train.rejects.jsonl``, beside it."""
    path = Path(output)
    return path.with_name(path.name.removesuffix(".parquet") + ".rejects.jsonl")


def format_dataset(
    source: str | Path,
    output: str | Path,
    *,
    tokenizer: str | Path,
    template: str | Path | ChatTemplate | None = None,
    pack: int | None = None,
    rejects: str | Path | None = None,
    report: str | Path | None = None,
    engine: Literal["local", "ray"] = "local",
    workers: int | None = None,
    shard_rows: int = 1024,
    progress: bool | None = None,
    **options: Any,
) -> Summary:
    """Format the chat dataset ``source`` for training, into the Parquet file ``output``.

    * ``source``: a .jsonl, .json or .parquet file, or a folder of them, with rows in OpenAI, ShareGPT or
      prompt/completion form (:mod:`chatcodec.dataset.rows`);
    * ``tokenizer``: a model folder with ``tokenizer.json``; ``template`` replaces its chat template;
    * ``options``: what :class:`~chatcodec.dataset.FormatOptions` takes (``reasoning``, ``end_of_turn``,
      ``last_turn_only``, ``labels``, ``max_length``, ``overlong``, ``content_special_tokens``);
    * ``pack``: pack rows into sequences of this many tokens (best-fit decreasing, within each shard of
      ``shard_rows`` rows), with ``position_ids`` and ``seq_lengths``; rows are at most ``pack`` long;
    * ``rejects``: where the rows that could not be formatted go, as JSON lines with their id, reason,
      error message and the row itself (default: ``OUTPUT.rejects.jsonl``; always written);
    * ``report``: write a self-contained HTML report there;
    * ``engine``: ``"local"`` (``workers`` processes, default all cores) or ``"ray"`` (Ray Data);
    * ``progress``: a live progress bar on stderr; by default only when stderr is a terminal.

    Returns the run's :class:`~chatcodec.dataset.Summary`, which the output file's metadata keeps too.
    """
    require_pyarrow()
    if engine not in ENGINES:
        raise InputError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}.")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise InputError(f"workers must be at least 1, not {workers!r}.")
    if pack is not None:
        if not isinstance(pack, int) or pack < 1:
            raise InputError(f"pack must be a positive number of tokens, not {pack!r}.")
        if options.get("max_length") is None:
            options["max_length"] = pack
        elif options["max_length"] > pack:
            raise InputError(f"max_length ({options['max_length']}) cannot exceed the pack length ({pack}).")
    output = Path(output)
    rejects_path = Path(rejects) if rejects is not None else default_rejects_path(output)
    outputs = {"output": output, "rejects": rejects_path}
    if report is not None:
        outputs["report"] = Path(report)
    check_outputs(source, outputs, tokenizer=tokenizer, templates=(template, options.get("text_template")))
    shards = plan(source, shard_rows=shard_rows)
    workers = workers if workers is not None else os.cpu_count() or 1
    # formatted in worker processes (each loads the codec): this one checks the templates, and loads it only for
    # a report
    elsewhere = engine == "ray" or (workers > 1 and len(shards) > 1)
    formatter = Formatter(tokenizer, template=template, load=not elsewhere, **options)
    if output.is_dir():
        raise InputError(f"The output {output} is a folder; give a file name such as {output / 'train.parquet'}.")
    if engine == "ray":
        results = ray_results(shards, formatter, pack)
    else:
        results = local_results(shards, formatter, pack, workers=workers)
    show = sys.stderr.isatty() if progress is None else progress
    summary, samples = _write(results, shards, output, rejects_path, formatter, pack, show)
    if report is not None:
        from .report import write_report

        write_report(report, summary, samples, formatter.codec, title=f"{Path(source).name} -> {output.name}")
    return summary


def check_outputs(
    source: str | Path,
    outputs: Mapping[str, str | Path],
    *,
    tokenizer: str | Path,
    templates: tuple[Any, ...] = (),
) -> None:
    """Refuse, before anything is opened for writing, an output that is one of the run's inputs (a dataset
    file, the tokenizer's files, a template file) or another output: writing it would destroy what is read.

    ``outputs`` maps each output's name in the error (``"output"``, or ``"--rejects"`` on the command line) to
    its path. Paths are compared as the files they are (symbolic and hard links included).
    """
    from .readers import input_files

    inputs = [(path, f"the input {path}") for path, _ in input_files(source)]
    model = Path(tokenizer).expanduser()
    model_files = [model / name for name in _MODEL_FILES] if model.is_dir() else [model]
    inputs += [(path, f"the tokenizer's {path.name}") for path in model_files if path.is_file()]
    for template in templates:
        if isinstance(template, (str, Path)) and Path(template).expanduser().is_file():
            inputs.append((Path(template).expanduser(), f"the template file {template}"))
    seen: list[tuple[Path, str]] = []
    for name, given in outputs.items():
        path = Path(given).expanduser()
        for other, what in [*inputs, *seen]:
            if _same_file(path, other):
                raise InputError(
                    f"{name} {given} is {what}: writing it would destroy what the run reads; give another path."
                )
        seen.append((path, f"the path given to {name} too"))


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        try:
            return os.path.samefile(a, b)
        except OSError:
            pass
    return a.resolve() == b.resolve()


def _write(
    results: Iterator[ShardResult],
    shards: list[Shard],
    output: Path,
    rejects_path: Path,
    formatter: Formatter,
    pack: int | None,
    show: bool,
) -> tuple[Summary, list[Formatted]]:
    import pyarrow.parquet as pq

    schema = output_schema(labels=formatter.options.labels, packed=pack is not None)
    summary = Summary(pack_length=pack or 0)
    samples: list[Formatted] = []
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    total = sum(s.rows or 0 for s in shards) if all(s.rows is not None for s in shards) else None
    try:
        with (
            pq.ParquetWriter(str(partial), schema) as writer,
            rejects_path.open("w", encoding="utf-8") as rejected,
            _progress(show, total) as advance,
        ):
            for result in results:
                if result.table.num_rows:
                    writer.write_table(result.table)
                for line in result.rejects:
                    rejected.write(line + "\n")
                summary = summary + result.summary
                samples.extend(result.samples[: max(0, 2 - len(samples))])
                advance(result.summary.rows_in, result.summary.tokens)
            writer.add_key_value_metadata({SUMMARY_KEY: summary.to_json().encode()})
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    return summary, samples


@contextmanager
def _progress(show: bool, total: int | None) -> Iterator[Any]:
    """A function ``advance(rows, tokens)`` driving a live bar (rows/s, tokens/s, ETA), or doing nothing."""
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    except ImportError:
        show = False
    if not show:
        yield lambda rows, tokens: None
        return
    started = time.perf_counter()
    columns = (
        TextColumn("formatting"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} rows" if total else "{task.completed:,.0f} rows"),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("rows", total=total, rate="")
        seen = {"rows": 0, "tokens": 0}

        def advance(rows: int, tokens: int) -> None:
            seen["rows"] += rows
            seen["tokens"] += tokens
            elapsed = max(time.perf_counter() - started, 1e-9)
            rate = f"{seen['rows'] / elapsed:,.0f} rows/s, {seen['tokens'] / elapsed:,.0f} tokens/s"
            bar.update(task, advance=rows, rate=rate)

        yield advance
