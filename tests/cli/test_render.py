"""The chatcodec command: exact bytes on stdout, one clear line and exit code 2 for every mistake."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from chatcodec.cli import main

from ..conftest import SHARED, require_shared
from ..reference import require_transformers

ROOT = Path(__file__).resolve().parents[2]
WEATHER = ROOT / "examples" / "weather.json"


def run(argv: list[str], stdin: str = "") -> tuple[int, bytes, str]:
    """Run the command in-process; returns (exit code, stdout bytes, stderr text)."""
    out, err = io.BytesIO(), io.StringIO()

    class Stdout(io.TextIOWrapper):
        def isatty(self) -> bool:
            return False

    stdout = Stdout(out, encoding="utf-8")
    saved = sys.stdin, sys.stdout, sys.stderr
    stdin_stream = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8", "surrogatepass")), encoding="utf-8")
    sys.stdin, sys.stdout, sys.stderr = stdin_stream, stdout, err
    try:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
        stdout.flush()
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return code, out.getvalue(), err.getvalue()


def test_render_weather_is_byte_identical_to_transformers() -> None:
    require_shared()
    require_transformers()
    from transformers import AutoTokenizer

    request = json.loads(WEATHER.read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(str(SHARED / "tokenizers" / "qwen3"))
    expected = tokenizer.apply_chat_template(
        request["messages"], tools=request["tools"], add_generation_prompt=True, tokenize=False
    )
    code, stdout, stderr = run(["render", "--template", "qwen3", "--add-generation-prompt", str(WEATHER)])
    assert (code, stderr) == (0, "")
    assert stdout == expected.encode("utf-8")


def test_the_installed_command_works() -> None:
    command = [
        sys.executable,
        "-m",
        "chatcodec",
        "render",
        "--template",
        "qwen3",
        "--add-generation-prompt",
        str(WEATHER),
    ]
    done = subprocess.run(command, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"<|im_start|>system\nYou are a weather assistant.")
    assert done.stdout.endswith(b"<|im_start|>assistant\n")


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`chatcodec render ... | head -c 0`: the reader has closed the pipe before the prompt is written; the
    command exits 0 with nothing on stderr (no traceback, no "Exception ignored" when Python flushes at exit)."""
    command = [sys.executable, "-m", "chatcodec", "render", "--template", "qwen3", str(WEATHER)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # long before the command has imported, rendered and written
        stderr = process.stderr.read()
        assert process.wait(timeout=120) == 0, stderr
    assert stderr == b""


def test_bare_list_on_stdin_and_options() -> None:
    chat = [{"role": "user", "content": "2+2?"}]
    code, stdout, _ = run(
        ["render", "-t", "qwen3", "--add-generation-prompt", "--var", "enable_thinking=false"], json.dumps(chat)
    )
    assert code == 0
    assert stdout == b"<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    code, stdout, _ = run(["render", "-t", "qwen3"], json.dumps(chat))  # off unless asked, as in the API
    assert stdout == b"<|im_start|>user\n2+2?<|im_end|>\n"
    code, stdout, _ = run(["render", "-t", "qwen3"], json.dumps({"messages": chat, "add_generation_prompt": True}))
    assert stdout == b"<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    request = json.dumps({"messages": chat, "add_generation_prompt": True})
    code, stdout, _ = run(["render", "-t", "qwen3", "--no-add-generation-prompt"], request)  # the option wins
    assert stdout == b"<|im_start|>user\n2+2?<|im_end|>\n"


def test_continue_final_message_and_request_fields() -> None:
    request = {
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}],
        "continue_final_message": True,
        "chat_template_kwargs": {"unused": 1},
    }
    code, stdout, _ = run(["render", "-t", "chatml"], json.dumps(request))
    assert code == 0
    assert stdout == b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I am"


def test_now_pins_the_clock(tmp_path: Path) -> None:
    chat = json.dumps([{"role": "user", "content": "date?"}])
    code, stdout, _ = run(["render", "-t", "llama3", "--now", "2026-11-29T12:00"], chat)
    assert code == 0
    assert b"Today Date: 26 Jul 2024" in stdout  # the Llama 3.1 template's own default wins over the clock
    code, stdout, _ = run(["render", "-t", "midm", "--now", "2026-11-29T12:00"], chat)
    assert b"Today Date: 29 Nov 2026" in stdout


def test_tools_file(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(json.loads(WEATHER.read_text())["tools"]))
    chat = json.dumps([{"role": "user", "content": "weather?"}])
    code, stdout, _ = run(["render", "-t", "qwen3", "--tools", str(tools)], chat)
    assert code == 0 and b'"name": "get_weather"' in stdout


def test_show_marks_tokens_and_the_end() -> None:
    chat = json.dumps([{"role": "user", "content": "Hi"}])
    code, stdout, _ = run(["render", "-t", "chatml", "--show", "--add-generation-prompt"], chat)
    assert code == 0
    assert stdout.decode() == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n⏎\n"


def test_templates_lists_builtins() -> None:
    code, stdout, _ = run(["templates"])
    assert code == 0
    names = [line.split()[0] for line in stdout.decode().splitlines() if line and not line.startswith(" ")]
    assert {"qwen3", "llama3", "gpt-oss", "midm", "seed-korean-toolcall"} <= set(names)


BAD_INPUTS: list[tuple[list[str], str, str]] = [
    (["render"], "{oops", "stdin is not valid JSON: Expecting property name enclosed in double quotes"),
    (["render"], "", "messages input (stdin) is empty"),
    (["render"], '[{"content": "no role"}]', 'message 0 in stdin has no "role"'),
    (["render"], '{"model": "x"}', 'must hold a list of messages or a request body with "messages"'),
    (["render"], '{"messages": []}', '"messages" in stdin must be a non-empty list'),
    (["render"], '["hi"]', "message 0 in stdin is a string, not an object"),
    (["render", "missing.json"], "", "messages file missing.json does not exist"),
    (["render", "-t", "qwen-3"], '[{"role": "user", "content": "x"}]', "Did you mean 'qwen3'?"),
    (["render", "-t", "gemma"], '[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]',
     "Conversation roles must alternate user/assistant/user/assistant/... (template 'gemma', line"),
    (["render", "--var", "x"], '[{"role": "user", "content": "x"}]', "--var takes KEY=VALUE"),
    (["render", "--now", "noon"], '[{"role": "user", "content": "x"}]', "--now takes an ISO date"),
    (["render", "--continue-final-message", "--add-generation-prompt"],
     '[{"role": "assistant", "content": "x"}]', "continue_final_message and add_generation_prompt are not compatible"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "stdin", "message"), BAD_INPUTS, ids=[b[2][:40] for b in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], stdin: str, message: str) -> None:
    code, stdout, stderr = run(argv, stdin)
    assert code == 2
    assert stdout == b""
    assert stderr.count("\n") == 1 and stderr.startswith("chatcodec: error: ")
    assert message in stderr


def test_no_command_prints_help() -> None:
    code, _, stderr = run([])
    assert code == 2 and "render" in stderr
