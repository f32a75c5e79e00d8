"""The API's docs pages, /docs (Swagger UI) and /redoc, with their scripts and styles served from
an installed package (fastapi-offline's static files) instead of a CDN: FastAPI's own pages load
them from the network, so offline they were blank."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

from .page import add_asset_routes, load_assets

# URL path -> (file of fastapi_offline/static, media type)
ASSETS = {
    "/docs/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "/docs/swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "/docs/redoc.standalone.js": ("redoc.standalone.js", "text/javascript; charset=utf-8"),
    "/docs/favicon.png": ("favicon.png", "image/png"),
}
ASSET_PATHS = tuple(ASSETS)  # open without an API key, as the pages are


def mount_docs(app: FastAPI, title: str) -> None:
    """/docs and /redoc over /openapi.json, every file they load from this server. The app must
    be made with docs_url=None and redoc_url=None."""

    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{title} - Swagger UI",
            swagger_js_url="/docs/swagger-ui-bundle.js",
            swagger_css_url="/docs/swagger-ui.css",
            swagger_favicon_url="/docs/favicon.png",
        )

    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title=f"{title} - ReDoc",
            redoc_js_url="/docs/redoc.standalone.js",
            redoc_favicon_url="/docs/favicon.png",
            with_google_fonts=False,
        )

    app.add_api_route("/docs", swagger, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)
    add_asset_routes(app, load_assets(ASSETS, "fastapi_offline", "static"))
