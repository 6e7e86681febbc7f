"""Every output format as data: its family machine, markers and reasoning tags.

:data:`CATALOG` maps each name to its :class:`Format`. Names follow ``shared/parse-vectors.jsonl``;
three more cover what the corpus needs: ``midm`` (Mi:dm 2.0, Hermes with the newlines always present),
``hermes_call_id`` (``<tool_call>CALL_ID`` then the JSON, the id kept; every Hermes variant accepts
that line) and ``content`` (no tool syntax at all, optional ``<think>`` blocks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from .base import Sink
from .format import Build, Format
from .gemma import ESC, GemmaMachine
from .generic import FunctionaryMachine, GenericMachine
from .harmony import CHANNEL, CONSTRAIN, ENDS, MESSAGE, START, HarmonyMachine
from .jsonstream import CallKeys
from .machine import MachineBase, Options, ThinkSpec
from .pythonic import PythonicMachine
from .tagged_json import (
    Block,
    JsonMachine,
    JsonSpec,
    deepseek_header,
    fenced,
    function_tag_header,
    kimi_header,
    mistral_header,
)
from .xml_args import XmlMachine, XmlSpec

__all__ = ["ALIASES", "CATALOG", "DETECTION_ORDER", "FORMATS", "REASONING_PARSERS", "ReasoningParser", "tagged_spec"]

# -- reasoning tags ------------------------------------------------------------------------------------

THINK = ThinkSpec(("<think>",), ("</think>",))
# Qwen3.5 and Qwen3-Coder may open a call inside their thinking without closing it first.
QWEN_XML_THINK = ThinkSpec(("<think>",), ("</think>",), (("<tool_call>", "<function="),))
# Kimi K2 Thinking may open its tool-call section inside the think block.
KIMI_THINK = ThinkSpec(
    ("<think>",),
    ("</think>",),
    (("<|tool_calls_section_begin|>", None), ("<|tool_call_section_begin|>", None)),
)
SEED_THINK = ThinkSpec(("<seed:think>",), ("</seed:think>",))
GEMMA4_THINK = ThinkSpec(("<|channel>thought",), ("<channel|>",))
# Apriel 1.5 reasons without an opening tag, then answers in [BEGIN FINAL RESPONSE] ... [END FINAL RESPONSE].
APRIEL_THINK = ThinkSpec(("<thinking>",), ("</thinking>", "[BEGIN FINAL RESPONSE]"), (("<tool_calls>", None),))
MISTRAL_THINK = ThinkSpec(("[THINK]",), ("[/THINK]",))
R7B_THINK = ThinkSpec(("<|START_THINKING|>",), ("<|END_THINKING|>",))
APERTUS_THINK = ThinkSpec(("<|inner_prefix|>",), ("<|inner_suffix|>",))
# Granite 3.2 reasons between plain-text markers (vLLM's granite reasoning parser); 3.3 uses <think>.
GRANITE_THINK = ThinkSpec(("<think>", "Here is my thought process:"), ("</think>", "Here is my response:"))

# -- builders ----------------------------------------------------------------------------------------


def _json(spec: JsonSpec) -> Build:
    def build(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
        return JsonMachine(out, opts, spec, think)

    return build


def _xml(spec: XmlSpec) -> Build:
    def build(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
        return XmlMachine(out, opts, spec, think)

    return build


def _of(cls: Callable[..., MachineBase], **kwargs: Any) -> Build:
    def build(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
        return cls(out, opts, think, **kwargs)

    return build


def _json_markers(spec: JsonSpec) -> tuple[str, ...]:
    found: list[str] = [*spec.openers, *spec.strip]
    for block in spec.openers.values():
        found += [*block.close, *block.call_open, *block.call_close, *block.args_suffix]
    return tuple(dict.fromkeys(found))


def _xml_markers(spec: XmlSpec) -> tuple[str, ...]:
    found: Iterable[str | None] = (
        *spec.block_open,
        *spec.block_close,
        spec.call_open,
        spec.call_close,
        spec.param_open,
        spec.param_close,
        spec.key_close,
        spec.value_open,
    )
    return tuple(m for m in found if m)


# -- JSON inside tags ------------------------------------------------------------------------------------

_NAMED_FUNCTION = Block("named", ("</function>",), header=function_tag_header)
_BARE = Block("object", keys=CallKeys(name_first=True, need_args=True))
# llama.cpp's Hermes parser also accepts these wrappers around the call object.
_WRAPPERS = ("<function_call>", "<tool>", "<tools>", "<response>", "<json>", "<xml>", "<JSON>")
HERMES = JsonSpec(
    {
        "<tool_call>": Block("object", ("</tool_call>",), id_line=True, nested=True),
        **{tag: Block("object", (f"</{tag[1:]}",), nested=True) for tag in _WRAPPERS},
        "```json": Block("object", ("```",), nested=True),
        "```xml": Block("object", ("```",), nested=True),
        "<function=": _NAMED_FUNCTION,
        '<function name="': _NAMED_FUNCTION,
        "{": _BARE,
    }
)
QWEN_AGENT = JsonSpec(HERMES.openers, code_block=True)
_LLAMA_ARGS = ("parameters", "arguments")
LLAMA3 = JsonSpec(
    {
        "{": Block("object", (";",), keys=CallKeys(args=_LLAMA_ARGS, name_first=True, need_args=True)),
        "<|python_tag|>": Block("python_tag", (";", "<|eom_id|>", "<|eot_id|>"), keys=CallKeys(args=_LLAMA_ARGS)),
    }
)
FUNCTIONARY_V3_1 = JsonSpec(
    {"<function=": _NAMED_FUNCTION, "<|python_tag|>": Block("python_tag", ("<|eom_id|>", "<|eot_id|>"))}
)
JSON_BARE = JsonSpec({"{": _BARE}, give_up_after_non_call=True)


def tagged_spec(tag: str) -> JsonSpec:
    """Ollama's template-derived tag: a call object or a list after it; ``<x>`` closes with ``</x>``."""
    if tag == "{":
        return JsonSpec({tag: _BARE})
    if tag == "[":
        return JsonSpec({tag: Block("list")})
    close = (f"</{tag[1:]}",) if tag.startswith("<") and tag.endswith(">") and not tag.startswith("</") else ()
    return JsonSpec({tag: Block("auto", close, nested=True)})


