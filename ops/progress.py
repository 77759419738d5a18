"""A one-line progress bar with rate and ETA, on stderr, only when stderr is a terminal.

    with Progress("replay", total=n, unit="events") as bar:
        bar.update(done)        # cheap: redraws at most every `every` seconds

Nothing is printed when stderr is not a TTY (pipes, CI, tests), so output
stays clean for scripts.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

_WIDTH = 24


def _human(n: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}T"


def _eta(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


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
                    f"ETA {_eta(eta)}")
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
