"""Choose a chat template's output decoder by rendering probe conversations.

The template is asked to render an assistant turn with one tool call, and the same turn without
it; the text the call adds is what a model trained on the template writes. That text is decoded
with every format. The formats that give back the call compete on how much of the text they
explain as tool-call syntax (the rest would be left in content), then on the model id, then on a
fixed preference order, and a few rules pick the exact variant inside a family (``[CALL_ID]`` means
Mistral v13, ``function<｜tool▁sep｜>`` DeepSeek V3, an id on the ``<tool_call>`` line the
ID-prefixed Hermes style).

When no rendering shows a call (the template raises, or ignores ``tool_calls``), the markers in the
template source decide, as llama.cpp's legacy detection did; failing that the format is ``content``.

:func:`decoder_for` also renders the generation prompt: if it ends inside an open think block the
decoder starts in reasoning, if it closed the block (thinking off) it starts in content.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..exceptions import ChatcodecError, DecodeError
from ..polyfills import Polyfill, select
from ..render import ChatTemplate
from .catalog import CATALOG
from .format import Decoder
from .prompt import PROBE_NOW, PROBE_USER, as_template, template_think_state
from .registry import decoder, get_format, make_decoder

__all__ = ["Detection", "decoder_for", "detect", "detect_format"]

PROBE_NAME = "get_weather"
PROBE_ARGS = {"city": "Paris"}
PROBE_ID = "a1b2c3d4e"  # nine alphanumerics: Mistral templates reject anything else
PROBE_TEXT = "Checking."
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": PROBE_NAME,
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name."}},
                "required": ["city"],
            },
        },
    }
]
_USER = PROBE_USER
_NOW = PROBE_NOW
#: what the window may start before the first differing character (a marker cut by the diff)
BACKOFF = 48

#: the formats detection may choose, best rank first
_DETECTABLE = sorted((f for f in CATALOG.values() if f.rank is not None), key=lambda f: f.rank or 0)
#: markers too common in templates to identify a format from the source alone
_WEAK_MARKERS = frozenset({
    "{", "}", "[", "]", ";", "```", "```json", "```xml", "functools", "Action:", "all", "<response>",
    "</response>", "<think>", "</think>", "<tool>", "<tools>", "</tools>", "<json>", "</json>", "<xml>", "</xml>",
    # end-of-turn tokens many unrelated templates share
    "<|end|>", "<|start|>", "<|return|>", "<|eot_id|>", "<|eom_id|>",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Detection:
    """What :func:`detect` found.

    ``how`` is ``"rendered"`` (a probe render showed the call and the format decoded it back),
    ``"source"`` (no render showed a call; the template source's markers decided) or ``"none"`` (no
    tool-call syntax at all: ``content``). ``rendered`` is the text the template wrote for the call.
    """

    format: str
    how: Literal["rendered", "source", "none"]
    rendered: str = ""


_CACHE: weakref.WeakKeyDictionary[ChatTemplate, Detection] = weakref.WeakKeyDictionary()
#: by content too, so that loading the same template again (by name or path) is not probed again
_BY_CONTENT: dict[tuple[Any, ...], Detection] = {}
_BY_CONTENT_SIZE = 64


def detect_format(template: ChatTemplate | str) -> str:
    """The name of the output format ``template``'s own tool-call rendering uses.

    ``template`` is a :class:`~chatcodec.ChatTemplate`, a built-in name or a path.

    >>> detect_format("qwen3")
    'hermes'
    """
    return detect(template).format


def detect(template: ChatTemplate | str) -> Detection:
    """Like :func:`detect_format`, with how the answer was found (cached per template)."""
    chat = as_template(template)
    found = _CACHE.get(chat)
    if found is None:
        key = (tuple(sorted(chat.sources.items())), tuple(sorted(chat.special_tokens.items(), key=repr)))
        found = _BY_CONTENT.get(key)
        if found is None:
            found = _detect(chat)
            if len(_BY_CONTENT) >= _BY_CONTENT_SIZE:
                _BY_CONTENT.pop(next(iter(_BY_CONTENT)))
            _BY_CONTENT[key] = found
        _CACHE[chat] = found
    return found


def _detect(template: ChatTemplate) -> Detection:
    source = "\n".join(template.sources.values())
    for window in _call_windows(template):
        best = _best_decoder(window)
        if best is not None:
            return Detection(_refine(best, window, source), "rendered", window)
    by_source = _from_source(source)
    if by_source is not None:
        return Detection(_refine(by_source, source, source), "source")
    return Detection("content", "none")


def _render(template: ChatTemplate, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    try:
        return template.render(messages, tools=PROBE_TOOLS, now=_NOW, **kwargs)
    except ChatcodecError:
        return None


def _call_windows(template: ChatTemplate) -> list[str]:
    """The text each probe variant's tool call adds to the render (variants that render at all)."""
    windows = []
    without = _render(template, [_USER, {"role": "assistant", "content": PROBE_TEXT}])
    if without is None:
        without = _render(template, [_USER], add_generation_prompt=True) or ""
    for arguments in (PROBE_ARGS, json.dumps(PROBE_ARGS)):
        for content in (PROBE_TEXT, None, ""):
            call = {
                "id": PROBE_ID,
                "type": "function",
                "function": {"name": PROBE_NAME, "arguments": arguments},
            }
            rendered = _render(template, [_USER, {"role": "assistant", "content": content, "tool_calls": [call]}])
            if rendered is None:
                continue
            common = 0
            limit = min(len(rendered), len(without))
            while common < limit and rendered[common] == without[common]:
                common += 1
            start = max(0, common - BACKOFF)
            at = rendered.rfind(PROBE_TEXT, start, common + len(PROBE_TEXT))
            if at >= 0:
                start = at + len(PROBE_TEXT)
            window = rendered[start:]
            if PROBE_NAME in window and window not in windows:
                windows.append(window)
    return windows


