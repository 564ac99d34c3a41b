"""The FastAPI application: routers, error answers, and the OpenAPI document."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from jobcontrol.api import audit, definitions, jobs, lanes, runs, stream, system, workers
from jobcontrol.api.bodies import MAX_BODY_BYTES
from jobcontrol.api.deps import (
    ApiContext,
    JSONAnswer,
    TokenGate,
    install_error_handlers,
    require,
    role_table,
)
from jobcontrol.service.users import Action, User


def create_app(ctx: ApiContext) -> FastAPI:
    """The admin API for one daemon; the OpenAPI document is at ``/api/v1/openapi.json``."""
    app = FastAPI(
        title="Job Control admin API",
        version=ctx.version,
        # Served below behind a token: every request but /healthz needs one.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        default_response_class=JSONAnswer,
        # No app-wide body limit: FastAPI checks that before any middleware, so it would
        # answer 413 before TokenGate's 401. Each router carries the limit instead.
    )
    app.state.ctx = ctx
    install_error_handlers(app)
    app.add_middleware(TokenGate)  # 401 before any body is read
    modules = (jobs, runs, system, stream, definitions, workers, lanes, audit)
    for module in modules:
        app.include_router(module.router, max_body_size=MAX_BODY_BYTES)
    # What each route's user must be allowed, for TokenGate's 403 before any body.
    app.state.least_actions = role_table(r for m in modules for r in m.router.routes)

    @app.get("/api/v1/openapi.json", include_in_schema=False)
    def openapi_document(_user: Annotated[User, Depends(require(Action.READ))]) -> JSONResponse:
        """The OpenAPI document of this API (a viewer token is enough)."""
        return JSONResponse(app.openapi())

    return app
