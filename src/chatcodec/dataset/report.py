"""The run's report: one self-contained HTML page (no script, no network), and ``stats`` of an output file.

The page has the summary (rows in and out, rejects by reason, truncation, the supervised share of
tokens, packing), the histogram of token lengths and two sample rows drawn token by token, the
supervised tokens highlighted.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..exceptions import InputError, LoadError
from .formatting import REASONS, Formatted
from .summary import SUMMARY_KEY, Summary, bin_bounds, require_pyarrow

if TYPE_CHECKING:
    from ..tokens import Codec

__all__ = ["read_summary", "render_report", "write_report"]

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
table { border-collapse: collapse; } td, th { padding: 0.2em 0.8em; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.tokens { font: 13px/1.9 ui-monospace, monospace; white-space: pre-wrap; border: 1px solid #ccc; padding: 0.6em; }
.tokens span { border-right: 1px solid #e4e4e4; }
.tokens .s { background: #c8f0c8; }
.legend .s { background: #c8f0c8; padding: 0 0.4em; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
"""


def render_report(summary: Summary, samples: Sequence[Formatted], codec: Codec, *, title: str = "") -> str:
    """The report page as a string."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>chatcodec dataset report {html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>Dataset report</h1><p>{html.escape(title)}</p>",
        "<h2>Summary</h2>",
        _summary_table(summary),
        "<h2>Token lengths</h2>",
        _histogram(summary),
        "<h2>Sample rows</h2>",
        "<p class='legend'>Each token is a box; <span class='s'>supervised</span> tokens are the ones the"
        " model learns to produce.</p>",
    ]
    for sample in samples:
        parts.append(
            f"<h3>{html.escape(sample.id)} ({len(sample.input_ids)} tokens, {sum(sample.mask)} supervised)</h3>"
        )
        parts.append(_tokens(sample, codec))
    if not samples:
        parts.append("<p>No row was formatted.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    path: str | Path, summary: Summary, samples: Sequence[Formatted], codec: Codec, *, title: str = ""
) -> None:
    """Write :func:`render_report` to ``path``."""
    try:
        Path(path).write_text(render_report(summary, samples, codec, title=title), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"Cannot write the report to {path}: {exc.strerror or exc}.") from None


def _summary_table(summary: Summary) -> str:
    rows = [
        ("rows in", f"{summary.rows_in:,}"),
        ("rows out", f"{summary.rows_out:,}"),
        ("rejected", f"{summary.rejected_total:,}"),
    ]
    rows += [
        (f"&nbsp;&nbsp;{html.escape(k)}: {html.escape(REASONS.get(k, ''))}", f"{v:,}")
        for k, v in sorted(summary.rejected.items())
    ]
    rows += [
        ("truncated", f"{summary.truncated:,}"),
        ("tokens", f"{summary.tokens:,}"),
        ("supervised tokens", f"{summary.supervised_tokens:,} ({100 * summary.supervised_share:.1f}%)"),
    ]
    if summary.rows_out:
        rows.append(
            (
                "tokens per row",
                f"{summary.shortest:,} to {summary.longest:,}, mean {summary.tokens / summary.rows_out:,.1f}",
            )
        )
    efficiency = summary.packing_efficiency
    if efficiency is not None:
        rows.append(("packed sequences", f"{summary.sequences:,} of up to {summary.pack_length:,} tokens"))
        rows.append(("packing efficiency", f"{100 * efficiency:.1f}%"))
    body = "".join(f"<tr><th>{k}</th><td class='n'>{v}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _histogram(summary: Summary) -> str:
    if not summary.lengths:
        return "<p>No row.</p>"
    first, last = min(summary.lengths), max(summary.lengths)
    bins = list(range(first, last + 1))
    peak = max(summary.lengths.values())
    width, height, bar = 640, 180, max(4, min(40, 600 // len(bins)))
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + 40}' role='img'>"]
    for position, index in enumerate(bins):
        count = summary.lengths.get(index, 0)
        low, high = bin_bounds(index)
        tall = round(height * count / peak)
        x = 30 + position * bar
        out.append(
            f"<rect x='{x}' y='{height - tall}' width='{bar - 1}' height='{tall}' fill='#4a7fc1'>"
            f"<title>{low}-{high - 1} tokens: {count:,} rows</title></rect>"
        )
        if position % max(1, len(bins) // 8) == 0:
            out.append(f"<text x='{x}' y='{height + 14}'>{low}</text>")
    out.append(f"<text x='30' y='{height + 32}'>tokens per row (log scale); bar height: rows, peak {peak:,}</text>")
    out.append("</svg>")
    return "".join(out)


def _tokens(sample: Formatted, codec: Codec) -> str:
    spans = []
    for token, supervised in zip(sample.input_ids, sample.mask, strict=True):
        text = codec.decode([token]).replace("\n", "\u21b5\n")
        spans.append(f"<span{' class=s' if supervised else ''}>{html.escape(text)}</span>")
    return f"<div class='tokens'>{''.join(spans)}</div>"


def read_summary(path: str | Path) -> Summary:
    """The summary of an output file: the run's own, kept in its metadata, or counted from its columns."""
    require_pyarrow()
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(str(path))
    except Exception as exc:  # pyarrow raises OSError or ArrowInvalid by case
        raise LoadError(f"{path} is not a Parquet file pyarrow can read: {exc}.") from None
    metadata = parquet.metadata.metadata or {}
    if SUMMARY_KEY in metadata:
        return Summary.from_dict(json.loads(metadata[SUMMARY_KEY]))
    names = parquet.schema_arrow.names
    mask = "assistant_masks" if "assistant_masks" in names else "labels" if "labels" in names else None
    if "input_ids" not in names or mask is None:
        raise LoadError(f"{path} has no input_ids and assistant_masks or labels: it is not a formatted dataset.")
    summary = Summary()
    for batch in parquet.iter_batches(columns=["input_ids", mask]):
        for ids, bits in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
            supervised = (
                sum(1 for b in bits if b == 1) if mask == "assistant_masks" else sum(1 for b in bits if b != -100)
            )
            summary.rows_in += 1
            summary.add_row(len(ids), supervised, truncated=False)
    return summary
