"""Connecting to NATS: the one place crr opens a connection.

nats-py's defaults give up reconnecting after about two minutes; crr's
long-running processes reconnect forever, with jittered exponential delays
from `crr.bus.retry` so a fleet of agents does not stampede a restarted server.
The initial connect is retried with the same policy: forever for services
(`retry_initial=None`), a few attempts for one-shot CLI commands.

Credentials always come from a file (`--creds`, `$NATS_CREDS`), never from
a command line; the file's form is recognised (`credential_options`): a
JWT `.creds` file, an nkey seed file (`crr nats-config`'s default), or a
`user:`/`password:` file.  Asynchronous server errors (a permissions
violation arrives as an `-ERR` long after the publish returned) are logged
and handed to the listeners registered with `add_error_listener`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import random
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import nats
import nats.errors
from nats.aio.client import Client

from crr.bus import natspy
from crr.bus.errors import BUS_FAILURES, NATS_FAILURES, as_crr_error, describe
from crr.bus.nats_probe import check_nats
from crr.bus.natspy import headers as nats_headers
from crr.bus.retry import CONNECT, RECONNECT
from crr.schemas.distribution import install_hint
from crr.schemas.errors import AuthError, BusTimeoutError, NotConnectedError, NotNatsServerError

log = logging.getLogger("crr.bus")

Connection: TypeAlias = Client
"""An open connection to NATS, as services hold it: opened by `open_connection` or
`connect` (the composition root) and handed to `bus` functions and readers; code outside
`bus/` names this type, never nats-py's."""

DEFAULT_URL = "nats://127.0.0.1:4222"

def default_url() -> str:
    """`NATS_URL` from the environment, else `nats://127.0.0.1:4222`."""
    return os.environ.get("NATS_URL") or DEFAULT_URL


PING_INTERVAL = 5.0
MAX_OUTSTANDING_PINGS = 2
"""A server that stops answering (frozen, or cut off behind a silent network) is
given up after about (MAX_OUTSTANDING_PINGS + 1) x PING_INTERVAL = 15 s, then the
client reconnects elsewhere; nats-py's default (2 min x 2) would keep a client
on a dead server for up to 6 minutes."""


