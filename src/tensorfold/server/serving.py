"""The two generation endpoints: checks, prompt ids, sampling parameters, choices, the reply."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass, fields
from pathlib import Path

from fastapi import Request

from ..checkpoint_info import generation_config
from ..engine.constraints import Grammar
from ..engine.reasoning import thinking_open
from ..engine.request import SamplingParams
from ..errors import QueueFull, RequestError
from ..tokenizer import Tokenizer
from .async_engine import AsyncEngine, Choice, EngineFailed, EngineLoading
from .chat_request import chat_options, check_tools, tool_choice
from .errors import APIError, from_engine
from .formats import ChatFormat, CompletionFormat, TokenTexts
from .limits import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, Limits
from .logsafe import clip, names
from .metrics import Metrics
from .prompts import split_prompt
from .protocol import ChatCompletionRequest, CompletionRequest, GenerationRequest
from .reply import SSE_HEADERS, EventStream, Reply, collect, stream_events
from .structured import chat_grammar, compile_error
from .textwork import ChatInput, TextWorker

log = logging.getLogger("tensorfold.server")
MAX_N = 128


@dataclass(frozen=True)
class SamplingDefaults:
    """Where a request leaves a field out: the checkpoint's generation_config (as vLLM does)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_new_tokens: int | None = None  # the checkpoint's reply limit (the server's --max-tokens)

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> SamplingDefaults:
        raw = generation_config(path)
        limit = raw.get("max_new_tokens")
        limit = limit if isinstance(limit, int) and limit > 0 else None
        if raw.get("do_sample") is False:  # the checkpoint asks for greedy decoding
            return cls(temperature=0.0, max_new_tokens=limit)
        picked = {k.name: raw[k.name] for k in fields(cls) if raw.get(k.name) is not None}
        return cls(**(picked | {"max_new_tokens": limit}))


@dataclass
class ServerState:
    """What every route needs: the engine bridge, the tokenizer, the name it answers to."""

    engine: AsyncEngine
    tokenizer: Tokenizer | None
    model_name: str
    metrics: Metrics
    defaults: SamplingDefaults
    texts: TokenTexts
    text: TextWorker  # tokenizing and templates, off the event loop
    limits: Limits
    fingerprint: str | None = None  # system_fingerprint: what fixes a request's bytes
    think_ids: tuple[int | None, int | None] = (None, None)  # <think>, </think>

    @property
    def context(self) -> int:
        return self.engine.facts.context


@dataclass(frozen=True)
class Job:
    """A request ready for the engine: its choices and how to answer."""

    request_id: str
    choices: list[Choice]
    stream: bool
    include_usage: bool
    prefixes: dict[int, str]  # echoed prompt text by choice index
    renames: dict[str, str]  # engine parameter names -> the names the client used
    continuous_usage: bool = False  # usage in every chunk (vLLM's continuous_usage_stats)


async def complete(s: ServerState, body: CompletionRequest, request: Request):
    check_common(body, s)
    check_choices(len(split_prompt(body.prompt)), body.n, "prompt", s)  # before tokenizing
    prompts = await s.text.prompts(body.prompt)
    check_context(prompts, "prompt", s)
    renames = {} if body.max_tokens is not None else {"max_tokens": "prompt"}
    echo_lp = body.echo and body.logprobs is not None
    scored = [
        k for k in (body.logprobs if echo_lp else None, body.prompt_logprobs) if k is not None
    ]
    params = sampling_params(
        body, s.defaults, body.max_tokens, body.logprobs, renames, max(scored, default=None)
    )
    choices = await drafting(s, body, choices_for(prompts, params, body.n))
    prefixes = {}
    if body.echo and s.tokenizer is not None:
        texts = [await s.text.decode(ids) for ids in prompts]
        prefixes = {c.index: texts[c.index // body.n] for c in choices}
    job = Job(
        f"cmpl-{uuid.uuid4().hex}",
        choices,
        body.stream,
        body.include_usage,
        prefixes,
        renames,
        body.continuous_usage,
    )
    fmt = CompletionFormat(
        job.request_id,
        s.model_name,
        s.texts,
        body.logprobs is not None,
        body.return_token_ids,
        s.fingerprint,
        echo_lp,
        body.prompt_logprobs is not None,
    )
    return await respond(s, job, fmt, request)


async def chat(s: ServerState, body: ChatCompletionRequest, request: Request):
    check_common(body, s)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(
            400, "top_logprobs needs logprobs: true", "top_logprobs", code="invalid_value"
        )
    check_tools(body)
    check_choices(1, body.n, "messages", s)
    ids = await s.text.chat(ChatInput.of(body))
    check_context([ids], "messages", s)
    limit_name = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    limit = getattr(body, limit_name)
    renames = {
        "logprobs": "top_logprobs",
        "prompt": "messages",
        "max_tokens": limit_name if limit is not None else "messages",
    }
    top = (body.top_logprobs or 0) if body.logprobs else None
    if body.prompt_logprobs is not None and body.stream:
        raise APIError(
            400,
            "prompt_logprobs is answered in a whole reply, not a stream",
            "prompt_logprobs",
            code="unsupported",
        )
    grammar = await grammar_for(s, body, ids)
    params = sampling_params(body, s.defaults, limit, top, renames, body.prompt_logprobs, grammar)
    job = Job(
        f"chatcmpl-{uuid.uuid4().hex}",
        await drafting(s, body, choices_for([ids], params, body.n)),
        body.stream,
        body.include_usage,
        {},
        renames,
        body.continuous_usage,
    )
    fmt = ChatFormat(
        job.request_id,
        s.model_name,
        s.texts,
        body.logprobs,
        body.return_token_ids,
        chat_options(body, ids, s.think_ids),
        s.fingerprint,
    )
    return await respond(s, job, fmt, request)


def sampling_params(
    req: GenerationRequest,
    defaults: SamplingDefaults,
    max_tokens: int | None,
    logprobs: int | None,
    renames: dict[str, str],
    prompt_logprobs: int | None = None,
    grammar: Grammar | None = None,
) -> SamplingParams:
    """The engine's parameters; a bad value is a 400 naming the field as the client spelt it."""

    def pick(name: str):
        value = getattr(req, name)
        return getattr(defaults, name) if value is None else value

    try:
        return SamplingParams(
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            logit_bias=_bias(req.logit_bias),
            min_tokens=req.min_tokens,
            prompt_logprobs=prompt_logprobs,
            grammar=grammar,
            max_tokens=max_tokens,
            temperature=pick("temperature"),
            top_p=pick("top_p"),
            top_k=pick("top_k"),
            min_p=pick("min_p"),
            seed=req.seed,
            stop=req.stop or (),
            ignore_eos=req.ignore_eos,
            stop_token_ids=tuple(req.stop_token_ids or ()),
            logprobs=logprobs,
        )
    except RequestError as exc:
        raise from_engine(exc, renames) from exc


def _bias(raw: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias: token ids as JSON object keys (strings)."""
    out = {}
    for key, value in (raw or {}).items():
        try:
            out[int(key)] = value
        except ValueError:
            raise APIError(
                400,
                f"logit_bias keys must be token ids, not {clip(repr(key), 40)}",
                "logit_bias",
                code="invalid_value",
            ) from None
    return out


async def grammar_for(
    s: ServerState, body: ChatCompletionRequest, ids: list[int]
) -> Grammar | None:
    """The reply's grammar (response_format, a forced tool call), compiled against the
    vocabulary on a worker thread; one that does not compile is a 400 naming its field."""
    end = s.think_ids[1] if thinking_open(ids, *s.think_ids) else None
    grammar = chat_grammar(body, end)
    if grammar is None:
        return None
    why = await s.text.run(s.engine.grammar_error, grammar)
    if why:
        forced = tool_choice(body) == "required" or isinstance(body.tool_choice, dict)
        raise APIError(
            400,
            f"the {'tools' if forced else 'response_format'} schema does not compile: "
            f"{clip(compile_error(why), 400)}",
            "tools" if forced else "response_format",
            code="invalid_value",
        )
    return grammar


def check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(
            404,
            f"the model {name!r} does not exist; this server serves {served!r}",
            "model",
            code="model_not_found",
            type="not_found_error",
        )


def check_common(req: GenerationRequest, s: ServerState) -> None:
    """Refusals that do not need the prompt: wrong model, n out of range, unsupported fields,
    stops the engine could not check cheaply at every token."""
    check_model(req.model, s.model_name)
    if not 1 <= req.n <= MAX_N:  # the limit named is the one in force: the queue may be smaller
        most = min(MAX_N, s.limits.max_queue)
        raise APIError(400, f"n={req.n} must be between 1 and {most}", "n", code="invalid_value")
    if req.stream_options is not None and not req.stream:
        raise APIError(
            400, "stream_options needs stream: true", "stream_options", code="invalid_value"
        )
    bad = req.unsupported()
    if bad is not None:
        raise APIError(400, f"{bad} is not supported by this server", bad, code="unsupported")
    check_stops(req, s.text.vocab_size)
    if req.model_extra:
        log.warning(
            "ignoring %d unknown field(s): %s", len(req.model_extra), names(sorted(req.model_extra))
        )


def check_stops(req: GenerationRequest, vocab_size: int) -> None:
    stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
    if len(stops) > MAX_STOP_STRINGS:
        raise APIError(
            400,
            f"stop has {len(stops)} strings; at most {MAX_STOP_STRINGS}",
            "stop",
            code="invalid_value",
        )
    for stop in stops:
        if not 1 <= len(stop) <= MAX_STOP_CHARS:
            raise APIError(
                400,
                f"a stop string must have 1 to {MAX_STOP_CHARS} characters, not {len(stop)}",
                "stop",
                code="invalid_value",
            )
    ids = req.stop_token_ids or []
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise APIError(
            400,
            f"stop_token_ids has {len(ids)} ids; at most {MAX_STOP_TOKEN_IDS}",
            "stop_token_ids",
            code="invalid_value",
        )
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise APIError(
            400,
            f"stop token id {bad} is outside the vocabulary [0, {vocab_size})",
            "stop_token_ids",
            code="invalid_value",
        )


def check_choices(prompts: int, n: int, param: str, s: ServerState) -> None:
    """More choices than the queue holds can never be admitted: a 400, not a 429 to retry."""
    choices, queue = prompts * n, s.limits.max_queue
    if choices > queue:
        who = "n" if n > 1 else param
        raise APIError(
            400,
            f"{prompts} prompt(s) x n={n} = {choices} choices can never wait "
            f"in a queue of {queue} (--max-queue); send at most {queue}",
            who,
            code="too_many_choices",
        )


def check_context(prompts: list[list[int]], param: str, s: ServerState) -> None:
    """A prompt past the context on its own is the prompt's fault, not max_tokens'."""
    longest = max((len(ids) for ids in prompts), default=0)
    if longest >= s.context:
        raise APIError(
            400,
            f"the prompt is {longest} tokens; the context is {s.context} tokens "
            "and at least one must be generated",
            param,
            code="context_length_exceeded",
        )


async def drafting(s: ServerState, body: GenerationRequest, choices: list[Choice]):
    """Each choice's drafting: off with `draft: false`; a `prediction` drafts from its tokens."""
    prediction = None
    if body.prediction is not None and body.prediction.text:
        prediction = tuple((await s.text.prompts(body.prediction.text))[0])
    draft = body.draft is not False
    return [dataclasses.replace(c, draft=draft, prediction=prediction) for c in choices]


def choices_for(prompts: list[list[int]], params: SamplingParams, n: int) -> list[Choice]:
    """Choice i of prompt p has index p * n + i and choice i, whatever else is in the batch."""
    return [
        Choice(p * n + i, ids, params, choice=i) for p, ids in enumerate(prompts) for i in range(n)
    ]


async def respond(s: ServerState, job: Job, fmt: CompletionFormat | ChatFormat, request: Request):
    """Admits the job's choices (or refuses with the engine's reason), then answers."""
    try:
        gen = s.engine.submit(job.request_id, job.choices)
    except (RequestError, QueueFull) as exc:
        raise from_engine(exc, job.renames) from exc
    except EngineLoading as exc:  # the warm-up is still running: come back shortly
        raise APIError(
            503, str(exc), type="server_error", code="loading", headers={"Retry-After": "5"}
        ) from exc
    except EngineFailed as exc:  # the engine has stopped: nothing can be served
        raise APIError(503, str(exc), type="server_error", code="engine_stopped") from exc
    reply = Reply(job.request_id, job.choices, gen, fmt, s.metrics, job.prefixes)
    if job.stream:
        events = stream_events(reply, job.include_usage, job.continuous_usage)
        return EventStream(events, headers=SSE_HEADERS)
    return await collect(reply, request)
