"""REST: the OpenAPI document at /openapi.json, a docs page with no CDN, `at` in RFC 3339."""

from __future__ import annotations

import re

import httpx
from nats.aio.client import Client

from crr.schemas.wire_time import parse_time
from tests.support.projector import publish_catalog, publish_report
from tests.support.rest import running_api


async def test_openapi_json_and_offline_docs(nc: Client) -> None:
    """/openapi.json is the same document as /schema/openapi.json; /docs lists every operation
    and loads nothing from elsewhere (no script, no external URL)."""
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        spec = await http.get("/openapi.json")
        assert spec.status_code == 200
        assert spec.json() == (await http.get("/schema/openapi.json")).json()
        page = await http.get("/docs")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        for path in spec.json()["paths"]:
            assert f"{path}</code>" in page.text, path
        assert "<script" not in page.text
        assert re.findall(r"(?:src|href)=['\"]https?://", page.text) == []
        assert "expr" in page.text  # parameters are described


async def test_select_at_is_rfc3339_with_a_numeric_twin(nc: Client) -> None:
    """/v1/select says when it evaluated as RFC 3339 (`at`) and in epoch seconds (`at_ts`)."""
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        await publish_catalog(nc)
        await rig.settle(await publish_report(nc, "scratch", "n1", {"scratch_free": 500.0}))
        body = (await http.get("/v1/select", params={"expr": "scratch_free > 1"})).json()
        assert body["hosts"] == ["n1"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", body["at"])
        assert abs(parse_time(body["at"]) - body["at_ts"]) < 0.001