def _best_decoder(window: str) -> str | None:
    ranked: list[tuple[int, int, int, str]] = []
    for fmt in _DETECTABLE:
        name = fmt.name
        stream = decoder(name).stream(trace=True)
        stream.feed(window)
        stream.finish()
        calls = stream.message.tool_calls
        if not calls or calls[0].name != PROBE_NAME or calls[0].arguments != PROBE_ARGS:
            continue
        explained = sum(len(s.text) for s in stream.trace if s.kind in ("call", "markup"))
        ranked.append((-explained, 0 if calls[0].id == PROBE_ID else 1, fmt.rank or 0, name))
    return min(ranked)[3] if ranked else None


def _refine(name: str, text: str, source: str) -> str:
    """The exact variant inside a family whose formats decode the probe alike.

    ``text`` is the rendered call (or, without one, the template source).
    """
    if name == "hermes" and f"<tool_call>{PROBE_ID}" in text:
        return "hermes_call_id"
    if name in ("mistral_v11", "mistral_v13", "mistral_pre_v11"):
        return "mistral_v13" if "[CALL_ID]" in text else "mistral_v11" if "[ARGS]" in text else "mistral_pre_v11"
    if name in ("deepseek_v3", "deepseek_v3_1", "deepseek_r1"):
        # V3 and R1 name the call type and fence the JSON; R1 templates also handle </think>.
        if "function<｜tool▁sep｜>" not in text and "```json" not in text:
            return "deepseek_v3_1"
        return "deepseek_r1" if "</think>" in source else "deepseek_v3"
    return name


def _from_source(source: str) -> str | None:
    """The format whose distinctive markers the template source mentions most."""
    ranked: list[tuple[int, int, str]] = []
    for fmt in _DETECTABLE:
        strong = [m for m in fmt.syntax if m not in _WEAK_MARKERS and len(m) >= 5]
        hits = sum(1 for m in strong if m in source)
        if hits:
            ranked.append((-hits, fmt.rank or 0, fmt.name))
    return min(ranked)[2] if ranked else None


# -- the decoder for a template ---------------------------------------------------------------


def decoder_for(
    template: ChatTemplate | str,
    *,
    prompt: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    polyfill: Polyfill = False,
    **options: Any,
) -> Decoder:
    """The decoder for output generated from ``template``'s prompts.

    The format comes from :func:`detect_format`; for prompts rendered with a ``polyfill`` that put
    the tools into the system text (``tools_in_system``), it is ``generic``, which those instructions
    ask for. Unless ``thinking_forced_open`` is given, the reasoning start state comes from ``prompt``
    (the exact prompt, when you have it) or from the template's generation prompt rendered with
    ``chat_template_kwargs`` (and ``enable_thinking``).
    Other options are :func:`~chatcodec.decoders.decoder`'s.

    >>> d = decoder_for("qwen3", enable_thinking=True)
    >>> d.decode('Hi.<tool_call>{"name": "f", "arguments": {}}</tool_call>').tool_calls[0].name
    'f'
    """
    chat = as_template(template)
    fmt = get_format(detect(chat).format)
    if polyfill and "tools_in_system" in select(polyfill, lambda: chat.capabilities):
        fmt = get_format("generic")
    if prompt is not None and not isinstance(prompt, str):
        raise DecodeError(f"prompt must be the prompt text, not {type(prompt).__name__}.")
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        raise DecodeError(f"chat_template_kwargs must be a mapping, not {type(chat_template_kwargs).__name__}.")
    if options.get("thinking_forced_open") is None:
        enable = options.get("enable_thinking")
        state = template_think_state(
            chat, fmt.think, enable if isinstance(enable, bool) else None, chat_template_kwargs, prompt
        )
        if state is not None:
            options["thinking_forced_open"] = state == "open"
    options.setdefault("template", chat)
    return make_decoder(fmt, **options)
