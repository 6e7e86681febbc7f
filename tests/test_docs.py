"""The examples in docstrings and in the README run and print what they claim."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest

import chatcodec

from .conftest import require_shared

README = Path(__file__).resolve().parents[1] / "README.md"
MODULES = sorted(
    info.name for info in pkgutil.walk_packages(chatcodec.__path__, "chatcodec.") if "__main__" not in info.name
)


class Finder(doctest.DocTestFinder):
    """Finds each example once, in the module that defines it (exported names report ``chatcodec`` as theirs)."""

    def _from_module(self, module: Any, object: Any) -> bool:
        if inspect.isclass(object) and object.__module__ == "chatcodec":
            return bool(chatcodec._DEFINED_IN.get(object.__name__) == module.__name__)
        return bool(super()._from_module(module, object))  # type: ignore[misc]


def docstring_examples(name: str) -> list[doctest.DocTest]:
    return Finder().find(importlib.import_module(name), name)


@pytest.mark.parametrize("name", ["chatcodec", *MODULES])
def test_docstring_examples(name: str) -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in docstring_examples(name):
        runner.run(test)
    assert runner.failures == 0


def test_exported_classes_keep_their_examples() -> None:
    """A class that reports ``chatcodec`` as its module is still searched for examples where it is defined."""
    found = {test.name for name in MODULES for test in docstring_examples(name)}
    assert "chatcodec.render.ChatTemplate" in found and "chatcodec.limits.Limits" in found
    assert chatcodec.ChatTemplate.__module__ == "chatcodec"


def test_readme_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block of the README runs, in order, in one namespace, from the checkout."""
    require_shared()
    monkeypatch.chdir(README.parent)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert blocks
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
