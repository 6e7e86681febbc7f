"""Tools the server runs itself: the MCP servers of ``chatcodec serve --mcp-config``, between the rounds of a request.

:class:`HostedTools` holds the server's :class:`~chatcodec.Toolbox` (its MCP sessions opened once, at start) and
says which of its tools a request may use. :class:`HostedRun` is one request's rounds, in no dialect's words: the
model is asked; the calls it makes to hosted tools go through the toolbox's one call path (validation, the
timeout, every failure an ``Error: ...`` result); their results are added to the conversation and the model is
asked again, until it answers without such calls, calls one of the client's own functions, or :data:`ROUNDS`
requests were made. A dialect turns what the run yields (deltas, :class:`HostedCall` records, the last
:class:`~chatcodec.server.chat.Outcome`) into its items and events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..decoders import Delta
from .chat import ChatService, Outcome, Plan
from .protocol import ChatRequest

if TYPE_CHECKING:
    from ..tools import Toolbox

__all__ = ["ROUNDS", "HostedCall", "HostedRun", "HostedTools"]

#: how many times one request's model is asked at most: each answer's hosted calls run, then it is asked again;
#: the last time with tool choice "none", so that it answers (calls it makes anyway are run, and the answer ends
#: with them)
ROUNDS = 4


@dataclass(frozen=True, slots=True)
class HostedCall:
    """One call of a hosted tool: the call's id in the conversation, the server's label, the tool's own name (as its
    server lists it) and the arguments as JSON text; ``status`` is ``"calling"`` until it ran, then ``"completed"``
    with its ``output`` (what the tool returned, as the model reads it) or ``"failed"`` with the ``error``."""

    id: str
    label: str
    name: str
    arguments: str
    status: Literal["calling", "completed", "failed"] = "calling"
    output: str | None = None
    error: str | None = None


class HostedTools:
    """The MCP servers' tools of ``toolbox``, by server label."""

    def __init__(self, toolbox: Toolbox) -> None:
        self.toolbox = toolbox
        #: label -> the name the model sees -> the tool as its server lists it (name, description, parameters)
        self.servers = toolbox.mcp_servers
        self._owners = {
            seen: (label, tool["name"]) for label, tools in self.servers.items() for seen, tool in tools.items()
        }

    def owner(self, name: str) -> tuple[str, str] | None:
        """The label and the tool's own name of the tool the model calls ``name``, when it is hosted."""
        return self._owners.get(name)

    def chosen(self, label: str, allowed: Sequence[str] | None) -> dict[str, dict[str, Any]]:
        """The tools of server ``label`` that ``allowed`` (their own names; None: all) lets a request use."""
        tools = self.servers[label]
        return {seen: listed for seen, listed in tools.items() if allowed is None or listed["name"] in allowed}

    async def call(self, calls: Sequence[HostedCall]) -> list[HostedCall]:
        """Run ``calls`` concurrently through the toolbox; each comes back completed or failed, in order."""
        seen = {(label, own): name for name, (label, own) in self._owners.items()}
        raw = [
            {"id": c.id, "type": "function", "function": {"name": seen[(c.label, c.name)], "arguments": c.arguments}}
            for c in calls
        ]
        results = await self.toolbox.acall_many(raw)
        return [
            dataclasses.replace(c, status="failed", error=r.error)
            if r.error is not None
            else dataclasses.replace(c, status="completed", output=r.message["content"])
            for c, r in zip(calls, results, strict=True)
        ]


class HostedRun:
    """One request's rounds over ``plan`` (whose generation ``gen`` and ``first`` chunk have begun, as
    :meth:`ChatService.first_chunk` gives them), in which the model may call the hosted tools named in ``allowed``.

    Iterate it for the deltas the client sees (those of hosted calls are left out), each hosted call twice (a
    :class:`HostedCall` calling, then done), and last one :class:`Outcome` with the tokens of every round and only
    the client's own calls. ``replan`` plans a later round's request (off the event loop). Afterwards
    :attr:`messages` are the turns the rounds added to the request's messages, the answer's last.
    """

    def __init__(
        self,
        service: ChatService,
        hosted: HostedTools,
        allowed: Collection[str],
        plan: Plan,
        gen: Any,
        first: Any,
        replan: Callable[[ChatRequest], Awaitable[Plan]],
        rounds: int = ROUNDS,
    ) -> None:
        self.service = service
        self.hosted = hosted
        self.allowed = frozenset(allowed)
        self._start = (plan, gen, first)
        self._replan = replan
        self.rounds = rounds
        self.messages: list[dict[str, Any]] = []

    def _owner(self, name: str) -> tuple[str, str] | None:
        return self.hosted.owner(name) if name in self.allowed else None

    async def __aiter__(self) -> AsyncIterator[Delta | HostedCall | Outcome]:
        plan, gen, first = self._start
        request = plan.request
        asked = request.messages
        forcing = request.tool_choice not in ("auto", "none")
        prompt_tokens = completion_tokens = 0
        for index in range(self.rounds):
            hidden: set[int] = set()  # the decoder's indexes of this round's hosted calls
            outcome: Outcome | None = None
            async for piece in self.service.run(plan, gen, first):
                if isinstance(piece, Outcome):
                    outcome = piece
                    continue
                tc = piece.tool_call
                if tc is not None:
                    if tc.name is not None and self._owner(tc.name) is not None:
                        hidden.add(tc.index)
                    if tc.index in hidden:
                        continue
                yield piece
            assert outcome is not None  # ChatService.run always ends with one
            prompt_tokens += outcome.prompt_tokens
            completion_tokens += outcome.completion_tokens
            mine = [c for c in outcome.calls if self._owner(c["name"]) is not None]
            theirs = [c for c in outcome.calls if self._owner(c["name"]) is None]
            last = dataclasses.replace(
                outcome, calls=theirs, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
            )
            if not mine:
                self.messages.append(last.message())
                yield last
                return
            calling = []
            for c in mine:
                label, name = self._owner(c["name"]) or ("", "")
                calling.append(HostedCall(c["id"], label, name, c["arguments"]))
            for call in calling:
                yield call
            done = await self.hosted.call(calling)
            for call in done:
                yield call
            self.messages.append(outcome.message())
            for raw, call in zip(mine, done, strict=True):
                content = call.output if call.error is None else f"Error: {call.error}."
                self.messages.append({"role": "tool", "tool_call_id": call.id, "name": raw["name"], "content": content})
            if theirs or index == self.rounds - 1:
                finish = "tool_calls" if theirs else "stop"
                yield dataclasses.replace(last, finish="length" if outcome.finish == "length" else finish)
                return
            choice = "none" if index == self.rounds - 2 else ("auto" if forcing else request.tool_choice)
            request = dataclasses.replace(request, messages=[*asked, *self.messages], tool_choice=choice)
            plan = await self._replan(request)
            gen, first = await self.service.first_chunk(plan)
