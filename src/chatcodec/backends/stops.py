"""Stop strings over streamed text: cut at the first stop, hold back what may be the start of one.

>>> stops = StopStrings(("</s>",))
>>> stops.feed("Hello</"), stops.feed("world"), stops.stopped
('Hello', '</world', False)
>>> stops.feed("!</s> never seen"), stops.stopped, stops.matched
('!', True, '</s>')
"""

from __future__ import annotations

__all__ = ["StopStrings"]


class StopStrings:
    """Feeds text through, cut before the first stop string; ``stopped`` says when one was found, ``matched``
    which one (the first to begin in the text)."""

    __slots__ = ("_held", "_longest", "_stops", "matched", "stopped")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """The text that is safe to emit now."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        found = [(i, -len(s), s) for s in self._stops if (i := buf.find(s)) >= 0]
        if found:
            cut, _, self.matched = min(found)
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = 0
        for n in range(min(self._longest - 1, len(buf)), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self._stops):
                keep = n
                break
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def finish(self) -> str:
        """What was held back, once the text has ended without a stop."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
