"""Input files cut into shards: small descriptions of row ranges that any process can read on its own.

The input is a JSONL, JSON or Parquet file, or a folder holding them (searched recursively, in name
order; other files are left alone). Planning reads no row: a JSONL file is cut at line boundaries every
``shard_rows`` lines, a Parquet file at row groups (and within them), and a JSON file (a list of rows,
parsed whole: use JSONL or Parquet for large data) is one shard. Both engines run the same plan, so the
output does not depend on the engine or the number of workers.

A row without an ``id`` is named by where it is: ``file.jsonl:12`` (its line), ``file.json[3]`` or
``file.parquet[3]`` (its index in the file).

Reading is total over rows: a line that is not JSON, is longer than :data:`MAX_ROW_BYTES`, nests deeper
than :data:`~chatcodec.dataset.rows.MAX_DEPTH` or holds a lone surrogate comes back as that row's error (a
``bad_row`` reject holding its text), and so does such an element of a JSON file's list; only a file that
cannot be read at all stops the run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..exceptions import InputError, LoadError
from .rows import RowError, check_row

__all__ = ["MAX_ROW_BYTES", "SUFFIXES", "Shard", "plan", "read_shard"]

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}
_CHUNK = 1 << 22
#: the longest row (a JSONL line, an element of a JSON list) that is parsed; a longer one is a reject with its
#: text, unparsed. It is the render's default output budget (``Limits.max_output``): a longer row cannot render.
MAX_ROW_BYTES = 16_000_000


@dataclass(frozen=True)
class Shard:
    """A range of rows of one file: ``start``/``stop`` are byte offsets (JSONL) or row numbers (others)."""

    index: int
    path: str
    kind: str
    start: int
    stop: int
    #: the line number (JSONL) or row index of the first row
    first: int
    #: how many rows (for JSONL: lines, blank ones included), or None when unknown before reading
    rows: int | None
    #: the file's name in row ids
    label: str


def input_files(source: str | Path) -> list[tuple[Path, str]]:
    """The files to read, each with the label its row ids get."""
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise InputError(f"Cannot read {path.name}: a dataset is a .jsonl, .json or .parquet file, or a folder.")
        return [(path, path.name)]
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix in SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise InputError(f"The folder {path} holds no .jsonl, .json or .parquet file.")
        return [(p, p.relative_to(path).as_posix()) for p in files]
    raise LoadError(f"No dataset at {path}: it is neither a file nor a folder.")


def plan(source: str | Path, *, shard_rows: int = 1024) -> list[Shard]:
    """The shards of ``source``, in order."""
    if shard_rows < 1:
        raise InputError(f"shard_rows must be at least 1, not {shard_rows}.")
    shards: list[Shard] = []
    for path, label in input_files(source):
        kind = SUFFIXES[path.suffix]
        for start, stop, first, rows in _cuts(path, kind, shard_rows):
            shards.append(Shard(len(shards), str(path), kind, start, stop, first, rows, label))
    return shards


def _cuts(path: Path, kind: str, shard_rows: int) -> Iterator[tuple[int, int, int, int | None]]:
    if kind == "json":
        yield 0, 0, 0, None
    elif kind == "parquet":
        import pyarrow.parquet as pq

        try:
            rows = _parquet_file(pq, path).metadata.num_rows
        except OSError as exc:
            raise LoadError(f"{path} is not a Parquet file pyarrow can read: {exc}.") from None
        for start in range(0, rows, shard_rows):
            yield start, min(start + shard_rows, rows), start, min(shard_rows, rows - start)
    else:
        yield from _jsonl_cuts(path, shard_rows)


def _jsonl_cuts(path: Path, shard_rows: int) -> Iterator[tuple[int, int, int, int | None]]:
    """Byte ranges of ``shard_rows`` lines each, found by counting newlines a few megabytes at a time."""
    start = offset = lines = 0  # lines: how many the current shard has so far
    line = 1  # the number of the first line of the current shard
    last = b"\n"
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            at = 0
            while True:
                found = 0
                while found < shard_rows - lines and (newline := chunk.find(b"\n", at)) >= 0:
                    at, found = newline + 1, found + 1
                if found < shard_rows - lines:
                    lines += found
                    break
                yield start, offset + at, line, shard_rows
                start, line, lines = offset + at, line + shard_rows, 0
            offset += len(chunk)
            last = chunk[-1:]
    if offset > start:
        yield start, offset, line, lines + (last != b"\n")


def read_shard(shard: Shard) -> Iterator[tuple[str, Any, str | None]]:
    """``(row id, row, None)`` for each row, or ``(row id, its text, message)`` for a line that is not JSON."""
    if shard.kind == "jsonl":
        yield from _read_jsonl(shard)
    elif shard.kind == "json":
        yield from _read_json(shard)
    else:
        yield from _read_parquet(shard)


def _row_id(row: Any, where: str) -> str:
    given = row.get("id") if isinstance(row, dict) else None
    return str(given) if isinstance(given, (str, int)) and not isinstance(given, bool) else where


def _read_jsonl(shard: Shard) -> Iterator[tuple[str, Any, str | None]]:
    with open(shard.path, "rb") as f:
        f.seek(shard.start)
        data = f.read(shard.stop - shard.start)
    for number, raw in enumerate(data.split(b"\n"), start=shard.first):
        if not raw.strip():
            continue
        where = f"{shard.label}:{number}"
        row, error = _parse(raw, f"line {number}")
        yield (where, row, error) if error is not None else (_row_id(row, where), row, None)


def _parse(raw: bytes | str, where: str) -> tuple[Any, str | None]:
    """One row's JSON, or its text and why it cannot be read (too long, not JSON, too deep for the parser)."""
    if len(raw) > MAX_ROW_BYTES:
        size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
        if size > MAX_ROW_BYTES:
            text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
            return text, f"{where} is {size:,} bytes, over the {MAX_ROW_BYTES:,} a row may hold"
    try:
        row = json.loads(raw)
        check_row(row)  # too deep or a lone surrogate: kept as its text, which any file can hold
        return row, None
    except RowError as exc:
        error = f"{where}: {exc}"
    except ValueError as exc:
        error = f"{where} is not JSON: {exc}"
    except RecursionError:
        error = f"{where} nests too deeply to read"
    return (raw if isinstance(raw, str) else raw.decode("utf-8", "replace")), error


