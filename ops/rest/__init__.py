"""The REST API and status page (`crr api`); needs the `api` extra (litestar, uvicorn)."""
