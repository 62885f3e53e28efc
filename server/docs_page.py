"""The interactive API docs at /docs, served from files installed with the package.

FastAPI's default page loads Swagger UI from a CDN, so it is blank on a host without internet access,
which GPU clusters often are. `swagger-ui-bundle` ships the same assets as package data. With an API token the
page asks for it as the history's pages do (the login form; its cookie then opens the page and the document it
reads, /openapi.json), since the document names every registered problem.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from kernelloop.server.openapi import OPENAPI_PATH
from kernelloop.server.routes.deps import WEB_PAGE
from kernelloop.server.web import access

ASSETS = "/docs-assets"


def install(app: FastAPI) -> None:
    """Serve /docs and its assets (the app must be created with docs_url=None and redoc_url=None)."""
    app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False, tags=[WEB_PAGE], dependencies=[Depends(access.require_reader)])
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=OPENAPI_PATH,
            title=f"{app.title}: API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )
