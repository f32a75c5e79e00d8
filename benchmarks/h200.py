"""One run on the GPU machine: the card's ceilings, random 9B-shape checkpoints (4-bit g64 and bf16),
decode at 1/4/16/64 lanes, prompts of 2k-64k tokens, time to first token and peak memory, each as a
ratio of the card's limit. Prints a table last.

    PYTHONPATH=src python3 benchmarks/h200.py --out /tmp/bench [--sizes 2048,8192,32768,65536]
    PYTHONPATH=src python3 benchmarks/h200.py --shape 122b-a10b --models 4bit --in-memory
    PYTHONPATH=src python3 benchmarks/h200.py --lanes "" --sizes "" --decode-context 0,8192,32768,131072

--in-memory draws the random tensors as the loader reads them (no weight file: the 122B-A10B at
4 bits is ~69 GB, more than the GPU machine's disk); the load and the peak memory are those of a
file's, plus one entry's draw in flight.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from inexact import make_inexact
from tqdm import tqdm

from tensorfold.engine.engine import Engine, EngineConfig, hold_unpacked
from tensorfold.engine.flags import add_overlap_flag, add_unpacked_flag
from tensorfold.engine.request import SamplingParams
from tensorfold.models.loader import load_model
from tensorfold.ops.gated_delta import FORMS
from tensorfold.receipts.plot import require_matplotlib
from tensorfold.tools.make_random import FORMATS, RandomPlan, make_random
from tensorfold.tools.random_checkpoint import RandomCheckpoint

VOCAB = 248320


def ceilings() -> dict:
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    copy = 2 * x.numel() * 10 / (time.perf_counter() - t)
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    flops = 2 * 8192**3 * 20 / (time.perf_counter() - t)
    return {"copy_bytes_per_s": copy, "bf16_flops": flops}


@dataclass(frozen=True)
class Run:
    """How this run builds its engines (from the command line)."""

    graphs: bool = True
    exact: bool = True
    in_memory: bool = False
    gdn_form: str = "recurrence"
    untried: bool = False  # the tile book times the shapes not yet offered (tiles.untried) too
    overlap: bool | None = None  # the engine's overlapped passes (None: its default)
    own_shared: bool = False  # MoE: the shared expert in launches of its own (not the grouped)
    unpacked: bool | None = None  # packed weights held dequantized too (None: the engine's call)
    plans: dict = field(default_factory=dict)  # folder -> RandomPlan of an in-memory checkpoint

    def engine(self, model, parallel: int, context: int, chunk: int) -> Engine:
        return Engine(
            model,
            None,
            EngineConfig(
                parallel=parallel,
                context=context,
                chunk=chunk,
                token_budget=max(chunk, parallel) + parallel,
                max_queue=4096,
                cuda_graphs=self.graphs,
                gdn_form=self.gdn_form,
                overlap=self.overlap,
                unpacked_weights=self.unpacked,
            ),
        )

    def checkpoint(self, path: Path, shape: str, name: str) -> Path:
        """The random checkpoint's folder: its files, or only its config.json (in memory)."""
        quantize = FORMATS[name]
        if self.in_memory:
            self.plans[path] = RandomPlan(shape, quantize, device="cuda")
            return self.plans[path].write_config(path)
        return make_random(path, shape, quantize, device="cuda")

    def tensors(self, path: Path) -> RandomCheckpoint | None:
        """The in-memory tensors of the folder, or None: its files."""
        return RandomCheckpoint(path, self.plans[path]) if path in self.plans else None

    def load(self, path: Path):
        ckpt = self.tensors(path)
        t = time.perf_counter()
        model = load_model(path, dtype=torch.bfloat16, device="cuda", checkpoint=ckpt)
        torch.cuda.synchronize()
        print(f"{path.name}: loaded in {time.perf_counter() - t:.0f} s", flush=True)
        if not self.exact:
            make_inexact(model)
        if self.untried:
            tile_book(model).untried = True
        if self.own_shared:
            model.separate_shared_experts()
        if self.unpacked:
            t = time.perf_counter()
            hold_unpacked(model)
            print(f"{path.name}: held unpacked in {time.perf_counter() - t:.0f} s", flush=True)
        return model


