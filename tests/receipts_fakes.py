"""A stand-in OpenAI-compatible peer for the receipts' planted failures: its tokens are a pure
function of the prompt, and a plan says which requests it gets wrong and how."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from server_harness import wait_for

VOCAB = 500


@dataclass
class Plan:
    """What the fake does wrong. `alter(n, body)`: change the tokens of request number n (1-based,
    in arrival order at the generation routes)."""

    window: int = 512
    alter: Callable[[int, dict], bool] = lambda n, body: False
    refuse_past_window: bool = True
    cached_tokens: int = 0
    extra_prompt_tokens: int = 0  # usage.prompt_tokens off by this
    answers: dict[str, str] = field(default_factory=dict)  # chat prompt -> reply


def _prompt_key(body: dict) -> str:
    return json.dumps(body.get("prompt", body.get("messages")), sort_keys=True)


def _prompt_len(body: dict) -> int:
    prompt = body.get("prompt")
    return len(prompt) if isinstance(prompt, list) else len(_prompt_key(body))


def tokens_for(body: dict, altered: bool) -> list[int]:
    seed = hashlib.sha256(_prompt_key(body).encode()).digest()
    ids = [(seed[i % 32] + 7 * i) % VOCAB for i in range(int(body.get("max_tokens") or 16))]
    if altered and len(ids) > 2:
        ids[2] = (ids[2] + 1) % VOCAB  # one token differs, mid-reply
    return ids


def _usage(plan: Plan, body: dict, n: int) -> dict:
    p = _prompt_len(body) + plan.extra_prompt_tokens
    return {
        "prompt_tokens": p,
        "completion_tokens": n,
        "total_tokens": p + n,
        "prompt_tokens_details": {"cached_tokens": plan.cached_tokens},
    }


def _chat_reply(plan: Plan, body: dict) -> str:
    question = body["messages"][-1]["content"]
    answer = plan.answers.get(question, "I do not know.")
    thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
    return f"Let me think.\n</think>\n\n{answer}" if thinking else answer


def make_app(plan: Plan) -> FastAPI:
    app = FastAPI()
    count = {"n": 0}
    lock = threading.Lock()

    def generate(body: dict, chat: bool):
        with lock:
            count["n"] += 1
            n = count["n"]
        past = _prompt_len(body) + (body.get("max_tokens") or 16) > plan.window
        if plan.refuse_past_window and past:
            return JSONResponse({"error": {"message": "past the window"}}, status_code=400)
        ids = tokens_for(body, plan.alter(n, body))
        if body.get("stream"):
            return StreamingResponse(_events(plan, body, ids, chat), media_type="text/event-stream")
        choice = {"index": 0, "finish_reason": "length", "token_ids": ids}
        if chat:
            choice["message"] = {"role": "assistant", "content": _chat_reply(plan, body)}
        else:
            choice["text"] = " ".join(map(str, ids))
        return {"choices": [choice], "usage": _usage(plan, body, len(ids))}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return generate(await request.json(), chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return generate(await request.json(), chat=True)

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "fake", "max_model_len": plan.window}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        text = (await request.json())["prompt"]
        return {"tokens": [ord(c) % VOCAB for c in text]}

    return app


def _events(plan: Plan, body: dict, ids: list[int], chat: bool):
    for t in ids:
        choice = {"index": 0, "token_ids": [t]}
        choice |= {"delta": {"content": f" {t}"}} if chat else {"text": f" {t}"}
        yield f"data: {json.dumps({'choices': [choice]})}\n\n"
    yield f"data: {json.dumps({'choices': [], 'usage': _usage(plan, body, len(ids))})}\n\n"
    yield "data: [DONE]\n\n"


@dataclass
class FakePeer:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_fake(plan: Plan) -> FakePeer:
    server = uvicorn.Server(
        uvicorn.Config(
            make_app(plan), host="127.0.0.1", port=0, log_level="warning", access_log=False
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "the fake server to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    return FakePeer(f"http://127.0.0.1:{port}", server, thread)
