"""`crr hosts forget`: the admin instruction that drops what the fold knows of a host, or of
one reporter on it (docs/contract.md, "Subjects and streams": admin subjects)."""

from __future__ import annotations

from typing import Final

import msgspec

from crr.projections.changes import Acc, stamp
from crr.projections.envelope import Envelope
from crr.projections.event_address import address
from crr.projections.state import ProjectionState
from crr.projections.validation import short
from crr.schemas.errors import SubjectError
from crr.schemas.events import Forget
from crr.schemas.subjects import EventAddress, parse_forget_subject

_FORGET: Final = msgspec.json.Decoder(Forget)


def apply_forget(state: ProjectionState, env: Envelope, acc: Acc) -> str | None:
    """`crr hosts forget`: drop everything known about the host (docs/contract.md, "Subjects and
    streams": admin subjects).

    Its batches are killed (their deadline entries are skipped when they come
    due; a silence entry finds no record and does nothing), events of it held
    for a catalog are dropped, and the host is reported changed: with no record
    left the projector writes a delete marker.  Later events bring it back.
    """
    try:
        host = parse_forget_subject(env.subject)
    except SubjectError as exc:
        return f"unknown subject: {exc.message}"
    if host is None:
        return f"unknown subject: {short(env.subject)!r} is no admin instruction crr knows"
    try:
        forget = _FORGET.decode(env.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"bad forget instruction: {exc}"
    if forget.host != host:
        return (f"payload names host {short(forget.host)!r} but the subject says "
                f"{short(host)!r}")
    if forget.reporter is not msgspec.UNSET:
        _forget_reporter(state, host, forget.reporter, acc)
        return None
    rec = state.hosts.pop(host, None)
    if rec is not None:
        for rs in rec.reporters.values():
            for b in rs.batches:
                b.kill()
            rs.batches = []
    for subject in [s for s in state.pending if _pending_host(s) == host]:
        del state.pending[subject]
    acc.hosts.add(host)
    return None


def _forget_reporter(state: ProjectionState, host: str, reporter: str, acc: Acc) -> None:
    """`crr hosts forget HOST --reporter R`: drop R's row on the host, its values (they
    live in its batches, which die) and its inventory; events of R on the host held for
    a catalog go too.  Other reporters' rows and values are untouched.  The host goes
    with it when nothing else is left of it (a delete marker, as for a whole host).
    Its deadline entries find no row when they come due and do nothing.  Later events
    of R bring its row back.
    """
    for subject in [s for s in state.pending if _pending_address(s) == (host, reporter)]:
        del state.pending[subject]
    rec = state.hosts.get(host)
    if rec is None:
        return
    rs = rec.reporters.pop(reporter, None)
    if rs is not None:
        for b in rs.batches:
            b.kill()
        rs.batches = []
    had_inventory = rec.inventory.pop(reporter, None) is not None
    if rs is None and not had_inventory:
        return  # nothing of R here: no change
    if not rec.reporters and not rec.inventory:
        del state.hosts[host]
    else:
        stamp(rec, acc)
    acc.hosts.add(host)


def _pending_host(subject: str) -> str | None:
    addr = address(subject)
    return addr.host if isinstance(addr, EventAddress) else None


def _pending_address(subject: str) -> tuple[str | None, str] | None:
    addr = address(subject)
    return (addr.host, addr.reporter) if isinstance(addr, EventAddress) else None
