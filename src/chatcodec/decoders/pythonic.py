"""Python call lists: ``[get_weather(city="Paris"), search(q="x")]``, in content or Llama 4 tags.

``[get_weather(city='Paris', days=[1, 2]), search(q="x")]`` (pythonic, Llama 4 inside
``<|python_start|>``, LFM2's Python form). Keyword arguments become JSON: a string argument streams
as it arrives; any other literal is converted once it is complete (``None`` -> ``null``, tuples ->
lists). A call is announced at its first keyword (or at ``)`` when it has none), so a bracketed
aside in prose stays content.
"""

from __future__ import annotations

from .base import Sink
from .machine import MachineBase, Options, ThinkSpec, markers, skip_space
from .pycalls import PyCallList

__all__ = ["PythonicMachine"]

FENCE, PY_FENCE = "```", "```python"


class PythonicMachine(MachineBase):
    """Python call lists in content; Llama 4 wraps them in ``<|python_start|>...<|python_end|>``."""

    def __init__(
        self,
        out: Sink,
        opts: Options,
        think: ThinkSpec | None = None,
        *,
        start: str | None = None,
        end: str | None = None,
    ) -> None:
        super().__init__(out, opts, think)
        self._start, self._end = start, end
        self._markers = self.body_markers(["[", PY_FENCE, *([start] if start else [])])
        self._list: PyCallList | None = None
        self._closers: list[str] = []

    def s_body(self, final: bool) -> bool:
        pos = self.pos
        i, marker = self._markers.find(self.buf, pos, final)
        self.emit(i)
        if marker is None:
            return i > pos
        if self.think_opens(marker):
            return True
        self._closers = [] if self._end is None or marker != self._start else [self._end]
        if marker == "[":
            self._list = PyCallList(True)
            self.state = self.s_list
        else:  # <|python_start|> or a ```python fence: a list or bare calls may follow
            self.hold(i + len(marker))
            if marker == PY_FENCE:
                self._closers.insert(0, FENCE)
            self.state = self.s_start_list
        return True

    def s_start_list(self, final: bool) -> bool:
        """After the opener and whitespace (and maybe a fence): a bracketed list, or bare calls."""
        pos = self.pos
        self.hold(skip_space(self.buf, pos))
        buf, i = self.buf, self.pos
        if i >= len(buf) and not final:
            return self.pos > pos
        if FENCE not in self._closers:
            if buf.startswith(PY_FENCE, i):
                self.hold(i + len(PY_FENCE))
                self._closers.insert(0, FENCE)
                return True
            if len(buf) - i < len(PY_FENCE) and PY_FENCE.startswith(buf[i:]) and not final:
                return self.pos > pos
        self._list = PyCallList(buf.startswith("[", i))
        self.state = self.s_list
        return True

    def s_list(self, final: bool) -> bool:
        lst = self._list
        assert lst is not None
        moved = lst.step(self, final)
        if not lst.done:
            return moved
        if lst.count == 0:
            self.fallback()
            self.state = self.s_body
            return True
        if lst.clean:
            self.markup_held()
            self.state = self.s_close
        else:
            self.fallback()
            self.state = self.s_body
        return True

    def s_close(self, final: bool) -> bool:
        """A closing fence, and ``<|python_end|>`` after a Llama 4 call list, are markup."""
        found = self.marker_after_space(markers(*self._closers), final)
        if found is None:
            return False
        i, marker = found
        if marker is None:
            self.state = self.s_body
        else:
            self.markup(i + len(marker))
            self._closers.remove(marker)
        return True
