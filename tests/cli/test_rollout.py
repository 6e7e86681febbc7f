"""chatcodec rollout: tool rollouts on the embedded model, token in and token out, with the engine's own record.

The exactness is read from llama.cpp itself: after every generation the tokens its context evaluated must be
the ids the conversation gave it followed by what it sampled (but the last sampled token, never evaluated),
at the same place in ``conv.input_ids``, and ``sampled_mask`` must be 1 exactly there. The 64-rollout run of
the same check is ``bench/bench_rollouts.py``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from .. import forced
from .test_render import ROOT, run

EXAMPLE = ROOT / "examples" / "temperature.py"
#: the example's functions with every argument an enum, as a tools file for the command
BOUNDED = Path(forced.__file__)


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("temperature_rollout", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Logged:
    """The embedded backend, with llama.cpp's record of the tokens it evaluated read after each generation."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.info = backend.info
        self.log: list[tuple[list[int], list[int], list[int]]] = []

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        sampled: list[int] = []
        async for chunk in self.backend.generate(request):
            sampled += chunk.token_ids or ()
            yield chunk
        llama = self.backend._llama
        self.log.append((list(request.prompt), sampled, [int(t) for t in llama.input_ids[: llama.n_tokens]]))


@pytest.fixture(scope="module")
def backend() -> Any:
    """The embedded SmolLM2 model."""
    pytest.importorskip("llama_cpp", reason="the embedded model needs llama-cpp-python (the serve extra)")
    from chatcodec.backends import LlamaBackend

    return LlamaBackend()


def test_rollouts_with_tool_calls_are_exact_against_the_engine(backend: Any) -> None:
    from chatcodec.cli.rollout import roll
    from chatcodec.tools import LocalClient, Toolbox

    example = _example()
    toolbox = Toolbox(forced.TOOLS)  # the example's functions, every argument an enum
    messages = [{"role": "user", "content": example.QUESTION}]
    calls = 0
    for seed in (32, 34):  # the first two of bench_rollouts.py
        logged = Logged(backend)
        client = LocalClient(logged, template=backend.codec)
        # the forced call (one at a time) is at most 164 bytes, so CALL_TOKENS always finish it (tests/forced.py)
        rollout = asyncio.run(
            roll(
                client,
                toolbox,
                messages,
                rounds=2,
                temperature=1.0,
                seed=seed,
                max_tokens=forced.CALL_TOKENS,
                tool_choice="required",
            )
        )
        conv = rollout.conversation
        ids, mask = conv.input_ids, conv.sampled_mask
        assert logged.log and [g for g, _ in rollout.generations] == [g for g, _, _ in logged.log]
        marked = [0] * len(ids)
        for given, sampled, evaluated in logged.log:
            at = len(given)
            assert ids[:at] == given and ids[at : at + len(sampled)] == sampled
            assert evaluated == (given + sampled)[:-1]  # what llama.cpp's context holds
            marked[at : at + len(sampled)] = [1] * len(sampled)
        assert mask == marked
        # each generation after the first kept all the engine evaluated of the one before (usage's cached_tokens)
        before = [len(given) + len(sampled) - 1 for given, sampled, _ in logged.log[:-1]]
        assert rollout.cached[1:] == before
        assert conv.messages[1]["role"] == "assistant" and conv.messages[1]["tool_calls"]  # the forced call
        assert conv.messages[2]["role"] == "tool"
        calls += rollout.tool_calls
    assert calls >= 2


def test_the_command_writes_rows_and_counts_the_drift(tmp_path: Path, backend: Any) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    output = tmp_path / "rollouts.parquet"
    argv = ["rollout", str(BOUNDED), "-p", "How warm is it in Paris?", "--rounds", "2", "-n", "1", "--seed", "32"]
    # the forced call (the command makes one at a time) is at most 164 bytes: CALL_TOKENS always finish it
    tokens = str(forced.CALL_TOKENS)
    code, stdout, stderr = run([*argv, "--max-tokens", tokens, "--tool-choice", "required", "-o", str(output)])
    assert code == 0, stderr
    assert "rollouts [" in stderr and "1/1" in stderr  # the progress bar
    summary = stdout.decode().splitlines()
    assert summary[0].startswith("1 rollouts, ") and str(output) in summary[0]
    assert summary[1].startswith("engine: ") and " kept from the one before" in summary[1]
    assert summary[2].startswith("drift: a fresh encode of the messages would change ") and "of 1" in summary[2]
    rows = pq.read_table(output).to_pylist()
    assert len(rows) == 1
    row = rows[0]
    assert len(row["input_ids"]) == len(row["sampled_mask"]) == len(row["logprobs"]) == row["num_tokens"]
    assert 0 < sum(row["sampled_mask"]) < row["num_tokens"] and row["assistant_masks"] == row["sampled_mask"]
    messages = json.loads(row["messages"])
    assert [m["role"] for m in messages[:3]] == ["user", "assistant", "tool"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-o", "rows.csv"], "--output must end in .parquet or .jsonl"),
        (["-o", "rows.parquet", "--rounds", "0"], "--rounds"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(extra: list[str], message: str) -> None:
    code, stdout, stderr = run(["rollout", str(EXAMPLE), "-p", "Hi", *extra])
    assert (code, stdout) == (2, b"")
    assert message in stderr and stderr.count("\n") == 1
