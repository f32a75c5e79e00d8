"""GPU (skipped without CUDA): the gated delta rule in grid chunks, at the 9B's layer shape, in
each GPU form (`chunk`: fla's kernels; `grid`: one launch a layer; `rows`: one launch computing a
pass's new rows only), gives a lane's rows and state
the same bytes however its rows are cut into passes, in either layout (packed eager passes, padded
CUDA-graph passes), beside other lanes or alone, and stays close to the per-token recurrence
computed in float64."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from tensorfold.batch import LaneIndex, Segment  # noqa: E402
from tensorfold.cache.state_pool import StatePool  # noqa: E402
from tensorfold.ops import gated_delta as ref  # noqa: E402
from tensorfold.ops.dispatch import lane_index  # noqa: E402
from tensorfold.ops.norm import l2_norm  # noqa: E402
from tensorfold.ops.triton import gated_delta_chunk, gated_delta_grid, gated_delta_rows  # noqa: E402

SHAPE = ref.GDNShape(16, 32, 128, 128)  # the 9B's Gated DeltaNet heads
CONV = 2 * SHAPE.key_dim + SHAPE.value_dim
DEV = torch.device("cuda")
FORMS = ("chunk", "grid", "rows")
OURS = {"grid": gated_delta_grid.grid_lanes, "rows": gated_delta_rows.rows_lanes}


@pytest.fixture(params=FORMS)
def form(request):
    return request.param


def _rows(n: int, seed: int):
    torch.manual_seed(seed)
    x = torch.randn(n, CONV, device=DEV).to(torch.bfloat16)
    g = -torch.rand(n, SHAPE.num_v_heads, device=DEV) * 0.3
    beta = torch.rand(n, SHAPE.num_v_heads, device=DEV).to(torch.bfloat16)
    return x, g, beta


def _pool(slots: int = 4) -> StatePool:
    s = SHAPE
    return StatePool(
        1, slots, 4, CONV, s.num_v_heads, s.k_head_dim, s.v_head_dim, torch.bfloat16, DEV, 64
    )


def _eager(form, pool, lanes, x, g, beta):
    """One eager pass; lanes: (slot, start, rows) in row order."""
    segs, row0 = [], 0
    for slot, start, n in lanes:
        segs.append(Segment(slot, start, row0, n, torch.arange(start + n, device=DEV)))
        row0 += n
    index = lane_index(tuple(segs), DEV, 4, chunked=True)
    if form in OURS:
        return OURS[form](x, g, beta, pool.layer(0), SHAPE, index)
    return gated_delta_chunk.gated_delta_lanes(x, g, beta, pool.layer(0), SHAPE, index)


def _graph(form, pool, x, g, beta, slots, tails, rows):
    """One pass in a CUDA graph's layout: `rows` rows a lane, tail lengths on the device."""
    if form in OURS:
        bounds = torch.arange(slots.shape[0] + 1, device=DEV) * rows
        index = LaneIndex(slots, bounds, bounds[:0], bounds[:0], None, tails)
        return OURS[form](x, g, beta, pool.layer(0), SHAPE, index)
    return gated_delta_chunk.graph_lanes(x, g, beta, pool.layer(0), SHAPE, slots, tails, rows)


def _cut(form, cuts, x, g, beta, slot=1, graph_rows=None):
    """A lane's rows in passes of `cuts` rows (eager), or `graph_rows` a pass in the graph layout."""
    pool, outs, start = _pool(), [], 0
    for c in cuts:
        r = slice(start, start + c)
        if graph_rows:
            slots, tails = torch.tensor([slot], device=DEV), torch.tensor([start % 64], device=DEV)
            o = _graph(form, pool, x[r], g[r], beta[r], slots, tails, c)
        else:
            o = _eager(form, pool, [(slot, start, c)], x[r], g[r], beta[r])
        outs.append(o)
        start += c
    return torch.cat(outs), pool.slot_bytes(slot, start)


