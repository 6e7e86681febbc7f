"""The static checks (ruff, ruff format, mypy) run with the tests, so CI's one test command runs them too; and CI's
rule that every test runs (``CHATCODEC_NO_SKIP=1``) holds."""

from __future__ import annotations

import os
import shutil
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


def test_a_skipped_test_fails_the_run_only_where_every_test_must_run(tmp_path: Path) -> None:
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_some.py").write_text(
        "import pytest\n\ndef test_runs():\n    pass\n\ndef test_skips():\n    pytest.skip('no browser')\n"
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    environment = {k: v for k, v in os.environ.items() if k != "CHATCODEC_NO_SKIP"}
    anywhere = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert anywhere.returncode == 0, anywhere.stdout
    in_ci = subprocess.run(
        command, cwd=tmp_path, env={**environment, "CHATCODEC_NO_SKIP": "1"}, capture_output=True, text=True
    )
    assert in_ci.returncode == 1, in_ci.stdout
    assert "CHATCODEC_NO_SKIP=1: 1 skipped test(s) fail the run" in in_ci.stdout
