"""The FastAPI application: routers, error answers, and the OpenAPI document."""

from __future__ import annotations

from fastapi import FastAPI

from jobcontrol.api import definitions, jobs, runs, stream, system
from jobcontrol.api.bodies import MAX_BODY_BYTES
from jobcontrol.api.deps import ApiContext, install_error_handlers


def create_app(ctx: ApiContext) -> FastAPI:
    """The admin API for one daemon; the OpenAPI document is at ``/api/v1/openapi.json``."""
    app = FastAPI(
        title="Job Control admin API",
        version=ctx.version,
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
        max_body_size=MAX_BODY_BYTES,
    )
    app.state.ctx = ctx
    install_error_handlers(app)
    for module in (jobs, runs, system, stream, definitions):
        app.include_router(module.router)
    return app
