"""What the prompt tells a decoder: the template it came from, and whether it left a think block open.

A completion starts where the prompt ends. If the generation prompt opened a think block, the output
starts inside reasoning; if it closed one (thinking switched off), it starts in content. That state
comes from the rendered prompt, never from guessing at keyword arguments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from ..exceptions import ChatcodecError, DecodeError
from ..render import ChatTemplate
from ..templates import load_template
from .machine import ThinkSpec

__all__ = [
    "PROBE_NOW",
    "PROBE_USER",
    "as_template",
    "end_markers",
    "generation_prompt",
    "prompt_state",
    "template_think_state",
]

PROBE_USER = {"role": "user", "content": "What is the weather in Paris?"}
PROBE_NOW = datetime(2026, 1, 1, 12, 0, 0)
#: how much of a given prompt, beyond the length of the template's generation prompt, is examined
PROMPT_SLACK = 16

ThinkState = Literal["open", "closed"]


def as_template(template: object, error: type[ChatcodecError] = DecodeError) -> ChatTemplate:
    """``template`` as a :class:`ChatTemplate`: one already, a built-in name, or a path to load; anything
    else raises ``error`` (the caller's kind of mistake).

    >>> as_template("qwen3").name
    'qwen3'
    >>> as_template(5)
    Traceback (most recent call last):
    ...
    chatcodec.DecodeError: template must be a ChatTemplate, a built-in template name or a path, not int.
    """
    if isinstance(template, ChatTemplate):
        return template
    if isinstance(template, str | os.PathLike):
        return load_template(os.fspath(template))
    raise error(f"template must be a ChatTemplate, a built-in template name or a path, not {type(template).__name__}.")


#: end-of-turn tokens a template may write itself besides the one after a final turn (Llama 3.1 ends a
#: built-in tool call with <|eom_id|>); each counts where the template's source has it
END_TOKENS = (
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<end_of_turn>", "<|end_of_text|>", "<|endoftext|>", "</s>",
    "<|END_OF_TURN_TOKEN|>", "<｜end▁of▁sentence｜>", "<turn|>", "<|end|>", "<|return|>",
)  # fmt: skip


def end_markers(template: ChatTemplate) -> tuple[str, ...]:
    """What ends an assistant turn of ``template``: its stop markers (from its capabilities), its
    end-of-sequence token, and the known end-of-turn tokens its source writes.

    >>> end_markers(as_template("llama3"))
    ('<|eot_id|>', '<|eom_id|>')
    """
    source = "\n".join(template.sources.values())
    eos = template.special_tokens.get("eos_token")
    found = [*template.capabilities.stop_markers, *([eos] if isinstance(eos, str) and eos else [])]
    found += [token for token in END_TOKENS if token in source]
    return tuple(dict.fromkeys(found))


def prompt_state(prompt: str, think: ThinkSpec | None) -> ThinkState | None:
    """Whether ``prompt`` ends inside a think block with the tags of ``think`` (``"open"``), after
    one (``"closed"``, thinking switched off), or neither.

    Give it the generation prompt, or the end of a prompt: a system prompt may well mention the tags.

    >>> prompt_state("<|im_start|>assistant\\n<think>\\n", ThinkSpec(("<think>",), ("</think>",)))
    'open'
    """
    if think is None:
        return None
    opened = max((prompt.rfind(tag) for tag in think.start), default=-1)
    closed = max((prompt.rfind(tag) for tag in think.end), default=-1)
    if opened > closed:
        return "open"
    return "closed" if closed >= 0 else None


def generation_prompt(template: ChatTemplate, kwargs: Mapping[str, Any] | None = None) -> str | None:
    """What ``add_generation_prompt`` appends after a user turn; None if the template cannot say."""
    try:
        with_gp = template.render([PROBE_USER], add_generation_prompt=True, now=PROBE_NOW, **(kwargs or {}))
        without = template.render([PROBE_USER], add_generation_prompt=False, now=PROBE_NOW, **(kwargs or {}))
    except ChatcodecError:
        return None
    common = 0
    while common < min(len(with_gp), len(without)) and with_gp[common] == without[common]:
        common += 1
    return with_gp[common:]


def template_think_state(
    template: ChatTemplate,
    think: ThinkSpec | None,
    enable_thinking: bool | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    prompt: str | None = None,
) -> ThinkState | None:
    """Whether prompts from ``template`` end inside a think block with the tags of ``think``.

    The template's :attr:`~chatcodec.ChatTemplate.capabilities` know the state its generation prompt
    leaves, with and without ``enable_thinking``; that answers when the template thinks with these
    tags. Other template variables, or the real ``prompt`` (only its end is examined: about as long
    as the template's own generation prompt, and a little more), are read directly.
    """
    if think is None:
        return None
    kwargs = dict(chat_template_kwargs or {})
    if prompt is None and not set(kwargs) - {"enable_thinking"}:
        caps = template.capabilities
        if caps.think_tags is None or caps.think_tags[0] in think.start or caps.think_tags[1] in think.end:
            wanted = kwargs.get("enable_thinking", enable_thinking)
            state = caps.think_state_for(wanted if isinstance(wanted, bool) else None)
            return None if state == "none" else state
    if enable_thinking is not None:
        kwargs.setdefault("enable_thinking", enable_thinking)
    generation = generation_prompt(template, kwargs)
    if prompt is not None:
        generation = prompt[-(len(generation or "") + PROMPT_SLACK) :]
    return prompt_state(generation, think) if generation is not None else None
