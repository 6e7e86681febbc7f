"""What every completion backend offers the server and the function-calling loop.

A backend turns a prompt (text the chat template rendered, or token ids) into generated text, as a
stream of :class:`Chunk` objects. It knows nothing about chats: the caller renders, decodes and
validates. The one protocol, :class:`Backend`, is implemented by the embedded llama.cpp model
(:class:`~chatcodec.backends.LlamaBackend`) and by any OpenAI-compatible ``/v1/completions`` server
(:class:`~chatcodec.backends.RemoteBackend`).

>>> request = Generation("Hello", max_tokens=8, stop=("\\n",))
>>> request.max_tokens, request.stop, request.constraint is None
(8, ('\\n',), True)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["Backend", "Chunk", "Constraint", "FinishReason", "Generation", "ModelInfo"]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the generated text must match, in the forms backends understand.

    ``grammar`` is a GBNF grammar (llama.cpp's dialect) whose start rule is ``root``. ``json_schema`` is
    the same constraint as a JSON schema when the whole output is one JSON value (``None`` when the
    output has markers around its JSON). ``description`` says in words what is enforced, for errors.
    """

    grammar: str
    json_schema: Mapping[str, Any] | None = None
    description: str = ""


@dataclass(frozen=True, slots=True)
class Generation:
    """One completion request: the prompt and how to sample it.

    ``prompt`` is the rendered text, which the engine tokenizes with its special tokens read as such (a raw
    completion), or token ids (then nothing is added in front: the template owns BOS). A chat prompt comes
    as ids from :meth:`chatcodec.Codec.encode`, in which text from the caller never became a control token;
    ``text`` is then the same prompt as text, for an engine that takes only text, and ``unsafe_text`` says why
    that text must not be sent (the caller's text holds a control token, which such an engine would read as
    one), if it must not. ``stop`` strings end the text without being part of it; the backend's
    end-of-generation tokens always stop it. ``None`` sampling values mean the backend's defaults.
    """

    prompt: str | Sequence[int]
    text: str | None = None
    unsafe_text: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    constraint: Constraint | None = None
    #: extra fields passed through to a remote backend as they are (ignored by the embedded one)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of generated text. The last chunk of a generation has ``finish_reason`` and the usage.

    ``token_ids`` are the tokens generated since the last chunk (their text may come later, held back for a
    stop string or an unfinished UTF-8 character), all of them over a generation: the end-of-generation token
    and a stop string's too, as ``completion_tokens`` counts them. None: the backend does not report them.
    ``cached_tokens`` (on the last chunk) counts the prompt's first tokens the engine kept from what it had
    evaluated before, and so did not evaluate again (OpenAI's ``prompt_tokens_details.cached_tokens``); None:
    the backend does not say.
    ``stop`` is the request's stop string that ended the generation (``finish_reason`` ``"stop"``), when the
    backend knows it; None for an end-of-generation token, or an engine that does not say which stop it met.
    """

    text: str
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: tuple[int, ...] | None = None
    cached_tokens: int | None = None
    stop: str | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the server says about the model in ``/v1/models``."""

    id: str
    owned_by: str = "chatcodec"
    context_length: int | None = None


@runtime_checkable
class Backend(Protocol):
    """A raw completion engine: prompt in, text out, nothing about chats.

    ``generate`` is an async generator: closing it (``aclose()``, or a cancelled task) stops the
    generation and frees the model for the next request. Errors are :class:`~chatcodec.BackendError`
    (unreachable or failing backend) and :class:`~chatcodec.BackendTimeoutError`.
    """

    @property
    def info(self) -> ModelInfo: ...

    def generate(self, request: Generation) -> AsyncGenerator[Chunk, None]: ...

    async def tokenize(self, text: str, *, special: bool = True) -> list[int]: ...

    async def detokenize(self, ids: Sequence[int]) -> str: ...

    async def aclose(self) -> None: ...
