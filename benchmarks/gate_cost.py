"""What drafting costs when it cannot win: a random 9B-shape checkpoint with a random MTP head of
the real checkpoint's shape (`mtp.*`, so nearly every draft is wrong), whole requests at 1 and
16 lanes, plain against drafted, under CUDA graphs. The gate must close within a few verify
passes and retry rarely, so the drafted run's speed stays near plain's (target: 0.97x or more).
Tokens are checked equal to plain; the table shows verify passes, drafts kept and the prices the
engine measured for a verify pass against a plain one.

    PYTHONPATH=src:tests python3 benchmarks/gate_cost.py --out /tmp/gate [--models 4bit,bf16]
        [--lanes 1,16] [--draft-tokens 4] [--tokens 256]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from drafting_util import add_mtp_head  # tests/: a random MTP head with published names

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.models.loader import load_model
from tensorfold.tools.make_random import FORMATS, make_random

PROMPT = 64
WARM = 2  # rounds before the timed one: a server past its first requests


def prompts(lanes: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 200, (PROMPT,), generator=g).tolist() for _ in range(lanes)]


def run(model, lanes: int, tokens: int, k: int, graphs: bool) -> tuple[list[float], list, Engine]:
    """Seconds for every lane's whole request, round by round: WARM + 1 rounds of the same
    requests in one engine (the first compiles and records graphs, a shape's graph records on
    its second run; each round's gates start from what the lanes before learnt). Returns the
    rounds' seconds, the last round's tokens and the engine (its stats: the last round's)."""
    config = EngineConfig(
        parallel=lanes,
        context=PROMPT + tokens + 16,
        chunk=2048,
        cuda_graphs=graphs,
        draft="mtp" if k else None,
        draft_tokens=max(k, 1),
    )
    eng = Engine(model, None, config)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    seconds = []
    for _ in range(WARM + 1):
        eng.drafting.stats = type(eng.drafting.stats)()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        reqs = [eng.add_request(p, params) for p in prompts(lanes)]
        eng.run_until_done()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t)
    return seconds, [r.output_ids for r in reqs], eng


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/gate")
    p.add_argument("--models", default="4bit")
    p.add_argument("--lanes", default="1,16")
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--shape", default="9b")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself")
    args = p.parse_args()
    k, graphs = args.draft_tokens, args.device == "cuda"
    print(
        f"| model | lanes | plain tok/s | drafted tok/s (mtp, K={k}) | drafted / plain "
        "| verify passes | drafts kept | measured verify / plain price |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        path = make_random(Path(args.out) / name, args.shape, FORMATS[name], device=args.device)
        add_mtp_head(path, device=args.device)
        model = load_model(path, dtype=torch.bfloat16, device=args.device)
        for lanes in (int(x) for x in args.lanes.split(",") if x):
            plains, want, _ = run(model, lanes, args.tokens, 0, graphs)
            drafts, got, eng = run(model, lanes, args.tokens, k, graphs)
            plain, drafted = plains[-1], drafts[-1]  # the first rounds compile for both
            assert got == want, "drafted tokens differ from plain"
            s, made = eng.drafting.stats, lanes * args.tokens
            price = eng.drafting.prices.ratio(lanes, k + 1)
            print(
                f"| {name} | {lanes} | {made / plain:,.1f} | {made / drafted:,.1f} | "
                f"{plain / drafted:.3f} | {s.verifies} | {s.accepted} of {s.proposed} | "
                f"{'-' if price is None else f'{price:.2f}'} |",
                flush=True,
            )
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
