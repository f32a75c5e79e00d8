"""The gated delta rule in chunks of 64 rows on the absolute grid (docs/model.md, 'Gated
DeltaNet'; docs/exactness.md, 'The recurrence in grid chunks').

Positions 64c .. 64c+63 of a sequence form chunk c. A chunk's rows are computed together, in the
chunked (WY) form, from the state at the chunk's first position; the state is kept only at chunk
boundaries. Every row of a chunk depends on that state and the chunk's rows up to itself only, so
a pass that brings some of a chunk's rows recomputes it from the rows kept since the boundary (the
lane's tail) plus its own: a decode step, a prompt cut anywhere and a whole prompt then compute
every row with the same operations on the same values. `gated_delta_step` is the per-token
recurrence of the same function, kept as the test's reference of the chunk form's value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import CHUNK, GDNState, Segment
from .gates import untailed
from .norm import l2_norm

# The exact forms of the rule (docs/exactness.md): one token at a time, or grid chunks of 64 rows
# (on the GPU "chunk" runs fla's chunk kernels, "grid" our one-launch kernel and "rows" our kernel
# that computes only a pass's new rows; the CPU runs this module's reference for all three)
FORMS = ("recurrence", "chunk", "grid", "rows")
OWN_KERNELS = ("grid", "rows")  # the chunk forms of our own kernels (their card limits)


def grid_chunked(form: str) -> bool:
    """Whether `form` computes grid chunks, keeping each lane's rows since its boundary."""
    if form not in FORMS:
        raise ValueError(f"gdn form {form!r}: expected one of {', '.join(FORMS)}")
    return form != "recurrence"


def grid_kernel_refuses(shape: "GDNShape") -> str | None:
    """Why the GPU's grid kernel cannot run a layer of this shape, or None: its tiles want
    power-of-two head dims of at least 16, and whole groups of value heads per key head."""
    dk, dv = shape.k_head_dim, shape.v_head_dim
    if dk & (dk - 1) or dv & (dv - 1) or min(dk, dv) < 16 or shape.num_v_heads % shape.num_k_heads:
        return (
            f"the grid form needs power-of-two head dims of at least 16 and value heads in whole "
            f"groups per key head, got dk={dk} dv={dv} Hk={shape.num_k_heads} "
            f"Hv={shape.num_v_heads}"
        )
    return None


def grid_card_refuses(shape: "GDNShape") -> str | None:
    """Why an engine on a GPU refuses the grid form for a layer of this shape, or None. Beyond
    the kernel's own limits: its configuration (value blocks of 64 columns, 4 warps) has passed
    its checks on a card at head dims of 128 (every Qwen3.5 size) and no other; at 32-column
    value blocks Triton 3.6 compiled it into code that faults (docs/exactness.md)."""
    refused = grid_kernel_refuses(shape)
    if refused or (shape.k_head_dim, shape.v_head_dim) == (128, 128):
        return refused
    return (
        f"the grid form runs on a GPU at head dims of 128, the only ones its kernel has passed "
        f"its checks at on a card; got dk={shape.k_head_dim} dv={shape.v_head_dim}"
    )


def gated_delta_step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
) -> torch.Tensor:
    """One token for all value heads. Updates `state` [Hv, dk, dv] in place, returns o [Hv, dv].

    q, k [Hv, dk] (normalised, q scaled), v [Hv, dv], decay = exp(g) [Hv], beta [Hv];
    all in the state's dtype.
    """
    state.mul_(decay[:, None, None])
    memory = (state * k[:, :, None]).sum(dim=-2)
    delta = (v - memory) * beta[:, None]
    state.add_(k[:, :, None] * delta[:, None, :])
    return (state * q[:, :, None]).sum(dim=-2)


def gated_delta_rule(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
) -> torch.Tensor:
    """The per-token recurrence over tokens [n] of one sequence: q, k [n, Hv, dk], v [n, Hv, dv],
    decay = exp(g), beta [n, Hv]. Returns o [n, Hv, dv] in the state's dtype; updates `state`."""
    out = torch.empty((q.shape[0], *v.shape[1:]), dtype=state.dtype, device=state.device)
    for t in range(q.shape[0]):
        out[t] = gated_delta_step(state, q[t], k[t], v[t], decay[t], beta[t])
    return out


@dataclass(frozen=True)
class GDNShape:
    """A Gated DeltaNet layer's heads (this rank's heads under a split)."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim


def _heads(x: torch.Tensor, h: GDNShape, acc: torch.dtype):
    """q, k [n, Hv, dk] (l2-normed in `acc`, q scaled by dk^-1/2; value head j reads key head
    j // (Hv/Hk)) and v [n, Hv, dv] of conv rows x [n, q | k | v]."""
    n, rep = x.shape[0], h.num_v_heads // h.num_k_heads
    q, k, v = x.to(acc).split([h.key_dim, h.key_dim, h.value_dim], dim=-1)
    q = l2_norm(q.view(n, h.num_k_heads, -1)) / h.k_head_dim**0.5
    k = l2_norm(k.view(n, h.num_k_heads, -1))
    return q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1), v.view(n, h.num_v_heads, -1)


