"""Shared data and helpers for the decoder tests.

The parse vectors and the template corpus live in ``shared/`` next to the checkout (the directory
that contains the checkout holds ``shared/``). Tests that need them skip, saying why, when it is
absent; nothing is copied into the repository.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chatcodec.decoders import AssistantMessage, Delta

CHECKOUT = Path(__file__).resolve().parents[2]
SHARED = CHECKOUT.parent / "shared"
VECTORS_FILE = SHARED / "parse-vectors.jsonl"


def load_vectors() -> list[dict[str, Any]]:
    """Every parse vector, in file order (the index is the line number from 0); [] if absent."""
    if not VECTORS_FILE.is_file():
        return []
    with VECTORS_FILE.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


VECTORS = load_vectors()


def need_vectors() -> None:
    if not VECTORS:
        pytest.skip(f"the shared parse vectors are not available at {VECTORS_FILE}")


def vector_params() -> list[Any]:
    """One pytest param per vector, ``id`` = ``<index>-<format>``; a skipping stand-in if absent."""
    if not VECTORS:
        return [pytest.param(None, None, id="no-shared-vectors")]
    return [pytest.param(i, v, id=f"{i:03d}-{v['format']}") for i, v in enumerate(VECTORS)]


@dataclass
class Streamed:
    """What a client rebuilds from the deltas alone."""

    content: str | None
    reasoning_content: str | None
    calls: list[tuple[str, str | None, str]]  # (name, id, arguments)


def rebuild(deltas: list[Delta]) -> Streamed:
    """Accumulate deltas the way an OpenAI client does, checking the contract on the way.

    - a call's first delta carries its name; the name never comes twice and is never changed;
    - an id comes at most once;
    - call indices are 0, 1, 2 ... in order of first appearance.
    """
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        set_fields = [
            delta.content is not None,
            delta.reasoning_content is not None,
            delta.tool_call is not None,
        ]
        assert sum(set_fields) == 1, f"a delta must set exactly one field: {delta}"
        if delta.content is not None:
            assert delta.content, "empty content delta"
            content.append(delta.content)
        elif delta.reasoning_content is not None:
            assert delta.reasoning_content, "empty reasoning delta"
            reasoning.append(delta.reasoning_content)
        else:
            tc = delta.tool_call
            assert tc is not None
            if tc.index not in calls:
                assert tc.index == len(calls), f"call index {tc.index} out of order"
                assert tc.name is not None, "a call's first delta must carry its name"
                calls[tc.index] = {"name": tc.name, "id": tc.id, "args": []}
            else:
                assert tc.name is None, f"call {tc.index}: name sent twice"
                if tc.id is not None:
                    assert calls[tc.index]["id"] is None, f"call {tc.index}: id sent twice"
                    calls[tc.index]["id"] = tc.id
            calls[tc.index]["args"].append(tc.arguments)
    return Streamed(
        "".join(content) or None,
        "".join(reasoning) or None,
        [(c["name"], c["id"], "".join(c["args"])) for _, c in sorted(calls.items())],
    )


def as_streamed(message: AssistantMessage) -> Streamed:
    return Streamed(
        message.content,
        message.reasoning_content,
        [(c.name, c.id, c.arguments_json) for c in message.tool_calls],
    )
