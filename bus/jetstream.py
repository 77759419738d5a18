"""The JetStream calls services make, in crr's terms: the port over nats-py's JetStream API.

Code outside `bus/` holds a `Connection` (`crr.bus.connection`) or a `JetStream`
handle (`jetstream(nc, timeout=...)`: the same connection with its own request
timeout) and hands it to these functions; it never calls nats-py itself.
What they return is crr's (`StreamState`, `crr.bus.ordered.StoredMessage`, a
stream sequence), and what they raise is the error tree (`crr.bus.errors`): a
missing stream or message is `NotFoundOnServerError`, a refused fenced write
`WrongLastSequenceError`, a timeout `BusTimeoutError`, and so on.

- `stream_state`: a stream's first/last sequence, message count, age limit (and,
  asked for, the message count per subject of a filter);
- `publish`: one message, waiting for the stream's acknowledgement; its sequence;
- `get` / `get_last`: one stored message by sequence (or the next on a subject from
  it), or the newest on a subject — answered by the stream leader (`STREAM.MSG.GET`);
- `purge`: a subject filter's messages stored before a sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeAlias

import msgspec
from nats.js.api import RawStreamMsg
from nats.js.client import JetStreamContext

from crr.bus.connection import Connection
from crr.bus.errors import nats_errors
from crr.bus.ordered import StoredMessage
from crr.schemas.errors import CrrError, JetStreamError, NotFoundOnServerError
from crr.schemas.subjects import EVENTS_STREAM, destination_partitions

JetStream: TypeAlias = JetStreamContext
"""A connection's JetStream API with its own request timeout (`jetstream`)."""

Api: TypeAlias = Connection | JetStream
"""What the calls below take: a connection (the default 5 s timeout) or a `JetStream`."""

DEFAULT_TIMEOUT = 5.0
"""nats-py's own default for a JetStream API request."""


def jetstream(nc: Connection, *, timeout: float = DEFAULT_TIMEOUT) -> JetStream:
    """`nc`'s JetStream API, each request answered within `timeout` seconds (or
    `BusTimeoutError`)."""
    return nc.jetstream(timeout=timeout)


def _js(api: Api) -> JetStreamContext:
    return api if isinstance(api, JetStreamContext) else api.jetstream()


class StreamState(msgspec.Struct, frozen=True, kw_only=True):
    """What a stream holds now (`stream_state`)."""

    first_seq: int
    last_seq: int
    messages: int
    max_age: float
    """Its age limit in seconds (0: unlimited)."""
    subjects: dict[str, int] | None = None
    """Messages per subject of the filter asked for (None: none asked, or none held)."""
    partitions: int = 1
    """N of the partition transform it stores with (1: none)."""


async def stream_state(api: Api, stream: str, *, subjects: str | None = None) -> StreamState:
    """`stream`'s state; `subjects` (a filter): also its message count per subject.

    `StreamNotFoundError` (a `NotFoundOnServerError`) when the stream does not exist."""
    with nats_errors():
        info = await _js(api).stream_info(stream, subjects_filter=subjects)
    st = info.state
    t = info.config.subject_transform
    return StreamState(first_seq=st.first_seq, last_seq=st.last_seq, messages=st.messages,
                       max_age=float(info.config.max_age or 0), subjects=st.subjects,
                       partitions=1 if t is None or not t.dest else destination_partitions(t.dest))


async def publish(api: Api, subject: str, payload: bytes, *,
                  headers: dict[str, str] | None = None, timeout: float | None = None,
                  where: str | None = None) -> int:
    """Publish and wait for the stream's acknowledgement (within `timeout`, default the
    handle's); the stream sequence it was stored at.  `where` prefixes an error's text."""
    with nats_errors(where):
        ack = await _js(api).publish(subject, payload, headers=headers, timeout=timeout)
    return int(ack.seq)


def _stored(msg: RawStreamMsg) -> StoredMessage:
    """`msg` in crr's terms (a `STREAM.MSG.GET` answer always carries its sequence and time)."""
    return StoredMessage(int(msg.seq or 0), msg.time.timestamp() if msg.time else 0.0,
                         msg.subject or "", msg.data or b"", msg.headers or None, 0)


async def get(api: Api, stream: str, seq: int, *, subject: str | None = None,
              next: bool = False) -> StoredMessage:
    """The message stored at `seq`; with `next`, the first at or after `seq` (on `subject`,
    a filter, when given).  Empty data is `b""`; `pending` is 0.

    `NotFoundOnServerError` when there is none."""
    with nats_errors():
        msg = await _js(api).get_msg(stream, seq=seq, subject=subject, next=next)
    return _stored(msg)


async def get_last(api: Api, stream: str, subject: str) -> StoredMessage:
    """The newest message on `subject` (wildcards allowed), as `get`.

    `NotFoundOnServerError` when there is none."""
    with nats_errors():
        msg = await _js(api).get_last_msg(stream, subject)
    return _stored(msg)


async def purge(nc: Connection, stream: str, *, subject: str, before_seq: int,
                timeout: float = 10.0) -> int:
    """Remove the messages on `subject` (a filter) stored before `before_seq`; how many.

    `JetStreamError` (its message: the server's description) when JetStream refuses."""
    req = json.dumps({"filter": subject, "seq": before_seq}).encode()
    with nats_errors():
        reply = await nc.request(f"$JS.API.STREAM.PURGE.{stream}", req, timeout=timeout)
    body = json.loads(reply.data)
    if "error" in body:
        error = body["error"]
        raise JetStreamError(f"{error.get('description', error)}", code=error.get("code"),
                             err_code=error.get("err_code"))
    return int(body.get("purged", 0))


@dataclass(frozen=True)
class StreamRange:
    """What CRR_EVENTS holds now: first and last sequence and the first message's time."""

    first_seq: int
    last_seq: int
    first_time: float | None
    last_time: float | None

    @property
    def empty(self) -> bool:
        """No message at all."""
        return self.last_seq < self.first_seq or self.last_seq == 0


async def _msg_time(nc: Connection, seq: int) -> float | None:
    try:
        msg = await get(nc, EVENTS_STREAM, seq, next=True)
    except NotFoundOnServerError:
        return None
    return msg.time


async def stream_range(nc: Connection) -> StreamRange:
    """The range of CRR_EVENTS now (CrrError if the stream does not exist)."""
    try:
        st = await stream_state(nc, EVENTS_STREAM)
    except NotFoundOnServerError:
        raise CrrError(f"stream {EVENTS_STREAM} does not exist (is a projector or "
                       "`crr server` provisioning it?)") from None
    if st.last_seq == 0 or st.messages == 0:
        return StreamRange(st.first_seq, st.last_seq, None, None)
    first_t = await _msg_time(nc, st.first_seq)
    last_t = (await get(nc, EVENTS_STREAM, st.last_seq)).time
    return StreamRange(st.first_seq, st.last_seq, first_t, last_t)
