"""Hostile rows among good ones: the job is total over rows (each bad row is its own reject, with its reason,
and every good row is written), locally, on Ray and on the command line; and no output may be an input.

The planted rows are the classes the review found and their neighbours: nesting past what the reader takes
(in a list, in an object, in content parts, past the JSON parser's own limit), lone surrogates (in content, a
key, an id, a tool), content that is not a string, a list of parts or null, empty conversations, and rows
longer than a row may be.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatcodec import InputError
from chatcodec.dataset import format_dataset
from chatcodec.dataset.readers import MAX_ROW_BYTES

from ..cli.test_render import run
from ..conftest import SHARED, require_shared

pq = pytest.importorskip("pyarrow.parquet")

QWEN3 = SHARED / "tokenizers" / "qwen3"
GOOD_ROWS = 10_000
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def _good(index: int) -> str:
    chat = [{"role": "user", "content": f"Q{index}"}, {"role": "assistant", "content": f"A{index}"}]
    return json.dumps({"id": f"good{index}", "messages": chat})


def _row(row_id: str, content: str, extra: str = "") -> str:
    """A row whose user message has ``content`` (raw JSON text) and ``extra`` fields."""
    user = f'{{"role": "user", "content": {content}{extra}}}'
    return f'{{"id": "{row_id}", "messages": [{user}, {{"role": "assistant", "content": "ok"}}]}}'


#: each hostile line (raw JSONL text), the reason it must be rejected for, and a piece of its error
HOSTILE: list[tuple[str, str, str]] = [
    ("[" * 2000 + "]" * 2000, "bad_row", "nests too deeply"),
    ('{"id": "deep-object", "messages": ' + '{"a": ' * 2000 + "1" + "}" * 2000 + "}", "bad_row", "nests too deeply"),
    (_row("deep-content", "[" * 500 + '"x"' + "]" * 500), "bad_row", "nests deeper than 100"),
    (_row("deep-parts", '[{"type": "text", "text": "x", "x": ' + "[" * 300 + "]" * 300 + "}]"), "bad_row",
     "nests deeper than 100"),
    (_row("surrogate-content", '"\\ud800 lone"'), "bad_row", "lone surrogate (\\ud800)"),
    (_row("surrogate-key", '"x"', ', "\\udfff": 1'), "bad_row", "key holding a lone surrogate"),
    ('{"id": "\\udc80", "messages": [{"role": "user", "content": "x"}]}', "bad_row", "lone surrogate (\\udc80)"),
    ('{"id": "surrogate-tool", "tools": [{"name": "\\ud83d"}], "messages": [{"role": "user", "content": "x"}]}',
     "bad_row", "tools[0].name holds a lone surrogate"),
    (_row("int-content", "42"), "bad_row", "messages[0].content must be a string, a list of parts or null"),
    (_row("bool-content", "true"), "bad_row", "not a boolean"),
    (_row("object-content", '{"text": "x"}'), "bad_row", "not an object"),
    (_row("number-parts", "[1, 2]"), "bad_row", "content[0] must be a part"),
    ('{"id": "empty", "messages": []}', "bad_row", "an empty list; a conversation needs at least one message"),
    ('{"id": "empty-sharegpt", "conversations": []}', "bad_row", "an empty list; a conversation needs at least one"),
    ('{"id": "huge", "messages": [{"role": "user", "content": "' + "x" * (MAX_ROW_BYTES + 10) + '"}]}', "bad_row",
     f"over the {MAX_ROW_BYTES:,} a row may hold"),
]  # fmt: skip


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10,000 good rows with the hostile ones planted among them, as JSONL, and the template."""
    require_shared()
    folder = tmp_path_factory.mktemp("hostile")
    lines = [_good(index) for index in range(GOOD_ROWS)]
    for at, (line, _, _) in enumerate(HOSTILE):
        lines.insert(1 + at * (GOOD_ROWS // len(HOSTILE)), line)
    (folder / "rows.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "template.jinja").write_text(TEMPLATE, encoding="utf-8")
    return folder


def _check_run(folder: Path, out: Path, summary: Any) -> None:
    assert summary.rows_out == GOOD_ROWS and summary.rows_in == GOOD_ROWS + len(HOSTILE)
    assert pq.read_table(out).column("id").to_pylist() == [f"good{i}" for i in range(GOOD_ROWS)]
    rejects = out.with_name(out.name.removesuffix(".parquet") + ".rejects.jsonl").read_bytes()
    records = [json.loads(line) for line in rejects.decode("utf-8").splitlines()]  # valid UTF-8, every line
    assert len(records) == len(HOSTILE)
    for record, (line, reason, message) in zip(records, HOSTILE, strict=True):
        assert record["reason"] == reason, record["error"]
        assert message in record["error"], record["error"]
        kept = record["row"]  # the row itself, or its text when it cannot be held as a row
        assert kept == line or json.dumps(kept) == json.dumps(json.loads(line)), record["id"]


def test_hostile_rows_are_rejects_and_every_good_row_is_kept(hostile: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    summary = format_dataset(hostile / "rows.jsonl", out, tokenizer=QWEN3, template=hostile / "template.jinja",
                             workers=1, shard_rows=2048)  # fmt: skip
    _check_run(hostile, out, summary)


def test_on_the_command_line_the_run_exits_1(hostile: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli.parquet"
    code, stdout, stderr = run(["dataset", str(hostile / "rows.jsonl"), "--tokenizer", str(QWEN3), "-t",
                                str(hostile / "template.jinja"), "-o", str(out), "--workers", "1"])  # fmt: skip
    assert code == 1, stderr
    assert stdout.decode().startswith(f"rows: {GOOD_ROWS + len(HOSTILE)} in, {GOOD_ROWS} out, {len(HOSTILE)} rejected")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def test_on_ray_too(local_ray: None, hostile: Path, tmp_path: Path) -> None:
    out = tmp_path / "ray.parquet"
    summary = format_dataset(hostile / "rows.jsonl", out, tokenizer=QWEN3, template=hostile / "template.jinja",
                             engine="ray", shard_rows=2048)  # fmt: skip
    _check_run(hostile, out, summary)


def test_a_json_file_is_read_element_by_element(tmp_path: Path) -> None:
    require_shared()
    good = [json.loads(_good(i)) for i in range(3)]
    text = "[" + ", ".join([json.dumps(good[0]), "[" * 3000 + "]" * 3000, json.dumps(good[1]),
                            '{"id": "s", "messages": [{"role": "user", "content": "\\ud800"}]}', json.dumps(good[2]),
                            '{"id": "n", "messages": [{"role": "user", "content": 7}]}']) + "]"  # fmt: skip
    (tmp_path / "rows.json").write_text(text, encoding="utf-8")
    summary = format_dataset(tmp_path / "rows.json", tmp_path / "out.parquet", tokenizer=QWEN3, workers=1)
    assert pq.read_table(tmp_path / "out.parquet").column("id").to_pylist() == ["good0", "good1", "good2"]
    records = [json.loads(line) for line in (tmp_path / "out.rejects.jsonl").read_text("utf-8").splitlines()]
    assert [(r["id"], r["reason"]) for r in records] == [("rows.json[1]", "bad_row"), ("rows.json[3]", "bad_row"),
                                                         ("n", "bad_row")]  # fmt: skip
    assert "nests too deeply" in records[0]["error"] and "lone surrogate" in records[1]["error"]
    assert summary.rows_in == 6 and summary.rows_out == 3
    (tmp_path / "broken.json").write_text('[{"id": 1}, {"id": ', encoding="utf-8")
    with pytest.raises(Exception, match="brackets do not match"):
        format_dataset(tmp_path / "broken.json", tmp_path / "b.parquet", tokenizer=QWEN3, workers=1)


# --- outputs that are inputs --------------------------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def small(tmp_path: Path) -> Path:
    require_shared()
    (tmp_path / "in.jsonl").write_text("".join(_good(i) + "\n" for i in range(3)), encoding="utf-8")
    (tmp_path / "t.jinja").write_text(TEMPLATE, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("flags", "named", "victim"),
    [
        (["-o", "{in}"], "-o", "in.jsonl"),
        (["-o", "{dir}/out.parquet", "--rejects", "{in}"], "--rejects", "in.jsonl"),
        (["-o", "{dir}/out.parquet", "--report", "{in}"], "--report", "in.jsonl"),
        (["-o", "{dir}/out.parquet", "--report", "{dir}/t.jinja", "-t", "{dir}/t.jinja"], "--report", "t.jinja"),
        (["-o", "{dir}/out.parquet", "--rejects", "{dir}/link.jsonl"], "--rejects", "in.jsonl"),
        (["-o", "{dir}/out.parquet", "--rejects", "{dir}/out.parquet"], "--rejects", None),
        (["-o", "{dir}/out.parquet", "--report", "{dir}/out.rejects.jsonl"], "--report", None),
    ],
)
def test_an_output_that_is_an_input_is_refused_before_anything_is_written(
    small: Path, flags: list[str], named: str, victim: str | None
) -> None:
    (small / "link.jsonl").symlink_to(small / "in.jsonl")
    before = {p.name: _digest(p) for p in small.iterdir() if p.is_file()}
    argv = [f.format(dir=small, **{"in": small / "in.jsonl"}) for f in flags]
    code, stdout, stderr = run(["dataset", str(small / "in.jsonl"), "--tokenizer", str(QWEN3), *argv])
    assert code == 2 and stdout == b"", stderr
    assert stderr.count("\n") == 1 and stderr.startswith(f"chatcodec: error: {named} "), stderr
    assert "writing it would destroy" in stderr and (victim is None or victim in stderr), stderr
    assert {p.name: _digest(p) for p in small.iterdir() if p.is_file()} == before  # nothing made, nothing changed


def test_the_tokenizer_files_are_inputs_too(tmp_path: Path) -> None:
    require_shared()
    (tmp_path / "in.jsonl").write_text(_good(0) + "\n", encoding="utf-8")
    before = _digest(QWEN3 / "tokenizer.json")
    with pytest.raises(InputError, match=r"tokenizer's tokenizer\.json"):
        format_dataset(tmp_path / "in.jsonl", tmp_path / "o.parquet", tokenizer=QWEN3,
                       rejects=QWEN3 / "tokenizer.json")  # fmt: skip
    assert _digest(QWEN3 / "tokenizer.json") == before and not (tmp_path / "o.parquet").exists()


def test_in_the_library_rejects_over_the_input_is_refused(small: Path) -> None:
    before = _digest(small / "in.jsonl")
    with pytest.raises(InputError, match=r"^rejects .* is the input"):
        format_dataset(small / "in.jsonl", small / "o.parquet", tokenizer=QWEN3, rejects=small / "in.jsonl")
    assert _digest(small / "in.jsonl") == before


def test_stats_takes_no_output(small: Path) -> None:
    out = small / "o.parquet"
    format_dataset(small / "in.jsonl", out, tokenizer=QWEN3, workers=1)
    code, stdout, stderr = run(["dataset", "stats", str(out)])
    assert (code, stderr) == (0, "") and stdout.decode().startswith("rows: 3 in, 3 out")
    code, _, stderr = run(["dataset", "stats"])
    assert code == 2 and "dataset stats needs the formatted file" in stderr and "-o" not in stderr
    code, _, stderr = run(["dataset", "stats", str(out), "-o", str(small / "x.parquet")])
    assert code == 2 and "writes nothing" in stderr
