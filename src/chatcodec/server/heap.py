"""Giving the heap a large request freed back to the operating system.

A prompt of megabytes is millions of tokens, each an int, a tuple of offsets and list slots: hundreds of
megabytes of small objects, allocated on a worker thread. Python frees them when the request ends, but glibc's
malloc keeps the freed pages in its arenas (one per thread that allocated), so the server's resident size stays
at its peak: 8 MiB prompts left it at 2.5x its start with nothing alive. ``malloc_trim(0)`` hands the free
pages of every arena back; the server calls it after a request whose body was large, before it answers.
Elsewhere than glibc (macOS, musl, Windows) there is nothing to call and :func:`trim` does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

__all__ = ["TRIM_AFTER", "trim"]

#: a request body of at least this many bytes has its freed heap given back after it (a smaller one cannot
#: leave much: the work of a request grows with its body)
TRIM_AFTER = 1 << 20


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        function: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return function


def trim() -> bool:
    """Give the free pages of malloc's arenas back to the operating system (ctypes lets the GIL go meanwhile).
    False where the C library has no ``malloc_trim``."""
    function = _malloc_trim()
    if function is None:
        return False
    function(0)
    return True
