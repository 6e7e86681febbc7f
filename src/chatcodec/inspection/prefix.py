"""Prefix stability: is the prompt of turns 1..k always the start of the prompt of turns 1..k+1?

A server reuses its KV cache, and a trainer builds one sample per turn, on the assumption that a chat
only grows at its end. A template breaks it when a later turn changes how an earlier one renders: Qwen3
drops an assistant turn's reasoning once a user turn follows it, so the tokens cached for that turn are
no longer the prompt (user-problems.md §5.1, §5.2).

:func:`prefix_stability` renders a probe conversation (:func:`~chatcodec.inspection.probes.conversation`)
one message at a time, without the generation prompt, and also each prompt that asks for an assistant
turn (with the generation prompt) against the conversation that has that turn; for templates that read
``enable_thinking``, with it true and false too. Each place where the shorter render is not a prefix
of the longer one becomes a :class:`PrefixChange` naming what changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from ..capabilities import THINK_TAGS
from ..render import ChatTemplate
from .probes import TOOLS, Needles, conversation, render_or_error, uses_tools

__all__ = ["PrefixChange", "PrefixStability", "prefix_stability"]

#: a think block with nothing in it, in any of the tag pairs templates write
_EMPTY_THINK = re.compile("|".join(f"{re.escape(start)}\\s*{re.escape(end)}" for start, end in THINK_TAGS))

ChangeKind = Literal["history_reasoning_dropped", "generation_prompt_not_kept", "ending_not_kept", "turn_changed"]


@dataclass(frozen=True, slots=True)
class PrefixChange:
    """One place where a longer conversation re-renders an earlier part differently.

    ``variables`` are the template variables of the render (``{"enable_thinking": False}``); ``step`` is
    ``"message"`` (turns 1..k without the generation prompt, against 1..k+1) or ``"generation_prompt"``
    (turns 1..k with it, against the conversation with the assistant's answer); ``message`` is the index
    of the message whose rendering changed, ``role`` its role; ``removed`` is the text that was in the
    shorter render and is gone, ``added`` what replaced it.
    """

    variables: dict[str, Any]
    step: Literal["message", "generation_prompt"]
    message: int
    role: str
    kind: ChangeKind
    removed: str
    added: str

    @property
    def explanation(self) -> str:
        """One sentence: what changed, and where."""
        where = f"message {self.message} ({self.role})"
        if self.kind == "history_reasoning_dropped":
            what = "the empty think block" if _EMPTY_THINK.fullmatch(self.removed.strip()) else "the reasoning"
            text = f"history reasoning dropped: {what} of {where} is no longer rendered"
            text += " once a later turn follows"
        elif self.kind == "ending_not_kept":
            text = "the end of the prompt is not kept: what follows the last message changes once a later turn follows"
        elif self.kind == "generation_prompt_not_kept":
            text = (
                "the generation prompt is not kept: the answer to it renders in history without what the generation"
                " prompt wrote"
            )
        else:
            text = f"{where} renders differently once a later turn follows"
        changed = [f"{_short(self.removed)} removed" if self.removed else "", f"{_short(self.added)} added"]
        detail = ", ".join(part for part in changed if part and not part.startswith("'' "))
        if self.variables:
            text += " (with " + ", ".join(f"{k}={v!r}" for k, v in self.variables.items()) + ")"
        return f"{text}: {detail}" if detail else text

    def to_dict(self) -> dict[str, Any]:
        return {
            "variables": dict(self.variables),
            "step": self.step,
            "message": self.message,
            "role": self.role,
            "kind": self.kind,
            "removed": self.removed,
            "added": self.added,
            "explanation": self.explanation,
        }


@dataclass(frozen=True, slots=True)
class PrefixStability:
    """Whether every render of a growing probe conversation starts with the render before it.

    ``stable`` is None when no two renders could be compared (the template rejected the probes);
    ``checked`` counts the comparisons made.
    """

    stable: bool | None
    changes: tuple[PrefixChange, ...]
    checked: int

    @property
    def explanation(self) -> str:
        if self.stable is None:
            return "not checked: the template rendered none of the probe conversations"
        if self.stable:
            return f"each render starts with the one before it ({self.checked} comparisons)"
        return "; ".join(dict.fromkeys(change.explanation for change in self.changes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "stable": self.stable,
            "checked": self.checked,
            "explanation": self.explanation,
            "changes": [change.to_dict() for change in self.changes],
        }


def prefix_stability(template: ChatTemplate) -> PrefixStability:
    """Check ``template`` with the probe conversation, once per value of the variables that matter.

    >>> from chatcodec import load_template
    >>> prefix_stability(load_template("chatml")).stable
    True
    >>> print(prefix_stability(load_template("qwen3")).changes[0].explanation)  # doctest: +ELLIPSIS
    history reasoning dropped: the reasoning of message 2 (assistant) is no longer rendered ...
    """
    caps = template.capabilities
    full = conversation(caps)
    variants: list[dict[str, Any]] = [{}]
    if "enable_thinking" in caps.variables:
        variants += [{"enable_thinking": True}, {"enable_thinking": False}]
    changes: list[PrefixChange] = []
    checked = 0
    if uses_tools(full):  # a real chat passes its tools with every request, from the first turn on
        variants = [{"tools": TOOLS, **v} for v in variants]
    for variables in variants:
        thinking = variables.get("enable_thinking")
        if caps.think_state_for(thinking if isinstance(thinking, bool) else None) == "closed":
            # thinking is off: the model writes no reasoning, so the conversation has none
            messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in full]
        else:
            messages = full
        renders = [render_or_error(template, messages[:k], **variables) for k in range(1, len(messages) + 1)]
        for k in range(1, len(messages)):
            shorter, longer = renders[k - 1], renders[k]
            if isinstance(shorter, str) and isinstance(longer, str):
                checked += 1
                changes += _compare(shorter, longer, messages, variables, "message")
            if messages[k]["role"] == "assistant" and isinstance(longer, str):
                prompt = render_or_error(template, messages[:k], add_generation_prompt=True, **variables)
                if isinstance(prompt, str):
                    checked += 1
                    changes += _compare(prompt, longer, messages, variables, "generation_prompt")
    if not checked:
        return PrefixStability(None, (), 0)
    return PrefixStability(not changes, tuple(_distinct(changes)), checked)


def _distinct(changes: list[PrefixChange]) -> list[PrefixChange]:
    """One change per (kind, removed, added): the variants and turns that agree say the same thing once."""
    seen: dict[tuple[str, str, str], PrefixChange] = {}
    for change in changes:
        seen.setdefault((change.kind, change.removed, change.added), change)
    return list(seen.values())


def _compare(
    shorter: str, longer: str, messages: list[dict[str, Any]], variables: dict[str, Any], step: Any
) -> list[PrefixChange]:
    if longer.startswith(shorter):
        return []
    shown = {k: v for k, v in variables.items() if k != "tools"}
    last_end = _last_message_end(shorter, messages)
    found = []
    for at, removed, added in _changes(shorter, longer):
        index = _message_at(shorter, at, messages)
        kind: ChangeKind = "turn_changed"
        reasoning = messages[index].get("reasoning_content")
        dropped = isinstance(reasoning, str) and reasoning in removed and reasoning not in added
        emptied = bool(removed.strip()) and not added.strip() and _EMPTY_THINK.fullmatch(removed.strip()) is not None
        if dropped or emptied:
            kind = "history_reasoning_dropped"
        elif step == "generation_prompt" and at >= last_end:
            kind = "generation_prompt_not_kept"
        elif at >= last_end and at + len(removed) == len(shorter):
            kind = "ending_not_kept"
        found.append(PrefixChange(shown, step, index, str(messages[index].get("role")), kind, removed, added))
    return found


#: how much text must agree again after a change for the change to be over
_RESYNC = 24
#: the most text a removal may be replaced with and still read as one change
_SMALL = 8


def _changes(shorter: str, longer: str) -> list[tuple[int, str, str]]:
    """The changes that turn ``shorter`` into the start of ``longer``: ``(position in shorter, removed, added)``.

    From each point where the two differ, the smallest change (characters removed from ``shorter`` plus
    characters put in their place) after which the two agree again for a while; then on from there.
    """
    i = j = _marker_start(shorter, _common_prefix(shorter, longer), 0)
    # one change after which all the rest of shorter is kept (a block removed or moved) reads best
    tail = shorter[i:]
    for cut in range(1, len(tail) - _RESYNC):
        kept = tail[cut:]
        at = longer.find(kept, j, j + _SMALL + len(kept))
        if at >= 0:
            return [(i, tail[:cut], longer[j:at])]
    changes = []
    while i < len(shorter):
        cut, inserted = len(shorter) - i, 0  # at worst, the rest of shorter is gone
        for c in range(len(shorter) - i):
            if c >= cut + inserted:
                break
            kept = shorter[i + c : i + c + _RESYNC]
            found = longer.find(kept, j, j + cut + inserted - c + len(kept))
            if found >= 0 and c + found - j < cut + inserted:
                cut, inserted = c, found - j
        changes.append((i, shorter[i : i + cut], longer[j : j + inserted]))
        i, j = i + cut, j + inserted
        resumed = i
        while i < len(shorter) and j < len(longer) and shorter[i] == longer[j]:
            i, j = i + 1, j + 1
        if i < len(shorter):
            back = i - _marker_start(shorter, i, resumed)
            i, j = i - back, j - back
    return changes


def _common_prefix(a: str, b: str) -> int:
    limit = min(len(a), len(b))
    i = 0
    while i < limit and a[i] == b[i]:
        i += 1
    return i


def _marker_start(text: str, at: int, floor: int) -> int:
    """``at``, or the start of the marker it falls inside (``<|endoftext|>`` and ``<|user|>`` share ``<|``,
    which is no part of what they have in common); never before ``floor``."""
    window = text[max(floor, at - 40) : at]
    opened = max(window.rfind("<"), window.rfind("["))
    if opened >= 0 and not any(close in window[opened:] for close in (">", "]")):
        return at - (len(window) - opened)
    return at


def _needles(message: dict[str, Any]) -> list[str]:
    found = []
    for key in ("content", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str) and value:
            found.append(value)
    if message.get("tool_calls"):
        found.append(Needles.ARG_VALUE)
    return found


def _message_at(text: str, position: int, messages: list[dict[str, Any]]) -> int:
    """The message whose text is the first to appear at or after ``position`` (the last one if none does)."""
    best: tuple[int, int] | None = None
    for index, message in enumerate(messages):
        for needle in _needles(message):
            at = text.find(needle, position)
            if at >= 0 and text.rfind(needle, 0, position) < 0 and (best is None or at < best[0]):
                best = (at, index)
    if best is not None:
        return best[1]
    present = [i for i, m in enumerate(messages) if any(n in text for n in _needles(m))]
    return present[-1] if present else len(messages) - 1


def _last_message_end(text: str, messages: list[dict[str, Any]]) -> int:
    ends = [text.rfind(n) + len(n) for m in messages for n in _needles(m) if n in text]
    return max(ends, default=0)


def _short(text: str, limit: int = 60) -> str:
    shown = text if len(text) <= limit else text[: limit - 1] + "…"
    return repr(shown)
