"""An event subject parsed once: what it says (type, reporter, host), or why it is no event
subject.  Cached, because the same subjects come again and again."""

from __future__ import annotations

import functools

from crr.schemas.errors import SubjectError
from crr.schemas.subjects import EventAddress, parse_event_subject


@functools.lru_cache(maxsize=1 << 16)
def address(subject: str) -> EventAddress | str:
    """The parsed event subject, or why it is not one (cached: subjects repeat)."""
    try:
        return parse_event_subject(subject)
    except SubjectError as exc:
        return f"unknown subject: {exc.message}"
