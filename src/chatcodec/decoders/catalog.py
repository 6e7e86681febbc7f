"""Every output format as data: markers, blocks, reasoning tags. Importing this fills the registry.

Names follow ``shared/parse-vectors.jsonl``. Two more cover the corpus's seed templates: ``midm``
(Mi:dm 2.0, Hermes with the newlines always present) and ``hermes_call_id`` (``<tool_call>ID`` then
the JSON, the call id kept as the tool call's id; every Hermes variant accepts that line too).
"""

from __future__ import annotations

from .base import Sink
from .jsonstream import CallKeys
from .machine import MachineBase, Options, ThinkSpec
from .registry import Build, Format, register
from .generic import FunctionaryMachine, GenericMachine
from .harmony import HarmonyMachine
from .pythonic import GemmaMachine, PythonicMachine
from .xml_args import XmlMachine, XmlSpec
from .tagged_json import (
    Block,
    JsonMachine,
    JsonSpec,
    deepseek_header,
    function_tag_header,
    kimi_header,
    mistral_header,
)

THINK = ThinkSpec(("<think>",), ("</think>",))
# Qwen3.5 and Qwen3-Coder may open a call inside their thinking without closing it first.
QWEN_XML_THINK = ThinkSpec(("<think>",), ("</think>",), (("<tool_call>", "<function="),))
KIMI_THINK = ThinkSpec(
    ("<think>",),
    ("</think>",),
    (("<|tool_calls_section_begin|>", None), ("<|tool_call_section_begin|>", None)),
)
SEED_THINK = ThinkSpec(("<seed:think>",), ("</seed:think>",))
MISTRAL_THINK = ThinkSpec(("[THINK]",), ("[/THINK]",))
R7B_THINK = ThinkSpec(("<|START_THINKING|>",), ("<|END_THINKING|>",))
APERTUS_THINK = ThinkSpec(("<|inner_prefix|>",), ("<|inner_suffix|>",))


