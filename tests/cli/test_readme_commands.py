"""Every ``chatcodec`` command line in the shell blocks of the README and the docs pages runs, from the checkout,
and exits 0."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import require_shared

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: the README and every page of the docs site
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _command_lines() -> list[str]:
    text = "".join(page.read_text(encoding="utf-8") for page in PAGES)
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    # commands that need a server or a network are left to their own tests
    found = [
        line
        for line in lines
        if re.match(r"(echo .*\| )?chatcodec ", line)
        and "http://" not in line  # --url, --mcp-url: a server's line, run by that server's tests
        and not line.startswith("chatcodec serve")
    ]
    return list(dict.fromkeys(found))  # a command shown on two pages runs once


COMMAND_LINES = _command_lines()


def test_the_pages_have_command_lines() -> None:
    assert len(COMMAND_LINES) >= 20
    readme = README.read_text(encoding="utf-8")
    assert sum(line in readme for line in COMMAND_LINES) >= 4


@pytest.mark.parametrize("line", COMMAND_LINES)
def test_readme_command_runs(line: str) -> None:
    require_shared()
    python = shlex.quote(sys.executable)
    shell = re.sub(r"(^|\| )chatcodec ", rf"\g<1>{python} -m chatcodec ", line)
    # as in the activated virtualenv the README asks for: `python` on a line (an MCP server's command) is this one
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", shell], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout
