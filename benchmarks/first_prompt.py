"""Time to first token of the first prompt a fresh server gets, with and without the warm-up, and
the warm-up's own time with and without a tile file from an earlier start (run it twice).

    PYTHONPATH=src python3 benchmarks/first_prompt.py --out /tmp/bench --tiles /tmp/tiles [--no-warmup]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.engine.warmup import warm_up
from tensorfold.models.loader import load_model
from tensorfold.tools.make_random import make_random

VOCAB = 248320


def ttft(eng: Engine, n: int, seed: int) -> float:
    ids = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return ttft_of(eng, ids)


def ttft_of(eng: Engine, ids: list[int]) -> float:
    """Seconds from a request's arrival to its first token, the engine otherwise idle."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    req = eng.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0))
    eng.run_until_done()
    torch.cuda.synchronize()
    assert req.output_ids
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/bench")
    p.add_argument("--shape", default="9b")
    p.add_argument("--quantize", default="4")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--chunk", type=int, default=128, help="as `tensorfold serve` (its default)")
    p.add_argument("--tiles", default="/tmp/tiles", help="the tile file's folder")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    path = Path(args.out) / f"{args.shape}-{args.quantize}"
    if not (path / "config.json").exists():
        make_random(path, args.shape, args.quantize, device="cuda")
    model = load_model(path, dtype=torch.bfloat16, device="cuda")
    eng = Engine(model, None, EngineConfig(parallel=4, context=65536, chunk=args.chunk))
    report = warm_up(eng, 300, Path(args.tiles), progress=False) if args.warmup else None
    first, second = ttft(eng, args.size, 1), ttft(eng, args.size, 2)
    row = {
        "warmup": report.summary() if report else "off",
        "warmup_s": report.seconds if report else 0.0,
        "first_ttft_s": first,
        "second_ttft_s": second,
        "first_over_second": first / second,
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
