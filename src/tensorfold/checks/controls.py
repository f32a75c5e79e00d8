"""The registry's planted faulty variants: each must turn its kernel's check red."""

from __future__ import annotations

import torch

from ..ops.triton import conv as tconv
from ..ops.triton import gated_delta, linear


def _conv_no_state(x, states, weight, slots, taps, keep, writes=None, **bounds):
    """Planted: the conv forgets to carry its window to the next call."""
    saved = states.clone()
    out = tconv.conv_lanes(x, states, weight, slots, taps, keep, writes, **bounds)
    states.copy_(saved)
    return out


def _in_place(impl):
    """Planted: the state written back where it was read, whatever slot it was to be left in."""
    return lambda *args, writes=None, **kw: impl(*args, **kw)


def _fla_chunked(q, k, v, g, beta, states, slots, cu, writes=None, gate_params=None):
    """Planted: fla's chunked (WY) kernel in place of the recurrence."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from ..ops.triton.gates import gdn_gates

    if gate_params is not None:  # g and beta are the gates' inputs
        g, beta = gdn_gates(g, beta, *gate_params)

    o, final = chunk_gated_delta_rule(
        q[None],
        k[None],
        v[None],
        g=g[None].float(),
        beta=beta[None],
        scale=q.shape[-1] ** -0.5,
        initial_state=states[slots],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu,
    )
    states[slots if writes is None else writes] = final
    return o[0]


def _chunks_follow_the_pass(x, g, beta, states, shape, lanes):
    """Planted: chunks start at each pass's first row (no grid, no tail); the state after the
    pass's last row is kept."""
    from ..ops.triton.gated_delta_chunk import _fla_index, assemble
    from ..ops.triton.gated_delta_fla import chunk_forward

    n = torch.arange(x.shape[0], device=x.device)
    q, k, v, gg, bb = assemble(x, g, beta, states, shape, n, n * 0 - 1)
    lengths = (lanes.cu_seqlens[1:] - lanes.cu_seqlens[:-1]).tolist()
    cu, chunks, offsets = (torch.tensor(a, device=x.device) for a in _fla_index(lengths))
    h0 = states.recurrent[lanes.slots]
    o, final = chunk_forward(q, k, v, gg, bb, h0, cu, chunks.view(-1, 2), offsets)
    states.recurrent.index_copy_(0, lanes.slots, final)
    return o[0]


def _short_passes_other_row_sum(x, g, beta, states, shape, lanes):
    """Planted: passes of few rows normalise q and k with another reduction tree (the sum split
    in two halves, as a kernel with its warps split along the row would)."""
    from ..ops.triton.gated_delta_chunk import FAULT_HALVES, eager_lanes

    fault = FAULT_HALVES if x.shape[0] <= 8 else 0
    return eager_lanes(x, g, beta, states, shape, lanes.gdn, fault=fault)


def _grid_tail_solved(x, g, beta, states, shape, lanes):
    """Planted: a chunk some of whose rows the pass lacks solves only the pass's own rows (as
    an incremental solve that forgot the tail would)."""
    from ..ops.triton.gated_delta_grid import FAULT_TAIL_SOLVED, grid_lanes

    return grid_lanes(x, g, beta, states, shape, lanes, FAULT_TAIL_SOLVED)


def _grid_early_state(x, g, beta, states, shape, lanes):
    """Planted: the slot's state advances to the end of every pass, finished chunk or not."""
    from ..ops.triton.gated_delta_grid import FAULT_EARLY_STATE, grid_lanes

    return grid_lanes(x, g, beta, states, shape, lanes, FAULT_EARLY_STATE)


def _rows_tail_skipped(x, g, beta, states, shape, lanes):
    """Planted: a block's substitution leaves the tail's rows out of each row's sum (as a
    decode step that forgot the v' its tail keeps would)."""
    from ..ops.triton.gated_delta_rows import FAULT_TAIL_SKIPPED, rows_lanes

    return rows_lanes(x, g, beta, states, shape, lanes, FAULT_TAIL_SKIPPED)


