"""Giving the process's freed memory back to the OS after a burst.

A long-running service that went through a burst (the projector catching up
after an overload) frees what it buffered, but glibc's allocator keeps the
free pages in the process: its RSS then carries the burst's high-water mark.
`trim` returns them (`malloc_trim(0)`); elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Final


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_TRIM: Final = getattr(_libc(), "malloc_trim", None)


def trim() -> int:
    """Give the heap's free pages back to the OS; 1 when it could (glibc), else 0."""
    if _TRIM is None:
        return 0
    _TRIM(0)
    return 1
