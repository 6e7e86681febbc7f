"""The command table: each command is imported only when it runs, and every one has help; ``templates``."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from chatcodec import ChatTemplate, load_template
from chatcodec.cli import COMMANDS

from .test_render import run


def test_help_imports_no_command_module() -> None:
    code = (
        "import sys\nfrom chatcodec.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "loaded = [m for m in sys.modules if m.startswith('chatcodec.cli.') and m != 'chatcodec.cli.common']\n"
        "print(' '.join(sorted(loaded)), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for name in COMMANDS:
        assert f"\n    {name}" in done.stdout or f" {name} " in done.stdout
    assert done.stderr.strip() == ""


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_a_module_with_configure_run_and_help(name: str) -> None:
    module = importlib.import_module(COMMANDS[name][0])
    assert callable(module.configure) and callable(module.run)
    code, stdout, stderr = run([name, "--help"])
    assert code == 0 and stderr == ""
    assert len(stdout.decode()) > 200  # a description and the options, not only the usage line


def test_templates_name_prints_source_and_provenance() -> None:
    code, stdout, _ = run(["templates", "qwen3"])
    assert code == 0
    text = stdout.decode()
    assert text.startswith("{# qwen3: ") and "license: Apache-2.0" in text.splitlines()[2]
    builtin = load_template("qwen3")
    # the provenance is a Jinja comment: the printed text renders exactly as the built-in does
    printed = ChatTemplate(text, special_tokens=builtin.special_tokens)
    chat = [{"role": "user", "content": "Hi"}]
    assert printed.render(chat, add_generation_prompt=True) == builtin.render(chat, add_generation_prompt=True)


def test_templates_unknown_name_suggests() -> None:
    code, stdout, stderr = run(["templates", "qwen-3"])
    assert (code, stdout) == (2, b"")
    assert "Did you mean 'qwen3'?" in stderr and stderr.count("\n") == 1
