"""LocalClient.complete: a conversation on the embedded model, token in and token out, evaluated from its new ids.

The engine's record is read from llama.cpp itself: every call of ``Llama.eval`` (the ids the context evaluated,
in order) is logged, and after each generation the context holds ``input_ids[:n_tokens]``. So the counts
checked here are the engine's, against the lengths the conversation gives: turn k keeps the whole of turn
k-1 but its last sampled token (which sampling never evaluates), and evaluates only the ids after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from types import ModuleType

import pytest

import chatcodec
from chatcodec import ConversationError, InputError, Toolbox
from chatcodec.tools import LocalClient

from .. import forced
from ..server.conftest import gguf


class Engine:
    """The embedded backend, with a log of every batch of ids its llama.cpp context evaluated."""

    def __init__(self) -> None:
        pytest.importorskip("llama_cpp", reason="the embedded model needs llama-cpp-python (the serve extra)")
        from chatcodec.backends import LlamaBackend

        self.backend = LlamaBackend(gguf())
        self.llama = self.backend._llama
        self.evaluated: list[list[int]] = []
        real = self.llama.eval

        def logged(tokens: Sequence[int]) -> None:
            self.evaluated.append([int(t) for t in tokens])
            real(tokens)

        self.llama.eval = logged

    def held(self) -> list[int]:
        """What the context holds now: the ids it evaluated and kept."""
        return [int(t) for t in self.llama.input_ids[: self.llama.n_tokens]]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    found = Engine()
    yield found
    asyncio.run(found.backend.aclose())


def kept_prefix(held: list[int], prompt: list[int]) -> int:
    """How many of ``prompt``'s ids an engine holding ``held`` keeps: their common prefix, but the prompt's last
    id, which is evaluated again for its logits."""
    count = 0
    for x, y in zip(held, prompt[:-1], strict=False):
        if x != y:
            break
        count += 1
    return count


def test_a_rollout_evaluates_only_the_new_ids_and_usage_counts_the_kept_prompt(
    engine: Engine, temperature: ModuleType
) -> None:
    client = LocalClient(engine.backend)
    toolbox = Toolbox(forced.TOOLS)  # the example's functions, every argument an enum
    conv = client.codec.conversation(tools=toolbox.tools, polyfill="auto")
    conv.append({"role": "user", "content": temperature.QUESTION}, add_generation_prompt=True)
    start = engine.held()
    record: list[list[int]] = []  # every batch the engine evaluated over the rollout
    previous: tuple[list[int], list[int]] | None = None
    appended: list[int] = []
    calls = 0
    kept: list[int] = []  # usage's cached_tokens of each turn
    sampled_at: list[int] = []  # the positions of the sampled ids, as the engine reported them
    for turn in range(3):
        given = conv.input_ids
        held = engine.held()
        engine.evaluated.clear()
        answer = asyncio.run(
            client.complete(
                conv,
                temperature=1.0,
                seed=32 + turn,
                # the forced call is at most 164 bytes, so CALL_TOKENS always finish it (tests/forced.py)
                max_tokens=forced.CALL_TOKENS if turn == 0 else 48,
                tool_choice="required" if turn == 0 else None,
                parallel_tool_calls=False,
            )
        )
        sampled = answer["choices"][0]["token_ids"]
        usage = answer["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert usage["prompt_tokens"] == len(given) and usage["completion_tokens"] == len(sampled)
        assert cached == kept_prefix(held, given)
        kept.append(cached)
        if previous is not None:  # all of the turn before, but its last sampled token, never evaluated
            before, before_sampled = previous
            assert given[: len(before) + len(before_sampled)] == before + before_sampled
            assert cached == len(before) + len(before_sampled) - 1
            assert len(given) - cached == 1 + len(appended)
        # the engine evaluated the prompt's ids after the kept ones, then each sampled token but the last
        assert engine.evaluated[0] == given[cached:]
        assert engine.evaluated[1:] == [[token] for token in sampled[:-1]]
        assert engine.held() == given + sampled[:-1]
        record += engine.evaluated
        ids = conv.input_ids
        assert ids[: len(given)] == given and ids[len(given) :] == sampled
        sampled_at += range(len(given), len(given) + len(sampled))
        assert answer["choices"][0]["message"] == conv.messages[-1]
        message = answer["choices"][0]["message"]
        if turn == 0:
            assert message["tool_calls"] and answer["choices"][0]["finish_reason"] == "tool_calls"
        previous = (given, sampled)
        if message.get("tool_calls"):
            calls += len(message["tool_calls"])
            results = asyncio.run(toolbox.acall_many(message["tool_calls"]))
            appended = conv.append([r.message for r in results], add_generation_prompt=True)
        else:
            appended = conv.append({"role": "user", "content": "And in Paris?"}, add_generation_prompt=True)
    assert calls >= 1
    # the engine's whole record: what it held of the first prompt, every id it evaluated, and the last sampled
    # token, is the conversation's ids up to the end of the last generation
    assert previous is not None
    given, sampled = previous
    logged = start[: kept[0]] + [token for batch in record for token in batch] + sampled[-1:]
    assert logged == conv.input_ids[: len(given) + len(sampled)]
    assert [i for i, bit in enumerate(conv.sampled_mask) if bit] == sampled_at


def test_a_shorter_prompt_between_two_long_ones_keeps_only_what_the_context_holds(engine: Engine) -> None:
    """The context holds input_ids[:n_tokens]; past it are ids of an earlier, longer prompt that it dropped
    (keeping those made llama_decode fail)."""
    from chatcodec.backends import Generation

    codec = engine.backend.codec
    long = codec.encode(
        [{"role": "user", "content": "Tell me a long story about a cat and a dog who live in Paris."}],
        add_generation_prompt=True,
    ).input_ids

    async def generate(ids: list[int], limit: int) -> tuple[list[int], int | None]:
        sampled: list[int] = []
        last = None
        async for chunk in engine.backend.generate(Generation(ids, max_tokens=limit, temperature=0)):
            sampled += chunk.token_ids or ()
            last = chunk
        assert last is not None
        return sampled, last.cached_tokens

    first, _ = asyncio.run(generate(long, 4))
    _, short_cached = asyncio.run(generate(long[:10], 1))  # one token sampled, none evaluated after the prompt
    assert short_cached == 9 and engine.held() == long[:10]
    again, cached = asyncio.run(generate(long, 4))
    assert cached == 10 and again == first


def test_bad_calls_are_one_clear_error_and_the_conversation_stays_usable(engine: Engine) -> None:
    client = LocalClient(engine.backend)
    other = chatcodec.Codec(engine.backend.template, engine.backend.tokenizer).conversation()
    other.append({"role": "user", "content": "Hi"}, add_generation_prompt=True)
    with pytest.raises(InputError, match=r"client\.codec\.conversation"):
        asyncio.run(client.complete(other))
    conv = client.codec.conversation([{"role": "user", "content": "Hi"}])
    with pytest.raises(ConversationError, match="add_generation_prompt=True"):
        asyncio.run(client.complete(conv))
    conv.append({"role": "user", "content": "Say hello."}, add_generation_prompt=True)
    with pytest.raises(InputError, match="tool_choice must be"):
        asyncio.run(client.complete(conv, tool_choice="no_such_tool"))
    before = conv.input_ids
    answer = asyncio.run(client.complete(conv, temperature=0, max_tokens=8))
    assert conv.input_ids == before + answer["choices"][0]["token_ids"] and not conv.awaiting
    with pytest.raises(ConversationError):
        asyncio.run(client.complete(conv))  # a completion was added: the next turn's messages come first
