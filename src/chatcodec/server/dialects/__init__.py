"""The API dialects beside chat completions: each turns its request into the one internal request
(:class:`~chatcodec.server.protocol.ChatRequest`) and the service's answer (:class:`~chatcodec.server.chat.Outcome`
and the deltas before it) back into its own shape, whole and as its event stream. None knows another, and nothing
below the server knows any.

- :mod:`.responses`: OpenAI's Responses API (``POST /v1/responses``, with the store behind
  ``previous_response_id``);
- :mod:`.messages`: Anthropic's Messages API (``POST /v1/messages`` and ``/v1/messages/count_tokens``).

Chat completions itself is :mod:`chatcodec.server.protocol` (its request) and
:class:`~chatcodec.server.chat.ChatService` (its answer).
"""
