"""Write ``data/mistral_common.jsonl``: tool-call turns exactly as mistral-common's tokenizers encode them.

Run from the repository root (needs ``pip install "mistral-common[sentencepiece]>=1.13"``, which nothing else needs)::

    python -m tests.decoders.make_mistral_vectors

For each tokenizer version chatcodec can meet (v2 and v3 on SentencePiece, v3 on Tekken, v7, v11 and
v13), each conversation below is encoded with ``encode_chat_completion``; the assistant's tool-call
turn (from its first ``[TOOL_CALLS]`` to its ``</s>``) is turned back into text the way a serving
engine streams it: control tokens as their strings, other tokens detokenized in place (so the space
SentencePiece puts after a control token is kept). v11 and v13 ship no tokenizer file with the
package, so the v7 Tekken vocabulary is loaded with that version and the control tokens those
versions add (``[ARGS]``, ``[CALL_ID]``). Each line: ``version``, ``case``, ``text`` and the
``calls`` (name, arguments, and the id where the version writes one).

It also writes ``data/mistral_templates/VERSION.jinja``: the chat template mistral-common generates for
each version (``generate_chat_template``, text only, BOS and EOS as literals), which the template round
trip (``test_template_roundtrip.py``) and ``test_mistral.py`` read.

The files are committed, so tests need no mistral-common; rerun this when a version is added.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from mistral_common.integrations.chat_templates.chat_templates import generate_chat_template
from mistral_common.protocol.instruct.messages import AssistantMessage, ToolMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy, SpecialTokens
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

OUT = Path(__file__).parent / "data" / "mistral_common.jsonl"
TEMPLATES = Path(__file__).parent / "data" / "mistral_templates"
TOOLS = [
    Tool(function=Function(name=n, description=d, parameters={"type": "object", "properties": {}}))
    for n, d in (("get_weather", "The weather in a city."), ("get_time", "The time in a city."), ("ping", "Ping."))
]
CASES: dict[str, list[tuple[str, dict[str, Any], str]]] = {
    "one": [("get_weather", {"city": "Paris"}, "k7Hq2Zp9W")],
    "two": [
        ("get_weather", {"city": "Paris", "unit": "celsius"}, "k7Hq2Zp9W"),
        ("get_time", {"city": "Tokyo"}, "m3Rt8Yv1B"),
    ],
    "nasty": [
        ("get_weather", {"city": 'São "Paulo"\n\\ [TOOL_CALLS] ]}', "days": [1, 2.5, None, True]}, "a1B2c3D4e"),
        ("ping", {}, "Zz9Yy8Xx7"),
    ],
}


def tokenizers() -> dict[str, MistralTokenizer]:
    found = {
        "v2": MistralTokenizer.v2(),
        "v3": MistralTokenizer.v3(),
        "v3-tekken": MistralTokenizer.v3(is_tekken=True),
        "v7": MistralTokenizer.v7(),
    }
    data = Path(MistralTokenizer._data_path()) / "tekken_240911.json"
    for version in ("v11", "v13"):
        config = json.loads(data.read_text(encoding="utf-8"))
        config["config"]["version"] = version
        extra = [SpecialTokens.args, SpecialTokens.call_id, SpecialTokens.begin_think, SpecialTokens.end_think]
        specials = [*Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
        specials += [{"rank": len(specials) + k, "token_str": t.value, "is_control": True} for k, t in enumerate(extra)]
        config["special_tokens"] = [dict(s) for s in specials]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"tekken_{version}.json"
            path.write_text(json.dumps(config), encoding="utf-8")
            found[version] = MistralTokenizer.from_file(str(path))
    return found


def as_text(tokenizer: MistralTokenizer, tokens: list[int]) -> str:
    """What a serving engine streams for ``tokens``: special tokens as text, the rest detokenized."""
    inner = tokenizer.instruct_tokenizer.tokenizer
    out: list[str] = []
    run: list[int] = []
    anchor = inner.encode("a", bos=False, eos=False)  # decoded before a run, so its leading space stays
    for token in [*tokens, None]:
        if token is None or inner.is_special(token):
            if run:
                out.append(inner.decode(anchor + run, special_token_policy=SpecialTokenPolicy.IGNORE)[1:])
                run = []
            if token is not None:
                out.append(inner.id_to_piece(token))
        else:
            run.append(token)
    return "".join(out)


def vector(version: str, tokenizer: MistralTokenizer, case: str) -> dict[str, Any]:
    calls = CASES[case]
    messages: list[Any] = [
        UserMessage(content="What is the weather?"),
        AssistantMessage(
            tool_calls=[ToolCall(id=i, function=FunctionCall(name=n, arguments=json.dumps(a))) for n, a, i in calls]
        ),
        ToolMessage(content="18 C", tool_call_id=calls[0][2], name=calls[0][0]),  # v2 takes one result a turn
    ]
    tokens = tokenizer.encode_chat_completion(ChatCompletionRequest(messages=messages, tools=TOOLS)).tokens
    inner = tokenizer.instruct_tokenizer.tokenizer
    start = tokens.index(inner.get_special_token(SpecialTokens.tool_calls.value))
    end = tokens.index(inner.eos_id, start) + 1
    text = as_text(tokenizer, tokens[start:end])
    with_ids = "[CALL_ID]" in text or '"id": ' in text
    return {
        "version": version,
        "case": case,
        "text": text,
        "calls": [{"name": n, "arguments": a, **({"id": i} if with_ids else {})} for n, a, i in calls],
    }


def template(version: str, tokenizer: MistralTokenizer) -> str:
    """mistral-common's chat template for ``tokenizer``'s version and backend, text only."""
    return generate_chat_template(
        spm=version in ("v2", "v3", "v7"),
        tokenizer_version=tokenizer.instruct_tokenizer.tokenizer.version,
        image_support=False,
        audio_support=False,
        thinking_support=False,
        default_system_prompt=None,
        plain_thinking_support=False,
        use_special_token_variables=False,
        model_settings_fields=None,
        reasoning_effort_values=None,
        reasoning_effort_default=None,
    )


def main() -> None:
    found = tokenizers()
    TEMPLATES.mkdir(exist_ok=True)
    for version, tokenizer in found.items():
        (TEMPLATES / f"{version}.jinja").write_text(template(version, tokenizer), encoding="utf-8")
    rows = [vector(v, t, case) for v, t in found.items() for case in CASES]
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} vectors -> {OUT}")


if __name__ == "__main__":
    main()
