"""What a verify pass costs against a decode step: a random 9B-shape checkpoint, each lane decoding
steadily, timed per engine step (a) plain, as a CUDA graph and eagerly, and (b) drafting K tokens
that are all accepted (a scripted drafter proposing the plain reply), so every step is one verify
pass of K+1 rows per lane committing K+1 tokens, replayed from a CUDA graph and eagerly. Tokens
are checked equal to the plain run's; the graph run must have replayed its verify passes. Beside
the steps' wall time, the card's own time for a replayed pass (CUDA events around it): a verify
step above its pass is the host's work between passes, which a verify step cannot overlap.

    PYTHONPATH=src:tests python3 benchmarks/verify_cost.py --out /tmp/verify [--models 4bit,bf16]
        [--lanes 1,4,16] [--draft-tokens 7] [--untried]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch
from clock import ReplayEvents, restored  # this folder's
from drafting_util import Script  # tests/: the scripted drafter of the drafting tests

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.models.loader import load_model
from tensorfold.runner.cuda_graph import bucket
from tensorfold.tools.make_random import FORMATS, make_random

PROMPT, TOKENS, STEPS = 64, 200, 12


def prompts(lanes: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 200, (PROMPT,), generator=g).tolist() for _ in range(lanes)]


def engine(model, lanes: int, graphs: bool, k: int = 0, replies=None) -> Engine:
    config = EngineConfig(
        parallel=lanes,
        context=PROMPT + TOKENS + 8,
        chunk=512,
        cuda_graphs=graphs,
        draft="ngram" if k else None,
        draft_tokens=max(k, 1),
    )
    eng = Engine(model, None, config)
    if k:
        eng.drafting.default = Script(replies)
    return eng


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(eng: Engine, lanes: int, tables: list | None = None):
    """(seconds per step, tokens per step, replies, the card's seconds per replayed pass or
    None) over STEPS steady steps; with `tables`, the kernels of 4 more steady steps appended
    to it (profile_decode's table)."""
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    reqs = [eng.add_request(p, params) for p in prompts(lanes)]
    while any(r.in_prompt or len(r.output_ids) < 24 for r in reqs):  # warm: compile, graphs
        eng.step()
    before = sum(len(r.output_ids) for r in reqs)
    # the card's own time of each pass replayed (the start event of an overlapped step's pass
    # waits for the pass before it, so each span is its own pass's)
    restore: list = []
    replays = (
        ReplayEvents(restore) if torch.cuda.is_available() and eng.config.cuda_graphs else None
    )
    sync()
    t = time.perf_counter()
    for _ in range(STEPS):
        eng.step()
    sync()
    seconds = (time.perf_counter() - t) / STEPS
    made = (sum(len(r.output_ids) for r in reqs) - before) / STEPS
    card = replays.seconds() / max(1, len(replays.events)) if replays is not None else None
    restored(restore)
    if tables is not None:
        from profile_decode import kernel_table  # this folder's: the CUDA profiler's sums

        tables.append(kernel_table(eng, steps=4) + "\n\n" + host_table(eng, steps=4))
    eng.run_until_done()
    return seconds, made, [r.output_ids for r in reqs], card


def host_table(eng: Engine, steps: int, top: int = 18) -> str:
    """The host's functions over `steps` engine steps by their own time (cProfile): where a
    step's time goes when it is not the device's."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        eng.step()
    sync()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return f"host, {steps} steps under cProfile:\n" + text.getvalue().split("\n", 4)[-1]


def card_cells(decode: float | None, verify: float | None) -> str:
    """The card's time of a decode pass and a verify pass (graphs), and their ratio."""
    if not decode or not verify:
        return "- | -"
    return f"{decode * 1e3:.2f} / {verify * 1e3:.2f} ms | {verify / decode:.2f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/verify")
    p.add_argument("--models", default="4bit,bf16")
    p.add_argument("--lanes", default="1,4,16")
    p.add_argument("--draft-tokens", type=int, default=7)
    p.add_argument("--shape", default="9b")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself")
    p.add_argument("--checkpoint", default=None, help="a checkpoint instead of a random one")
    p.add_argument(
        "--untried",
        action="store_true",
        help="the tile book times the shapes not yet offered too (tiles.untried: the Gluon ring "
        "on pieces past 128 rows, a verify pass of more than 16 lanes of 5 rows)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the table, the kernels of a decode step and a verify step (graphs), by name",
    )
    args = p.parse_args()
    k = args.draft_tokens
    print(
        f"| model | lanes | decode step (graph) | decode step (eager) | verify step ({k + 1} rows, "
        "graph) | verify step (eager) | verify / decode (graph) | verify / decode (eager) "
        "| tok/s plain (graph) | tok/s drafted (graph) | decode pass / verify pass (card) "
        "| verify / decode (card) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        quantize = FORMATS[name]
        path = args.checkpoint or make_random(
            Path(args.out) / name, args.shape, quantize, device=args.device
        )
        model = load_model(path, dtype=torch.bfloat16, device=args.device)
        book = next((lin.book for lin in model.linears() if lin.book is not None), None)
        if book is not None:
            book.untried = args.untried
        for lanes in (int(x) for x in args.lanes.split(",") if x):
            tables = [] if args.profile else None
            graph, _, want, card_decode = timed(engine(model, lanes, True), lanes, tables)
            eager, _, same, _ = timed(engine(model, lanes, False), lanes)
            replies = {tuple(pr): out for pr, out in zip(prompts(lanes), want)}
            drafted = engine(model, lanes, True, k, replies)
            verify, made, got, card_verify = timed(drafted, lanes, tables)
            verify_eager, _, got_eager, _ = timed(engine(model, lanes, False, k, replies), lanes)
            assert same == want and got == want and got_eager == want, "tokens differ from plain"
            runner = drafted.runner
            replayed = runner.replays.get((bucket(lanes, runner.buckets), k + 1), 0)
            assert replayed or args.device == "cpu", "no verify pass was replayed from a graph"
            print(
                f"| {name} | {lanes} | {graph * 1e3:.2f} ms | {eager * 1e3:.2f} ms | "
                f"{verify * 1e3:.2f} ms | {verify_eager * 1e3:.2f} ms | {verify / graph:.2f} | "
                f"{verify_eager / eager:.2f} | {lanes / graph:,.0f} | {made / verify:,.0f} | "
                f"{card_cells(card_decode, card_verify)} |",
                flush=True,
            )
            for what, table in zip(("decode", "verify"), tables or []):
                print(f"\n{name}, {lanes} lanes, a {what} step (graphs):\n{table}\n", flush=True)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
