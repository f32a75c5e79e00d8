"""The attention kernel alone at depth of context, on the GPU: one decode attention layer of the 9B
(16 query heads over 4 KV heads, head dim 256) at 1k-128k keys for 1, 4 and 16 lanes, replayed as a
CUDA graph, and the last 4,096-row chunk of a prompt at 8k-128k keys; each against the bytes it
must read, under launch variants (pipelining depth, warps, rows and value columns a program
holds, programs per SM), every variant's output checked bitwise against the default's and decode
rows against prompt rows. `--old FILE` times a previous kernel module on the same cases. Prints a
table last.

    PYTHONPATH=src python3 benchmarks/attention_depth.py [--keys 1024,8192,32768,131072]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
from pathlib import Path

import torch
import triton

from tensorfold.batch import Segment
from tensorfold.ops.attention import AttentionTiles
from tensorfold.ops.triton import attention
from tensorfold.util import capturing

HQ, HKV, D = 16, 4, 256
SCALE = D**-0.5
KV_BYTES = HKV * D * 2 * 2  # K and V of one position, one layer
# (name, module constants) of each launch variant; the first is the module's default
DECODE_VARIANTS = [
    ("default", {}),
    ("fold 1 at a time", {"FOLD_CHUNK": 1}),
    ("fold chunk 4", {"FOLD_CHUNK": 4}),
    ("fold chunk 16", {"FOLD_CHUNK": 16}),
    ("fold cols 32", {"FOLD_COLS": 32}),
    ("fold cols 128", {"FOLD_COLS": 128}),
    ("fold 2 warps cols 128", {"FOLD_COLS": 128, "FOLD_WARPS": 2}),
    ("fold stages 1", {"FOLD_STAGES": 1}),
    ("waves 4", {"SPLIT_WAVES": 4}),
]


class _NoLaunch:
    """A kernel that launches nothing (to time the launches before it alone)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


SPLIT_ALONE = ("split launch alone", {"_fold_kernel": _NoLaunch()})
PROMPT_VARIANTS = [
    ("default", {}),
    ("256 cols", {"SERIAL_COLS": 256}),
    ("256 cols 8 warps", {"SERIAL_COLS": 256, "SERIAL_WARPS": 8}),
    ("32 rows", {"SERIAL_ROWS": 32}),
    ("stages 2", {"SERIAL_STAGES": 2}),
]


def cache(keys: int):
    rows = keys + 8192
    kc = torch.randn(rows, HKV, D, device="cuda").to(torch.bfloat16)
    vc = torch.randn(rows, HKV, D, device="cuda").to(torch.bfloat16)
    return kc, vc, torch.randperm(rows, device="cuda")[:keys].to(torch.int32)


