"""``chatcodec dataset``: a summary and an exit code that tells whether rows were rejected; `stats`; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import SHARED, require_shared
from .test_render import run

pq = pytest.importorskip("pyarrow.parquet")

GOOD = {"id": "ok", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
BAD = {"id": "bad", "messages": [{"role": "robot", "content": "Hi"}]}


def _write(path: Path, *rows: dict[str, object]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_a_clean_run_exits_0_and_prints_the_summary(tmp_path: Path) -> None:
    require_shared()
    source = _write(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "out.parquet"
    code, stdout, stderr = run(
        ["dataset", source, "--tokenizer", str(SHARED / "tokenizers" / "qwen3"), "-o", str(out), "--labels",
         "--var", "enable_thinking=false", "--report", str(tmp_path / "r.html")]
    )  # fmt: skip
    assert (code, stderr) == (0, "")
    assert stdout.decode().startswith("rows: 1 in, 1 out, 0 rejected, 0 truncated\ntokens: ")
    row = pq.read_table(out).to_pylist()[0]
    assert row["id"] == "ok" and -100 in row["labels"] and (tmp_path / "r.html").is_file()
    code, stdout, _ = run(["dataset", "stats", str(out)])
    assert code == 0 and stdout.decode().startswith("rows: 1 in, 1 out, 0 rejected")
    code, stdout, _ = run(["dataset", "stats", str(out), "--json"])
    assert json.loads(stdout)["rows_out"] == 1


def test_rejected_rows_exit_1_with_their_reasons(tmp_path: Path) -> None:
    require_shared()
    source = _write(tmp_path / "in.jsonl", GOOD, BAD)
    out = tmp_path / "out.parquet"
    code, stdout, _ = run(
        ["dataset", source, "--tokenizer", str(SHARED / "tokenizers" / "qwen3" / "tokenizer.json"), "-o", str(out),
         "--json", "--pack", "64", "--workers", "2", "--shard-rows", "1"]
    )  # fmt: skip
    summary = json.loads(stdout)
    assert code == 1 and summary["rejected"] == {"bad_row": 1} and summary["rows_out"] == 1
    assert "reasons" in summary and summary["sequences"] == 1
    reject = json.loads((tmp_path / "out.rejects.jsonl").read_text(encoding="utf-8"))
    assert reject["id"] == "bad" and "robot" in reject["error"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "needs -o OUT.parquet"),
        (["-o", "x.parquet", "--tokenizer", "/nonexistent"], "nonexistent"),
        (["-o", "x.parquet", "--tokenizer", "TOKENIZER", "--overlong", "cut"], "invalid choice: 'cut'"),
        (["-o", "x.parquet", "--tokenizer", "TOKENIZER", "--workers", "0"], "positive whole number"),
        (["-o", "x.parquet", "--tokenizer", "TOKENIZER", "--var", "x={bad"], "--var"),
        (["-o", "x.parquet", "--tokenizer", "TOKENIZER", "--max-length", "9", "--pack", "8"], "pack length"),
        (["-o", "x.parquet"], "needs --tokenizer"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(tmp_path: Path, extra: list[str], message: str) -> None:
    require_shared()
    source = _write(tmp_path / "in.jsonl", GOOD)
    extra = [str(SHARED / "tokenizers" / "qwen3") if a == "TOKENIZER" else a for a in extra]
    extra = [str(tmp_path / a) if a == "x.parquet" else a for a in extra]
    code, stdout, stderr = run(["dataset", source, *extra])
    assert code == 2 and stdout == b""
    assert stderr.count("\n") == 1 and stderr.startswith("chatcodec: error: ") and message in stderr, stderr


def test_stats_of_a_file_that_is_not_a_dataset(tmp_path: Path) -> None:
    (tmp_path / "x.parquet").write_text("no", encoding="utf-8")
    code, _, stderr = run(["dataset", "stats", str(tmp_path / "x.parquet")])
    assert code == 2 and "not a Parquet file" in stderr and stderr.count("\n") == 1
    code, _, stderr = run(["dataset", "stats", str(tmp_path / "missing.parquet")])
    assert code == 2 and stderr.count("\n") == 1
