"""Choose a chat template's output decoder by rendering probe conversations.

1. **Catalog.** The template is asked to render an assistant turn with one tool call, and the same
   turn without it; the text the call adds is what a model trained on the template writes. That text
   is decoded with every format. The formats that give back the call compete on how much of the text
   they explain as tool-call syntax (the rest would be left in content), then on the model id, then
   on :attr:`~.format.Format.rank`, and a few rules pick the exact variant inside a family
   (``[CALL_ID]`` means Mistral v13, ``function<｜tool▁sep｜>`` DeepSeek V3, an id on the
   ``<tool_call>`` line the ID-prefixed Hermes style). The winner must also read back the learner's
   probes (two calls, two arguments, another name, no arguments) without leaving syntax in content.
2. **Learned.** When no catalog format does, :mod:`.learn` builds one from those probe renders.
3. **Instructions.** A template that never renders past calls may say in its tool instructions how to
   call: an example call between tags (learned, or a catalog format that reads it), or a catalog
   format's markers.
4. **Source.** Failing all that, the markers in the template source decide, as llama.cpp's legacy
   detection did; and failing that the format is ``content`` (a ``fallback``, about which
   :func:`decoder_for` warns when the template renders tools).

:func:`decoder_for` also takes the generation prompt's think state (from the template's
capabilities): if it ends inside an open think block the decoder starts in reasoning, if it closed
the block (thinking off) it starts in content.
"""

from __future__ import annotations

import json
import re
import warnings
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..exceptions import ChatcodecError, DecodeError, DecodeWarning
from ..polyfills import Polyfill, select
from ..render import ChatTemplate
from ..templates import builtin_templates, content_key
from .catalog import CATALOG
from .format import Decoder, Format
from .learn import LEARN_TOOLS, from_instructions, learn, probe_windows, reads_back
from .machine import ThinkSpec
from .prompt import PROBE_NOW, PROBE_USER, as_template, end_markers, generation_prompt, template_think_state
from .registry import ReasoningFormat, get_format, make_decoder, with_reasoning_parser
from .response_reader import decoder_from_response_template
from .response_writer import write_response_template

__all__ = [
    "Detection",
    "check_response_template",
    "decoder",
    "decoder_for",
    "detect",
    "detect_format",
    "response_template",
]

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


How = Literal["catalog", "learned", "fallback"]
Evidence = Literal["rendered", "instructions", "source", "none"]


@dataclass(frozen=True, slots=True)
class Detection:
    """What :func:`detect` found, and how.

    ``how``: ``"catalog"`` (a known format), ``"learned"`` (no known format read the template's calls
    back, so one was learned from its renders: :attr:`learned`) or ``"fallback"`` (no tool-call syntax
    found: ``content``). ``evidence``: what decided: ``"rendered"`` (the template's rendering of a
    call), ``"instructions"`` (its tool instructions, for templates that never render past calls),
    ``"source"`` (markers in the template source) or ``"none"``. ``rendered`` is the text that decided
    (the rendered call, or the instructions).
    """

    format: str
    how: How
    evidence: Evidence = "none"
    rendered: str = ""
    learned: Format | None = None

    @property
    def output_format(self) -> Format:
        """The :class:`~chatcodec.decoders.format.Format` to decode with (learned or from the catalog)."""
        return self.learned if self.learned is not None else get_format(self.format)


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
        key = content_key(chat)
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
    think = _think_spec(template)
    probes = probe_windows(
        lambda messages, **kw: _render(template, messages, tools=LEARN_TOOLS, **kw),
        _USER,
        end_markers(template),
    )
    fallback: Detection | None = None
    for window in _call_windows(template):
        best = _best_decoder(window)
        if best is None:
            continue
        found = Detection(_refine(best, window, source), "catalog", "rendered", window)
        if not probes or reads_back(get_format(found.format), probes):
            return found
        fallback = fallback or found
    learned = learn(probes, think)
    if learned is not None:
        return Detection("learned", "learned", "rendered", learned.evidence, learned.format)
    if fallback is not None:
        return fallback
    instructions = _instructions(template)
    if instructions:
        found_there = _from_instructions(instructions, think)
        if found_there is not None:
            return found_there
    by_source = _from_source(source)
    if by_source is not None:
        return Detection(_refine(by_source, source, source), "catalog", "source")
    return Detection("content", "fallback", "none")


