"""Warm-up before serving: every launch shape a server will need is chosen and compiled before its
first user waits for it.

On the GPU a product's launch shape is timed once per (product, rows class) by the tile book, and
Triton compiles each kernel variant on first use; a decode pass of each lane-count bucket is
recorded as a CUDA graph on first use. Done inside a user's request, that took an 8k prompt on the 9B from 0.46 s
to 1.61 s. The warm-up runs throwaway requests that reach every rows class (decode steps of 1 to
`parallel` lanes, half of them sampled; prompt chunks of 16, 32, 64, 128, 256, 512 and `chunk` rows;
with `--mixed-chunk`, a prompt read beside lanes falling through every bucket; with lone graphs,
a prompt alone in each lone piece's graph) with the prompt cache off, then keeps the tile book's
choices in a small file keyed by the card and the versions, so the next start times nothing. Launch shapes never change a bit (docs/exactness.md), so neither the warm-up nor a
stale file can change a token: they only change how soon the first one comes.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .engine import Engine
from .request import SamplingParams

TILE_FILE_VERSION = 8  # bump when the tile book's keys or candidates change meaning


@dataclass(frozen=True)
class WarmupReport:
    steps: int  # warm-up requests batches run
    planned: int
    seconds: float
    cached_shapes: int  # launch shapes read from the tile file
    chosen_shapes: int  # launch shapes known after the warm-up
    tile_file: str | None
    skipped: str | None = None  # why nothing ran (CPU, turned off)

    def summary(self) -> str:
        if self.skipped:
            return f"warm-up skipped: {self.skipped}"
        return (
            f"warm-up: {self.steps}/{self.planned} steps in {self.seconds:.1f} s, "
            f"{self.chosen_shapes} launch shapes ({self.cached_shapes} from {self.tile_file})"
        )


def warmup_steps(parallel: int, chunk: int, context: int) -> list[tuple[int, int]]:
    """(prompt length, lanes) per step: one lane through each prompt rows class, then `parallel`
    lanes that finish one after another, so a decode pass of every lane count runs."""
    longest = max(1, context - parallel - 1)
    prompts = sorted({min(n, chunk, longest) for n in (16, 32, 64, 128, 256, 512, chunk)})
    return [(n, 1) for n in prompts] + [(1, parallel)]


def mixed_ends(lanes: int, buckets: tuple[int, ...]) -> list[int]:
    """max_tokens of each of `lanes` lanes decoding beside a prompt so that, pass after pass,
    the lanes left fall from one lane-count bucket to the next below it (each bucket's mixed
    graph then runs once): a lane's first token comes from its prompt pass, then one a pass."""
    counts, c = [], lanes
    while c >= 1:
        counts.append(c)
        c = max((b for b in buckets if b < c), default=0)
    return [1 + sum(1 for n in counts if n > i) for i in range(lanes)]


def wants_mixed(engine: Engine) -> bool:
    """Mixed graphs to record: prompt pieces beside decoding lanes replay from graphs."""
    return engine.runner.piece_rows > 0 and engine.config.parallel > 1


def _run_mixed(engine: Engine, vocab: int) -> None:
    """Lanes decode while a prompt is read beside them a mixed piece a pass (mixed_ends)."""
    c, runner = engine.config, engine.runner
    ends = mixed_ends(c.parallel - 1, runner.buckets)
    n = min(c.chunk + runner.piece_rows * (max(ends) + 1), c.context - 1)
    for lane, end in enumerate(ends):
        params = SamplingParams(max_tokens=end, temperature=0.0, ignore_eos=True)
        engine.add_request([(11 + lane) % vocab], params, f"warmup-mixed-{lane}")
    ids = [(5 + 17 * i) % vocab for i in range(n)]
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.add_request(ids, params, "warmup-mixed-prompt")
    engine.run_until_done()


def wants_lone(engine: Engine) -> bool:
    """Lone prompt graphs to record: a short prompt read alone replays one (runner.shape)."""
    return bool(engine.runner.lone_pieces)


def _run_lone(engine: Engine, vocab: int, pieces: tuple[int, ...]) -> None:
    """The lone graphs put back, a prompt alone that fills each one's room."""
    runner = engine.runner
    runner.lone_pieces = pieces
    for piece in pieces:
        n = min(piece, engine.config.context - 1)
        ids = [(3 + 13 * i) % vocab for i in range(n)]
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        engine.add_request(ids, params, f"warmup-lone-{piece}")
        engine.run_until_done()


