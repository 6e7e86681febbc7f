"""chatcodec: chat messages to model prompts and tokens, and model output back to messages."""

from .exceptions import ChatcodecError as ChatcodecError
