"""One shard's work, the same in every engine: read its rows, format them, pack them, count them.

The result is a :class:`ShardResult`: an Arrow table of the output rows, the rejects (each with the
row it came from) and the shard's :class:`Summary`. A shard is the unit a worker retries: its result
exists whole or not at all, so a retried shard can neither lose nor repeat a row.
"""

from __future__ import annotations

import json
import sys
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .formatting import Formatted, Formatter, Rejected, labels
from .packing import pack
from .readers import Shard, read_shard
from .summary import Summary

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ShardResult", "output_schema", "run_shard"]

#: how many formatted rows each shard offers as samples for the report
SAMPLES = 2


@dataclass
class ShardResult:
    index: int
    table: pa.Table
    #: one JSON line each: ``{"id", "reason", "error", "row"}``
    rejects: list[str]
    summary: Summary
    samples: list[Formatted] = field(default_factory=list)


def output_schema(*, labels: bool, packed: bool) -> pa.Schema:
    """The columns of the output file."""
    import pyarrow as pa

    ids = pa.list_(pa.int32())
    bits = pa.list_(pa.int8())
    fields = [
        ("id", pa.list_(pa.string()) if packed else pa.string()),
        ("input_ids", ids),
        ("attention_mask", bits),
        ("labels", ids) if labels else ("assistant_masks", bits),
        ("num_tokens", pa.int32()),
    ]
    if packed:
        fields += [("position_ids", ids), ("seq_lengths", ids)]
    return pa.schema(fields)


def run_shard(shard: Shard, formatter: Formatter, pack_length: int | None = None) -> ShardResult:
    """Read, format and (if ``pack_length``) pack one shard."""
    summary = Summary(pack_length=pack_length or 0)
    with_labels = formatter.options.labels
    schema = output_schema(labels=with_labels, packed=pack_length is not None)
    # unpacked rows go straight into flat C arrays, column by column: no list per row outlives its row (a
    # shard's lists made the garbage collector's full passes longer and longer), and the Arrow columns are
    # these arrays' buffers
    columns = _Columns(with_labels) if pack_length is None and _NATIVE_ARROW else None
    rows: list[Formatted] = []
    rejects: list[str] = []
    for row_id, row, error in read_shard(shard):
        summary.rows_in += 1
        result = formatter.format(row, row_id) if error is None else Rejected(row_id, "bad_row", error)
        if isinstance(result, Rejected):
            summary.rejected[result.reason] += 1
            rejects.append(reject_line(result, row))
            continue
        summary.add_row(len(result.input_ids), sum(result.mask), truncated=result.truncated)
        if columns is None or len(rows) < SAMPLES:
            rows.append(result)
        if columns is not None:
            columns.add(result)
    if columns is not None:
        return ShardResult(shard.index, columns.table(schema), rejects, summary, rows[:SAMPLES])
    if pack_length is None:
        lists: dict[str, Any] = {
            "id": [row.id for row in rows],
            "input_ids": [row.input_ids for row in rows],
            "masks": [row.mask for row in rows],
        }
    else:
        sequences = pack([r.id for r in rows], [r.input_ids for r in rows], [r.mask for r in rows], pack_length)
        summary.sequences = len(sequences)
        lists = {
            "id": [s.ids for s in sequences],
            "input_ids": [s.input_ids for s in sequences],
            "masks": [s.mask for s in sequences],
            "position_ids": [s.position_ids for s in sequences],
            "seq_lengths": [s.seq_lengths for s in sequences],
        }
    return ShardResult(shard.index, _table(schema, lists, with_labels), rejects, summary, rows[:SAMPLES])


def reject_line(rejected: Rejected, row: Any) -> str:
    """The rejects file's line for a row: ``{"id", "reason", "error", "row"}`` as JSON, whatever the row holds.

    UTF-8 where it can be; a row with a lone surrogate is written with ``\\u`` escapes (kept exactly, and
    valid UTF-8). A row too deep to write is not here: the reader keeps such a row as its text.
    """
    record = {"id": rejected.id, "reason": rejected.reason, "error": rejected.message, "row": row}
    line = json.dumps(record, ensure_ascii=False, default=str)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(json.loads(line), ensure_ascii=True)
    return line


