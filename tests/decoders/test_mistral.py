"""Mistral tool calls in every tokenizer version chatcodec can meet, checked against mistral-common itself.

``data/mistral_common.jsonl`` holds the tool-call turns mistral-common's tokenizers encode (v2 and v3
on SentencePiece, v3 on Tekken, v7, v11, v13) and ``data/mistral_templates/`` the chat template it
generates for each version; ``make_mistral_vectors.py`` writes both. Each version's template is
detected as a Mistral format of the catalog, renders the tokenizer's turn byte for byte, and its
decoder reads the turn back, whole and streamed from any split point, to the same calls.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from chatcodec import load_template
from chatcodec.decoders import decoder, decoder_for, detect

from .helpers import as_streamed, rebuild

DATA = Path(__file__).parent / "data"
VECTORS = [json.loads(line) for line in (DATA / "mistral_common.jsonl").read_text(encoding="utf-8").splitlines()]
#: the catalog format each version's template is detected as (each Mistral format reads every shape)
DETECTED = {
    "v2": "mistral_pre_v11",
    "v3": "mistral_pre_v11",
    "v3-tekken": "mistral_pre_v11",
    "v7": "mistral_pre_v11",
    "v11": "mistral_v13",  # [TOOL_CALLS]f[CALL_ID]id[ARGS]{...}: llama.cpp's and vLLM's name for it
    "v13": "mistral_v11",  # [TOOL_CALLS]f[ARGS]{...}
}


def test_every_version_is_covered() -> None:
    assert sorted({v["version"] for v in VECTORS}) == sorted(DETECTED)
    assert sorted(p.stem for p in (DATA / "mistral_templates").glob("*.jinja")) == sorted(DETECTED)


@pytest.mark.parametrize("version", sorted(DETECTED))
def test_version(version: str) -> None:
    template = load_template(DATA / "mistral_templates" / f"{version}.jinja")
    found = detect(template)
    assert (found.how, found.format) == ("catalog", DETECTED[version]), found
    d = decoder_for(template)
    for vector in (v for v in VECTORS if v["version"] == version):
        text, calls = vector["text"], vector["calls"]
        rendered = template.render(
            [
                {"role": "user", "content": "What is the weather?"},
                {"role": "assistant", "tool_calls": [tool_call(c, k) for k, c in enumerate(calls)]},
            ]
        )
        assert rendered.endswith("[/INST]" + text), (rendered, text)  # the template writes what the tokenizer does
        message = d.decode(text)
        assert [(c.name, c.arguments) for c in message.tool_calls] == [(c["name"], c["arguments"]) for c in calls]
        assert (message.content, message.invalid_tool_calls) == (None, ()), text  # </s> is markup
        for call, want in zip(message.tool_calls, calls, strict=True):
            if f"[CALL_ID]{want.get('id')}" in text:  # written before the arguments: the model's id is kept
                assert call.id == want["id"]
            else:  # written after them (v3, v7) or not at all: a fresh id in the form Mistral templates take
                assert re.fullmatch(r"[A-Za-z0-9]{9}", call.id), call.id
        whole = as_streamed(message, text)
        for cut in range(len(text) + 1):  # streamed, split anywhere: the same message, names whole
            stream = d.stream()
            assert rebuild(stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish(), text) == whole, cut
        stream = d.stream()  # and one character at a time
        assert rebuild([x for ch in text for x in stream.feed(ch)] + stream.finish(), text) == whole


def tool_call(call: dict[str, Any], k: int) -> dict[str, Any]:
    call_id = call.get("id", f"call{k:05d}")  # every template from v3 on wants nine alphanumerics
    return {"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}


@pytest.mark.parametrize("name", ["mistral_v2", "mistral_v3", "mistral_v7"])
def test_version_names(name: str) -> None:
    """mistral-common's version names choose the format of that version."""
    for vector in VECTORS:
        message = decoder(name, stop_markers=("</s>",)).decode(vector["text"])
        assert [(c.name, c.arguments) for c in message.tool_calls] == [
            (c["name"], c["arguments"]) for c in vector["calls"]
        ]
