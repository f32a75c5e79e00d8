"""Where a drafted step spends its time at one stream: the demo model (or any checkpoint) on the
CPU or a GPU (there each timed part syncs the device before and after, so a part's figure is
its own launches' time, not the next sync's), the same prompts plain and drafted (ngram, mtp, a scripted drafter proposing the plain
reply, whose every draft is right), each run timed by part: the target's passes by the rows they
feed, the MTP head's runs (after a pass, and per draft step), the drafting bookkeeping around
them, and the rest of the engine step. Tokens are checked equal to the plain run's.

    PYTHONPATH=src:tests python benchmarks/profile_drafting.py --checkpoint DEMO_WITH_HEAD \
        [--modes plain,ngram,mtp,script] [--draft-tokens 4] [--prompts 12] [--cprofile mtp]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import torch
from clock import Clock, restored
from drafting_util import Script  # tests/: the scripted drafter of the drafting tests

from tensorfold.demo.data import Sample, generate
from tensorfold.drafters import base as drafter_base
from tensorfold.drafters import mtp
from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.models.loader import load_model
from tensorfold.tokenizer import Tokenizer


def pass_label(plan) -> str:
    """A target pass by the rows it feeds: decode (1), verify (k+1 and more), catch-up."""
    rows = plan.rows
    drafted = any(len(lane.logits) > 1 for lane in plan)  # a verify lane wants every draft's
    return f"pass {'verify' if drafted else 'plain'} {rows} rows"


def instrument(eng: Engine, clock: Clock) -> list:
    restore: list = []
    clock.wrap(eng.runner, "execute", pass_label, restore)
    clock.wrap(eng, "step", lambda: "step (all)", restore)
    for part in ("propose", "before_pass", "after_pass", "settle", "observe"):
        clock.wrap(eng.drafting, part, lambda *a, p=part: f"drafting.{p}", restore)
    clock.wrap(eng.drafting.states, "copy_slots", lambda *a, **k: "state copy (save)", restore)
    if eng.drafting.spares is None and eng.drafting.config.method:
        eng.drafting.spares = eng.drafting.states.like(eng.drafting.lanes)
    if eng.drafting.spares is not None:
        clock.wrap(
            eng.drafting.spares, "copy_slot", lambda *a, **k: "state copy (put back)", restore
        )
    clock.wrap(
        mtp.MTPDrafter,
        "run",
        lambda self, req, start, tokens, h: f"mtp head {len(tokens)} rows",
        restore,
    )
    graphs = getattr(eng.drafting.default, "graphs", None)
    if graphs is not None:  # the head's steps from CUDA graphs
        clock.wrap(graphs, "catch_up", lambda req, s, ids, r: f"mtp graph {len(ids)} rows", restore)
        clock.wrap(graphs, "chain", lambda req, pos, k, **_: f"mtp graph chain {k}", restore)
    return restore


def samples(n: int, tok: Tokenizer, thinking: bool) -> list[list[int]]:
    """n demo prompts (not the MTP training seed's), thinking on or off."""
    return [tok.encode(Sample(s.task, thinking, s.system).prompt_text()) for s in generate(99, n)]


def run(model, tok, prompts, args, method, replies=None, clock=None):
    engine_method = "ngram" if method == "script" else method  # then the script replaces it
    cfg = EngineConfig(
        parallel=1, context=1024, draft=engine_method, draft_tokens=args.draft_tokens
    )
    eng = Engine(model, tok, cfg)
    if method == "script":
        eng.drafting.default = Script(replies)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    eng.add_request(prompts[0], params)  # warm
    eng.run_until_done()
    restore = instrument(eng, clock) if clock is not None else []
    reqs = [eng.add_request(p, params) for p in prompts]
    t = time.perf_counter()
    eng.run_until_done()
    seconds = time.perf_counter() - t
    restored(restore)
    s = eng.drafting.stats
    accept = s.acceptance_length
    return [r.output_ids for r in reqs], seconds, accept, eng


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", type=Path, default=Path("src/tensorfold/demo/bf16"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--modes", default="plain,ngram,mtp,script")
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--no-thinking", action="store_true")
    p.add_argument("--repeat", type=int, default=1, help="timed runs per mode (the best kept)")
    p.add_argument("--cprofile", default="", help="a mode to run under cProfile too")
    p.add_argument("--no-gate", action="store_true", help="draft at every chance (no back-off)")
    args = p.parse_args()
    if args.no_gate:
        drafter_base.Gate.open = lambda self: True
    torch.manual_seed(0)
    model = load_model(args.checkpoint, dtype=torch.bfloat16, device=args.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else lambda: None
    tok = Tokenizer(args.checkpoint)
    prompts = samples(args.prompts, tok, not args.no_thinking)
    want, _, _, _ = run(model, tok, prompts, args, None)
    replies = {tuple(pr): out for pr, out in zip(prompts, want)}
    made = sum(len(o) for o in want)
    modes = args.modes.split(",")
    best: dict[str, tuple[float, float, Clock]] = {}
    for _ in range(args.repeat):  # the modes in turn, so a busy machine slows each alike
        for mode in modes:
            clock = Clock(sync)
            method = None if mode == "plain" else mode
            got, seconds, accept, _ = run(model, tok, prompts, args, method, replies, clock)
            assert got == want, f"{mode}: drafted tokens differ from plain"
            if mode not in best or seconds < best[mode][0]:
                best[mode] = (seconds, accept, clock)
    print(f"{len(prompts)} prompts, {made} tokens, K={args.draft_tokens}, best of {args.repeat}")
    print("| mode | tok/s | × plain | acceptance length |")
    print("| --- | --- | --- | --- |")
    base = best["plain"][0] if "plain" in best else float("nan")
    for mode in modes:
        seconds, accept, _ = best[mode]
        print(f"| {mode} | {made / seconds:.1f} | {base / seconds:.2f} | {accept:.2f} |")
    clocks = {mode: b[2] for mode, b in best.items()}
    for mode, clock in clocks.items():
        total = clock.seconds.get("step (all)", 0.0)
        print(f"\n{mode}: {total * 1e3:.0f} ms in steps")
        for key in sorted(clock.seconds, key=lambda k: -clock.seconds[k]):
            s, n = clock.seconds[key], clock.calls[key]
            print(f"  {key:32s} {s * 1e3:9.1f} ms {n:6d} calls {s / n * 1e6:8.0f} us/call")
    if args.cprofile:
        method = None if args.cprofile == "plain" else args.cprofile
        prof = cProfile.Profile()
        prof.enable()
        run(model, tok, prompts, args, method, replies)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
