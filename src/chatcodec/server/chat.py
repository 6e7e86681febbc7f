"""One chat completion: render the prompt, constrain, generate, decode, validate, answer.

:class:`ChatService` holds what every request shares (the backend, the template, the decoder options)
and turns a :class:`~chatcodec.server.protocol.ChatRequest` into an OpenAI answer, whole or as a
stream of chunks. It keeps its own time apart from the backend's, per request (:class:`Overhead`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..backends import Backend, Chunk, Constraint, Generation
from ..decoders import AssistantMessage, Decoder, Delta, ToolCall, decoder, decoder_for
from ..exceptions import ChatcodecError, InputError, TemplateError
from ..refs import validator
from ..render import ChatTemplate
from ..tokens import Codec
from .constrain import Frame, learn_frame, response_constraint, text_constraint, thinking_for, tool_constraint
from .errors import APIError
from .protocol import EFFORTS, ChatRequest, ResponseFormat

__all__ = ["ASK_TOKEN_IDS", "ChatService", "Generated", "Outcome", "Overhead", "Pending", "Plan", "with_constraint"]

log = logging.getLogger("chatcodec.server")


class Overhead:
    """The gateway's own time per request (everything but waiting for the backend), in seconds."""

    def __init__(self, keep: int = 100_000) -> None:
        self.samples: deque[float] = deque(maxlen=keep)
        self.requests = 0
        self.errors = 0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)

    def summary(self) -> dict[str, Any]:
        values = sorted(self.samples)

        def q(p: float) -> float | None:
            return round(values[min(len(values) - 1, int(p * len(values)))] * 1000, 4) if values else None

        return {
            "requests": self.requests,
            "errors": self.errors,
            "overhead_ms": {"count": len(values), "p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "max": q(1.0)},
        }


class _Clock:
    """Counts the CPU time of the event loop's thread between :meth:`resume` and :meth:`pause`, on top of the
    planning's (``already``, timed on its worker thread): the gateway's own work, without the waits (for the
    backend, for the GIL an in-process model holds, for other requests)."""

    __slots__ = ("_since", "total")

    def __init__(self, already: float = 0.0) -> None:
        self.total = already
        self._since: float | None = time.thread_time()

    def pause(self) -> None:
        if self._since is not None:
            self.total += time.thread_time() - self._since
            self._since = None

    def resume(self) -> None:
        if self._since is None:
            self._since = time.thread_time()


class Generated:
    """The token ids the backend generated (:attr:`Chunk.token_ids`): all of them, and those no streamed event
    has given yet; None from the first chunk that came without them (the backend does not report them)."""

    __slots__ = ("all", "unsent")

    def __init__(self) -> None:
        self.all: list[int] | None = []
        self.unsent: list[int] = []

    def add(self, chunk: Chunk) -> None:
        if chunk.token_ids is None:
            self.all = None
        elif self.all is not None:
            self.all += chunk.token_ids
            self.unsent += chunk.token_ids

    def take(self) -> list[int] | None:
        """The ids for the next streamed event: those since the last one."""
        if self.all is None:
            return None
        taken, self.unsent = self.unsent, []
        return taken


@dataclass(slots=True)
class Plan:
    """What one request became: the prompt, the generation request and the decoder to read the answer."""

    request: ChatRequest
    prompt: str
    generation: Generation
    decoder: Decoder
    tools: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    constrained: bool = False
    #: why the request's reasoning effort was not used (the template has no switch for it), for a response header
    reasoning_ignored: str | None = None
    #: the gateway's CPU time before generation (parsing the request, rendering, the grammar), in seconds
    setup: float = 0.0
    #: the constraint still to build (``plan(req, constrain=False)``): :meth:`ChatService.constrain` builds it, or
    #: a child process does (:mod:`chatcodec.server.offload`)
    pending: Pending | None = None


@dataclass(frozen=True, slots=True)
class Pending:
    """A request's constraint still to build: what its grammar is made of, as plain data, so that a child process
    with its own copy of the template can build it (:meth:`build`) as the server would."""

    format_name: str
    kwargs: Mapping[str, Any]
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    parallel: bool
    response_format: ResponseFormat | None

    @classmethod
    def of(cls, req: ChatRequest, format_name: str, kwargs: Mapping[str, Any]) -> Pending:
        return cls(format_name, kwargs, req.tools, req.tool_choice, req.parallel_tool_calls, req.response_format)

    def build(self, template: ChatTemplate) -> Constraint | None:
        """The constraint, in the output syntax of the format (400 errors for a schema no grammar can follow)."""
        enable = self.kwargs.get("enable_thinking")
        thinking = thinking_for(template, enable if isinstance(enable, bool) else None)
        tools, choice = self.tools, self.tool_choice
        try:
            if tools and choice not in ("none", "auto"):
                frame = _frame(template, self.format_name, self.kwargs)
                return tool_constraint(
                    self.format_name, tools, choice, parallel=self.parallel, frame=frame, thinking=thinking
                )
            if self.response_format is not None:
                return response_constraint(self.response_format, thinking)
            if tools and choice == "auto":
                frame = _frame(template, self.format_name, self.kwargs)
                return tool_constraint(
                    self.format_name, tools, "auto", parallel=self.parallel, frame=frame, thinking=thinking
                )
            if tools and choice == "none" and self.format_name == "generic":
                return text_constraint(thinking)
        except InputError as exc:
            raise APIError(400, f"Cannot constrain generation to the schema: {exc}", param="tools") from None
        return None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one answer ended, in no dialect's words: what :meth:`ChatService.run` gives last.

    ``calls`` are the valid tool calls as ``{"id", "name", "arguments"}`` (arguments as JSON text), ``invalid``
    the others as the decoders write ``invalid_tool_calls``. ``finish`` is ``"stop"``, ``"length"`` (the token
    limit ended generation, whatever was cut) or ``"tool_calls"``. ``stop`` is the request's stop string that
    ended the text, when the backend knows it (finish ``"stop"``; None for the model's own end).
    """

    content: str | None
    reasoning: str | None
    calls: list[dict[str, Any]]
    invalid: list[dict[str, Any]]
    finish: str
    prompt_tokens: int
    completion_tokens: int
    #: the prompt's first tokens the engine kept from its last evaluation (0: none, or the backend does not say)
    cached_tokens: int = 0
    stop: str | None = None

    def message(self) -> dict[str, Any]:
        """The answer as the assistant's chat message (the calls' arguments parsed), for a conversation that goes on."""
        turn: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            turn["reasoning_content"] = self.reasoning
        if self.calls:
            turn["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.loads(c["arguments"])},
                }
                for c in self.calls
            ]
        return turn


class ChatService:
    """Chat completions over ``backend`` with ``template``.

    ``tool_parser`` forces the output format (vLLM's ``--tool-call-parser``); by default it is chosen
    from the template. ``polyfill`` is passed to rendering and decoding ("auto": templates without
    tools, a system role, ... get the documented rewrites).
    """

    def __init__(
        self,
        backend: Backend,
        template: ChatTemplate,
        *,
        model: str,
        tool_parser: str | None = None,
        polyfill: str | bool = "auto",
        default_max_tokens: int | None = None,
        codec: Codec | None = None,
        aliases: Sequence[str] = (),
    ) -> None:
        self.backend = backend
        self.template = template
        #: the template with the model's tokenizer: prompts become ids in which text from the caller is never a
        #: control token (None: the prompt goes as text, for a remote engine whose tokenizer is not at hand)
        self.codec = codec
        self.model = model
        #: the names a request's ``model`` may give: the model's id and its aliases (``--served-model-name``)
        self.names = tuple(dict.fromkeys((model, *aliases)))
        self.tool_parser = tool_parser
        self.polyfill = polyfill
        self.default_max_tokens = default_max_tokens
        self.overhead = Overhead()

    # --- planning -----------------------------------------------------------------------------------------

    def plan(self, req: ChatRequest, *, constrain: bool = True) -> Plan:
        """Render the prompt and choose the decoder and the constraint (400 errors for bad input).

        With ``constrain=False`` the constraint (a grammar built from the request's schemas: the costly part
        of a request with large tools) is left in :attr:`Plan.pending`, for :meth:`constrain` to build on a pool
        of its own, so that requests with grammars cannot hold every planning thread from plain chats.
        """
        kwargs, ignored = self._reasoning(req)
        tools = req.tools
        ids: list[int] | None = None
        unsafe: str | None = None
        try:
            if self.codec is not None:
                encoding = self.codec.encode(
                    req.messages, tools=tools, add_generation_prompt=True, polyfill=self.polyfill, **kwargs
                )
                prompt, ids = encoding.text, encoding.input_ids
                if encoding.escaped:  # only ids keep it text: an engine that reads text would see a control token
                    unsafe = self._culprit(req, kwargs, prompt[slice(*encoding.escaped[0])])
            else:
                prompt = self.template.render(
                    req.messages, tools=tools, add_generation_prompt=True, polyfill=self.polyfill, **kwargs
                )
        except TemplateError as exc:
            raise APIError(400, f"The chat template refused the request: {exc}", param="messages") from None
        except ChatcodecError as exc:
            raise APIError(400, str(exc), param="messages") from None
        dec = self._decoder(req, kwargs)
        pending = Pending.of(req, dec.name, kwargs)
        constraint = pending.build(self.template) if constrain else None
        stops = tuple(dict.fromkeys(req.stop))
        generation = Generation(
            ids if ids is not None else prompt,
            text=prompt,
            unsafe_text=unsafe,
            max_tokens=self._max_tokens(req, len(ids) if ids is not None else None),
            temperature=req.temperature,
            top_p=req.top_p,
            stop=stops,
            seed=req.seed,
            constraint=constraint,
            extra=ASK_TOKEN_IDS if req.return_token_ids else {},
        )
        by_name = {t["function"]["name"]: t["function"] for t in tools or ()}
        plan = Plan(req, prompt, generation, dec, by_name, constraint is not None, ignored)
        if not constrain and self._needs_constraint(req, dec.name):
            plan.pending = pending
        return plan

    def constrain(self, plan: Plan) -> Plan:
        """``plan`` with its pending constraint built (400 errors for a schema no grammar can follow)."""
        if plan.pending is None:
            return plan
        started = time.thread_time()
        return with_constraint(plan, plan.pending.build(self.template), time.thread_time() - started)

    @staticmethod
    def _needs_constraint(req: ChatRequest, format_name: str) -> bool:
        """Whether :meth:`_constraint` can give a constraint for ``req`` (the cases it builds one)."""
        if req.response_format is not None:
            return True
        return bool(req.tools) and (req.tool_choice != "none" or format_name == "generic")

    def _reasoning(self, req: ChatRequest) -> tuple[dict[str, Any], str | None]:
        """The template's variables with the request's reasoning effort and budget set on the switches the template
        reads (the table in docs/guide/dialects.md), and why they were ignored when it reads none. What the
        caller set in ``chat_template_kwargs`` stands."""
        kwargs = dict(req.chat_template_kwargs)
        effort, budget = req.reasoning_effort, req.thinking_budget
        if effort is None and budget is None:
            return kwargs, None
        if effort is None:
            effort = "none" if budget == 0 else "medium"
        reads = set(self.template.capabilities.variables)
        found: dict[str, Any] = {}
        if "reasoning_effort" in reads:
            scale = effort_scale(self.template.source)
            if effort not in scale:
                raise APIError(
                    400,
                    f"This model's template takes a reasoning effort of {', '.join(scale)}, not {effort!r}.",
                    param=req.reasoning_field,
                )
            found["reasoning_effort"] = effort
        for switch in ("enable_thinking", "thinking"):
            if switch in reads:
                found[switch] = effort != "none"
        for name in BUDGET_VARIABLES:
            if name in reads and budget is not None:
                found[name] = budget
        if not found:
            return kwargs, "the chat template has no reasoning switch (enable_thinking, reasoning_effort, thinking)"
        return {**found, **kwargs}, None

    def check_model(self, model: str | None) -> None:
        """A 404 ``model_not_found`` (as vLLM answers) unless ``model`` is None or one of :attr:`names`."""
        if model is not None and model not in self.names:
            served = ", ".join(repr(n) for n in self.names)
            raise APIError(
                404, f"The model {model!r} does not exist here; this server serves {served}.", param="model",
                kind="model_not_found",
            )  # fmt: skip

    def _max_tokens(self, req: ChatRequest, prompt_tokens: int | None) -> int | None:
        """The request's output cap, checked against what the context leaves after the prompt (a 400 that says
        how much is left); without one, the server's default, cut to what is left."""
        context = self.backend.info.context_length
        left = None if context is None else context - (prompt_tokens or 0)
        where = "the prompt's " + str(prompt_tokens) + " tokens" if prompt_tokens is not None else "nothing"
        if left is not None and left < 1:
            raise APIError(
                400,
                f"The prompt is {prompt_tokens} tokens: it fills the model's context of {context}.",
                param="messages",
            )
        asked = req.max_tokens
        if asked is not None:
            if left is not None and asked > left:
                raise APIError(
                    400,
                    f"{req.max_tokens_field} is {asked}, but the model's context of {context} tokens leaves {left}"
                    f" after {where}.",
                    param=req.max_tokens_field,
                )
            return asked
        if self.default_max_tokens is None:
            return None
        return self.default_max_tokens if left is None else min(self.default_max_tokens, left)

    def _culprit(self, req: ChatRequest, kwargs: Mapping[str, Any], token: str) -> str:
        """Which caller string holds the control token ``token`` that the encoding kept as text."""
        assert self.codec is not None
        try:
            self.codec.encode(
                req.messages,
                tools=req.tools,
                add_generation_prompt=True,
                polyfill=self.polyfill,
                content_special_tokens="reject",
                **kwargs,
            )
        except ChatcodecError as exc:
            return str(exc).split(". Content may not", 1)[0]
        return f"The request's text holds the control token {token!r}"

    def _decoder(self, req: ChatRequest, kwargs: Mapping[str, Any]) -> Decoder:
        thinking = kwargs.get("enable_thinking")
        thinking = thinking if isinstance(thinking, bool) else None
        tools: Sequence[Any] | None = req.tools if req.tool_choice != "none" else []
        try:
            if self.tool_parser is not None:
                return decoder(self.tool_parser, tools=tools, template=self.template, enable_thinking=thinking)
            polyfill = self.polyfill if req.tools else False
            return decoder_for(self.template, tools=tools, enable_thinking=thinking, polyfill=polyfill)
        except ChatcodecError as exc:
            raise APIError(400, str(exc), param="chat_template_kwargs") from None

    # --- answering ----------------------------------------------------------------------------------------

    def _validate(
        self, plan: Plan, message: AssistantMessage, ids: _Ids
    ) -> tuple[list[ToolCall], list[dict[str, Any]]]:
        """Split decoded calls into valid ones and invalid ones (cut off, not JSON, unknown name, against the
        schema). An invalid one is ``{"index", "id", "name", "arguments", "raw", "error"}``, as the
        decoders write ``invalid_tool_calls``."""
        from jsonschema.exceptions import best_match
        from referencing.exceptions import Unresolvable

        found = [(getattr(call, "index", i), call) for i, call in enumerate(message.tool_calls)]
        found += [(call.index, call) for call in getattr(message, "invalid_tool_calls", ())]
        valid: list[ToolCall] = []
        invalid: list[dict[str, Any]] = []
        for index, call in sorted(found, key=lambda pair: pair[0]):
            error = call.error
            fn = plan.tools.get(call.name)
            if error is None and fn is None:
                error = f"the model called {call.name!r}, which is not among the tools"
            if error is None and not isinstance(call.arguments, dict):
                error = "the arguments are not a JSON object"
            if error is None and fn is not None:
                try:  # a validator that never fetches a schema (chatcodec.refs)
                    check = validator(fn.get("parameters") or {}, where=f"the parameters schema of {call.name}")
                    exc = best_match(check.iter_errors(call.arguments))
                except (ChatcodecError, Unresolvable) as problem:
                    error = f"the arguments could not be checked: {problem}"
                else:
                    if exc is not None:
                        where = "/".join(str(p) for p in exc.absolute_path)
                        error = f"the arguments do not match the schema{' at ' + where if where else ''}: {exc.message}"
            if error is None:
                valid.append(call)
            else:
                invalid.append(
                    {
                        "index": index,
                        "id": ids.get(call.id, index),
                        "name": call.name,
                        "arguments": call.arguments_json,
                        "raw": call.raw,
                        "error": error,
                    }
                )
        return valid, invalid

    async def complete(self, plan: Plan) -> dict[str, Any]:
        """The whole answer (``chat.completion``)."""
        clock = _Clock(plan.setup)
        stream = plan.decoder.stream()
        last: Chunk | None = None
        generated = Generated()
        try:
            async with aclosing(self.backend.generate(plan.generation)) as chunks:
                while True:
                    clock.pause()
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    finally:
                        clock.resume()
                    if chunk.text:
                        stream.feed(chunk.text)
                    generated.add(chunk)
                    last = chunk
            stream.finish()
            msg = stream.message
            ids = _Ids()
            valid, invalid = self._validate(plan, msg, ids)
            finish = _finish(last, valid)
            message: dict[str, Any] = {"role": "assistant", "content": msg.content}
            if msg.reasoning_content is not None:
                message["reasoning_content"] = msg.reasoning_content
            if valid:
                calls = [
                    {
                        "id": ids.get(c.id, getattr(c, "index", i)),
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments_json},
                    }
                    for i, c in enumerate(valid)
                ]
                if plan.request.legacy:
                    message["function_call"] = calls[0]["function"]
                else:
                    message["tool_calls"] = calls
            if invalid:
                message["invalid_tool_calls"] = invalid
            if plan.request.legacy and valid:
                finish = "function_call"
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            if plan.request.return_token_ids:
                choice["token_ids"] = generated.all
            return {
                "id": _completion_id(),
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [choice],
                "usage": _usage(last),
                **_prompt_fields(plan),
            }
        finally:
            clock.pause()
            self.overhead.add(clock.total)

    async def first_chunk(self, plan: Plan) -> tuple[Any, Chunk | None]:
        """Start the generation and wait for its first chunk, so that a backend that is down gives a
        status code rather than an error inside a stream that already said 200."""
        gen = self.backend.generate(plan.generation)
        try:
            chunk = await anext(gen)
        except StopAsyncIteration:
            return gen, None
        except BaseException:
            await gen.aclose()
            raise
        return gen, chunk

    async def stream(self, plan: Plan, gen: Any, first: Chunk | None) -> AsyncIterator[bytes]:
        """The answer as server-sent events, ending with ``data: [DONE]``."""
        clock = _Clock(plan.setup)
        req = plan.request
        cid, created = _completion_id(), int(time.time())
        model = json.dumps(self.model)
        head = f'{{"id": "{cid}", "object": "chat.completion.chunk", "created": {created}, "model": {model}, '
        usage_null = ', "usage": null' if req.include_usage else ""

        generated = Generated()

        def event(delta: Mapping[str, Any], finish: str | None = None, top: str = "") -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if req.return_token_ids:  # the tokens since the last event (vLLM's delta token_ids)
                choice["token_ids"] = generated.take()
            choices = json.dumps(choice, ensure_ascii=False)
            return f'data: {head}{top}"choices": [{choices}]{usage_null}}}\n\n'.encode()

        ids = _Ids()
        stream = plan.decoder.stream()
        last: Chunk | None = None
        announced: dict[int, str] = {}
        try:
            # the prompt's ids and text, when asked for, come with the first event (as vLLM sends them)
            top = "".join(
                f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}, " for k, v in _prompt_fields(plan).items()
            )
            if first is not None:
                generated.add(first)
            clock.pause()
            yield event({"role": "assistant", "content": ""}, top=top)
            clock.resume()
            async with aclosing(gen) as chunks:
                chunk = first
                while chunk is not None:
                    last = chunk
                    out = stream.feed(chunk.text) if chunk.text else []
                    for delta in out:
                        data = self._delta(delta, ids, announced, req.legacy)
                        if not data:
                            continue
                        clock.pause()
                        yield event(data)
                        clock.resume()
                    clock.pause()
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        chunk = None
                    finally:
                        clock.resume()
                    if chunk is not None:
                        generated.add(chunk)
            for delta in stream.finish():
                data = self._delta(delta, ids, announced, req.legacy)
                if not data:
                    continue
                clock.pause()
                yield event(data)
                clock.resume()
            valid, invalid = self._validate(plan, stream.message, ids)
            finish = _finish(last, valid)
            if req.legacy and valid:
                finish = "function_call"
            final: dict[str, Any] = {}
            if invalid:  # the announced calls that turned out invalid, for the client to drop
                final["invalid_tool_calls"] = [{k: entry[k] for k in ("index", "id", "error")} for entry in invalid]
            clock.pause()
            yield event(final, finish)
            if req.include_usage:
                yield f'data: {head}"choices": [], "usage": {json.dumps(_usage(last))}}}\n\n'.encode()
            yield b"data: [DONE]\n\n"
        except ChatcodecError as exc:
            self.overhead.errors += 1
            status = 504 if type(exc).__name__ == "BackendTimeoutError" else 502
            clock.pause()
            yield b"data: " + json.dumps(APIError(status, str(exc)).body()).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        except Exception as exc:  # never a stream cut without an error event and its end
            self.overhead.errors += 1
            log.exception("unexpected error while streaming")
            clock.pause()
            body = APIError(500, f"Internal error: {type(exc).__name__}: {exc}").body()
            yield b"data: " + json.dumps(body).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            clock.pause()
            self.overhead.add(clock.total)

    async def run(self, plan: Plan, gen: Any, first: Chunk | None) -> AsyncIterator[Delta | Outcome]:
        """The answer in no dialect's words, for the dialect adapters: the decoder's deltas as they come (a call's
        first delta carries the id it keeps; the decoder's notices of invalid calls are left out), then one
        :class:`Outcome`. ``gen`` and ``first`` are :meth:`first_chunk`'s. Backend failures raise."""
        clock = _Clock(plan.setup)
        ids = _Ids()
        stream = plan.decoder.stream()
        last: Chunk | None = None
        try:
            async with aclosing(gen) as chunks:
                chunk = first
                while chunk is not None:
                    last = chunk
                    for delta in stream.feed(chunk.text) if chunk.text else ():
                        out = _neutral(delta, ids)
                        if out is not None:
                            clock.pause()
                            yield out
                            clock.resume()
                    clock.pause()
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        chunk = None
                    finally:
                        clock.resume()
            for delta in stream.finish():
                out = _neutral(delta, ids)
                if out is not None:
                    clock.pause()
                    yield out
                    clock.resume()
            msg = stream.message
            valid, invalid = self._validate(plan, msg, ids)
            calls = [
                {"id": ids.get(c.id, getattr(c, "index", i)), "name": c.name, "arguments": c.arguments_json}
                for i, c in enumerate(valid)
            ]
            usage = _usage(last)
            prompt_tokens = usage["prompt_tokens"]
            if not prompt_tokens and not isinstance(plan.generation.prompt, str):
                prompt_tokens = len(plan.generation.prompt)
            finish = _finish(last, valid)
            outcome = Outcome(
                msg.content,
                msg.reasoning_content,
                calls,
                invalid,
                finish,
                prompt_tokens,
                usage["completion_tokens"],
                usage["prompt_tokens_details"]["cached_tokens"],
                last.stop if last is not None and finish == "stop" else None,
            )
            clock.pause()
            yield outcome
        finally:
            clock.pause()
            self.overhead.add(clock.total)

    @staticmethod
    def _delta(delta: Delta, ids: _Ids, announced: dict[int, str], legacy: bool) -> dict[str, Any]:
        tc = delta.tool_call
        if tc is not None and getattr(tc, "error", None) is not None:
            return {}  # the decoder's own notice of an invalid call: the last event lists every invalid call
        if tc is None:
            if delta.reasoning_content is not None:
                return {"reasoning_content": delta.reasoning_content}
            return {"content": delta.content}
        if legacy:
            if tc.name is not None:
                return {"function_call": {"name": tc.name, "arguments": tc.arguments}}
            return {"function_call": {"arguments": tc.arguments}}
        entry: dict[str, Any] = {"index": tc.index}
        if tc.name is not None:
            announced[tc.index] = ids.get(tc.id, tc.index)
            entry.update(id=announced[tc.index], type="function", function={"name": tc.name, "arguments": tc.arguments})
        elif tc.id is not None:
            return {}  # a model-native id after the arguments: the call already has its id
        else:
            entry["function"] = {"arguments": tc.arguments}
        return {"tool_calls": [entry]}


