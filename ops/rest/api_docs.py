"""`GET /openapi.json` and `GET /docs`: the API's own description, served with no CDN.

Clusters are often offline, so the docs page is plain HTML rendered here
from the OpenAPI document — every operation with its parameters and
responses — with no script and no external asset.  (Litestar's own UIs load
their JavaScript from a CDN; only its JSON renderer is enabled, at
`/schema/openapi.json`, which stays for existing readers.)
"""

from __future__ import annotations

import html
from typing import Any

from litestar import Request, get
from litestar.enums import MediaType
from litestar.handlers import HTTPRouteHandler

_METHODS = ("get", "post", "put", "patch", "delete")


def _schema_of(request: Request[Any, Any, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = request.app.openapi_schema.to_schema()
    return doc


def _type(schema: dict[str, Any]) -> str:
    if "type" in schema:
        return str(schema["type"])
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    alts = schema.get("oneOf") or schema.get("anyOf") or []
    return " | ".join(_type(a) for a in alts) or "any"


def render_docs(doc: dict[str, Any]) -> str:
    """The OpenAPI document `doc` as one self-contained HTML page."""
    e = html.escape
    info = doc.get("info", {})
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{e(info.get('title', 'API'))} API</title>",
        "<style>body{font:14px/1.45 system-ui,sans-serif;max-width:60em;margin:2em auto;"
        "padding:0 1em}code,td{font-family:ui-monospace,monospace}table{border-collapse:"
        "collapse}td,th{border-bottom:1px solid #ddd;padding:.2em .6em;text-align:left}"
        "h2{margin-top:2em;font-size:1.1em}</style></head><body>",
        f"<h1>{e(info.get('title', 'API'))} API {e(str(info.get('version', '')))}</h1>",
        f"<p>{e(info.get('description', ''))}</p>",
        "<p>Machine-readable: <a href='/openapi.json'>/openapi.json</a></p>",
    ]
    for path, item in sorted(doc.get("paths", {}).items()):
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            out.append(f"<h2><code>{method.upper()} {e(path)}</code></h2>")
            if op.get("summary"):
                out.append(f"<p>{e(op['summary'])}</p>")
            if op.get("description"):
                out.append(f"<p>{e(op['description'])}</p>")
            params = op.get("parameters", [])
            if params:
                out.append("<table><tr><th>parameter</th><th>in</th><th>type</th>"
                           "<th>required</th><th>meaning</th></tr>")
                out.extend(
                    f"<tr><td>{e(p.get('name', ''))}</td><td>{e(p.get('in', ''))}</td>"
                    f"<td>{e(_type(p.get('schema', {})))}</td>"
                    f"<td>{'yes' if p.get('required') else 'no'}</td>"
                    f"<td>{e(p.get('description', ''))}</td></tr>" for p in params)
                out.append("</table>")
            codes = ", ".join(f"{e(code)} {e(r.get('description', ''))}"
                              for code, r in sorted(op.get("responses", {}).items()))
            if codes:
                out.append(f"<p>Responses: {codes}</p>")
    out.append("</body></html>")
    return "\n".join(out)


@get("/openapi.json", include_in_schema=False, media_type=MediaType.JSON)
async def openapi_json(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The OpenAPI document (also at `/schema/openapi.json`)."""
    return _schema_of(request)


@get("/docs", include_in_schema=False, media_type=MediaType.HTML)
async def docs(request: Request[Any, Any, Any]) -> str:
    """The API reference as a plain page: no script, no CDN."""
    return render_docs(_schema_of(request))


HANDLERS: list[HTTPRouteHandler] = [openapi_json, docs]
