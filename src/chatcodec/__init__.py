"""chatcodec: chat messages to model prompts and tokens, and model output back to messages.

>>> import chatcodec
>>> chat = chatcodec.load_template("qwen3")
>>> chat.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'

Names from the upper floors (:data:`_LAZY`) are imported on first use, so ``import chatcodec`` stays
small: ``chatcodec.apply_chat_template`` works, and costs its import only when it is used.
"""

import contextlib as _contextlib
import importlib as _importlib
import typing as _typing

from .capabilities import Capabilities as Capabilities
from .exceptions import BackendError as BackendError
from .exceptions import BackendTimeoutError as BackendTimeoutError
from .exceptions import ChatcodecError as ChatcodecError
from .exceptions import ConversationError as ConversationError
from .exceptions import DecodeError as DecodeError
from .exceptions import DecodeWarning as DecodeWarning
from .exceptions import InputError as InputError
from .exceptions import LimitError as LimitError
from .exceptions import LoadError as LoadError
from .exceptions import MaskError as MaskError
from .exceptions import PromptMismatchError as PromptMismatchError
from .exceptions import RenderWarning as RenderWarning
from .exceptions import SandboxError as SandboxError
from .exceptions import SchemaError as SchemaError
from .exceptions import SpecialTokenError as SpecialTokenError
from .exceptions import TemplateError as TemplateError
from .exceptions import TemplateNotFoundError as TemplateNotFoundError
from .exceptions import TemplateRaisedError as TemplateRaisedError
from .exceptions import TemplateRuntimeError as TemplateRuntimeError
from .exceptions import TemplateSyntaxError as TemplateSyntaxError
from .exceptions import ToolServerError as ToolServerError
from .history import History as History
from .limits import Limits as Limits
from .render import ChatTemplate as ChatTemplate
from .templates import builtin_templates as builtin_templates
from .templates import load_template as load_template
from .tokens import Codec as Codec
from .tokens import Encoding as Encoding
from .tokens import load as load
from .vocab import TextTokenizer as TextTokenizer

if _typing.TYPE_CHECKING:  # what type checkers and IDEs see for the lazy names
    from .compat import apply_chat_template as apply_chat_template
    from .compat import patch as patch
    from .conversation import Conversation as Conversation
    from .conversation import Drift as Drift
    from .conversation import Reset as Reset
    from .dataset import format_dataset as format_dataset
    from .decoders import AssistantMessage as AssistantMessage
    from .decoders import Decoder as Decoder
    from .decoders import DecodeStream as DecodeStream
    from .decoders import Delta as Delta
    from .decoders import ToolCall as ToolCall
    from .decoders import ToolCallDelta as ToolCallDelta
    from .decoders import decoder as decoder
    from .decoders import decoder_for as decoder_for
    from .decoders import decoder_from_response_template as decoder_from_response_template
    from .decoders import detect_format as detect_format
    from .decoders import response_template as response_template
    from .inspection import Finding as Finding
    from .inspection import Report as Report
    from .inspection import inspect as inspect
    from .inspection import lint as lint
    from .tools import Toolbox as Toolbox
    from .tools import tool_schema as tool_schema

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it from here

#: public name -> the module that defines it, imported the first time the name is used (PEP 562)
_LAZY: dict[str, str] = {
    # the decoders: 46 formats' machines and their detection, a third of the import
    "AssistantMessage": "chatcodec.decoders",
    "DecodeStream": "chatcodec.decoders",
    "Decoder": "chatcodec.decoders",
    "Delta": "chatcodec.decoders",
    "ToolCall": "chatcodec.decoders",
    "ToolCallDelta": "chatcodec.decoders",
    "decoder": "chatcodec.decoders",
    "decoder_for": "chatcodec.decoders",
    "decoder_from_response_template": "chatcodec.decoders",
    "detect_format": "chatcodec.decoders",
    "response_template": "chatcodec.decoders",
    "Conversation": "chatcodec.conversation",
    "Drift": "chatcodec.conversation",
    "Reset": "chatcodec.conversation",
    "Finding": "chatcodec.inspection",
    "Report": "chatcodec.inspection",
    "inspect": "chatcodec.inspection",
    "lint": "chatcodec.inspection",
    "format_dataset": "chatcodec.dataset",
    "Toolbox": "chatcodec.tools",
    "apply_chat_template": "chatcodec.compat",
    "patch": "chatcodec.compat",
    "tool_schema": "chatcodec.tools",
    "ParsedConversation": "chatcodec.unrender",
    "parse_conversation": "chatcodec.unrender",
}

__all__ = [
    "AssistantMessage",
    "BackendError",
    "BackendTimeoutError",
    "Capabilities",
    "ChatTemplate",
    "ChatcodecError",
    "Codec",
    "Conversation",
    "ConversationError",
    "DecodeError",
    "DecodeStream",
    "DecodeWarning",
    "Decoder",
    "Delta",
    "Drift",
    "Encoding",
    "Finding",
    "History",
    "InputError",
    "LimitError",
    "Limits",
    "LoadError",
    "MaskError",
    "ParsedConversation",
    "PromptMismatchError",
    "RenderWarning",
    "Report",
    "Reset",
    "SandboxError",
    "SchemaError",
    "SpecialTokenError",
    "TemplateError",
    "TemplateNotFoundError",
    "TemplateRaisedError",
    "TemplateRuntimeError",
    "TemplateSyntaxError",
    "TextTokenizer",
    "ToolCall",
    "ToolCallDelta",
    "ToolServerError",
    "Toolbox",
    "apply_chat_template",
    "builtin_templates",
    "decoder",
    "decoder_for",
    "decoder_from_response_template",
    "detect_format",
    "format_dataset",
    "inspect",
    "lint",
    "load",
    "load_template",
    "parse_conversation",
    "patch",
    "response_template",
    "tool_schema",
]


#: exported name -> the module that defines it (``__module__`` says ``chatcodec``; doctest needs the source)
_DEFINED_IN: dict[str, str] = {}


def _public(value: _typing.Any) -> _typing.Any:
    """Report ``chatcodec`` as the module of an exported class or function (tracebacks, reprs, help)."""
    module = getattr(value, "__module__", None)
    if isinstance(module, str) and module != "chatcodec":
        with _contextlib.suppress(AttributeError, TypeError):
            value.__module__ = "chatcodec"
            _DEFINED_IN[value.__name__] = module
    return value


for _name in __all__:
    if _name not in _LAZY:
        _public(globals()[_name])
del _name


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chatcodec' has no attribute {name!r}")
    value = _public(getattr(_importlib.import_module(module), name))
    globals()[name] = value  # later uses are plain attribute lookups
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
