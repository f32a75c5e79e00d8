"""Where a mixed pass spends the card's time: `lanes` streams decode while a prompt is read beside
them a `--mixed-chunk` piece a pass, at a given depth into the prompt. Per (lanes, piece): the
wall time of a pass replayed from its mixed graph, and the kernels of a few eager passes summed
by name; then the same with the attention's split plan forced for the prompt tiles (the plans
give the same bits; only their speed differs), on a random checkpoint (9B shape).

    PYTHONPATH=src:benchmarks python3 benchmarks/profile_mixed.py --cases 1x127,1x128,16x112,16x128 \
        --depth 16384

(LANESxPIECE: 1 + 127 and 16 + 112 rows fill one 128-row product tile, 1 + 128 and 16 + 128 spill
into a second.)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from h200 import VOCAB, Run, start_decoding
from profile_decode import kernel_table

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.ops.triton import attention

STREAM = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)


def reading(model, lanes: int, piece: int, depth: int) -> tuple[Engine, object]:
    """An engine whose streams decode beside a prompt read up to `depth` rows."""
    n = depth + 64 * piece
    config = EngineConfig(parallel=lanes + 1, context=n + 4096, chunk=2048, mixed_chunk=piece)
    eng = Engine(model, None, config)
    start_decoding(eng, lanes, STREAM)
    ids = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(5)).tolist()
    req = eng.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0))
    while req.lane.computed < depth:
        eng.step()
    return eng, req


def pass_ms(eng: Engine, passes: int = 8) -> float:
    eng.step()  # records the graph when it is new
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(passes):
        eng.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / passes * 1e3


def measure(eng: Engine, label: str) -> str:
    graph = pass_ms(eng)
    replays = sum(v for k, v in eng.runner.replays.items() if len(k) == 3 and k[0])
    eng.runner.use_graphs = False
    eager = pass_ms(eng, 3)
    table = kernel_table(eng, steps=3, top=14)
    eng.runner.use_graphs = True
    return (
        f"### {label}: graph pass {graph:.2f} ms, eager pass {eager:.2f} ms "
        f"({replays} mixed replays)\n{table}\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/mixed")
    p.add_argument("--shape", default="9b")
    p.add_argument("--models", default="4bit")
    p.add_argument("--cases", default="1x128,16x128", help="LANESxPIECE, comma-separated")
    p.add_argument("--depth", type=int, default=16384)
    args = p.parse_args()
    run = Run(in_memory=True)
    plan = attention.choose_plan
    for name in args.models.split(","):
        model = run.load(run.checkpoint(Path(args.out) / name, args.shape, name))
        for case in args.cases.split(","):
            lanes, piece = (int(x) for x in case.split("x"))
            eng, _ = reading(model, lanes, piece, args.depth)
            label = f"{name}, {lanes} streams, piece {piece}, depth {args.depth}"
            print(measure(eng, label), flush=True)
            attention.choose_plan = lambda *a: "split"
            eng.runner.graphs.clear()  # recorded again with the split plan
            print(measure(eng, label + ", split plan"), flush=True)
            attention.choose_plan = plan
            del eng
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
