"""A remote backend: any OpenAI-compatible raw ``/v1/completions`` endpoint, reached over httpx.

vLLM, SGLang, llama.cpp's server and llama-cpp-python's server all offer raw completions. The gateway
renders and decodes; the engine only completes text, so several gateways can stand side by side in
front of one engine (they keep no state between requests).

Constrained generation is passed in the dialect the engine understands, found from the ``owned_by``
field of its ``/v1/models`` answer unless given:

- ``"llama.cpp"`` (llama.cpp's server, llama-cpp-python's server): ``grammar`` (GBNF);
- ``"vllm"``: ``structured_outputs`` (``json`` or ``grammar``), and the older ``guided_json`` /
  ``guided_grammar`` that earlier releases read;
- ``"sglang"``: ``json_schema`` or ``ebnf``;
- ``"none"``: nothing is sent; the server validates the output instead.

A chat prompt goes as token ids to the engines that take them (vLLM, SGLang, llama.cpp's server, another
``chatcodec serve``), so that text from the caller never becomes a control token there. An engine that takes
only text (llama-cpp-python's server) gets the text, but not when the caller's text holds a control token:
it would read it as one, so that request is refused (400) with the field named.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Literal

import httpx

from ..exceptions import BackendError, BackendTimeoutError, InputError
from .base import Chunk, Generation, ModelInfo

__all__ = ["DIALECTS", "Dialect", "RemoteBackend"]

Dialect = Literal["llama.cpp", "vllm", "sglang", "none"]
DIALECTS: tuple[str, ...] = ("auto", "llama.cpp", "vllm", "sglang", "none")
_OWNERS: dict[str, Dialect] = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp", "me": "llama.cpp"}
#: engines (by the owned_by of their /v1/models) whose /v1/completions takes a prompt of token ids
_TAKE_IDS = frozenset({"vllm", "sglang", "llamacpp", "chatcodec"})


class RemoteBackend:
    """An OpenAI-compatible completion server at ``base_url`` (with or without the ``/v1`` suffix).

    ``model`` is the model name sent in each request (default: the first one ``/v1/models`` lists).
    ``timeout`` bounds each read (the wait for the next streamed token included); ``connect_timeout``
    the connection. Connections are pooled and reused.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        dialect: str = "auto",
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        max_connections: int = 256,
    ) -> None:
        if dialect not in DIALECTS:
            raise InputError(f"The structured-output dialect must be one of {', '.join(DIALECTS)}, not {dialect!r}.")
        url = base_url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise InputError(f"The backend URL must start with http:// or https://, not {base_url!r}.")
        if url.endswith("/v1"):
            url = url[:-3]
        self.base_url = url
        self._model = model
        self._dialect: Dialect | None = None if dialect == "auto" else dialect  # type: ignore[assignment]
        self._info: ModelInfo | None = None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    # --- what the engine is ---------------------------------------------------------------------------

    async def connect(self) -> ModelInfo:
        """Ask ``/v1/models`` which model is served and by what engine (done once, on first use)."""
        if self._info is not None:
            return self._info
        body = await self._json("GET", "/v1/models")
        models = body.get("data") if isinstance(body, Mapping) else None
        if not isinstance(models, list) or not models or not isinstance(models[0], Mapping):
            raise BackendError(f"{self.base_url}/v1/models lists no model.")
        chosen = next((m for m in models if m.get("id") == self._model), models[0])
        owner = str(chosen.get("owned_by") or "")
        if self._dialect is None:
            self._dialect = _OWNERS.get(owner, "none")
        length = chosen.get("max_model_len") or (chosen.get("meta") or {}).get("n_ctx_train")
        self._info = ModelInfo(
            self._model or str(chosen.get("id")), owner or "remote", length if isinstance(length, int) else None
        )
        return self._info

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            return ModelInfo(self._model or "remote", "remote")
        return self._info

    @property
    def dialect(self) -> Dialect | None:
        """The structured-output dialect in use (None until :meth:`connect` has run, when it is found)."""
        return self._dialect

    # --- completions -----------------------------------------------------------------------------------

    def body(self, request: Generation) -> dict[str, Any]:
        """The JSON body of the ``/v1/completions`` request for ``request``."""
        body: dict[str, Any] = {
            "model": self.info.id,
            "prompt": self._prompt(request),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        for key in ("temperature", "top_p", "seed"):
            value = getattr(request, key)
            if value is not None:
                body[key] = value
        if request.stop:
            body["stop"] = list(request.stop)
        if self._dialect == "vllm":
            body["add_special_tokens"] = False  # the template owns BOS
            body["skip_special_tokens"] = True
        constraint = request.constraint
        if constraint is not None:
            schema = dict(constraint.json_schema) if constraint.json_schema is not None else None
            if self._dialect == "llama.cpp":
                body["grammar"] = constraint.grammar
            elif self._dialect == "vllm":
                if schema is not None:
                    body["structured_outputs"] = {"json": schema}
                    body["guided_json"] = schema
                else:
                    body["structured_outputs"] = {"grammar": constraint.grammar}
                    body["guided_grammar"] = constraint.grammar
            elif self._dialect == "sglang":
                if schema is not None:
                    body["json_schema"] = json.dumps(schema)
                else:
                    body["ebnf"] = constraint.grammar
        body.update(request.extra)
        return body

    @property
    def takes_token_ids(self) -> bool:
        """Whether the engine's /v1/completions takes token ids (known once :meth:`connect` has run)."""
        return self._info is not None and self._info.owned_by in _TAKE_IDS

    def _prompt(self, request: Generation) -> str | list[int]:
        prompt = request.prompt
        if isinstance(prompt, str):
            return prompt
        if self.takes_token_ids or request.text is None:
            return list(prompt)
        if request.unsafe_text is not None:
            raise InputError(
                f"{request.unsafe_text}, and the engine at {self.base_url} ({self.info.owned_by}) takes prompts as"
                " text, where it would read that as a control token: remove it, or serve with an engine that"
                " takes token ids (vLLM, SGLang, llama.cpp's server)."
            )
        return request.text

    async def generate(self, request: Generation) -> AsyncGenerator[Chunk, None]:
        await self.connect()
        body = self.body(request)
        finish: str | None = None
        stop: str | None = None
        usage: Mapping[str, Any] | None = None
        events = 0
        # the generated ids, when the request asks the engine for them (return_token_ids, in extra) and every
        # event with text gives them; else the chunks report none
        reported = body.get("return_token_ids") is True
        try:
            async with self._client.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _refused(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = _event(data)
                    if isinstance(event.get("error"), Mapping):
                        raise BackendError(f"The backend reported an error: {_message(event)}")
                    if isinstance(event.get("usage"), Mapping):
                        usage = event["usage"]
                    for choice in event.get("choices") or ():
                        if not isinstance(choice, Mapping):
                            continue
                        text = choice.get("text")
                        text = text if isinstance(text, str) else ""
                        ids = _token_ids(choice.get("token_ids")) if reported else None
                        reported = reported and (ids is not None or not text)
                        if text:
                            events += 1
                        if text or ids:
                            yield Chunk(text, token_ids=ids if reported else None)
                        if choice.get("finish_reason"):
                            finish = str(choice["finish_reason"])
                        # vLLM's (and chatcodec serve's) stop_reason: the stop string met, when one was
                        if choice.get("stop_reason") in request.stop:
                            stop = choice["stop_reason"]
        except httpx.TimeoutException as exc:
            raise BackendTimeoutError(f"The backend at {self.base_url} timed out ({type(exc).__name__}).") from None
        except httpx.HTTPError as exc:
            raise BackendError(f"The backend at {self.base_url} failed: {type(exc).__name__}: {exc}") from None
        if finish is None:
            raise BackendError(f"The backend at {self.base_url} ended the stream without finishing the completion.")
        yield await self._last(request, "", finish, usage, events, () if reported else None, stop)

    async def _last(
        self,
        request: Generation,
        text: str,
        finish: Any,
        usage: Mapping[str, Any] | None,
        events: int | None,
        token_ids: tuple[int, ...] | None = None,
        stop: str | None = None,
    ) -> Chunk:
        """The final chunk, with the engine's usage. An engine that reports none in its stream
        (llama-cpp-python's server) gets the prompt counted by its own tokenize endpoint and the completion
        by its stream events, one per token there."""
        prompt_tokens = usage.get("prompt_tokens") if usage else None
        completion_tokens = usage.get("completion_tokens") if usage else None
        if not isinstance(prompt_tokens, int):
            prompt = request.prompt
            try:
                prompt_tokens = len(await self.tokenize(prompt)) if isinstance(prompt, str) else len(prompt)
            except BackendError:
                prompt_tokens = None
        if not isinstance(completion_tokens, int):
            completion_tokens = events
        if finish == "length":
            return Chunk(text, "length", prompt_tokens, completion_tokens, token_ids)
        return Chunk(text, "stop", prompt_tokens, completion_tokens, token_ids, stop=stop)

    # --- tokens ----------------------------------------------------------------------------------------

    async def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        await self.connect()
        if self._dialect == "vllm" or self.info.owned_by == "sglang":
            body = await self._json(
                "POST", "/tokenize", {"model": self.info.id, "prompt": text, "add_special_tokens": False}
            )
            ids = body.get("tokens")
        elif self.info.owned_by == "llamacpp":
            ids = (await self._json("POST", "/tokenize", {"content": text, "parse_special": special})).get("tokens")
        elif self.info.owned_by == "me":  # llama-cpp-python's server
            ids = (await self._json("POST", "/extras/tokenize", {"input": text})).get("tokens")
        else:
            raise BackendError(f"The backend at {self.base_url} has no tokenize endpoint chatcodec knows.")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise BackendError(f"The backend at {self.base_url} answered tokenize without a token list.")
        return ids

    async def detokenize(self, ids: Sequence[int]) -> str:
        await self.connect()
        if self._dialect == "vllm" or self.info.owned_by == "sglang":
            text = (await self._json("POST", "/detokenize", {"model": self.info.id, "tokens": list(ids)})).get("prompt")
        elif self.info.owned_by == "llamacpp":
            text = (await self._json("POST", "/detokenize", {"tokens": list(ids)})).get("content")
        elif self.info.owned_by == "me":
            text = (await self._json("POST", "/extras/detokenize", {"tokens": list(ids)})).get("text")
        else:
            raise BackendError(f"The backend at {self.base_url} has no detokenize endpoint chatcodec knows.")
        if not isinstance(text, str):
            raise BackendError(f"The backend at {self.base_url} answered detokenize without text.")
        return text

    async def _json(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        try:
            response = await self._client.request(method, path, json=body)
        except httpx.TimeoutException as exc:
            raise BackendTimeoutError(f"The backend at {self.base_url} timed out ({type(exc).__name__}).") from None
        except httpx.HTTPError as exc:
            raise BackendError(f"Cannot reach the backend at {self.base_url}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            raise _refused(response)
        try:
            data = response.json()
        except ValueError:
            raise BackendError(f"{self.base_url}{path} did not answer JSON.") from None
        if not isinstance(data, dict):
            raise BackendError(f"{self.base_url}{path} did not answer a JSON object.")
        return data

    async def aclose(self) -> None:
        await self._client.aclose()


def _event(data: str) -> dict[str, Any]:
    try:
        event = json.loads(data)
    except ValueError:
        raise BackendError(f"The backend sent a stream event that is not JSON: {data[:200]!r}") from None
    if not isinstance(event, dict):
        raise BackendError(f"The backend sent a stream event that is not a JSON object: {data[:200]!r}")
    return event


def _message(body: Any) -> str:
    if isinstance(body, Mapping):
        err = body.get("error", body)
        if isinstance(err, Mapping) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("detail"):
            return str(body["detail"])
    return str(body)[:500]


def _refused(response: httpx.Response) -> BackendError:
    try:
        detail = _message(response.json())
    except ValueError:
        detail = response.text[:500]
    return BackendError(f"The backend answered {response.status_code}: {detail}", status=response.status_code)


def _token_ids(value: Any) -> tuple[int, ...] | None:
    """An event's ``token_ids`` (vLLM's, chatcodec serve's), or None when it has none."""
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return tuple(value)
    return None
