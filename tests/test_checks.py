"""The static checks (ruff, ruff format, mypy) run with the tests, so CI's one test command runs them too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_scripts_check_passes() -> None:
    environment = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check")], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
