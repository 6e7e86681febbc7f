"""Constrained generation on the embedded model checks the grammar on the model's own choice first, and gives
the same tokens as llama-cpp-python applying the grammar to the whole vocabulary (greedy: one right answer)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from chatcodec.backends import Constraint, Generation, LlamaBackend
from chatcodec.server.constrain import response_constraint, text_constraint, tool_constraint
from chatcodec.server.protocol import ResponseFormat

from .. import forced
from .checks import QUESTION
from .conftest import temperature_tools

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaBackend]:
    backend = LlamaBackend(n_threads=1)
    yield backend
    asyncio.run(backend.aclose())


def generate(backend: LlamaBackend, ids: list[int], constraint: Constraint, tokens: int, **sampling: Any) -> str:
    async def run() -> str:
        text = ""
        async for chunk in backend.generate(Generation(ids, max_tokens=tokens, constraint=constraint, **sampling)):
            text += chunk.text
        return text

    return asyncio.run(run())


def whole_vocabulary(backend: LlamaBackend, ids: list[int], constraint: Constraint, tokens: int) -> str:
    """llama-cpp-python's own greedy generation, its grammar applied to every token at every step."""
    import llama_cpp

    grammar = llama_cpp.LlamaGrammar.from_string(constraint.grammar, verbose=False)
    llama = backend._llama
    out: list[int] = []
    for token in llama.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, grammar=grammar):
        if llama_cpp.llama_vocab_is_eog(backend._vocab, token):
            break
        out.append(token)
        if len(out) >= tokens:
            break
    return str(llama.detokenize(out).decode("utf-8"))


def test_greedy_constrained_tokens_are_llama_cpp_s(backend: LlamaBackend) -> None:
    tools = temperature_tools()
    asked = backend.codec.encode(
        [{"role": "user", "content": QUESTION}], tools=tools, add_generation_prompt=True, polyfill="auto"
    ).input_ids
    city = [{"role": "user", "content": "Give the largest city of France and its population as JSON."}]
    plain = backend.codec.encode(city, add_generation_prompt=True).input_ids
    cases = [
        (asked, tool_constraint("generic", tools, "required", parallel=True, frame=None)),
        (asked, text_constraint()),
        (plain, response_constraint(ResponseFormat("json_schema", SCHEMA, "city"))),
    ]
    before = dict(backend.grammar_counts)
    for ids, constraint in cases:
        # both generations compared from the context's cached prefix: a first evaluation of the prompt in one batch
        # gives logits that differ in their last bits, and a near tie could then flip a greedy token
        generate(backend, ids, constraint, 1, temperature=0)
        assert generate(backend, ids, constraint, 24, temperature=0) == whole_vocabulary(backend, ids, constraint, 24)
    counts = {k: backend.grammar_counts[k] - before[k] for k in before}
    assert counts["checked"] > counts["rescued"] > 0  # the model's choice was refused sometimes, and found again


def test_sampled_constrained_output_follows_the_schema(backend: LlamaBackend) -> None:
    city = [{"role": "user", "content": "Give the largest city of France and its population as JSON."}]
    ids = backend.codec.encode(city, add_generation_prompt=True).input_ids
    # SCHEMA with the city at most 24 characters: the longest answer is 194 bytes, whole within CITY_TOKENS
    constraint = response_constraint(ResponseFormat("json_schema", forced.CITY, "city"))
    tokens = forced.CITY_TOKENS
    texts = [generate(backend, ids, constraint, tokens, temperature=1.0, seed=seed) for seed in (1, 2, 3)]
    for text in texts:
        jsonschema.validate(json.loads(text), forced.CITY)
    assert generate(backend, ids, constraint, tokens, temperature=1.0, seed=2) == texts[1]  # seeded: reproducible
