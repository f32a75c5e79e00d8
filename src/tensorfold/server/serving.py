"""From a parsed request to the engine and back: lanes in, a response or an SSE stream out."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import AsyncIterator

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..engine.request import Request as EngineRequest
from ..engine.request import SamplingParams, TokenEvent
from ..errors import QueueFull, RequestError
from .async_engine import AsyncEngine, EngineFailed, Generation, Lane
from .errors import APIError, from_engine
from .formats import ChatFormat, ChoiceState, CompletionFormat, usage
from .metrics import Metrics
from .protocol import ErrorInfo, ErrorResponse, GenerationRequest

log = logging.getLogger("tensorfold.server")
MAX_N = 128


@dataclass(frozen=True)
class SamplingDefaults:
    """Used where a request leaves a field out: the checkpoint's generation_config, as vLLM does."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> SamplingDefaults:
        f = Path(path) / "generation_config.json"
        raw = json.loads(f.read_text()) if f.is_file() else {}
        return cls(**{k.name: raw[k.name] for k in fields(cls) if raw.get(k.name) is not None})


@dataclass(frozen=True)
class Job:
    """A request ready for the engine: its lanes, how to answer, and the names the client used."""

    request_id: str
    lanes: list[Lane]
    prompt_tokens: int                   # each distinct prompt once, as usage counts it
    stream: bool
    include_usage: bool
    prefixes: dict[int, str]             # echoed prompt text by choice index


def sampling_params(req: GenerationRequest, defaults: SamplingDefaults, max_tokens: int | None,
                    logprobs: int | None, renames: dict[str, str]) -> SamplingParams:
    def pick(name: str):
        value = getattr(req, name)
        return getattr(defaults, name) if value is None else value

    try:
        return SamplingParams(max_tokens=max_tokens, temperature=pick("temperature"),
                              top_p=pick("top_p"), top_k=pick("top_k"), min_p=pick("min_p"),
                              seed=req.seed, stop=req.stop or (), ignore_eos=req.ignore_eos,
                              stop_token_ids=tuple(req.stop_token_ids or ()), logprobs=logprobs)
    except RequestError as exc:
        raise from_engine(exc, renames) from exc


def check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(404, f"the model {name!r} does not exist; this server serves {served!r}",
                       "model", code="model_not_found", type="not_found_error")


def check_common(req: GenerationRequest, served: str) -> None:
    """Refusals that do not need the engine: wrong model, n out of range, unsupported fields."""
    check_model(req.model, served)
    if not 1 <= req.n <= MAX_N:
        raise APIError(400, f"n={req.n} must be between 1 and {MAX_N}", "n", code="invalid_value")
    bad = req.unsupported()
    if bad is not None:
        raise APIError(400, f"{bad} is not supported by this server", bad, code="unsupported")
    if req.model_extra:
        log.warning("ignoring unknown fields: %s", ", ".join(sorted(req.model_extra)))


def lanes_for(prompts: list[list[int]], params: SamplingParams, n: int) -> list[Lane]:
    """Choice i of prompt p has index p * n + i and stream i, whatever else is in the batch."""
    return [Lane(p * n + i, ids, params, stream=i) for p, ids in enumerate(prompts) for i in range(n)]


def submit(engine: AsyncEngine, job: Job, renames: dict[str, str]) -> Generation:
    try:
        return engine.submit(job.request_id, job.lanes)
    except (RequestError, QueueFull) as exc:
        raise from_engine(exc, renames) from exc


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


