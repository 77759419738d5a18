"""The SDK refuses a publish for a scope the catalog gives the reporter no resource of
(`submit(host="nodeA")` of a cluster-scope reporter, which left a `lic: silent` row),
before anything is published and with the reason, as it refuses an undeclared reporter."""

from __future__ import annotations

import pytest
from nats.aio.client import Client

from crr.schemas.errors import UnknownReporterError, WrongScopeError
from crr.schemas.subjects import EVENTS_STREAM
from crr.sdk.external_reporter import ExternalReporter
from tests.support.projector import publish_catalog, running_projector


async def _last_seq(nc: Client) -> int:
    return int((await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq)


async def test_submit_with_a_host_for_a_cluster_scope_reporter_is_refused(nc: Client,
                                                                          nats_url: str) -> None:
    """WrongScopeError (an UnknownReporterError) with the reason; the stream is untouched;
    the same reporter without a host is applied."""
    await publish_catalog(nc)
    async with (running_projector(nc),
                ExternalReporter.connect(reporter="flexlm", url=nats_url, attempts=3) as rep):
        before = await _last_seq(nc)
        with pytest.raises(WrongScopeError) as caught:
            await rep.submit({"matlab_free": 3}, host="nodeA")
        with pytest.raises(WrongScopeError):
            rep.health("ok", host="nodeA")
        assert await _last_seq(nc) == before
        assert isinstance(caught.value, UnknownReporterError)
        assert "owns cluster-scope resources only (matlab_free)" in str(caught.value)
        assert "nothing published" in str(caught.value)
        assert (await rep.submit({"matlab_free": 3})).ok
