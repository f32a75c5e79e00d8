"""`bench decode` and `bench concurrent`: served decode speed from the stream's token timing,
and whether a request's tokens stay the same alone, beside others, and with "draft": false."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .client import Endpoint, Stream
from .plot import PlotRequest, concurrent_panel, decode_panel, plot_one
from .prompts import Prompt, RequestStyle
from .report import median, progress, short, table, write_json


@dataclass(frozen=True)
class BenchConfig:
    endpoint: Endpoint
    model: str
    prompts: tuple[Prompt, ...]
    tokens: int = 256
    reps: int = 3
    temperatures: tuple[float, ...] = (0.0,)
    seed: int = 0
    style: RequestStyle = RequestStyle()

    def seed_for(self, temperature: float, rep: int) -> int:
        """Greedy runs share one seed (one reference); sampled reps each get their own."""
        return self.seed if temperature == 0 else self.seed + rep

    def body(self, prompt: Prompt, temperature: float, seed: int) -> dict:
        return prompt.body(self.model, self.tokens, temperature, seed, self.style)


def _describe(prompt: Prompt, temperature: float, rep: int, s: Stream, **more) -> dict:
    return {"prompt": prompt.name, "temperature": temperature, "rep": rep, **more, **s.record()}


# -- decode ------------------------------------------------------------------------------------


DRAFT_SERIES = (
    "tensorfold_draft_acceptance_length_sum",
    "tensorfold_draft_acceptance_length_count",
)


def draft_totals(endpoint: Endpoint) -> tuple[float, float] | None:
    """(tokens committed by verify passes, verify passes) from a TensorFold server's /metrics;
    None from a server without them."""
    body = endpoint.text("/metrics")
    if body is None:
        return None
    found = {}
    for line in body.splitlines():
        name, _, value = line.partition(" ")
        if name in DRAFT_SERIES:
            found[name] = float(value)
    return tuple(found[n] for n in DRAFT_SERIES) if len(found) == 2 else None


def acceptance_length(before, after) -> float | None:
    """Mean tokens committed per verify pass between two readings (None: no verify pass)."""
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def run_decode(cfg: BenchConfig) -> list[dict]:
    records = []
    with progress(len(cfg.temperatures) * len(cfg.prompts) * cfg.reps, "bench decode") as bar:
        for temperature in cfg.temperatures:
            for prompt in cfg.prompts:
                for rep in range(cfg.reps):
                    body = cfg.body(prompt, temperature, cfg.seed_for(temperature, rep))
                    before = draft_totals(cfg.endpoint)
                    s = cfg.endpoint.stream(prompt.path, body)
                    accept = acceptance_length(before, draft_totals(cfg.endpoint))
                    records.append(_describe(prompt, temperature, rep, s, accept_len=accept))
                    bar.update()
    return records


def decode_table(records: list[dict]) -> str:
    rows = []
    for key in dict.fromkeys((r["prompt"], r["temperature"]) for r in records):
        group = [r for r in records if (r["prompt"], r["temperature"]) == key]
        rates = [r["tok_s"] for r in group]
        rows.append(
            [
                *key,
                ", ".join(f"{v:.2f}" if v else "-" for v in rates),
                median(rates),
                median([r["ttft_s"] for r in group]),
                group[0]["tokens"],
                median([r["accept_len"] for r in group if r.get("accept_len") is not None]),
                " ".join(sorted({short(r["sha"]) for r in group})),
            ]
        )
    head = ["prompt", "temperature", "tok/s by rep", "median tok/s", "median ttft s", "tokens"]
    return table([*head, "accept len", "sha"], rows)


def decode_command(cfg: BenchConfig, output: str | None, plot: PlotRequest | None = None) -> int:
    records = run_decode(cfg)
    print(decode_table(records))
    failed = [r for r in records if r["status"] != 200 or r["error"]]
    short_runs = [r for r in records if r["tokens"] < cfg.tokens]
    if short_runs:
        print(
            f"note: {len(short_runs)} requests stopped before {cfg.tokens} tokens "
            "(the server may not honour ignore_eos)"
        )
    write_json(
        output,
        {
            "tool": "bench decode",
            "url": cfg.endpoint.url,
            "model": cfg.model,
            "tokens": cfg.tokens,
            "records": records,
        },
    )
    if plot is not None:
        plot_one(decode_panel(records, plot), plot, f"bench decode: {cfg.model}")
    for r in failed:
        print(f"request failed: {r['prompt']} rep {r['rep']}: {r['status']} {r['error']}")
    return 1 if failed else 0


# -- concurrent --------------------------------------------------------------------------------


@dataclass
class References:
    """Per (prompt, temperature, seed): the hash alone, and alone with "draft": false."""

    alone: dict[tuple, Stream] = field(default_factory=dict)
    serial: dict[tuple, Stream] = field(default_factory=dict)


def run_together(endpoint: Endpoint, path: str, body: dict, level: int) -> list[Stream]:
    """`level` copies of one request, released together."""
    barrier = threading.Barrier(level)

    def one(_: int) -> Stream:
        barrier.wait()
        return endpoint.stream(path, body)

    with ThreadPoolExecutor(level) as pool:
        return list(pool.map(one, range(level)))


def aggregate(streams: list[Stream]) -> float | None:
    """Tokens after each stream's first, over the span from the first token to the last."""
    timed = [s for s in streams if len(s.times) >= 2]
    if not timed:
        return None
    span = max(s.times[-1] for s in timed) - min(s.times[0] for s in timed)
    return sum(s.tokens - s.counts[0] for s in timed) / span if span > 0 else None


