"""Hostile and mistaken input to every command: one line on stderr, exit 2, nothing on stdout, no traceback.

The table covers the inputs of issues 7 and 10 (deep JSON, a lone surrogate, huge integers, reserved and
untyped ``--var``, odd request fields, deep content, a bad ``chat_control_tokens``, budget flags, ...), and
then every shared option of every command in the command table with a bad value.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chatcodec.cli import COMMANDS

from ..conftest import SHARED, require_shared
from .test_render import run

QWEN3 = str(SHARED / "tokenizers" / "qwen3")
HI = json.dumps([{"role": "user", "content": "Hi"}])


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep_content(depth: int) -> str:
    return '[{"role": "user", "content": ' + "[" * depth + '"x"' + "]" * depth + "}]"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    require_shared()
    root = tmp_path_factory.mktemp("hostile")
    bad_control = root / "bad-control"
    shutil.copytree(QWEN3, bad_control)
    config = json.loads((bad_control / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_control_tokens"] = [1, None, {"a": 2}]
    (bad_control / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    drop_calls = root / "drop-calls.jinja"
    drop_calls.write_text(
        "{% for m in messages %}{% if not m.tool_calls %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endif %}{% endfor %}",
        encoding="utf-8",
    )
    runaway = root / "runaway.jinja"
    runaway.write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", encoding="utf-8"
    )
    calls = root / "calls.json"
    calls.write_text(
        json.dumps(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
            ]
        ),
        encoding="utf-8",
    )
    tools_object = root / "tools-object.json"
    tools_object.write_text('{"tools": {"name": "f"}}', encoding="utf-8")
    deep_tools = root / "deep-tools.json"
    deep_tools.write_text(_deep(100_000), encoding="utf-8")
    return {
        "bad_control": str(bad_control),
        "drop_calls": str(drop_calls),
        "runaway": str(runaway),
        "calls": str(calls),
        "tools_object": str(tools_object),
        "deep_tools": str(deep_tools),
    }


#: (argv, stdin, what the one line must contain); {name} is replaced from the files fixture
HOSTILE: list[tuple[list[str], str, str]] = [
    # issue 7: the inputs that printed a traceback
    (["render", "-t", "chatml"], _deep(100_000), "stdin nests JSON too deeply to read"),
    (["tokenize", "--tokenizer", QWEN3], _deep(100_000), "stdin nests JSON too deeply to read"),
    (["render", "-t", "chatml"], '[{"role": "user", "content": "\\ud800"}]', "lone surrogate (\\ud800)"),
    (["tokenize", "--tokenizer", QWEN3], '[{"role": "user", "content": "a\\udfffb"}]', "lone surrogate (\\udfff)"),
    (["render", "-t", "chatml"], '[{"role": "user", "content": ' + "9" * 5000 + "}]", "Exceeds the limit (4300"),
    (["render", "-t", "chatml", "--var", "messages=1"], HI, "'messages' is not a template variable you can set"),
    (["tokenize", "--tokenizer", QWEN3, "--var", "tools=[]"], HI, "'tools' is not a template variable you can set"),
    (["render", "-t", "chatml"], json.dumps({"messages": json.loads(HI), "chat_template_kwargs": [1]}),
     '"chat_template_kwargs" in stdin must be an object, not a list'),
    (["render", "-t", "chatml"], json.dumps({"messages": json.loads(HI), "chat_template_kwargs": {"messages": 1}}),
     "'messages' is not a template variable"),
    (["tokenize", "--tokenizer", QWEN3], _deep_content(600), "message 0 (user) has its content as a list of parts"),
    (["render", "-t", "qwen3"], _deep_content(600), "message 0 (user) has its content as a list of parts"),
    (["tokenize", "--tokenizer", QWEN3], _deep_content(5000), "nests"),
    (["render", "-t", "chatml"], _deep_content(5000), "nests"),
    (["tokenize", "--tokenizer", "{bad_control}"], HI, "chat_control_tokens must be a list of token strings"),
    # issue 10
    (["render", "-t", "chatml", "--var", "foo={bad"], HI, "--var foo: '{bad' is not a JSON value; quote a string"),
    (["render", "-t", "chatml", "--var", "x"], HI, "--var takes KEY=VALUE"),
    (["render", "-t", "chatml", "--vars", "[1]"], HI, "--vars takes a JSON object"),
    (["render", "-t", "chatml", "--vars", "{oops"], HI, "--vars is not valid JSON"),
    (["render", "-t", "chatml", "--tools", "{tools_object}"], HI, "must hold a list of tools"),
    (["render", "-t", "chatml", "--tools", "{deep_tools}"], HI, "nests JSON too deeply"),
    (["decode", "--format", "hermes", "--tools", "{tools_object}"], "", "tools-object.json must hold a list"),
    (["decode", "--format", "hermes", "--tools", "missing.json"], "", "tools file missing.json does not exist"),
    (["render", "-t", "chatml"], json.dumps({"messages": json.loads(HI), "tools": {"a": 1}}),
     '"tools" in stdin must be a list'),
    (["render", "-t", "chatml"], json.dumps({"messages": json.loads(HI), "add_generation_prompt": "yes"}),
     '"add_generation_prompt" in stdin must be true or false'),
    (["render", "-t", "chatml", "--show", "--json"], HI, "not allowed with argument"),
    (["decode", "--format", "hermes", "--chunk-size", "0", "--stream"], "x", "--chunk-size: '0' must be at least 1"),
    (["decode", "--format", "hermes", "--chunk-size", "5"], "x", "--chunk-size feeds the stream: it needs --stream"),
    (["decode", "--format", "hermes", "--var", "x=1"], "x", "need --template, not --format"),
    (["decode", "--format", "hermes", "-t", "qwen3"], "x", "not both"),
    (["templates", "qwen-3"], "", "Did you mean 'qwen3'?"),
    (["tokenize"], HI, "this command needs --tokenizer PATH"),
    (["tokenize", "--tokenizer", "{drop_calls}"], HI, "drop-calls.jinja: there is no tokenizer.json in"),
    (["tokenize", "--tokenizer", QWEN3, "-t", "{drop_calls}", "{calls}", "--json"], "", "no token of them could"),
    (["tokenize", "--tokenizer", QWEN3, "-t", "{drop_calls}", "{calls}", "--show"], "", "no token of them could"),
    (["render", "-t", "{runaway}", "--timeout", "0.3"], HI, "longer than 0.3 s"),
    (["render", "-t", "chatml", "--max-output", "10"], HI, "over the 10 allowed"),
    (["render", "-t", "chatml", "--timeout", "nan"], HI, "--timeout: 'nan' must be a number above 0"),
    (["render", "-t", "no-such-template"], HI, "No chat template at 'no-such-template'"),
    (["render", "--tokenizer", "/no/such/folder"], HI, "--tokenizer /no/such/folder: no such folder or file"),
    (["render", "-t", "chatml", "."], "", "messages file . is a folder"),
    (["render", "--bogus"], HI, "unrecognized arguments: --bogus"),
    (["bogus"], "", "invalid choice: 'bogus'"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "stdin", "message"), HOSTILE, ids=[" ".join(h[0])[:60] for h in HOSTILE])
def test_hostile_input_is_one_line_and_exit_2(files: dict[str, str], argv: list[str], stdin: str, message: str) -> None:
    argv = [a.format(**files) if a.startswith("{") and a.endswith("}") else a for a in argv]
    code, stdout, stderr = run(argv, stdin)
    assert (code, stdout) == (2, b""), stderr
    assert stderr.count("\n") == 1 and stderr.startswith("chatcodec: error: "), stderr
    assert "Traceback" not in stderr
    assert message in stderr


def test_at_the_real_entry_point_there_is_no_traceback_either() -> None:
    for stdin in (_deep(100_000), '[{"role": "user", "content": "\\ud800"}]', _deep_content(5000)):
        done = subprocess.run(
            [sys.executable, "-m", "chatcodec", "render", "-t", "chatml"], input=stdin.encode(), capture_output=True
        )
        assert done.returncode == 2 and done.stdout == b""
        assert done.stderr.count(b"\n") == 1 and done.stderr.startswith(b"chatcodec: error: ")


def test_typed_variables_render_the_non_thinking_prompt() -> None:
    expected = b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    for value in ("False", "false"):
        code, stdout, _ = run(
            ["render", "-t", "qwen3", "--add-generation-prompt", "--var", f"enable_thinking={value}"], HI
        )
        assert (code, stdout) == (0, expected), value
    code, stdout, _ = run(
        ["render", "-t", "qwen3", "--add-generation-prompt", "--vars", '{"enable_thinking": false}'], HI
    )
    assert stdout == expected
    code, stdout, _ = run(["render", "-t", "qwen3", "--add-generation-prompt", "--var", "enable_thinking=True"], HI)
    assert stdout == b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    # precedence: request < --vars < --var
    request = json.dumps({"messages": json.loads(HI), "chat_template_kwargs": {"enable_thinking": True}})
    argv = ["render", "-t", "qwen3", "--add-generation-prompt", "--vars", '{"enable_thinking": false}']
    assert run(argv, request)[1] == expected
    assert run([*argv, "--var", "enable_thinking=None"], request)[1].endswith(b"assistant\n")


def test_a_default_template_is_announced(tmp_path: Path) -> None:
    code, stdout, stderr = run(["render"], HI)
    assert code == 0 and stdout == b"<|im_start|>user\nHi<|im_end|>\n"
    assert stderr == "chatcodec: note: no --template given: using the built-in 'chatml' template\n"
    code, _, stderr = run(["render", "-t", "chatml"], HI)
    assert stderr == ""
    code, _, stderr = run(["render", "--tokenizer", QWEN3], HI)  # the tokenizer's own template: no note
    assert code == 0 and stderr == ""


def test_the_same_request_body_works_for_every_command(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    request.write_text(json.dumps({"messages": json.loads(HI), "tools": tools}), encoding="utf-8")
    code, stdout, _ = run(["render", "-t", "qwen3", "--tools", str(request)], HI)
    assert code == 0 and b'"name": "get_weather"' in stdout
    code, stdout, _ = run(["tokenize", "--tokenizer", QWEN3, "--tools", str(request)], HI)
    assert code == 0 and len(stdout.split()) > 50
    code, stdout, _ = run(["decode", "-t", "qwen3", "--tools", str(request)], '<tool_call>{"name": "nope"}</tool_call>')
    assert code == 0 and "tool_calls" not in json.loads(stdout)  # an unknown tool name is not a call


#: a bad value for each shared option; every command that takes the option must refuse it in one line
BAD_SHARED = {
    "--template": ["--template", "no-such-template"],
    "--tokenizer": ["--tokenizer", "/no/such/folder"],
    "--var": ["--var", "x"],
    "--vars": ["--vars", "[1]"],
    "--tools": ["--tools", "/no/such/tools.json"],
    "--json": ["--json", "--show"],
    "--max-output": ["--max-output", "0"],
    "--timeout": ["--timeout", "-1"],
}


def _options(command: str) -> set[str]:
    import importlib

    from chatcodec.cli.common import ArgumentParser

    parser = ArgumentParser(prog=f"chatcodec {command}")
    importlib.import_module(COMMANDS[command][0]).configure(parser)
    return {option for action in parser._actions for option in action.option_strings}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_a_bad_shared_option_in_one_line(command: str) -> None:
    require_shared()
    taken = [option for option in BAD_SHARED if option in _options(command)]
    for option in taken:
        extra = ["--format", "hermes"] if command == "decode" and option in ("--var", "--vars") else []
        code, stdout, stderr = run([command, *extra, *BAD_SHARED[option]], HI)
        assert (code, stdout) == (2, b""), (command, option, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith("chatcodec: error: "), (command, option, stderr)
    code, _, stderr = run([command, "--no-such-option"], HI)
    assert code == 2 and stderr.count("\n") == 1


def test_render_tokenize_and_decode_take_every_shared_option() -> None:
    for command in ("render", "tokenize", "decode"):
        assert set(BAD_SHARED) <= _options(command), command
