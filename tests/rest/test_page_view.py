"""`GET /v1/page` (ops/rest/page_view.py): one answer for one paint of the status page, and
the page's defaults from the active catalog (issue 40, item 4)."""

from __future__ import annotations

import json
import time

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from crr.admin.reporter_health import FAILING_STATES
from crr.projections.select import compile_select
from crr.rest.page_view import example_expression, precisions
from crr.schemas.catalog import Catalog, ResourceSpec
from crr.schemas.subjects import event_subject
from crr.schemas.wire_time import format_time
from tests.rest.test_rest_status_page_agrees import CATALOG, report
from tests.support.faults import eventually
from tests.support.projector import FAST_CATALOG, publish_catalog, publish_report
from tests.support.rest import running_api

KINDS = st.sampled_from(["numeric", "boolean", "string", "string_set"])
NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: n not in {"and", "or", "not", "has", "has_any", "has_all", "defined", "count",
                        "true", "false", "select"})


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(NAMES, st.tuples(KINDS, st.sampled_from(["host", "cluster"])),
                       max_size=6))
def test_the_example_expression_is_the_catalogs_own_and_compiles(
        resources: dict[str, tuple[str, str]]) -> None:
    """Whatever the catalog, the example names only its host-scope resources and compiles
    (none when it has none)."""
    catalog = Catalog(resources={
        n: ResourceSpec(kind=k, reporter="r", scope=s)  # type: ignore[arg-type]
        for n, (k, s) in resources.items()})
    expr = example_expression(catalog)
    host = {n for n, (_, s) in resources.items() if s == "host"}
    if not host:
        assert expr is None
        return
    assert expr is not None
    compiled = compile_select(expr, catalog)
    assert compiled.resources <= host
    assert compiled.resources


def test_precision_defaults_to_one_decimal_and_follows_the_catalog() -> None:
    """`precision:` per numeric resource, 1 when left out; other kinds have none."""
    assert precisions(CATALOG) == {"tmp_gb": 0, "beat": 1}
    assert precisions(FAST_CATALOG) == {"scratch_free": 1, "blink": 1, "matlab_free": 1}


async def test_one_answer_agrees_with_itself(nc: Client) -> None:
    """The summary's failing count, the failures and the rows' marks use one rule (a
    stopped reporter whose values went stale is failing, as `crr health` lists it); the
    bridges' marks are the exports that hold; the defaults are the catalog's."""
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        await publish_catalog(nc, CATALOG)
        await publish_report(nc, "disk", "node1", {},
                             raw=report("disk", "node1", {"tmp_gb": 500.0, "tags": ["a"]}, 1))
        await publish_report(nc, "disk", "node2", {},
                             raw=report("disk", "node2", {"tmp_gb": 3.0, "tags": []}, 1))
        seq = await publish_report(nc, "pulse", "node2", {},
                                   raw=report("pulse", "node2", {"beat": 1.0}, 1))
        stopped = json.dumps({"reporter": "pulse", "host": "node2", "boot": "b1", "seq": 2,
                              "at": format_time(time.time()), "state": "stopped"})
        ack = await nc.jetstream().publish(event_subject("health", "pulse", "node2"),
                                           stopped.encode())
        await rig.settle(max(seq, ack.seq))

        async def failing() -> object:
            got = (await http.get("/v1/page")).json()
            return got if got["failures_total"] else None

        # Until the projector's expiry marks beat stale (200 ms + grace): a bounded retry.
        page = await eventually(failing, 10, "pulse listed as failing")
        assert page["summary"]["failing_reporters"] == page["failures_total"] == 1
        [row] = page["failures"]
        assert (row["reporter"], row["host"], row["state"]) == ("pulse", "node2", "stopped")
        assert row["state"] not in FAILING_STATES
        assert row["missing"] == ["beat"]
        marks = page["marks"]
        assert [m["reporter"] for m in marks["node2"]["reporters"] if m["failing"]] == ["pulse"]
        statuses = {r["host"]: r["status"] for r in page["table"]["rows"]}
        assert statuses["node2"] == "stale"  # `crr hosts`' STATUS (state-only failing)
        assert marks["node1"]["bridges"] == {"features": ["roomy"], "drain": None}
        assert marks["node2"]["bridges"] == {"features": [],
                                             "drain": "scratch nearly full"}
        assert page["display"]["example"] == "beat > 0 && count(tags) > 0"
        assert page["display"]["precision"] == {"beat": 1, "tmp_gb": 0}
        assert page["display"]["exports"] is True
        assert page["summary"]["at"] == page["at"] == page["table"]["at"]
        # A catalog without exports: no bridge marks, and the page says so.
        await rig.settle(await publish_catalog(nc, FAST_CATALOG))
        bare = (await http.get("/v1/page")).json()
        assert bare["display"]["exports"] is False
        assert all(m["bridges"] is None for m in bare["marks"].values())