def _references(cfg: BenchConfig, alone: bool, serial: bool) -> References:
    refs = References()
    for temperature in cfg.temperatures:
        for prompt in cfg.prompts:
            for rep in range(cfg.reps):
                seed = cfg.seed_for(temperature, rep)
                key, body = (prompt.name, temperature, seed), cfg.body(prompt, temperature, seed)
                if alone and key not in refs.alone:
                    refs.alone[key] = cfg.endpoint.stream(prompt.path, body)
                if serial and key not in refs.serial:
                    refs.serial[key] = cfg.endpoint.stream(prompt.path, {**body, "draft": False})
    return refs


def _cells(streams: list[Stream], key: tuple, refs: References) -> list[dict]:
    cells = []
    for lane, s in enumerate(streams):
        alone, serial = refs.alone.get(key), refs.serial.get(key)
        cell = {"lane": lane, "sha": s.sha, "ok": s.ok}
        if alone is not None:
            cell |= {
                "alone_sha": alone.sha,
                "alone_equal": s.ok and alone.ok and s.sha == alone.sha,
            }
        if serial is not None:
            cell |= {
                "serial_sha": serial.sha,
                "serial_equal": s.ok and serial.ok and s.sha == serial.sha,
            }
        cells.append(cell)
    return cells


def run_concurrent(
    cfg: BenchConfig, levels: tuple[int, ...], alone: bool, serial: bool
) -> tuple[list[dict], References]:
    refs = _references(cfg, alone, serial)
    runs = []
    total = len(cfg.temperatures) * len(cfg.prompts) * len(levels) * cfg.reps
    with progress(total, "bench concurrent") as bar:
        for temperature in cfg.temperatures:
            for prompt in cfg.prompts:
                for level in levels:
                    for rep in range(cfg.reps):
                        seed = cfg.seed_for(temperature, rep)
                        streams = run_together(
                            cfg.endpoint, prompt.path, cfg.body(prompt, temperature, seed), level
                        )
                        runs.append(
                            {
                                "prompt": prompt.name,
                                "temperature": temperature,
                                "level": level,
                                "rep": rep,
                                "seed": seed,
                                "aggregate_tok_s": aggregate(streams),
                                "cells": _cells(streams, (prompt.name, temperature, seed), refs),
                                "requests": [s.record() for s in streams],
                            }
                        )
                        bar.update()
    return runs, refs


def count_cells(runs: list[dict], kind: str) -> tuple[int, int]:
    """(cells, failed) for kind "alone" or "serial"."""
    flags = [c[f"{kind}_equal"] for run in runs for c in run["cells"] if f"{kind}_equal" in c]
    return len(flags), flags.count(False)


def concurrent_table(runs: list[dict]) -> str:
    rows = []
    for key in dict.fromkeys((r["prompt"], r["temperature"], r["level"]) for r in runs):
        group = [r for r in runs if (r["prompt"], r["temperature"], r["level"]) == key]
        rates = [r["aggregate_tok_s"] for r in group]
        cells = [c for r in group for c in r["cells"]]
        rows.append(
            [
                *key,
                ", ".join(f"{v:.2f}" if v else "-" for v in rates),
                median(rates),
                _equal(cells, "alone"),
                _equal(cells, "serial"),
                " ".join(sorted({short(c["sha"]) for c in cells})),
            ]
        )
    return table(
        [
            "prompt",
            "temperature",
            "level",
            "aggregate tok/s by rep",
            "median",
            "alone equal",
            "serial equal",
            "sha",
        ],
        rows,
    )


def _equal(cells: list[dict], kind: str) -> str:
    flags = [c[f"{kind}_equal"] for c in cells if f"{kind}_equal" in c]
    return f"{flags.count(True)}/{len(flags)}" if flags else "-"


def concurrent_command(
    cfg: BenchConfig,
    levels: tuple[int, ...],
    alone: bool,
    serial: bool,
    output: str | None,
    plot: PlotRequest | None = None,
) -> int:
    runs, refs = run_concurrent(cfg, levels, alone, serial)
    print(concurrent_table(runs))
    failed_requests = sum(not c["ok"] for r in runs for c in r["cells"])
    failed_requests += sum(not s.ok for s in [*refs.alone.values(), *refs.serial.values()])
    failures = failed_requests
    for kind, wanted in (("alone", alone), ("serial", serial)):
        if wanted:
            total, failed = count_cells(runs, kind)
            failures += failed
            print(f"{kind}: {total} cells, {total - failed} equal, {failed} failed")
    if failed_requests:
        print(f"{failed_requests} requests failed")
    write_json(
        output,
        {
            "tool": "bench concurrent",
            "url": cfg.endpoint.url,
            "model": cfg.model,
            "tokens": cfg.tokens,
            "levels": list(levels),
            "runs": runs,
            "alone": {str(k): v.record() for k, v in refs.alone.items()},
            "serial": {str(k): v.record() for k, v in refs.serial.items()},
        },
    )
    if plot is not None:
        plot_one(concurrent_panel(runs, plot), plot, f"bench concurrent: {cfg.model}")
    return 1 if failures else 0
