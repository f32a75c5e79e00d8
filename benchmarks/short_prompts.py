"""Time to first token of short prompts read alone, from the lone pieces' CUDA graphs and eagerly
(the same engine, its `lone_pieces` set aside), for the bundled demo and a random 9B in memory:
the best of `--rounds` requests of each length, after one of each to compile and record.

    PYTHONPATH=src:benchmarks python3 benchmarks/short_prompts.py [--models demo,9b-4bit]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from first_prompt import ttft_of
from h200 import Run

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.models.loader import load_model
from tensorfold.util import default_checkpoint


def engine(name: str, out: Path) -> Engine:
    if name == "demo":
        model = load_model(default_checkpoint(None), dtype=torch.bfloat16, device="cuda")
    else:
        run = Run(in_memory=True)
        model = run.load(run.checkpoint(out / name, "9b", name.split("-")[1]))
    return Engine(model, None, EngineConfig(parallel=4, context=2048, chunk=2048, lone_graphs=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="demo,9b-4bit")
    p.add_argument("--lengths", default="8,20,40,100,128,300")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("/tmp/bench"))
    args = p.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    rows = []
    for name in args.models.split(","):
        eng = engine(name, args.out)
        vocab = eng.model.config.vocab_size
        lone = eng.runner.lone_pieces
        for n in lengths:
            ids = [(7 + 31 * i) % vocab for i in range(n)]
            times = {}
            for label, pieces in (("eager", ()), ("graph", lone)):
                eng.runner.lone_pieces = pieces
                times[label] = min(ttft_of(eng, ids) for _ in range(args.rounds + 1))
            rows.append((name, n, times["eager"], times["graph"]))
            print(rows[-1], flush=True)
        eng.runner.lone_pieces = lone
        del eng
        torch.cuda.empty_cache()
    print("\n| model | prompt tokens | TTFT eager ms | TTFT lone graph ms | eager / graph |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, n, eager, graph in rows:
        print(f"| {name} | {n} | {eager * 1e3:.2f} | {graph * 1e3:.2f} | {eager / graph:.2f} |")


if __name__ == "__main__":
    main()
