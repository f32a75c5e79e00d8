"""The FastAPI app: OpenAI routes, health, metrics, memory, tokenize; create_app builds one."""
from __future__ import annotations

import hmac
import os
import resource
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from ..engine.engine import Engine
from ..tokenizer import Tokenizer
from .async_engine import AsyncEngine
from .errors import APIError, install_handlers
from .formats import TokenTexts
from .metrics import Metrics
from .prompts import encode_chat, encode_prompts
from .protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ModelCard,
                       ModelList, TokenizeRequest)
from .serving import SamplingDefaults, ServerState, chat, check_model, complete

OPEN_PATHS = ("/health", "/metrics", "/docs", "/openapi.json")


class APIKeyCheck:
    """Bearer-token check before anything else (body parsing included); monitoring stays open."""

    def __init__(self, app: ASGIApp, api_key: str, metrics: Metrics) -> None:
        self.app, self.expected, self.metrics = app, f"Bearer {api_key}".encode(), metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        self.metrics.refused("unauthorized")
        err = APIError(401, "invalid or missing API key (send Authorization: Bearer KEY)",
                       code="invalid_api_key")
        await err.response()(scope, receive, send)


def create_app(engine: Engine, tokenizer: Tokenizer | None, served_model_name: str,
               api_key: str | None = None, defaults: SamplingDefaults | None = None) -> FastAPI:
    """The server for one engine; its engine thread runs from startup to shutdown."""
    bridge = AsyncEngine(engine)
    metrics = Metrics(lambda: bridge.stats, engine.config.parallel)
    state = ServerState(bridge, tokenizer, served_model_name, metrics,
                        defaults or SamplingDefaults(), TokenTexts(tokenizer))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        bridge.start()
        yield
        bridge.stop()

    app = FastAPI(title="TensorFold", lifespan=lifespan)
    app.state.server = state
    install_handlers(app)
    if api_key:
        app.add_middleware(APIKeyCheck, api_key=api_key, metrics=metrics)
    _generation_routes(app, state)
    _info_routes(app, state)
    _token_routes(app, state)
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
        if not s.engine.alive:
            body = {"status": "engine stopped"} | ({"fault": s.engine.fault} if s.engine.fault else {})
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(s.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/memory")
    async def memory() -> dict:
        return _memory(s.engine.engine)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):     # not Linux: the peak is the best we have
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _memory(engine: Engine) -> dict:
    """Bytes by owner. The KV pool includes the pages the prompt cache may hold."""
    device = engine.model.device
    cache = engine.prefix_cache
    out = {"device": str(device), "weights_bytes": engine.model.weight_bytes,
           "kv_pool_bytes": engine.caches.kv.nbytes,
           "state_pool_bytes": engine.caches.states.nbytes,
           "prompt_cache_bytes": cache.nbytes, "prompt_cache_budget_bytes": cache.budget_bytes,
           "prompt_cache_entries": len(cache), "process_rss_bytes": _rss_bytes(),
           "device_allocated_bytes": None, "device_peak_bytes": None}
    if device.type == "cuda":
        out["device_allocated_bytes"] = torch.cuda.memory_allocated(device)
        out["device_peak_bytes"] = torch.cuda.max_memory_allocated(device)
    return out


def _token_routes(app: FastAPI, s: ServerState) -> None:
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        check_model(body.model, s.model_name)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "send exactly one of prompt and messages", "prompt",
                           code="invalid_value")
        if body.messages is not None:
            ids = encode_chat(body.messages, s.tokenizer, body.chat_template_kwargs,
                              body.add_generation_prompt)
        else:
            ids = encode_prompts(body.prompt, s.tokenizer)[0]
        return {"count": len(ids), "max_model_len": s.context, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        check_model(body.model, s.model_name)
        vocab = s.engine.engine.model.config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})",
                           "tokens", code="invalid_value")
        if s.tokenizer is None:
            raise APIError(400, "this checkpoint has no tokenizer", "tokens", code="no_tokenizer")
        return {"prompt": s.tokenizer.decode(body.tokens)}
