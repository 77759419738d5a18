"""A one-line progress bar with rate and ETA, on stderr, only when stderr is a terminal.

    with Progress("replay", total=n, unit="events") as bar:
        bar.update(done)        # cheap: redraws at most every `every` seconds

Nothing is printed when stderr is not a TTY (pipes, CI, tests), so output
stays clean for scripts.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from crr.projections.freshness import format_eta
from crr.schemas.snapshot import RebuildProgress

_WIDTH = 24


def _human(n: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}T"




class Progress:
    """Redraws `label [####----] done/total unit  rate/s  ETA m:ss` in place."""

    def __init__(self, label: str, *, total: float | None, unit: str = "",
                 stream: TextIO | None = None, enabled: bool | None = None,
                 every: float = 0.2) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.every = every
        self._start = time.monotonic()
        self._next = self._start + every
        self._drawn = False

    def update(self, done: float, *, total: float | None = None) -> None:
        """Report progress; redraws only when the last draw is `every` seconds old."""
        if not self.enabled:
            return
        if total is not None:
            self.total = total
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every
        self._draw(done, now)

    def line(self, done: float, now: float) -> str:
        """The text of the bar for `done` at monotonic time `now`."""
        elapsed = max(now - self._start, 1e-9)
        rate = done / elapsed
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            frac = min(max(done / self.total, 0.0), 1.0)
            fill = round(frac * _WIDTH)
            eta = (self.total - done) / rate if rate > 0 else 0.0
            return (f"{self.label} [{'#' * fill}{'-' * (_WIDTH - fill)}] {frac:4.0%} "
                    f"{_human(done)}/{_human(self.total)}{unit}  {_human(rate)}/s  "
                    f"ETA {format_eta(eta)}")
        return f"{self.label} {_human(done)}{unit}  {_human(rate)}/s"

    def _draw(self, done: float, now: float) -> None:
        self.stream.write("\r\x1b[2K" + self.line(done, now))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar (the command prints its own summary)."""
        if self.enabled and self._drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


async def show_rebuild(progress: Callable[[], RebuildProgress | None], done: asyncio.Event,
                       *, stream: TextIO | None = None) -> None:
    """A progress bar of a projector's rebuild (`Projector.rebuild_progress`) until
    `done` (its `ready`) is set; nothing unless stderr is a terminal."""
    with Progress("rebuilding", total=None, unit="events", stream=stream) as bar:
        if not bar.enabled:
            return
        while not done.is_set():
            now = progress()
            if now is not None:
                bar.update(now.folded, total=now.to_fold)
            await asyncio.sleep(bar.every)  # a redraw cadence, not a synchronisation