def _think_spec(template: ChatTemplate) -> ThinkSpec:
    """The template's own think tags (for a learned format), or ``<think>``."""
    tags = template.capabilities.think_tags
    return ThinkSpec((tags[0],), (tags[1],)) if tags else ThinkSpec(("<think>",), ("</think>",))


def _instructions(template: ChatTemplate) -> str:
    """The text the template adds to a prompt for the tools: their definitions and its instructions.

    Tools are passed as ``tools`` and, for templates that read them under another name (SmolLM3's
    ``xml_tools``), under every template variable whose name ends in ``tools``.
    """
    names = [v for v in template.capabilities.variables if v.endswith("tools") and v != "tools"]
    extra: dict[str, Any] = {name: LEARN_TOOLS for name in names}
    try:
        with_tools = template.render([_USER], tools=LEARN_TOOLS, add_generation_prompt=True, now=_NOW, **extra)
        without = template.render([_USER], add_generation_prompt=True, now=_NOW)
    except ChatcodecError:
        return ""
    return with_tools if with_tools != without else ""


def _from_instructions(text: str, think: ThinkSpec) -> Detection | None:
    """The format the tool instructions describe: by a call example, else by the markers they name."""
    learned = from_instructions(text, think)
    if learned is not None:
        example = f'{learned.format.syntax[0]}{{"name": "{PROBE_NAME}", "arguments": {json.dumps(PROBE_ARGS)}}}'
        example += learned.format.syntax[1] if len(learned.format.syntax) > 1 else ""
        best = _best_decoder(example)
        if best is not None and not (make_decoder(get_format(best)).decode(example).content or "").strip():
            return Detection(best, "catalog", "instructions", learned.evidence)
        return Detection("learned", "learned", "instructions", learned.evidence, learned.format)
    by_markers = _from_source(text)
    if by_markers is not None:
        return Detection(by_markers, "catalog", "instructions", text)
    return None