def graph_time(fn) -> float:
    """Median seconds of one replay of fn's launches as a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with capturing(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median") / 1e3


class Variant:
    """Module constants set for the duration of a call."""

    def __init__(self, values: dict, mod=attention) -> None:
        self.values, self.mod = values, mod

    def __call__(self, fn):
        saved = {k: getattr(self.mod, k) for k in self.values}
        for k, v in self.values.items():
            setattr(self.mod, k, v)
        try:
            return fn()
        finally:
            for k, v in saved.items():
                setattr(self.mod, k, v)


def registers(mods) -> str:
    """Registers and spills of every compiled variant of the attention kernels."""
    out = []
    for (label, mod), name in itertools.product(
        mods, ("_serial_kernel", "_split_kernel", "_fold_kernel")
    ):
        try:
            for cache_ in getattr(mod, name).device_caches.values():
                for k in cache_[0].values():
                    m = k.metadata
                    out.append(
                        f"{label} {name} warps {m.num_warps} stages {m.num_stages}: {k.n_regs} regs, {k.n_spills} spills"
                    )
        except Exception as e:  # noqa: BLE001 - Triton's internals differ by version
            out.append(f"{name}: registers not read ({type(e).__name__})")
    return "\n".join(sorted(set(out)))


def time_case(label: str, run, base, variants, rows, failures, rate):
    for name, values in variants:
        try:
            out = Variant(values)(run)
            t = Variant(values)(lambda: graph_time(run))
        except Exception as e:  # noqa: BLE001 - a variant that cannot compile is reported
            rows.append({"what": label, "variant": name, "error": str(e)[:80]})
            continue
        if base is not None and not torch.equal(out, base):
            failures.append(f"{label} {name} differs from the default")
        rows.append({"what": label, "variant": name, "us": t * 1e6, **rate(t)})
        print(json.dumps(rows[-1]), flush=True)


def module(path: str, name: str):
    """A kernel module loaded from a file, or None."""
    if not path:
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keys", default="1024,8192,32768,131072")
    p.add_argument("--prompt-keys", default="8192,32768,65536,131072")
    p.add_argument("--variant-keys", default="8192,32768", help="prompt keys of the variants")
    p.add_argument("--old", default="", help="a previous kernel module file, timed as 'before'")
    p.add_argument(
        "--prev",
        default="",
        help="kernel module files of the same arithmetic (comma-separated): timed, bytes checked",
    )
    args = p.parse_args()
    keys = [int(k) for k in args.keys.split(",")]
    prompt_keys = [int(k) for k in args.prompt_keys.split(",")]
    variant_keys = {int(k) for k in args.variant_keys.split(",") if k}
    old = module(args.old, "old_attention")
    same = [(Path(f).stem, module(f, Path(f).stem)) for f in args.prev.split(",") if f]
    kc, vc, table = cache(max(keys + prompt_keys))
    rows, failures = [], []
    for k in keys:
        for lanes in (1, 4, 16) if k <= 32768 else (1,):
            segs = tuple(Segment(i, k - 1, i, 1, table[:k]) for i in range(lanes))
            tiles = AttentionTiles.build(segs, "cuda")
            q = (torch.randn(lanes, HQ, D, device="cuda") * 4).to(torch.bfloat16)
            run = lambda: attention.paged_attention(q, kc, vc, tiles, SCALE)  # noqa: E731
            base = run()
            gbps = lambda t: {"GB/s": lanes * k * KV_BYTES / t / 1e9}  # noqa: E731
            picked = DECODE_VARIANTS if lanes == 1 or k == 8192 else DECODE_VARIANTS[:1]
            time_case(f"decode {lanes}x{k}", run, base, picked, rows, failures, gbps)
            others = [(name, mod, base) for name, mod in same] + [("before", old, None)]
            for name, mod, check in others:
                if mod is not None:
                    then = lambda: mod.paged_attention(q, kc, vc, tiles, SCALE)  # noqa: E731
                    time_case(
                        f"decode {lanes}x{k}", then, check, [(name, {})], rows, failures, gbps
                    )
            # the first launch alone: what the fold of the stored super-blocks adds is the rest
            time_case(f"decode {lanes}x{k}", run, None, [SPLIT_ALONE], rows, failures, gbps)
            for name, mod in same:
                then = lambda: Variant(SPLIT_ALONE[1], mod)(  # noqa: E731
                    lambda: mod.paged_attention(q, kc, vc, tiles, SCALE)
                )
                time_case(
                    f"decode {lanes}x{k}", then, None, [(f"{name} split alone", {})], rows,
                    failures, gbps,
                )  # fmt: skip
    for k in prompt_keys:
        n = 4096
        q = (torch.randn(n, HQ, D, device="cuda") * 4).to(torch.bfloat16)
        tiles = AttentionTiles.build((Segment(0, k - n, 0, n, table[:k]),), "cuda")
        run = lambda: attention.paged_attention(q, kc, vc, tiles, SCALE)  # noqa: E731
        base = run()
        for i in (0, n // 2, n - 1):  # decode rows equal the prompt's rows
            one = AttentionTiles.build(
                (Segment(0, k - n + i, 0, 1, table[: k - n + i + 1]),), "cuda"
            )
            if not torch.equal(
                attention.paged_attention(q[i : i + 1], kc, vc, one, SCALE)[0], base[i]
            ):
                failures.append(f"decode row {k - n + i} differs from its prompt row")
        flops = 4 * HQ * D * n * (k - n / 2)  # causal: each row reads keys up to itself
        tflops = lambda t: {"TFLOP/s": flops / t / 1e12}  # noqa: E731
        picked = PROMPT_VARIANTS if k in variant_keys else PROMPT_VARIANTS[:1]
        time_case(f"prompt 4096 at {k}", run, base, picked, rows, failures, tflops)
        if old is not None:
            before = lambda: old.paged_attention(q, kc, vc, tiles, SCALE)  # noqa: E731
            time_case(f"prompt 4096 at {k}", before, None, [("before", {})], rows, failures, tflops)
    print(registers([("default", attention)] + same))
    print("\n| what | variant | time | rate |\n| --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['what']} | {r['variant']} | {r['error']} | |")
        else:
            rate = f"{r['GB/s']:,.0f} GB/s" if "GB/s" in r else f"{r['TFLOP/s']:.0f} TFLOP/s"
            print(f"| {r['what']} | {r['variant']} | {r['us']:,.1f} µs | {rate} |")
    print("bitwise:", "all equal" if not failures else "; ".join(failures))


if __name__ == "__main__":
    main()
