"""Connecting to NATS: the one place crr opens a connection.

nats-py's defaults give up reconnecting after about two minutes; crr's
long-running processes reconnect forever, with jittered exponential delays
from tenacity so a fleet of agents does not stampede a restarted server.
The initial connect is retried with the same policy: forever for services
(`retry_initial=None`), a few attempts for one-shot CLI commands.
"""

from __future__ import annotations

import logging
import os
import random
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import nats
import nats.errors
import tenacity
from nats.aio.client import Client

from schemas.errors import AuthError, NotConnectedError

log = logging.getLogger("crr.bus")

DEFAULT_URL = "nats://127.0.0.1:4222"

_reconnect_wait = (tenacity.wait_exponential(multiplier=0.05, max=2.0)
                   + tenacity.wait_random(0, 0.25))


def default_url() -> str:
    """`NATS_URL` from the environment, else `nats://127.0.0.1:4222`."""
    return os.environ.get("NATS_URL") or DEFAULT_URL


def _reconnect_delay(attempt: int) -> float:
    state = tenacity.RetryCallState(retry_object=tenacity.AsyncRetrying(), fn=None, args=(),
                                    kwargs={})
    state.attempt_number = max(1, attempt)
    return float(_reconnect_wait(state))


def _pick_server(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
    """nats-py reconnect hook: a random eligible server after a jittered delay."""
    server = random.choice(servers)  # noqa: S311 - load spreading, not security
    return server, _reconnect_delay(getattr(server, "reconnects", 0) + 1)


def _is_auth_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "authorization" in text or "authentication" in text or "permissions" in text


async def _on_error(exc: Exception) -> None:
    log.warning("nats: %s", exc)


async def _on_disconnect() -> None:
    log.info("nats: disconnected")


async def _on_reconnect() -> None:
    log.info("nats: reconnected")


async def open_connection(
    url: str | None = None,
    *,
    creds: str | None = None,
    name: str = "crr",
    tls_ca: str | None = None,
    attempts: int | None = 5,
    connect_timeout: float = 2.0,
) -> Client:
    """Connect (retrying `attempts` times; None = forever) and return the client.

    Raises `AuthError` at once for refused credentials (retrying cannot help)
    and `NotConnectedError` with the URL when no server answered.
    """
    servers = [s.strip() for s in (url or default_url()).split(",") if s.strip()]
    if creds is not None and not os.path.isfile(creds):  # noqa: ASYNC240 - one stat, at startup
        raise AuthError(f"credentials file not found: {creds}")
    tls: ssl.SSLContext | None = None
    if tls_ca is not None or any(s.startswith("tls://") for s in servers):
        tls = ssl.create_default_context(cafile=tls_ca)

    options: dict[str, Any] = {
        "servers": servers,
        "name": name,
        "connect_timeout": connect_timeout,
        "allow_reconnect": True,
        # One pass over the servers per initial attempt (tenacity retries the
        # attempt); once connected, reconnect forever (set below).
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": 0.2,
        "reconnect_to_server_handler": _pick_server,
        "error_cb": _on_error,
        "disconnected_cb": _on_disconnect,
        "reconnected_cb": _on_reconnect,
        "pending_size": 64 * 1024 * 1024,
    }
    if creds is not None:
        options["user_credentials"] = creds
    if tls is not None:
        options["tls"] = tls

    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_never if attempts is None else tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_exponential(multiplier=0.2, max=5.0) + tenacity.wait_random(0, 0.5),
        retry=tenacity.retry_if_exception(lambda e: not isinstance(e, AuthError)),
        reraise=True,
        before_sleep=lambda rs: log.warning(
            "cannot reach NATS at %s (%s); retrying", ",".join(servers),
            rs.outcome.exception() if rs.outcome else "?",
        ),
    )
    try:
        async for attempt in retrying:
            with attempt:
                try:
                    nc = await nats.connect(**options)
                except Exception as exc:
                    if _is_auth_error(exc):
                        raise AuthError(f"NATS at {','.join(servers)} refused the credentials: "
                                        f"{exc}") from None
                    raise NotConnectedError(
                        f"cannot reach NATS at {','.join(servers)}: {exc or type(exc).__name__}"
                    ) from None
                nc.options["max_reconnect_attempts"] = -1
                return nc
    except tenacity.RetryError as exc:  # pragma: no cover - reraise=True makes this unreachable
        raise NotConnectedError(f"cannot reach NATS at {','.join(servers)}") from exc
    raise NotConnectedError(f"cannot reach NATS at {','.join(servers)}")  # pragma: no cover


@asynccontextmanager
async def connect(
    url: str | None = None,
    *,
    creds: str | None = None,
    name: str = "crr",
    tls_ca: str | None = None,
    attempts: int | None = 5,
) -> AsyncIterator[Client]:
    """`async with connect(...) as nc:` — open, yield, then drain and close."""
    nc = await open_connection(url, creds=creds, name=name, tls_ca=tls_ca, attempts=attempts)
    try:
        yield nc
    finally:
        if nc.is_connected:
            try:
                await nc.drain()
            except (nats.errors.Error, TimeoutError):
                await nc.close()
        else:
            await nc.close()
