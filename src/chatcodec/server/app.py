"""The ASGI app: OpenAI's chat and completion endpoints, vLLM's tokenize pair, models and health.

Every answer that is not a success is an OpenAI error body with a status: 400 for the request (the
field is named), 404/405 for a wrong route, 502 when the backend fails, 504 when it times out, and 500
with a body for anything unforeseen, after which the server goes on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..backends import Backend, Chunk, Generation, GGUFTokenizer
from ..exceptions import BackendError, BackendTimeoutError, ChatcodecError, InputError
from ..render import ChatTemplate
from ..tokens import Codec
from ..vocab import TextTokenizer
from . import bodies, heap, offload
from .access import AccessLog, Metered
from .chat import ASK_TOKEN_IDS, ChatService, Generated, Outcome, Plan, with_constraint
from .dialects import messages as anthropic
from .dialects import responses as openresponses
from .errors import APIError, json_bytes
from .hosted import ROUNDS, HostedCall, HostedRun, HostedTools
from .protocol import ChatRequest, parse_chat, parse_completion
from .store import ResponseStore
from .tokenizing import TokenRequests

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ..tools import Toolbox

__all__ = ["create_app"]

log = logging.getLogger("chatcodec.server")

_T = TypeVar("_T")

#: the largest request body read, in bytes
MAX_BODY = 8 * 1024 * 1024
#: how many requests are read at once, each on a worker thread (the JSON body parsed and, for a chat, the
#: prompt rendered and encoded): a long conversation takes seconds to encode (1.4 s
#: for 2.5 MB), which on the event loop would stall every other request and stream; past this many, the
#: next ones wait
PLANNERS = 4
#: how many /tokenize and /detokenize requests are worked on at once: megabytes of text or ids take seconds, and
#: with the planners a few of them would hold up every chat. The embedded model's are worked on in a child
#: process (:mod:`.offload`), a remote engine's read and answered on a thread. One thread: CPython gives the GIL
#: to any thread that waits for it, so with two such jobs the event loop waited behind both at each of the dozen
#: times a request needs the GIL (bench/bench_pressure.py: /health at p90 74 ms, 28-31 ms with one)
TOKENIZERS = 1
#: how many grammars are built at once, each in a child process (:mod:`.offload`): a schema near the budget
#: takes a second or two to become a grammar, and on the planners' threads four such requests would hold every
#: plain chat
GRAMMARS = 2
#: how long a request body may take to arrive, in seconds (then 408)
BODY_TIMEOUT = 30.0
#: how often, in seconds, a thread holding the GIL is asked to let another run while the server is up (CPython's
#: default is 5 ms): the planners' and tokenizers' pure-Python work holds it, and each request the event loop
#: serves meanwhile needs it several times. 1 ms took /health's p90 under the worst token load from 102 ms to
#: 37 ms (bench/bench_pressure.py)
SWITCH_INTERVAL = 0.001
#: where a request's scope keeps the size of the body read (the heap is trimmed after a large one)
_BODY_SIZE = "chatcodec.body_size"
#: the request scope's list of a handler's large values (millions of ids or texts), freed on a worker thread
#: after the handler returns: freed with its frame on the event loop, 1.5 million ids took 50-200 ms of it
_LARGE = "chatcodec.large"


def _error(exc: APIError) -> Response:
    return Response(json_bytes(exc.body()), status_code=exc.status, media_type="application/json")


#: the response header that says a request's reasoning effort was ignored, and why
REASONING_HEADER = "chatcodec-reasoning"


def _headers(plan: Plan) -> dict[str, str] | None:
    if plan.reasoning_ignored is None:
        return None
    return {REASONING_HEADER: f"ignored: {plan.reasoning_ignored}"}


def _anthropic_error(exc: APIError) -> Response:
    return Response(json_bytes(anthropic.error_body(exc)), status_code=exc.status, media_type="application/json")


async def _outcome(pieces: AsyncIterator[Any]) -> Outcome:
    """The :class:`Outcome` that ends :meth:`ChatService.run`'s answer (the deltas before it are not needed)."""
    outcome = None
    async for piece in pieces:
        if isinstance(piece, Outcome):
            outcome = piece
    if outcome is None:
        raise RuntimeError("ChatService.run ended without an Outcome")
    return outcome


def _backend_error(exc: BackendError) -> APIError:
    if isinstance(exc, BackendTimeoutError):
        return APIError(504, str(exc))
    if exc.status is not None and 400 <= exc.status < 500 and exc.status not in (401, 403, 404):
        return APIError(400, str(exc))
    return APIError(502, str(exc))


