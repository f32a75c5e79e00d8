"""The API's docs pages, /docs (Swagger UI) and /redoc, with their scripts and styles served from
an installed package (fastapi-offline's static files) instead of a CDN: FastAPI's own pages load
them from the network, so offline they were blank."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

# URL path -> (file of fastapi_offline/static, media type)
ASSETS = {
    "/docs/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "/docs/swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "/docs/redoc.standalone.js": ("redoc.standalone.js", "text/javascript; charset=utf-8"),
    "/docs/favicon.png": ("favicon.png", "image/png"),
}
ASSET_PATHS = tuple(ASSETS)  # open without an API key, as the pages are


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str


def _assets() -> dict[str, Asset]:
    """Every file read once at start, so a request never touches the file system."""
    folder = resources.files("fastapi_offline") / "static"
    return {
        path: Asset(folder.joinpath(name).read_bytes(), media)
        for path, (name, media) in ASSETS.items()
    }


def mount_docs(app: FastAPI, title: str) -> None:
    """/docs and /redoc over /openapi.json, every file they load from this server. The app must
    be made with docs_url=None and redoc_url=None."""
    assets = _assets()

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

    def serve(asset: Asset):
        async def send() -> Response:
            return Response(asset.body, media_type=asset.media_type)

        return send

    app.add_api_route("/docs", swagger, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)
    for path, asset in assets.items():
        app.add_api_route(path, serve(asset), methods=["GET"], include_in_schema=False)
