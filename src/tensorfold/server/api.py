"""The FastAPI app: OpenAI routes, health, metrics, memory, tokenize; create_app builds one."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..engine.engine import Engine
from ..engine.reasoning import think_ids
from ..tokenizer import Tokenizer
from .async_engine import AsyncEngine
from .auth import DOCS_PATHS, MONITORING_PATHS, APIKeyCheck
from .bodyguard import BodyGuard
from .connections import ConnectionGuard
from .docs import ASSET_PATHS as DOC_ASSETS
from .docs import mount_docs
from .errors import APIError, install_handlers, log, refusal_sender
from .formats import TokenTexts
from .limits import Limits
from .logsafe import guard_logger
from .metrics import Metrics
from .page import PAGE_PATHS, mount_page
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from .serving import SamplingDefaults, ServerState, chat, check_model, complete
from .textwork import ChatInput, TextWorker

OPEN_PATHS = (*MONITORING_PATHS, *DOCS_PATHS, *DOC_ASSETS, *PAGE_PATHS)


def create_app(
    engine: Engine,
    tokenizer: Tokenizer | None,
    served_model_name: str,
    api_key: str | None = None,
    defaults: SamplingDefaults | None = None,
    web: bool = True,
    limits: Limits | None = None,
    warmup: Callable[[], object] | None = None,
    fingerprint: str | None = None,
    allowed_origins: tuple[str, ...] = (),
) -> FastAPI:
    """The server for one engine; its engine thread runs from startup to shutdown. `web`: the chat
    page at GET / (server/page.py). `warmup` runs on the engine thread first (engine/warmup.py):
    /health answers "loading" and generation 503 until it ends."""
    bridge = AsyncEngine(engine, warmup)
    metrics = Metrics(lambda: bridge.stats, bridge.facts.lanes)
    limits = limits or Limits.for_context(bridge.facts.context, bridge.facts.max_queue)
    limits.check()
    text = TextWorker(tokenizer, bridge.facts.vocab_size, limits)
    state = ServerState(
        bridge,
        tokenizer,
        served_model_name,
        metrics,
        defaults or SamplingDefaults(),
        TokenTexts(tokenizer),
        text,
        limits,
        fingerprint,
        think_ids(tokenizer),
    )
    guard_logger(log)  # every server log line escaped and bounded

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        bridge.start()
        yield
        bridge.stop()
        bridge.close()  # a tensor split's other ranks stop
        text.close()

    app = FastAPI(title="TensorFold", lifespan=lifespan, docs_url=None, redoc_url=None)
    mount_docs(app, "TensorFold")  # the docs pages with their files from the package, not a CDN
    app.state.server = state
    app.state.connection_guard = ConnectionGuard(
        limits.connections, metrics.dropped, metrics.refused
    )
    install_handlers(app)
    app.add_middleware(
        BodyGuard, limits=limits, refuse=refusal_sender(metrics.refused), routes=app.router.routes
    )
    if api_key:  # added last: runs first, before any body is read
        app.add_middleware(
            APIKeyCheck, api_key=api_key, count=metrics.refused, open_paths=OPEN_PATHS
        )
    if allowed_origins:  # added after the key check: runs before it (a preflight has no key)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )
    _generation_routes(app, state)
    _info_routes(app, state)
    _token_routes(app, state)
    if web:
        mount_page(app)
    return app


def _generation_routes(app: FastAPI, s: ServerState) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await complete(s, body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await chat(s, body, request)


def _info_routes(app: FastAPI, s: ServerState) -> None:
    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=s.model_name, max_model_len=s.context)])

    @app.get("/health")
    async def health() -> Response:
        if s.engine.loading and s.engine.alive:
            return JSONResponse({"status": "loading"}, status_code=503)
        if not s.engine.alive:
            body = {"status": "engine stopped"} | (
                {"fault": s.engine.fault} if s.engine.fault else {}
            )
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,  # Prometheus text, as /openapi.json must say
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus metrics"}},
    )
    async def metrics() -> Response:
        return Response(s.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/memory")
    async def memory() -> dict:
        return asdict(s.engine.memory())  # bytes by owner (engine/stats.py MemoryReport)


def _token_routes(app: FastAPI, s: ServerState) -> None:
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        check_model(body.model, s.model_name)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(
                400, "send exactly one of prompt and messages", "prompt", code="invalid_value"
            )
        if body.continue_final_message:  # as /v1/chat/completions answers it
            raise APIError(
                400,
                "continue_final_message is not supported by this server",
                "continue_final_message",
                code="unsupported",
            )
        if body.messages is not None:
            ids = await s.text.chat(ChatInput.of(body))
        else:
            ids = (await s.text.prompts(body.prompt))[0]
        out = {"count": len(ids), "max_model_len": s.context, "tokens": ids}
        if body.return_token_strs:
            out["token_strs"] = [s.texts.get(t)[0] for t in ids]
        return out

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        check_model(body.model, s.model_name)
        return {"prompt": await s.text.decode(body.tokens)}