def _neutral(delta: Delta, ids: _Ids) -> Delta | None:
    """``delta`` for :meth:`ChatService.run`: a call's header with the id the answer keeps; None for what a
    dialect does not send (a decoder's notice of an invalid call, a model-native id after the arguments)."""
    tc = delta.tool_call
    if tc is None:
        return delta
    if tc.error is not None or (tc.name is None and tc.id is not None):
        return None
    if tc.name is not None:
        return Delta(tool_call=dataclasses.replace(tc, id=ids.get(tc.id, tc.index)))
    return delta


class _Ids:
    """Call ids unique to this answer: the model's own id, or ``call_`` and random hex."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[int, str] = {}

    def get(self, native: str | None, index: int) -> str:
        if native:
            return native
        made = self._made.get(index)
        if made is None:
            made = self._made[index] = "call_" + secrets.token_hex(12)
        return made


#: the longest chat_template_kwargs (as JSON) whose learned frame is remembered
_FRAME_KEY = 4096

#: the template variables that take a budget of reasoning tokens
BUDGET_VARIABLES = ("thinking_budget", "max_thinking_tokens", "reasoning_budget")


@lru_cache(maxsize=64)
def effort_scale(source: str) -> tuple[str, ...]:
    """The reasoning efforts a template that reads ``reasoning_effort`` takes: low, medium and high, and any other
    of OpenAI's (none, minimal) that its source names as a string."""
    return tuple(e for e in EFFORTS if e in ("low", "medium", "high") or f'"{e}"' in source or f"'{e}'" in source)


