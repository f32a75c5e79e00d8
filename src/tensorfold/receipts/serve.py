"""`bench serve`: a serving benchmark against any OpenAI-compatible server, in the shape users
know from vLLM's: at each concurrency, requests of `input_len` prompt tokens that each generate
`output_len` tokens (ignore_eos), sent all at once or at a Poisson rate; request throughput,
output and total tok/s, and time to first token, time per output token, inter-token latency and
end-to-end latency at p50 / p90 / p99, with the failed requests counted and named.

Prompts are made here, never downloaded: `random` draws token ids (seeded, distinct per request,
so no two share a cached prefix) from the ids the server's tokenizer gives a public-domain
paragraph; `text` sends that paragraph from a different offset each, as text."""

from __future__ import annotations

import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .client import Endpoint, Stream, Tokens
from .prompts import PARAGRAPH
from .report import progress, table, write_json

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class ServeConfig:
    endpoint: Endpoint
    model: str
    concurrency: tuple[int, ...] = (1,)
    input_len: int = 1024
    output_len: int = 512
    requests: int = 0  # per level; 0: four per concurrent slot, at least 8
    request_rate: float = math.inf  # Poisson arrivals per second (inf: all at once)
    dataset: str = "random"  # "random" token ids or "text"
    seed: int = 0
    temperature: float = 0.0  # above 0: each prompt sampled with seed + its index

    def __post_init__(self) -> None:
        checks = [
            (
                all(c >= 1 for c in self.concurrency) and self.concurrency,
                "--concurrency",
                "each >= 1",
            ),
            (self.input_len >= 1, "--input-len", ">= 1"),
            (self.output_len >= 1, "--output-len", ">= 1"),
            (self.temperature >= 0, "--temperature", ">= 0"),
            (self.requests >= 0, "--num-prompts", ">= 0"),
            (self.request_rate > 0, "--request-rate", "> 0 (inf: all at once)"),
            (self.dataset in ("random", "text"), "--dataset", "random or text"),
        ]
        for ok, name, want in checks:
            if not ok:
                raise ValueError(f"{name} must be {want}")

    def count(self, level: int) -> int:
        return self.requests or max(8, 4 * level)


