"""Reports for a terminal: plain text, with ANSI colour when asked for."""

from __future__ import annotations

from typing import ClassVar

from ..capabilities import Capabilities

__all__ = ["Style", "capabilities_text", "visible"]


class Style:
    """ANSI styles, or nothing when colour is off."""

    CODES: ClassVar[dict[str, str]] = {
        "bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35",
    }  # fmt: skip

    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        codes = ";".join(self.CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def yes_no(self, value: bool | None, good: bool = True) -> str:
        if value is None:
            return self("unknown", "dim")
        return self("yes" if value else "no", "green" if value == good else "red")


def visible(text: str, limit: int = 100) -> str:
    """Text on one line, with newlines shown as ``\\n`` and long text cut."""
    shown = text.replace("\n", "\\n")
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def capabilities_text(caps: Capabilities, *, color: bool) -> list[str]:
    """The boolean capabilities in columns, then the think states and the template's messages."""
    s = Style(color)
    cells = []
    for flag in Capabilities.flags():
        value = getattr(caps, flag)
        good = not flag.startswith("requires_")
        cells.append(f"{flag:<26}{s.yes_no(value, good)}")
    width = 26 + 3 + (9 if color else 0) + 2
    lines = []
    for i in range(0, len(cells), 2):
        lines.append("  " + "".join(cell.ljust(width) for cell in cells[i : i + 2]))
    lines.append(
        f"  think state after the generation prompt: {caps.think_state}"
        f" (enable_thinking=True: {caps.think_state_enabled}, False: {caps.think_state_disabled})"
    )
    if caps.think_tags:
        lines.append(f"  think tags: {caps.think_tags[0]} {caps.think_tags[1]}")
    lines.append(f"  date in the prompt: {s.yes_no(caps.date_dependent, good=False)}")
    for flag, message in caps.errors:
        lines.append(f"  {flag}: {s(repr(message), 'dim')}")
    return lines
