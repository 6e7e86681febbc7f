"""docs/guide/mcp.md: every ```python block runs as it stands, in order, from the repository's root, and prints
what the page says it prints; the loop on the embedded model gives what the code guarantees."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guide" / "mcp.md"
#: the roles the loop's block prints: the forced call, its result and the answer (as its comment says), or the
#: call alone, when max_tokens cut it
WHOLE = ["user", "assistant", "tool", "assistant"]
CUT = ["user", "assistant"]


def check_loop(transcript: list[dict[str, Any]], temperature: ModuleType) -> None:
    """What the code guarantees of the block's loop. Its tools' location is a free string, so no max_tokens holds
    every call (on another CPU the model may write a longer one): either the one forced call ran and the model
    answered, or max_tokens cut the call, which was not run."""
    roles = [message["role"] for message in transcript]
    assert roles in (WHOLE, CUT), roles
    assistant = transcript[1]
    if roles == CUT:
        assert "tool_calls" not in assistant and assistant["invalid_tool_calls"], assistant
        assert {call["error"] for call in assistant["invalid_tool_calls"]} == {"the arguments were cut off"}
        return
    (call,) = assistant["tool_calls"]  # one call at a time
    assert "invalid_tool_calls" not in assistant and transcript[2]["tool_call_id"] == call["id"]
    function = getattr(temperature, call["function"]["name"])
    returned = function(**json.loads(call["function"]["arguments"]))
    assert json.loads(transcript[2]["content"]) in (returned, {"result": returned})  # no Error: the call was valid
    # the last round is asked with tool_choice "none": an answer whose first character is not a call's "{"
    answer = transcript[3]
    assert answer["content"] and not answer.get("tool_calls") and not answer.get("invalid_tool_calls")


def test_the_guide_blocks_run(monkeypatch: pytest.MonkeyPatch, temperature: ModuleType) -> None:
    monkeypatch.chdir(ROOT)
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(blocks) == 4
    printed = io.StringIO()
    spaces = []
    for block in blocks:
        spaces.append({"__name__": "guide"})
        with contextlib.redirect_stdout(printed):
            exec(compile(block, str(PAGE), "exec"), spaces[-1])
    lines = printed.getvalue().splitlines()
    assert lines[3] in (str(WHOLE), str(CUT)) and f"# {WHOLE}: the call, its result, the answer" in blocks[2]
    check_loop(spaces[2]["transcript"], temperature)
    assert lines[:3] + lines[4:] == [
        "['get_current_temperature', 'get_temperature_date']",
        "Error: invalid arguments for get_current_temperature: 'location' is a required property.",
        "['get_current_temperature', 'get_temperature_date']",
        '{"value": "NaN"}',
        'Error: tool call 0 is a string, not a tool call object ({"name": ..., "arguments": {...}}).',
    ]
