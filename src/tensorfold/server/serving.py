"""The two generation endpoints: checks, prompt ids, sampling parameters, lanes, then the reply."""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, fields
from pathlib import Path

from fastapi import Request

from ..engine.request import SamplingParams
from ..errors import QueueFull, RequestError
from ..tokenizer import Tokenizer
from .async_engine import AsyncEngine, EngineFailed, Lane
from .errors import APIError, from_engine
from .formats import ChatFormat, CompletionFormat, TokenTexts
from .metrics import Metrics
from .prompts import encode_chat, encode_prompts
from .protocol import ChatCompletionRequest, CompletionRequest, GenerationRequest
from .reply import SSE_HEADERS, EventStream, Reply, collect, stream_events

log = logging.getLogger("tensorfold.server")
MAX_N = 128


@dataclass(frozen=True)
class SamplingDefaults:
    """Where a request leaves a field out: the checkpoint's generation_config (as vLLM does)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> SamplingDefaults:
        f = Path(path) / "generation_config.json"
        raw = json.loads(f.read_text()) if f.is_file() else {}
        if raw.get("do_sample") is False:            # the checkpoint asks for greedy decoding
            return cls(temperature=0.0)
        return cls(**{k.name: raw[k.name] for k in fields(cls) if raw.get(k.name) is not None})


@dataclass
class ServerState:
    """What every route needs: the engine bridge, the tokenizer, the name it answers to."""

    engine: AsyncEngine
    tokenizer: Tokenizer | None
    model_name: str
    metrics: Metrics
    defaults: SamplingDefaults
    texts: TokenTexts

    @property
    def context(self) -> int:
        return self.engine.engine.config.context


@dataclass(frozen=True)
class Job:
    """A request ready for the engine: its lanes and how to answer."""

    request_id: str
    lanes: list[Lane]
    stream: bool
    include_usage: bool
    prefixes: dict[int, str]             # echoed prompt text by choice index
    renames: dict[str, str]              # engine parameter names -> the names the client used


async def complete(s: ServerState, body: CompletionRequest, request: Request):
    check_common(body, s.model_name)
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo with logprobs needs prompt logprobs, which are not supported",
                       "echo", code="unsupported")
    prompts = encode_prompts(body.prompt, s.tokenizer)
    renames = {} if body.max_tokens is not None else {"max_tokens": "prompt"}
    params = sampling_params(body, s.defaults, body.max_tokens, body.logprobs, renames)
    lanes = lanes_for(prompts, params, body.n)
    prefixes = {}
    if body.echo and s.tokenizer is not None:
        prefixes = {lane.index: s.tokenizer.decode(lane.prompt_ids) for lane in lanes}
    job = Job(f"cmpl-{uuid.uuid4().hex}", lanes, body.stream, body.include_usage, prefixes,
              renames)
    fmt = CompletionFormat(job.request_id, s.model_name, s.texts, body.logprobs is not None,
                           body.return_token_ids)
    return await respond(s, job, fmt, request)


async def chat(s: ServerState, body: ChatCompletionRequest, request: Request):
    check_common(body, s.model_name)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs",
                       code="invalid_value")
    ids = encode_chat(body.messages, s.tokenizer, body.chat_template_kwargs,
                      body.add_generation_prompt)
    limit_name = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    limit = getattr(body, limit_name)
    renames = {"logprobs": "top_logprobs", "prompt": "messages",
               "max_tokens": limit_name if limit is not None else "messages"}
    top = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling_params(body, s.defaults, limit, top, renames)
    job = Job(f"chatcmpl-{uuid.uuid4().hex}", lanes_for([ids], params, body.n), body.stream,
              body.include_usage, {}, renames)
    fmt = ChatFormat(job.request_id, s.model_name, s.texts, body.logprobs, body.return_token_ids)
    return await respond(s, job, fmt, request)


def sampling_params(req: GenerationRequest, defaults: SamplingDefaults, max_tokens: int | None,
                    logprobs: int | None, renames: dict[str, str]) -> SamplingParams:
    """The engine's parameters; a bad value is a 400 naming the field as the client spelt it."""
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
        raise APIError(400, f"n={req.n} must be between 1 and {MAX_N}", "n",
                       code="invalid_value")
    bad = req.unsupported()
    if bad is not None:
        raise APIError(400, f"{bad} is not supported by this server", bad, code="unsupported")
    if req.model_extra:
        log.warning("ignoring unknown fields: %s", ", ".join(sorted(req.model_extra)))


def lanes_for(prompts: list[list[int]], params: SamplingParams, n: int) -> list[Lane]:
    """Choice i of prompt p has index p * n + i and stream i, whatever else is in the batch."""
    return [Lane(p * n + i, ids, params, stream=i)
            for p, ids in enumerate(prompts) for i in range(n)]


async def respond(s: ServerState, job: Job, fmt: CompletionFormat | ChatFormat,
                  request: Request):
    """Admits the job's lanes (or refuses with the engine's reason), then answers."""
    try:
        gen = s.engine.submit(job.request_id, job.lanes)
    except (RequestError, QueueFull) as exc:
        raise from_engine(exc, job.renames) from exc
    except EngineFailed as exc:             # the engine has stopped: nothing can be served
        raise APIError(503, str(exc), type="server_error", code="engine_stopped") from exc
    reply = Reply(job.request_id, job.lanes, gen, fmt, s.metrics, job.prefixes)
    if job.stream:
        return EventStream(stream_events(reply, job.include_usage), headers=SSE_HEADERS)
    return await collect(reply, request)
