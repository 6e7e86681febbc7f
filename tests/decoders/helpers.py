"""Shared data and helpers for the decoder tests.

The parse vectors and the template corpus live in ``shared/`` next to the checkout (the directory
that contains the checkout holds ``shared/``). Tests that need them skip, saying why, when it is
absent; nothing is copied into the repository.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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


def vector_options(vector: dict[str, Any]) -> dict[str, Any]:
    """The decoder options a vector states; ``template`` names the source's model template, which
    is documentation here (most are not templates chatcodec ships), so it is left out."""
    return {k: v for k, v in vector.get("options", {}).items() if k != "template"}


def vector_params() -> list[Any]:
    """One pytest param per vector, ``id`` = ``<index>-<format>``; a skipping stand-in if absent."""
    if not VECTORS:
        return [pytest.param(None, None, id="no-shared-vectors")]
    return [pytest.param(i, v, id=f"{i:03d}-{v['format']}") for i, v in enumerate(VECTORS)]


@dataclass
class Streamed:
    """What a client rebuilds from the deltas alone.

    Ids the model wrote are kept; an id the decoder made (fresh for every stream) is ``None``, so
    two decodes of one text compare equal. An id is the model's when it appears in ``source``.
    """

    content: str | None
    reasoning_content: str | None
    calls: list[tuple[str, str | None, str]]  # (name, id, arguments), every call announced
    invalid: list[int] = field(default_factory=list)  # the indices of the calls that turned out invalid


def _model_id(call_id: str, source: str) -> str | None:
    return call_id if call_id and call_id in source else None


def rebuild(deltas: list[Delta], source: str = "") -> Streamed:
    """Accumulate deltas the way an OpenAI client does, checking the contract on the way.

    - a call's first delta carries its name and its id; neither ever comes again;
    - call indices are 0, 1, 2 ... in order of first appearance;
    - the deltas naming invalid calls come last, once per call, for calls that were announced.
    """
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    invalid: list[int] = []
    for delta in deltas:
        if invalid:
            assert delta.tool_call is not None and delta.tool_call.error, f"{delta} after an invalid-call delta"
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
            if tc.error is not None:
                assert tc.index in calls and tc.index not in invalid and tc.error
                assert tc.id is not None and _model_id(tc.id, source) == calls[tc.index]["id"]
                invalid.append(tc.index)
                continue
            if tc.index not in calls:
                assert tc.index == len(calls), f"call index {tc.index} out of order"
                assert tc.name is not None, "a call's first delta must carry its name"
                assert tc.id, "a call's first delta must carry its id"
                calls[tc.index] = {"name": tc.name, "id": _model_id(tc.id, source), "args": []}
            else:
                assert tc.name is None, f"call {tc.index}: name sent twice"
                assert tc.id is None, f"call {tc.index}: id sent twice"
            calls[tc.index]["args"].append(tc.arguments)
    return Streamed(
        "".join(content) or None,
        "".join(reasoning) or None,
        [(c["name"], c["id"], "".join(c["args"])) for _, c in sorted(calls.items())],
        invalid,
    )


def as_streamed(message: AssistantMessage, source: str = "") -> Streamed:
    calls = sorted((*message.tool_calls, *message.invalid_tool_calls), key=lambda c: c.index)
    assert [c.index for c in calls] == list(range(len(calls)))
    return Streamed(
        message.content,
        message.reasoning_content,
        [(c.name, _model_id(c.id, source), c.arguments_json) for c in calls],
        [c.index for c in message.invalid_tool_calls],
    )
