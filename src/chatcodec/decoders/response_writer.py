"""Write transformers' ``response_template`` for a :class:`Format`: its reasoning tags, content and tool calls.

Each catalog format's tool-call syntax is one field (:data:`CALL_FIELDS`), written with patterns that
allow the whitespace chatcodec's own machine allows. A format the declarative language cannot say is in
:data:`UNSAID` with what cannot be said, and writing it raises :class:`~chatcodec.DecodeError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..exceptions import DecodeError
from .format import Format

__all__ = ["CALL_FIELDS", "UNSAID", "write_response_template"]

_CALL = {"type": "function", "function": "{content}"}
_NAMED = {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}
_WITH_ID = {"id": "{id}", "type": "function", "function": {"name": "{name}", "arguments": "{content}"}}
_EACH_ONE = {"type": "function", "function": {"name": "{content.name}", "arguments": "{content.arguments}"}}
_EACH = {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}}
_JSON_VALUE = {"name": "json", "args": {"allow_non_json": True}}


def _alt(markers: Iterable[str]) -> str:
    return "|".join(re.escape(m) for m in sorted(dict.fromkeys(markers), key=len, reverse=True))


def _xml_field(open_pattern: str, close_pattern: str, tag_pattern: str) -> dict[str, Any]:
    return {
        "open_pattern": open_pattern,
        "close_pattern": close_pattern,
        "repeats": True,
        "content": "xml-inline",
        "content_args": {"tag_pattern": tag_pattern, "value_parser": _JSON_VALUE},
        "transform": _NAMED,
    }


def _json_field(open_: str, close_pattern: str, *, literal: bool, transform: Any = _CALL, each: bool = False,
                args: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    found: dict[str, Any] = {"open" if literal else "open_pattern": open_, "close_pattern": close_pattern}
    # a region that holds a list of calls is the whole list (its calls are not appended as one item)
    found.update(repeats=not each, content="json")
    if args:
        found["content_args"] = dict(args)
    found["transform"] = transform
    if each:
        found["transform_each"] = True
    return found


_QWEN_XML = _xml_field(
    r"<(?:tool_call>\s*<)?function=(?P<name>[^\n>]+)>",
    r"</function>\s*(?:</tool_call>\s*)?",
    r"<parameter=(?P<key>[^>\n]+)>\s*(?P<value>.*?)\s*</parameter>",
)
_DS_SEP, _DS_CALL_END, _DS_END = (
    re.escape(m) for m in ("<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")
)
# A region the text ends in closes there, so no close says "or the end" (\Z): at the edge of a stream, an
# empty match there would hide a delimiter that has only begun to arrive.
# Patterns start with a literal wherever they can (an optional section opener goes after the first "<"):
# the regex module searches a pattern that begins with a literal far faster than one that begins optionally.
_MISTRAL_CLOSE = r"(?=\[TOOL_CALLS\]|</s>)"
_GEMMA_ARGS = {"unquoted_keys": True, "string_delims": [['<|"|>', '<|"|>']]}

#: each catalog format's tool-call field, and the content markers it strips
CALL_FIELDS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "hermes": (_json_field("<tool_call>", r"</tool_call>\s*", literal=True), ()),
    "hermes_call_id": (
        _json_field(
            r"<tool_call>(?P<id>[^\s{]*)\s*",
            r"</tool_call>\s*",
            literal=False,
            transform={"id": "{id}", "type": "function", "function": "{content}"},
        ),
        (),
    ),
    "qwen3_coder": (_QWEN_XML, ()),
    "seed_oss": (
        _xml_field(
            r"<(?:seed:tool_call>\s*<)?function=(?P<name>[^\n>]+)>",
            r"</function>\s*(?:</seed:tool_call>\s*)?",
            r"<parameter=(?P<key>[^>\n]+)>\s*(?P<value>.*?)\s*</parameter>",
        ),
        (),
    ),
    "glm45": (
        _xml_field(
            r"<tool_call>\s*(?P<name>[^\s<]+)\s*",
            r"</tool_call>\s*",
            r"<arg_key>\s*(?P<key>[^<]+?)\s*</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>",
        ),
        (),
    ),
    "minimax_m2": (
        _xml_field(
            r'<(?:minimax:tool_call>\s*<)?invoke name="?(?P<name>[^">\n]+)"?>',
            r"</invoke>\s*(?:</minimax:tool_call>\s*)?",
            r'<parameter name="?(?P<key>[^">\n]+)"?>\s*(?P<value>.*?)\s*</parameter>',
        ),
        (),
    ),
    "deepseek_dsml": (
        _xml_field(
            r'<(?:｜DSML｜(?:function|tool)_calls>\s*<)?｜DSML｜invoke name="(?P<name>[^"]+)"\s*>',
            r"</｜DSML｜invoke>\s*(?:</｜DSML｜(?:function|tool)_calls>\s*)?",
            r'<｜DSML｜parameter name="(?P<key>[^"]+)"[^>]*>(?P<value>.*?)</｜DSML｜parameter>',
        ),
        (),
    ),
    "kimi_k2": (
        _json_field(
            r"<\|(?:tool_calls?_section_begin\|>\s*<\|)?tool_call_begin\|>\s*"
            r"(?P<id>(?:functions\.)?(?P<name>[^\s:<]+)(?::\d+)?)\s*<\|tool_call_argument_begin\|>",
            r"<\|tool_call_end\|>\s*(?:<\|tool_calls?_section_end\|>\s*)?",
            literal=False,
            transform=_WITH_ID,
        ),
        (),
    ),
    "deepseek_v3_1": (
        _json_field(
            rf"<｜(?:tool▁calls▁begin｜>\s*<｜)?tool▁call▁begin｜>(?P<name>[^<]+?){_DS_SEP}",
            rf"{_DS_CALL_END}\s*(?:{_DS_END}\s*)?",
            literal=False,
            transform=_NAMED,
        ),
        (),
    ),
    "deepseek_v3": (
        _json_field(
            rf"<｜(?:tool▁calls▁begin｜>\s*<｜)?tool▁call▁begin｜>function{_DS_SEP}(?P<name>[^\n<]+?)\s*```json\s*",
            rf"\s*```\s*{_DS_CALL_END}\s*(?:{_DS_END}\s*)?",
            literal=False,
            transform=_NAMED,
        ),
        (),
    ),
    "mistral_v11": (
        _json_field(r"\[TOOL_CALLS\](?P<name>[^\[{]+?)\[ARGS\]", _MISTRAL_CLOSE, literal=False, transform=_NAMED),
        (),
    ),
    "mistral_v13": (
        _json_field(
            r"\[TOOL_CALLS\](?P<name>[^\[{]+?)\[CALL_ID\](?P<id>[^\[]*)\[ARGS\]",
            _MISTRAL_CLOSE,
            literal=False,
            transform=_WITH_ID,
        ),
        (),
    ),
    "mistral_pre_v11": (
        _json_field("[TOOL_CALLS]", _MISTRAL_CLOSE, literal=True, transform=_EACH, each=True),
        (),
    ),
    "llama3_json": (
        _json_field(
            r'\{\s*"name":\s*"(?P<name>[^"]+)",\s*"(?:parameters|arguments)":\s*',
            r"\}\s*(?:;\s*|(?=<\|eot_id\|>|<\|eom_id\|>)|\Z)",
            literal=False,
            transform=_NAMED,
        ),
        (),
    ),
    "nemotron_v2": (_json_field("<TOOLCALL>", r"</TOOLCALL>\s*", literal=True, transform=_EACH, each=True), ()),
    "apriel": (_json_field("<tool_calls>", r"</tool_calls>\s*", literal=True, transform=_EACH, each=True), ()),
    "granite": (
        _json_field("<|tool_call|>", r"(?=<\|end_of_text\|>)", literal=True, transform=_EACH, each=True),
        ("<response>", "</response>"),
    ),
    "phi4_mini": (_json_field("functools", r"(?=<\|end\|>)", literal=True, transform=_EACH, each=True), ()),
    "command_r7b": (
        _json_field(
            "<|START_ACTION|>",
            r"<\|END_ACTION\|>\s*",
            literal=True,
            transform={
                "id": "{tool_call_id}",
                "type": "function",
                "function": {"name": "{tool_name}", "arguments": "{parameters}"},
            },
            each=True,
        ),
        ("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    ),
    "command_r_plus": (
        _json_field(
            r"Action:\s*(?:```json)?\s*",
            r"```\s*|(?=<\|END_OF_TURN_TOKEN\|>)",
            literal=False,
            transform={"type": "function", "function": {"name": "{tool_name}", "arguments": "{parameters}"}},
            each=True,
        ),
        (),
    ),
    "gemma4": (
        _json_field(
            r"<\|tool_call>call:(?P<name>[^{\s]+)",
            r"<tool_call\|>\s*",
            literal=False,
            transform=_NAMED,
            args=_GEMMA_ARGS,
        ),
        (),
    ),
    "function_gemma": (
        _json_field(
            r"<start_function_call>call:(?P<name>[^{\s]+)",
            r"<end_function_call>\s*",
            literal=False,
            transform=_NAMED,
            args={"unquoted_keys": True, "string_delims": [["<escape>", "<escape>"]]},
        ),
        (),
    ),
    "gpt_oss": (
        _json_field(
            r"to=functions\.(?P<name>[^\s<]+)\s*(?:<\|channel\|>commentary)?\s*"
            r"(?:<\|constrain\|>)?\s*(?:json)?\s*<\|message\|>",
            r"<\|call\|>\s*",
            literal=False,
            transform=_NAMED,
        ),
        (),
    ),
    "lfm2": (
        {
            "open": "<|tool_call_start|>",
            "close_pattern": r"<\|tool_call_end\|>\s*",
            "content": "python-call-list",
            "transform": _EACH,
            "transform_each": True,
        },
        (),
    ),
    "phi4_mini_llamacpp": (_json_field("<|tool_call|>", r"<\|/tool_call\|>\s*", literal=True), ()),
    "mistral_v11_vllm_text": (
        _json_field(r"\[TOOL_CALLS\](?P<name>[^\[{]+?)(?=\{)", _MISTRAL_CLOSE, literal=False, transform=_NAMED),
        (),
    ),
    "granite_20b_fc": (
        _json_field("<function_call>", r"(?=<function_call>)", literal=True, transform=_EACH_ONE),
        (),
    ),
    # Functionary v3.2: ">>>" before each message, then its recipient line: "all" for content, else a name
    "functionary_v3_2": (
        _json_field(
            r">>>\s*(?!all\n)(?P<name>[A-Za-z_][\w.\-]*)\n",
            r"(?=>>>|<\|eot_id\|>)",
            literal=False,
            transform=_NAMED,
        ),
        (">>>all\n",),
    ),
    "llama4_pythonic": (
        {
            "open": "<|python_start|>",
            "close_pattern": r"<\|python_end\|>\s*",
            "content": "python-call-list",
            "transform": _EACH,
            "transform_each": True,
        },
        (),
    ),
    "pythonic": ({}, ()),
}
for _alias, _owner in (("midm", "hermes"), ("nemotron_v3", "qwen3_coder"), ("magistral", "mistral_v11"),
                       ("mistral_nemo", "mistral_pre_v11"), ("generic_template_tag", "hermes"),
                       ("deepseek_r1", "deepseek_v3"), ("firefunction_v2", "phi4_mini")):  # fmt: skip
    CALL_FIELDS[_alias] = CALL_FIELDS[_owner]
del CALL_FIELDS["pythonic"]

#: what the language cannot say, for the formats it cannot say
UNSAID: dict[str, str] = {
    "pythonic": "its calls are a bare Python list ('[f(x=1)]') with no marker before them: a region opens only at a"
    " delimiter, and '[' also begins ordinary text",
    "generic": "the whole answer is one JSON object whose 'response' key is the content: content parsers make tool"
    " calls of a region, never content out of JSON",
    "functionary_v3_1": "code after <|python_tag|> is a call to 'python' whose argument is the raw code: a transform"
    " cannot turn text into arguments",
    "hermes_qwen_agent_code": "code in a <code> block after the call object joins the call's arguments, which a"
    " transform cannot do",
    "apertus": 'each call is an object whose one key is the function\'s name ({"f": {...}}): a transform places'
    " values by the keys it names, and cannot read a key as the name",
    "json_bare": "bare JSON objects are calls only before any other text: a region cannot depend on what came before",
    "json_list": "a bare JSON list is a call list only at the start of the answer",
    "learned": "chatcodec learned this format from the template's renders, and writes response templates only for"
    " the catalog's formats",
}


def write_response_template(
    fmt: Format,
    *,
    prompt: str,
    end_markers: Sequence[str],
    forced_open: bool,
    reasoning_name: str = "reasoning_content",
    sample: str = "",
) -> dict[str, Any]:
    """The response template for ``fmt`` after ``prompt``, the generation prompt (what the template appends to ask
    for an answer), with ``end_markers`` ending a turn. ``forced_open``: the answer starts inside
    reasoning although the prompt writes no think tag (the format's reasoning parser assumes it).

    A format the declarative language cannot say raises :class:`~chatcodec.DecodeError`, naming what.
    """
    if fmt.name in UNSAID or (fmt.name not in CALL_FIELDS and fmt.name not in _PLAIN_FORMATS):
        reason = UNSAID.get(fmt.name, "chatcodec has no response-template writer for it")
        raise DecodeError(f"The output format {fmt.name!r} cannot be written as a response template: {reason}.")
    think = fmt.think
    anchor = prompt
    if think is not None:
        cut = [k for k in (prompt.find(tag) for tag in think.start) if k > 0]
        anchor = prompt[: min(cut)] if cut else anchor
    if fmt.name == "functionary_v3_2":  # the prompt writes the first ">>>": the output's first message reads it
        anchor = anchor.removesuffix(">>>")
    if not anchor.strip():
        raise DecodeError(
            "The template's generation prompt writes nothing before the answer, so a response template has no"
            " start anchor to find it by."
        )
    fields: dict[str, Any] = {}
    if think is not None:
        ends = [_alt(think.end)]
        ends += [rf"(?={re.escape(m)}\s*{re.escape(after)})" if after else f"(?={re.escape(m)})"
                 for m, after in think.implicit]  # fmt: skip
        reasoning: dict[str, Any] = {"open": think.start[0] if len(think.start) == 1 else list(think.start)}
        if forced_open and not any(tag in prompt for tag in think.start):
            # \G: only where the parser stands (the leftmost place the lookahead holds), so a search is linear
            reasoning = {"open_pattern": rf"{_alt(think.start)}|\G(?=[\s\S]*?(?:{_alt(think.end)}))"}
        reasoning["close_pattern"] = rf"(?:{ends[0]})\s*" + "".join(f"|{e}" for e in ends[1:])
        reasoning["content"] = "text"
        fields[reasoning_name] = reasoning
    if fmt.name == "gpt_oss":
        fields = {
            reasoning_name: {
                "open": "<|channel|>analysis<|message|>",
                "close_pattern": r"<\|end\|>\s*",
                "content": "text",
            },
            "content": {
                "open": "<|channel|>final<|message|>",
                "close_pattern": r"<\|(?:return|end)\|>\s*",
                "content": "text",
            },
            "tool_calls": CALL_FIELDS["gpt_oss"][0],
        }
        return {"defaults": {"role": "assistant"}, "start_anchor": anchor, "fields": fields}
    calls, strip = CALL_FIELDS.get(fmt.name, ({}, ()))
    if calls:
        fields["tool_calls"] = _as_rendered(fmt.name, calls, sample)
    content: dict[str, Any] = {"content": "text"}
    closers = [*end_markers, *strip]
    if closers:
        content = {"close_pattern": rf"(?:{_alt(closers)})\s*", "content": "text"}
    fields["content"] = content
    return {"defaults": {"role": "assistant"}, "start_anchor": anchor, "fields": fields}


def _as_rendered(name: str, calls: dict[str, Any], sample: str) -> dict[str, Any]:
    """The tool-call field in the shape ``sample`` (the template's rendered call) shows."""
    if name == "lfm2":
        after = sample.partition("<|tool_call_start|>")[2].lstrip()
        if after.startswith("{"):
            calls = _json_field("<|tool_call_start|>", r"<\|tool_call_end\|>\s*", literal=True)
        elif after.startswith("[") and after[1:].lstrip().startswith("{"):
            calls = _json_field(
                "<|tool_call_start|>", r"<\|tool_call_end\|>\s*", literal=True, transform=_EACH, each=True
            )
    if calls.get("content") == "json" and re.search(r"[{,:\[]\s*'", sample):
        # the template writes Python literals ({'city': 'Paris'}): single quotes delimit strings
        calls = {**calls, "content_args": {**calls.get("content_args", {}), "string_delims": [["'", "'"]]}}
    return calls


#: formats without tool calls, written as reasoning and content alone
_PLAIN_FORMATS = frozenset({"content", "reasoning_deepseek_r1", "reasoning_qwen3"})
