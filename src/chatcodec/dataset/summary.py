"""What a run did: rows in, out, rejected by reason and truncated, tokens and their lengths, packing.

A :class:`Summary` is small whatever the dataset's size: token lengths are counted in fixed
logarithmic bins (four per doubling), not kept. Engines make one per shard and add them up; the
output file keeps the final one in its metadata, where ``chatcodec dataset stats`` reads it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import InputError

__all__ = ["SUMMARY_KEY", "Summary", "bin_bounds", "length_bin", "require_pyarrow"]

#: the output file's metadata key holding the run's summary (JSON)
SUMMARY_KEY = b"chatcodec.summary"

_PER_DOUBLING = 4


def require_pyarrow() -> None:
    """Raise a clear error when pyarrow, which reads and writes Parquet, is not installed."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise InputError("Formatting datasets needs pyarrow: pip install 'chatcodec[dataset]'.") from None


def length_bin(length: int) -> int:
    """The histogram bin of a token length: four bins per doubling.

    >>> [length_bin(n) for n in (1, 2, 3, 1000, 1024)]
    [0, 4, 6, 39, 40]
    """
    return math.floor(_PER_DOUBLING * math.log2(max(length, 1)) + 1e-9)


def bin_bounds(index: int) -> tuple[int, int]:
    """The token lengths ``[low, high)`` a bin holds.

    >>> bin_bounds(40), bin_bounds(41)
    ((1024, 1218), (1218, 1449))
    """
    low = math.ceil(2 ** (index / _PER_DOUBLING) - 1e-9)
    high = math.ceil(2 ** ((index + 1) / _PER_DOUBLING) - 1e-9)
    return low, max(high, low + 1)


@dataclass
class Summary:
    """Counts of one run, or of one shard of it; ``+`` adds two."""

    rows_in: int = 0
    rows_out: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    truncated: int = 0
    tokens: int = 0
    supervised_tokens: int = 0
    shortest: int | None = None
    longest: int | None = None
    #: length bin -> rows (see :func:`length_bin`)
    lengths: Counter[int] = field(default_factory=Counter)
    #: packing: how many sequences, and their capacity (0 when not packed)
    sequences: int = 0
    pack_length: int = 0

    def add_row(self, length: int, supervised: int, *, truncated: bool) -> None:
        """Count one formatted row."""
        self.rows_out += 1
        self.tokens += length
        self.supervised_tokens += supervised
        self.truncated += truncated
        self.shortest = length if self.shortest is None else min(self.shortest, length)
        self.longest = length if self.longest is None else max(self.longest, length)
        self.lengths[length_bin(length)] += 1

    def __add__(self, other: Summary) -> Summary:
        low = [v for v in (self.shortest, other.shortest) if v is not None]
        high = [v for v in (self.longest, other.longest) if v is not None]
        return Summary(
            self.rows_in + other.rows_in,
            self.rows_out + other.rows_out,
            self.rejected + other.rejected,
            self.truncated + other.truncated,
            self.tokens + other.tokens,
            self.supervised_tokens + other.supervised_tokens,
            min(low) if low else None,
            max(high) if high else None,
            self.lengths + other.lengths,
            self.sequences + other.sequences,
            self.pack_length or other.pack_length,
        )

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def supervised_share(self) -> float:
        """The share of output tokens the model is trained on."""
        return self.supervised_tokens / self.tokens if self.tokens else 0.0

    @property
    def packing_efficiency(self) -> float | None:
        """Tokens over the room the packed sequences had; None when not packed."""
        if not self.sequences:
            return None
        return self.tokens / (self.sequences * self.pack_length)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (what the output file's metadata holds)."""
        return {
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "rejected": dict(sorted(self.rejected.items())),
            "truncated": self.truncated,
            "tokens": self.tokens,
            "supervised_tokens": self.supervised_tokens,
            "shortest": self.shortest,
            "longest": self.longest,
            "lengths": {str(k): v for k, v in sorted(self.lengths.items())},
            "sequences": self.sequences,
            "pack_length": self.pack_length,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        return cls(
            data["rows_in"],
            data["rows_out"],
            Counter(data["rejected"]),
            data["truncated"],
            data["tokens"],
            data["supervised_tokens"],
            data["shortest"],
            data["longest"],
            Counter({int(k): v for k, v in data["lengths"].items()}),
            data["sequences"],
            data["pack_length"],
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def text(self) -> str:
        """The summary for a person, as ``chatcodec dataset`` prints it.

        >>> s = Summary(rows_in=3)
        >>> s.add_row(10, 4, truncated=False); s.add_row(30, 6, truncated=True); s.rejected["bad_row"] += 1
        >>> print(s.text())
        rows: 3 in, 2 out, 1 rejected (bad_row 1), 1 truncated
        tokens: 40 (10 to 30 per row, mean 20.0), supervised 10 (25.0%)
        """
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items()))
        lines = [
            f"rows: {self.rows_in} in, {self.rows_out} out, {self.rejected_total} rejected"
            + (f" ({reasons})" if reasons else "")
            + f", {self.truncated} truncated"
        ]
        if self.rows_out:
            mean = self.tokens / self.rows_out
            lines.append(
                f"tokens: {self.tokens} ({self.shortest} to {self.longest} per row, mean {mean:.1f}),"
                f" supervised {self.supervised_tokens} ({100 * self.supervised_share:.1f}%)"
            )
        efficiency = self.packing_efficiency
        if efficiency is not None:
            lines.append(
                f"packing: {self.sequences} sequences of up to {self.pack_length} tokens, {100 * efficiency:.1f}% full"
            )
        return "\n".join(lines)
