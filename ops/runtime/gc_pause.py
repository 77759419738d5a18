"""Pausing the cyclic garbage collector while a synchronous bulk build runs."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a synchronous bulk build.

    Decoding tens of thousands of snapshots creates millions of objects,
    none of them garbage; generation scans would cost as much as the
    decoding.  Nested use is safe.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
