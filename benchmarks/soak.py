"""Soak a running TensorFold server (loopback) with a mix of good, hostile and cancelled requests
for a bounded time, while a fixed greedy probe checks its tokens and logprobs never change.

    python benchmarks/soak.py --url http://127.0.0.1:8080 --duration 300
    python benchmarks/soak.py --serve --duration 300          # starts `tensorfold serve` itself

Prints requests, errors (any answer other than the case expects, any 5xx), p50/p99 latency of the
good requests, the server's RSS and prompt-cache bytes at the start and end (the cache grows to
its --prompt-cache-gib budget), and the probe's runs and changes; --json
writes the same as one object. Assumes the default limits (--max-queue below 128, no
--trust-request-chat-template)."""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

import httpx

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def add(a, b):",
    "2 + 3 =",
    "The quick brown fox",
    "In a hole in the ground",
]
PROBE = {
    "prompt": "The capital of France is",
    "max_tokens": 16,
    "temperature": 0,
    "ignore_eos": True,
    "logprobs": 2,
    "return_token_ids": True,
}
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
JSON = {"content-type": "application/json"}


@dataclass
class Tally:
    requests: int = 0
    errors: int = 0
    by_case: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    probes: int = 0
    probe_changes: int = 0
    rss_mib: list[float] = field(default_factory=list)  # the server's RSS every 30 s
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, case: str, ok: bool, why: str, latency: float | None) -> None:
        with self.lock:
            self.requests += 1
            self.by_case[case] = self.by_case.get(case, 0) + 1
            if latency is not None:
                self.latencies.append(latency)
            if not ok:
                self.errors += 1
                key = f"{case}: {why}"[:160]
                self.failures[key] = self.failures.get(key, 0) + 1


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    prompt_cap: int  # bytes past the server's default prompt cap


def _status(r: httpx.Response, want: int, code: str | None = None) -> tuple[bool, str]:
    got = r.json().get("error", {}).get("code") if r.status_code >= 400 else None
    ok = r.status_code == want and (code is None or got == code)
    return ok, f"{r.status_code} {got}"


def _good(c: httpx.Client, t: Target, rng: random.Random) -> tuple[bool, str]:
    kind = rng.choice(["complete", "chat", "n2", "tokenize"])
    if kind == "tokenize":
        return _status(c.post("/tokenize", json={"prompt": rng.choice(PROMPTS)}), 200)
    if kind == "chat":
        body = {
            "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": rng.randint(4, 24),
            "chat_template_kwargs": {"enable_thinking": False},
        }
        return _status(c.post("/v1/chat/completions", json=body), 200)
    body = {
        "prompt": rng.choice(PROMPTS),
        "max_tokens": rng.randint(4, 32),
        "temperature": rng.choice([0.0, 0.8]),
        "seed": rng.randint(0, 99),
        "n": 2 if kind == "n2" else 1,
    }
    return _status(c.post("/v1/completions", json=body), 200)


def _stream(c: httpx.Client, t: Target, rng: random.Random) -> tuple[bool, str]:
    body = {
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "stream": True,
        "max_tokens": rng.randint(4, 24),
        "stream_options": {"include_usage": True},
    }
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    return r.status_code == 200 and lines[-1] == "data: [DONE]", f"{r.status_code}"


