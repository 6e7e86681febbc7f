"""Decode model output into content, reasoning and tool calls, whole or streamed.

>>> from chatcodec.decoders import decoder
>>> text = 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
>>> msg = decoder("hermes").decode(text)
>>> msg.content, msg.tool_calls[0].name, msg.tool_calls[0].arguments
('Let me check.', 'get_weather', {'city': 'Paris'})
>>> msg.to_openai()["tool_calls"][0]["function"]["arguments"]
'{"city": "Paris"}'
"""

from .base import AssistantMessage as AssistantMessage
from .base import DecodeStream as DecodeStream
from .base import Delta as Delta
from .base import Span as Span
from .base import ToolCall as ToolCall
from .base import ToolCallDelta as ToolCallDelta
from .detect import Detection as Detection
from .detect import decoder as decoder
from .detect import decoder_for as decoder_for
from .detect import detect as detect
from .detect import detect_format as detect_format
from .detect import response_template as response_template
from .format import Decoder as Decoder
from .registry import formats as formats
from .response_reader import decoder_from_response_template as decoder_from_response_template

__all__ = [
    "AssistantMessage",
    "DecodeStream",
    "Decoder",
    "Delta",
    "Detection",
    "Span",
    "ToolCall",
    "ToolCallDelta",
    "decoder",
    "decoder_for",
    "decoder_from_response_template",
    "detect",
    "detect_format",
    "formats",
    "response_template",
]
