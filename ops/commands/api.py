"""`crr api [--listen 127.0.0.1:8080]`: the read-only REST API and the live status page."""

from __future__ import annotations

import argparse
from typing import Any

from crr.bus.connection import connect, display_url
from crr.runtime.shutdown import STOP_EPILOG, stopping
from crr.schemas.distribution import install_hint
from crr.schemas.errors import CrrError


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr api`."""
    p = sub.add_parser("api", parents=[common],
                       help="the REST API (OpenAPI at /openapi.json, docs at /docs) and "
                            "status page (/)",
                       epilog="/healthz is 503 (its JSON says why) when NATS is unreachable or "
                              "the projector has written no status for "
                              "$CRR_PROJECTOR_SILENT_AFTER seconds (default 15).  "
                              + STOP_EPILOG)
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="address to serve on (default 127.0.0.1:8080; port 0: any)")
    p.set_defaults(func=run, serve_metrics=True)


async def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; the view follows CRR_SNAPSHOT live."""
    # Imported here: the API's dependencies (litestar, uvicorn) are only needed by `crr api`.
    try:
        from crr.rest.app import create_app  # noqa: PLC0415 - optional extra
        from crr.rest.server import bind, serve  # noqa: PLC0415 - optional extra
    except ImportError as exc:
        raise CrrError(f"`crr api` needs the api extra ({exc.name or exc} is missing): "
                       f"{install_hint('api')}") from None
    from crr.view.scheduler_view import SchedulerView  # noqa: PLC0415 - keeps other commands' start-up lean

    sock = bind(args.listen)
    async with stopping() as stop, connect(
            args.server, creds=args.creds, tls_ca=args.tls_ca, name="crr-api",
            attempts=None) as nc:
        view = SchedulerView(nc)
        await view.start()
        app, api = create_app(view)
        host, port = sock.getsockname()[:2]
        print(f"crr api: serving on http://{host}:{port}/ from {display_url(args.server)} "
              "(OpenAPI: /openapi.json, docs: /docs); /healthz is 503 until the snapshot "
              "is loaded", flush=True)
        stop.serving()
        try:
            await serve(app, api, sock, stop)
        finally:
            await view.stop()
    return 0
