"""Where a decode pass spends the card's time: the kernels of a few eager decode steps (with
--graphed, of CUDA graph replays) on a random checkpoint (9B shape unless --shape), summed by name,
and the same steps' wall time eager and as CUDA graphs. With --prompt N, also the kernels of one
N-token prompt (in chunks of --chunk rows). Each table opens with the kernel time by kind:
products, experts, recurrence, attention, conv, the rest (where an 8k prompt's time goes, in any
--gdn-form).

    PYTHONPATH=src python3 benchmarks/profile_decode.py --out /tmp/prof [--models 4bit,bf16] [--lanes 1]
    PYTHONPATH=src python3 benchmarks/profile_decode.py --shape 35b-a3b --models 4bit --lanes 1,16
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from h200 import Run, start_decoding  # this folder's benchmark: the same engines and lanes
from torch.profiler import ProfilerActivity, profile

from tensorfold.engine.engine import Engine
from tensorfold.engine.flags import add_unpacked_flag
from tensorfold.engine.request import SamplingParams
from tensorfold.ops.gated_delta import FORMS


def decoding_engine(model, lanes: int, graphs: bool, unpacked: bool | None = None) -> Engine:
    eng = Run(graphs=graphs, unpacked=unpacked).engine(model, lanes, 512, 128)
    start_decoding(eng, lanes, SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
    return eng


def step_time(eng: Engine, steps: int = 20) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps


# where a pass's kernel time goes, by the first pattern a kernel's name matches
CATEGORIES = (
    ("products", ("_dense_kernel", "_affine", "_sum_segments", "_dequant", "gemm", "cutlass")),
    ("experts", ("_grouped", "_expert", "_tiles_kernel", "_sum_pairs", "_route", "_combine")),
    (
        "recurrence",
        ("_recurrence", "_grid_chunks", "_assemble", "chunk_", "cumsum", "recompute_w_u"),
    ),
    ("attention", ("_serial_kernel", "_split_kernel", "_fold_kernel")),
    ("conv", ("_conv",)),
)


def category(kernel: str) -> str:
    return next((c for c, names in CATEGORIES if any(n in kernel for n in names)), "the rest")


def kernel_table(eng: Engine, steps: int = 3, top: int = 25) -> str:
    """Kernel time by name over `steps` engine steps (steps=0: until the engine is done, as one)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.step()
        if not steps:
            eng.run_until_done()
        torch.cuda.synchronize()
    steps = steps or 1
    sums: dict[str, list[float]] = {}
    for e in prof.key_averages():
        if getattr(e.device_type, "name", "") == "CUDA":
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            s = sums.setdefault(e.key[:70], [0.0, 0])
            s[0] += us
            s[1] += e.count
    if not sums:
        return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=top)
    total = sum(v[0] for v in sums.values()) / steps
    count = sum(v[1] for v in sums.values()) / steps
    parts: dict[str, float] = {}
    for name, (us, _) in sums.items():
        parts[category(name)] = parts.get(category(name), 0.0) + us / steps
    lines = [
        f"kernel time per step {total / 1e3:.2f} ms over {count:.0f} kernels: "
        + ", ".join(
            f"{c} {us / 1e3:.2f} ms" for c, us in sorted(parts.items(), key=lambda x: -x[1])
        ),
        "| kernel | us/step | launches/step |",
        "| --- | --- | --- |",
    ]
    for name, (us, n) in sorted(sums.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {name} | {us / steps:.0f} | {n / steps:.0f} |")
    return "\n".join(lines)


def prompt_table(run: Run, model, n: int, chunk: int) -> str:
    eng = run.engine(model, 1, n + 8, chunk)
    warm = torch.randint(0, 1000, (min(n, 2 * chunk),)).tolist()  # compiles, times the tiles
    eng.add_request(warm, SamplingParams(max_tokens=1, temperature=0.0))
    eng.run_until_done()
    eng.add_request(
        torch.randint(0, 1000, (n,)).tolist(), SamplingParams(max_tokens=1, temperature=0.0)
    )
    torch.cuda.synchronize()
    t = time.perf_counter()
    table = kernel_table(eng, steps=0)
    return f"prompt of {n} tokens in chunks of {chunk}: {time.perf_counter() - t:.2f} s under the profiler\n{table}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/prof")
    p.add_argument("--models", default="4bit,bf16")
    p.add_argument("--lanes", default="1")
    p.add_argument(
        "--prompt", type=int, default=0, help="also profile one prompt of this many tokens"
    )
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--shape", default="9b")
    p.add_argument("--in-memory", action="store_true", help="no weight files (h200.py's)")
    p.add_argument("--gdn-form", choices=FORMS, default="recurrence")
    add_unpacked_flag(p)
    p.add_argument(
        "--graphed",
        action="store_true",
        help="the kernels of the CUDA graph steps, not the eager ones (whose batch building "
        "launches copies a replay does not)",
    )
    args = p.parse_args()
    report = []
    run = Run(in_memory=args.in_memory, gdn_form=args.gdn_form, unpacked=args.unpacked_weights)
    for name in args.models.split(","):
        path = run.checkpoint(Path(args.out) / f"{args.shape}-{name}", args.shape, name)
        model = run.load(path)
        for lanes in (int(x) for x in args.lanes.split(",") if x):
            eng = decoding_engine(model, lanes, graphs=False, unpacked=args.unpacked_weights)
            eager = step_time(eng)
            if not args.graphed:
                report.append(f"## {name}, {lanes} lanes\n{kernel_table(eng)}")
            del eng
            eng = decoding_engine(model, lanes, graphs=True, unpacked=args.unpacked_weights)
            graphed = step_time(eng)
            if args.graphed:
                report.append(f"## {name}, {lanes} lanes, graph steps\n{kernel_table(eng)}")
            report.append(
                f"step wall time: eager {eager * 1e3:.2f} ms, CUDA graph {graphed * 1e3:.2f} ms "
                f"({lanes / graphed:,.0f} tok/s)"
            )
            del eng
        if args.prompt:
            report.append(f"## {name}, {prompt_table(run, model, args.prompt, args.chunk)}")
        del model
        torch.cuda.empty_cache()
    print("\n\n".join(report))


if __name__ == "__main__":
    main()