def with_constraint(plan: Plan, constraint: Constraint | None, seconds: float) -> Plan:
    """``plan`` with its pending constraint, built in ``seconds`` of CPU time."""
    generation = dataclasses.replace(plan.generation, constraint=constraint)
    return dataclasses.replace(
        plan, generation=generation, constrained=constraint is not None, pending=None, setup=plan.setup + seconds
    )


def _frame(template: ChatTemplate, format_name: str, kwargs: Mapping[str, Any]) -> Frame | None:
    if format_name in ("generic", "content"):
        return None
    key = json.dumps(dict(kwargs), sort_keys=True, default=str)
    if len(key) > _FRAME_KEY:  # not remembered: 64 keys of megabytes would be a cache of gigabytes
        return learn_frame(template, kwargs)
    return _frame_for(template, key)


@lru_cache(maxsize=64)
def _frame_for(template: ChatTemplate, kwargs_json: str) -> Frame | None:
    return learn_frame(template, json.loads(kwargs_json))


#: what a request for token ids asks a remote engine too (vLLM and chatcodec serve answer it; others ignore it)
ASK_TOKEN_IDS: Mapping[str, Any] = {"return_token_ids": True}


def _prompt_fields(plan: Plan) -> dict[str, Any]:
    """vLLM's ``prompt_token_ids`` (the ids the gateway encoded; None without a tokenizer for the model, when the
    prompt goes to the backend as text) and ``prompt_text``, as the request asked for them."""
    out: dict[str, Any] = {}
    if plan.request.return_token_ids:
        prompt = plan.generation.prompt
        out["prompt_token_ids"] = None if isinstance(prompt, str) else list(prompt)
    if plan.request.return_prompt_text:
        out["prompt_text"] = plan.prompt
    return out


def _finish(last: Chunk | None, calls: Sequence[ToolCall]) -> str:
    """Why generation ended, as OpenAI says it: ``length`` whenever the token limit ended it, whatever was cut
    (a call cut there is among the invalid ones), else ``tool_calls`` when it made valid calls."""
    if last is not None and last.finish_reason == "length":
        return "length"
    if calls:
        return "tool_calls"
    return last.finish_reason if last is not None and last.finish_reason else "stop"


def _usage(last: Chunk | None) -> dict[str, Any]:
    """OpenAI's usage, with the prompt tokens the engine kept from its last evaluation as ``cached_tokens``."""
    prompt = last.prompt_tokens if last is not None and last.prompt_tokens is not None else 0
    completion = last.completion_tokens if last is not None and last.completion_tokens is not None else 0
    cached = last.cached_tokens if last is not None and last.cached_tokens is not None else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)
