"""``chatcodec decode``: the command logic, and the command through ``chatcodec``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from chatcodec.cli import decode as cli
from chatcodec.cli import main
from chatcodec.cli.common import ArgumentParser
from chatcodec.exceptions import DecodeError

HERMES_CALL = 'Sure.<tool_call>{"name": "f", "arguments": {"x": "é"}}</tool_call>'


def run(argv: list[str], stdin: str | bytes = "") -> str:
    parser = ArgumentParser(prog="chatcodec decode")
    cli.configure(parser)
    data = stdin.encode() if isinstance(stdin, str) else stdin
    out = io.StringIO()
    assert cli.run(parser.parse_args(argv), io.BytesIO(data), out) == 0
    return out.getvalue()


def test_decode_prints_the_openai_message() -> None:
    message = json.loads(run(["--format", "hermes"], HERMES_CALL))
    call_id = message["tool_calls"][0].pop("id")
    assert call_id.startswith("call_") and len(call_id) == 29
    assert message == {
        "role": "assistant",
        "content": "Sure.",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"x": "é"}'}}],
    }


def test_stream_prints_json_lines_that_add_up() -> None:
    lines = run(["--format", "hermes", "--stream", "--chunk-size", "1"], HERMES_CALL).splitlines()
    deltas = [json.loads(line) for line in lines]
    assert "".join(d.get("content", "") for d in deltas) == "Sure."
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "f"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"x": "é"}'


def test_template_detection_and_reasoning_state() -> None:
    message = json.loads(run(["--template", "qwen3", "--reasoning-format", "deepseek"], "<think>a</think>b"))
    assert (message["reasoning_content"], message["content"]) == ("a", "b")


def test_tools_file_checks_names(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": [{"type": "function", "function": {"name": "g"}}]}))
    message = json.loads(run(["--format", "hermes", "--tools", str(tools)], HERMES_CALL))
    assert "tool_calls" not in message and message["content"] == HERMES_CALL


def test_list_formats() -> None:
    listed = run(["--list-formats"])
    assert "hermes " in listed and "gpt_oss " in listed


def test_mistakes_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DecodeError, match="--format NAME"):
        run([])
    assert main(["decode", "--format", "nope"]) == 2
    assert "Unknown output format 'nope'" in capsys.readouterr().err


def test_broken_calls_are_reported_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    run(["--format", "hermes"], '<tool_call>{"name": "f", "arguments": {"x"')
    assert "warning: tool call 0 (f)" in capsys.readouterr().err


def test_a_fallback_to_content_is_a_warning_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = tmp_path / "tools_only.jinja"
    template.write_text(
        "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    message = json.loads(run(["--template", str(template)], '<call>{"name": "f"}</call>'))
    assert message["content"] == '<call>{"name": "f"}</call>'
    err = capsys.readouterr().err
    assert err.startswith("chatcodec: warning: No tool-call format found for template") and err.count("\n") == 1


def test_vllm_and_llama_cpp_names() -> None:
    text = "I should look.</think>" + HERMES_CALL
    argv = ["--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1"]
    message = json.loads(run(argv, text))
    assert (message["reasoning_content"], message["content"]) == ("I should look.", "Sure.")
    assert message["tool_calls"][0]["function"]["name"] == "f"
    assert json.loads(run(["--format", "Hermes 2 Pro"], HERMES_CALL))["tool_calls"][0]["function"]["name"] == "f"
    listed = run(["--list-formats"])
    assert "'openai' -> gpt_oss" in listed and "deepseek_r1" in listed