def start_decoding(eng: Engine, lanes: int, params: SamplingParams, n: int = 32, seed: int = 0):
    """`lanes` greedy requests of random n-token prompts, stepped until every lane decodes (and a
    few steps more, so each lane count's graph is captured before anything is timed)."""
    g = torch.Generator().manual_seed(seed or lanes)
    reqs = [
        eng.add_request(torch.randint(0, VOCAB, (n,), generator=g).tolist(), params)
        for _ in range(lanes)
    ]
    while any(r.in_prompt or not r.output_ids for r in reqs):
        eng.step()
    for _ in range(4):
        eng.step()
    torch.cuda.synchronize()
    return reqs


def decode(model, lanes: int, run: Run, tokens: int = 64) -> float:
    """Aggregate generated tokens per second while every lane is decoding: the timed steps stop
    before the first lane ends (lanes whose prompts took different passes end at different
    steps, and each smaller lane count would record its graph inside the timing)."""
    eng = run.engine(model, lanes, 512, 128)
    greedy = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    reqs = start_decoding(eng, lanes, greedy)
    steps = min(r.max_tokens - len(r.output_ids) for r in reqs) - 1
    start, before = time.perf_counter(), sum(len(r.output_ids) for r in reqs)
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    assert all(len(r.output_ids) < r.max_tokens for r in reqs)
    return (sum(len(r.output_ids) for r in reqs) - before) / (time.perf_counter() - start)


def decode_at(model, context: int, lanes: int, run: Run, tokens: int = 256) -> tuple[float, float]:
    """(aggregate tok/s, KV bytes a step reads) of `lanes` greedy lanes decoding after prompts of
    `context` tokens each (32 at context 0), timed over `tokens` steps from the step after every
    lane's first token (its graph is recorded before the timing starts)."""
    n = max(context, 32)
    # lanes that finish their prompt first decode while the others read theirs
    extra = lanes * n // 4096 + 16
    eng = run.engine(model, lanes, n + tokens + extra + 64, 4096)
    params = SamplingParams(max_tokens=tokens + extra, temperature=0.0, ignore_eos=True)
    reqs = start_decoding(eng, lanes, params, n, seed=context + lanes)
    start, before = time.perf_counter(), sum(len(r.output_ids) for r in reqs)
    for _ in range(tokens - 5):
        eng.step()
    torch.cuda.synchronize()
    assert all(len(r.output_ids) < r.max_tokens for r in reqs)
    rate = (sum(len(r.output_ids) for r in reqs) - before) / (time.perf_counter() - start)
    kv = eng.caches.kv
    return rate, lanes * (n + tokens // 2) * kv.page_bytes / kv.page_size


def prefill(model, n: int, run: Run, chunk: int = 4096) -> float:
    """Seconds from submission to the first token of an n-token prompt (one lane)."""
    eng = run.engine(model, 1, n + 8, chunk)
    ids = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    # the warm-up is a prompt as long as the measured one (other tokens), so every launch shape and
    # kernel the measured passes use is timed and compiled here: a warm-up of one chunk left the
    # first 8k prompt compiling inside its timing (1.20 s against 0.46 s warm)
    other = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n + 1)).tolist()
    warm = eng.add_request(other, SamplingParams(max_tokens=1, temperature=0.0))
    eng.run_until_done()
    torch.cuda.synchronize()
    t = time.perf_counter()
    req = eng.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0))
    eng.run_until_done()
    torch.cuda.synchronize()
    assert warm.output_ids and req.output_ids
    return time.perf_counter() - t


