"""The server's heaviest work, done in child processes: the embedded model's ``/tokenize`` and ``/detokenize``,
and building grammars.

Why processes and not threads: a worker thread does its work holding the GIL, and the event loop, which
needs the GIL for every request it answers, waits for it at each hand-off. With the work cut into slices and
one token thread, ``/health`` still answered at p99 95-111 ms (about 1 in 100 over 100 ms) while the worst
token and grammar requests ran (``bench/bench_pressure.py``). In a child process the work has its own GIL and
its own garbage collector, and the server's process only moves bytes.

What crosses is plain data. A child is started with a :class:`Recipe`, from which it rebuilds the server's
template, and for the token work the model's tokenizer (its vocabulary alone, from the GGUF) and the codec.
A request body's bytes go in, and the answer's JSON bytes come back, or a
:class:`~chatcodec.server.chat.Pending` goes in and its :class:`~chatcodec.backends.Constraint` comes back.
A failure comes back as the error answer it would have been in the server. If a child dies (a native crash, or
the kernel's OOM killer), only its requests fail, with a 500, and the next request starts a new child.

Children are started with ``spawn`` (a fresh interpreter: forking a process that runs llama.cpp's threads is not
safe). Each ignores Ctrl-C, which its parent handles, and exits when its parent is gone.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from ..backends import Constraint, GGUFTokenizer
from ..exceptions import ChatcodecError
from ..limits import Limits
from ..render import ChatTemplate
from ..tokens import Codec
from .chat import Pending
from .errors import APIError
from .tokenizing import TokenRequests

__all__ = ["Offload", "Recipe", "constrain", "detokenize", "tokenize"]

log = logging.getLogger("chatcodec.server")

#: how often, in seconds, a child looks whether its parent is still there
_PARENT_CHECK = 1.0


@dataclass(frozen=True, slots=True)
class Recipe:
    """What a child needs to rebuild the server's template and tokenizer (picklable; a compiled template is not)."""

    sources: Mapping[str, str]
    special_tokens: Mapping[str, str]
    name: str | None
    limits: Limits
    response_template: Mapping[str, Any] | None
    polyfill: str | bool = "auto"
    context_length: int | None = None
    #: the GGUF whose vocabulary the token work cuts with (None: a child for grammars only)
    gguf: str | None = None
    #: the process that started the child: it exits when that one is gone
    parent: int = field(default_factory=os.getpid)

    @classmethod
    def of(cls, template: ChatTemplate, **settings: Any) -> Recipe:
        """The recipe of ``template``, with the token work's ``settings`` (``polyfill``, ``context_length``,
        ``gguf``)."""
        shipped = template.response_template
        return cls(
            template.sources, template.special_tokens, template.name, template.limits, shipped, **settings
        )  # fmt: skip

    def template(self) -> ChatTemplate:
        """The template again, as the server has it."""
        made = ChatTemplate(dict(self.sources), special_tokens=self.special_tokens, name=self.name, limits=self.limits)
        made.response_template = dict(self.response_template) if self.response_template is not None else None
        return made


class _Child:
    """What a child's jobs work with, made once when it starts."""

    def __init__(self, recipe: Recipe) -> None:
        self.template = recipe.template()
        self.tokenizer = GGUFTokenizer(recipe.gguf) if recipe.gguf is not None else None
        codec = Codec(self.template, self.tokenizer) if self.tokenizer is not None else None
        self.requests = TokenRequests(
            self.template, codec, polyfill=recipe.polyfill, context_length=recipe.context_length
        )

    def tokenizer_or_refuse(self) -> GGUFTokenizer:
        if self.tokenizer is None:
            raise RuntimeError("this child was started without a tokenizer")
        return self.tokenizer


#: in a child: what its jobs use (set by :func:`_start`)
_here: _Child | None = None


def _start(recipe: Recipe) -> None:
    """A child's start: its state, and a watch on its parent."""
    global _here
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent shuts the pool
    threading.Thread(target=_watch_parent, args=(recipe.parent,), daemon=True).start()
    _here = _Child(recipe)


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(_PARENT_CHECK)
        if os.getppid() != parent:  # the parent is gone (killed, or crashed): nobody will read what this makes
            os._exit(0)


def _child() -> _Child:
    if _here is None:
        raise RuntimeError("not in a chatcodec child process")
    return _here


# The jobs, run in a child. Each gives (True, value) or (False, (status, message, param, kind)): an exception of
# the child's making may not survive pickling, its error answer always does.

_Result = tuple[bool, Any]


def _answered(job: Callable[..., Any], *args: Any) -> _Result:
    try:
        return True, job(*args)
    except APIError as exc:
        return False, (exc.status, exc.message, exc.param, exc.kind)
    except ChatcodecError as exc:
        return False, (400, str(exc), None, None)
    except Exception as exc:  # the server answers it as its own unforeseen errors: a 500 with a body
        return False, (500, f"Internal error: {type(exc).__name__}: {exc}", None, None)


def tokenize(data: bytes | bytearray) -> _Result:
    """(In a child) the /tokenize answer to ``data``, as JSON bytes."""
    here = _child()
    return _answered(lambda: here.requests.tokenized(data, here.tokenizer_or_refuse()))


def detokenize(data: bytes | bytearray) -> _Result:
    """(In a child) the /detokenize answer to ``data``, as JSON bytes."""
    here = _child()
    return _answered(lambda: here.requests.detokenized(data, here.tokenizer_or_refuse()))


def constrain(pending: Pending) -> _Result:
    """(In a child) ``pending``'s constraint and the CPU seconds it took."""
    here = _child()

    def build() -> tuple[Constraint | None, float]:
        started = time.thread_time()
        return pending.build(here.template), time.thread_time() - started

    return _answered(build)


def ready() -> _Result:
    """(In a child) its process id, once its state is made."""
    _child()
    return True, os.getpid()


class Offload:
    """``workers`` child processes made from ``recipe``, for one kind of work (``what``, for messages); started
    when first needed, or by :meth:`start`. Past ``workers`` jobs at once, the next ones wait their turn."""

    def __init__(self, recipe: Recipe, *, workers: int = 1, what: str = "worker") -> None:
        self.recipe = recipe
        self.workers = workers
        self.what = what
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start,
                initargs=(self.recipe,),
            )
        return self._pool

    async def start(self) -> list[int]:
        """Start every child now (a server's start) and wait until each is ready; their process ids."""
        pool = self._executor()
        loop = asyncio.get_running_loop()
        waiting = [loop.run_in_executor(pool, ready) for _ in range(self.workers)]
        return [await self.run_waiting(future) for future in waiting]

    async def run(self, job: Callable[..., _Result], *args: Any) -> Any:
        """``job(*args)``'s value, from a child (its error answer raised as the :class:`APIError` it was)."""
        return await self.run_waiting(asyncio.get_running_loop().run_in_executor(self._executor(), job, *args))

    async def run_waiting(self, future: Awaitable[_Result]) -> Any:
        """What the job of ``future``, submitted to this pool, gave."""
        pool = self._pool
        try:
            ok, value = await future
        except BrokenProcessPool:
            if pool is not None and self._pool is pool:  # the next request starts a new child
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            log.error("a chatcodec %s process ended unexpectedly; a new one starts for the next request", self.what)
            raise APIError(
                500, f"The server's {self.what} process ended unexpectedly; a new one answers the next request."
            ) from None
        if not ok:
            status, message, param, kind = value
            raise APIError(status, message, param=param, kind=kind)
        return value

    def shutdown(self) -> None:
        """Stop the children, a job under way with them: the process's exit would otherwise wait for it."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
        if terminate is not None:
            terminate()
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
