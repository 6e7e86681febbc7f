"""Decode model output into content, reasoning and tool calls, whole or streamed."""

from .base import AssistantMessage as AssistantMessage
from .base import DecodeStream as DecodeStream
from .base import Delta as Delta
from .base import Span as Span
from .base import ToolCall as ToolCall
from .base import ToolCallDelta as ToolCallDelta
from .registry import Decoder as Decoder
from .registry import decoder as decoder
from .registry import formats as formats

__all__ = [
    "AssistantMessage",
    "DecodeStream",
    "Decoder",
    "Delta",
    "Span",
    "ToolCall",
    "ToolCallDelta",
    "decoder",
    "formats",
]
