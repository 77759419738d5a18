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
    """Talking to NATS failed."""

    retriable = True


class NotConnectedError(BusError):
    """No NATS server could be reached (yet)."""


class AuthError(BusError):
    """The server refused our credentials or a publish permission; retrying will not help."""

    retriable = False


class StreamConfigError(CrrError, RuntimeError):
    """An existing stream's configuration conflicts with what crr needs."""


class ReporterError(CrrError, RuntimeError):
    """A reporter script could not be run or misbehaved."""


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
