"""Adversarial completions: every marker of every format, repeated and nested, after any format's call.

Shared by ``test_adversarial.py`` (totality: no exception, nothing lost) and
``bench/bench_decode.py --sweep`` (the same texts at 20 KB and 200 KB, timed: linear or not).

Each text is a *prefix* (nothing, or the format's own call opened up to an argument value, so the
flood lands in the deepest states) followed by one marker in one *shape*:

- ``repeated``: the marker again and again;
- ``nested``: the marker, then every kind of opening bracket, again and again (markers inside
  ever deeper structures);
- ``deep``: the marker once, then JSON and Python brackets nested as deep as the size allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

from chatcodec import load_template
from chatcodec.decoders import Decoder, detect, formats
from chatcodec.decoders.format import Format
from chatcodec.decoders.learn import VALUE_A
from chatcodec.decoders.registry import get_format, make_decoder

#: templates whose tool-call syntax no catalog format reads: their learned formats are swept too
NOVEL = Path(__file__).parent / "data" / "templates"

_JSON_ARGS = '{"name": "f", "arguments": {"a": '
_LIST_ARGS = "[" + _JSON_ARGS
_MISTRAL = "[TOOL_CALLS]f[ARGS]{" + '"a": '
_QWEN_XML = "<tool_call>\n<function=f>\n<parameter=a>\n"
_DEEPSEEK_V3 = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": '

#: per format: its own call, opened up to the first argument value
CALL_PREFIXES: dict[str, str] = {
    "apertus": '<|tools_prefix|>[{"f": {"a": ',
    "apriel": "<tool_calls>" + _LIST_ARGS,
    "command_r7b": '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": {"a": ',
    "command_r_plus": 'Action:\n```json\n[{"tool_name": "f", "parameters": {"a": ',
    "content": "<think>",
    "deepseek_dsml": '<｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="a" string="false">',
    "deepseek_r1": _DEEPSEEK_V3,
    "deepseek_v3": _DEEPSEEK_V3,
    "deepseek_v3_1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": ',
    "firefunction_v2": "functools" + _LIST_ARGS,
    "function_gemma": "<start_function_call>call:f{a:",
    "functionary_v3_1": '<function=f>{"a": ',
    "functionary_v3_2": 'f\n{"a": ',
    "gemma4": "<|tool_call>call:f{a:",
    "generic": '{"tool_calls": ' + _LIST_ARGS,
    "generic_template_tag": "<tool_call>" + _JSON_ARGS,
    "glm45": "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>",
    "gpt_oss": '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": ',
    "granite": "<|tool_call|>" + _LIST_ARGS,
    "granite_20b_fc": "<function_call> " + _JSON_ARGS,
    "hermes": "<tool_call>" + _JSON_ARGS,
    "hermes_call_id": "<tool_call>call1\n" + _JSON_ARGS,
    "hermes_qwen_agent_code": "<tool_call>" + _JSON_ARGS,
    "json_bare": _JSON_ARGS,
    "json_list": _LIST_ARGS,
    "kimi_k2": '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": ',
    "lfm2": "<|tool_call_start|>" + _LIST_ARGS,
    "llama3_json": '{"name": "f", "parameters": {"a": ',
    "llama4_pythonic": "<|python_start|>[f(a=",
    "magistral": _MISTRAL,
    "midm": "<tool_call>\n" + _JSON_ARGS,
    "minimax_m2": '<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">',
    "mistral_nemo": "[TOOL_CALLS]" + _LIST_ARGS,
    "mistral_pre_v11": "[TOOL_CALLS]" + _LIST_ARGS,
    "mistral_v11": _MISTRAL,
    "mistral_v11_vllm_text": "[TOOL_CALLS]f{" + '"a": ',
    "mistral_v13": "[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{" + '"a": ',
    "nemotron_v2": "<TOOLCALL>" + _LIST_ARGS,
    "nemotron_v3": _QWEN_XML,
    "phi4_mini": "functools" + _LIST_ARGS,
    "phi4_mini_llamacpp": "<|tool_call|>" + _JSON_ARGS,
    "pythonic": "[f(a=",
    "qwen3_coder": _QWEN_XML,
    "reasoning_deepseek_r1": "",
    "reasoning_qwen3": "",
    "seed_oss": "<seed:tool_call>\n<function=f>\n<parameter=a>\n",
}

SHAPES: dict[str, Callable[[str, int], str]] = {
    "repeated": lambda m, size: m * (size // len(m) + 1),
    "nested": lambda m, size: (m + "{[(<") * (size // (len(m) + 4) + 1),
    "deep": lambda m, size: m + '{"a": [' * (size // 7 + 1),
}


@cache
def learned() -> dict[str, tuple[Format, str]]:
    """``learned:NAME`` -> (the format learned from ``data/templates/NAME.jinja``, its call prefix)."""
    found = {}
    for path in sorted(NOVEL.glob("*.jinja")):
        detection = detect(load_template(path))
        if detection.learned is not None:
            rendered = detection.rendered
            at = rendered.find(VALUE_A)
            if at < 0:  # learned from instructions: the call they show, opened
                rendered, at = detection.learned.syntax[0] + '{"name": "f", "arguments": {"a": ', -1
            found[f"learned:{path.stem}"] = (detection.learned, rendered[:at] if at >= 0 else rendered)
    return found


def all_formats() -> list[str]:
    """Every catalog format, then every learned one."""
    return [*formats(), *learned()]


def make(label: str) -> Decoder:
    """The decoder for a catalog format name or a ``learned:NAME`` label."""
    if label in learned():
        return make_decoder(learned()[label][0])
    return make_decoder(get_format(label))


def call_prefix(label: str) -> str:
    return learned()[label][1] if label in learned() else CALL_PREFIXES[label]


def all_markers() -> list[str]:
    """Every literal marker of every format, catalog and learned (tool-call syntax and reasoning tags)."""
    found = {m for name in formats() for m in get_format(name).markers}
    return sorted(found | {m for fmt, _ in learned().values() for m in fmt.markers})


def texts(fmt: str, size: int) -> Iterator[tuple[str, str, str, str]]:
    """``(marker, shape, prefix kind, text)`` for every marker and shape, each text ``size`` long."""
    for marker in all_markers():
        for shape, make_text in SHAPES.items():
            for kind, prefix in (("bare", ""), ("in-call", call_prefix(fmt))):
                if kind == "in-call" and not prefix:
                    continue
                yield marker, shape, kind, (prefix + make_text(marker, size))[:size]