def _server_picker(current: list[str]) -> Callable[[list[Any], dict[str, Any]],
                                                     tuple[Any, float]]:
    """nats-py reconnect hook: a random eligible server after a jittered delay.

    The server being left (`current[0]`) is avoided when there are others: a
    client that leaves a server because it froze or lost its cluster should not
    pick it again by chance."""

    def pick(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        others = [s for s in servers if current and s.uri.netloc != current[0]]
        server = random.choice(others or servers)  # noqa: S311 - load spreading
        current[:] = [server.uri.netloc]
        return server, RECONNECT.delay(getattr(server, "reconnects", 0) + 1)

    return pick


async def switch_server(nc: Client, why: str) -> bool:
    """Reconnect `nc` to another server of its list (False if it has no other).

    For a server that still answers but cannot serve JetStream (cut off from its
    cluster's majority): pings alone never give it up."""
    if len(nc.servers) < 2 or not nc.is_connected:
        return False
    log.warning("nats: leaving %s (%s); reconnecting to another server",
                nc.connected_url.netloc if nc.connected_url else "?", why)
    force = getattr(nc, "force_reconnect", None)  # nats-py >= 2.10
    if force is None:
        return False
    await force()
    return True


def server_major_minor(nc: Connection) -> tuple[int, int] | None:
    """(major, minor) of the connected server's version; None when it does not parse."""
    server = nc.connected_server_version
    try:
        return server.major, server.minor
    except ValueError:
        return None


def max_payload(nc: Connection) -> int:
    """The largest message (headers and data) the connected server accepts, in bytes."""
    return nc.max_payload


def _redact(url: str) -> str:
    """`url` without a `user:password@` part (messages and logs never show secrets)."""
    scheme, sep, rest = url.rpartition("://")
    host = rest.rpartition("@")[2]
    return f"{scheme}{sep}{host}" if sep else host


def _is_auth_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "authorization" in text or "authentication" in text or "permissions" in text


ErrorListener = Callable[[Exception], None]
_LISTENERS = "crr_error_listeners"
_SEEN = "crr_seen_errors"


def _is_fatal(exc: BaseException) -> bool:
    """Errors no retry can fix: refused credentials, an untrusted server certificate."""
    return _is_auth_error(exc) or isinstance(exc, ssl.SSLCertVerificationError)


def display_url(url: str | None) -> str:
    """The server list `url` (default: `default_url()`) as messages show it: no passwords."""
    return ",".join(_redact(s.strip()) for s in (url or default_url()).split(",") if s.strip())


_SCHEMES = ("nats", "tls", "ws", "wss")


def check_urls(url: str) -> list[str]:
    """The comma-separated server list `url`, each checked for a scheme nats-py speaks.

    `http://…` (a common slip: the monitoring port) would otherwise be tried
    five times and fail with an unhelpful name-resolution error.
    """
    servers = [s.strip() for s in url.split(",") if s.strip()]
    if not servers:
        raise NotConnectedError(f"no NATS server URL given ({url!r})")
    for s in servers:
        scheme, sep, _ = s.partition("://")
        if sep and scheme.lower() not in _SCHEMES:
            raise NotConnectedError(
                f"unsupported URL scheme {scheme!r} in {_redact(s)}: use nats://, tls://, "
                "ws:// or wss:// (the NATS client port, usually 4222)")
    return servers


def _error_callback(
    listeners: list[ErrorListener], seen: list[Exception], fatal: asyncio.Event,
    connected: list[int],
) -> Callable[[Exception], Any]:
    async def on_error(exc: Exception) -> None:
        seen[:] = [exc]  # the last one: why a connect attempt failed
        if _is_fatal(exc):
            fatal.set()
        # While connecting, the failure reaches the caller as one error (or, for a
        # service retrying forever, as one WARNING per attempt): no per-server noise.
        # Once connected, a service logs what the server says at WARNING; a one-shot
        # command at INFO, and `connect` names it in the command's one error line.
        level = logging.DEBUG if not connected else connected[0]
        log.log(level, "nats: %s", describe(exc))
        for listener in list(listeners):
            try:
                listener(exc)
            except Exception:  # a listener's bug must not break the connection
                log.exception("error listener failed")

    return on_error


def add_error_listener(nc: Client, listener: ErrorListener) -> Callable[[], None]:
    """Call `listener(exc)` for each asynchronous error of `nc`; returns the remover.

    Only connections opened by `open_connection` carry listeners; on another
    client this does nothing (and the remover too).
    """
    return _register(nc, _LISTENERS, listener)


def _register(nc: Client, key: str, listener: Any) -> Callable[[], None]:
    """Add `listener` to the list stored under `key` in `nc.options`; returns the remover."""
    listeners: list[Any] | None = nc.options.get(key)
    if listeners is None:
        return lambda: None
    listeners.append(listener)

    def remove() -> None:
        if listener in listeners:
            listeners.remove(listener)

    return remove


def credential_options(path: str) -> dict[str, Any]:
    """nats-py connect options for the credentials file at `path` (its form is recognised).

    * a JWT `.creds` file (`-----BEGIN NATS USER JWT-----`): operator/JWT mode;
    * an nkey seed file (one line `SU…`, as `nk -gen user` or `crr nats-config` write);
    * `user: NAME` and `password: SECRET` lines (`crr nats-config --auth password`).

    Raises `AuthError` naming the file (never its contents) otherwise.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthError(f"cannot read credentials file {path}: "
                        f"{getattr(exc, 'strerror', None) or type(exc).__name__}") from None
    if "BEGIN NATS USER JWT" in text:
        _need_nkeys(path)
        return {"user_credentials": path}
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if len(lines) == 1 and lines[0].startswith("SU") and ":" not in lines[0]:
        _need_nkeys(path)
        return {"nkeys_seed": path}
    fields = {}
    for ln in lines:
        key, sep, value = ln.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    if fields.get("user") and fields.get("password"):
        return {"user": fields["user"], "password": fields["password"]}
    raise AuthError(f"credentials file {path}: not a NATS .creds file, an nkey seed file "
                    "or a user:/password: file")


def _need_nkeys(path: str) -> None:
    """nats-py signs with the `nkeys` package (the `auth` extra); say so before connecting."""
    try:
        importlib.import_module("nkeys")
    except ImportError:
        raise AuthError(f"credentials file {path} holds an nkey: nkeys is not installed "
                        f"(the auth extra): {install_hint('auth')}") from None


async def _on_disconnect() -> None:
    log.info("nats: disconnected")


ReconnectListener = Callable[[], None]
_RECONNECT_LISTENERS = "crr_reconnect_listeners"


def _reconnect_callback(listeners: list[ReconnectListener]) -> Callable[[], Any]:
    async def on_reconnect() -> None:
        log.info("nats: reconnected")
        for listener in list(listeners):
            try:
                listener()
            except Exception:  # a listener's bug must not break the connection
                log.exception("reconnect listener failed")

    return on_reconnect


def add_reconnect_listener(nc: Client, listener: ReconnectListener) -> Callable[[], None]:
    """Call `listener()` each time `nc` has reconnected; returns the remover.

    For readers that must check the server's state after an outage (a
    restarted server may have lost its last acknowledged messages).  Only
    connections opened by `open_connection` carry listeners; on another
    client this does nothing (and the remover too).
    """
    return _register(nc, _RECONNECT_LISTENERS, listener)


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
    servers = check_urls(url or default_url())
    if creds is not None and not os.path.isfile(creds):  # noqa: ASYNC240 - one stat, at startup
        raise AuthError(f"credentials file not found: {creds}")
    listeners: list[ErrorListener] = []
    reconnect_listeners: list[ReconnectListener] = []
    seen: list[Exception] = []
    fatal = asyncio.Event()
    current: list[str] = []
    connected: list[int] = []  # once connected: the level error_cb logs at
    shown = ",".join(_redact(s) for s in servers)  # for messages: no user:password@
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
        "reconnect_to_server_handler": _server_picker(current),
        "ping_interval": PING_INTERVAL,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
        "error_cb": _error_callback(listeners, seen, fatal, connected),
        "disconnected_cb": _on_disconnect,
        "reconnected_cb": _reconnect_callback(reconnect_listeners),
        "pending_size": 64 * 1024 * 1024,
    }
    if creds is not None:
        options.update(credential_options(creds))
    if tls is not None:
        options["tls"] = tls

    # AuthError is not retriable; NotConnectedError is.  A service (attempts=None)
    # says so at WARNING each time; a one-shot command fails with one line at the
    # end, so its retries are INFO.
    # A service retries a port that is not NATS too (it may be one again later), saying so.
    retrying = CONNECT.retrying(attempts=attempts, log=log,
                                also=(NotNatsServerError,) if attempts is None else (),
                                level=logging.WARNING if attempts is None else logging.INFO)
    async for attempt in retrying:
        with attempt:
            await check_nats(servers, [_redact(s) for s in servers])
            try:
                nc = await _connect_once(options, fatal, seen)
            except CredentialsRequiredError as exc:
                raise AuthError(f"NATS at {shown} requires credentials and none were given "
                                f"(pass --creds FILE); the connection ended with: "
                                f"{exc}") from None
            except Exception as exc:
                # nats-py reports a refused CONNECT to error_cb and raises only
                # "no servers available": look at what error_cb saw, too.
                cause = exc if _is_auth_error(exc) or not seen else seen[0]
                if _is_auth_error(cause):
                    raise AuthError(f"NATS at {shown} refused the credentials: "
                                    f"{describe(cause)}") from None
                if isinstance(cause, ssl.SSLCertVerificationError):
                    raise NotConnectedError(
                        f"NATS at {shown}: the server's TLS certificate is not trusted "
                        f"({cause.verify_message}); pass its CA with --tls-ca") from None
                raise NotConnectedError(
                    f"cannot reach NATS at {shown}: {_why(exc, cause)}") from None
            nc.options["max_reconnect_attempts"] = -1
            if nc.connected_url is not None:
                current[:] = [nc.connected_url.netloc]
            connected.append(logging.WARNING if attempts is None else logging.INFO)
            seen.clear()  # from now on: what the server said after connecting
            nc.options[_SEEN] = seen
            nc.options[_LISTENERS] = listeners
            nc.options[_RECONNECT_LISTENERS] = reconnect_listeners
            return nc
    raise NotConnectedError(f"cannot reach NATS at {shown}")  # pragma: no cover


def _why(exc: BaseException, cause: BaseException) -> str:
    """What made a connect attempt fail, said once: the underlying error when there is one.

    nats-py ends a failed attempt with "no servers available for connection";
    the reason (refused, unknown host, timeout) is what `error_cb` saw.
    """
    if cause is exc:
        return describe(exc)
    if isinstance(exc, nats.errors.NoServersError):
        return describe(cause)
    return f"{describe(exc)} (last error: {describe(cause)})"


async def _connect_once(
    options: dict[str, Any], fatal: asyncio.Event, seen: list[Exception]
) -> Client:
    """One connect (`Client.connect`), cut short by a fatal error its `error_cb` saw.

    nats-py goes on retrying the server pool after a refused CONNECT or a
    failed TLS verification (and, for TLS, can hang there): neither can
    succeed on retry, so the attempt ends at once with that error.
    """
    fatal.clear()
    seen.clear()
    nc = Client()
    task = asyncio.ensure_future(nc.connect(**options))
    waiter = asyncio.ensure_future(fatal.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if fatal.is_set() and seen:
            raise seen[0] from None
        raise
    except Exception as exc:
        if _credentials_missing(nc, options):
            raise CredentialsRequiredError(describe(exc)) from exc
        raise
    nats_headers.install(nc)  # the same headers, parsed faster (every message has some)
    return nc


class CredentialsRequiredError(Exception):
    """A connect failed after the server's INFO said it requires authentication, and none
    was given (see `_credentials_missing`)."""


def _credentials_missing(nc: Client, options: dict[str, Any]) -> bool:
    """Whether the server asked for authentication (`auth_required` in its INFO) and the
    options carry none: no credentials file, token or user in the URL.

    Such a server answers CONNECT with `-ERR 'Authorization Violation'` and closes the
    connection; under load the close can reach the client as a reset before that line is
    read (seen: five attempts in a row), so the failure would look like an unreachable
    server.  The INFO, read before CONNECT, tells which it is."""
    info = natspy.server_info(nc)
    if info is None or not info.get("auth_required"):
        return False
    given = ("user_credentials", "nkeys_seed", "nkeys_seed_str", "user", "password", "token")
    if any(options.get(k) for k in given):
        return False
    return not any("@" in str(s) for s in options.get("servers", ()))


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
    except NATS_FAILURES as exc:
        # The bus boundary of a whole command: what escapes it is crr's error.
        # A request the server's authorization refused ends in a bare timeout; the
        # reason came separately, to error_cb.  A one-shot command says it.
        said: list[Exception] = nc.options.get(_SEEN) or []
        if attempts is not None and said and "permissions violation" in str(said[0]).lower():
            # (Named as nats-py said it: a bus call has mapped its timeout already.)
            bare = exc.__cause__ if (isinstance(exc, BusTimeoutError)
                                     and isinstance(exc.__cause__, TimeoutError)) else exc
            raise AuthError(f"{describe(bare)}: the server refused it ({describe(said[0])})"
                            ) from exc
        mapped = as_crr_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc
    finally:
        if nc.is_connected:
            try:
                await nc.drain()
            except BUS_FAILURES:
                await _close(nc)
        else:
            await _close(nc)


async def _close(nc: Client) -> None:
    """Close `nc`; a transport the server already dropped (a reset while nats-py flushes
    what it still buffers) is closed all the same, not an error of the command."""
    with contextlib.suppress(*BUS_FAILURES):
        await nc.close()
