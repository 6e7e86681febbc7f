"""What the command line reads: inputs under a size limit (``--max-input`` raises it), text that must be UTF-8,
library limits named by their flags, outputs that would overwrite an input, and roles a template drops."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from chatcodec.cli import common, decode

from ..conftest import SHARED, require_shared
from .test_render import run

HI = json.dumps([{"role": "user", "content": "Hi"}])


def _one_line_exit_2(code: int, stdout: bytes, stderr: str) -> str:
    assert code == 2, stderr
    assert stdout == b"" and stderr.count("\n") == 1 and stderr.startswith("chatcodec: error: "), stderr
    assert "Traceback" not in stderr
    return stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["render", "/dev/zero"],
        ["render", "-t", "chatml", "--tools", "/dev/zero", "{hi}"],
        ["render", "-t", "chatml", "--vars", "/dev/zero", "{hi}"],
        ["unrender", "-t", "chatml", "/dev/zero"],
        ["tokenize", "/dev/zero", "--tokenizer", str(SHARED / "tokenizers" / "qwen3")],
        ["decode", "--format", "hermes", "--tools", "/dev/zero"],
    ],
)
def test_an_endless_input_is_refused_at_the_limit(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "hi.json").write_text(HI, encoding="utf-8")
    argv = [a.format(hi=tmp_path / "hi.json") for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", "chatcodec", *argv, "--max-input", "1M"],
        capture_output=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    stderr = done.stderr.decode()
    message = _one_line_exit_2(done.returncode, done.stdout, stderr)
    assert "over 1,048,576 bytes, the input limit; raise it with --max-input SIZE" in message


def test_the_default_limit_and_raising_it(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps([{"role": "user", "content": "x" * 3000}]), encoding="utf-8")
    message = _one_line_exit_2(*run(["render", "-t", "chatml", str(big), "--max-input", "2K"]))
    assert "over 2,048 bytes" in message
    code, stdout, stderr = run(["render", "-t", "chatml", str(big), "--max-input", "4K"])
    assert code == 0 and stdout.count(b"x") == 3000, stderr
    code, _, stderr = run(["render", "-t", "chatml", str(big)])
    assert code == 0 and common.MAX_INPUT_BYTES == 64 * 2**20
    assert "not a size" in run(["render", str(big), "--max-input", "lots"])[2]


def test_stdin_is_limited_too() -> None:
    message = _one_line_exit_2(*run(["render", "-t", "chatml", "--max-input", "1K"], stdin=HI + " " * 2000))
    assert "in stdin is over 1,024 bytes" in message


def _decode(argv: list[str], data: bytes) -> tuple[int, str, str]:
    """``chatcodec decode`` with ``data`` as its binary stdin, in process."""
    parser = common.ArgumentParser(prog="chatcodec decode")
    decode.configure(parser)
    common.add_input_limit(parser)
    args = parser.parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stderr
    sys.stderr = err
    try:
        common._input_limit[0] = args.max_input or common.MAX_INPUT_BYTES
        try:
            code = decode.run(args, stdin=io.BytesIO(data), stdout=out)
        except common.ChatcodecError as exc:
            code = common.fail(str(exc))
    finally:
        sys.stderr = saved
        common._input_limit[0] = common.MAX_INPUT_BYTES
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("data", "where"),
    [(b"\xff\xfe\x00binary", 0), (b"Sure.\x80\x81", 5), (b"ok " * 30000 + b"\xc3", 90000), (bytes(range(256)), 128)],
)
def test_decode_refuses_binary_stdin(data: bytes, where: int, stream: bool) -> None:
    argv = ["--format", "hermes", *(["--stream"] if stream else [])]
    code, stdout, stderr = _decode(argv, data)
    assert code == 2 and f"stdin is not UTF-8 text (byte {where})" in stderr, stderr
    assert "\ufffd" not in stdout


def test_decode_reads_text_and_is_limited() -> None:
    code, stdout, _ = _decode(["--format", "hermes"], "Caf\u00e9 ok".encode())
    assert code == 0 and json.loads(stdout)["content"] == "Caf\u00e9 ok"
    code, _, stderr = _decode(["--format", "hermes", "--stream", "--max-input", "1K"], b"a" * 70000)
    assert code == 2 and "over 1,024 bytes, the input limit; raise it with --max-input" in stderr


def test_limit_errors_name_the_flags(tmp_path: Path) -> None:
    message = _one_line_exit_2(*run(["render", "-t", "chatml", "--max-output", "10"], stdin=HI))
    assert "--max-output N" in message and "Limits(" not in message
    slow = json.dumps([{"role": "user", "content": "x"}])
    path = tmp_path / "slow.jinja"
    path.write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", encoding="utf-8"
    )
    message = _one_line_exit_2(*run(["render", "-t", str(path), "--timeout", "0.2"], stdin=slow))
    assert "--timeout SECONDS" in message and "Limits(" not in message


def test_show_refuses_to_write_over_its_input(tmp_path: Path) -> None:
    chat = tmp_path / "chat.json"
    chat.write_text(HI, encoding="utf-8")
    tools = tmp_path / "tools.json"
    tools.write_text("[]", encoding="utf-8")
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (chat, tools)}
    for argv, named in (
        ([str(chat), "-t", "chatml", "--html", str(chat)], "FILE"),
        ([str(chat), "-t", "chatml", "--tools", str(tools), "--html", str(tools)], "--tools"),
    ):
        message = _one_line_exit_2(*run(["show", *argv]))
        assert f"is the input {named}" in message
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (chat, tools)} == digests
    code, _, stderr = run(["show", str(chat), "-t", "chatml", "--html", str(tmp_path / "page.html")])
    assert code == 0 and (tmp_path / "page.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>"), stderr


def test_a_role_the_template_writes_as_nothing_is_warned_about() -> None:
    require_shared()
    chat = [{"role": "user", "content": "Hi"}, {"role": "wizard", "content": "Abracadabra"},
            {"role": "narrator", "content": [{"type": "text", "text": "Once upon a time"}]}]  # fmt: skip
    code, stdout, stderr = run(["render", "-t", "qwen3"], stdin=json.dumps(chat))
    assert code == 0 and b"Abracadabra" not in stdout
    assert stderr.splitlines() == [
        "chatcodec: warning: the template wrote nothing for messages[1] (role 'wizard', a role it does not know):"
        " its text is not in the prompt",
        "chatcodec: warning: the template wrote nothing for messages[2] (role 'narrator', a role it does not know):"
        " its text is not in the prompt",
    ]
    code, stdout, stderr = run(["render", "-t", "chatml"], stdin=json.dumps(chat[:2]))  # chatml writes any role
    assert code == 0 and b"Abracadabra" in stdout and stderr == ""