def resume(model, n: int) -> dict:
    """Time to first token of an n-token prompt computed fresh, then sent again and resumed from the
    prompt cache; the tokens must be equal, and the cache's bytes per cached token."""
    eng = Engine(
        model,
        None,
        EngineConfig(
            parallel=1, context=n + 8, chunk=4096, prompt_cache_bytes=8 << 30, cache_every=4096
        ),
    )
    ids = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(7)).tolist()
    times, reqs = [], []
    for _ in range(2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        reqs.append(
            eng.add_request(ids, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        )
        while not reqs[-1].output_ids:
            eng.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        eng.run_until_done()
    assert reqs[0].output_ids == reqs[1].output_ids, "resumed != fresh"
    cache = eng.prefix_cache
    return {
        "fresh_ttft_s": times[0],
        "resumed_ttft_s": times[1],
        "cached_tokens": reqs[1].cached_tokens,
        "cache_bytes": cache.nbytes,
        "entries": len(cache),
        "kv_bytes_per_token": cache.kv.page_bytes / 16,
    }


@dataclass(frozen=True)
class ExpertShare:
    nbytes: int  # every routed expert's weights, as held
    params: int  # their parameters
    chosen: float  # the share one token reads: top_k / num_experts (0 for a dense model)


def expert_share(model) -> ExpertShare:
    moe = model.config.moe
    stacks = [
        s
        for layer in model.layers
        if hasattr(layer.mlp, "experts")
        for s in (layer.mlp.experts.gate, layer.mlp.experts.up, layer.mlp.experts.down)
    ]
    if moe is None or not stacks:
        return ExpertShare(0, 0, 0.0)
    nbytes = sum(
        layer.mlp.experts.nbytes for layer in model.layers if hasattr(layer.mlp, "experts")
    )
    params = sum(s.num_experts * s.shape[0] * s.shape[1] for s in stacks)
    return ExpertShare(nbytes, params, moe.top_k / moe.num_experts)


def depth_rows(model, label: str, depths: list[tuple[int, int]], run: Run, limits: dict) -> list:
    """Decode at depth of context: one row per (context, lanes), its limit the card's copy rate
    over the weights and the KV rows one step reads."""
    rows = []
    for context, lanes in tqdm(depths, desc=f"{label} decode at depth", unit="run"):
        rate, kv_bytes = decode_at(model, context, lanes, run)
        bound = limits["copy_bytes_per_s"] / (model.weight_bytes + kv_bytes) * lanes
        what = f"decode {lanes} lanes at context {context}"
        rows.append({"model": label, "what": what, "tok_s": rate, "limit": bound})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench(
    path: Path,
    sizes: list[int],
    lanes: list[int],
    limits: dict,
    run: Run,
    depths: list[tuple[int, int]] = (),
) -> list[dict]:
    torch.cuda.reset_peak_memory_stats()
    model = run.load(path)
    label = path.name if run.exact else f"{path.name} (inexact)"
    weight_bytes = model.weight_bytes
    experts = expert_share(model)
    params = sum(lin.out_features * lin.in_features for lin in model.linears())
    params += experts.params * experts.chosen  # a token runs top_k of the E experts
    params_flops = 2 * params  # ~2 FLOP per product parameter per token
    rows = []
    for n in tqdm(lanes, desc=f"{label} decode", unit="lanes"):
        rate = decode(model, n, run)
        # weights read once per pass: the dense ones, and the experts n lanes choose at most
        read = weight_bytes - experts.nbytes + experts.nbytes * min(1.0, n * experts.chosen)
        bound = limits["copy_bytes_per_s"] / read * n
        rows.append({"model": label, "what": f"decode {n} lanes", "tok_s": rate, "limit": bound})
    rows += depth_rows(model, label, list(depths), run, limits)
    for n in tqdm(sizes, desc=f"{label} prompts", unit="prompt"):
        secs = prefill(model, n, run)
        rows.append(
            {
                "model": label,
                "what": f"prompt {n}",
                "tok_s": n / secs,
                "ttft_s": secs,
                "limit": limits["bf16_flops"] / params_flops,
            }
        )
    rows.append(
        {
            "model": label,
            "what": "peak GPU memory GiB",
            "value": torch.cuda.max_memory_allocated() / 2**30,
            "weights_GiB": weight_bytes / 2**30,
        }
    )
    print_tiles(label, model)
    del model
    torch.cuda.empty_cache()
    return rows


def tile_book(model):
    """The tile book every layer of a GPU model shares (None on the CPU)."""
    return next((lin.book for lin in model.linears() if lin.book is not None), None)


def print_tiles(label: str, model) -> None:
    """The launch shape the tile book chose for each (rows class, N, K, format)."""
    book = tile_book(model)
    for key, t in sorted(book.chosen.items() if book else (), key=str):
        print(f"tiles {label} {key}: {t}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/bench")
    p.add_argument("--sizes", default="2048,8192,32768,65536")
    p.add_argument("--lanes", default="1,4,16,64")
    p.add_argument("--models", default="4bit,bf16")
    p.add_argument(
        "--attention",
        default="",
        help="attention launch constants to try, e.g. SERIAL_SCRATCH=1,SPLIT_WAVES=8 (same bits)",
    )
    p.add_argument(
        "--decode-context",
        default="",
        help="decode at depth: contexts P or PxL (L lanes of P tokens each), e.g. 0,8192,8192x16",
    )
    p.add_argument(
        "--shape", default="9b", help="a released shape: 0.8b, 2b, 4b, 9b, 27b, 35b-a3b, 122b-a10b"
    )
    p.add_argument(
        "--inexact",
        action="store_true",
        help="time the non-exact variant (cuBLAS products, chunked prompt recurrence) to price exactness",
    )
    p.add_argument(
        "--gdn-form",
        choices=FORMS,
        default="recurrence",
        help="the gated delta rule's exact form",
    )
    p.add_argument(
        "--resume", type=int, default=0, help="also time a resumed n-token prompt (bf16)"
    )
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay decode passes as CUDA graphs",
    )
    add_overlap_flag(p)
    p.add_argument(
        "--unfused-sums",
        action="store_true",
        help="every product's segment sums in a launch of their own, none added inside the op "
        "that reads them (the same bits; prices the fusion)",
    )
    p.add_argument(
        "--own-shared",
        action="store_true",
        help="MoE: each layer's shared expert in launches of its own, not as one more expert of "
        "the grouped launches (the same bits; prices the joint form)",
    )
    p.add_argument(
        "--untried",
        action="store_true",
        help="the tile book also times the launch shapes not yet offered to it (their bits unchecked)",
    )
    p.add_argument(
        "--in-memory",
        action="store_true",
        help="no weight files: the random tensors drawn as the loader reads them (the 122B)",
    )
    add_unpacked_flag(p)
    p.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="chart: decode against lanes, prompts against length, the peers",
    )
    args = p.parse_args()
    if args.unfused_sums:
        from tensorfold.ops.triton import linear as tlinear

        keep_none = tlinear._total
        tlinear._total = lambda part, out, keep, dtype, y=None: keep_none(
            part, out, False, dtype, y
        )
    if args.plot:
        require_matplotlib()  # before the run, not after it
    for item in filter(None, args.attention.split(",")):
        from tensorfold.ops.triton import attention

        name, value = item.split("=")
        setattr(attention, name, int(value))  # a launch variant: the kernels' bits do not change
        print(f"attention {name} = {value}", flush=True)
    run = Run(
        graphs=args.cuda_graphs,
        exact=not args.inexact,
        in_memory=args.in_memory,
        gdn_form=args.gdn_form,
        untried=args.untried,
        overlap=args.overlap,
        own_shared=args.own_shared,
        unpacked=args.unpacked_weights,
    )
    out = Path(args.out)
    limits = ceilings()
    print(
        f"copy {limits['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {limits['bf16_flops'] / 1e12:.0f} TFLOP/s",
        flush=True,
    )
    rows = []
    sizes = [int(s) for s in args.sizes.split(",") if s]
    lanes = [int(s) for s in args.lanes.split(",") if s]
    depths = [
        tuple(int(x) for x in (d + "x1").split("x")[:2])
        for d in args.decode_context.split(",")
        if d
    ]
    for name in args.models.split(","):
        t = time.perf_counter()
        path = run.checkpoint(out / f"{args.shape}-{name}", args.shape, name)
        print(f"{name}: random checkpoint in {time.perf_counter() - t:.0f} s", flush=True)
        rows += bench(path, sizes, lanes, limits, run, depths)
        for r in rows[-(len(sizes) + len(lanes) + len(depths) + 1) :]:
            print(json.dumps(r), flush=True)
        if args.resume and name == "bf16":
            model = load_model(
                path, dtype=torch.bfloat16, device="cuda", checkpoint=run.tensors(path)
            )
            print("resume", json.dumps(resume(model, args.resume)), flush=True)
            del model
    print("\n| model | figure | measured | limit | ratio |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        if "tok_s" in r:
            extra = f" (TTFT {r['ttft_s']:.2f} s)" if "ttft_s" in r else ""
            print(
                f"| {r['model']} | {r['what']} | {r['tok_s']:,.0f} tok/s{extra} | {r['limit']:,.0f} | "
                f"{r['tok_s'] / r['limit']:.2f} |"
            )
        else:
            print(
                f"| {r['model']} | {r['what']} | {r['value']:.1f} | weights {r['weights_GiB']:.1f} GiB | |"
            )
    if args.plot:
        from h200_charts import load, plot  # beside this script; the peers' recorded figures

        title = f"h200.py --shape {args.shape}, {time.strftime('%Y-%m-%d')}"
        plot(rows, load().peers, args.plot, title)
        print(f"chart: {args.plot}")


if __name__ == "__main__":
    main()
