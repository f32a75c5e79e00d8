"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): the grid form's one-launch kernel
(ops/triton/gated_delta_grid.py; the rows form's through `check_form`, triton_interpret_rows.py)
on a tiny layer, fp16, on the CPU. Its rows against the chunk form's fp32 reference, and bitwise:
any cuts of a prompt (decode rows included) = one call, a lane beside others = alone, a graph
pass's layout = an eager pass's; each planted fault caught."""

import interpreter_bounds
import interpreter_dot
import torch

from tensorfold.batch import CHUNK, LaneIndex, Segment
from tensorfold.cache.state_pool import StatePool
from tensorfold.ops import gated_delta as ref
from tensorfold.ops.triton import gated_delta_grid as grid
from tensorfold.ops.triton.gated_delta_chunk import LanePlan

SHAPE = ref.GDNShape(2, 4, 16, 16)
CONV = 2 * SHAPE.key_dim + SHAPE.value_dim


def pool(dtype=torch.float16):
    return StatePool(1, 4, 4, CONV, 4, 16, 16, dtype, torch.device("cpu"), CHUNK)


def eager(lanes):
    """A pass's LaneIndex from (slot, start, rows) per lane, as an eager CUDA pass builds it."""
    bounds = [0]
    for _, _, n in lanes:
        bounds.append(bounds[-1] + n)
    t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return LaneIndex(
        t([s for s, _, _ in lanes]), t(bounds), t([]), t([]), None,
        t([start % CHUNK for _, start, _ in lanes]), LanePlan.build(lanes, "cpu"),
    )  # fmt: skip


def graph(slots, tails, rows):
    """A graph pass's LaneIndex: `rows` rows a lane, tails read from the device, no plan."""
    t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return LaneIndex(
        t(slots), t([i * rows for i in range(len(slots) + 1)]), t([]), t([]), None, t(tails)
    )


def run(kernel, cuts, x, g, beta, slot=1, fault=0, into=None):
    """One lane's rows fed to `kernel` in passes of `cuts` rows; (outputs, its slot's bytes)."""
    into = into or pool()
    states, outs, start = into.layer(0), [], 0
    for c in cuts:
        r = slice(start, start + c)
        outs.append(kernel(x[r], g[r], beta[r], states, SHAPE, eager([(slot, start, c)]), fault))
        start += c
    return torch.cat(outs), into.slot_bytes(slot, start)


def same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def case(n, seed):
    torch.manual_seed(seed)
    x = torch.randn(n, CONV).half()
    return x, -torch.rand(n, 4) * 0.5, torch.rand(n, 4).half()


def check_form(kernel, faults) -> None:
    """A chunk kernel's checks: the reference, cuts, a lane beside others, the graph layout, and
    each (fault, cuts) planted: the cuts then differ from one call."""
    interpreter_dot.install()
    interpreter_bounds.install()
    n = 150
    x, g, beta = case(n, 0)
    whole = run(kernel, [n], x, g, beta)
    # against the chunk form's reference in fp32
    states = pool(torch.float32).layer(0)
    seg = (Segment(1, 0, 0, n, None),)
    want = ref.gated_delta_lanes(x.float(), g, beta.float(), states, SHAPE, seg)
    err = float((whole[0].float() - want).norm() / want.norm())
    assert err < 5e-3, err
    assert float((whole[1][1] - states.recurrent[1]).norm() / states.recurrent[1].norm()) < 5e-3
    for cuts in ([37] * 4 + [2], [n - 40] + [1] * 40, [64, 64, 22], [63, 2, 85], [1, 127, 22]):
        assert same(run(kernel, cuts, x, g, beta), whole), cuts
    # a lane beside others: lanes (3, 70 rows from 0) and (2, 5 rows at 61 after 61 rows) around it
    beside = pool()
    states = beside.layer(0)
    ox, og, ob = case(131, 1)
    run(kernel, [61], ox[:61], og[:61], ob[:61], slot=2, into=beside)
    both = kernel(
        torch.cat([ox[61:131], x, ox[:5]]), torch.cat([og[61:131], g, og[:5]]),
        torch.cat([ob[61:131], beta, ob[:5]]), states, SHAPE,
        eager([(3, 0, 70), (1, 0, n), (2, 61, 5)]),
    )  # fmt: skip
    assert same(
        (both[70 : 70 + n], beside.slot_bytes(1, n)),
        whole,
    )
    # a graph pass (4 rows a lane, tails on the device) = eager passes of the same rows
    pa, pb = pool(), pool()
    a, b = pa.layer(0), pb.layer(0)
    run(kernel, [50], x[:50], g[:50], beta[:50], slot=1, into=pa)
    run(kernel, [50], x[:50], g[:50], beta[:50], slot=1, into=pb)
    run(kernel, [61], ox[:61], og[:61], ob[:61], slot=2, into=pa)
    run(kernel, [61], ox[:61], og[:61], ob[:61], slot=2, into=pb)
    for step in range(5):  # lane 1 from 50, lane 2 from 61: both cross a boundary on the way
        r1, r2 = slice(50 + 4 * step, 54 + 4 * step), slice(61 + 4 * step, 65 + 4 * step)
        xs, gs, bs = (torch.cat([t[r1], o[r2]]) for t, o in ((x, ox), (g, og), (beta, ob)))
        tails = [(50 + 4 * step) % CHUNK, (61 + 4 * step) % CHUNK]
        out_g = kernel(xs, gs, bs, a, SHAPE, graph([1, 2], tails, 4))
        lanes = [(1, 50 + 4 * step, 4), (2, 61 + 4 * step, 4)]
        out_e = kernel(xs, gs, bs, b, SHAPE, eager(lanes))
        assert torch.equal(out_g, out_e), step
        assert torch.equal(a.recurrent, b.recurrent), step
        for slot, t in zip((1, 2), tails):  # rows past the tail are never read
            kept = (t + 4) % CHUNK
            assert torch.equal(a.tail[slot, :kept], b.tail[slot, :kept]), step
            assert torch.equal(a.tail_gates[slot, :kept], b.tail_gates[slot, :kept]), step
    for fault, cuts in faults:
        planted = run(kernel, cuts, x, g, beta, fault=fault)
        assert not same(planted, run(kernel, [n], x, g, beta, fault=fault)), fault


def main() -> None:
    check_form(
        grid.grid_lanes,
        [(grid.FAULT_TAIL_SOLVED, [110] + [1] * 40), (grid.FAULT_EARLY_STATE, [37] * 4 + [2])],
    )
    g, beta = case(100, 0)[1:]
    # a program's value blocks, one or several: the same bits (dv 64 in blocks of 16)
    wide = ref.GDNShape(2, 4, 16, 64)
    conv = 2 * wide.key_dim + wide.value_dim
    xw = torch.randn(100, conv).half()
    got = []
    for per in (1, 2, 4):
        st = StatePool(1, 2, 4, conv, 4, 16, 64, torch.float16, torch.device("cpu"), CHUNK).layer(0)
        o = grid.grid_lanes(
            xw,
            g[:100],
            beta[:100],
            st,
            wide,
            eager([(1, 0, 100)]),
            block_v=16,
            blocks_per_program=per,
        )
        got.append((o, st.recurrent[1], st.tail[1, :36], st.tail_gates[1, :36]))
    assert all(all(torch.equal(a, b) for a, b in zip(got[0], other)) for other in got[1:])
    print("grid form matches its reference and itself")


if __name__ == "__main__":
    main()