def _read_json(shard: Shard) -> Iterator[tuple[str, Any, str | None]]:
    try:
        text = Path(shard.path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LoadError(f"{shard.path} is not UTF-8 text (byte {exc.start}).") from None
    for index, element in enumerate(_json_elements(text, shard.path)):
        where = f"{shard.label}[{index}]"
        row, error = _parse(element, where)
        yield (where, row, error) if error is not None else (_row_id(row, where), row, None)


#: in a JSON text: a string (escapes included), or one of the characters that open, close or separate values
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')


def _json_elements(text: str, path: str) -> Iterator[str]:
    """The texts of the elements of the JSON list ``text`` (a lone object: itself), found without parsing them,
    so each is parsed and refused on its own. A text that is not a list whose brackets match is an error for
    the whole file."""
    start = len(text) - len(text.lstrip())
    if not text.startswith("[", start):
        yield text  # one row: parsed, or refused, as one
        return
    depth, begin, closed = 0, start + 1, False
    for token in _JSON_TOKENS.finditer(text, start):
        mark = token.group()
        if mark in "[{":
            depth += 1
        elif mark in "]}":
            depth -= 1
            if depth == 0:
                element = text[begin : token.start()]
                if element.strip():
                    yield element
                closed = True
                break
        elif mark == "," and depth == 1:
            yield text[begin : token.start()]
            begin = token.end()
    if not closed or text[token.end() :].strip():
        raise LoadError(f"{path} is not valid JSON: a list whose brackets do not match, or text after it.")


def _read_parquet(shard: Shard) -> Iterator[tuple[str, Any, str | None]]:
    import pyarrow.parquet as pq

    parquet = _parquet_file(pq, Path(shard.path))
    index = 0
    for group in range(parquet.metadata.num_row_groups):
        size = parquet.metadata.row_group(group).num_rows
        if index + size > shard.start and index < shard.stop:
            table = parquet.read_row_group(group)
            low, high = max(shard.start - index, 0), min(shard.stop - index, size)
            for offset, row in enumerate(table.slice(low, high - low).to_pylist()):
                yield _row_id(row, f"{shard.label}[{index + low + offset}]"), row, None
        index += size
        if index >= shard.stop:
            break


def _parquet_file(pq: Any, path: Path) -> Any:
    try:
        return pq.ParquetFile(str(path))
    except Exception as exc:  # pyarrow raises ArrowInvalid (a ValueError) or OSError by case
        raise LoadError(f"{path} is not a Parquet file pyarrow can read: {exc}.") from None
