"""Fixtures for the tools tests: the seed's temperature example and its conversation in the corpus."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..conftest import conversations, require_shared

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "temperature.py"


@pytest.fixture(scope="session")
def temperature() -> ModuleType:
    """examples/temperature.py, imported from its file."""
    spec = importlib.util.spec_from_file_location("temperature_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def roundtrip() -> dict[str, Any]:
    """The corpus conversation tools_roundtrip: the seed's two calls, their results and the tools."""
    require_shared()
    return conversations()["tools_roundtrip"]
