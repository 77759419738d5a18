"""The REST API's errors as RFC 9457 problem details (`application/problem+json`).

A bad `select[]` expression is a 400 whose `detail` carries the caret message
and `column` the 0-based offset; `NotReadyError` (before the view's initial
load) a 503; any other `CrrError` a 400; Litestar's own HTTP errors keep their
status; anything else is a 500 that names only the exception's type (the rest
is logged).
"""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap

from crr.schemas.errors import CrrError, ExpressionError, NotReadyError

log = logging.getLogger("crr.api")

PROBLEM_JSON: Final = "application/problem+json"


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An RFC 9457 problem detail."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    expression: str | None = None
    """For a bad `select[]` expression: the expression as given."""
    column: int | None = None
    """For a bad `select[]` expression: 0-based offset of the offending token."""


def _problem(status: int, title: str, detail: str | None = None, *,
             instance: str | None = None, **extra: Any) -> Response[Problem]:
    return Response(Problem(title=title, status=status, detail=detail, instance=instance,
                            **extra), status_code=status, media_type=PROBLEM_JSON)


def _on_expression(request: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
    assert isinstance(exc, ExpressionError)
    return _problem(400, "Bad select[] expression", exc.pretty(), instance=request.url.path,
                    expression=exc.expression, column=exc.column,
                    type="https://crr.invalid/problems/bad-expression")


def _on_not_ready(request: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
    return _problem(503, "Scheduler view not ready", str(exc), instance=request.url.path)


def _on_crr(request: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
    return _problem(400, "Bad request", str(exc), instance=request.url.path)


def _on_http(request: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
    assert isinstance(exc, HTTPException)
    detail = exc.detail
    if isinstance(exc, ValidationException) and exc.extra:
        detail = f"{detail}: {msgspec.json.encode(exc.extra).decode()}"
    title = {400: "Bad request", 404: "Not found", 405: "Method not allowed"}.get(
        exc.status_code, "HTTP error")
    return _problem(exc.status_code, title, detail, instance=request.url.path)


def _on_internal(request: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
    log.exception("internal error on %s", request.url.path, exc_info=exc)
    return _problem(500, "Internal server error", type(exc).__name__, instance=request.url.path)


EXCEPTION_HANDLERS: Final[ExceptionHandlersMap] = {
    ExpressionError: _on_expression,
    NotReadyError: _on_not_ready,
    CrrError: _on_crr,
    HTTPException: _on_http,
    Exception: _on_internal,
}
"""Litestar's `exception_handlers` for the app (most specific first, as Litestar looks
them up along the exception's MRO)."""
