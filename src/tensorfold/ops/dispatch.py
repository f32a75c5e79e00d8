"""One function per op: the Triton kernel for CUDA tensors, the plain-torch reference otherwise.

The layers call only these, so each layer has one body. A kernel and its reference keep the same
arithmetic contract (docs/exactness.md); the registry (checks/registry.py) checks each kernel
against its reference. Triton is imported only when a CUDA tensor arrives: the CPU path needs none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import ForwardBatch, LaneIndex, Segment
from ..util import longs
from . import attention as ref_attention
from . import conv as ref_conv
from . import gated_delta as ref_gdn
from . import gates as ref_gates
from . import linear as ref_linear
from . import moe as ref_moe
from . import norm as ref_norm
from . import sampling as ref_sampling
from .linear import Partial
from .quant import QuantizedWeight
from .rope import apply_rope

# The arithmetic of every kernel and reference (docs/exactness.md): bump it with any change that
# can move a bit, so system_fingerprint tells clients their bytes may differ. 3: GPU attention
# over fixed 256-key super-blocks; 2: the MoE routing and sum as single kernels on the GPU.
ARITHMETIC_VERSION = 3


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """The CPU's row tile: its elementwise ops and products then see one shape per tile. The GPU
    kernels' bits never depend on the row count, so they get the rows as they are."""
    return x if x.is_cuda else ref_linear.pad_rows(x)


def lane_index(
    segments: tuple[Segment, ...], device, conv_kernel: int, chunked: bool = False
) -> LaneIndex:
    """The index tensors of a pass's per-lane kernels (`chunked`: the packing plan of the chunk
    form's fla kernels on a GPU; the grid form's kernel reads the lanes' tails only)."""
    bounds = [0]
    for seg in segments:
        bounds.append(bounds[-1] + seg.length)
    taps, keep = ref_conv.conv_gather(segments, conv_kernel)
    as_t = lambda v: longs(v, device)  # noqa: E731
    plan = None
    if torch.device(device).type == "cuda" and chunked:
        from .triton.gated_delta_chunk import LanePlan

        plan = LanePlan.build([(s.slot, s.start, s.length) for s in segments], device)
    moved = any(s.writes >= 0 for s in segments)
    return LaneIndex(
        as_t([s.slot for s in segments]),
        as_t(bounds),
        as_t(taps),
        as_t(keep),
        ref_attention.AttentionTiles.build(segments, device),
        as_t([s.start % ref_gdn.CHUNK for s in segments]),
        plan,
        writes=as_t([s.out for s in segments]) if moved else None,
        most_rows=max((s.length for s in segments), default=0),
    )


def linear(
    x: torch.Tensor,
    w: torch.Tensor | QuantizedWeight,
    book=None,
    tile: int = ref_linear.COL_TILE,
    partial: bool = False,
) -> torch.Tensor | Partial:
    """x [M, K] · wᵀ -> [M, N]; `book` (ops.triton.linear.TileBook) picks GPU launch shapes,
    `tile` the CPU's column tile (ops/linear.py, col_tile). `partial`: on the GPU a split form's
    segment sums may come back as a Partial, for `rms_norm`'s residual add or `silu_mul` to add."""
    if x.is_cuda:
        from .triton.linear import matmul

        return matmul(x, w, book, keep=partial)
    if isinstance(w, QuantizedWeight):
        held = w.unpacked(x.dtype)
        if held is None:
            return ref_linear.matmul_packed_rows(x, w, tile)
        w = held  # the same values, dequantized once: the same calls and bits
    return ref_linear.matmul_rows(x, w, tile=tile)


