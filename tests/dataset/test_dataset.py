"""format_dataset end to end: input forms and files, planted bad rows, options, packing, engines, report, stats."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from chatcodec import InputError, LoadError
from chatcodec.dataset import REASONS, Formatter, best_fit_decreasing, format_dataset, read_summary

from ..conftest import SHARED, conversations, require_shared
from .test_parity import write_jsonl

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

#: a small chatml template that raises on a late system message and hides the content "hidden"
TEMPLATE = (
    "{%- for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be first') }}{% endif %}<|im_start|>{{ m.role }}\n"
    "{% if m.content != 'hidden' %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
)


def _chat(user: str, assistant: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


GOOD: list[dict[str, Any]] = [
    {"id": "openai", "messages": _chat("What is 2+2?", "4")},
    {"id": "sharegpt", "system": "Be brief.", "conversations": [
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]},
    {"id": "pair", "prompt": "Capital of France?", "completion": "Paris."},
    {"id": "pair-chat", "prompt": [{"role": "user", "content": "Ping"}], "completion": [
        {"role": "assistant", "content": "Pong"}]},
    {"id": "long-ok", "messages": _chat("word " * 10, "fine")},
]  # fmt: skip

#: each planted bad row, the reason it must be rejected for, and a piece of its message
BAD: list[tuple[dict[str, Any] | str, str, str]] = [
    ({"id": "bad-role", "messages": [{"role": "wizard", "content": "Hi"}]}, "bad_row", "role 'wizard'"),
    ({"id": "bad-speaker", "conversations": [{"from": "robot", "value": "Hi"}]}, "bad_row", "from 'robot'"),
    ({"id": "no-fields", "text": "just text"}, "bad_row", "none of messages, conversations or prompt/completion"),
    ("this line is not JSON", "bad_row", "is not JSON"),
    ({"id": "late-system", "messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "s"},
                                        {"role": "assistant", "content": "y"}]}, "template_error", "must be first"),
    ({"id": "too-long", "messages": _chat("word " * 80, "ok")}, "too_long", "over max_length=48"),
    ({"id": "injected", "messages": _chat("x<|im_start|>system", "y")}, "control_token", "'<|im_start|>'"),
    ({"id": "no-answer", "messages": [{"role": "user", "content": "Hello?"}]}, "unsupervised", "no assistant turn"),
    ({"id": "hidden", "messages": _chat("x", "hidden")}, "mask_error", "no token of them could be found"),
]  # fmt: skip


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The good rows with every kind of bad row between them, as JSONL."""
    folder = tmp_path_factory.mktemp("planted")
    lines = []
    for index, row in enumerate(GOOD):
        lines.append(json.dumps(row))
        bad = BAD[index * 2 : index * 2 + 2]
        lines += [b if isinstance(b, str) else json.dumps(b) for b, _, _ in bad]
    (folder / "planted.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "template.jinja").write_text(TEMPLATE, encoding="utf-8")
    return folder


def _run(folder: Path, out: Path, **options: Any) -> Any:
    options.setdefault("workers", 1)
    return format_dataset(
        folder / "planted.jsonl", out, tokenizer=SHARED / "tokenizers" / "qwen3", template=folder / "template.jinja",
        content_special_tokens="reject", max_length=48, **options,
    )  # fmt: skip


def _rejects(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_planted_bad_rows_go_to_the_rejects_and_every_good_row_is_kept(planted: Path, tmp_path: Path) -> None:
    require_shared()
    summary = _run(planted, tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("id").to_pylist() == [row["id"] for row in GOOD]  # all of them, in input order
    rejects = _rejects(tmp_path / "out.rejects.jsonl")
    assert [r["reason"] for r in rejects] == [reason for _, reason, _ in BAD]
    for record, (row, _, message) in zip(rejects, BAD, strict=True):
        assert message in record["error"], record
        assert record["row"] == row  # the row itself, to fix and run again
        if isinstance(row, dict):
            assert record["id"] == row["id"]
    assert rejects[3]["id"] == "planted.jsonl:6"  # a row without an id is named by its line
    assert set(r["reason"] for r in rejects) == set(REASONS) - {"error"}  # every kind a row can cause
    assert summary.rows_in == len(GOOD) + len(BAD) and summary.rows_out == len(GOOD)
    assert dict(summary.rejected) == {"bad_row": 4, "template_error": 1, "too_long": 1, "control_token": 1,
                                      "unsupervised": 1, "mask_error": 1}  # fmt: skip
    assert read_summary(tmp_path / "out.parquet") == summary


def test_truncate_and_keep(planted: Path, tmp_path: Path) -> None:
    require_shared()
    cut = _run(planted, tmp_path / "cut.parquet", overlong="truncate")
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "cut.parquet").to_pylist()}
    assert "too-long" not in rows and cut.truncated == 0  # cut before the answer: nothing left to learn
    record = next(r for r in _rejects(tmp_path / "cut.rejects.jsonl") if r["id"] == "too-long")
    assert record["reason"] == "too_long" and "no supervised token is left" in record["error"]
    kept = _run(planted, tmp_path / "keep.parquet", overlong="keep")
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "keep.parquet").to_pylist()}
    assert rows["too-long"]["num_tokens"] > 48 and kept.truncated == 0


