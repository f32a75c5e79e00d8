"""Every refusal as an OpenAI error body: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
import re
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from ..errors import ContextOverflow, QueueFull, RequestError
from .protocol import ErrorInfo, ErrorResponse

log = logging.getLogger("tensorfold.server")

RETRY_AFTER_S = 1
OUTCOMES = {401: "unauthorized", 429: "queue_full"}  # metrics labels; other 4xx are "invalid"
# pydantic error types that mean a value out of range (the rest: a wrong type)
VALUE_ERRORS = frozenset(
    {
        "finite_number",
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "literal_error",
        "too_long",
        "too_short",
        "string_too_short",
        "string_too_long",
        "value_error",
    }
)
Count = Callable[[str, str], None]  # (outcome, reason): Metrics.refused
HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


class APIError(Exception):
    """An error the client caused (or must wait out), with its HTTP status and OpenAI fields."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type, self.headers = type, headers or {}

    def response(self) -> JSONResponse:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return JSONResponse(
            ErrorResponse(error=info).model_dump(), status_code=self.status, headers=self.headers
        )

    @property
    def outcome(self) -> str:
        return OUTCOMES.get(self.status, "error" if self.status >= 500 else "invalid")

    @property
    def reason(self) -> str:
        """The metrics label of a refusal: its code (a fixed set, never client text)."""
        return self.code or ("server_error" if self.status >= 500 else "invalid_request")


def from_engine(exc: RequestError | QueueFull, renames: dict[str, str] | None = None) -> APIError:
    """Maps an engine refusal to its status; `renames` maps engine parameter names to the API's."""
    if isinstance(exc, QueueFull):
        return APIError(
            429,
            str(exc),
            code="queue_full",
            type="rate_limit_error",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    param = (renames or {}).get(exc.param, exc.param)
    if isinstance(exc, ContextOverflow):  # OpenAI's and vLLM's status for it
        return APIError(400, str(exc), param, code="context_length_exceeded")
    return APIError(400, str(exc), param, code="invalid_value")


# pydantic's names of a union's members in an error's location ('str', 'list[int]', ...)
UNION_TAG = re.compile(r"^(str|int|float|bool|dict|list|none|function-\w+|[\w-]+\[.*\])$")


def _param(loc: tuple, body: Any) -> str | None:
    """('body', 'messages', 0, 'role') -> 'messages[0].role': the path through the body, leaving
    out pydantic's union tags ('str', 'list[int]'), which name no field."""
    parts = list(loc[1:]) if loc and loc[0] == "body" else list(loc)
    path, here = "", body
    for i, part in enumerate(parts):
        if isinstance(part, int) and isinstance(here, list) and part < len(here):
            path, here = f"{path}[{part}]", here[part]
        elif (
            isinstance(part, str)
            and isinstance(here, dict)
            and (part in here or (i == len(parts) - 1 and not UNION_TAG.match(part)))
        ):
            path, here = f"{path}.{part}" if path else part, here.get(part)
        elif not path:
            return None
    return path or None


def validation_error(exc: RequestValidationError) -> APIError:
    """FastAPI's 422 rewritten as OpenAI does: a 400 naming the field."""
    errors = exc.errors()
    first = errors[0] if errors else {"type": "missing", "loc": ("body",), "msg": "no body"}
    if first["type"] == "json_invalid":
        why = first.get("ctx", {}).get("error", first["msg"])
        return APIError(400, f"the body is not valid JSON: {why}", code="invalid_json")
    param = _param(tuple(first.get("loc", ())), getattr(exc, "body", None))
    if param is None:
        return APIError(400, "the body must be a JSON object", code="invalid_json")
    code = "invalid_value" if first["type"] in VALUE_ERRORS else "invalid_type"
    return APIError(400, f"{param}: {first['msg']}", param, code=code)


def log_refusal(method: str, path: str, err: APIError) -> None:
    log.info("%s %s %d %s (param %s)", method, path, err.status, err.message, err.param)


def refusal_sender(count: Count) -> Callable[[APIError, Scope, Receive, Send], Awaitable[None]]:
    """How a middleware refuses (before any route): logged, counted, an OpenAI error body."""

    async def refuse(err: APIError, scope: Scope, receive: Receive, send: Send) -> None:
        log_refusal(scope["method"], scope["path"], err)
        count(err.outcome, err.reason)
        await err.response()(scope, receive, send)

    return refuse


def install_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
        log_refusal(request.method, request.url.path, exc)
        request.app.state.server.metrics.refused(exc.outcome, exc.reason)
        return exc.response()

    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await on_api_error(request, validation_error(exc))

    async def on_http(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = HTTP_CODES.get(exc.status_code, "invalid_request")
        request.app.state.server.metrics.refused("invalid", code)
        return APIError(
            exc.status_code, str(exc.detail), type=kind, code=code, headers=exc.headers
        ).response()

    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        request.app.state.server.metrics.refused("error", "internal_error")
        err = APIError(
            500, f"internal error: {type(exc).__name__}", type="server_error", code="internal_error"
        )
        return err.response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_crash)