HOSTILE: list[tuple[str, Callable[[Target], bytes | dict], int, str]] = [
    # (name, body, status, code): each must be refused exactly so
    ("huge_body", lambda t: b'{"prompt": "' + b"a" * t.prompt_cap + b'"}', 413, "prompt_too_large"),
    ("bad_json", lambda t: b'{"prompt": "x",', 400, "invalid_json"),
    ("surrogate", lambda t: b'{"prompt": "\\ud800 x"}', 400, "invalid_encoding"),
    ("bad_utf8", lambda t: b'{"prompt": "caf\xe9"}', 400, "invalid_encoding"),
    ("digits", lambda t: b'{"prompt": "x", "seed": ' + b"7" * 5000 + b"}", 400, "invalid_encoding"),
    ("temp_inf", lambda t: b'{"prompt": "x", "temperature": Infinity}', 400, "invalid_value"),
    ("temp_huge", lambda t: {"prompt": "x", "temperature": 1e308}, 400, "invalid_value"),
    ("stream_yes", lambda t: {"prompt": "x", "stream": "yes"}, 400, "invalid_type"),
    ("stop_empty", lambda t: {"prompt": "x", "stop": [""]}, 400, "invalid_value"),
    ("stop_ids", lambda t: {"prompt": "x", "stop_token_ids": [-1]}, 400, "invalid_value"),
    ("echo_neg", lambda t: {"prompt": [-1], "echo": True}, 400, "invalid_value"),
    ("n_huge", lambda t: {"prompt": "x", "n": 128}, 400, "too_many_choices"),
]
HOSTILE_CHAT: list[tuple[str, Callable[[Target], dict], int, str]] = [
    ("wizard", lambda t: {"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value"),
    (
        "own_template",
        lambda t: {"messages": [{"role": "user", "content": "x"}], "chat_template": LOOP},
        400,
        "untrusted_chat_template",
    ),
    (
        "kwargs_template",
        lambda t: {
            "messages": [{"role": "user", "content": "x"}],
            "chat_template_kwargs": {"chat_template": LOOP},
        },
        400,
        "invalid_value",
    ),
]


def _hostile(c: httpx.Client, t: Target, rng: random.Random) -> tuple[bool, str]:
    table, path = rng.choice([(HOSTILE, "/v1/completions"), (HOSTILE_CHAT, "/v1/chat/completions")])
    name, make, status, code = rng.choice(table)
    body = make(t)
    r = (
        c.post(path, content=body, headers=JSON)
        if isinstance(body, bytes)
        else c.post(path, json=body)
    )
    ok, why = _status(r, status, code)
    return ok, f"{name} {why}"


def _unknown_fields(c: httpx.Client, t: Target, rng: random.Random) -> tuple[bool, str]:
    body = {"prompt": "x", "max_tokens": 2, **{f"f{i}\nINFO forged": i for i in range(1000)}}
    return _status(c.post("/v1/completions", json=body), 200)


def _cancel(c: httpx.Client, t: Target, rng: random.Random) -> tuple[bool, str]:
    body = {"prompt": rng.choice(PROMPTS), "max_tokens": 64, "ignore_eos": True}
    if rng.random() < 0.5:  # leave a stream after its first chunks
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= rng.randint(0, 3):
                    break
        return r.status_code == 200, f"{r.status_code}"
    try:  # leave mid-prompt or mid-decode
        r = c.post("/v1/completions", json=body, timeout=rng.uniform(0.02, 0.3))
        return r.status_code == 200, f"{r.status_code}"
    except httpx.TimeoutException:
        return True, "left"


def _half_sent(c: httpx.Client, t: Target, rng: random.Random) -> tuple[bool, str]:
    """A request that stops halfway; the server must not wait for it past its timeouts."""
    parts = urlsplit(t.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
        time.sleep(rng.uniform(0.1, 1.0))
    return True, "sent"


CASES = [
    ("good", _good, 40),
    ("stream", _stream, 15),
    ("hostile", _hostile, 25),
    ("cancel", _cancel, 12),
    ("unknown_fields", _unknown_fields, 3),
    ("half_sent", _half_sent, 5),
]
TIMED = ("good", "stream")  # the latency figures are these cases'


def client_loop(t: Target, tally: Tally, deadline: float, seed: int) -> None:
    rng = random.Random(seed)
    names, weights = [c[0] for c in CASES], [c[2] for c in CASES]
    with httpx.Client(base_url=t.url, timeout=60) as c:
        while time.monotonic() < deadline:
            name = rng.choices(names, weights)[0]
            run = next(fn for n, fn, _ in CASES if n == name)
            start = time.monotonic()
            try:
                ok, why = run(c, t, rng)
            except Exception as exc:  # noqa: BLE001 - any failure of a case is an error
                ok, why = False, type(exc).__name__
            latency = time.monotonic() - start if name in TIMED and ok else None
            tally.add(name, ok and not why.startswith("5"), why, latency)


def _probe(c: httpx.Client) -> tuple[list[int], list[float]]:
    choice = c.post("/v1/completions", json=PROBE).json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def probe_loop(t: Target, tally: Tally, deadline: float, every: float) -> None:
    next_sample = time.monotonic()
    with httpx.Client(base_url=t.url, timeout=60) as c:
        want = _probe(c)
        while time.monotonic() < deadline:
            got = _probe(c)
            with tally.lock:
                tally.probes += 1
                tally.probe_changes += got != want
            if time.monotonic() >= next_sample:
                tally.rss_mib.append(memory(t.url)[0])
                next_sample += 30.0
            time.sleep(every)  # a paced probe, not a load


def memory(url: str) -> tuple[float, float]:
    """The server's RSS and its prompt cache's bytes, in MiB."""
    m = httpx.get(f"{url}/memory", timeout=30).json()
    return round(m["process_rss_bytes"] / 2**20, 1), round(m["prompt_cache_bytes"] / 2**20, 1)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def soak(url: str, duration: float, clients: int, seed: int) -> dict:
    card = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    target = Target(url, card["id"], 2 * max(card["max_model_len"] * 32, 64 << 10))
    tally, (start_rss, start_cache) = Tally(), memory(url)
    deadline = time.monotonic() + duration
    threads = [
        threading.Thread(target=client_loop, args=(target, tally, deadline, seed + i))
        for i in range(clients)
    ]
    threads.append(threading.Thread(target=probe_loop, args=(target, tally, deadline, 1.0)))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    lat, (end_rss, end_cache) = tally.latencies, memory(url)
    return {
        "duration_s": duration,
        "clients": clients,
        "requests": tally.requests,
        "errors": tally.errors,
        "failures": tally.failures,
        "by_case": tally.by_case,
        "p50_s": round(pct(lat, 0.5), 4),
        "p99_s": round(pct(lat, 0.99), 4),
        "rss_start_mib": start_rss,
        "rss_end_mib": end_rss,
        "prompt_cache_start_mib": start_cache,
        "prompt_cache_end_mib": end_cache,
        "rss_every_30s_mib": tally.rss_mib,
        "probes": tally.probes,
        "probe_changes": tally.probe_changes,
    }


def spawn(extra: list[str]) -> tuple[subprocess.Popen, str]:
    """`tensorfold serve` on a free loopback port; returns it and its URL once healthy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "import sys; from tensorfold.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, "serve", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling the server's start
    proc.kill()
    raise SystemExit("the server did not start")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None)
    p.add_argument(
        "--serve",
        nargs=argparse.REMAINDER,
        default=None,
        help="start `tensorfold serve` with these arguments instead of --url",
    )
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    proc, url = spawn(args.serve) if args.serve is not None else (None, args.url)
    try:
        out = soak(url, args.duration, args.clients, args.seed)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    for key, value in out.items():
        print(f"{key:>14}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))
    return 0 if out["errors"] == 0 and out["probe_changes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
