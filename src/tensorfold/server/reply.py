"""One request's answer: events from its choices become a JSON response or an SSE stream, and a
client that leaves (or a server that stops) cancels the choices still running."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import AsyncIterator

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..engine.request import TokenEvent
from .async_engine import Choice, EngineFailed, Generation
from .errors import APIError
from .formats import ChatFormat, ChoiceState, CompletionFormat, usage
from .metrics import ChoiceTimes, Metrics
from .protocol import CompletionTokensDetails, ErrorInfo, ErrorResponse, Usage

log = logging.getLogger("tensorfold.server")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Reply:
    """Drives one Generation to its end, keeping per-choice state, metrics and the log line."""

    def __init__(
        self,
        request_id: str,
        asked: list[Choice],
        gen: Generation,
        fmt: CompletionFormat | ChatFormat,
        metrics: Metrics,
        prefixes: dict[int, str],
    ) -> None:
        self.request_id, self.gen, self.fmt, self.metrics = request_id, gen, fmt, metrics
        self.asked = asked
        self.requests = {c.index: req for c, req in zip(asked, gen.requests)}
        self.choices = {
            c.index: ChoiceState(
                c.index, len(c.prompt_ids), prefixes.get(c.index, ""), c.prompt_ids
            )
            for c in asked
        }

    def add(self, index: int, event: TokenEvent) -> ChoiceState:
        c, now = self.choices[index], time.monotonic()
        if event.token_ids:
            if c.last_token_time is not None:
                self.metrics.token_latency.observe(now - c.last_token_time)
            c.last_token_time = now
        if event.prompt_logprobs is not None:
            c.prompt_logprobs = event.prompt_logprobs
        c.token_ids += event.token_ids
        c.logprobs += event.logprobs
        c.text += event.text
        if event.finished:
            self._finished(c, event.finish_reason or "stop")
        return c

    def _finished(self, c: ChoiceState, reason: str) -> None:
        c.finish_reason = reason
        req = self.requests[c.index]
        if req.times.first_token is not None:
            self.metrics.ttft.observe(req.times.first_token - req.times.arrival)
        times = ChoiceTimes(req.times.arrival, req.times.admitted, time.monotonic())
        self.metrics.finished(reason, c.prompt_tokens, len(c.token_ids), req.cached_tokens, times)

    def close(self, status: int) -> None:
        """Cancels choices still running (the client left) and writes the request's log line."""
        self.gen.cancel()
        for c in self.choices.values():
            if c.finish_reason is None:
                self._finished(c, "cancelled")
        self._log(status)

    def usage(self) -> Usage:
        """Each prompt counts once (its first choice), however many choices it has."""
        firsts = [c for c in self.asked if c.choice == 0]
        prompt = sum(len(c.prompt_ids) for c in firsts)
        cached = sum(self.requests[c.index].cached_tokens for c in firsts)
        u = usage(list(self.choices.values()), prompt, cached)
        if any(c.prediction for c in self.asked):  # OpenAI's counts of the predicted tokens
            drafts = [self.requests[c.index].lane.draft for c in self.asked]
            u.completion_tokens_details = CompletionTokensDetails(
                accepted_prediction_tokens=sum(d.prediction_accepted for d in drafts if d),
                rejected_prediction_tokens=sum(d.prediction_rejected for d in drafts if d),
            )
        return u

    def _log(self, status: int) -> None:
        reqs = list(self.requests.values())
        u = self.usage()
        firsts = [r.times.first_token for r in reqs if r.times.first_token is not None]
        ttft = f"{min(firsts) - min(r.times.arrival for r in reqs):.3f}s" if firsts else "-"
        span = time.monotonic() - min(firsts) if firsts else 0.0
        rate = f"{u.completion_tokens / span:.1f}" if span > 0 else "-"
        reasons = ",".join(sorted({c.finish_reason or "-" for c in self.choices.values()}))
        log.info(
            "%s %d prompt=%d completion=%d cached=%d ttft=%s tok/s=%s finish=%s",
            self.request_id,
            status,
            u.prompt_tokens,
            u.completion_tokens,
            u.prompt_tokens_details.cached_tokens,
            ttft,
            rate,
            reasons,
        )

    def chunk_for(self, c: ChoiceState, event: TokenEvent, continuous: bool = False) -> str | None:
        """The SSE chunk for one event, or None when it carries nothing to show yet;
        `continuous`: each chunk carries the usage so far (vLLM's continuous_usage_stats)."""
        wanted = self.fmt.want_logprobs or self.fmt.want_ids
        if not (event.text or event.finished or (event.token_ids and wanted)):
            return None
        body = self.fmt.delta(
            c,
            event.text,
            event.token_ids,
            event.logprobs,
            event.finish_reason if event.finished else None,
        )
        bodies = body if isinstance(body, list) else [body]
        if continuous:
            for b in bodies:
                b.usage = self.usage()
        return "".join(sse(b.model_dump_json()) for b in bodies) or None


def sse(data: str) -> str:
    return f"data: {data}\n\n"


class EventStream(StreamingResponse):
    """SSE that always watches for the client leaving, so a silent stream (mid-prompt) notices."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def run_then_stop(func) -> None:
                await func()
                tg.cancel_scope.cancel()

            tg.start_soon(run_then_stop, partial(self.stream_response, send))
            await run_then_stop(partial(self.listen_for_disconnect, receive))


async def stream_events(
    reply: Reply, include_usage: bool, continuous: bool = False
) -> AsyncIterator[str]:
    status = 499  # until the stream ends normally: the client left
    try:
        for c in reply.choices.values():
            opening = reply.fmt.opening(c)
            if opening is not None:
                if continuous:  # every chunk, the first too, carries the usage so far
                    opening.usage = reply.usage()
                yield sse(opening.model_dump_json())
        async for index, event in reply.gen.events():
            chunk = reply.chunk_for(reply.add(index, event), event, continuous)
            if chunk is not None:
                yield chunk
        if include_usage:
            yield sse(reply.fmt.usage_chunk(reply.usage()).model_dump_json())
        status = 200
    except EngineFailed as exc:
        status = 500
        error = ErrorResponse(error=ErrorInfo(message=str(exc), type="server_error"))
        yield sse(error.model_dump_json())
    finally:
        reply.close(status)
    yield "data: [DONE]\n\n"


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def collect(reply: Reply, request: Request) -> Response:
    """Waits for every choice, or cancels them all the moment the client disconnects."""

    async def drain() -> None:
        async for index, event in reply.gen.events():
            reply.add(index, event)

    work = asyncio.ensure_future(drain())
    watch = asyncio.ensure_future(_until_disconnect(request.receive))
    status = 499  # unless the work ends first: the client left (or we stop)
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            work.result()
            status = 200
    except EngineFailed as exc:
        status = 500
        raise APIError(500, str(exc), type="server_error") from exc
    finally:
        work.cancel()
        watch.cancel()
        reply.close(status)
    if status != 200:
        return Response(status_code=status)
    if any(c.finish_reason == "cancelled" for c in reply.choices.values()):
        raise APIError(
            503,
            "the request was cancelled: the server is shutting down",
            code="cancelled",
            type="server_error",
        )
    body = reply.fmt.response(list(reply.choices.values()), reply.usage())
    return JSONResponse(body.model_dump())
