"""docs/guide/mcp.md: every ```python block runs as it stands, in order, from the repository's root."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guide" / "mcp.md"


def test_the_guide_blocks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(blocks) == 4
    printed = io.StringIO()
    for block in blocks:
        with contextlib.redirect_stdout(printed):
            exec(compile(block, str(PAGE), "exec"), {"__name__": "guide"})
    lines = printed.getvalue().splitlines()
    assert lines == [
        "['get_current_temperature', 'get_temperature_date']",
        "Error: invalid arguments for get_current_temperature: 'location' is a required property.",
        "['get_current_temperature', 'get_temperature_date']",
        '{"value": "NaN"}',
        'Error: tool call 0 is a string, not a tool call object ({"name": ..., "arguments": {...}}).',
    ]
