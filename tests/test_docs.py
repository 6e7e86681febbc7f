"""The examples in docstrings and in the README run and print what they claim."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import chatcodec

from .conftest import require_shared

README = Path(__file__).resolve().parents[1] / "README.md"
MODULES = sorted(
    info.name for info in pkgutil.walk_packages(chatcodec.__path__, "chatcodec.") if "__main__" not in info.name
)


@pytest.mark.parametrize("name", ["chatcodec", *MODULES])
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_readme_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block of the README runs, in order, in one namespace, from the checkout."""
    require_shared()
    monkeypatch.chdir(README.parent)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert blocks
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
