"""A live TensorFold server on 127.0.0.1 for tests: uvicorn in a thread, on a free port."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx
import uvicorn

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.models.loader import load_model
from tensorfold.server.api import create_app
from tensorfold.server.connections import server_config
from tensorfold.tokenizer import Tokenizer

CONTEXT = 512
# requests the server tests share
MSG = [{"role": "user", "content": "hi"}]
CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
PROBE = {
    "prompt": "Once upon a time",
    "max_tokens": 4,
    "temperature": 0,
    "ignore_eos": True,
    "return_token_ids": True,
}


@dataclass
class LiveServer:
    url: str
    engine: Engine
    tokenizer: Tokenizer
    name: str
    server: uvicorn.Server
    thread: threading.Thread

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)

    def openai(self, api_key: str = "none"):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=60)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def make_engine(path: Path, engine_cls: type[Engine] = Engine, **config) -> Engine:
    opts = {"parallel": 4, "context": CONTEXT, "chunk": 16} | config
    tokenizer = Tokenizer(path)
    return engine_cls(load_model(path), tokenizer, EngineConfig(**opts))


def start_server(engine: Engine, name: str = "tiny", **app_kwargs) -> LiveServer:
    app = create_app(engine, engine.tokenizer, name, **app_kwargs)
    server = uvicorn.Server(
        server_config(app, "127.0.0.1", 0, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "the server to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    return LiveServer(f"http://127.0.0.1:{port}", engine, engine.tokenizer, name, server, thread)


def wait_for(check: Callable[[], object], what: str, timeout: float = 60.0):
    """Polls `check` until it returns something truthy; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.005)  # a poll interval, not a synchronisation
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def process_up(url: str, proc, timeout: float = 120.0) -> None:
    """Waits until a server started as its own process answers /health with 200; fails if the
    process exits first or the time runs out."""

    def up() -> bool:
        assert proc.poll() is None, "the server exited"
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, f"{url} to become healthy", timeout)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name + (f"{{{want}}}" if want else "")) + r" ([0-9.e+-]+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def solo(
    engine: Engine, prompt_ids: list[int], params: SamplingParams, choice: int = 0
) -> list[int]:
    """The reference: the request alone on an offline engine (no server, nothing beside it)."""
    assert not engine.has_work()
    req = engine.add_request(prompt_ids, params, choice=choice)
    engine.run_until_done()
    return list(req.output_ids)


def sse_events(response: httpx.Response):
    """The JSON payloads of an SSE response, up to [DONE] (which is yielded as None)."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield None if data == "[DONE]" else json.loads(data)


def assert_error(r: httpx.Response, status: int, param: str | None, code: str) -> dict:
    """An OpenAI error body with this status, parameter and code."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["code"] == code
    assert isinstance(err["message"], str) and err["message"]
    return err