def json_format(spec: JsonSpec) -> Build:
    def build(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
        if opts.tag is not None and spec.openers.keys() == {"<tool_call>"} | _HERMES_EXTRA.keys():
            return JsonMachine(out, opts, _tagged_spec(opts.tag), think)
        return JsonMachine(out, opts, spec, think)

    return build


# -- JSON inside tags ------------------------------------------------------------------------------

_NAMED_FUNCTION = Block("named", ("</function>",), header=function_tag_header)
_BARE = Block("object", keys=CallKeys(name_first=True, need_args=True))
# llama.cpp's Hermes parser also accepts these wrappers around the call object.
_HERMES_EXTRA: dict[str, Block] = {
    **{
        tag: Block("object", (f"</{tag[1:]}",), nested=True)
        for tag in ("<function_call>", "<tool>", "<tools>", "<response>", "<json>", "<xml>", "<JSON>")
    },
    "```json": Block("object", ("```",), nested=True),
    "```xml": Block("object", ("```",), nested=True),
    "<function=": _NAMED_FUNCTION,
    '<function name="': _NAMED_FUNCTION,
    "{": _BARE,
}
HERMES = JsonSpec({"<tool_call>": Block("object", ("</tool_call>",), id_line=True, nested=True), **_HERMES_EXTRA})


def _tagged_spec(tag: str) -> JsonSpec:
    """Ollama's template-derived tag: a call object or a list after it; ``<x>`` closes with ``</x>``."""
    close = (f"</{tag[1:]}",) if tag.startswith("<") and tag.endswith(">") and not tag.startswith("</") else ()
    if tag in ("{", "["):
        block = _BARE if tag == "{" else Block("list")
        return JsonSpec({tag: block})
    return JsonSpec({tag: Block("auto", close, nested=True)})


_LLAMA_KEYS = CallKeys(args=("parameters", "arguments"), name_first=True, need_args=True)
LLAMA3 = JsonSpec(
    {
        "{": Block("object", (";",), keys=_LLAMA_KEYS),
        "<|python_tag|>": Block(
            "python_tag", (";", "<|eom_id|>", "<|eot_id|>"), keys=CallKeys(args=("parameters", "arguments"))
        ),
    }
)

_SIMPLE_OBJECT_FORMATS = {
    "granite_20b_fc": ("Granite 20B FC: <function_call> {...} per call", "<function_call>", ()),
    "phi4_mini_llamacpp": ("Phi-4-mini, llama.cpp template: <|tool_call|>{...}<|/tool_call|>",
                           "<|tool_call|>", ("<|/tool_call|>",)),
}

# -- a marker, then a JSON list ---------------------------------------------------------------------


def _list(marker: str, close: tuple[str, ...] = (), keys: CallKeys | None = None) -> JsonSpec:
    return JsonSpec({marker: Block("list", close, keys=keys or CallKeys())})


MISTRAL = JsonSpec({"[TOOL_CALLS]": Block("mistral", header=mistral_header)})

# -- name, then JSON arguments, between special markers ----------------------------------------------

_DS_CALL = dict(
    call_open=("<｜tool▁call▁begin｜>",),
    call_close=("<｜tool▁call▁end｜>",),
    header=deepseek_header,
    args_suffix=("```",),
)
_DS_BEGIN = "<｜tool▁calls▁begin｜>"
_DS_END = ("<｜tool▁calls▁end｜>",)
DEEPSEEK = JsonSpec({_DS_BEGIN: Block("section", _DS_END, **_DS_CALL)})  # type: ignore[arg-type]
# R1 distills also write these section markers, and sometimes no per-call marker.
_R1_BEGINS = (_DS_BEGIN, "<｜tool_calls_begin｜>", "<｜tool calls begin｜>", "<｜tool\\_calls\\_begin｜>", "<｜tool▁calls｜>")
DEEPSEEK_R1 = JsonSpec(
    {
        begin: Block("section", _DS_END, call_open_optional=True, **_DS_CALL)  # type: ignore[arg-type]
        for begin in _R1_BEGINS
    }
)
_KIMI_SECTION = Block(
    "section",
    ("<|tool_calls_section_end|>", "<|tool_call_section_end|>"),
    call_open=("<|tool_call_begin|>",),
    call_close=("<|tool_call_end|>",),
    header=kimi_header,
)
KIMI = JsonSpec({"<|tool_calls_section_begin|>": _KIMI_SECTION, "<|tool_call_section_begin|>": _KIMI_SECTION})
FUNCTIONARY_V3_1 = JsonSpec(
    {"<function=": _NAMED_FUNCTION, "<|python_tag|>": Block("python_tag", ("<|eom_id|>", "<|eot_id|>"))}
)


def _register_json() -> None:
    def add(name: str, summary: str, spec: JsonSpec, think: ThinkSpec | None = THINK, **kw: bool) -> None:
        register(Format(name, summary, json_format(spec), think, **kw))

    add("hermes", "Hermes / Qwen2.5 / Qwen3: <tool_call>{json}</tool_call>, and llama.cpp's tolerated wrappers",
        HERMES)
    add("midm", "Mi:dm 2.0: <tool_call>\\n{json}\\n</tool_call> (the Hermes grammar)", HERMES)
    add("hermes_call_id", "ID-prefixed Hermes: <tool_call>CALL_ID\\n{json}\\n</tool_call>", HERMES)
    add("hermes_qwen_agent_code", "Qwen-Agent Hermes with code in <code>...</code> after the call object",
        JsonSpec(HERMES.openers, code_block=True))
    add("generic_template_tag", "Ollama: JSON calls after the tag derived from the template (tag=...)", HERMES)
    add("json_bare", "Ollama: bare JSON call objects; after a non-call object, everything is content",
        JsonSpec({"{": _BARE}, give_up_after_non_call=True), None)
    add("json_list", "Ollama with the tag '[': a JSON list of calls", JsonSpec({"[": Block("list")}), None)
    add("llama3_json", "Llama 3.x: bare {\"name\", \"parameters\"}, ';'-separated, optional <|python_tag|>", LLAMA3)
    add("functionary_v3_1", "Functionary v3.1: <function=f>{...}</function>; raw code after <|python_tag|>",
        FUNCTIONARY_V3_1, None)
    for name, (summary, marker, close) in _SIMPLE_OBJECT_FORMATS.items():
        add(name, summary, JsonSpec({marker: Block("object", close)}))

    add("mistral_pre_v11", "Mistral pre-v11: [TOOL_CALLS][{...}] (also accepts the v11 shape)", MISTRAL, None)
    add("mistral_nemo", "Mistral Nemo: [TOOL_CALLS][{..., \"id\"}]", MISTRAL, None)
    add("mistral_v11", "Mistral v11+: [TOOL_CALLS]f[ARGS]{...} per call, [THINK] reasoning", MISTRAL,
        MISTRAL_THINK)
    add("mistral_v13", "Mistral v13: [TOOL_CALLS]f[CALL_ID]id[ARGS]{...}", MISTRAL, MISTRAL_THINK)
    add("mistral_v11_vllm_text", "Mistral v11 as decoded text without [ARGS]: [TOOL_CALLS]f{...}", MISTRAL,
        MISTRAL_THINK)
    add("magistral", "Magistral: [THINK]...[/THINK] reasoning, Mistral tool calls", MISTRAL, MISTRAL_THINK)
    add("granite", "Granite 3.x: <|tool_call|>[...], <think> and <response>",
        JsonSpec({"<|tool_call|>": Block("list")}, strip=("<response>", "</response>")))
    add("phi4_mini", "Phi-4-mini: functools[{...}]", _list("functools"), None)
    add("firefunction_v2", "Firefunction v2: ' functools[{...}]'", _list("functools"), None)
    add("lfm2", "LFM2: <|tool_call_start|>[...]<|tool_call_end|>, a JSON list or Python calls",
        JsonSpec({"<|tool_call_start|>": Block("any_list", ("<|tool_call_end|>",))}))
    add("nemotron_v2", "Nemotron Nano v2: <TOOLCALL>[...]</TOOLCALL>", _list("<TOOLCALL>", ("</TOOLCALL>",)),
        THINK, opens_think=True)
    add("apertus", "Apertus: <|tools_prefix|>[{\"f\": {...}}]<|tools_suffix|>, <|inner_prefix|> reasoning",
        _list("<|tools_prefix|>", ("<|tools_suffix|>",), CallKeys(name_as_key=True)), APERTUS_THINK)
    add("command_r7b", "Command R7B: <|START_ACTION|>[{tool_call_id, tool_name, parameters}]<|END_ACTION|>",
        JsonSpec(
            {"<|START_ACTION|>": Block("list", ("<|END_ACTION|>",),
                                       keys=CallKeys(("tool_name",), ("parameters",), ("tool_call_id",)))},
            strip=("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
        ),
        R7B_THINK)
    add("deepseek_v3", "DeepSeek V3: function<｜tool▁sep｜>f + fenced JSON, in a tool-calls section", DEEPSEEK)
    add("deepseek_r1", "DeepSeek R1: V3 calls, forced-open <think>, distill marker variants", DEEPSEEK_R1,
        opens_think=True)
    add("deepseek_v3_1", "DeepSeek V3.1: f<｜tool▁sep｜>{...} in a tool-calls section", DEEPSEEK, opens_think=True)
    add("kimi_k2", "Kimi K2: sections of functions.f:N<|tool_call_argument_begin|>{...}; ids kept", KIMI,
        KIMI_THINK)


_register_json()


# -- XML-style arguments --------------------------------------------------------------------------

def xml_format(spec: XmlSpec) -> Build:
    def build(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
        return XmlMachine(out, opts, spec, think)

    return build


_QWEN_INNER = dict(call_open="<function=", call_close="</function>", param_open="<parameter=",
                   param_close="</parameter>")
QWEN3_CODER = XmlSpec(("<tool_call>",), ("</tool_call>",), bare_call=True, **_QWEN_INNER)  # type: ignore[arg-type]
SEED_OSS = XmlSpec(("<seed:tool_call>",), ("</seed:tool_call>",), **_QWEN_INNER)  # type: ignore[arg-type]
GLM45 = XmlSpec(("<tool_call>",), ("</tool_call>",), None, None, "<arg_key>", "</arg_value>",
                key_close="</arg_key>", value_open="<arg_value>")
MINIMAX_M2 = XmlSpec(("<minimax:tool_call>",), ("</minimax:tool_call>",), "<invoke name=", "</invoke>",
                     "<parameter name=", "</parameter>", many_calls=True)
DSML = XmlSpec(("<｜DSML｜function_calls>", "<｜DSML｜tool_calls>"), ("</｜DSML｜function_calls>", "</｜DSML｜tool_calls>"),
               "<｜DSML｜invoke", "</｜DSML｜invoke>", "<｜DSML｜parameter", "</｜DSML｜parameter>", many_calls=True)


def _register_xml() -> None:
    def add(name: str, summary: str, spec: XmlSpec, think: ThinkSpec | None, **kw: bool) -> None:
        register(Format(name, summary, xml_format(spec), think, **kw))

    add("qwen3_coder", "Qwen3-Coder / Qwen3.5 XML: <tool_call><function=f><parameter=k>v</parameter>...",
        QWEN3_CODER, QWEN_XML_THINK, opens_think=True)
    add("nemotron_v3", "Nemotron 3 Nano: Qwen3-Coder XML calls, forced-open <think>", QWEN3_CODER,
        QWEN_XML_THINK, opens_think=True)
    add("seed_oss", "Seed-OSS: <seed:think>, <seed:tool_call><function=f><parameter=k>...", SEED_OSS,
        SEED_THINK, opens_think=True)
    add("glm45", "GLM 4.5+: <tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>", GLM45, THINK)
    add("minimax_m2", "MiniMax-M2: <minimax:tool_call><invoke name=\"f\"><parameter name=\"k\">v...",
        MINIMAX_M2, THINK, opens_think=True)
    add("deepseek_dsml", "DeepSeek V3.2/V4 DSML: <｜DSML｜invoke name=...><｜DSML｜parameter ... string=...>",
        DSML, THINK, opens_think=True)


_register_xml()


# -- reasoning only ---------------------------------------------------------------------------------

class PlainMachine(MachineBase):
    """Reasoning, then content: no tool calls."""

    def s_body(self, final: bool) -> bool:
        pos = self.pos
        self.emit(len(self.buf))
        return len(self.buf) > pos


def _plain(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
    return PlainMachine(out, opts, think)


register(Format("reasoning_deepseek_r1", "Reasoning only, vLLM deepseek_r1 rules: the prompt opened <think>",
                _plain, THINK, forced_open=True, opens_think=True))
register(Format("reasoning_qwen3", "Reasoning only, vLLM qwen3 rules: open unless enable_thinking=False; "
                "<tool_call><function= ends it", _plain, QWEN_XML_THINK, forced_open=True, opens_think=True))
register(Format("content", "Plain text with an optional leading <think> block, no tool calls", _plain, THINK))


# -- Python calls and FunctionGemma -----------------------------------------------------------------

def _pythonic(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
    return PythonicMachine(out, opts, think)


def _llama4(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
    return PythonicMachine(out, opts, think, start="<|python_start|>", end="<|python_end|>")


def _gemma(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
    return GemmaMachine(out, opts, think)


register(Format("pythonic", "Python call lists: [f(a='x'), g(b=1)]", _pythonic, THINK))
register(Format("llama4_pythonic", "Llama 4: a Python call list in <|python_start|>...<|python_end|>", _llama4))
register(Format("function_gemma", "FunctionGemma: <start_function_call>call:f{k:<escape>v<escape>}...",
                _gemma))


# -- channels, envelopes, recipients --------------------------------------------------------------

def _harmony(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
    return HarmonyMachine(out, opts)


def _generic(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
    return GenericMachine(out, opts, think)


def _functionary(out: Sink, opts: Options, think: ThinkSpec | None) -> MachineBase:
    return FunctionaryMachine(out, opts, think)


register(Format("gpt_oss", "gpt-oss harmony: analysis / commentary to=functions.f / final channels", _harmony))
register(Format("generic", "llama.cpp generic JSON: {\"tool_calls\": [...]}, {\"tool_call\": ...} or "
                "{\"response\": ...}", _generic, THINK))
register(Format("functionary_v3_2", "Functionary v3.2: recipient lines (all / name / python), >>> between",
                _functionary))