def test_truncation_keeps_the_start(tmp_path: Path) -> None:
    require_shared()
    rows = [{"id": "a", "messages": _chat("Hi", "word " * 60)}]
    summary = format_dataset(
        write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.parquet", tokenizer=SHARED / "tokenizers" / "qwen3",
        max_length=30, overlong="truncate", workers=1,
    )  # fmt: skip
    whole = Formatter(SHARED / "tokenizers" / "qwen3").format(rows[0], "a")
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()[0]
    assert summary.truncated == 1 and out["num_tokens"] == 30
    assert out["input_ids"] == whole.input_ids[:30] and out["assistant_masks"] == whole.mask[:30]  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["json", "parquet", "folder"])
def test_every_input_kind_gives_the_same_rows(planted: Path, tmp_path: Path, kind: str) -> None:
    require_shared()
    baseline = tmp_path / "jsonl.parquet"
    _run(planted, baseline)
    rows = [json.loads(line) for line in (planted / "planted.jsonl").read_text().splitlines() if line.startswith("{")]
    good = [r for r in rows if r["id"] in {g["id"] for g in GOOD}]
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "template.jinja").write_text(TEMPLATE, encoding="utf-8")
    if kind == "json":
        (folder / "planted.jsonl").write_text("", encoding="utf-8")  # _run reads this name: keep it empty
        source = folder / "rows.json"
        source.write_text(json.dumps(good), encoding="utf-8")
    elif kind == "parquet":
        source = folder / "rows.parquet"
        pq.write_table(pa.Table.from_pylist([{"id": r["id"], "payload": json.dumps(r)} for r in good]), source)
        pq.write_table(pa.Table.from_pylist([r for r in good if "messages" in r]), folder / "openai.parquet")
    else:
        source = folder / "parts"
        (source / "b").mkdir(parents=True)
        write_jsonl(source / "a.jsonl", good[:2])
        write_jsonl(source / "b" / "c.jsonl", good[2:])
        (source / "notes.txt").write_text("not data", encoding="utf-8")  # other files are left alone
    expected = {r["id"]: r for r in pq.read_table(baseline).to_pylist()}
    if kind == "parquet":
        source = folder / "openai.parquet"  # Parquet rows: messages as a list of structs
        good = [r for r in good if "messages" in r]
    common = dict(tokenizer=SHARED / "tokenizers" / "qwen3", template=folder / "template.jinja", workers=1)
    summary = format_dataset(source, tmp_path / "out.parquet", **common)  # type: ignore[arg-type]
    got = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["id"] for r in got] == [r["id"] for r in good] and summary.rejected_total == 0
    for row in got:
        assert row["input_ids"] == expected[row["id"]]["input_ids"]
        assert row["assistant_masks"] == expected[row["id"]]["assistant_masks"]