async def _read_body(request: Request, max_body: int, timeout: float = BODY_TIMEOUT) -> bytearray:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_body:
        raise APIError(400, f"The request body is {int(length)} bytes; the limit is {max_body}.", param="body")
    data = bytearray()
    deadline = asyncio.get_running_loop().time() + timeout
    pieces = request.stream()
    while True:
        left = deadline - asyncio.get_running_loop().time()
        try:  # a client that stalls mid-upload does not hold the request open
            piece = await asyncio.wait_for(anext(pieces, None), max(left, 0.0))
        except asyncio.TimeoutError:
            raise APIError(408, f"The request body did not arrive within {timeout:g} s.", param="body") from None
        if piece is None:
            break
        data += piece
        if len(data) > max_body:
            raise APIError(400, f"The request body is over the limit of {max_body} bytes.", param="body")
    request.scope[_BODY_SIZE] = len(data)
    if not data:
        raise APIError(400, "The request body is empty; send a JSON object.", param="body")
    return data


def freed_later(request: Request, value: object) -> None:
    """Keep ``value`` (millions of ids, say) until the handler has returned, then free it on a worker thread."""
    request.scope.setdefault(_LARGE, []).append(value)


def create_app(
    backend: Backend,
    template: ChatTemplate,
    *,
    model: str | None = None,
    tool_parser: str | None = None,
    polyfill: str | bool = "auto",
    max_body: int = MAX_BODY,
    body_timeout: float = BODY_TIMEOUT,
    default_max_tokens: int | None = None,
    tokenizer: Tokenizer | TextTokenizer | None = None,
    aliases: Sequence[str] = (),
    store: ResponseStore | None = None,
    toolbox: Toolbox | None = None,
    mcp_rounds: int = ROUNDS,
) -> Starlette:
    """The server for ``backend`` with ``template`` (serve it with uvicorn).

    ``tokenizer`` is the model's (default: the backend's own ``tokenizer``, as the embedded model has): chats are
    then encoded to token ids by a :class:`~chatcodec.Codec`, so text from the caller never becomes a control
    token. Without one, prompts go to the backend as text. A request's ``model`` must be ``model`` (default: the
    backend's id) or one of ``aliases``. ``store`` keeps the Responses API's stored responses (None: none are
    kept, and ``previous_response_id`` finds nothing). A request body may hold ``max_body`` bytes and must
    arrive within ``body_timeout`` seconds (then 408). ``toolbox`` holds the MCP servers that ``/v1/responses``
    requests may name as ``{"type": "mcp", "server_label": ...}`` tools, whose calls the server runs itself
    (:mod:`chatcodec.server.hosted`), asking the model at most ``mcp_rounds`` times per request; it stays open
    while the app serves, and the app closes it when it shuts down (its MCP servers' children exit).

    Each request is logged in one line on the ``chatcodec.access`` logger (:mod:`chatcodec.server.access`).
    """
    name = model or backend.info.id
    if tokenizer is None:
        tokenizer = getattr(backend, "tokenizer", None)
    backend = Metered(backend)  # generations count their tokens into their request's access line
    codec = Codec(template, tokenizer) if tokenizer is not None else None
    service = ChatService(
        backend,
        template,
        model=name,
        tool_parser=tool_parser,
        polyfill=polyfill,
        default_max_tokens=default_max_tokens,
        codec=codec,
        aliases=aliases,
    )
    hosted = HostedTools(toolbox) if toolbox is not None and toolbox.mcp_servers else None

    # Pools, so that one kind of work cannot starve another: chats are planned on threads, the embedded model's
    # tokenize and detokenize requests worked on in a child process and grammars built in others
    # (:mod:`.offload`: with their own GIL, the event loop never waits for them); a remote engine's token
    # requests are read and answered on a thread of their own. Past their workers, requests wait their turn in
    # their own queue.
    planners = ThreadPoolExecutor(PLANNERS, thread_name_prefix="chatcodec-plan")
    tokenizers = ThreadPoolExecutor(TOKENIZERS, thread_name_prefix="chatcodec-tokens")
    token_requests = TokenRequests(template, codec, polyfill=polyfill, context_length=backend.info.context_length)
    # the embedded model's tokenizer: its /tokenize and /detokenize answers are made whole in a child
    local = getattr(backend, "tokenizer", None)
    local = local if isinstance(local, GGUFTokenizer) else None
    settings = dict(polyfill=polyfill, context_length=backend.info.context_length)
    grammars = offload.Offload(offload.Recipe.of(template, **settings), workers=GRAMMARS, what="grammar")
    token_child = None
    if local is not None:
        recipe = offload.Recipe.of(template, **settings, gguf=str(local.path))
        token_child = offload.Offload(recipe, workers=TOKENIZERS, what="tokenizer")

    async def off_the_loop(work: Callable[[], _T], pool: ThreadPoolExecutor = planners) -> _T:
        """``work()`` on a thread of ``pool`` (the planners', by default)."""
        return await asyncio.get_running_loop().run_in_executor(pool, work)

    async def constrained(plan: Plan) -> Plan:
        """``plan`` with its grammar built in a grammar child (none: ``plan`` as it is)."""
        if plan.pending is None:
            return plan
        constraint, seconds = await grammars.run(offload.constrain, plan.pending)
        return with_constraint(plan, constraint, seconds)

    async def read_json(request: Request) -> Any:
        """The request's JSON body, parsed on a worker thread (8 MiB of JSON takes tens of milliseconds)."""
        return await off_the_loop(functools.partial(bodies.parse, await _read_body(request, max_body, body_timeout)))

    def guarded(
        handler: Callable[[Request], Awaitable[Response]], shape: Callable[[APIError], Response] = _error
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` with every failure answered in its dialect's error ``shape``."""

        async def endpoint(request: Request) -> Response:
            service.overhead.requests += 1
            try:
                return await handler(request)
            except APIError as exc:
                service.overhead.errors += 1
                return shape(exc)
            except BackendError as exc:
                service.overhead.errors += 1
                return shape(_backend_error(exc))
            except InputError as exc:
                service.overhead.errors += 1
                return shape(APIError(400, str(exc)))
            except ChatcodecError as exc:
                service.overhead.errors += 1
                return shape(APIError(400, str(exc)))
            except ClientDisconnect:
                return Response(status_code=499)
            except Exception as exc:  # never a 500 without a body, and the server goes on
                service.overhead.errors += 1
                log.exception("unexpected error in %s", request.url.path)
                return shape(APIError(500, f"Internal error: {type(exc).__name__}: {exc}"))
            finally:  # what a large request allocated is freed by now: give it back before answering
                large = request.scope.pop(_LARGE, None)
                if large:
                    await off_the_loop(large.clear, tokenizers)
                if request.scope.get(_BODY_SIZE, 0) >= heap.TRIM_AFTER:
                    await off_the_loop(heap.trim, tokenizers)

        return endpoint

    def plan_chat(data: bytearray) -> Plan:
        started = time.thread_time()
        req = parse_chat(bodies.parse(data))
        service.check_model(req.model)
        plan = service.plan(req, constrain=False)
        plan.setup = time.thread_time() - started
        return plan

    async def chat(request: Request) -> Response:
        data = await _read_body(request, max_body, body_timeout)
        plan = await constrained(await off_the_loop(functools.partial(plan_chat, data)))
        if plan.request.stream:
            gen, first = await _until_disconnect(request, service.first_chunk(plan))
            events = service.stream(plan, gen, first)
            return StreamingResponse(events, media_type="text/event-stream", headers=_headers(plan))
        answer = await _until_disconnect(request, service.complete(plan))
        return JSONResponse(answer, headers=_headers(plan))

    # --- the Responses API ---

    def plan_responses(data: bytearray) -> tuple[openresponses.ResponsesRequest, Plan]:
        started = time.thread_time()
        req = openresponses.parse_responses(bodies.parse(data), store.get if store is not None else None, hosted)
        service.check_model(req.chat.model)
        plan = service.plan(req.chat, constrain=False)
        plan.setup = time.thread_time() - started
        return req, plan

    async def keep(
        req: openresponses.ResponsesRequest, answer: dict[str, Any], outcome: Outcome, run: HostedRun | None = None
    ) -> None:
        if store is not None and req.store:
            messages = [*req.history, *run.messages] if run is not None else openresponses.conversation(req, outcome)
            await off_the_loop(functools.partial(store.put, answer["id"], answer, messages, req.items))

    async def replan(chat: ChatRequest) -> Plan:
        """A later round's plan (the conversation with the hosted calls' results), off the event loop."""
        return await constrained(await off_the_loop(functools.partial(service.plan, chat, constrain=False)))

    async def responses(request: Request) -> Response:
        data = await _read_body(request, max_body)
        req, plan = await off_the_loop(functools.partial(plan_responses, data))
        plan = await constrained(plan)
        gen, first = await _until_disconnect(request, service.first_chunk(plan))
        rid = openresponses.new_id("resp")
        if req.chat.stream:
            events = responses_events(req, plan, gen, first, rid)
            return StreamingResponse(events, media_type="text/event-stream", headers=_headers(plan))

        async def whole() -> dict[str, Any]:
            if req.mcp:  # the rounds' items in order, as the stream gives them
                events = openresponses.EventStream(req, rid, name)
                async for _ in answer_events(req, events, plan, gen, first):
                    pass
                return events.response
            outcome = await _outcome(service.run(plan, gen, first))
            answer = openresponses.response_object(req, outcome, rid, int(time.time()), name)
            await keep(req, answer, outcome)
            return answer

        return JSONResponse(await _until_disconnect(request, whole()), headers=_headers(plan))

    async def responses_events(
        req: openresponses.ResponsesRequest, plan: Plan, gen: Any, first: Chunk | None, rid: str
    ) -> AsyncIterator[bytes]:
        events = openresponses.EventStream(req, rid, name)
        for event in events.start():
            yield event
        try:
            async for event in answer_events(req, events, plan, gen, first):
                yield event
        except BackendError as exc:
            service.overhead.errors += 1
            yield events.error(_backend_error(exc))
        except APIError as exc:  # a later round's conversation that the template refuses
            service.overhead.errors += 1
            yield events.error(exc)

    async def answer_events(
        req: openresponses.ResponsesRequest,
        events: openresponses.EventStream,
        plan: Plan,
        gen: Any,
        first: Chunk | None,
    ) -> AsyncIterator[bytes]:
        """The answer's events after the opening ones: with ``mcp`` tools, the servers' listings and every round's
        items (the hosted calls' among them); backend failures raise."""
        run = None
        if req.mcp and hosted is not None:
            allowed = [name for tool in req.mcp for name in tool.tools]
            run = HostedRun(service, hosted, allowed, plan, gen, first, replan, mcp_rounds)
        for event in events.listed(req.mcp):
            yield event
        async for piece in run if run is not None else service.run(plan, gen, first):
            if isinstance(piece, Outcome):
                for event in events.finish(piece):
                    yield event
                await keep(req, events.response, piece, run)
                yield events.closing()
            elif isinstance(piece, HostedCall):
                for event in events.hosted(piece):
                    yield event
            else:
                for event in events.feed(piece):
                    yield event

    async def stored_response(request: Request) -> Response:
        rid = request.path_params["rid"]
        found = await off_the_loop(functools.partial(store.get, rid)) if store is not None else None
        if request.method == "DELETE" and found is not None and store is not None:
            await off_the_loop(functools.partial(store.delete, rid))
            return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})
        if found is None:
            raise APIError(404, f"No stored response has the id {rid!r}.", param="response_id")
        return JSONResponse(found.response)

    async def stored_input_items(request: Request) -> Response:
        rid = request.path_params["rid"]
        found = await off_the_loop(functools.partial(store.get, rid)) if store is not None else None
        if found is None:
            raise APIError(404, f"No stored response has the id {rid!r}.", param="response_id")
        return JSONResponse(openresponses.items_page(found.items, request.query_params))

    # --- Anthropic's Messages API ---

    def plan_messages(data: bytearray) -> Plan:
        started = time.thread_time()
        req = anthropic.parse_messages(bodies.parse(data))
        service.check_model(req.model)
        plan = service.plan(req, constrain=False)
        plan.setup = time.thread_time() - started
        return plan

    async def messages(request: Request) -> Response:
        data = await _read_body(request, max_body)
        plan = await constrained(await off_the_loop(functools.partial(plan_messages, data)))
        gen, first = await _until_disconnect(request, service.first_chunk(plan))
        if plan.request.stream:
            events = messages_events(plan, gen, first)
            return StreamingResponse(events, media_type="text/event-stream", headers=_headers(plan))
        outcome = await _until_disconnect(request, _outcome(service.run(plan, gen, first)))
        return JSONResponse(anthropic.message_object(outcome, name), headers=_headers(plan))

    async def messages_events(plan: Plan, gen: Any, first: Chunk | None) -> AsyncIterator[bytes]:
        prompt = plan.generation.prompt
        events = anthropic.EventStream(name, 0 if isinstance(prompt, str) else len(prompt))
        for event in events.start():
            yield event
        try:
            async for piece in service.run(plan, gen, first):
                for event in events.finish(piece) if isinstance(piece, Outcome) else events.feed(piece):
                    yield event
        except BackendError as exc:
            service.overhead.errors += 1
            yield events.error(_backend_error(exc))

    def count_request(data: bytearray) -> tuple[list[int] | None, str]:
        req = anthropic.parse_messages(bodies.parse(data), counting=True)
        service.check_model(req.model)
        plan = service.plan(req, constrain=False)  # only the prompt is counted: no grammar
        prompt = plan.generation.prompt
        return (None if isinstance(prompt, str) else list(prompt)), plan.prompt

    async def count_tokens(request: Request) -> Response:
        data = await _read_body(request, max_body)
        ids, text = await off_the_loop(functools.partial(count_request, data))
        if ids is None:
            ids = await backend.tokenize(text)
        return JSONResponse({"input_tokens": len(ids)})

    async def raw_prompt_ids(prompt: str | list[int]) -> list[int] | None:
        """A raw completion's prompt as the backend tokenizes it (None when it cannot say)."""
        if isinstance(prompt, list):
            return prompt
        try:
            return await backend.tokenize(prompt)
        except BackendError:
            return None

    async def completions(request: Request) -> Response:
        body = await read_json(request)
        req = parse_completion(body)
        service.check_model(req.model)
        generation = Generation(
            req.prompt,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=req.stop,
            seed=req.seed,
            extra=ASK_TOKEN_IDS if req.return_token_ids else {},
        )
        cid, created = "cmpl-" + hex(time.time_ns())[2:], int(time.time())
        prompt_ids = await raw_prompt_ids(req.prompt) if req.return_token_ids else None

        def payload(
            text: str,
            finish: str | None,
            usage: dict[str, int] | None = None,
            ids: Sequence[int] | None = (),
            prompt: bool = False,
            stop: str | None = None,
        ) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            if finish is not None:  # vLLM's: the stop string that ended the text (None: an end token or the limit)
                choice["stop_reason"] = stop
            if req.return_token_ids:  # vLLM's: the prompt's ids (in the first event of a stream) and the new ones
                if prompt:
                    choice["prompt_token_ids"] = prompt_ids
                choice["token_ids"] = None if ids is None else list(ids)
            out: dict[str, Any] = {"id": cid, "object": "text_completion", "created": created, "model": name}
            out["choices"] = [choice]
            if usage is not None:
                out["usage"] = usage
            return out

        if req.stream:
            gen = backend.generate(generation)
            first = await _until_disconnect(request, _first(gen))

            async def events() -> AsyncIterator[bytes]:
                chunk = first
                try:
                    while chunk is not None:
                        data = payload(
                            chunk.text, chunk.finish_reason, ids=chunk.token_ids, prompt=chunk is first, stop=chunk.stop
                        )
                        yield f"data: {json.dumps(data)}\n\n".encode()
                        if chunk.finish_reason is not None:
                            if req.include_usage:
                                usage = _usage(chunk)
                                tail = {**payload("", None), "choices": [], "usage": usage}
                                yield f"data: {json.dumps(tail)}\n\n".encode()
                            break
                        chunk = await anext(gen, None)
                    yield b"data: [DONE]\n\n"
                except BackendError as exc:
                    yield b"data: " + json.dumps(_backend_error(exc).body()).encode() + b"\n\n"
                    yield b"data: [DONE]\n\n"
                finally:
                    await gen.aclose()

            return StreamingResponse(events(), media_type="text/event-stream")

        async def whole() -> dict[str, Any]:
            parts: list[str] = []
            generated = Generated()
            last: Chunk | None = None
            gen = backend.generate(generation)
            try:
                async for chunk in gen:
                    parts.append(chunk.text)
                    generated.add(chunk)
                    last = chunk
            finally:
                await gen.aclose()
            finish = last.finish_reason if last is not None else "stop"
            stop = last.stop if last is not None else None
            return payload("".join(parts), finish, _usage(last), ids=generated.all, prompt=True, stop=stop)

        return JSONResponse(await _until_disconnect(request, whole()))

    async def tokenize(request: Request) -> Response:
        data = await _read_body(request, max_body, body_timeout)
        if token_child is not None:
            return Response(await token_child.run(offload.tokenize, data), media_type="application/json")
        body, text, ids = await off_the_loop(functools.partial(token_requests.tokenize_request, data), tokenizers)
        if ids is None:
            ids = await backend.tokenize(text)
        freed_later(request, ids)
        token_strs = [await backend.detokenize([i]) for i in ids] if body.get("return_token_strs") else None
        answer = token_requests.tokens_answer(ids, token_strs)
        content = await off_the_loop(functools.partial(bodies.dumps, answer), tokenizers)
        return Response(content, media_type="application/json")

    async def detokenize(request: Request) -> Response:
        data = await _read_body(request, max_body, body_timeout)
        if token_child is not None:
            return Response(await token_child.run(offload.detokenize, data), media_type="application/json")
        ids = await off_the_loop(functools.partial(token_requests.detokenize_request, data), tokenizers)
        freed_later(request, ids)
        text = await backend.detokenize(ids)
        content = await off_the_loop(functools.partial(bodies.dumps, {"prompt": text}), tokenizers)
        return Response(content, media_type="application/json")

    async def models(request: Request) -> Response:
        info = backend.info
        card = {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "chatcodec",
            "max_model_len": info.context_length,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def stats(request: Request) -> Response:
        summary = {"pid": os.getpid(), **service.overhead.summary()}  # which worker answered (serve --workers)
        backend_stats = getattr(backend, "stats", None)
        if callable(backend_stats):
            summary["backend"] = backend_stats()
        return JSONResponse(summary)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = "No such endpoint." if exc.status_code == 404 else f"{request.method} is not allowed here."
        shape = _anthropic_error if request.url.path.startswith("/v1/messages") else _error
        return shape(APIError(exc.status_code, f"{message} ({request.method} {request.url.path})"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The first request would otherwise pay for the template's probe renders (capabilities, the
        # output format) and its compilation: do it once, before serving.
        probe_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        for extra in ({}, {"tools": [probe_tool], "tool_choice": "required"}):
            with contextlib.suppress(APIError, ChatcodecError):
                service.plan(parse_chat({"messages": [{"role": "user", "content": "Hi"}], **extra}))
        children = [pool for pool in (grammars, token_child) if pool is not None]
        starting = [asyncio.ensure_future(child.start()) for child in children]  # while the model warms up
        warm = getattr(backend, "warm", None)
        if warm is not None:  # the embedded model: its first evaluation, before the first request
            await warm()
        for child, started in zip(children, starting, strict=True):
            try:
                await started
            except APIError:  # its requests answer 500 and start another; the server serves the rest
                log.error("the %s process could not start: see the lines above", child.what)
        connect = getattr(backend, "connect", None)
        if connect is not None:
            try:
                await connect()
            except BackendError as exc:  # not up yet: each request says so (502) until it is
                log.warning("%s", exc)
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL))  # the process's, put back at shutdown
        # What is loaded by now (the vocabulary, the template, the codec's tables) lives as long as the server:
        # frozen, the collector's full passes skip it. Unfrozen, each walked it all, GIL held: 70-190 ms with
        # /health waiting, whenever a request (a grammar's cycles) made enough garbage.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            sys.setswitchinterval(switch)
            gc.unfreeze()
        if toolbox is not None:  # before uvicorn raises a stopping signal again, which would end the process
            await toolbox.aclose()
        await backend.aclose()
        planners.shutdown(wait=False, cancel_futures=True)
        tokenizers.shutdown(wait=False, cancel_futures=True)
        grammars.shutdown()
        if token_child is not None:
            token_child.shutdown()

    routes = [
        Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/responses", guarded(responses), methods=["POST"]),
        Route("/v1/responses/{rid}", guarded(stored_response), methods=["GET", "DELETE"]),
        Route("/v1/responses/{rid}/input_items", guarded(stored_input_items), methods=["GET"]),
        Route("/v1/messages", guarded(messages, _anthropic_error), methods=["POST"]),
        Route("/v1/messages/count_tokens", guarded(count_tokens, _anthropic_error), methods=["POST"]),
        Route("/tokenize", guarded(tokenize), methods=["POST"]),
        Route("/detokenize", guarded(detokenize), methods=["POST"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.add_middleware(AccessLog)
    app.state.service = service
    return app


async def _first(gen: AsyncGenerator[Chunk, None]) -> Chunk | None:
    try:
        return await anext(gen)
    except StopAsyncIteration:
        return None


def _usage(chunk: Chunk | None) -> dict[str, int]:
    prompt = chunk.prompt_tokens or 0 if chunk is not None else 0
    completion = chunk.completion_tokens or 0 if chunk is not None else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Run ``work`` unless the client goes away first, in which case it is cancelled."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        raise ClientDisconnect()
    return task.result()


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
