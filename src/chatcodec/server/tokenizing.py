"""vLLM's ``/tokenize`` and ``/detokenize``: the request read, the ids or the text made, the answer written.

One :class:`TokenRequests` serves both places this work is done: the server's own process, where a remote
engine makes the ids, and the child process that does all of it for the embedded model
(:mod:`chatcodec.server.offload`), where the answer comes back whole, as JSON bytes.

>>> from chatcodec import load_template
>>> requests = TokenRequests(load_template("chatml"), None, polyfill="auto", context_length=8192)
>>> requests.tokenize_request(b'{"prompt": "Hi"}')
({'prompt': 'Hi'}, 'Hi', None)
>>> requests.detokenize_request(b'{"tokens": [1, 2]}')
[1, 2]
"""

from __future__ import annotations

from typing import Any

from ..backends import GGUFTokenizer
from ..exceptions import ChatcodecError
from ..render import ChatTemplate
from ..tokens import Codec
from . import bodies
from .errors import APIError
from .protocol import parse_chat

__all__ = ["TokenRequests"]


class TokenRequests:
    """The token endpoints' work for ``template`` (with ``codec``, when the model's tokenizer is at hand: a chat's
    ids are then the injection-safe encoder's), for a model of ``context_length`` tokens."""

    def __init__(
        self, template: ChatTemplate, codec: Codec | None, *, polyfill: str | bool, context_length: int | None
    ) -> None:
        self.template = template
        self.codec = codec
        self.polyfill = polyfill
        self.context_length = context_length

    def tokenize_request(self, data: bytes | bytearray) -> tuple[dict[str, Any], str, list[int] | None]:
        """A /tokenize body, its text, and its ids (None: the tokenizer is to cut the text)."""
        body = bodies.parse(data)
        if not isinstance(body, dict):
            raise APIError(400, "The request body must be a JSON object.", param="body")
        if "messages" not in body:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise APIError(400, "prompt must be a string (or give messages).", param="prompt")
            return body, prompt, None
        add_generation_prompt = body.get("add_generation_prompt", True)
        if not isinstance(add_generation_prompt, bool):
            raise APIError(400, "add_generation_prompt must be true or false.", param="add_generation_prompt")
        req = parse_chat({k: v for k, v in body.items() if k in ("messages", "tools", "chat_template_kwargs")})
        options: dict[str, Any] = dict(
            tools=req.tools, add_generation_prompt=add_generation_prompt, **req.chat_template_kwargs
        )
        try:
            if self.codec is not None:
                encoding = self.codec.encode(req.messages, polyfill=self.polyfill, **options)
                return body, encoding.text, encoding.input_ids
            return body, self.template.render(req.messages, polyfill=self.polyfill, **options), None
        except ChatcodecError as exc:
            raise APIError(400, f"The chat template refused the request: {exc}", param="messages") from None

    def tokens_answer(self, ids: list[int], token_strs: list[str] | None) -> dict[str, Any]:
        """The /tokenize answer, as vLLM writes it."""
        answer: dict[str, Any] = {"count": len(ids), "max_model_len": self.context_length, "tokens": ids}
        if token_strs is not None:
            answer["token_strs"] = token_strs
        return answer

    @staticmethod
    def detokenize_request(data: bytes | bytearray) -> list[int]:
        """A /detokenize body's ids."""
        body = bodies.parse(data)
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise APIError(400, "tokens must be a list of token ids.", param="tokens")
        return ids

    def tokenized(self, data: bytes | bytearray, tokenizer: GGUFTokenizer) -> bytes:
        """The whole /tokenize answer to ``data``, cut by ``tokenizer``, as JSON bytes."""
        body, text, ids = self.tokenize_request(data)
        if ids is None:
            ids = tokenizer.tokenize(text, special=True)
        token_strs = tokenizer.token_texts(ids) if body.get("return_token_strs") else None
        return bodies.dumps(self.tokens_answer(ids, token_strs))

    def detokenized(self, data: bytes | bytearray, tokenizer: GGUFTokenizer) -> bytes:
        """The whole /detokenize answer to ``data``, as JSON bytes."""
        return bodies.dumps({"prompt": tokenizer.detokenize_text(self.detokenize_request(data))})