def make_prompts(cfg: ServeConfig, tokens: Tokens, n: int) -> list[list[int] | str]:
    """`n` prompts of cfg.input_len tokens (text prompts: about that many)."""
    pool = tokens.encode(PARAGRAPH * (cfg.input_len // 64 + 2))
    if len(pool) < 2:
        raise RuntimeError("the tokenizer gave the paragraph fewer than 2 tokens")
    rng = random.Random(cfg.seed)
    if cfg.dataset == "random":
        vocab = sorted(set(pool))
        return [[rng.choice(vocab) for _ in range(cfg.input_len)] for _ in range(n)]
    while len(pool) < cfg.input_len + n:
        pool += pool
    return [tokens.decode(pool[i : i + cfg.input_len]) for i in range(n)]


def body(cfg: ServeConfig, prompt: list[int] | str, index: int = 0) -> dict:
    """Prompt `index`'s request: greedy, or sampled with its own seed (the same at every level,
    so an exact server gives it the same tokens at every concurrency)."""
    out = {
        "model": cfg.model,
        "prompt": prompt,
        "max_tokens": cfg.output_len,
        "temperature": cfg.temperature,
        "ignore_eos": True,
        "return_token_ids": True,  # the tokens' hash compares levels; peers ignore it
        "stream_options": {"include_usage": True},
    }
    if cfg.temperature > 0:
        out["seed"] = cfg.seed + index
    return out


def request_record(s: Stream, prompt_tokens: int, sent: float) -> dict:
    """One request's figures: latencies in seconds from when it was sent (`sent`, a perf_counter
    time); `itl` are the gaps between its token-bearing chunks."""
    tokens = s.tokens
    tpot = None
    if len(s.times) >= 2 and tokens > s.counts[0]:
        tpot = (s.times[-1] - s.times[0]) / (tokens - s.counts[0])
    return {
        "ok": s.ok,
        "status": s.status,
        "error": s.error,
        "prompt_tokens": (s.usage or {}).get("prompt_tokens", prompt_tokens),
        "output_tokens": tokens,
        "sent": sent,
        "end": s.end,
        "ttft_s": s.ttft,
        "tpot_s": tpot,
        "itl_s": [b - a for a, b in zip(s.times, s.times[1:])],
        "e2e_s": s.end - s.start,
        "sha": s.sha if s.ok else None,
    }


def run_level(cfg: ServeConfig, level: int, prompts: list, bar=None) -> list[dict]:
    """Every prompt through at most `level` requests in flight; with a request rate, each sent
    after a seeded exponential gap (a Poisson process), else all queued at once."""
    rng = random.Random(cfg.seed * 1_000_003 + level)
    records: list[dict | None] = [None] * len(prompts)
    lock = threading.Lock()

    def one(i: int, prompt) -> None:
        sent = time.perf_counter()
        try:
            s = cfg.endpoint.stream("/v1/completions", body(cfg, prompt, i))
        except Exception as exc:  # a dropped connection is a failed request, not a crash
            s = Stream(0, sent, end=time.perf_counter(), error=f"{type(exc).__name__}: {exc}")
        n = len(prompt) if isinstance(prompt, list) else cfg.input_len
        with lock:
            records[i] = request_record(s, n, sent)
            if bar is not None:
                bar.update()

    with ThreadPoolExecutor(max_workers=level) as pool:
        for i, prompt in enumerate(prompts):
            if math.isfinite(cfg.request_rate) and i:
                time.sleep(rng.expovariate(cfg.request_rate))
            pool.submit(one, i, prompt)
    return [r for r in records if r is not None]


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile, linear between closest ranks (numpy's default)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(level: int, cfg: ServeConfig, records: list[dict]) -> dict:
    """The level's figures; throughputs over the wall time from the first send to the last end."""
    done = [r for r in records if r["ok"]]
    start = min((r["sent"] for r in records), default=0.0)
    end = max((r["end"] for r in records), default=0.0)
    wall = max(end - start, 1e-9)
    out_tokens = sum(r["output_tokens"] for r in done)
    in_tokens = sum(r["prompt_tokens"] for r in done)
    row = {
        "concurrency": level,
        "request_rate": cfg.request_rate,
        "requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "short": sum(r["output_tokens"] < cfg.output_len for r in done),
        "duration_s": wall,
        "request_throughput": len(done) / wall,
        "output_tok_s": out_tokens / wall,
        "total_tok_s": (in_tokens + out_tokens) / wall,
    }
    series = {
        "ttft": [r["ttft_s"] for r in done],
        "tpot": [r["tpot_s"] for r in done],
        "itl": [g for r in done for g in r["itl_s"]],
        "e2e": [r["e2e_s"] for r in done],
    }
    for name, values in series.items():
        got = [v for v in values if v is not None]
        row[f"{name}_mean_ms"] = 1000 * sum(got) / len(got) if got else None
        for q in PERCENTILES:
            p = percentile(got, q)
            row[f"{name}_p{q}_ms"] = 1000 * p if p is not None else None
    return row


def same_tokens(levels: dict[int, list[dict]]) -> bool | None:
    """Whether each prompt got the same tokens at every level that sent it (greedy or seeded:
    an exact server's promise); None with one level."""
    if len(levels) < 2:
        return None
    by_prompt: dict[int, set] = {}
    for records in levels.values():
        for i, r in enumerate(records):
            if r["sha"] is not None:
                by_prompt.setdefault(i, set()).add(r["sha"])
    return all(len(shas) == 1 for shas in by_prompt.values())


def summary_table(rows: list[dict]) -> str:
    head = ["conc", "rate", "req", "failed", "req/s", "out tok/s", "total tok/s"]
    for name in ("ttft", "tpot", "itl"):
        head += [f"{name} p{q} ms" for q in PERCENTILES]
    cells = []
    for r in rows:
        rate = "inf" if math.isinf(r["request_rate"]) else r["request_rate"]
        line = [r["concurrency"], rate, r["requests"], r["failed"], r["request_throughput"]]
        line += [r["output_tok_s"], r["total_tok_s"]]
        for name in ("ttft", "tpot", "itl"):
            line += [r[f"{name}_p{q}_ms"] for q in PERCENTILES]
        cells.append(line)
    return table(head, cells)


def serve_command(cfg: ServeConfig, tokens: Tokens, output: str | None, plot=None) -> int:
    rows, levels = [], {}
    made = make_prompts(cfg, tokens, max(cfg.count(c) for c in cfg.concurrency))
    for level in cfg.concurrency:
        prompts = made[: cfg.count(level)]  # prompt i is the same at every level
        with progress(len(prompts), f"bench serve {level}") as bar:
            records = run_level(cfg, level, prompts, bar)
        levels[level] = records
        rows.append(summarize(level, cfg, records))
    print(summary_table(rows))
    same = same_tokens(levels)
    if same is not None:
        print(f"same tokens at every concurrency: {'yes' if same else 'NO'}")
    write_json(
        output,
        {
            "tool": "bench serve",
            "url": cfg.endpoint.url,
            "model": cfg.model,
            "input_len": cfg.input_len,
            "output_len": cfg.output_len,
            "dataset": cfg.dataset,
            "temperature": cfg.temperature,
            "runs": rows,
            "same_tokens": same,
            "records": {str(k): v for k, v in levels.items()},
        },
    )
    if plot is not None:
        from .plot import draw, serve_panels

        draw(serve_panels(rows, plot), plot.path, f"bench serve: {cfg.model}")
        print(f"chart: {plot.path}")
    failed = [(lv, r) for lv, recs in levels.items() for r in recs if not r["ok"]]
    for lv, r in failed[:10]:
        print(f"request failed at concurrency {lv}: {r['status']} {r['error']}")
    short = sum(r["short"] for r in rows)
    if short:
        print(f"note: {short} requests stopped before {cfg.output_len} tokens (ignore_eos?)")
    return 1 if failed else 0