def test_rows_without_ids_are_named_by_place(tmp_path: Path) -> None:
    require_shared()
    rows = [{"messages": _chat("a", "b")}, {"messages": _chat("c", "d")}]
    (tmp_path / "rows.json").write_text(json.dumps(rows), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    for name in ("rows.json", "rows.parquet"):
        format_dataset(tmp_path / name, tmp_path / "out.parquet", tokenizer=SHARED / "tokenizers" / "qwen3", workers=1)
        assert pq.read_table(tmp_path / "out.parquet").column("id").to_pylist() == [f"{name}[0]", f"{name}[1]"]


def test_supervision_options_on_qwen3(tmp_path: Path) -> None:
    require_shared()
    reasoning = conversations()["reasoning_final_turn"]["messages"]
    multi = conversations()["multi_turn"]["messages"]
    rows = [{"id": "think", "messages": reasoning}, {"id": "multi", "messages": multi}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    codec_dir = SHARED / "tokenizers" / "qwen3"
    fmt = Formatter(codec_dir)

    def masked(out: Path, row_id: str, column: str = "assistant_masks") -> str:
        row = next(r for r in pq.read_table(out).to_pylist() if r["id"] == row_id)
        keep = [
            t for t, m in zip(row["input_ids"], row[column], strict=True) if (m != -100 if column == "labels" else m)
        ]
        return fmt.codec.decode(keep)

    format_dataset(source, tmp_path / "all.parquet", tokenizer=codec_dir, workers=1)
    format_dataset(
        source, tmp_path / "plain.parquet", tokenizer=codec_dir, reasoning=False, end_of_turn=False, workers=1
    )
    format_dataset(source, tmp_path / "last.parquet", tokenizer=codec_dir, last_turn_only=True, labels=True, workers=1)
    thought = reasoning[-1]["reasoning_content"].strip()
    answer = reasoning[-1]["content"].strip()
    assert masked(tmp_path / "all.parquet", "think") == f"<think>\n{thought}\n</think>\n\n{answer}<|im_end|>"
    assert masked(tmp_path / "plain.parquet", "think") == answer
    answers = [m["content"] for m in multi if m["role"] == "assistant"]
    assert masked(tmp_path / "plain.parquet", "multi") == "".join(answers)
    assert len(answers) > 1
    assert masked(tmp_path / "last.parquet", "multi", "labels").endswith(answers[-1] + "<|im_end|>")
    assert answers[0] not in masked(tmp_path / "last.parquet", "multi", "labels")
    assert "assistant_masks" not in pq.read_schema(tmp_path / "last.parquet").names


def test_escape_is_the_default(tmp_path: Path) -> None:
    require_shared()
    rows = [{"id": "x", "messages": _chat("x<|im_end|>y", "ok")}]
    format_dataset(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "o.parquet",
                   tokenizer=SHARED / "tokenizers" / "qwen3", workers=1)  # fmt: skip
    ids = pq.read_table(tmp_path / "o.parquet").to_pylist()[0]["input_ids"]
    assert ids.count(151645) == 2  # <|im_end|>: the template's two, not the user's


# --- packing -----------------------------------------------------------------------------------------


def test_best_fit_decreasing_fills_the_tightest_bin() -> None:
    assert best_fit_decreasing([6, 5, 4, 3, 2], 10) == [[0, 2], [1, 3, 4]]  # 6+4 and 5+3+2: no room wasted
    assert best_fit_decreasing([7, 7, 7], 10) == [[0], [1], [2]]
    with pytest.raises(InputError, match="cannot be packed"):
        best_fit_decreasing([11], 10)


def test_packed_output_holds_every_row_once_with_positions(tmp_path: Path) -> None:
    require_shared()
    rows = [{"id": f"r{i}", "messages": _chat("question " * (i % 7 + 1), "answer " * (i % 5 + 1))} for i in range(60)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    tokenizer = SHARED / "tokenizers" / "qwen3"
    format_dataset(source, tmp_path / "rows.parquet", tokenizer=tokenizer, workers=1, shard_rows=25)
    summary = format_dataset(source, tmp_path / "packed.parquet", tokenizer=tokenizer, pack=128, workers=1,
                             shard_rows=25)  # fmt: skip
    single = {r["id"]: r for r in pq.read_table(tmp_path / "rows.parquet").to_pylist()}
    packed = pq.read_table(tmp_path / "packed.parquet").to_pylist()
    assert sorted(i for seq in packed for i in seq["id"]) == sorted(single)  # each row exactly once
    for seq in packed:
        assert seq["num_tokens"] == len(seq["input_ids"]) == sum(seq["seq_lengths"]) <= 128
        at = 0
        for row_id, length in zip(seq["id"], seq["seq_lengths"], strict=True):
            assert seq["input_ids"][at : at + length] == single[row_id]["input_ids"]
            assert seq["assistant_masks"][at : at + length] == single[row_id]["assistant_masks"]
            assert seq["position_ids"][at : at + length] == list(range(length))
            at += length
    assert summary.sequences == len(packed)
    assert summary.packing_efficiency == sum(s["num_tokens"] for s in packed) / (128 * len(packed))
    # best-fit decreasing reaches the fewest sequences possible in each shard of 25 rows here
    lengths = [single[f"r{i}"]["num_tokens"] for i in range(60)]
    assert summary.sequences == sum(-(-sum(lengths[at : at + 25]) // 128) for at in range(0, 60, 25))
    assert "packing:" in summary.text()


def test_pack_limits_the_row_length(tmp_path: Path) -> None:
    require_shared()
    rows = [{"id": "big", "messages": _chat("word " * 200, "ok")}, {"id": "small", "messages": _chat("a", "b")}]
    summary = format_dataset(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "o.parquet",
                             tokenizer=SHARED / "tokenizers" / "qwen3", pack=64, workers=1)  # fmt: skip
    assert dict(summary.rejected) == {"too_long": 1} and summary.rows_out == 1
    with pytest.raises(InputError, match="cannot exceed the pack length"):
        format_dataset(tmp_path / "in.jsonl", tmp_path / "o.parquet", tokenizer=SHARED / "tokenizers" / "qwen3",
                       pack=64, max_length=100)  # fmt: skip


def test_flat_columns_equal_the_row_lists(planted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unpacked rows are written from flat C arrays: the same table as Arrow's conversion of the row lists,
    with masks and with labels, rejects among the rows, ids beyond ASCII and a shard with no row left."""
    require_shared()
    import chatcodec.dataset.shards as shards

    rows = [
        {"id": f"r{i}-\u00e9\u4e2d", "messages": _chat(f"question {i} " * (i + 1), f"answer {i}")} for i in range(7)
    ]
    lines = [json.dumps(row) for row in rows[:3]] + ["not JSON"] + [json.dumps(row) for row in rows[3:]]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n\n\nnot JSON either\n", encoding="utf-8")
    qwen3 = SHARED / "tokenizers" / "qwen3"
    for options in ({}, {"labels": True}):
        flat = format_dataset(tmp_path / "in.jsonl", tmp_path / "flat.parquet", tokenizer=qwen3, workers=1,
                              shard_rows=4, **options)  # fmt: skip
        with monkeypatch.context() as patch:
            patch.setattr(shards, "_NATIVE_ARROW", False)
            lists = format_dataset(tmp_path / "in.jsonl", tmp_path / "lists.parquet", tokenizer=qwen3, workers=1,
                                   shard_rows=4, **options)  # fmt: skip
        assert flat == lists and flat.rows_out == 7 and flat.rejected == {"bad_row": 2}
        table = pq.read_table(tmp_path / "flat.parquet")
        assert table.equals(pq.read_table(tmp_path / "lists.parquet"))
        assert table.column("id").to_pylist() == [row["id"] for row in rows]
        assert [len(ids) for ids in table.column("input_ids").to_pylist()] == table.column("num_tokens").to_pylist()


def test_unpacked_output_does_not_import_pandas(planted: Path, tmp_path: Path) -> None:
    """pyarrow's conversion of Python lists imports pandas (a third of a second in each worker); the flat
    columns are Arrow buffers, which do not."""
    require_shared()
    import subprocess

    qwen3 = SHARED / "tokenizers" / "qwen3"
    code = (
        "import sys; from chatcodec.dataset import format_dataset;"
        f"format_dataset({str(planted)!r}, {str(tmp_path / 'o.parquet')!r}, tokenizer={str(qwen3)!r},"
        f" template={str(planted / 'template.jinja')!r}, workers=1);"
        "print('pandas' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-1] == "False"
    # without max_length the over-long row passes, and the injected control token is escaped
    assert pq.read_table(tmp_path / "o.parquet").num_rows == len(GOOD) + 2


# --- engines, progress, report, errors ---------------------------------------------------------------


def test_two_workers_give_the_one_worker_output(planted: Path, tmp_path: Path) -> None:
    require_shared()
    one = _run(planted, tmp_path / "one.parquet", shard_rows=3)
    two = _run(planted, tmp_path / "two.parquet", shard_rows=3, workers=2)
    assert pq.read_table(tmp_path / "one.parquet").equals(pq.read_table(tmp_path / "two.parquet"))
    assert _rejects(tmp_path / "one.rejects.jsonl") == _rejects(tmp_path / "two.rejects.jsonl")
    assert one == two


def test_with_workers_only_they_load_the_codec(planted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers load the codec; this process checks the templates, and loads it for a report only."""
    require_shared()
    import chatcodec.dataset.formatting as formatting

    loads: list[str] = []
    load = formatting.load
    monkeypatch.setattr(formatting, "load", lambda source: (loads.append(str(source)), load(source))[1])
    _run(planted, tmp_path / "two.parquet", shard_rows=3, workers=2)
    assert loads == []
    _run(planted, tmp_path / "two.parquet", shard_rows=3, workers=2, report=tmp_path / "report.html")
    assert len(loads) == 1
    _run(planted, tmp_path / "one.parquet", shard_rows=3, workers=1)
    assert len(loads) == 2
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    (no_tokenizer / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    with pytest.raises(LoadError, match=r"no tokenizer\.json"):
        format_dataset(planted, tmp_path / "o.parquet", tokenizer=no_tokenizer, shard_rows=3, workers=2)
    with pytest.raises(LoadError, match="No chat template"):
        format_dataset(planted, tmp_path / "o.parquet", tokenizer=SHARED / "tokenizers" / "qwen3",
                       template=tmp_path / "missing.jinja", shard_rows=3, workers=2)  # fmt: skip


def test_progress_is_quiet_off_a_terminal_and_live_when_asked(
    planted: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    require_shared()
    _run(planted, tmp_path / "quiet.parquet")
    assert capfd.readouterr().err == ""
    _run(planted, tmp_path / "bar.parquet", progress=True)
    err = capfd.readouterr().err
    assert "rows/s" in err and "tokens/s" in err and f"{len(GOOD) + len(BAD)}/{len(GOOD) + len(BAD)}" in err


def test_report_is_self_contained(planted: Path, tmp_path: Path) -> None:
    require_shared()
    _run(planted, tmp_path / "out.parquet", report=tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<svg" in page and "<rect" in page  # the histogram
    assert page.count("<div class='tokens'>") == 2 and "<span class=s>" in page  # two samples, masks shown
    for reason in ("template_error", "control_token", "too_long", "mask_error"):
        assert reason in page
    assert "supervised tokens" in page and "truncated" in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert "<script" not in page and "<link" not in page


def test_stats_without_the_run_summary_counts_the_columns(planted: Path, tmp_path: Path) -> None:
    require_shared()
    summary = _run(planted, tmp_path / "out.parquet")
    bare = pq.read_table(tmp_path / "out.parquet").replace_schema_metadata(None)
    pq.write_table(bare, tmp_path / "bare.parquet")
    counted = read_summary(tmp_path / "bare.parquet")
    assert (counted.rows_out, counted.tokens, counted.supervised_tokens) == (
        summary.rows_out, summary.tokens, summary.supervised_tokens,
    )  # fmt: skip
    assert counted.lengths == summary.lengths


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    require_shared()
    tokenizer = SHARED / "tokenizers" / "qwen3"
    source = write_jsonl(tmp_path / "in.jsonl", GOOD)
    empty = tmp_path / "empty"
    empty.mkdir()
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"source": tmp_path / "missing.jsonl"}, LoadError, "No dataset at"),
        ({"source": empty}, InputError, "holds no .jsonl"),
        ({"overlong": "cut"}, InputError, "overlong must be one of"),
        ({"max_length": 0}, InputError, "max_length must be a positive"),
        ({"engine": "spark"}, InputError, "engine must be one of"),
        ({"pack": -1}, InputError, "pack must be a positive"),
        ({"reasonning": False}, InputError, "Unknown dataset option 'reasonning'"),
        ({"tokenizer": tmp_path}, LoadError, "tokenizer"),
        ({"workers": 0}, InputError, "workers must be at least 1"),
        ({"text_template": "no-such-template", "workers": 1}, LoadError, "no-such-template"),
        ({"text_template": "no-such-template", "workers": 2}, LoadError, "no-such-template"),
    ]
    for arguments, error, message in cases:
        call: dict[str, Any] = {"source": source, "output": tmp_path / "o.parquet", "tokenizer": tokenizer}
        call.update(arguments)
        with pytest.raises(error, match=message):
            format_dataset(call.pop("source"), call.pop("output"), **call)
    (tmp_path / "broken.parquet").write_text("nope", encoding="utf-8")
    with pytest.raises(LoadError, match="not a Parquet file"):
        format_dataset(tmp_path / "broken.parquet", tmp_path / "o.parquet", tokenizer=tokenizer)


def test_polyfill_formats_rows_the_template_refuses(tmp_path: Path) -> None:
    require_shared()
    template = tmp_path / "no_system.jinja"
    template.write_text(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
        encoding="utf-8",
    )
    rows = [{"id": "sys", "messages": [{"role": "system", "content": "Be brief."}, *_chat("Hi", "Hello")]}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    common: dict[str, Any] = {"tokenizer": SHARED / "tokenizers" / "qwen3", "template": template, "workers": 1}
    exact = format_dataset(source, tmp_path / "exact.parquet", **common)
    assert dict(exact.rejected) == {"template_error": 1}
    filled = format_dataset(source, tmp_path / "filled.parquet", polyfill="auto", **common)
    row = pq.read_table(tmp_path / "filled.parquet").to_pylist()[0]
    codec = Formatter(SHARED / "tokenizers" / "qwen3").codec
    assert filled.rows_out == 1
    assert codec.decode(row["input_ids"]).startswith("<|im_start|>user\nBe brief.\n\nHi<|im_end|>")
    assert codec.decode([t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]) == (
        "Hello<|im_end|>"
    )
    with pytest.raises(InputError, match="Unknown polyfill 'nope'"):
        format_dataset(source, tmp_path / "x.parquet", polyfill={"nope"}, **common)


def test_without_pyarrow_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # what a missing package looks like to import
    with pytest.raises(InputError, match=r"pip install 'chatcodec\[dataset\]'"):
        format_dataset(tmp_path / "in.jsonl", tmp_path / "o.parquet", tokenizer=SHARED / "tokenizers" / "qwen3")
    with pytest.raises(InputError, match="pyarrow"):
        read_summary(tmp_path / "o.parquet")


def test_rows_kept_as_text_are_read_back_with_their_template(tmp_path: Path) -> None:
    """A dataset of Llama 3 prompts, formatted for Qwen3: each text is read back into its messages with
    text_template and formatted as those messages are; a text another template wrote is a bad_row reject."""
    require_shared()
    from chatcodec import load_template

    llama3 = load_template("llama3")
    chats = [_chat(f"Question {i}?", f"Answer {i}.") for i in range(3)]
    rows: list[dict[str, Any]] = [{"id": f"t{i}", "text": llama3.render(chat)} for i, chat in enumerate(chats)]
    rows[1]["text"] = load_template("chatml").render(chats[1])
    tokenizer = SHARED / "tokenizers" / "qwen3"
    summary = format_dataset(
        write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.parquet", tokenizer=tokenizer,
        text_template="llama3", workers=1,
    )  # fmt: skip
    out = {row["id"]: row for row in pq.read_table(tmp_path / "out.parquet").to_pylist()}
    assert sorted(out) == ["t0", "t2"] and summary.rejected == {"bad_row": 1}
    fmt = Formatter(tokenizer)
    for key, chat in (("t0", chats[0]), ("t2", chats[2])):
        expected = fmt.format({"messages": chat}, key)
        assert out[key]["input_ids"] == expected.input_ids and out[key]["assistant_masks"] == expected.mask  # type: ignore[union-attr]
    rejects = [json.loads(line) for line in (tmp_path / "out.rejects.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in rejects] == ["t1"]
    assert "does not start as template 'llama3'" in json.dumps(rejects[0])
