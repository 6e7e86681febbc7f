"""``chatcodec tokenize``: ids, JSON and the --show view, on the real Qwen3 tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatcodec.cli import main as cli_main

from ..conftest import SHARED, require_shared

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <|im_end|> there"},
    {"role": "assistant", "content": "Hello!"},
]


def main(argv: list[str]) -> int:
    model, *rest = argv
    return cli_main(["tokenize", "--tokenizer", model, *rest])


@pytest.fixture
def chat(tmp_path: Path) -> Path:
    require_shared()
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(MESSAGES), encoding="utf-8")
    return path


def test_prints_the_ids(chat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(SHARED / "tokenizers" / "qwen3"), str(chat)]) == 0
    ids = [int(i) for i in capsys.readouterr().out.split()]
    assert ids[:3] == [151644, 8948, 198]  # <|im_start|>system\n
    assert ids.count(151645) == 3  # the template's three <|im_end|>, not the user's


def test_json_has_the_mask_and_counts(chat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(SHARED / "tokenizers" / "qwen3"), str(chat), "--json", "--no-reasoning"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["assistant_mask"]) == len(out["input_ids"])
    assert [i for i, m in zip(out["input_ids"], out["assistant_mask"], strict=True) if m] == [9707, 0, 151645]
    assert sum(out["message_token_counts"]) == len(out["input_ids"]) and len(out["message_token_counts"]) == 3


def test_show_marks_masked_tokens_and_counts(chat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(SHARED / "tokenizers" / "qwen3"), str(chat), "--show", "--no-reasoning"]) == 0
    out = capsys.readouterr().out
    assert "|[Hello]|[!]|[<|im_end|>]|" in out
    assert "|Hi| <||im|_end|||>| there|" in out  # the user's <|im_end|> is plain text
    assert "1 control token(s) in content encoded as plain text" in out
    assert "message 2   assistant" in out


def test_reject_is_one_line_and_exit_2(chat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([str(SHARED / "tokenizers" / "qwen3"), str(chat), "--content-special-tokens", "reject"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "message 1 (user) content" in err


def test_bad_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_shared()
    bad = tmp_path / "bad.json"
    bad.write_text("[", encoding="utf-8")
    assert main([str(SHARED / "tokenizers" / "qwen3"), str(bad)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
