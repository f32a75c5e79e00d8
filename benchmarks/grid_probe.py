"""Where the grid kernel fails on a card, one small launch per process (a fault poisons the
process): `inverse W` runs the chunk solve alone at W warps against torch's inverse, `blocks W`
its diagonal-block extraction and reassembly, `kernel HK HV D ROWS BV W DTYPE` the whole kernel
on one lane of ROWS prompt rows, then times it; a last word `np` swaps in block helpers without
the 4-D permute. Run it under CUDA_LAUNCH_BLOCKING=1 (benchmarks/grid.sh's probe phase runs the
set).

    PYTHONPATH=src python3 benchmarks/grid_probe.py inverse 8
    PYTHONPATH=src python3 benchmarks/grid_probe.py kernel 16 32 128 70 32 8 bfloat16
    PYTHONPATH=src python3 benchmarks/grid_probe.py registry 64 8   # gdn.grid at block_v 64
    PYTHONPATH=src python3 benchmarks/grid_probe.py compare   # recurrence beside grid, timed

A run with DISABLE_MMA_V3=1 (Triton's own switch, read when a kernel compiles) puts every product
on the mma.sync path instead of wgmma.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from tensorfold.batch import CHUNK, Segment
from tensorfold.cache.state_pool import StatePool
from tensorfold.ops import gated_delta as ref
from tensorfold.ops.dispatch import lane_index
from tensorfold.ops.triton import gated_delta_grid as grid
from tensorfold.util import capturing


@triton.jit
def _diagonal_blocks_np(a):
    """_diagonal_blocks without the 4-D permute: the diagonal blocks picked from [4, 16, 4, 16]."""
    b = tl.arange(0, 4)
    wide = tl.reshape(a, (4, 16, 4, 16))  # [row block, row, column block, column]
    same = (b[:, None] == b[None, :])[:, None, :, None]
    return tl.sum(tl.where(same, wide, 0.0), axis=2)


@triton.jit
def _block_diagonal_np(d):
    """_block_diagonal without the 4-D permute."""
    b = tl.arange(0, 4)
    same = (b[:, None] == b[None, :])[:, None, :, None]
    wide = tl.where(same, tl.broadcast_to(d[:, :, None, :], (4, 16, 4, 16)), 0.0)
    return tl.reshape(wide, (64, 64))


def no_permute() -> None:
    """Swap the permute-free block helpers into the grid kernel (before its first compile)."""
    grid._diagonal_blocks, grid._block_diagonal = _diagonal_blocks_np, _block_diagonal_np


@triton.jit
def _solve_only(a_ptr, o_ptr, WHAT: tl.constexpr):
    r = tl.arange(0, 64)
    a = tl.load(a_ptr + r[:, None] * 64 + r[None, :])
    if WHAT == 0:
        y = grid._inverse(a)
    else:
        y = grid._block_diagonal(grid._diagonal_blocks(a))
    tl.store(o_ptr + r[:, None] * 64 + r[None, :], y)


def solve(what: int, warps: int) -> str:
    a = torch.tril(torch.randn(64, 64, device="cuda") * 0.1, -1)
    o = torch.empty_like(a)
    _solve_only[(1,)](a, o, what, num_warps=warps)
    torch.cuda.synchronize()
    if what:
        rb = torch.arange(64, device="cuda") // 16
        want = torch.where(rb[:, None] == rb[None, :], a, 0.0)
        return f"blocks at {warps} warps: {'equal' if torch.equal(o, want) else 'DIFFER'}"
    err = float((o - torch.linalg.inv(torch.eye(64, device="cuda") + a)).abs().max())
    return f"inverse at {warps} warps: max error {err:.2e}"


def kernel(hk: int, hv: int, d: int, rows: int, bv: int, warps: int, dtype: str) -> str:
    s, dt = ref.GDNShape(hk, hv, d, d), getattr(torch, dtype)
    conv = 2 * s.key_dim + s.value_dim
    pool = StatePool(1, 3, 4, conv, hv, d, d, dt, torch.device("cuda"), CHUNK)
    x = torch.randn(rows, conv, device="cuda").to(dt)
    g = -torch.rand(rows, hv, device="cuda") * 0.3
    beta = torch.rand(rows, hv, device="cuda").to(dt)
    seg = (Segment(1, 0, 0, rows, torch.arange(rows, device="cuda")),)
    lanes = lane_index(seg, "cuda", 4)
    o = grid.grid_lanes(x, g, beta, pool.layer(0), s, lanes, block_v=bv, num_warps=warps)
    torch.cuda.synchronize()
    print(f"kernel {s} rows {rows} bv {bv} warps {warps}: ran, max |o| {float(o.abs().max()):.3g}")
    return f"timing bv {bv} warps {warps}: " + timing(s, pool, dt, bv, warps)


def timing(s, pool, dt, bv: int, warps: int) -> str:
    """µs of one lane's decode row (a graph replayed) and of a 4,096-row prompt (eager), at this
    shape and launch configuration."""
    conv, hv, out = 2 * s.key_dim + s.value_dim, s.num_v_heads, []
    for rows in (1, 4096):
        x = torch.randn(rows, conv, device="cuda").to(dt)
        g = -torch.rand(rows, hv, device="cuda") * 0.3
        beta = torch.rand(rows, hv, device="cuda").to(dt)
        lanes = lane_index((Segment(1, 0, 0, rows, torch.arange(rows, device="cuda")),), "cuda", 4)
        run = lambda: grid.grid_lanes(  # noqa: E731
            x, g, beta, pool.layer(0), s, lanes, block_v=bv, num_warps=warps
        )
        out.append(f"{rows} rows {_timed(run, graphed=rows == 1):.1f} µs")
    return ", ".join(out)


def _timed(run, graphed: bool) -> float:
    """µs a call of `run` (after one warm call), between CUDA events: replayed from a CUDA graph
    640 times, or called eagerly 10 times."""
    run()
    if graphed:
        graph = torch.cuda.CUDAGraph()
        with capturing(graph):
            run()
        run = graph.replay
    reps = 640 if graphed else 10
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def compare() -> str:
    """The per-token recurrence beside the grid kernel (its shipped configuration) on one 9B
    layer of this card: one lane's decode row from a CUDA graph, and a 4,096-row prompt."""
    from tensorfold.ops.triton.gated_delta import gated_delta_lanes

    out = []
    for rows in (1, 4096):
        mk = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)  # noqa: E731
        q, k, v = mk(rows, 16, 128), mk(rows, 16, 128), mk(rows, 32, 128)
        g = -torch.rand(rows, 32, device="cuda") * 0.5
        beta = torch.rand(rows, 32, device="cuda").to(torch.bfloat16)
        states = torch.zeros(3, 32, 128, 128, device="cuda")
        slots, bounds = (torch.tensor(t, device="cuda") for t in ([1], [0, rows]))
        run = lambda: gated_delta_lanes(q, k, v, g, beta, states, slots, bounds)  # noqa: E731
        out.append(f"{rows} rows {_timed(run, graphed=rows == 1):.1f} µs")
    s = ref.GDNShape(16, 32, 128, 128)
    conv = 2 * s.key_dim + s.value_dim
    pool = StatePool(1, 3, 4, conv, 32, 128, 128, torch.bfloat16, torch.device("cuda"), CHUNK)
    grid_times = timing(s, pool, torch.bfloat16, grid.BLOCK_V, grid.NUM_WARPS)
    return f"recurrence: {', '.join(out)} | grid: {grid_times}"


def registry(bv: int, warps: int) -> None:
    """The registry's gdn.grid entry with the kernel's defaults set to this configuration."""
    from tensorfold.checks.registry import run_all

    grid.BLOCK_V, grid.NUM_WARPS = bv, warps
    lines, ok = run_all(False, echo=False, only="gdn.grid")
    print(f"registry bv {bv} warps {warps}: " + " | ".join(lines))


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    if args and args[-1] == "np":
        no_permute()
        args = args[:-1]
    if what == "kernel":
        print(kernel(*map(int, args[:6]), args[6]))
    elif what == "compare":
        print(compare())
    elif what == "registry":
        registry(int(args[0]), int(args[1]))
    else:
        print(solve(0 if what == "inverse" else 1, int(args[0])))