def unpacked(w: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The whole weight dequantized to `dtype` as the device's products dequantize it (held by
    `QuantizedWeight.hold_unpacked` for the products of many rows)."""
    if w.device.type == "cuda":
        from .triton.unpack import dequantize

        words = w.packed.view(torch.int32)
        return dequantize(words, w.scales, w.biases, w.bits, w.group_size, dtype)
    return w.rows(0, w.shape[0], dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    residual: torch.Tensor | None = None,
):
    """rms_norm(x); with `residual`, the residual add first: returns (residual + x, its norm)
    (x may be a product's Partial: its segments are added, in order, inside the add)."""
    if isinstance(x, Partial) and residual is None:
        x = total(x)
    if _on_gpu(x):
        from .triton import norm

        if residual is None:
            return norm.rms_norm(x, weight, eps, offset)
        return norm.add_rms_norm(residual, x, weight, eps, offset)
    if residual is None:
        return ref_norm.rms_norm(x, weight, eps, offset)
    h = residual + x
    return h, ref_norm.rms_norm(h, weight, eps, offset)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    if x.is_cuda:
        from .triton import norm

        return norm.gated_rms_norm(x, gate, weight, eps)
    return ref_norm.gated_rms_norm(x, gate, weight, eps)


def norm_rope(
    x: torch.Tensor | Partial,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    rope: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """apply_rope(rms_norm(x)) per head of x [N, H, D]: the q/k norm and the rotary embedding (x
    may be its product's Partial, added where it is read)."""
    if _on_gpu(x):
        from .triton import norm

        return norm.norm_rope(x, weight, eps, offset, *rope)
    return apply_rope(ref_norm.rms_norm(x, weight, eps, offset), *rope)


def qk_norm_rope(
    q: torch.Tensor | Partial,
    k: torch.Tensor | Partial,
    v: torch.Tensor | Partial,
    weights: tuple[torch.Tensor, torch.Tensor],
    eps: float,
    offset: float,
    rope: tuple[torch.Tensor, torch.Tensor],
    caches: tuple[torch.Tensor, torch.Tensor],
    rows: torch.Tensor,
) -> torch.Tensor:
    """`norm_rope(q)` (q's norm weight first in `weights`) returned and `norm_rope_cached(k, v)`
    (the keys' second) written; on the GPU in one launch where the inputs allow it."""
    if _on_gpu(q):
        from .triton import norm

        if norm.qk_fusable(q, k, v, caches):
            return norm.qk_norm_rope(q, k, v, weights, eps, offset, *rope, caches, rows)
    out = norm_rope(q, weights[0], eps, offset, rope)
    norm_rope_cached(k, v, weights[1], eps, offset, rope, caches, rows)
    return out


def norm_rope_cached(
    k: torch.Tensor | Partial,
    v: torch.Tensor | Partial,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    rope: tuple[torch.Tensor, torch.Tensor],
    caches: tuple[torch.Tensor, torch.Tensor],
    rows: torch.Tensor,
) -> None:
    """The fresh keys and values written to their KV rows: caches[0][rows] = norm_rope(k),
    caches[1][rows] = v (k, v [N, H, D]; the first len(rows) rows are real); one launch on the
    GPU where the caches allow it, else the norm and two indexed writes, here. k and v may be
    their product's Partial."""
    if _on_gpu(k):
        from .triton import norm

        if norm.keys_cacheable(k, caches):
            norm.norm_rope_cached(k, v, weight, eps, offset, *rope, caches, rows)
            return
    n = rows.shape[0]
    caches[0][rows] = norm_rope(k, weight, eps, offset, rope)[:n].to(caches[0].dtype)
    caches[1][rows] = total(v)[:n].to(caches[1].dtype)


def total(y: torch.Tensor | Partial) -> torch.Tensor:
    """A product's output: a Partial's segments added in order (its own sum launch)."""
    if isinstance(y, Partial):
        from .triton.linear import stored

        return stored(y)
    return y


def _one_plan(x: torch.Tensor | Partial, y: torch.Tensor | Partial) -> tuple:
    """Two outputs one kernel reads: as they are if both are stored or both a plan's Partials of
    one segment count (column ranges of one product); else each summed first."""
    if isinstance(x, Partial) or isinstance(y, Partial):
        same = isinstance(x, Partial) and isinstance(y, Partial)
        if not (same and x.sums.shape[0] == y.sums.shape[0]):
            return total(x), total(y)
    return x, y


def _on_gpu(x: torch.Tensor | Partial) -> bool:
    return isinstance(x, Partial) or x.is_cuda  # a Partial comes from a GPU's product only


def silu_mul(gate: torch.Tensor | Partial, up: torch.Tensor | Partial) -> torch.Tensor:
    """silu(gate) · up; gate and up may be column ranges of one product's Partial (two products,
    of their own plans or forms, are each summed first)."""
    gate, up = _one_plan(gate, up)
    if _on_gpu(gate):
        from .triton import gates as tgates

        return tgates.silu_mul(gate, up)
    return ref_gates.silu_mul(gate, up)


@dataclass(frozen=True)
class GateInputs:
    """The GDN gates' inputs on a GPU, computed where they are read: inside the per-token
    recurrence's kernel, or by their own kernel for the other forms (`values`)."""

    a: torch.Tensor | Partial
    b: torch.Tensor | Partial
    A_log: torch.Tensor
    dt_bias: torch.Tensor

    def values(self) -> tuple[torch.Tensor, torch.Tensor]:
        from .triton import gates as tgates

        return tgates.gdn_gates(self.a, self.b, self.A_log, self.dt_bias)


def gdn_gates(
    a: torch.Tensor | Partial,
    b: torch.Tensor | Partial,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    acc: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor] | GateInputs:
    """(g, beta): the log-decay in `acc` (the state's precision) and beta in the model dtype; on
    a GPU their inputs, for `gated_delta` to compute them (the same bits either way; a and b may
    be the in-projection's Partials, added where they are read)."""
    if _on_gpu(a):
        return GateInputs(*_one_plan(a, b), A_log, dt_bias)
    return ref_gates.gdn_gates(a, b, A_log, dt_bias, acc)


def causal_conv(
    x: torch.Tensor, states: torch.Tensor, weight: torch.Tensor, lanes: LaneIndex
) -> torch.Tensor:
    """silu(causal conv) of every lane's rows, each lane's conv state read from its slot and
    written back there (or to its `lanes.writes` slot)."""
    index = (lanes.slots, lanes.conv_taps, lanes.conv_keep, lanes.writes)
    if _on_gpu(x):
        from .triton import conv as tconv

        # padding rows (a mixed graph's prompt piece) take the form that writes every row
        most = 0 if lanes.padded else lanes.most_rows
        return tconv.conv_lanes(x, states, weight, *index, lanes.cu_seqlens, most)
    return ref_conv.causal_conv_lanes(x, states, weight, *index)


def gated_delta(
    x: torch.Tensor,
    gates: tuple[torch.Tensor, torch.Tensor] | GateInputs,
    states: ref_gdn.GDNState,
    shape: ref_gdn.GDNShape,
    batch: ForwardBatch,
    form: str = "recurrence",
) -> torch.Tensor:
    """The gated delta rule of every lane (x = [q | k | v] as the conv left them: the op
    l2-normalises and scales q and k), in one of the exact forms (docs/exactness.md): "recurrence",
    one token at a time from the state after the lane's last row, or grid chunks of 64 rows from
    the state at its last boundary and the rows since (its tail): "chunk" (fla's kernels on the
    GPU), "grid" (one launch on the GPU) or "rows" (one launch computing a pass's new rows
    only); the CPU runs one reference for all three. `gates`: (g,
    beta), or on a GPU their inputs, which the per-token kernel reads as they are."""
    if ref_gdn.grid_chunked(form) and batch.lanes.writes is not None:
        raise ValueError(f"the {form} form keeps each lane's state in its own slot; got writes")
    raw = isinstance(gates, GateInputs) and form == "recurrence"
    g, beta = (gates.a, gates.b) if raw else _gate_values(gates)
    if form == "grid" and x.is_cuda:
        from .triton.gated_delta_grid import grid_lanes

        return grid_lanes(x, g, beta, states, shape, batch.lanes)
    if form == "rows" and x.is_cuda:
        from .triton.gated_delta_rows import rows_lanes

        return rows_lanes(x, g, beta, states, shape, batch.lanes)
    if ref_gdn.grid_chunked(form):
        if x.is_cuda:
            from .triton.gated_delta_chunk import gated_delta_lanes

            return gated_delta_lanes(x, g, beta, states, shape, batch.lanes)
        return ref_gdn.gated_delta_lanes(x, g, beta, states, shape, batch.segments)
    if x.is_cuda:
        from .triton.gated_delta import gated_delta_lanes

        q, k, v = torch.split(x, [shape.key_dim, shape.key_dim, shape.value_dim], dim=-1)
        n = x.shape[0]
        return gated_delta_lanes(
            q.reshape(n, shape.num_k_heads, -1),
            k.reshape(n, shape.num_k_heads, -1),
            v.reshape(n, shape.num_v_heads, -1),
            g,
            beta,
            states.recurrent,
            batch.lanes.slots,
            batch.lanes.cu_seqlens,
            batch.lanes.padded,
            writes=batch.lanes.writes,
            gate_params=(gates.A_log, gates.dt_bias) if raw else None,
        )
    return ref_gdn.recurrence_lanes(x, g, beta, states, shape, batch.segments)


def _gate_values(gates) -> tuple[torch.Tensor, torch.Tensor]:
    return gates.values() if isinstance(gates, GateInputs) else gates


def gated_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
    gate: torch.Tensor,
) -> torch.Tensor:
    """Causal attention of every lane's rows over its pages, times sigmoid(gate): [N, Hq*D]."""
    if q.is_cuda:
        from .triton.attention import paged_attention

        tiles, zeroed = batch.lanes.attention, batch.lanes.padded
        out = paged_attention(q, k_cache, v_cache, tiles, scale, gate=gate, zeroed=zeroed)
        return out.view(q.shape[0], -1)
    return ref_attention.gated_attention_lanes(q, k_cache, v_cache, batch, scale, gate)


def moe_route(
    logits: torch.Tensor | Partial, top_k: int, *, last: int | None = None
) -> ref_moe.Route:
    """Each row's top-k experts (ascending id) and renormalised weights (docs/exactness.md,
    'Experts'), with `last` one more id after them (the joint shared expert); on the GPU one
    kernel (softmax, top-k, weights; the router's Partial added there), a float64 run the torch
    ops."""
    if _on_gpu(logits) and logits.dtype != torch.float64:
        from .triton.moe_rows import route

        return route(logits, top_k, last)
    return ref_moe.route(total(logits), top_k, last)


def expert_swiglu(
    x: torch.Tensor, ids: torch.Tensor, experts: ref_moe.Experts, book=None
) -> torch.Tensor:
    """[M, k, H]: each row's output of each of its experts, only the chosen experts read; on the
    GPU the tile table, one grouped launch for gate and up (silu · up written), one for down,
    in the launch shapes `book` (ops.triton.tiles.TileBook) picked."""
    if x.is_cuda:
        from .triton.moe import expert_swiglu

        return expert_swiglu(x, ids, experts, book)
    return ref_moe.expert_swiglu(x, ids, experts)


def moe_combine(
    routed: torch.Tensor,
    weights: torch.Tensor,
    shared: torch.Tensor,
    shared_logit: torch.Tensor | Partial,
) -> torch.Tensor:
    """Σ w·y over each row's experts in ascending id, then the gated shared expert, in fp32 and
    rounded once; on the GPU one kernel (each element reads its own row; the shared gate's
    Partial added there)."""
    if routed.is_cuda and weights.dtype == torch.float32:
        from .triton.moe_rows import combine

        return combine(routed, weights, shared, shared_logit)
    return ref_moe.combine(routed, weights, shared, total(shared_logit))


def sample_rows(
    rows: list[torch.Tensor], params: list[tuple[float, int, float, float]], us: list[float]
) -> torch.Tensor:
    """The sampled token of each row (through its request's rule already): (temperature, top_k,
    top_p, min_p) and the draw u a row, `ops.sampling.sample_row`'s rule, as int64 [R] on the
    rows' device; on the GPU one sort and two kernels a group of rows and no sync (a row's
    token never depends on the others)."""
    if rows[0].is_cuda:
        from .triton.sampling import GROUP, choose

        tokens = []
        for a in range(0, len(rows), GROUP):  # a group's copies and sort, not every row's
            t, k, p, m = zip(*params[a : a + GROUP])
            x = torch.stack([row.float() for row in rows[a : a + GROUP]])
            tokens.append(choose(x, t, k, p, m, us[a : a + GROUP]))
        return torch.cat(tokens)
    picked = [ref_sampling.sample_row(row, *q, u) for row, q, u in zip(rows, params, us)]
    return torch.tensor(picked, dtype=torch.long)
