"""The one error tree of crr.

Every error raised on purpose by crr is a `CrrError`.  Sub-classes also
inherit the builtin they resemble so callers can catch either.  `retriable`
tells the tenacity policies in `bus/` whether trying again can help.
"""

from __future__ import annotations


class CrrError(Exception):
    """Base of every error crr raises on purpose."""

    retriable: bool = False

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.message = message
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class CatalogError(CrrError, ValueError):
    """`resources.yaml` (or a published catalog) is invalid.

    `problems` holds every error found, each already prefixed with its path
    (`resources.datasets.kind: expected one of ...`).
    """

    def __init__(self, problems: list[str], *, where: str | None = None) -> None:
        self.problems = list(problems)
        head = f"{len(problems)} error(s) in catalog"
        super().__init__(head + ":\n  " + "\n  ".join(problems), where=where)


class DurationError(CrrError, ValueError):
    """A duration such as `30s` could not be parsed."""


class PayloadError(CrrError, ValueError):
    """An event payload could not be decoded or does not match its subject."""


class SubjectError(CrrError, ValueError):
    """A subject or subject token is malformed."""


class ExpressionError(CrrError, ValueError):
    """A `select[]` expression does not parse or does not type-check.

    `column` is the 0-based offset of the offending token in `expression`.
    """

    def __init__(self, message: str, *, expression: str, column: int) -> None:
        self.expression = expression
        self.column = column
        super().__init__(message)

    def pretty(self) -> str:
        """The message, the expression and a caret under the offending token."""
        return f"{self.message}\n  {self.expression}\n  {' ' * self.column}^"


class BusError(CrrError, ConnectionError):
    """Talking to NATS failed.

    `crr.bus.errors` maps every nats-py error (and a timeout or `OSError` of a NATS
    call) to this class or one of its sub-classes, so code outside `bus/` never
    catches a raw `nats.errors.Error`.  The original stays in `__cause__`.
    """

    retriable = True


class NotConnectedError(BusError):
    """No NATS server could be reached (yet), or the connection is down or closing."""


class NotNatsServerError(NotConnectedError):
    """The address answers, but not as a NATS server does (no `INFO` line first): a wrong
    port or URL; retrying will not help."""

    retriable = False


class AuthError(BusError):
    """The server refused our credentials or a publish permission; retrying will not help."""

    retriable = False


class BusTimeoutError(BusError, TimeoutError):
    """No answer in time: a request, a JetStream ack, or a connection gone stale.

    Whether the server acted on what was sent is unknown; retrying (with the same
    `Nats-Msg-Id`) is safe and may help.
    """

    retriable = True


class NoRespondersError(BusError):
    """Nobody answers on the subject: no JetStream stream captures it (start `crr
    projector`, which creates the streams), or no service is subscribed yet."""

    retriable = True


class MessageTooLargeError(BusError, ValueError):
    """The message exceeds the server's `max_payload`; retrying will not help."""

    retriable = False


class JetStreamError(BusError):
    """The JetStream API answered with an error.

    `code` is the HTTP-like status (404, 400, 503…), `err_code` JetStream's own
    number (10059 "stream not found"…).  A server-side failure (`code` >= 500:
    no leader during an election, the store busy) is retriable; a refusal of the
    request itself is not.
    """

    def __init__(self, message: str, *, code: int | None = None, err_code: int | None = None,
                 where: str | None = None) -> None:
        self.code = code
        self.err_code = err_code
        self.retriable = code is not None and code >= 500
        super().__init__(message, where=where)


class NotFoundOnServerError(JetStreamError, LookupError):
    """JetStream has no such thing: a message (none on that subject or sequence), a
    consumer, or a stream (`StreamNotFoundError`)."""


class StreamNotFoundError(NotFoundOnServerError):
    """The stream does not exist (JetStream err_code 10059)."""


class WrongLastSequenceError(JetStreamError):
    """A write expecting a last (subject) sequence was refused: someone wrote since
    (err_code 10071).  The projector's fence: the lease moved on."""


class SequenceCheckBusyError(JetStreamError):
    """A clustered stream refused a sequence-checked write only because another one on
    the same subject is in flight (err_code 10164): retriable."""

    def __init__(self, message: str, *, code: int | None = None, err_code: int | None = None,
                 where: str | None = None) -> None:
        super().__init__(message, code=code, err_code=err_code, where=where)
        self.retriable = True


class DuplicateInProcessError(JetStreamError):
    """A message with this `Nats-Msg-Id` is still being stored (an earlier attempt, err_code
    10158): retriable; the retry is either stored or acknowledged as a duplicate."""

    def __init__(self, message: str, *, code: int | None = None, err_code: int | None = None,
                 where: str | None = None) -> None:
        super().__init__(message, code=code, err_code=err_code, where=where)
        self.retriable = True


class StreamConfigError(CrrError, RuntimeError):
    """An existing stream's configuration conflicts with what crr needs."""


class ReporterError(CrrError, RuntimeError):
    """A reporter script could not be run or misbehaved."""


class UnknownReporterError(CrrError, LookupError):
    """A reporter the active catalog does not declare: every value it sent would be
    rejected, so `crr report` and the SDK refuse to publish for it."""


class WrongScopeError(UnknownReporterError):
    """A declared reporter publishing on a scope the catalog gives it no resource of (a
    cluster-scope reporter with a host, or a host-scope one without): refused before
    anything is published, as an undeclared reporter is; the projector dead-letters such
    an event (docs/contract.md)."""


class ReportRejectedError(CrrError, ValueError):
    """The projector did not apply (all of) a report (the SDK's `submit`).

    `state` is the verdict (`rejected`, `deadlettered`, `pending`: no catalog active
    yet, `not_applied`); `applied` the names it set anyway; `rejected` name → why
    (`"name: why"`, as `crr report` prints it); `reason` why a report was not applied
    at all.
    """

    def __init__(self, message: str, *, state: str, applied: list[str],
                 rejected: dict[str, str], reason: str | None = None) -> None:
        self.state = state
        self.applied = list(applied)
        self.rejected = dict(rejected)
        self.reason = reason
        super().__init__(message)


class CrrTimeoutError(CrrError, TimeoutError):
    """A bounded wait (a projector position, a readiness signal) ran out."""

    retriable = True


class NotReadyError(CrrError, RuntimeError):
    """A reader was asked for data before its initial load completed.

    "Not loaded yet" is never "absent": the scheduler view raises this
    instead of answering from a partial snapshot.
    """

    retriable = True


class LeaseLostError(CrrError, RuntimeError):
    """This projector no longer holds the writer lease: the server refused a fenced write.

    Another projector took over; this one must stop writing (it becomes a standby).
    """


class BridgeError(CrrError):
    """A scheduler target refused or failed a bridge's command (slurmctld down, a
    permission refused, a feature file that cannot be written).  Retried with back-off
    by the bridge engine, counted, never fatal to the bridge."""

    retriable = True


class SchedulerCommandError(BridgeError, RuntimeError):
    """A scheduler's own command (`scontrol`, `sinfo`) failed, timed out or could not be run.

    The `BridgeError` of a command-line target.  A bridge counts it, shows it in its
    status and tries again with back-off; it never stops the bridge.  `command` is the
    program name, `returncode` its exit status (None when it did not finish), `detail`
    the first line of what it said.
    """

    retriable = True

    def __init__(self, command: str, detail: str, *, returncode: int | None = None) -> None:
        self.command = command
        self.detail = detail
        self.returncode = returncode
        status = "timed out" if returncode is None else f"exit {returncode}"
        super().__init__(f"{status}: {detail}", where=command)