def _render(template: ChatTemplate, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    kwargs.setdefault("tools", PROBE_TOOLS)
    try:
        return template.render(messages, now=_NOW, **kwargs)
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
        stream = make_decoder(fmt).stream(trace=True)
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


# -- decoders by name and for a template ----------------------------------------------------------


def decoder(
    format: str,
    *,
    reasoning_format: ReasoningFormat = "auto",
    thinking_forced_open: bool | None = None,
    enable_thinking: bool | None = None,
    tools: Iterable[Mapping[str, Any] | str] | None = None,
    tools_schema: Mapping[str, Any] | None = None,
    template: Any = None,
    tag: str | None = None,
    stop_markers: Iterable[str] | None = None,
    reasoning_parser: str | None = None,
) -> Decoder:
    """A decoder for the output format ``format``: a name of :func:`formats`, a vLLM
    ``--tool-call-parser`` name (``mistral``, ``openai`` ...) or a llama.cpp chat-format name
    (``Hermes 2 Pro`` ...).

    - ``reasoning_format``: ``"auto"`` and ``"deepseek"`` move reasoning into ``reasoning_content``;
      ``"none"`` leaves it (tags included) in ``content``.
    - ``thinking_forced_open``: the prompt already opened the think block, so the output starts
      inside reasoning. By default it follows ``enable_thinking`` for formats whose templates open
      the block themselves, else the format's own default.
    - ``tools``: OpenAI tool dicts or bare names. When given, calls to other names are not calls, and
      the parameter schemas type the values of XML-style arguments.
    - ``tools_schema``: ``{parameter: type}`` hints for every tool (``"integer"``, a JSON schema, or
      ``"anyOf[integer,null]"``).
    - ``template``: the chat template the prompt came from (a :class:`~chatcodec.ChatTemplate`, a
      built-in name or a path). It sets ``thinking_forced_open`` from its generation prompt (with
      ``enable_thinking``) when that is not given. :func:`decoder_for` also picks the format from it.
    - ``tag``: the tool-call tag for Ollama's template-derived formats.
    - ``stop_markers``: end-of-turn markers (``<|im_end|>``); where they end the text they are markup,
      not content, as a server returns them with special tokens skipped. By default the template's own
      (see :func:`~chatcodec.decoders.prompt.end_markers`), or none without a template.
    - ``reasoning_parser``: a vLLM ``--reasoning-parser`` name; its tags and its start state replace
      the format's, so ``decoder("hermes", reasoning_parser="deepseek_r1")`` reads what vLLM's
      ``--tool-call-parser hermes --reasoning-parser deepseek_r1`` reads.

    A chat template's name where a format is expected gets the template's own format suggested.

    >>> decoder("deepseek_v3_1", thinking_forced_open=True).decode("Hmm.</think>Hi!").reasoning_content
    'Hmm.'
    """
    try:
        fmt = get_format(format)
    except DecodeError:
        if isinstance(format, str) and format in builtin_templates():
            found = detect_format(format)
            raise DecodeError(
                f"{format!r} is a chat template, not an output format: its format is {found!r}. Use"
                f" decoder({found!r}), or decoder_for({format!r}) to follow its prompts as well."
            ) from None
        raise
    if reasoning_parser is not None:
        fmt = with_reasoning_parser(fmt, reasoning_parser)
    return make_decoder(
        fmt,
        reasoning_format=reasoning_format,
        thinking_forced_open=thinking_forced_open,
        enable_thinking=enable_thinking,
        tools=tools,
        tools_schema=tools_schema,
        template=template,
        tag=tag,
        stop_markers=stop_markers,
    )


def decoder_for(
    template: ChatTemplate | str,
    *,
    prompt: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    polyfill: Polyfill = False,
    **options: Any,
) -> Decoder:
    """The decoder for output generated from ``template``'s prompts.

    A template loaded with a ``response_template`` (a model folder's ``tokenizer_config.json``) is decoded by
    it (see :func:`~chatcodec.decoders.response_reader.decoder_from_response_template`), unless a polyfill
    put the tools into the system text. Otherwise the format comes from :func:`detect_format`; for prompts
    rendered with a ``polyfill`` that put the tools into the system text (``tools_in_system``), it is
    ``generic``, which those instructions ask for. Unless ``thinking_forced_open`` is given, the reasoning
    start state comes from ``prompt`` (the exact prompt, when you have it) or from the template's generation
    prompt rendered with ``chat_template_kwargs`` (and ``enable_thinking``).
    Other options are :func:`~chatcodec.decoders.decoder`'s.

    >>> d = decoder_for("qwen3", enable_thinking=True)
    >>> d.decode('Hi.<tool_call>{"name": "f", "arguments": {}}</tool_call>').tool_calls[0].name
    'f'
    """
    chat = as_template(template)
    # the tools went into the system text, whose instructions ask for generic calls
    in_system = bool(polyfill) and "tools_in_system" in select(polyfill, lambda: chat.capabilities)
    if chat.response_template is not None and not in_system:  # the model's own says how its output is parsed
        return decoder_from_response_template(
            chat.response_template, template=chat, prompt=prompt, chat_template_kwargs=chat_template_kwargs, **options
        )
    found = detect(chat)
    fmt = found.output_format
    if found.how == "fallback" and chat.capabilities.tools:
        warnings.warn(
            f"No tool-call format found for template {chat.name or 'unnamed'!r}, which renders tools: its"
            " output is decoded as plain content, and any tool calls in it stay text. Render with"
            ' polyfill="auto" (and decode with decoder_for(template, polyfill="auto")), or name the format'
            " with decoder(FORMAT).",
            DecodeWarning,
            stacklevel=2,
        )
    if in_system:
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


def response_template(
    template: ChatTemplate | str, *, tools: Iterable[Mapping[str, Any]] | None = None, **variables: Any
) -> dict[str, Any]:
    """transformers' ``response_template`` for output generated from ``template``'s prompts.

    It is written for the format :func:`decoder_for` picks (its reasoning tags, the think state the
    generation prompt leaves with ``variables`` such as ``enable_thinking``, content, tool calls with
    names, arguments and ids) and anchored at the generation prompt. Before it is returned it must
    read the template's own rendering of a tool call (with ``tools``, or a probe tool) as chatcodec's
    decoder reads it; a format the language cannot say, or a template it would read differently,
    raises :class:`~chatcodec.DecodeError` naming what.

    >>> rt = response_template("qwen3")
    >>> rt["start_anchor"], rt["fields"]["tool_calls"]["open"]
    ('<|im_start|>assistant\\n', '<tool_call>')
    """
    chat = as_template(template)
    found = detect(chat)
    fmt = found.output_format
    own = decoder_for(chat, chat_template_kwargs=variables)
    prompt = _generation(chat, variables)
    source = "\n".join(chat.sources.values())
    name = "thinking" if "reasoning_content" not in source and "thinking" in source else "reasoning_content"
    written = write_response_template(
        fmt,
        prompt=prompt,
        end_markers=end_markers(chat),
        forced_open=own.options.forced_open,
        reasoning_name=name,
        sample=found.rendered,
    )
    wrong = check_response_template(chat, written, tools)
    if wrong is not None:
        raise DecodeError(f"The response template written for {chat.name or 'this template'!r} is wrong: {wrong}.")
    return written


def _generation(chat: ChatTemplate, variables: Mapping[str, Any]) -> str:
    """What the template writes to ask for an answer: its generation prompt, or where that is empty (the
    user turn itself ends with the model's cue, as Mistral's ``[/INST]``), the last marker of the prompt."""
    found = generation_prompt(chat, variables)
    if found and found.strip():
        return found
    prompt = _render(chat, [_USER], add_generation_prompt=True, **variables)
    cue = re.search(r"(?:<[^<>\s]+>|\[[^\[\]\s]+\])\s*$", prompt or "")
    if cue is None:
        raise DecodeError(
            f"Template {chat.name or 'unnamed'!r} writes nothing to ask for an answer, so a response template has no"
            " start anchor to find it by."
        )
    return cue.group()


def check_response_template(
    template: ChatTemplate | str, written: Mapping[str, Any], tools: Iterable[Mapping[str, Any]] | None = None
) -> str | None:
    """Why the response template ``written`` misreads ``template``'s own rendering of a tool call (one
    line), or None when it reads it as chatcodec's format decoder does (both starting outside
    reasoning, as a call in a history turn is written). A template that does not load says so."""
    chat = as_template(template)
    found = detect(chat)
    own = make_decoder(found.output_format, template=chat, thinking_forced_open=False)
    listed = list(tools) if tools is not None else PROBE_TOOLS
    try:
        theirs_decoder = decoder_from_response_template(written, prompt="", tools=listed)
    except DecodeError as exc:
        return str(exc)
    for window in _call_windows(chat):
        got = [(c.name, c.arguments) for c in theirs_decoder.decode(window).tool_calls]
        want = [(c.name, c.arguments) for c in own.decode(window).tool_calls]
        if got != want:
            return (
                f"the response template reads the template's own rendered call {window!r} as {got}, where"
                f" chatcodec's {found.format} decoder reads {want}"
            )
        return None
    return None
