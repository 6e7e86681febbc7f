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
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from ..exceptions import ChatcodecError
from ..polyfills import Polyfill, select
from .registry import Decoder, decoder, formats, get_format

if TYPE_CHECKING:
    from ..render import ChatTemplate

__all__ = ["Detection", "decoder_for", "detect", "detect_format", "prompt_state", "template_think_state"]

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
_USER = {"role": "user", "content": "What is the weather in Paris?"}
_NOW = datetime(2026, 1, 1, 12, 0, 0)
#: what the window may start before the first differing character (a marker cut by the diff)
BACKOFF = 48
#: how much of a given prompt, beyond the length of the template's generation prompt, is examined
PROMPT_SLACK = 16

#: ties go to the format listed first; the rest follow in name order
#: (llama3_json comes first: on bare JSON it ties with Hermes' bare-object fallback and is the real
#: owner; wherever Hermes tags are present, Hermes explains more of the text and wins outright.)
PREFERENCE = (
    "llama3_json", "hermes", "qwen3_coder", "glm45", "minimax_m2", "deepseek_dsml", "seed_oss", "kimi_k2",
    "deepseek_v3_1", "deepseek_v3", "deepseek_r1", "mistral_v11", "mistral_v13", "mistral_pre_v11", "gpt_oss",
    "command_r7b", "command_r_plus", "apriel", "granite", "nemotron_v2", "lfm2", "apertus", "phi4_mini",
    "phi4_mini_llamacpp", "gemma4", "function_gemma", "functionary_v3_2", "functionary_v3_1", "llama4_pythonic",
    "pythonic", "granite_20b_fc", "generic",
)  # fmt: skip
#: never chosen by detection: aliases that add nothing, Ollama's runtime heuristics, reasoning only
_NOT_DETECTED = frozenset({
    "midm", "hermes_call_id", "hermes_qwen_agent_code", "generic_template_tag", "json_bare", "json_list",
    "mistral_nemo", "mistral_v11_vllm_text", "magistral", "nemotron_v3", "firefunction_v2",
    "reasoning_deepseek_r1", "reasoning_qwen3", "content",
})  # fmt: skip
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


def detect_format(template: ChatTemplate) -> str:
    """The name of the output format ``template``'s own tool-call rendering uses.

    >>> from chatcodec import load_template
    >>> detect_format(load_template("qwen3"))
    'hermes'
    """
    return detect(template).format


def detect(template: ChatTemplate) -> Detection:
    """Like :func:`detect_format`, with how the answer was found (cached per template object)."""
    found = _CACHE.get(template)
    if found is None:
        found = _CACHE[template] = _detect(template)
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
    order = {name: i for i, name in enumerate(PREFERENCE)}
    for name in formats():
        if name in _NOT_DETECTED:
            continue
        stream = decoder(name).stream(trace=True)
        stream.feed(window)
        stream.finish()
        calls = stream.message.tool_calls
        if not calls or calls[0].name != PROBE_NAME or calls[0].arguments != PROBE_ARGS or calls[0].error:
            continue
        explained = sum(len(s.text) for s in stream.trace if s.kind in ("call", "markup"))
        ranked.append((-explained, 0 if calls[0].id == PROBE_ID else 1, order.get(name, len(order)), name))
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
    order = {name: i for i, name in enumerate(PREFERENCE)}
    for name in formats():
        if name in _NOT_DETECTED:
            continue
        strong = [m for m in get_format(name).syntax if m not in _WEAK_MARKERS and len(m) >= 5]
        hits = sum(1 for m in strong if m in source)
        if hits:
            ranked.append((-hits, order.get(name, len(order)), name))
    return min(ranked)[2] if ranked else None


# -- the generation prompt ------------------------------------------------------------------------


def prompt_state(prompt: str, fmt: str) -> Literal["open", "closed"] | None:
    """Whether ``prompt`` ends inside a think block of format ``fmt`` (``"open"``), after one
    (``"closed"``, thinking switched off), or neither.

    Give it the generation prompt, or the end of a prompt: a system prompt may well mention the tags.

    >>> prompt_state("<|im_start|>assistant\\n<think>\\n", "hermes")
    'open'
    """
    think = get_format(fmt).think
    if think is None:
        return None
    opened = max((prompt.rfind(tag) for tag in think.start), default=-1)
    closed = max((prompt.rfind(tag) for tag in think.end), default=-1)
    if opened > closed:
        return "open"
    return "closed" if closed >= 0 else None


def _generation_prompt(template: ChatTemplate, kwargs: Mapping[str, Any]) -> str | None:
    """What ``add_generation_prompt`` appends after a user turn."""
    try:
        with_gp = template.render([_USER], add_generation_prompt=True, now=_NOW, **kwargs)
        without = template.render([_USER], add_generation_prompt=False, now=_NOW, **kwargs)
    except ChatcodecError:
        return None
    common = 0
    while common < min(len(with_gp), len(without)) and with_gp[common] == without[common]:
        common += 1
    return with_gp[common:]


def template_think_state(
    template: ChatTemplate,
    fmt: str,
    enable_thinking: bool | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    prompt: str | None = None,
) -> Literal["open", "closed"] | None:
    """Whether prompts from ``template`` end inside a think block of ``fmt`` (see :func:`prompt_state`).

    With the real ``prompt``, only its end is examined: about as long as the template's own
    generation prompt, and a little more.
    """
    kwargs = dict(chat_template_kwargs or {})
    if enable_thinking is not None:
        kwargs.setdefault("enable_thinking", enable_thinking)
    generation = _generation_prompt(template, kwargs)
    if prompt is not None:
        generation = prompt[-(len(generation or "") + PROMPT_SLACK) :]
    return prompt_state(generation, fmt) if generation is not None else None


def decoder_for(
    template: ChatTemplate,
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

    >>> from chatcodec import load_template
    >>> d = decoder_for(load_template("qwen3"), enable_thinking=True)
    >>> d.decode('Hi.<tool_call>{"name": "f", "arguments": {}}</tool_call>').tool_calls[0].name
    'f'
    """
    name = detect_format(template)
    if polyfill and "tools_in_system" in select(polyfill, lambda: template.capabilities):
        name = "generic"
    if options.get("thinking_forced_open") is None:
        state = template_think_state(template, name, options.get("enable_thinking"), chat_template_kwargs, prompt)
        if state is not None:
            options["thinking_forced_open"] = state == "open"
    options.setdefault("template", template)
    return decoder(name, **options)