class Reply:
    """Drives one Generation to its end, keeping per-choice state, metrics and the log line."""

    def __init__(self, job: Job, gen: Generation, fmt: CompletionFormat | ChatFormat,
                 metrics: Metrics) -> None:
        self.job, self.gen, self.fmt, self.metrics = job, gen, fmt, metrics
        self.choices = {lane.index: ChoiceState(lane.index, len(lane.prompt_ids),
                                                job.prefixes.get(lane.index, ""))
                        for lane in job.lanes}
        self.requests: dict[int, EngineRequest] = {lane.index: r for lane, r in zip(job.lanes, gen.requests)}

    def add(self, index: int, event: TokenEvent) -> ChoiceState:
        c, now = self.choices[index], time.monotonic()
        if event.token_ids:
            if c.last_token_time is not None:
                self.metrics.token_latency.observe(now - c.last_token_time)
            c.last_token_time = now
        c.token_ids += event.token_ids
        c.logprobs += event.logprobs
        c.text += event.text
        if event.finished:
            self._finished(c, event.finish_reason or "stop")
        return c

    def _finished(self, c: ChoiceState, reason: str) -> None:
        c.finish_reason = reason
        req = self.requests[c.index]
        if req.first_token_time is not None:
            self.metrics.ttft.observe(req.first_token_time - req.arrival)
        self.metrics.finished(reason, c.prompt_tokens, len(c.token_ids), cached=0)

    def close(self, status: int = 200) -> None:
        """Cancels lanes still running (the client left) and writes the request's log line."""
        self.gen.cancel()
        for c in self.choices.values():
            if c.finish_reason is None:
                self._finished(c, "cancelled")
        self._log(status)

    def _log(self, status: int) -> None:
        reqs = list(self.requests.values())
        done = sum(len(c.token_ids) for c in self.choices.values())
        firsts = [r.first_token_time for r in reqs if r.first_token_time is not None]
        ttft = f"{min(firsts) - min(r.arrival for r in reqs):.3f}s" if firsts else "-"
        span = time.monotonic() - min(firsts) if firsts else 0.0
        rate = f"{done / span:.1f}" if span > 0 else "-"
        reasons = ",".join(sorted({c.finish_reason or "-" for c in self.choices.values()}))
        log.info("%s %d prompt=%d completion=%d cached=0 ttft=%s tok/s=%s finish=%s", self.job.request_id,
                 status, self.job.prompt_tokens, done, ttft, rate, reasons)

    def usage(self):
        return usage(list(self.choices.values()), self.job.prompt_tokens)

    def chunk_for(self, c: ChoiceState, event: TokenEvent) -> str | None:
        if not (event.text or event.finished or (event.token_ids and (self.fmt.want_logprobs
                                                                      or self.fmt.want_ids))):
            return None
        body = self.fmt.delta(c, event.text, event.token_ids, event.logprobs,
                              event.finish_reason if event.finished else None)
        return sse(body.model_dump_json())


def sse(data: str) -> str:
    return f"data: {data}\n\n"


async def stream_events(reply: Reply) -> AsyncIterator[str]:
    status = 499                  # until the stream ends normally: the client left
    try:
        for c in reply.choices.values():
            opening = reply.fmt.opening(c)
            if opening is not None:
                yield sse(opening.model_dump_json())
        async for index, event in reply.gen.events():
            chunk = reply.chunk_for(reply.add(index, event), event)
            if chunk is not None:
                yield chunk
        if reply.job.include_usage:
            yield sse(reply.fmt.usage_chunk(reply.usage()).model_dump_json())
        status = 200
    except EngineFailed as exc:
        status = 500
        yield sse(ErrorResponse(error=ErrorInfo(message=str(exc), type="server_error")).model_dump_json())
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
    status = 499                  # unless the work ends first: the client left (or we are stopping)
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
        raise APIError(503, "the request was cancelled: the server is shutting down",
                       code="cancelled", type="server_error")
    return JSONResponse(reply.fmt.response(list(reply.choices.values()), reply.usage()).model_dump())


async def respond(engine: AsyncEngine, metrics: Metrics, job: Job, fmt, request: Request,
                  renames: dict[str, str]):
    gen = submit(engine, job, renames)
    reply = Reply(job, gen, fmt, metrics)
    if job.stream:
        return EventStream(stream_events(reply), headers={"Cache-Control": "no-cache",
                                                          "X-Accel-Buffering": "no"})
    return await collect(reply, request)
