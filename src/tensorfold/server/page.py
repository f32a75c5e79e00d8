"""The chat page at GET /: static files from the package (no build step, nothing from a CDN)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

# URL path -> (file under server/web/, media type); nothing else is served from that folder.
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/web/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/web/markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
    "/web/chats.js": ("chats.js", "text/javascript; charset=utf-8"),
    "/web/sha256.js": ("sha256.js", "text/javascript; charset=utf-8"),
    "/web/style.css": ("style.css", "text/css; charset=utf-8"),
    "/web/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
PAGE_PATHS = tuple(ASSETS)  # open without an API key: the page asks for the key itself
# The page and its scripts come from this server only; it talks to this server only.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str


def load_assets(table: dict[str, tuple[str, str]], package: str, folder: str) -> dict[str, Asset]:
    """Every file of `table` (URL path -> (file, media type)) under `folder` of `package`, read
    once at start, so a request never touches the file system."""
    root = resources.files(package) / folder
    return {
        path: Asset(root.joinpath(name).read_bytes(), media)
        for path, (name, media) in table.items()
    }


def add_asset_routes(app: FastAPI, assets: dict[str, Asset], headers: dict | None = None) -> None:
    """GET (and HEAD) of each asset at its path, kept out of the OpenAPI document."""

    def route(asset: Asset):
        async def serve() -> Response:
            return Response(asset.body, media_type=asset.media_type, headers=headers)

        return serve

    for path, asset in assets.items():
        app.add_api_route(path, route(asset), methods=["GET", "HEAD"], include_in_schema=False)


def mount_page(app: FastAPI) -> None:
    add_asset_routes(app, load_assets(ASSETS, "tensorfold.server", "web"), HEADERS)
