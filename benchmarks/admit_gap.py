"""What a long prompt arriving costs the streams already running: `lanes` streams decode, then an
N-token prompt is admitted beside them; each stream's gap between tokens (one per pass) before
and while the prompt is read, and the prompt's time to first token against an idle engine's.
One row per (model, lanes, --mixed-chunk), on a random checkpoint (9B shape), every run's
tokens checked against the same stream's without the prompt beside it.

    PYTHONPATH=src:benchmarks python3 benchmarks/admit_gap.py --models 4bit,bf16 --lanes 1,16 \
        --prompt 32768 --mixed 0,128,256,512
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from h200 import VOCAB, Run, start_decoding

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams

CHUNK = 2048  # the GPU's prompt chunk (engine/flags.py)
STREAM = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)


def engine(model, lanes: int, context: int, mixed: int) -> Engine:
    return Engine(
        model,
        None,
        EngineConfig(parallel=lanes + 1, context=context, chunk=CHUNK, mixed_chunk=mixed or None),
    )


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def timed_steps(eng: Engine, until) -> list[float]:
    """Each pass's wall time (a pass ends when its tokens are on the host) until `until()`."""
    times = []
    while not until():
        t = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t)
    return times


def admit(eng: Engine, lanes: int, n: int, seed: int) -> dict:
    """Median pass before the prompt, worst pass while it is read, and its time to first token."""
    streams = start_decoding(eng, lanes, STREAM, seed=seed)
    steps = len(streams[0].output_ids)
    before = timed_steps(eng, lambda: len(streams[0].output_ids) >= steps + 32)
    t = time.perf_counter()
    req = eng.add_request(prompt(n, seed), SamplingParams(max_tokens=1, temperature=0.0))
    during = timed_steps(eng, lambda: bool(req.output_ids))
    ttft = time.perf_counter() - t
    tokens = [list(s.output_ids) for s in streams]
    for s in streams:
        eng.cancel(s.request_id)
    eng.run_until_done()
    return {
        "before": before,
        "during": during,
        "ttft": ttft,
        "tokens": tokens,
        "passes": len(during),
    }


def alone(model, lanes: int, n: int, steps: int, seed: int) -> list[list[int]]:
    """The streams' first `steps` tokens with no prompt beside them."""
    eng = engine(model, lanes, n + STREAM.max_tokens + 64, 0)
    streams = start_decoding(eng, lanes, STREAM, seed=seed)
    while len(streams[0].output_ids) < steps:
        eng.step()
    return [list(s.output_ids[:steps]) for s in streams]


def idle_ttft(model, n: int, seed: int) -> float:
    eng = engine(model, 1, n + 8, 0)
    eng.add_request(prompt(n, seed + 1), SamplingParams(max_tokens=1))  # compiles every shape
    eng.run_until_done()
    torch.cuda.synchronize()
    t = time.perf_counter()
    eng.add_request(prompt(n, seed), SamplingParams(max_tokens=1, temperature=0.0))
    eng.run_until_done()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/admit")
    p.add_argument("--shape", default="9b")
    p.add_argument("--models", default="4bit")
    p.add_argument("--lanes", default="1,16")
    p.add_argument("--prompt", type=int, default=32768)
    p.add_argument("--mixed", default="0,128,256,512", help="--mixed-chunk values (0: no cap)")
    args = p.parse_args()
    run = Run(in_memory=True)
    rows = []
    for name in args.models.split(","):
        model = run.load(run.checkpoint(Path(args.out) / name, args.shape, name))
        idle = idle_ttft(model, args.prompt, 1)
        for lanes in (int(x) for x in args.lanes.split(",")):
            for mixed in (int(x) for x in args.mixed.split(",")):
                eng = engine(model, lanes, args.prompt + STREAM.max_tokens + 64, mixed)
                admit(eng, lanes, 4096, 2)  # compiles and records the mixed passes' shapes
                r = admit(eng, lanes, args.prompt, 3)
                del eng
                steps = min(len(t) for t in r["tokens"])
                same = alone(model, lanes, args.prompt, steps, 3) == [
                    t[:steps] for t in r["tokens"]
                ]
                median = statistics.median(r["before"])
                worst = max(r["during"])
                rows.append(
                    f"| {name} | {lanes} | {mixed or 'none'} | {median * 1e3:.2f} | "
                    f"{worst * 1e3:.2f} | {worst / median:.1f} | {r['passes']} | "
                    f"{r['ttft']:.2f} | {idle:.2f} | {r['ttft'] / idle:.2f} | {same} |"
                )
                print(rows[-1], flush=True)
        del model
        torch.cuda.empty_cache()
    print(
        f"\n{args.shape}, a {args.prompt:,}-token prompt admitted beside decoding streams "
        f"(chunk {CHUNK}):\n\n| model | streams | mixed chunk | median gap ms | worst gap ms | "
        "worst / median | passes to first token | TTFT s | idle TTFT s | TTFT / idle | "
        "streams' tokens = alone |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "---: | ---: | --- |"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
