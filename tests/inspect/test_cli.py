"""The commands: chatcodec inspect, lint, diff and show, run in-process."""

from __future__ import annotations

import json
from pathlib import Path

import chatcodec
from chatcodec import load_template

from ..cli.test_render import run
from ..conftest import CORPUS, require_shared
from .conftest import QWEN3_TOKENIZER
from .test_lint import CLEAN

GEMMA2 = str(CORPUS / "templates" / "google-gemma-2-2b-it.jinja")
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Capital of France? <|im_end|>"},
    {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy."},
    {"role": "user", "content": "Thanks"},
]


def test_inspect_prints_the_report() -> None:
    code, out, err = run(["inspect", "qwen3"])
    assert code == 0, err
    text = out.decode()
    assert "  output format   hermes" in text and "  prefix stable   no" in text
    assert "history reasoning dropped: the reasoning of message 2 (assistant)" in text
    assert "give --tokenizer to measure it" in text


def test_inspect_json_with_a_model_folder_measures_tokens() -> None:
    require_shared()
    code, out, err = run(["inspect", str(QWEN3_TOKENIZER), "--json"])
    assert code == 0, err
    body = json.loads(out)
    assert body["capabilities"] == chatcodec.load(QWEN3_TOKENIZER).template.capabilities.to_dict()
    assert body["prefix_stable"]["stable"] is False
    assert body["token_overhead"]["per_role"]["user"] == 5  # <|im_start|> user \n ... <|im_end|> \n
    assert body["output_format"]["format"] == "hermes"


def test_lint_exit_codes(tmp_path: Path) -> None:
    require_shared()
    clean = tmp_path / "clean.jinja"
    clean.write_text(CLEAN, encoding="utf-8")
    code, out, _ = run(["lint", str(clean)])
    assert (code, out.decode()) == (0, "no findings\n")
    code, out, _ = run(["lint", GEMMA2])
    assert code == 1
    assert f"{GEMMA2}:1: error: a system message makes the template raise: 'System role not supported'" in out.decode()
    code, _, _ = run(["lint", "chatml"])
    assert code == 0  # warnings only
    code, _, _ = run(["lint", "chatml", "--strict"])
    assert code == 1
    code, out, _ = run(["lint", "chatml", "--strict", "--ignore", "special-token-injection,drops-tool-calls"])
    assert code == 0 and out.decode() == "no findings\n"


def test_lint_github_annotations() -> None:
    require_shared()
    code, out, _ = run(["lint", "--format", "github", GEMMA2])
    assert code == 1
    lines = out.decode().splitlines()
    assert lines[0].startswith(f"::error file={GEMMA2},line=1,title=raises-on-role::a system message")
    assert all(line.startswith(("::error ", "::warning ", "::notice ")) for line in lines)


def test_lint_json_and_a_bad_template() -> None:
    code, out, _ = run(["lint", "qwen3", "--format", "json"])
    body = json.loads(out)
    assert code == 0 and body["template"] == "qwen3"
    assert "not-prefix-stable" in {f["code"] for f in body["findings"]}
    code, out, err = run(["lint", "no-such-template"])
    assert code == 2 and out == b"" and err.count("\n") == 1


def test_diff_qwen3_thinking_on_and_off() -> None:
    code, out, err = run(
        ["diff", "qwen3", "qwen3", "--a-var", "enable_thinking=true", "--b-var", "enable_thinking=false"]
    )
    assert code == 1, err
    text = out.decode()
    assert "--- a: qwen3 (enable_thinking=true)\n+++ b: qwen3 (enable_thinking=false)\n" in text
    assert " <|im_start|>assistant\n+<think>\n+\n+</think>\n+\n" in text
    assert text.endswith("3 of 4 conversations differ\n")
    code, out, _ = run(["diff", "qwen3", "qwen3"])
    assert code == 0 and out.decode().endswith("0 of 4 conversations differ\n")


