"""Every error chatcodec raises for a template, a file or an input.

One base class, so callers can catch everything chatcodec reports with one ``except``::

    ChatcodecError
    ├── TemplateError               a template failed to compile or render; carries name and line
    │   ├── TemplateSyntaxError     the template source does not parse
    │   ├── TemplateRuntimeError    an operation inside the template failed (a TypeError, an undefined value)
    │   │   └── TemplateRaisedError the template called raise_exception(); the text is kept verbatim
    │   ├── SandboxError            the template reached for something the sandbox forbids
    │   └── LimitError              the render went over a budget: output size, time or recursion
    ├── InputError                  messages, tools, documents or options that cannot be rendered
    │   ├── SpecialTokenError       message text holds a control token and the policy is "reject"
    │   ├── MaskError               assistant turns that no supervised token can be found for
    │   └── PromptMismatchError     a prompt the template does not render from any text messages
    ├── SchemaError                 a Python function cannot be turned into a tool schema
    ├── LoadError                   a template or tokenizer file is missing, unreadable or malformed
    │   └── TemplateNotFoundError   no template under that name or in that place
    ├── DecodeError                 a decoder was asked for with options it cannot honour
    ├── ConversationError           a Conversation used out of order, or from two threads at once
    ├── BackendError                a completion backend is unreachable, failed, or answered nonsense
    │   └── BackendTimeoutError     a completion backend did not answer in time
    └── ToolServerError             an MCP server for a Toolbox could not be started, reached or listed

``InputError``, ``SchemaError``, ``LoadError`` and ``DecodeError`` also derive from ``ValueError``,
so code written against transformers' ``ValueError`` keeps working.

Two warnings, both ``UserWarning``: :class:`DecodeWarning`, a decoder for a template that renders tools found
no tool-call format in it, so tool calls in the output would stay text; and :class:`RenderWarning`, the
template wrote nothing for a message of a role it does not know.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendTimeoutError",
    "ChatcodecError",
    "ConversationError",
    "DecodeError",
    "DecodeWarning",
    "InputError",
    "LimitError",
    "LoadError",
    "MaskError",
    "PromptMismatchError",
    "RenderWarning",
    "SandboxError",
    "SchemaError",
    "SpecialTokenError",
    "TemplateError",
    "TemplateNotFoundError",
    "TemplateRaisedError",
    "TemplateRuntimeError",
    "TemplateSyntaxError",
    "ToolServerError",
]


class ChatcodecError(Exception):
    """Base class of every error chatcodec raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class TemplateError(ChatcodecError):
    """A chat template failed to compile or to render.

    ``message`` is the bare reason; ``str()`` adds where it happened: the template's name and the
    line of the template source.
    """

    def __init__(self, message: str, *, template_name: str | None = None, lineno: int | None = None) -> None:
        super().__init__(message)
        self.template_name = template_name
        self.lineno = lineno

    def __str__(self) -> str:
        where = []
        if self.template_name:
            where.append(f"template {self.template_name!r}")
        if self.lineno:
            where.append(f"line {self.lineno}")
        return f"{self.message} ({', '.join(where)})" if where else self.message


class TemplateSyntaxError(TemplateError):
    """The template source is not valid Jinja."""


class TemplateRuntimeError(TemplateError):
    """An operation inside the template failed while rendering.

    ``python_type`` names the underlying Python or Jinja error (``"TypeError"``, ``"UndefinedError"``),
    which is what transformers would have raised.
    """

    def __init__(
        self,
        message: str,
        *,
        python_type: str = "",
        template_name: str | None = None,
        lineno: int | None = None,
    ) -> None:
        super().__init__(message, template_name=template_name, lineno=lineno)
        self.python_type = python_type


class TemplateRaisedError(TemplateRuntimeError):
    """The template rejected the input itself, with ``raise_exception(message)``."""


class SandboxError(TemplateError):
    """The template tried to reach something the sandbox does not allow."""


class LimitError(TemplateError):
    """The render went over one of its budgets (see :class:`chatcodec.Limits`)."""


class InputError(ChatcodecError, ValueError):
    """Messages, tools, documents or options that cannot be rendered as given."""


class SpecialTokenError(InputError):
    """Text from a message holds a control token and the special-token policy is ``"reject"``."""


class MaskError(InputError):
    """A conversation has assistant turns, but no token of them could be marked for training."""


class PromptMismatchError(InputError):
    """A prompt to read back into messages (:func:`chatcodec.parse_conversation`) that the template does not
    render from any conversation of text messages: another template's, or rendered with other tools,
    date or variables."""


class SchemaError(ChatcodecError, ValueError):
    """A Python function cannot be turned into a JSON schema for a tool."""


class LoadError(ChatcodecError, ValueError):
    """A template or tokenizer source is missing, unreadable or malformed."""


class TemplateNotFoundError(LoadError, LookupError):
    """No chat template under that name or in that place."""


class DecodeError(ChatcodecError, ValueError):
    """A decoder was requested with a format or options it cannot honour.

    Model output itself never raises: decoders fall back to content instead.
    """


class DecodeWarning(UserWarning):
    """A decoder falls back to plain content for a template that renders tools: no tool-call format
    was found in the template, so tool calls in the model's output would stay text."""


class RenderWarning(UserWarning):
    """A message with a role the template does not know was rendered as nothing: its text is not in the
    prompt, and no error said so (transformers renders it the same way, silently)."""


class ConversationError(ChatcodecError, RuntimeError):
    """A :class:`chatcodec.Conversation` used out of order (a completion with no generation prompt before it,
    messages while a completion is awaited) or from two threads at once; the conversation is left as it was."""


class BackendError(ChatcodecError):
    """A completion backend (the embedded model or a remote server) could not produce the completion.

    ``status`` is the HTTP status the remote answered with, when it answered at all.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BackendTimeoutError(BackendError):
    """A completion backend did not answer, or stopped answering, within its timeout."""


class ToolServerError(ChatcodecError):
    """An MCP server for a :class:`~chatcodec.Toolbox` could not be started, reached or listed.

    Raised while the server is added; once it is in, its failures are the ``Error: ...`` results of calls.
    """