def _same(a, b, what):
    out_a, st_a = a
    out_b, st_b = b
    assert torch.equal(out_a, out_b), f"{what}: rows differ"
    for i, (p, q) in enumerate(zip(st_a, st_b)):
        assert torch.equal(p, q), f"{what}: state tensor {i} differs"


def test_any_cut_gives_the_same_bytes(form):
    n = 300
    x, g, beta = _rows(n, 0)
    whole = _cut(form, [n], x, g, beta)
    _same(whole, _cut(form, [37] * 8 + [4], x, g, beta), "chunks of 37")
    _same(whole, _cut(form, [128, 128, 44], x, g, beta), "chunks of 128")
    _same(whole, _cut(form, [16] * 18 + [12], x, g, beta), "chunks of 16")
    _same(whole, _cut(form, [1] * n, x, g, beta), "eager decode steps")
    _same(whole, _cut(form, [1] * n, x, g, beta, graph_rows=True), "graph decode steps")
    _same(
        whole, _cut(form, [61] + [5] * 47 + [4], x, g, beta, graph_rows=True), "graph passes of 5"
    )


def test_a_lane_beside_others_equals_alone(form):
    x, g, beta = _rows(190, 1)
    alone = _cut(form, [100, 90], x, g, beta)
    pool, (ox, og, ob) = _pool(), _rows(400, 2)
    # lane 1 beside lanes of other lengths, starts and tails (slots 0, 2, 3), over two passes
    mix = lambda o, t: torch.cat([o[:50], t[:100], o[50:114]])  # noqa: E731
    first = _eager(
        form, pool, [(0, 0, 50), (1, 0, 100), (3, 0, 64)], *map(mix, (ox, og, ob), (x, g, beta))
    )
    mix = lambda o, t: torch.cat([o[200:207], t[100:190], o[300:301]])  # noqa: E731
    second = _eager(
        form, pool, [(2, 0, 7), (1, 100, 90), (0, 50, 1)], *map(mix, (ox, og, ob), (x, g, beta))
    )
    got = (torch.cat([first[50:150], second[7:97]]), pool.slot_bytes(1, 190))
    _same(alone, got, "a lane beside others")


def test_close_to_the_float64_recurrence(form):
    n = 200
    x, g, beta = _rows(n, 3)
    out, _ = _cut(form, [n], x, g, beta)
    s = SHAPE
    q, k, v = x.double().split([s.key_dim, s.key_dim, s.value_dim], dim=-1)
    rep = s.num_v_heads // s.num_k_heads
    q = (l2_norm(q.view(n, s.num_k_heads, -1)) / s.k_head_dim**0.5).repeat_interleave(rep, 1)
    k = l2_norm(k.view(n, s.num_k_heads, -1)).repeat_interleave(rep, 1)
    state = torch.zeros(s.num_v_heads, s.k_head_dim, s.v_head_dim, dtype=torch.float64, device=DEV)
    want = ref.gated_delta_rule(
        state, q, k, v.view(n, s.num_v_heads, -1), g.double().exp(), beta.double()
    )
    err = (out.double() - want).abs().max() / want.abs().max()
    assert err < 2e-2, f"relative error {err:.2e}"


def test_prompts_packed_in_one_pass_equal_each_alone(form):
    lens = [20, 57, 94, 131]  # whole chunks and unfinished ones, in either call of the pass
    data = [_rows(n, 10 + i) for i, n in enumerate(lens)]
    solo = [_cut(form, [n], *d) for n, d in zip(lens, data)]
    pool = _pool(5)
    packed = _eager(
        form, pool, [(i, 0, n) for i, n in enumerate(lens)], *map(torch.cat, zip(*data))
    )
    start = 0
    for i, n in enumerate(lens):
        _same(solo[i], (packed[start : start + n], pool.slot_bytes(i, n)), f"prompt {i} packed")
        start += n
