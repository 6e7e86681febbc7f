"""LocalClient() without the serve extra (issue 29, item 16): a one-line error that says what to install.

Each run is a fresh interpreter in which one package of the extra cannot be imported (``None`` in
``sys.modules`` makes its import raise ModuleNotFoundError, as a missing package does).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PROGRAM = """
import sys
sys.modules[{module!r}] = None
from chatcodec import ChatcodecError
from chatcodec.tools import LocalClient
try:
    LocalClient()
except ChatcodecError as exc:
    print(type(exc).__name__ + ": " + str(exc))
"""


@pytest.mark.parametrize(
    ("module", "extra"),
    [("llama_cpp", "serve"), ("starlette", "serve"), ("httpx", "serve"), ("gguf", "gguf")],
)
def test_local_client_without_the_extra_says_what_to_install(module: str, extra: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(module=module)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert line.startswith("LoadError: ")
    assert f"pip install 'chatcodec[{extra}]'" in line
    assert "Traceback" not in done.stderr
