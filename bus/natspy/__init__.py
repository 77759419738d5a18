"""The one seam over nats-py's internals: crr's fast paths, checked, with public fallbacks.

crr's hot paths reach into nats-py 2.x where its public API costs too much; every
private name crr touches is used in this package only, and listed here per fast path:

- `parser` (`parser.py`): the connection's protocol parser, routing raw messages;
  public path: nats-py's parser, `Msg`, queue and callback task.
- `headers` (`headers.py`): `Client._process_headers` for plain header blocks;
  public path: nats-py's header parsing.
- `ordered_consumer` (`ordered_consumer.py`): an ordered consumer's data messages and
  its flow control; public path: nats-py's ordered consumer (`Msg`s in its queue).
- `framer` (`framing.py`): `Client.publish`'s framing of each message; public path:
  `Client.publish`.
- `flow_control` (`flow_control.py`): an ordered consumer's flow control answered by
  messages handled, on nats-py's own path; public path: nats-py answers by messages
  received (a waiting handler's backlog then waits in its queue).

`usable(path, obj)` says whether a path may be used now: nats-py in the supported
range (`SUPPORTED`), the module-level names it needs present (checked once, at first
use), the instance it works on (`obj`: a connection or a JetStream subscription) of
the shape it needs, and `CRR_NATS_FAST` not `0`.  Every "no" is announced once per
path and reason at WARNING, counted (`fallbacks`, exported as a metric), and listed by
`report()` (what `crr doctor` prints).  The public paths are those nats-py offers to
any client, so a nats-py that renamed a name makes crr slower, never wrong; CI runs
the bus suite both ways (`CRR_NATS_FAST=0`), and on the oldest nats-py pyproject.toml
admits (2.15.0) and the newest 2.x.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats.aio.client as _client
import nats.protocol.parser as _parser

log = logging.getLogger("crr.bus.natspy")

SUPPORTED = ((2, 15), (3, 0))
"""nats-py versions the fast paths are written for: at least the first, below the second."""

FAST_ENV = "CRR_NATS_FAST"
"""`CRR_NATS_FAST=0`: every fast path off (the public paths, e.g. to rule crr's out)."""

PATHS = ("parser", "headers", "ordered_consumer", "framer", "flow_control")

_MODULE_NAMES: dict[str, tuple[tuple[Any, tuple[str, ...]], ...]] = {
    "parser": ((_parser, ("Parser", "MSG_RE", "HMSG_RE", "OK_RE", "ERR_RE", "PING_RE",
                          "PONG_RE", "INFO_RE", "AWAITING_CONTROL_LINE",
                          "AWAITING_MSG_PAYLOAD", "MAX_CONTROL_LINE_SIZE")),),
    "headers": ((_client, ("NATS_HDR_LINE",)),
                (_client.Client, ("_parse_header_lines", "_process_headers"))),
    "ordered_consumer": (),
    "framer": ((_client.Client, ("_send_command", "_flush_pending", "publish")),),
    "flow_control": (),
}
"""Per path: the module-level (or class-level) names it needs."""

_CONNECTION = ("_ps", "_process_msg", "_process_err", "_process_ping", "_process_pong",
               "_process_info", "stats")
_INSTANCE_NAMES: dict[str, tuple[str, ...]] = {
    "parser": _CONNECTION,
    "headers": ("_process_headers",),
    "framer": ("_send_command", "_flush_pending", "_flush_queue", "_max_payload", "stats",
               "is_connected", "is_draining_pubs"),
    "ordered_consumer": ("_sub",),
    "flow_control": ("_sub",),
}
"""Per path: what the instance it works on (connection, or JetStream subscription) has."""

JSI_NAMES = ("_dseq", "_sseq", "_active", "track_sequences", "reset_ordered_consumer",
             "get_js_delivered", "_fcr", "_fcd", "_fciseq", "_cmeta", "_ordered", "_fctask")
"""What nats-py 2.x's `JetStreamContext._JSI` holds and the ordered-consumer path keeps
as nats-py would."""

fallbacks: Counter[str] = Counter()
"""Times each path took the public path instead (metrics: `crr_nats_fallbacks`)."""

_reasons: dict[str, str] = {}
"""The last reason each path was not usable (what `report` lists)."""
_module_ok: dict[str, str | None] = {}
_announced: set[tuple[str, str]] = set()


def version() -> tuple[int, ...]:
    """The installed nats-py's version (e.g. (2, 16, 0); () when it does not say)."""
    raw = str(getattr(_client, "__version__", ""))
    try:
        return tuple(int(p) for p in raw.split(".")[:3])
    except ValueError:
        return ()


def server_version(nc: Any) -> str:
    """The connected server's version (`2.15.1`), from nats-py's public accessor."""
    return str(nc.connected_server_version).removeprefix("<nats server v").removesuffix(">")


def server_info(nc: Any) -> dict[str, Any] | None:
    """The INFO the server sent (nats-py keeps it privately; None where it does not)."""
    info = getattr(nc, "_server_info", None)
    return info if isinstance(info, dict) else None


def _module_problem(path: str) -> str | None:
    if path not in _module_ok:
        have = version()
        problem = None
        if not have or not SUPPORTED[0] <= have < SUPPORTED[1]:
            problem = (f"nats-py {'.'.join(map(str, have)) or '?'} is outside the supported "
                       f"range >={'.'.join(map(str, SUPPORTED[0]))},"
                       f"<{'.'.join(map(str, SUPPORTED[1]))}")
        for owner, names in _MODULE_NAMES[path]:
            missing = [n for n in names if not hasattr(owner, n)]
            if problem is None and missing:
                problem = f"nats-py has no {getattr(owner, '__name__', owner)}." + \
                    ", .".join(missing)
        if path == "headers" and problem is None and getattr(
                _client, "parse_email", None) is not None:
            problem = "nats-py parses headers with fast_mail_parser (other results)"
        _module_ok[path] = problem
    return _module_ok[path]


def problem(path: str, obj: Any = None, extra: Callable[[Any], str | None] | None = None,
            ) -> str | None:
    """Why fast path `path` cannot be used on `obj` (None: it can)."""
    if os.environ.get(FAST_ENV, "").strip() == "0":
        return f"{FAST_ENV}=0"
    why = _module_problem(path)
    if why is None and obj is not None:
        missing = [n for n in _INSTANCE_NAMES[path] if not hasattr(obj, n)]
        if missing:
            why = f"{type(obj).__name__} has no {', '.join(missing)}"
    if why is None and extra is not None:
        why = extra(obj)
    return why


def usable(path: str, obj: Any = None, extra: Callable[[Any], str | None] | None = None,
           ) -> bool:
    """Whether fast path `path` may be used on `obj`; a "no" is announced (once per path
    and reason, at WARNING), counted and remembered for `report`.  `extra(obj)`: a further
    check of the path's own (its reason, or None)."""
    why = problem(path, obj, extra)
    if why is None:
        return True
    fallbacks[path] += 1
    _reasons[path] = why
    if (path, why) not in _announced:
        _announced.add((path, why))
        log.log(logging.INFO if why == f"{FAST_ENV}=0" else logging.WARNING,
                "nats-py fast path %r off (%s): using nats-py's public path", path, why)
    return False


@dataclass(frozen=True)
class PathState:
    """One fast path as `crr doctor` shows it."""

    path: str
    fast: bool
    reason: str | None
    fallbacks: int


def report() -> list[PathState]:
    """Every fast path: usable (as far as the module-level checks say, or as it went on
    the connections so far), or why not."""
    out = []
    for path in PATHS:
        why = _reasons.get(path) or problem(path)
        out.append(PathState(path=path, fast=why is None, reason=why,
                             fallbacks=fallbacks[path]))
    return out


def reset() -> None:
    """Forget every check and announcement (tests that change `CRR_NATS_FAST`)."""
    fallbacks.clear()
    _reasons.clear()
    _module_ok.clear()
    _announced.clear()
