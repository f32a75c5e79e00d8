"""A small client for any OpenAI-compatible server: streams with the arrival time of every
token-bearing chunk, plain JSON posts, the model list and tokenization."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from ..util import token_sha


@dataclass
class Stream:
    """One streamed request as the client saw it."""

    status: int
    start: float  # perf_counter when the request was sent
    end: float = 0.0
    token_ids: list[int] = field(default_factory=list)  # empty when the server sends no ids
    text: str = ""
    times: list[float] = field(default_factory=list)  # arrival of each token-bearing chunk
    counts: list[int] = field(default_factory=list)  # tokens in that chunk
    usage: dict | None = None
    finish_reason: str | None = None
    error: str | None = None
    dropped: bool = False  # the client closed it on purpose

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def tokens(self) -> int:
        if self.usage and self.usage.get("completion_tokens") is not None and not self.dropped:
            return int(self.usage["completion_tokens"])
        return len(self.token_ids) if self.token_ids else sum(self.counts)

    @property
    def ttft(self) -> float | None:
        return self.times[0] - self.start if self.times else None

    @property
    def tok_s(self) -> float | None:
        """Tokens after the first chunk over the time from the first chunk to the last."""
        if len(self.times) < 2 or self.times[-1] <= self.times[0]:
            return None
        return (self.tokens - self.counts[0]) / (self.times[-1] - self.times[0])

    @property
    def hash_kind(self) -> str:
        return "ids" if self.token_ids else "text"

    @property
    def sha(self) -> str:
        """token_sha of the ids; without ids, sha256 of the text (the record says which)."""
        if self.token_ids:
            return token_sha(self.token_ids)
        return hashlib.sha256(self.text.encode()).hexdigest()

    def record(self) -> dict:
        return {
            "status": self.status,
            "error": self.error,
            "tokens": self.tokens,
            "ttft_s": self.ttft,
            "tok_s": self.tok_s,
            "sha": self.sha,
            "hash_of": self.hash_kind,
            "finish_reason": self.finish_reason,
            "dropped": self.dropped,
            "usage": self.usage,
            "token_ids": self.token_ids,
        }


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict
    seconds: float


def _chunk_tokens(choice: dict) -> tuple[list[int], str]:
    """Token ids (our `token_ids`, or llama.cpp's `tokens`) and text of one streamed choice."""
    ids = choice.get("token_ids") or choice.get("tokens") or []
    delta = choice.get("delta") or {}
    text = choice.get("text") or delta.get("content") or ""
    thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
    return [int(i) for i in ids if isinstance(i, int)], thought + text


@dataclass(frozen=True)
class Endpoint:
    """Where a server is and how to call it. Each call opens its own connection, so calls may
    run from several threads, and closing a stream early closes its connection."""

    url: str
    api_key: str | None = None
    timeout: float = 3600.0

    @staticmethod
    def of(url: str, api_key: str | None = None) -> Endpoint:
        base = url.rstrip("/")
        return Endpoint(base[:-3] if base.endswith("/v1") else base, api_key)

    def _client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout)

    def post(self, path: str, body: dict) -> Reply:
        with self._client() as http:
            start = time.perf_counter()
            r = http.post(path, json=body)
            seconds = time.perf_counter() - start
        try:
            data = r.json()
        except ValueError:
            data = {"raw": r.text}
        return Reply(r.status_code, data if isinstance(data, dict) else {"data": data}, seconds)

    def get(self, path: str) -> Reply:
        with self._client() as http:
            start = time.perf_counter()
            r = http.get(path)
            return Reply(
                r.status_code, r.json() if r.status_code == 200 else {}, time.perf_counter() - start
            )

    def text(self, path: str) -> str | None:
        """A GET's body as text, or None when the server does not answer 200 (or at all)."""
        try:
            with self._client() as http:
                r = http.get(path)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    def stream(
        self,
        path: str,
        body: dict,
        stop_after: int | None = None,
        on_token: Callable[[Stream], None] | None = None,
    ) -> Stream:
        """POSTs with stream: true and reads the SSE events to [DONE]. With stop_after = k it
        closes the connection once k tokens arrived (k = 0: as soon as the headers came)."""
        body = {**body, "stream": True}
        with self._client() as http:
            s = Stream(0, time.perf_counter())
            with http.stream("POST", path, json=body) as r:
                s.status = r.status_code
                if r.status_code != 200:
                    s.error = r.read().decode(errors="replace")[:500]
                elif stop_after == 0:
                    s.dropped = True
                else:
                    self._read_events(r, s, stop_after, on_token)
            s.end = time.perf_counter()
        return s

    def _read_events(
        self,
        r: httpx.Response,
        s: Stream,
        stop_after: int | None,
        on_token: Callable[[Stream], None] | None,
    ) -> None:
        for line in r.iter_lines():
            now = time.perf_counter()  # the arrival, before any parsing
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            added = _add_event(s, json.loads(data), now)
            if added and on_token is not None:
                on_token(s)
            if stop_after is not None and s.tokens >= stop_after:
                s.dropped = True
                return

    def first_model(self) -> str:
        data = self.get("/v1/models").body.get("data") or [{}]
        return data[0].get("id", "")

    def window(self) -> int | None:
        """max_model_len from /v1/models (vLLM and TensorFold send it), else None."""
        data = self.get("/v1/models").body.get("data") or [{}]
        value = data[0].get("max_model_len")
        return int(value) if value else None


def _add_event(s: Stream, event: dict, now: float) -> int:
    """Adds one SSE payload to the stream; returns how many tokens it carried."""
    if event.get("error"):
        s.error = str(event["error"])[:500]
        return 0
    added = 0
    if event.get("usage"):
        s.usage = event["usage"]
    for choice in event.get("choices") or []:
        ids, text = _chunk_tokens(choice)
        s.text += text
        s.token_ids += ids
        if choice.get("finish_reason"):
            s.finish_reason = choice["finish_reason"]
        count = len(ids) if ids else (1 if text else 0)
        if count:
            s.times.append(now)
            s.counts.append(count)
            added += count
    return added


class Tokens:
    """Text to ids and back: the server's /tokenize and /detokenize, or a local tokenizer."""

    def __init__(self, endpoint: Endpoint, model: str, tokenizer: str | Path | None = None):
        self.endpoint, self.model = endpoint, model
        self.local = None
        if tokenizer is not None:
            from ..tokenizer import Tokenizer

            self.local = Tokenizer(tokenizer)

    @property
    def source(self) -> str:
        return f"tokenizer {self.local.path}" if self.local is not None else "server /tokenize"

    def encode(self, text: str) -> list[int]:
        if self.local is not None:
            return self.local.encode(text)
        # vLLM and TensorFold read `prompt`, llama.cpp `content`; none adds special tokens here.
        r = self.endpoint.post(
            "/tokenize",
            {
                "model": self.model,
                "prompt": text,
                "content": text,
                "add_special_tokens": False,
                "add_special": False,
            },
        )
        if r.status != 200 or "tokens" not in r.body:
            raise RuntimeError(f"POST /tokenize answered {r.status}; pass --tokenizer PATH")
        return [int(t) for t in r.body["tokens"]]

    def decode(self, ids: list[int]) -> str:
        if self.local is not None:
            return self.local.decode(ids, skip_special_tokens=False)
        r = self.endpoint.post("/detokenize", {"model": self.model, "tokens": ids})
        text = r.body.get("prompt", r.body.get("content"))
        if r.status != 200 or text is None:
            raise RuntimeError(f"POST /detokenize answered {r.status}; pass --tokenizer PATH")
        return text
