"""What choosing a pass's tokens costs on the GPU at a vocabulary's width: the sampled rows'
batched rule (`ops.dispatch.sample_rows`: the sort, the chunk kernel, the row kernel and the one
read back) against greedy's argmax of the same rows, wall time per call with the sync, for a few
row counts and sampling rules; each sampled row's token checked equal alone and among the rows.

    PYTHONPATH=src python3 benchmarks/sampling_cost.py [--vocab 248320] [--rows 1,16,64]
"""

from __future__ import annotations

import argparse
import time

import torch

from tensorfold.ops import dispatch
from tensorfold.ops.sampling import uniform

RULES = {  # (temperature, top_k, top_p, min_p)
    "t=1": (1.0, 0, 1.0, 0.0),
    "t=0.7 top_p=0.9": (0.7, 0, 0.9, 0.0),
    "t=1 top_k=50": (1.0, 50, 1.0, 0.0),
    "t=0.8 min_p=0.05": (0.8, 0, 1.0, 0.05),
}


def wall_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vocab", type=int, default=248_320)
    p.add_argument("--rows", default="1,16,64")
    args = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    print("| rows | rule | sampled ms | greedy ms |\n| --- | --- | --- | --- |")
    for m in (int(r) for r in args.rows.split(",")):
        logits = (torch.randn(m, args.vocab, generator=gen) * 4).to("cuda", torch.bfloat16)
        rows = [logits[i].float() for i in range(m)]
        greedy = wall_ms(lambda: logits.argmax(-1).tolist())
        for name, rule in RULES.items():
            us = [uniform(i, 1000 + i) for i in range(m)]
            run = lambda: dispatch.sample_rows(rows, [rule] * m, us).tolist()  # noqa: E731
            together = run()
            alone = [
                dispatch.sample_rows([rows[i]], [rule], [us[i]]).tolist()[0] for i in (0, m - 1)
            ]
            assert alone == [together[0], together[-1]], (name, m)
            print(f"| {m} | {name} | {wall_ms(run):.3f} | {greedy:.3f} |", flush=True)


if __name__ == "__main__":
    main()