def _ollama(default_tag: str) -> Build:
    def build(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
        return JsonMachine(out, opts, tagged_spec(opts.tag or default_tag), think)

    return build


# -- a marker, then a JSON list ------------------------------------------------------------------------


def _list(marker: str, close: tuple[str, ...] = (), keys: CallKeys | None = None) -> JsonSpec:
    return JsonSpec({marker: Block("list", close, keys=keys or CallKeys())})


# Every Mistral format accepts both shapes: the JSON list and name[ARGS]{...} (users ask for both).
MISTRAL = JsonSpec({"[TOOL_CALLS]": Block("mistral", header=mistral_header)})
# Granite 3.1 may write the call marker as plain text, <tool_call>, before the JSON list.
GRANITE = JsonSpec(
    {"<|tool_call|>": Block("list"), "<tool_call>": Block("auto", ("</tool_call>",))},
    strip=("<response>", "</response>"),
)
LFM2 = JsonSpec({"<|tool_call_start|>": Block("any_list", ("<|tool_call_end|>",))})
R7B = JsonSpec(
    {
        "<|START_ACTION|>": Block(
            "list", ("<|END_ACTION|>",), keys=CallKeys(("tool_name",), ("parameters",), ("tool_call_id",))
        )
    },
    strip=("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
)
APERTUS = _list("<|tools_prefix|>", ("<|tools_suffix|>",), CallKeys(name_as_key=True))
APRIEL = JsonSpec({"<tool_calls>": Block("list", ("</tool_calls>",))}, strip=("[END FINAL RESPONSE]",))
_R_PLUS_KEYS = CallKeys(("tool_name",), ("parameters",))
# Command R+: "Action:" then a fenced JSON list (the fence is optional).
COMMAND_R_PLUS = JsonSpec(
    {
        "Action:": Block("auto", nested=True, keys=_R_PLUS_KEYS),
        "```json": Block("object", ("```",), nested=True, keys=_R_PLUS_KEYS),
    }
)

# -- name, then JSON arguments, between special markers ---------------------------------------------------

_DS_BEGIN, _DS_END = "<｜tool▁calls▁begin｜>", ("<｜tool▁calls▁end｜>",)


def _deepseek_section(optional_call_open: bool = False) -> Block:
    return Block(
        "section",
        _DS_END,
        header=deepseek_header,
        call_open=("<｜tool▁call▁begin｜>",),
        call_close=("<｜tool▁call▁end｜>",),
        call_open_optional=optional_call_open,
        args_suffix=("```",),
    )


DEEPSEEK = JsonSpec({_DS_BEGIN: _deepseek_section()})
# R1 distills also write these section markers, and sometimes no per-call marker.
_R1_BEGINS = (
    _DS_BEGIN,
    "<｜tool_calls_begin｜>",
    "<｜tool calls begin｜>",
    "<｜tool\\_calls\\_begin｜>",
    "<｜tool▁calls｜>",
)
DEEPSEEK_R1 = JsonSpec({begin: _deepseek_section(True) for begin in _R1_BEGINS})
_KIMI_SECTION = Block(
    "section",
    ("<|tool_calls_section_end|>", "<|tool_call_section_end|>"),
    header=kimi_header,
    call_open=("<|tool_call_begin|>",),
    call_close=("<|tool_call_end|>",),
)
KIMI = JsonSpec({"<|tool_calls_section_begin|>": _KIMI_SECTION, "<|tool_call_section_begin|>": _KIMI_SECTION})

# -- XML-style arguments --------------------------------------------------------------------------------

QWEN3_CODER = XmlSpec(
    ("<tool_call>",), ("</tool_call>",), "<function=", "</function>", "<parameter=", "</parameter>", bare_call=True
)
SEED_OSS = XmlSpec(
    ("<seed:tool_call>",), ("</seed:tool_call>",), "<function=", "</function>", "<parameter=", "</parameter>"
)
GLM45 = XmlSpec(
    ("<tool_call>",),
    ("</tool_call>",),
    None,
    None,
    "<arg_key>",
    "</arg_value>",
    key_close="</arg_key>",
    value_open="<arg_value>",
)
MINIMAX_M2 = XmlSpec(
    ("<minimax:tool_call>",),
    ("</minimax:tool_call>",),
    "<invoke name=",
    "</invoke>",
    "<parameter name=",
    "</parameter>",
    many_calls=True,
)
DSML = XmlSpec(
    ("<｜DSML｜function_calls>", "<｜DSML｜tool_calls>"),
    ("</｜DSML｜function_calls>", "</｜DSML｜tool_calls>"),
    "<｜DSML｜invoke",
    "</｜DSML｜invoke>",
    "<｜DSML｜parameter",
    "</｜DSML｜parameter>",
    many_calls=True,
)

# -- the table ------------------------------------------------------------------------------------------


def _json_format(name: str, summary: str, spec: JsonSpec, think: ThinkSpec | None = THINK, **kw: Any) -> Format:
    spec = fenced(spec)  # a call in a ```json code block is a call, in every JSON format
    return Format(name, summary, _json(spec), think, syntax=_json_markers(spec), **kw)


def _xml_format(name: str, summary: str, spec: XmlSpec, think: ThinkSpec | None = THINK, **kw: Any) -> Format:
    return Format(name, summary, _xml(spec), think, syntax=_xml_markers(spec), **kw)


_HARMONY_SYNTAX = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)
_GEMMA4 = ("<|tool_call>", "<tool_call|>", '<|"|>')
_GEMMA4_SYNTAX = (*_GEMMA4, "<|tool_response>")
_PLAIN = _json(JsonSpec({}))

FORMATS: list[Format] = [
    # JSON inside tags
    _json_format(
        "hermes", "Hermes / Qwen2.5 / Qwen3: <tool_call>{json}</tool_call>, plus llama.cpp's wrappers", HERMES
    ),
    _json_format("midm", "Mi:dm 2.0: <tool_call>\\n{json}\\n</tool_call> (the Hermes grammar)", HERMES),
    _json_format("hermes_call_id", "ID-prefixed Hermes: <tool_call>CALL_ID\\n{json}\\n</tool_call>", HERMES),
    _json_format(
        "hermes_qwen_agent_code",
        "Qwen-Agent Hermes: code in <code>...</code> after the call object",
        QWEN_AGENT,
    ),
    _json_format("llama3_json", 'Llama 3.x: bare {"name", "parameters"}, \';\'-separated, <|python_tag|>', LLAMA3),
    _json_format(
        "functionary_v3_1",
        "Functionary v3.1: <function=f>{...}</function>; code after <|python_tag|>",
        FUNCTIONARY_V3_1,
        None,
    ),
    _json_format(
        "granite_20b_fc",
        "Granite 20B FC: <function_call> {...} per call",
        JsonSpec({"<function_call>": Block("object")}),
        None,
    ),
    _json_format(
        "phi4_mini_llamacpp",
        "Phi-4-mini, llama.cpp's template: <|tool_call|>{...}<|/tool_call|>",
        JsonSpec({"<|tool_call|>": Block("object", ("<|/tool_call|>",))}),
        None,
    ),
    _json_format(
        "json_bare",
        "Ollama: bare JSON call objects; after a JSON object that is not a call, only text",
        JSON_BARE,
        None,
    ),
    Format(
        "generic_template_tag",
        "Ollama: JSON calls after the tag derived from the template (tag=...)",
        _ollama("<tool_call>"),
        THINK,
        syntax=("<tool_call>", "</tool_call>"),
        uses_tag=True,
    ),
    Format(
        "json_list",
        "Ollama with the tag '[': a JSON list of calls",
        _ollama("["),
        None,
        syntax=("[",),
        uses_tag=True,
    ),
    # a marker, then a JSON list
    _json_format(
        "mistral_pre_v11",
        'Mistral before v11 (mistral-common v2, v3, v7): [TOOL_CALLS] [{"name", "arguments"(, "id")}], also v11\'s',
        MISTRAL,
        None,
    ),
    _json_format("mistral_nemo", 'Mistral Nemo: [TOOL_CALLS][{..., "id"}]', MISTRAL, None),
    _json_format(
        "mistral_v11",
        "Mistral v11+: [TOOL_CALLS]f[ARGS]{...} per call (mistral-common v13 writes this), [THINK] reasoning",
        MISTRAL,
        MISTRAL_THINK,
    ),
    _json_format(
        "mistral_v13",
        "Mistral: [TOOL_CALLS]f[CALL_ID]id[ARGS]{...} (mistral-common v11 writes this when calls have ids)",
        MISTRAL,
        MISTRAL_THINK,
    ),
    _json_format(
        "mistral_v11_vllm_text",
        "Mistral v11 as decoded text without [ARGS]: [TOOL_CALLS]f{...}",
        MISTRAL,
        MISTRAL_THINK,
    ),
    _json_format("magistral", "Magistral: [THINK]...[/THINK] reasoning, Mistral tool calls", MISTRAL, MISTRAL_THINK),
    _json_format(
        "granite",
        "Granite 3.x: <|tool_call|>[...] (3.1: <tool_call>), <think> or 'Here is my thought process:', <response>",
        GRANITE,
        GRANITE_THINK,
    ),
    _json_format("phi4_mini", "Phi-4-mini: functools[{...}]", _list("functools"), None),
    _json_format("firefunction_v2", "Firefunction v2: ' functools[{...}]'", _list("functools"), None),
    _json_format("lfm2", "LFM2: <|tool_call_start|>[...]<|tool_call_end|>, a JSON list or Python calls", LFM2),
    _json_format(
        "nemotron_v2",
        "Nemotron Nano v2: <TOOLCALL>[...]</TOOLCALL>",
        _list("<TOOLCALL>", ("</TOOLCALL>",)),
        opens_think=True,
    ),
    _json_format(
        "apertus",
        'Apertus: <|tools_prefix|>[{"f": {...}}]<|tools_suffix|>, <|inner_prefix|>',
        APERTUS,
        APERTUS_THINK,
    ),
    _json_format(
        "command_r7b",
        "Command R7B: <|START_ACTION|>[{tool_call_id, tool_name, parameters}]...",
        R7B,
        R7B_THINK,
    ),
    # name, then JSON arguments, between special markers
    _json_format(
        "apriel",
        "Apriel 1.5: reasoning, then [BEGIN FINAL RESPONSE]; calls in <tool_calls>[...]",
        APRIEL,
        APRIEL_THINK,
        forced_open=True,
    ),
    _json_format(
        "command_r_plus",
        "Command R+: Action: then a fenced JSON list of {tool_name, parameters}",
        COMMAND_R_PLUS,
        None,
    ),
    _json_format("deepseek_v3", "DeepSeek V3: function<｜tool▁sep｜>f + fenced JSON in a tool-calls section", DEEPSEEK),
    _json_format(
        "deepseek_r1",
        "DeepSeek R1: V3 calls, forced-open <think>, distill marker variants",
        DEEPSEEK_R1,
        opens_think=True,
    ),
    _json_format(
        "deepseek_v3_1",
        "DeepSeek V3.1: f<｜tool▁sep｜>{...} in a tool-calls section",
        DEEPSEEK,
        opens_think=True,
    ),
    _json_format(
        "kimi_k2",
        "Kimi K2: functions.f:N<|tool_call_argument_begin|>{...} in sections; ids kept",
        KIMI,
        KIMI_THINK,
    ),
    # XML-style arguments typed from the schema
    _xml_format(
        "qwen3_coder",
        "Qwen3-Coder / Qwen3.5: <tool_call><function=f><parameter=k>v</parameter>...",
        QWEN3_CODER,
        QWEN_XML_THINK,
        opens_think=True,
    ),
    _xml_format(
        "nemotron_v3",
        "Nemotron 3 Nano: Qwen3-Coder XML calls, forced-open <think>",
        QWEN3_CODER,
        QWEN_XML_THINK,
        opens_think=True,
    ),
    _xml_format(
        "seed_oss",
        "Seed-OSS: <seed:think>, <seed:tool_call><function=f><parameter=k>...",
        SEED_OSS,
        SEED_THINK,
        opens_think=True,
    ),
    _xml_format("glm45", "GLM 4.5+: <tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>", GLM45),
    _xml_format(
        "minimax_m2",
        'MiniMax-M2: <minimax:tool_call><invoke name="f"><parameter name="k">...',
        MINIMAX_M2,
        opens_think=True,
    ),
    _xml_format(
        "deepseek_dsml",
        "DeepSeek V3.2/V4 DSML: <｜DSML｜invoke name=...><｜DSML｜parameter string=...>",
        DSML,
        opens_think=True,
    ),
    # Python calls
    Format(
        "pythonic",
        "Python call lists: [f(a='x'), g(b=1)], also in a ```python fence",
        _of(PythonicMachine),
        THINK,
        syntax=("[", "]", "```python", "```"),
    ),
    Format(
        "llama4_pythonic",
        "Llama 4: a Python call list in <|python_start|>...<|python_end|>",
        _of(PythonicMachine, start="<|python_start|>", end="<|python_end|>"),
        syntax=("<|python_start|>", "<|python_end|>", "[", "]", "```python", "```"),
    ),
    Format(
        "function_gemma",
        "FunctionGemma: <start_function_call>call:f{k:<escape>v<escape>}...",
        _of(GemmaMachine),
        syntax=(GemmaMachine.OPEN, GemmaMachine.CLOSE, ESC),
    ),
    Format(
        "gemma4",
        'Gemma 4: <|tool_call>call:f{k:<|"|>v<|"|>}<tool_call|>, <|channel>thought reasoning',
        _of(GemmaMachine, markers=_GEMMA4, response=("<|tool_response>",)),
        GEMMA4_THINK,
        syntax=_GEMMA4_SYNTAX,
    ),
    # channels, envelopes, recipients
    Format(
        "gpt_oss",
        "gpt-oss harmony: analysis / commentary to=functions.f / final channels",
        _of(HarmonyMachine),
        syntax=_HARMONY_SYNTAX,
    ),
    Format(
        "generic",
        'llama.cpp generic JSON: {"tool_calls": [...]}, {"tool_call": ...}, {"response": ...}',
        _of(GenericMachine),
        THINK,
        syntax=("{", "}"),
    ),
    Format(
        "functionary_v3_2",
        "Functionary v3.2: recipient lines (all / name / python), >>> between",
        _of(FunctionaryMachine),
        syntax=(FunctionaryMachine.SEP, "all"),
    ),
    # reasoning only
    Format(
        "reasoning_deepseek_r1",
        "Reasoning only, vLLM deepseek_r1 rules: the prompt opened <think>",
        _PLAIN,
        THINK,
        forced_open=True,
        opens_think=True,
    ),
    Format(
        "reasoning_qwen3",
        "Reasoning only, vLLM qwen3 rules: open unless enable_thinking=False; <tool_call><function= also ends it",
        _PLAIN,
        QWEN_XML_THINK,
        forced_open=True,
        opens_think=True,
    ),
    Format("content", "Plain text with an optional leading <think> block; no tool calls", _PLAIN, THINK),
]

#: detection preference (see :attr:`Format.rank`): ties go to the format listed first.
#: llama3_json comes first: on bare JSON it ties with Hermes' bare-object fallback and is the real
#: owner; wherever Hermes tags are present, Hermes explains more of the text and wins outright.
#: Formats not listed are never detected: variants that add nothing to detection, Ollama's
#: runtime heuristics, and reasoning-only formats.
DETECTION_ORDER = (
    "llama3_json", "hermes", "qwen3_coder", "glm45", "minimax_m2", "deepseek_dsml", "seed_oss", "kimi_k2",
    "deepseek_v3_1", "deepseek_v3", "deepseek_r1", "mistral_v11", "mistral_v13", "mistral_pre_v11", "gpt_oss",
    "command_r7b", "command_r_plus", "apriel", "granite", "nemotron_v2", "lfm2", "apertus", "phi4_mini",
    "phi4_mini_llamacpp", "gemma4", "function_gemma", "functionary_v3_2", "functionary_v3_1", "llama4_pythonic",
    "pythonic", "granite_20b_fc", "generic",
)  # fmt: skip
#: Mistral templates reject any call id but nine alphanumerics
_MISTRAL_IDS = frozenset({
    "mistral_pre_v11", "mistral_nemo", "mistral_v11", "mistral_v13", "mistral_v11_vllm_text", "magistral",
})  # fmt: skip

_RANKS = {name: rank for rank, name in enumerate(DETECTION_ORDER)}
CATALOG: dict[str, Format] = {
    f.name: dataclasses.replace(f, rank=_RANKS.get(f.name), id_style="mistral" if f.name in _MISTRAL_IDS else "openai")
    for f in FORMATS
}

# -- names users already know ------------------------------------------------------------------------

#: vLLM's ``--tool-call-parser`` names, and llama.cpp's chat-format names, for the formats they parse
ALIASES: dict[str, str] = {
    # vLLM
    "granite4": "hermes",
    "mistral": "mistral_v11",
    "llama4_json": "llama3_json",
    "olmo3": "pythonic",
    "granite-20b-fc": "granite_20b_fc",
    "phi4_mini_json": "phi4_mini",
    "deepseek_v31": "deepseek_v3_1",
    "deepseek_v32": "deepseek_dsml",
    "deepseek_v4": "deepseek_dsml",
    "glm4_moe": "glm45",
    "glm47": "glm45",
    "qwen3_xml": "qwen3_coder",
    "openai": "gpt_oss",
    "functiongemma": "function_gemma",
    "mimo": "hermes",
    "cohere_command3": "command_r7b",
    "cohere_command4": "command_r7b",
    # mistral-common's tokenizer versions before v11 (TokenizerVersion): one JSON list of calls
    "mistral_v2": "mistral_pre_v11",
    "mistral_v3": "mistral_pre_v11",
    "mistral_v7": "mistral_pre_v11",
    # llama.cpp (common_chat_format_name)
    "Content-only": "content",
    "Generic": "generic",
    "Mistral Nemo": "mistral_nemo",
    "Magistral": "magistral",
    "Llama 3.x": "llama3_json",
    "Llama 3.x with builtin tools": "llama3_json",
    "DeepSeek R1": "deepseek_r1",
    "FireFunction v2": "firefunction_v2",
    "Functionary v3.2": "functionary_v3_2",
    "Functionary v3.1 Llama 3.1": "functionary_v3_1",
    "DeepSeek V3.1": "deepseek_v3_1",
    "Hermes 2 Pro": "hermes",
    "Command R7B": "command_r7b",
    "Granite": "granite",
    "GPT-OSS": "gpt_oss",
    "Seed-OSS": "seed_oss",
    "Nemotron V2": "nemotron_v2",
    "Apertus": "apertus",
    "LFM2 with JSON tools": "lfm2",
    "MiniMax-M2": "minimax_m2",
    "GLM 4.5": "glm45",
    "Kimi K2": "kimi_k2",
    "Qwen3 Coder": "qwen3_coder",
    "Apriel 1.5": "apriel",
    "Xiaomi MiMo": "hermes",
}


@dataclasses.dataclass(frozen=True, slots=True)
class ReasoningParser:
    """A vLLM ``--reasoning-parser``: its tags, and whether it assumes the prompt opened the block
    (``forced_open``; ``opens_think``: only when ``enable_thinking`` is true)."""

    think: ThinkSpec
    forced_open: bool = False
    opens_think: bool = False


#: vLLM's ``--reasoning-parser`` names
REASONING_PARSERS: dict[str, ReasoningParser] = {
    "deepseek_r1": ReasoningParser(THINK, forced_open=True, opens_think=True),
    "deepseek_v3": ReasoningParser(THINK, opens_think=True),
    "qwen3": ReasoningParser(QWEN_XML_THINK, forced_open=True, opens_think=True),
    "glm45": ReasoningParser(THINK),
    "granite": ReasoningParser(GRANITE_THINK),
    "mistral": ReasoningParser(MISTRAL_THINK),
    "minimax_m2": ReasoningParser(THINK, forced_open=True, opens_think=True),
    "seed_oss": ReasoningParser(SEED_THINK, forced_open=True, opens_think=True),
    "kimi_k2": ReasoningParser(KIMI_THINK),
    "olmo3": ReasoningParser(THINK),
    "holo2": ReasoningParser(THINK, forced_open=True, opens_think=True),
}