def _rows_early_state(x, g, beta, states, shape, lanes):
    """Planted: the rows form's boundary state advances over an unfinished chunk too."""
    from ..ops.triton.gated_delta_rows import FAULT_EARLY_STATE, rows_lanes

    return rows_lanes(x, g, beta, states, shape, lanes, FAULT_EARLY_STATE)


def _split_k(x, w, plan, out=None):
    """Planted: small batches reduce K in two halves added afterwards (cuBLAS's small-M habit)."""
    if x.shape[0] > 16:
        return linear.dense_matmul(x, w, plan, out)
    h = w.shape[1] // 2
    lo = linear.dense_matmul(x[:, :h].contiguous(), w[:, :h], plan).float()
    hi = linear.dense_matmul(x[:, h:].contiguous(), w[:, h:], plan).float()
    return (lo + hi).to(x.dtype)


def _unsegmented(x, w, plan, out=None):
    """Planted: few rows walk K in one chain instead of the weight's segments."""
    if x.shape[0] <= 16:
        plan = linear.LinearPlan(segment=w.shape[1], block_k=plan.block_k)
    return linear.dense_matmul(x, w, plan, out)


def _affine_chained(x, packed, scales, biases, bits, gs, plan, out=None):
    """Planted: few packed rows chain one MMA accumulator across the weight's segments instead of
    summing each segment from zero and adding the sums (a two-level plan read as one chain)."""
    if x.shape[0] <= 16:
        plan = linear.LinearPlan(segment=packed.shape[1] * 32 // bits, block_k=plan.block_k)
    return linear.affine_matmul(x, packed, scales, biases, bits, gs, plan, out)


def _affine_regrouped(x, packed, scales, biases, bits, gs, plan, out=None):
    """Planted: few packed rows feed the MMAs K values regrouped across 16-column steps (what an
    operand layout with kWidth > 2 does): the same products, summed in other groups of 16."""
    if x.shape[0] > 16:
        return linear.affine_matmul(x, packed, scales, biases, bits, gs, plan, out)
    k = x.shape[1]
    w = linear.dequantize(packed.view(torch.int32), scales, biases, bits, gs, x.dtype)
    order = torch.arange(k, device=x.device).view(-1, 2, 2, 8).transpose(1, 2).reshape(k)
    dense = linear.LinearPlan.for_weight(w.shape[0], k)
    return linear.dense_matmul(x[:, order].contiguous(), w[:, order].contiguous(), dense, out)


CONTROLS = [  # (kernel, what is planted, faulty implementation)
    (
        "linear.dense",
        "a row off by one",
        lambda x, w, p, out=None: linear.dense_matmul(x, w, p, out).roll(1, 0),
    ),
    ("linear.dense", "a reduction in another order (split K)", _split_k),
    ("linear.dense", "few rows reduced without the plan's segments", _unsegmented),
    ("linear.affine", "few rows chained across segments", _affine_chained),
    ("linear.affine", "K regrouped across MMAs (kWidth > 2)", _affine_regrouped),
    ("gdn.recurrence", "the chunked WY form", _fla_chunked),
    ("gdn.recurrence", "state left where it was read", _in_place(gated_delta.gated_delta_lanes)),
    ("gdn.chunk", "chunks that follow the pass, not the grid", _chunks_follow_the_pass),
    ("gdn.chunk", "another row-sum tree for short passes", _short_passes_other_row_sum),
    ("gdn.grid", "a partial chunk's solve skips the tail's rows", _grid_tail_solved),
    ("gdn.grid", "the boundary advances over an unfinished chunk", _grid_early_state),
    ("gdn.rows", "a block's substitution skips the tail's rows", _rows_tail_skipped),
    ("gdn.rows", "the boundary advances over an unfinished chunk", _rows_early_state),
    ("conv", "a conv window not carried over", _conv_no_state),
    ("conv", "state left where it was read", _in_place(tconv.conv_lanes)),
]
