"""The public surface: ``__all__`` is exactly the public names, they report ``chatcodec`` as their module,
and the version is written in one place."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import subprocess
import sys
from pathlib import Path

import chatcodec

ROOT = Path(__file__).resolve().parents[1]


def test_all_is_exactly_the_public_names() -> None:
    public = {
        name for name, value in vars(chatcodec).items() if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public - set(chatcodec._LAZY) == set(chatcodec.__all__) - set(chatcodec._LAZY)  # lazy ones appear once used
    assert set(chatcodec._LAZY) <= set(chatcodec.__all__)
    assert chatcodec.__all__ == sorted(chatcodec.__all__, key=lambda n: (n[0].islower(), n))
    assert len(set(chatcodec.__all__)) == len(chatcodec.__all__)


def test_every_exported_name_reports_chatcodec_as_its_module() -> None:
    for name in chatcodec.__all__:
        value = getattr(chatcodec, name)
        assert value.__module__ == "chatcodec", name
    assert repr(chatcodec.InputError) == "<class 'chatcodec.InputError'>"


def test_the_version_is_written_once() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", chatcodec.__version__)
    assert importlib.metadata.version("chatcodec") == chatcodec.__version__
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject and not re.search(r"(?m)^version\s*=", pyproject)
    done = subprocess.run([sys.executable, "-m", "chatcodec", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == f"chatcodec {chatcodec.__version__}"
