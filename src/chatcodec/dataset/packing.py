"""Packing rows into sequences of a fixed capacity, best-fit decreasing, for padding-free attention.

The longest row goes first; each row goes into the open sequence it fills best (the one with the least
room that still fits it), or starts a new one. Packed sequences are not padded: ``position_ids`` restart
at 0 for every row in them and ``seq_lengths`` gives the rows' lengths, which is what padding-free
attention needs to keep rows from seeing each other (as TRL's ``padding_free`` does).

>>> best_fit_decreasing([5, 3, 8, 2, 4], 10)
[[2, 3], [0, 4], [1]]
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

from ..exceptions import InputError

__all__ = ["Packed", "best_fit_decreasing", "pack"]


class Packed(NamedTuple):
    """One packed sequence: the ids of its rows, their tokens and masks end to end, and the boundaries."""

    ids: list[str]
    input_ids: list[int]
    mask: list[int]
    position_ids: list[int]
    seq_lengths: list[int]


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins of at most ``capacity``, in the order the bins were opened."""
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, bin), sorted: the best fit is the first with enough room
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        if length > capacity:
            raise InputError(f"A row of {length} tokens cannot be packed into sequences of {capacity}.")
        at = bisect.bisect_left(free, (length, -1))
        if at < len(free):
            room, target = free.pop(at)
            bins[target].append(index)
        else:
            room, target = capacity, len(bins)
            bins.append([index])
        if room - length > 0:
            bisect.insort(free, (room - length, target))
    return bins


def pack(ids: Sequence[str], input_ids: Sequence[list[int]], masks: Sequence[list[int]], capacity: int) -> list[Packed]:
    """Pack rows (their ids, tokens and masks) into sequences of at most ``capacity`` tokens.

    >>> [p.position_ids for p in pack(["a", "b"], [[1, 2], [3]], [[0, 1], [1]], 4)]
    [[0, 1, 0]]
    """
    sequences = []
    for members in best_fit_decreasing([len(row) for row in input_ids], capacity):
        sequences.append(
            Packed(
                [ids[i] for i in members],
                [token for i in members for token in input_ids[i]],
                [bit for i in members for bit in masks[i]],
                [position for i in members for position in range(len(input_ids[i]))],
                [len(input_ids[i]) for i in members],
            )
        )
    return sequences
