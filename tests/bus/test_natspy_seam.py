"""nats-py's internals behind one seam (`crr.bus.natspy`), each fast path with a public fallback.

- No module outside `bus/natspy/` names a private attribute of nats-py's classes (read
  from the source: every `x._name` whose `_name` nats-py defines, on anything but
  `self`/`cls`).
- A fast path whose names are missing falls back to nats-py's public path, announced at
  WARNING with the reason and counted — and crr still works, on a real server.
- `CRR_NATS_FAST=0` turns every fast path off; `crr doctor` says which are on.
"""

from __future__ import annotations

import ast
import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import nats.aio.client
import nats.aio.subscription
import nats.js.client
import nats.protocol.parser
import pytest
from nats.aio.client import Client
from nats.js.api import StreamConfig

from crr.bus import natspy
from crr.bus.natspy.framing import Framer
from crr.bus.ordered import OrderedReader
from crr.bus.pipeline_publish import PipelinePublisher
from crr.cli import main

ROOT = Path(__file__).resolve().parents[2]
SEAM = ROOT / "bus" / "natspy"


def _nats_private_names() -> set[str]:
    """Private (single-underscore) attribute names nats-py's classes define or set."""
    names: set[str] = set()
    owners = [nats.aio.client.Client, nats.aio.subscription.Subscription,
              nats.js.client.JetStreamContext, nats.protocol.parser.Parser]
    owners += [getattr(nats.js.client.JetStreamContext, "_JSI", object)]
    for owner in owners:
        for name in dir(owner):
            if name.startswith("_") and not name.startswith("__"):
                names.add(name)
        init = getattr(owner, "__init__", None)
        code = getattr(init, "__code__", None)
        if code is not None:
            names.update(n for n in code.co_names if n.startswith("_")
                         and not n.startswith("__"))
    names.update({"_ps", "_jsi", "_sub", "_id", "_server_info", "_process_headers"})
    return names


def _sources() -> Iterator[Path]:
    for pkg in ("bus", "producers", "projections", "schemas", "ops"):
        for path in (ROOT / pkg).rglob("*.py"):
            if SEAM not in path.parents:
                yield path


def test_private_nats_names_only_in_the_seam() -> None:
    """Every reach into nats-py's privates lives in `bus/natspy/` (one place to check and
    to fix when nats-py changes)."""
    private = _nats_private_names()
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in private
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls"))):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert found == []


@pytest.fixture
def fresh_checks() -> Iterator[None]:
    natspy.reset()
    yield
    natspy.reset()


async def test_a_missing_name_falls_back_announced_and_still_works(
        nc: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        fresh_checks: None) -> None:
    """nats-py without `_send_command` (a renamed internal): the framer is off, said at
    WARNING with the name, counted, and the pipelined publisher still stores every message
    through `Client.publish` — the public path."""
    monkeypatch.delenv(natspy.FAST_ENV, raising=False)
    monkeypatch.delattr(nats.aio.client.Client, "_send_command")
    caplog.set_level(logging.WARNING, logger="crr.bus.natspy")
    assert not natspy.usable("framer", nc)
    assert natspy.fallbacks["framer"] == 1
    [warning] = [r for r in caplog.records if "'framer'" in r.message]
    assert warning.levelno == logging.WARNING
    assert "_send_command" in warning.message
    assert "public path" in warning.message
    state = {s.path: s for s in natspy.report()}
    assert not state["framer"].fast
    assert state["framer"].reason is not None
    assert "_send_command" in state["framer"].reason


async def test_public_paths_carry_a_real_workload(
        nc: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        fresh_checks: None) -> None:
    """`CRR_NATS_FAST=0`: the pipelined publisher and the ordered reader run on nats-py's
    public paths (no fast path installed) and deliver every message in order."""
    monkeypatch.setenv(natspy.FAST_ENV, "0")
    caplog.set_level(logging.INFO, logger="crr.bus.natspy")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="SEAM_T", subjects=["seam.>"]))
    assert not Framer(nc)._fast
    async with PipelinePublisher(nc) as pipe:
        for i in range(500):
            await pipe.publish(f"seam.{i % 7}", str(i).encode())
        await pipe.flush(30)
        assert pipe.stats.acked == 500
    got: list[int] = []
    reader = OrderedReader(nc, stream="SEAM_T", subject="seam.>",
                           handler=lambda m: got.append(int(m.data)), backpressure=True,
                           direct=True, deliver=nats.js.api.DeliverPolicy.ALL)
    await reader.start()
    await reader.wait_ready(30)
    await reader.stop()
    assert got == list(range(500))
    assert reader._direct is None  # nats-py's own ordered consumer did the work
    assert all(not s.fast for s in natspy.report())
    assert any("CRR_NATS_FAST=0" in r.message for r in caplog.records)


async def test_doctor_says_which_paths_are_on(
        nats_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        fresh_checks: None) -> None:
    """`crr doctor`: nats-py's version, the range, the server, each path on or why not."""
    monkeypatch.delenv(natspy.FAST_ENV, raising=False)
    code = await asyncio.to_thread(main, ["doctor", "--server", nats_url])
    out = capsys.readouterr().out
    assert code == 0
    assert f"nats-py {'.'.join(map(str, natspy.version()))}" in out
    assert "nats-server 2." in out
    for path in natspy.PATHS:
        assert f"  {path}" in out
    assert "fast" in out
    natspy.reset()
    monkeypatch.setenv(natspy.FAST_ENV, "0")
    code = await asyncio.to_thread(main, ["doctor", "--server", nats_url])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("public path: CRR_NATS_FAST=0") == len(natspy.PATHS)
