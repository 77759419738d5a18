"""crr.bus.natspy.headers parses every header block exactly as nats-py's own code does."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from crr.bus.natspy import headers as nats_headers

pytestmark = pytest.mark.usefixtures("fast_paths_on")  # compares with nats-py itself

NAME_BYTES = st.sampled_from([b"Nats-Msg-Id", b"traceparent", b"Status", b"Description", b"X",
                              b" Nats-Msg-Id ", b"Na me", b"A\x1cB", b"\x1fA", b"\xc3\xa9t\xc3\xa9",
                              b"", b"a:b", b"K\t"]) | st.binary(max_size=8)
VALUE_BYTES = st.sampled_from([b" x", b"x", b"  spaced  ", b"", b"caf\xc3\xa9", b"\xff\xfe",
                               b"a:b:c", b"\t\x0btab", b"100"]) | st.binary(max_size=12)
LINE = st.one_of(
    st.tuples(NAME_BYTES, st.sampled_from([b":", b": "]), VALUE_BYTES).map(b"".join),
    st.binary(max_size=10).filter(lambda b: b"\r\n" not in b),  # a line without a colon
)
START = st.sampled_from([b"NATS/1.0\r\n", b"NATS/1.0 100 Idle Heartbeat\r\n", b"NATS/1.0 503\r\n",
                         b"NATS/1.0 404 No Messages\r\n", b"NATS/1.0 408 Request Timeout\r\n",
                         b"NATS/1.0\r\n\r\n", b"NATS/1.1\r\n"])


def parse_both(block: bytes) -> tuple[object, object]:
    """(nats-py's result, ours) for one block."""
    theirs, ours = Client(), Client()
    assert nats_headers.install(ours)

    async def one(nc: Client) -> object:
        try:
            return await nc._process_headers(block)
        except UnicodeDecodeError as exc:  # nats-py's, on a status line of invalid UTF-8
            return type(exc)

    async def both() -> tuple[object, object]:
        return await one(theirs), await one(ours)

    return asyncio.run(both())


@settings(max_examples=400, deadline=None)
@given(start=START, lines=st.lists(LINE, max_size=5), end=st.sampled_from([b"\r\n\r\n", b"\r\n",
                                                                              b""]))
def test_same_result_as_nats_py(start: bytes, lines: list[bytes], end: bytes) -> None:
    """Plain blocks, status lines, repeated names (the last wins), odd names and values."""
    block = start + b"\r\n".join(lines) + end
    theirs, ours = parse_both(block)
    assert ours == theirs


def test_common_blocks() -> None:
    """The blocks crr reads every message (a message id; a trace) and a heartbeat."""
    cases = {
        b"NATS/1.0\r\nNats-Msg-Id: sim0/h1/b/7\r\n\r\n": {"Nats-Msg-Id": "sim0/h1/b/7"},
        b"NATS/1.0\r\nNats-Msg-Id: a\r\nNats-Msg-Id: b\r\ntraceparent: 00-ab\r\n\r\n":
            {"Nats-Msg-Id": "b", "traceparent": "00-ab"},
        b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\n\r\n":
            {"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "0"},
    }
    for block, expected in cases.items():
        theirs, ours = parse_both(block)
        assert ours == theirs == expected
    assert parse_both(b"NATS/1.0\r\n") == (None, None)
