"""Parity: the dataset output equals transformers'
apply_chat_template(tokenize=True, return_assistant_tokens_mask=True).

Every corpus conversation becomes one row, through format_dataset (the whole pipeline: reader, formatter,
writer), with the real Qwen3 and Llama-3.1 tokenizers and a {% generation %} training template, and the
Parquet output is compared row for row with transformers.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from chatcodec import ChatTemplate
from chatcodec.dataset import Formatter, Rejected, format_dataset

from ..conftest import SHARED, conversations, require_shared
from ..test_masks import TAGGERS
from ..test_tokens import _codec, _transformers

pq = pytest.importorskip("pyarrow.parquet")

TRAINING_ONLY = ("add_generation_prompt", "continue_final_message")


def corpus_rows() -> list[dict[str, Any]]:
    """One row per corpus conversation and option set, as a training row: no generation prompt."""
    rows, seen = [], set()
    for conv_id, conv in conversations().items():
        for options in conv["option_sets"]:
            kwargs = {k: v for k, v in options.items() if k not in TRAINING_ONLY}
            key = (conv_id, json.dumps(kwargs, sort_keys=True))
            if key in seen:
                continue
            seen.add(key)
            row: dict[str, Any] = {"id": f"{conv_id}{'/' + key[1] if kwargs else ''}", "messages": conv["messages"]}
            if conv["tools"]:
                row["tools"] = conv["tools"]
            if kwargs:
                row["chat_template_kwargs"] = kwargs
            rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _reference(hf: Any, row: dict[str, Any], template: str | None) -> dict[str, Any] | None:
    try:
        return dict(
            hf.apply_chat_template(
                row["messages"], tools=row.get("tools"), chat_template=template, tokenize=True, return_dict=True,
                return_assistant_tokens_mask=True, **row.get("chat_template_kwargs", {}),
            )
        )  # fmt: skip
    except Exception:
        return None


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_tagged_template_output_equals_transformers_row_for_row(name: str, tmp_path: Path) -> None:
    hf, codec = _transformers(name), _codec(name)
    source = TAGGERS[name](codec.template.source)
    template_file = tmp_path / "training.jinja"
    template_file.write_text(source, encoding="utf-8")
    rows = corpus_rows()
    summary = format_dataset(
        write_jsonl(tmp_path / "corpus.jsonl", rows), tmp_path / "out.parquet",
        tokenizer=SHARED / "tokenizers" / name, template=template_file, content_special_tokens="allow", workers=1,
    )  # fmt: skip
    out = {row["id"]: row for row in pq.read_table(tmp_path / "out.parquet").to_pylist()}
    rejects = {
        r["id"]: r for r in map(json.loads, (tmp_path / "out.rejects.jsonl").read_text(encoding="utf-8").splitlines())
    }
    assert summary.rows_in == len(rows) == len(out) + len(rejects)
    compared = 0
    for row in rows:
        theirs = _reference(hf, row, source)
        if theirs is None:  # transformers refuses it: so do we, with the template's reason
            assert rejects[row["id"]]["reason"] == "template_error", row["id"]
            continue
        if not any(theirs["assistant_masks"]):  # nothing to learn from (no assistant turn)
            assert rejects[row["id"]]["reason"] == "unsupervised", row["id"]
            continue
        ours = out[row["id"]]
        assert ours["input_ids"] == list(theirs["input_ids"]), row["id"]
        assert ours["assistant_masks"] == list(theirs["assistant_masks"]), row["id"]
        assert ours["attention_mask"] == list(theirs["attention_mask"])
        assert ours["num_tokens"] == len(ours["input_ids"])
        compared += 1
    assert compared >= (14 if name == "qwen3" else 10)


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_model_template_ids_equal_transformers(name: str, tmp_path: Path) -> None:
    """With the model's own template (masks inferred, no tags), the ids are transformers' ids."""
    hf = _transformers(name)
    rows = corpus_rows()
    fmt = Formatter(SHARED / "tokenizers" / name, content_special_tokens="allow")
    compared = 0
    for row in rows:
        result = fmt.format(row, row["id"])
        theirs = _reference(hf, row, None)
        if theirs is None or not hasattr(result, "input_ids"):
            continue
        assert result.input_ids == list(theirs["input_ids"]), row["id"]  # type: ignore[union-attr]
        compared += 1
    assert compared >= 12


def test_hugging_face_datasets_map_with_processes() -> None:
    """The Formatter is a batched function for datasets.map with num_proc, giving format()'s rows."""
    require_shared()
    datasets = pytest.importorskip("datasets")
    plain = ["multi_turn", "multi_turn_no_system", "ends_with_assistant", "korean", "indonesian", "long_20_turn"]
    rows = [{"id": i, "messages": conversations()[c]["messages"]} for i, c in enumerate(plain)]
    rows.append({"id": 99, "messages": [{"role": "user", "content": "no answer"}]})
    fmt = Formatter(SHARED / "tokenizers" / "qwen3", reasoning=False)
    mapped = datasets.Dataset.from_list(rows).map(fmt, batched=True, batch_size=3, num_proc=2)
    assert len(mapped) == len(rows)
    for row, got in zip(rows, mapped, strict=True):
        expected = fmt.format(row, str(row["id"]))
        if row["id"] == 99:
            assert got["error"].startswith("unsupervised:") and got["input_ids"] == []
            continue
        assert got["error"] is None
        assert got["input_ids"] == expected.input_ids  # type: ignore[union-attr]
        assert got["assistant_masks"] == expected.mask  # type: ignore[union-attr]
        assert got["num_tokens"] == len(got["input_ids"]) == len(got["attention_mask"])
    assert sum(len(m) for m in mapped["assistant_masks"]) > 0


