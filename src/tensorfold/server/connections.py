"""Connection hygiene under uvicorn's h11 protocol: a request's headers and body must arrive in
time, an idle connection is closed, and past a cap on open connections each request gets a 503.
uvicorn alone waits forever for a half-sent request and answers its own cap in plain text."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import h11
import uvicorn
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from .auth import MONITORING_PATHS
from .errors import APIError
from .limits import ConnectionLimits
from .logsafe import clip

log = logging.getLogger("tensorfold.server")
LOG_EVERY_S = 10.0  # a flood of refused connections logs one line per this many seconds


@dataclass
class ConnectionGuard:
    """What every connection of one server shares: its limits and where refusals are counted."""

    limits: ConnectionLimits
    dropped: Callable[[str], None]  # Metrics.dropped(reason)
    refused: Callable[[str, str], None]  # Metrics.refused(outcome, reason)
    last_log: float = 0.0

    def note(self, what: str) -> None:
        now = time.monotonic()
        if now - self.last_log >= LOG_EVERY_S:
            self.last_log = now
            log.warning(
                "%s (further ones in the next %.0fs are counted in /metrics only)",
                what,
                LOG_EVERY_S,
            )

    def past_cap(self, app: Any) -> Any:
        """The app of a connection past the cap: /metrics is answered and /health says the
        server is alive but cannot take work (a supervisor sees why requests fail), anything
        else gets a 503; either way the connection then closes."""

        async def refuse_or_monitor(scope: Any, receive: Any, send: Any) -> None:
            cap = self.limits.max_connections
            if scope["type"] == "http" and scope["path"] == "/health":
                body = {"status": "overloaded", "reason": f"more than {cap} open connections"}
                response = JSONResponse(body, status_code=503, headers={"Connection": "close"})
                return await response(scope, receive, send)
            if scope["type"] == "http" and scope["path"] in MONITORING_PATHS:
                return await app(scope, receive, closing(send))
            self.refused("overloaded", "too_many_connections")
            self.note(f"refused a request: more than {cap} open connections (--max-connections)")
            err = APIError(
                503,
                f"the server has more than {cap} open connections; retry shortly",
                code="too_many_connections",
                type="server_error",
                headers={"Retry-After": "1", "Connection": "close"},
            )
            await err.response()(scope, receive, send)

        return refuse_or_monitor


def closing(send: Any) -> Any:
    """`send` with `Connection: close` added to the response's headers."""

    async def send_then_close(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {
                **message,
                "headers": [*message.get("headers", []), (b"connection", b"close")],
            }
        await send(message)

    return send_then_close


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines and the connection cap (see the module doc)."""

    guard: ConnectionGuard  # set on the subclass that guarded_protocol() makes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._phase: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.guard.limits.max_connections:
            self.app = self.guard.past_cap(self.app)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Arms the deadline that fits where the client is in its request; a phase keeps its
        first deadline, so trickling bytes never extends it."""
        if self.transport.is_closing():
            return self._arm(None)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm("body")
        elif state is not h11.IDLE:
            self._arm(None)  # the request is in: the reply may take as long as it needs
        elif self.cycle is None or self.conn.trailing_data[0]:
            self._arm("header")  # a request has begun (or the connection is new)
        elif self.timeout_keep_alive_task is None:
            self._arm("idle")  # e.g. after an early reply's unread body was drained
        else:
            self._arm(None)  # between requests: uvicorn's keep-alive timer runs

    def _arm(self, phase: str | None) -> None:
        if phase == self._phase:
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is not None:
            limits = self.guard.limits
            seconds = {
                "header": limits.header_timeout_s,
                "body": limits.body_timeout_s,
                "idle": limits.keep_alive_s,
            }[phase]
            self._deadline = self.loop.call_later(seconds, self._expired, phase)

    def _expired(self, phase: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if phase == "idle":  # an ordinary keep-alive end, not a refusal
            return self.transport.close()
        self.guard.dropped(f"{phase}_timeout")
        peer = clip(str(self.client), 80)
        self.guard.note(
            f"closed a connection from {peer}: its request's {phase} did not arrive "
            f"in time (--{phase}-timeout)"
        )
        if phase == "body":  # the request line is in: the client is told why (RFC 9110, 408)
            self.transport.write(_timeout_response(self.guard.limits.body_timeout_s))
        self.transport.close()


def _timeout_response(seconds: float) -> bytes:
    """A 408 with the API's error body (APIError's), written straight to the socket: the app is
    still waiting for the body, so no response of its own has begun."""
    message = f"the request body did not arrive within {seconds:g} s (--body-timeout)"
    body = APIError(408, message, code="body_timeout").response().body
    head = "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})


def server_config(app: Any, host: str, port: int, **options: Any) -> uvicorn.Config:
    """uvicorn's config for an app from create_app, with its connection limits in force."""
    guard: ConnectionGuard = app.state.connection_guard
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(guard),
        timeout_keep_alive=guard.limits.keep_alive_s,
        **options,
    )
