"""Every refusal as an OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..errors import ContextOverflow, QueueFull, RequestError
from .protocol import ErrorInfo, ErrorResponse

log = logging.getLogger("tensorfold.server")

RETRY_AFTER_S = 1
OUTCOMES = {401: "unauthorized", 429: "queue_full"}    # metrics labels; other 4xx are "invalid"


class APIError(Exception):
    """An error the client caused (or must wait out), with its HTTP status and OpenAI fields."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type, self.headers = type, headers or {}

    def response(self) -> JSONResponse:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=self.status,
                            headers=self.headers)

    @property
    def outcome(self) -> str:
        return OUTCOMES.get(self.status, "error" if self.status >= 500 else "invalid")


def from_engine(exc: RequestError | QueueFull, renames: dict[str, str] | None = None) -> APIError:
    """Maps an engine refusal to its status; `renames` maps engine parameter names to the API's."""
    if isinstance(exc, QueueFull):
        return APIError(429, str(exc), code="queue_full", type="rate_limit_error",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    param = (renames or {}).get(exc.param, exc.param)
    if isinstance(exc, ContextOverflow):
        return APIError(413, str(exc), param, code="context_length_exceeded")
    return APIError(400, str(exc), param, code="invalid_value")


def _param(loc: tuple) -> str | None:
    """('body', 'messages', 0, 'role') -> 'messages[0]': the field, and its index for lists."""
    parts = list(loc[1:]) if loc and loc[0] == "body" else list(loc)
    if not parts or not isinstance(parts[0], str):
        return None
    if len(parts) > 1 and isinstance(parts[1], int):
        return f"{parts[0]}[{parts[1]}]"
    return parts[0]


def validation_error(exc: RequestValidationError) -> APIError:
    """FastAPI's 422 rewritten: bad JSON is a 400, a wrong type a 422 naming the field."""
    errors = exc.errors()
    first = errors[0] if errors else {"type": "missing", "loc": ("body",), "msg": "no body"}
    if first["type"] == "json_invalid":
        why = first.get("ctx", {}).get("error", first["msg"])
        return APIError(400, f"the body is not valid JSON: {why}", code="invalid_json")
    param = _param(tuple(first.get("loc", ())))
    if param is None:
        return APIError(400, "the body must be a JSON object", code="invalid_json")
    return APIError(422, f"{param}: {first['msg']}", param, code="invalid_type")


def install_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
        log.info("%s %s %d %s (param %s)", request.method, request.url.path, exc.status,
                 exc.message, exc.param)
        request.app.state.server.metrics.refused(exc.outcome)
        return exc.response()

    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await on_api_error(request, validation_error(exc))

    async def on_http(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), type=kind).response()

    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        request.app.state.server.metrics.refused("error")
        err = APIError(500, f"internal error: {type(exc).__name__}", type="server_error")
        return err.response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_crash)