WORDS = str.split("the model data token answer river city weather price market value error code paper light water")
SYSTEM = "You are a careful assistant for a travel company. Answer briefly and never invent numbers."
TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"Look up the {arg}.", "parameters": {
        "type": "object", "properties": {arg: {"type": "string", "description": f"the {arg}"}}, "required": [arg]}}}
    for name, arg in [("get_weather", "city"), ("get_price", "ticker")]
]  # fmt: skip


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) + "."


def generated_rows(count: int) -> list[dict[str, Any]]:
    """Distinct conversations with one system prompt and set of tools, as bench/bench_dataset.py makes them."""
    rows = []
    for index in range(count):
        rng = random.Random(index)
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        for turn in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": f"({index}.{turn}) {_text(rng, 3, 20)}"})
            if rng.random() < 0.3:
                function = rng.choice(TOOLS)["function"]
                argument = next(iter(function["parameters"]["properties"]))
                name = function["name"]
                call = {"type": "function", "function": {"name": name, "arguments": {argument: _text(rng, 1, 2)}}}
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                messages.append({"role": "tool", "name": name, "content": json.dumps({"r": _text(rng, 2, 6)})})
            answer: dict[str, Any] = {"role": "assistant", "content": _text(rng, 5, 40)}
            if rng.random() < 0.3:
                answer["reasoning_content"] = _text(rng, 5, 20)
            messages.append(answer)
        rows.append({"id": f"g{index}", "messages": messages, "tools": TOOLS})
    return rows


@pytest.mark.parametrize("policy", ["allow", "escape"])
@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_generated_rows_through_one_formatter_equal_transformers(name: str, policy: str, tmp_path: Path) -> None:
    """Distinct rows sharing a system prompt and tools, through one Formatter (its cache of encoded text shared
    by the rows, as in a run): transformers' ids and masks, row for row."""
    hf, codec = _transformers(name), _codec(name)
    source = TAGGERS[name](codec.template.source)
    template_file = tmp_path / "training.jinja"
    template_file.write_text(source, encoding="utf-8")
    fmt = Formatter(SHARED / "tokenizers" / name, template=template_file, content_special_tokens=policy)
    compared = 0
    for row in generated_rows(40):
        theirs = _reference(hf, row, source)
        ours = fmt.format(row, row["id"])
        if theirs is None:
            assert isinstance(ours, Rejected) and ours.reason == "template_error", row["id"]
            continue
        assert not isinstance(ours, Rejected), ours
        assert ours.input_ids == list(theirs["input_ids"]), row["id"]
        assert ours.mask == list(theirs["assistant_masks"]), row["id"]
        compared += 1
    assert compared >= 25


def test_a_tagged_template_renders_each_row_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The mask of a {% generation %} template reads the spans of the encode's own render; no row is remembered
    for a next turn (rows are one-shot)."""
    codec = _codec("qwen3")
    template_file = tmp_path / "training.jinja"
    template_file.write_text(TAGGERS["qwen3"](codec.template.source), encoding="utf-8")
    fmt = Formatter(SHARED / "tokenizers" / "qwen3", template=template_file)
    renders: list[str] = []

    def counted(method: str) -> Any:
        original = getattr(ChatTemplate, method)
        return lambda self, *args, **kwargs: (renders.append(method), original(self, *args, **kwargs))[1]

    for method in ("render", "render_spans"):
        monkeypatch.setattr(ChatTemplate, method, counted(method))
    rows = generated_rows(5)
    results = [fmt.format(row, row["id"]) for row in rows]
    assert all(not isinstance(result, Rejected) and any(result.mask) for result in results)
    assert renders == ["render_spans"] * len(rows)
    assert len(fmt.codec.history) == 0