def recurrence_lanes(
    x: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: GDNState,
    heads: GDNShape,
    segments: tuple[Segment, ...],
) -> torch.Tensor:
    """The per-token form: every lane's rows one at a time from the state after its last row
    (the slot holds that state; the tail is unused), left in the segment's `out` slot. Inputs and
    result as gated_delta_lanes."""
    acc = states.recurrent.dtype
    decay = untailed(torch.exp, g)  # over every row at once
    out = x.new_zeros(x.shape[0], heads.num_v_heads, heads.v_head_dim)
    for seg in segments:
        r = seg.rows
        q, k, v = _heads(x[r], heads, acc)
        if seg.out != seg.slot:  # the rows run on a copy there, the read slot stays as it was
            states.recurrent[seg.out].copy_(states.recurrent[seg.slot])
        o = gated_delta_rule(states.recurrent[seg.out], q, k, v, decay[r], beta[r].to(acc))
        out[r] = o.to(x.dtype)
    return out


def _masked_exp(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """exp(x) where `keep`, exactly 0 elsewhere (the masked exponent never overflows)."""
    return untailed(torch.exp, torch.where(keep, x, torch.full_like(x, -torch.inf)))


def chunk(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One grid chunk from the state at its start: q, k [64, Hv, dk] (normalised, q scaled),
    v [64, Hv, dv], g (log-decay) and beta [64, Hv], rows past the chunk's real ones zero.
    Returns (o [64, Hv, dv], the state after all 64 rows); row i of o depends on rows ≤ i only.

    With Γ_i = exp(Σ_{j≤i} g_j) and A_ij = β_i (k_i·k_j) Γ_i/Γ_j for j < i:
      (I + A) [W | U] = [β Γ K | β V],   V' = U − W S,
      O = (Γ Q) S + ((Q Kᵀ) ⊙ Γ_i/Γ_j, j ≤ i) V',   S' = Γ_63 S + (K Γ_63/Γ)ᵀ V'.
    The shapes never change, so each row is the same sequence of operations in every pass."""
    # contiguous heads-first copies: a lone head's view is contiguous, several heads' are not, and
    # solve_triangular's LAPACK path (so its bits) follows I + A's layout (docs/exactness.md)
    qh, kh, vh, gh, bh = (t.transpose(0, 1).contiguous() for t in (q, k, v, g, beta))
    gc = torch.cumsum(gh, dim=-1)  # [Hv, 64]
    diff = gc[:, :, None] - gc[:, None, :]  # log Γ_i/Γ_j
    rows = torch.arange(CHUNK, device=q.device)
    below, upto = rows[:, None] > rows[None, :], rows[:, None] >= rows[None, :]
    b = bh[:, :, None]  # [Hv, 64, 1]
    a = b * (kh @ kh.transpose(-1, -2)) * _masked_exp(diff, below)
    gamma = untailed(torch.exp, gc)[:, :, None]
    rhs = torch.cat([b * gamma * kh, b * vh], dim=-1)
    eye = torch.eye(CHUNK, dtype=a.dtype, device=a.device)
    wu = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    w, u = wu.split([kh.shape[-1], vh.shape[-1]], dim=-1)
    v_new = u - w @ state
    attn = (qh @ kh.transpose(-1, -2)) * _masked_exp(diff, upto)
    o = (qh * gamma) @ state + attn @ v_new
    to_end = untailed(torch.exp, gc[:, -1:] - gc)[:, :, None]  # Γ_63/Γ_j
    end = gamma[:, -1:, :] * state + (kh * to_end).transpose(-1, -2) @ v_new
    return o.transpose(0, 1), end


def _pad(x: torch.Tensor) -> torch.Tensor:
    """x [n ≤ 64, ...] zero-padded to the chunk's 64 rows."""
    return (
        torch.cat([x, x.new_zeros((CHUNK - x.shape[0], *x.shape[1:]))]) if x.shape[0] < CHUNK else x
    )


def chunked_rule(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> torch.Tensor:
    """Rows [n] of one sequence starting at a grid boundary, chunk by chunk from `state` (the
    state there). Returns o [n, Hv, dv]; `state` becomes the state at the last boundary reached."""
    out = []
    for c in range(0, q.shape[0], CHUNK):
        piece = [_pad(t[c : c + CHUNK]) for t in (q, k, v, g, beta)]
        o, end = chunk(state, *piece)
        n = min(CHUNK, q.shape[0] - c)
        out.append(o[:n])
        if n == CHUNK:
            state.copy_(end)
    return torch.cat(out) if out else v.new_zeros((0, *v.shape[1:]))


def gated_delta_lanes(
    x: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: GDNState,
    heads: GDNShape,
    segments: tuple[Segment, ...],
) -> torch.Tensor:
    """Every lane of a pass: x [n, q | k | v] as the conv left them, g (log-decay, state dtype)
    and beta [n, Hv]. Per lane the rows since its last grid boundary (its tail) go first, then
    its new rows, chunk by chunk from its boundary state; q and k are l2-normed in the state's
    precision (q scaled by dk^-1/2), value head j reading key head j // (Hv/Hk). Afterwards the
    slot holds the state at the lane's last boundary and the tail its rows since.
    Returns o [n, Hv, dv] in x's dtype (padding rows zero)."""
    acc = states.recurrent.dtype
    out = x.new_zeros(x.shape[0], heads.num_v_heads, heads.v_head_dim)
    for seg in segments:
        r, t0 = seg.rows, seg.start % CHUNK
        xs, gs, bs = states.lane_rows(seg.slot, t0, x[r], g[r], beta[r])
        q, k, v = _heads(xs, heads, acc)
        o = chunked_rule(states.recurrent[seg.slot], q, k, v, gs, bs)
        out[r] = o[t0:].to(x.dtype)
        states.keep_tail(seg.slot, xs, gs, bs)
    return out
