"""nats-py's errors, mapped to crr's error tree at the bus boundary.

Code outside `bus/` never catches a raw `nats.errors.Error`: it wraps its
NATS calls in `with nats_errors():` (or lets `crr.bus.connection.connect` do it
for a whole command) and catches the `crr.schemas.errors` classes, whose
`retriable` flag the one retry policy (`crr.bus.retry`) reads.  The nats-py
error stays in `__cause__`.

- request/ack/flush timeout, `StaleConnectionError` → `BusTimeoutError` (retriable);
- `NoRespondersError`, `NoStreamResponseError` → `NoRespondersError` (retriable);
- connection closed/reconnecting/draining, `NoServersError`, a full outbound
  buffer, an `OSError` of a connect → `NotConnectedError` (retriable);
- `AuthorizationError`, a permissions violation, bad credentials → `AuthError`;
- `MaxPayloadError` → `MessageTooLargeError`; `BadSubjectError` → `SubjectError`;
- a JetStream API error → `JetStreamError` (retriable iff code >= 500) or one of its
  sub-classes by err_code: `StreamNotFoundError`, `NotFoundOnServerError` (any other
  404), `WrongLastSequenceError`, `SequenceCheckBusyError` and
  `DuplicateInProcessError` (both retriable);
- any other `nats.errors.Error` → `BusError` (retriable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import nats.errors
import nats.js.errors

from crr.schemas.errors import (
    AuthError,
    BusError,
    BusTimeoutError,
    CrrError,
    DuplicateInProcessError,
    JetStreamError,
    MessageTooLargeError,
    NoRespondersError,
    NotConnectedError,
    NotFoundOnServerError,
    SequenceCheckBusyError,
    StreamNotFoundError,
    SubjectError,
    WrongLastSequenceError,
)

STREAM_NOT_FOUND = 10059
"""JetStream err_code: the stream does not exist (as opposed to a missing message)."""
WRONG_LAST_SEQUENCE = 10071
"""JetStream err_code of a refused `Nats-Expected-Last-(Subject-)Sequence`."""
SEQUENCE_CHECK_BUSY = 10164
"""JetStream err_code (clustered streams): a sequence check refused because another
message checking the same subject is still in flight."""
DUPLICATE_IN_PROCESS = 10158
"""JetStream err_code: a message with this `Nats-Msg-Id` is still being stored."""

NO_STREAMS = "no crr streams on this server: start `crr projector` (it creates them)"

_NOT_CONNECTED = (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
                  nats.errors.ConnectionDrainingError, nats.errors.NoServersError,
                  nats.errors.OutboundBufferLimitError)
_BY_ERR_CODE: dict[int, type[JetStreamError]] = {
    STREAM_NOT_FOUND: StreamNotFoundError,
    WRONG_LAST_SEQUENCE: WrongLastSequenceError,
    SEQUENCE_CHECK_BUSY: SequenceCheckBusyError,
    DUPLICATE_IN_PROCESS: DuplicateInProcessError,
}

NATS_FAILURES: tuple[type[BaseException], ...] = (nats.errors.Error, TimeoutError,
                                                   ConnectionError)
"""What nats-py raises from a call on an open connection (a `ConnectionResetError`
"Connection lost" escapes its write path when the server goes away mid-call)."""
BUS_FAILURES: tuple[type[BaseException], ...] = (*NATS_FAILURES, OSError)
"""... and from a connect (CancelledError is not among them)."""


def _text(exc: BaseException) -> str:
    """`exc` as one non-empty line (some nats-py and asyncio errors have no text, and
    some fail to say it when built without their details)."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not hide the error itself
        text = ""
    return " ".join(text.split()) or type(exc).__name__


def describe(exc: BaseException) -> str:
    """`exc` as one non-empty line; a missing stream says what to do about it instead."""
    if isinstance(from_nats(exc), StreamNotFoundError):
        return NO_STREAMS
    return _text(exc)


def _is_auth(exc: BaseException) -> bool:
    text = _text(exc).lower()
    return "authorization" in text or "authentication" in text or "permissions" in text


def _from_api(exc: nats.js.errors.APIError, where: str | None) -> JetStreamError:
    # (Some sub-classes, the key-value ones, skip APIError.__init__: no code attributes.)
    code: int | None = getattr(exc, "code", None)
    err_code: int | None = getattr(exc, "err_code", None)
    cls = _BY_ERR_CODE.get(err_code or 0)
    if cls is None:
        cls = NotFoundOnServerError if code == 404 else JetStreamError
    message = NO_STREAMS if cls is StreamNotFoundError else (
        f"JetStream refused: {getattr(exc, 'description', None) or _text(exc)}"
        f" (code {code}, err_code {err_code})")
    return cls(message, code=code, err_code=err_code, where=where)


def from_nats(exc: BaseException, *, where: str | None = None) -> CrrError | None:
    """The crr error for `exc` (a nats-py, timeout or OS error); None if it is none of those.

    A `CrrError` is returned as it is.
    """
    match exc:
        case CrrError():
            return exc
        case nats.js.errors.APIError():
            return _from_api(exc, where)
        case nats.errors.NoRespondersError() | nats.js.errors.NoStreamResponseError():
            return NoRespondersError(f"no responders: {NO_STREAMS}", where=where)
        case nats.errors.MaxPayloadError():
            return MessageTooLargeError("message larger than the server's max_payload "
                                        f"(1 MiB by default): {_text(exc)}", where=where)
        case nats.errors.BadSubjectError():
            return SubjectError(f"invalid subject: {_text(exc)}", where=where)
        case nats.errors.AuthorizationError() | nats.errors.InvalidUserCredentialsError():
            return AuthError(_text(exc), where=where)
        case nats.errors.Error() if _is_auth(exc):
            return AuthError(_text(exc), where=where)
        case nats.errors.StaleConnectionError():
            return BusTimeoutError(f"connection stale: the server stopped answering "
                                   f"({_text(exc)})", where=where)
        case nats.errors.Error() if isinstance(exc, _NOT_CONNECTED):
            return NotConnectedError(_text(exc), where=where)
        case TimeoutError():  # nats.errors.TimeoutError is one too (asyncio.TimeoutError)
            return BusTimeoutError(f"no answer in time ({_text(exc)})", where=where)
        case nats.errors.Error():
            return BusError(_text(exc), where=where)
        case OSError():
            return NotConnectedError(_text(exc), where=where)
    return None


def as_crr_error(exc: BaseException, *, where: str | None = None) -> BaseException:
    """`from_nats(exc)`, chained to `exc`; `exc` itself when it is not a bus failure."""
    mapped = from_nats(exc, where=where)
    if mapped is None or mapped is exc:
        return exc
    mapped.__cause__ = exc
    return mapped


@contextmanager
def nats_errors(where: str | None = None) -> Iterator[None]:
    """Raise crr's error for any nats-py error (or timeout) in the block.

    `asyncio.CancelledError` and errors that are already `CrrError`s pass through.
    """
    try:
        yield
    except asyncio.CancelledError:
        raise
    except CrrError:
        raise
    except NATS_FAILURES as exc:
        raise as_crr_error(exc, where=where) from exc