def _tile_book(engine: Engine):
    return next((lin.book for lin in engine.model.linears() if lin.book is not None), None)


def tile_file(directory: Path, card: str) -> Path:
    """The tile file for this card and these versions (a different torch or Triton may favour
    other shapes, so each keeps its own)."""
    import torch
    import triton

    from ..ops.dispatch import ARITHMETIC_VERSION

    key = f"{card}|torch {torch.__version__}|triton {triton.__version__}|{ARITHMETIC_VERSION}"
    key += f"|{TILE_FILE_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return directory / f"tiles-{digest}.json"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tensorfold"


def warmup_params(lane: int) -> SamplingParams:
    """Lane `lane`'s rule in a warm-up step: odd lanes sampled (the API's default temperature,
    top-k, top-p and min-p), even ones greedy, so that as lanes finish one after another the
    sampling kernels meet every count of sampled rows (one row, a multiple of 16, others:
    Triton compiles each apart) before a user's first sampled token waits for them."""
    if lane % 2 == 0:
        return SamplingParams(max_tokens=lane + 2, temperature=0.0, ignore_eos=True)
    return SamplingParams(
        max_tokens=lane + 2, temperature=1.0, top_k=50, top_p=0.9, min_p=0.05, seed=lane,
        ignore_eos=True,
    )  # fmt: skip


def _run_step(engine: Engine, prompt: int, lanes: int, vocab: int) -> None:
    for lane in range(lanes):
        ids = [(7 + 31 * i + lane) % vocab for i in range(prompt)]
        engine.add_request(ids, warmup_params(lane), f"warmup-{prompt}-{lanes}-{lane}")
    engine.run_until_done()


def warm_up(
    engine: Engine,
    budget_s: float = 300.0,
    cache_dir: Path | None = None,
    progress: bool = True,
) -> WarmupReport:
    """Runs the warm-up on the calling thread (the engine's own, before it serves anything)."""
    model = engine.model
    if model.device.type != "cuda":
        return WarmupReport(0, 0, 0.0, 0, 0, None, "the CPU has no launch shapes to choose")
    import torch

    book = _tile_book(engine)
    path = None
    cached = 0
    if book is not None and cache_dir is not None:
        path = tile_file(cache_dir, torch.cuda.get_device_name(model.device))
        cached = book.load(path)
    c = engine.config
    steps = warmup_steps(c.parallel, c.chunk, c.context)
    start = time.monotonic()
    done = run_steps(engine, steps, budget_s, progress)
    planned = len(steps) + wants_mixed(engine) + wants_lone(engine)
    if book is not None and path is not None:
        book.save(path)
    chosen = len(book.chosen) if book is not None else 0
    return WarmupReport(
        done, planned, time.monotonic() - start, cached, chosen, str(path) if path else None
    )


def run_steps(
    engine: Engine, steps: list[tuple[int, int]], budget_s: float, progress: bool = False
) -> int:
    """Runs the steps (and the mixed and lone steps, when the engine has such graphs) with the
    prompt cache off (nothing of the warm-up is kept); stops starting new steps past `budget_s`
    (what is left is chosen on first use, as without a warm-up). The steps' prompts are read
    eagerly, the lone graphs set aside, so that every rows class of an eager pass is met."""
    start, done = time.monotonic(), 0
    budget, engine.prefix_cache.budget_bytes = engine.prefix_cache.budget_bytes, 0
    runner = engine.runner
    lone = runner.lone_pieces
    try:
        vocab = engine.model.config.vocab_size
        runs = [lambda p=p, n=n: _run_step(engine, p, n, vocab) for p, n in steps]
        if wants_mixed(engine):
            runs.append(lambda: _run_mixed(engine, vocab))
        runner.lone_pieces = ()
        if lone:
            runs.append(lambda: _run_lone(engine, vocab, lone))
        bar = _progress(len(runs), progress)
        for run in runs:
            if time.monotonic() - start > budget_s:
                break
            run()
            done += 1
            bar.update(1)
        bar.close()
    finally:
        engine.prefix_cache.budget_bytes = budget
        runner.lone_pieces = lone
    return done


def _progress(total: int, show: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="warm-up", unit="step", disable=not show)
