"""The API key: where it comes from (flag, file, environment) and the check on every request."""

from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError, Count, refusal_sender

KEY_ENV = "TENSORFOLD_API_KEY"
# Open without a key: monitoring, and the API's own description (the same for all docs pages).
DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
MONITORING_PATHS = ("/health", "/metrics")


def resolve_api_key(
    flag: str | None, key_file: str | None, environ: Mapping[str, str] = os.environ
) -> str | None:
    """--api-key, else --api-key-file, else $TENSORFOLD_API_KEY; a file or the environment keeps
    the key out of the process list."""
    if flag is not None and key_file is not None:
        raise ValueError("give the key once: --api-key or --api-key-file, not both")
    if key_file is not None:
        key = Path(key_file).read_text().strip()
        source = f"--api-key-file {key_file}"
    else:
        key = flag if flag is not None else environ.get(KEY_ENV)
        source = "--api-key" if flag is not None else f"${KEY_ENV}"
        if key is None:
            return None
    if not key or not key.isascii() or not key.isprintable() or " " in key:
        raise ValueError(f"the API key from {source} must be printable ASCII without spaces")
    return key


class APIKeyCheck:
    """Bearer-token check before anything else (body parsing included); the open paths skip it.
    Exactly one Authorization header; the comparison takes the same time whatever the key."""

    def __init__(
        self, app: ASGIApp, api_key: str, count: Count, open_paths: tuple[str, ...]
    ) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()
        self.open_paths, self.refuse = frozenset(open_paths), refusal_sender(count)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        given = [value for name, value in scope["headers"] if name == b"authorization"]
        if len(given) == 1 and hmac.compare_digest(given[0], self.expected):
            return await self.app(scope, receive, send)
        why = (
            "send exactly one Authorization header"
            if len(given) > 1
            else "invalid or missing API key (send Authorization: Bearer KEY)"
        )
        err = APIError(
            401,
            why,
            code="invalid_api_key",
            headers={"WWW-Authenticate": 'Bearer realm="tensorfold"'},
        )
        await self.refuse(err, scope, receive, send)