def test_diff_against_formatted_samples_finds_the_planted_mismatch(tmp_path: Path) -> None:
    qwen3 = load_template("qwen3")
    rows = []
    for index in range(4):
        messages = [
            {"role": "user", "content": f"Question {index}"},
            {"role": "assistant", "content": f"Answer {index}"},
        ]
        rows.append({"messages": messages, "text": qwen3.render(messages)})
    samples = tmp_path / "train.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, out, err = run(["diff", "qwen3", str(samples)])
    assert (code, out.decode()) == (0, "0 of 4 samples differ\n"), err
    rows[2]["text"] = rows[2]["text"].replace("<think>\n\n</think>\n\n", "")  # formatted without the empty think
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, out, _ = run(["diff", "qwen3", str(samples)])
    text = out.decode()
    assert code == 1
    assert text.startswith(f"== {samples} line 3: differs from what qwen3 renders\n")
    assert "-<think>\n-\n-</think>\n-\n" in text and text.endswith("1 of 4 samples differ (line 3)\n")


def test_diff_reads_samples_kept_as_text_alone(tmp_path: Path) -> None:
    """A dataset of rendered texts: each is read back with the template; one another template wrote differs."""
    qwen3, chatml = load_template("qwen3"), load_template("chatml")
    chats = [
        [{"role": "user", "content": f"Question {i}"}, {"role": "assistant", "content": f"Answer {i}"}]
        for i in range(3)
    ]
    rows = [{"text": qwen3.render(chat)} for chat in chats]
    rows.append({"text": qwen3.render(chats[0][:1], add_generation_prompt=True)})
    samples = tmp_path / "texts.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, out, err = run(["diff", "qwen3", str(samples)])
    assert (code, out.decode()) == (0, "0 of 4 samples differ\n"), err
    rows[1]["text"] = chatml.render(chats[1])  # no empty think block: not what qwen3 writes for an answer
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, out, _ = run(["diff", "qwen3", str(samples)])
    text = out.decode()
    assert code == 1 and text.startswith(f"== {samples} line 2: differs from what qwen3 renders\n")
    assert "-(raised: The prompt is not one template 'qwen3' renders from text messages" in text
    assert "(Readings whose texts hold the template's own markup, '<|im_end|>', are not taken: strict=True.)" in text
    assert text.endswith("1 of 4 samples differ (line 2)\n")


def test_diff_tokens_of_formatted_samples(tmp_path: Path) -> None:
    require_shared()
    codec = chatcodec.load(QWEN3_TOKENIZER)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    ids = codec.encode(messages).input_ids
    samples = tmp_path / "tokens.jsonl"
    rows = [{"messages": messages, "input_ids": ids}, {"messages": messages, "input_ids": [*ids, ids[-2]]}]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, out, _ = run(["diff", str(QWEN3_TOKENIZER), str(samples), "--json"])
    assert code == 1 and json.loads(out) == {"samples": 2, "different": [2]}
    code, out, err = run(["diff", "qwen3", str(samples)])  # ids need a tokenizer
    assert code == 2 and "give a tokenizer" in err and err.count("\n") == 1


def test_show_writes_a_page(tmp_path: Path) -> None:
    require_shared()
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT), encoding="utf-8")
    page = tmp_path / "page.html"
    code, _, err = run(["show", str(chat), "--tokenizer", str(QWEN3_TOKENIZER), "--html", str(page)])
    assert code == 0, err
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "Capital of France?" in text and 'id="legend"' in text
    code, _, err = run(["show", str(chat), "--html", str(page)])
    assert code == 2 and "needs --template" in err


def test_diff_on_the_callers_conversations(tmp_path: Path) -> None:
    chats = tmp_path / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
    ]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, out, err = run(["diff", "chatml", "qwen3", "--messages", str(chats)])
    text = out.decode()
    assert code == 1, err
    # the generation prompts agree; the answer differs by the empty think block Qwen3 writes in a final turn
    assert f"== {chats} line 1: same\n" in text and f"== {chats} line 2: differs\n" in text
    assert "+<think>\n+\n+</think>\n+\n" in text and text.endswith("1 of 2 conversations differ\n")