class _Columns:
    """The output columns of unpacked rows, as flat arrays of 32-bit ids (and labels) and 8-bit masks with
    their offsets."""

    def __init__(self, with_labels: bool) -> None:
        self.with_labels = with_labels
        self.ids: list[str] = []
        self.tokens = array("i")
        self.labels = array("i")
        self.masks = bytearray()
        self.offsets = array("i", [0])
        self.lengths = array("i")

    def add(self, row: Formatted) -> None:
        # fromlist and bytearray.extend take a list at C speed (array.extend goes item by item: 2-4x slower)
        self.ids.append(row.id)
        self.tokens.fromlist(row.input_ids)
        if self.with_labels:
            self.labels.fromlist(labels(row.input_ids, row.mask))
        else:
            self.masks.extend(row.mask)  # 0 and 1: bytes
        self.lengths.append(len(row.input_ids))
        self.offsets.append(len(self.tokens))

    def table(self, schema: pa.Schema) -> pa.Table:
        import pyarrow as pa

        count, total = len(self.lengths), len(self.tokens)
        offsets = _buffer_array(pa.int32(), count + 1, self.offsets)
        names = [name.encode("utf-8") for name in self.ids]
        name_offsets = array("i", [0])
        for name in names:
            name_offsets.append(name_offsets[-1] + len(name))
        arrays = [
            pa.Array.from_buffers(
                pa.string(), count, [None, pa.py_buffer(name_offsets), pa.py_buffer(b"".join(names))]
            ),
            pa.ListArray.from_arrays(offsets, _buffer_array(pa.int32(), total, self.tokens)),
            pa.ListArray.from_arrays(offsets, _buffer_array(pa.int8(), total, b"\x01" * total)),
            pa.ListArray.from_arrays(
                offsets,
                _buffer_array(pa.int32(), total, self.labels)
                if self.with_labels
                else _buffer_array(pa.int8(), total, self.masks),
            ),
            _buffer_array(pa.int32(), count, self.lengths),
        ]
        return pa.Table.from_arrays(arrays, schema=schema)


def _buffer_array(kind: pa.DataType, length: int, values: Any) -> pa.Array:
    """An Arrow array of fixed-width values over a buffer (``pa.array`` of a Python list imports pandas)."""
    import pyarrow as pa

    return pa.Array.from_buffers(kind, length, [None, pa.py_buffer(values)])


#: 32-bit C ints, little-endian: a C array's bytes are an Arrow int32 buffer
_NATIVE_ARROW = array("i").itemsize == 4 and sys.byteorder == "little"


def _table(schema: pa.Schema, columns: dict[str, Any], with_labels: bool) -> pa.Table:
    import pyarrow as pa

    ids = columns["input_ids"]
    arrays: dict[str, Any] = {"id": pa.array(columns["id"], schema.field("id").type)}
    offsets = _offsets(ids)
    flat = [t for row in ids for t in row]
    flat_ids = pa.array(flat, pa.int32())
    arrays["input_ids"] = pa.ListArray.from_arrays(offsets, flat_ids)
    arrays["attention_mask"] = pa.ListArray.from_arrays(offsets, pa.array([1] * len(flat_ids), pa.int8()))
    flat_mask = [b for row in columns["masks"] for b in row]
    if with_labels:
        flat_labels = labels(flat, flat_mask)
        arrays["labels"] = pa.ListArray.from_arrays(offsets, pa.array(flat_labels, pa.int32()))
    else:
        arrays["assistant_masks"] = pa.ListArray.from_arrays(offsets, pa.array(flat_mask, pa.int8()))
    arrays["num_tokens"] = pa.array([len(row) for row in ids], pa.int32())
    for name in ("position_ids", "seq_lengths"):
        if name in columns:
            arrays[name] = pa.array(columns[name], pa.list_(pa.int32()))
    return pa.Table.from_pydict(arrays, schema=schema)


def _offsets(rows: list[list[int]]) -> Any:
    import pyarrow as pa

    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + len(row))
    return pa.array(offsets, pa.int32())
