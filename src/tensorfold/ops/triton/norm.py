"""Row norms on the GPU, one program per row and one configuration per width, so a row's
reduction tree depends on its width alone (never on how many rows came with it)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..linear import Partial
from .launch import pdl, pdl_start
from .linear import stored
from .segments import _read, _segment_total, operand


def _config(width: int) -> tuple[int, int]:
    block = triton.next_power_of_2(width)
    return block, 4 if block <= 4096 else 8


@triton.jit
def _rms_kernel(
    x_ptr, w_ptr, y_ptr, W: tl.constexpr, eps, offset, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK)
    mask = o < W
    x = tl.load(x_ptr + row * W + o, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + o, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / W + eps)
    tl.store(y_ptr + row * W + o, (x * r * (offset + w)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_kernel(
    x_ptr, z_ptr, w_ptr, y_ptr, W: tl.constexpr, eps, z_heads, z_stride, z_segs,
    NSEG: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """NSEG > 0: the gate z is its product's segment sums (`z_segs` apart), added where read."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK)
    mask = o < W
    x = tl.load(x_ptr + row * W + o, mask=mask, other=0.0).to(tl.float32)
    z_row = (row // z_heads) * z_stride + (row % z_heads) * W  # the gate may be a column slice
    out = y_ptr.dtype.element_ty
    z = _read(z_ptr + z_row, 0, o, mask, z_segs, 0, NSEG, out).to(tl.float32)
    w = tl.load(w_ptr + o, mask=mask, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / W + eps)
    normed = (x * r).to(y_ptr.dtype.element_ty)  # rounded to the activation dtype
    y = (w * normed).to(tl.float32) * (z / (1.0 + tl.exp(-z)))
    tl.store(y_ptr + row * W + o, y.to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    w = x.shape[-1]
    flat = x.contiguous().view(-1, w)
    y = torch.empty_like(flat)
    block, warps = _config(w)
    _rms_kernel[(flat.shape[0],)](
        flat, weight, y, w, eps, offset, BLOCK=block, num_warps=warps, **pdl(x.device)
    )
    return y.view(x.shape)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor | Partial, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x [..., W]; gate [N, H, W] (rows may be strided) or any shape matching x, or a product's
    Partial of [N, H, W] (its segments added where they are read)."""
    w = x.shape[-1]
    flat = x.contiguous().view(-1, w)
    z, nseg = (gate.sums, gate.sums.shape[0]) if isinstance(gate, Partial) else (gate[None], 0)
    if z.dim() != 4 or z.stride(3) != 1 or z.stride(2) != w:
        z = z.contiguous().view(z.shape[0], -1, 1, w)
    y = torch.empty_like(flat)
    block, warps = _config(w)
    _gated_kernel[(flat.shape[0],)](
        flat, z, weight, y, w, eps, z.shape[2], z.stride(1), z.stride(0), NSEG=nseg, BLOCK=block,
        num_warps=warps, **pdl(x.device),
    )  # fmt: skip
    return y.view(x.shape)


@triton.jit
def _add_rms_kernel(
    h_ptr, d_ptr, w_ptr, hout_ptr, y_ptr, W: tl.constexpr, eps, offset, stride_ds, stride_dm,
    NSEG: tl.constexpr, BLOCK: tl.constexpr, FAULT: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    """NSEG 0: the delta d [rows, W] as stored; else its product's segment sums [NSEG, rows, W],
    added in order and rounded to the model dtype first, as the product's own sum stores it
    (rows `stride_dm` apart, segments `stride_ds`)."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK)
    mask = o < W
    if NSEG == 0:
        d = tl.load(d_ptr + row * stride_dm + o, mask=mask, other=0.0)
    else:
        d = _segment_total(
            d_ptr, row, o, mask, stride_ds, stride_dm, NSEG, hout_ptr.dtype.element_ty, FAULT
        )
    s = tl.load(h_ptr + row * W + o, mask=mask, other=0.0).to(tl.float32) + d.to(tl.float32)
    s = s.to(hout_ptr.dtype.element_ty)  # the residual stream, rounded as torch adds
    tl.store(hout_ptr + row * W + o, s, mask=mask)
    x = s.to(tl.float32)
    w = tl.load(w_ptr + o, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / W + eps)
    tl.store(y_ptr + row * W + o, (x * r * (offset + w)).to(y_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    h: torch.Tensor, delta, weight: torch.Tensor, eps: float, offset: float, fault: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h + delta, rms_norm(h + delta)) in one pass: the residual add and the next norm; `delta`
    may be a product's Partial, whose segments are added here (`fault`: the registry's planted
    forms of that sum)."""
    w = h.shape[-1]
    h = h.contiguous()
    d, nseg, stride_s, stride_m = operand(delta)
    out, y = torch.empty_like(h), torch.empty_like(h)
    block, warps = _config(w)
    _add_rms_kernel[(h.shape[0],)](
        h, d, weight, out, y, w, eps, offset, stride_s, stride_m, NSEG=nseg, BLOCK=block,
        FAULT=fault, num_warps=warps, **pdl(h.device),
    )  # fmt: skip
    return out, y


@triton.jit
def _norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, stride_row, stride_head, H: tl.constexpr,
    D: tl.constexpr, ROT: tl.constexpr, eps, offset, rows_ptr=None, v_ptr=None, vout_ptr=None,
    stride_vrow=0, stride_s=0, CACHE: tl.constexpr = False, NSEG: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """CACHE: y and vout are a KV cache's [slots, H, D]: the row goes to slot rows[row], and the
    row's v head is copied beside it (the attention layer's write of fresh keys and values).
    NSEG > 0: x (and v) are their product's segment sums (`stride_s` apart), added where read."""
    pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    _norm_rope_head(
        x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, pid // H, pid % H, stride_row, stride_head, H, D,
        ROT, eps, offset, rows_ptr, v_ptr, vout_ptr, stride_vrow, stride_s, CACHE, NSEG,
    )  # fmt: skip


@triton.jit
def _qk_rope_kernel(
    q_ptr, wq_ptr, yq_ptr, stride_qrow, stride_qhead, k_ptr, wk_ptr, kc_ptr, stride_krow,
    stride_khead, rows_ptr, v_ptr, vc_ptr, stride_vrow, cos_ptr, sin_ptr, eps, offset, stride_s,
    QN, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr,
    NSEG: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    """The q norm + rotary of QN = rows · HQ heads, then the keys' (written to their KV rows
    with the values), one program a head in one launch: each program runs the same head body
    as `_norm_rope_kernel` does for q or for the keys alone."""
    pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    if pid < QN:
        _norm_rope_head(
            q_ptr, wq_ptr, cos_ptr, sin_ptr, yq_ptr, pid // HQ, pid % HQ, stride_qrow,
            stride_qhead, HQ, D, ROT, eps, offset, None, None, None, 0, stride_s, False, NSEG,
        )  # fmt: skip
    else:
        pid -= QN
        _norm_rope_head(
            k_ptr, wk_ptr, cos_ptr, sin_ptr, kc_ptr, pid // HKV, pid % HKV, stride_krow,
            stride_khead, HKV, D, ROT, eps, offset, rows_ptr, v_ptr, vc_ptr, stride_vrow,
            stride_s, True, NSEG,
        )  # fmt: skip


@triton.jit
def _norm_rope_head(
    x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, row, head, stride_row, stride_head, H: tl.constexpr,
    D: tl.constexpr, ROT: tl.constexpr, eps, offset, rows_ptr, v_ptr, vout_ptr, stride_vrow,
    stride_s, CACHE: tl.constexpr, NSEG: tl.constexpr,
):  # fmt: skip
    """One head of one row: rms norm, rotate-half, stored (CACHE: at its KV row, its v head
    copied beside it)."""
    o = tl.arange(0, D)
    base = x_ptr + row * stride_row + head * stride_head
    OUT: tl.constexpr = y_ptr.dtype.element_ty
    x = _read(base, 0, o, True, stride_s, 0, NSEG, OUT).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    normed = (
        (x * r * (offset + tl.load(w_ptr + o).to(tl.float32)))
        .to(y_ptr.dtype.element_ty)
        .to(tl.float32)
    )
    # rotate-half: the partner of channel d < ROT is d ± ROT/2, normalised the same way
    half: tl.constexpr = ROT // 2
    partner = tl.where(o < half, o + half, o - half)
    in_rot = o < ROT
    xp = _read(base, 0, partner, in_rot, stride_s, 0, NSEG, OUT).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=in_rot, other=0.0).to(tl.float32)
    np_ = (xp * r * (offset + wp)).to(y_ptr.dtype.element_ty).to(tl.float32)
    rotated = tl.where(o < half, -np_, np_)
    c = tl.load(cos_ptr + row * ROT + o, mask=in_rot, other=1.0)
    s = tl.load(sin_ptr + row * ROT + o, mask=in_rot, other=0.0)
    out = tl.where(in_rot, normed * c + rotated * s, normed)
    dest = row
    if CACHE:
        dest = tl.load(rows_ptr + row).to(tl.int64)
        v = _read(v_ptr + row * stride_vrow + head * D, 0, o, True, stride_s, 0, NSEG, OUT)
        tl.store(vout_ptr + (dest * H + head) * D + o, v.to(vout_ptr.dtype.element_ty))
    tl.store(y_ptr + (dest * H + head) * D + o, out.to(y_ptr.dtype.element_ty))


def _heads(x: torch.Tensor | Partial) -> tuple[torch.Tensor, int, int]:
    """(x [N, H, D] as the kernel reads it, its segments, their stride): a Partial's segment 0
    view carries the rows' and heads' strides; each head's D values must be contiguous."""
    if isinstance(x, Partial):
        sums = x.sums if x.sums.stride(-1) == 1 else x.sums.contiguous()
        return sums[0], sums.shape[0], sums.stride(0)
    return (x if x.stride(2) == 1 else x.contiguous()), 0, 0


def _rope_launch(x, weight, eps, offset, cos, sin, y, rows: int, nseg: int, **cache):
    _norm_rope_kernel[(rows * x.shape[1],)](
        x, weight, cos.contiguous(), sin.contiguous(), y, x.stride(0), x.stride(1), H=x.shape[1],
        D=x.shape[2], ROT=cos.shape[-1], eps=eps, offset=offset, NSEG=nseg, num_warps=4, **cache,
        **pdl(x.device),
    )  # fmt: skip


def norm_rope(
    x: torch.Tensor | Partial,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """apply_rope(rms_norm(x)) for x [N, H, D] (any row and head strides): the per-head q/k norm and
    the rotary embedding in one pass. cos/sin [N, ROT] fp32. x may be its product's Partial."""
    (n, h, d), dtype = x.shape, x.dtype
    if d & (d - 1):  # the kernel holds a head as one power-of-two block
        from ..rope import apply_rope

        return apply_rope(rms_norm(stored(x), weight, eps, offset), cos, sin)
    x, nseg, stride_s = _heads(x)
    y = torch.empty((n, h, d), dtype=dtype, device=x.device)
    _rope_launch(x, weight, eps, offset, cos, sin, y, n, nseg, stride_s=stride_s)
    return y


def keys_cacheable(k: torch.Tensor, caches: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether `norm_rope_cached` takes these keys and caches: a power-of-two head, caches
    [slots, H, D] contiguous in the keys' dtype (else the norm, then indexed writes)."""
    d = k.shape[-1]
    return not d & (d - 1) and all(c.is_contiguous() and c.dtype == k.dtype for c in caches)


def norm_rope_cached(
    k: torch.Tensor | Partial,
    v: torch.Tensor | Partial,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    rows: torch.Tensor,
) -> None:
    """caches[0][rows] = norm_rope(k), caches[1][rows] = v for k, v [N, H, D] (`keys_cacheable`
    caches): one launch, the keys' bits those of `norm_rope`. k and v may be column ranges of one
    product's Partial (else each is summed first)."""
    d = k.shape[-1]
    if not _one_partial(k, v, d):
        k, v = stored(k), stored(v)
    k, nseg, stride_s = _heads(k)
    v = _values(v, d)
    cache = dict(rows_ptr=rows, v_ptr=v, vout_ptr=caches[1], stride_vrow=v.stride(0), CACHE=True)
    _rope_launch(k, weight, eps, offset, cos, sin, caches[0], rows.shape[0], nseg, **cache,
                 stride_s=stride_s)  # fmt: skip


def qk_norm_rope(
    q: torch.Tensor | Partial,
    k: torch.Tensor | Partial,
    v: torch.Tensor | Partial,
    weights: tuple[torch.Tensor, torch.Tensor],
    eps: float,
    offset: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    rows: torch.Tensor,
) -> torch.Tensor:
    """norm_rope(q) returned and norm_rope_cached(k, v) written in one launch (`qk_fusable`
    inputs): each head runs the body either launch runs, so its bits are theirs."""
    (n, hq, d), hkv, dtype = q.shape, k.shape[1], q.dtype
    q, nseg, stride_s = _heads(q)
    k, v = _heads(k)[0], _values(v, d)
    out = torch.empty((n, hq, d), dtype=dtype, device=q.device)
    nk = rows.shape[0]
    _qk_rope_kernel[(n * hq + nk * hkv,)](
        q, weights[0], out, q.stride(0), q.stride(1), k, weights[1], caches[0], k.stride(0),
        k.stride(1), rows, v, caches[1], v.stride(0), cos.contiguous(), sin.contiguous(), eps,
        offset, stride_s, n * hq, HQ=hq, HKV=hkv, D=d, ROT=cos.shape[-1], NSEG=nseg,
        num_warps=4, **pdl(q.device),
    )  # fmt: skip
    return out


def qk_fusable(q, k, v, caches: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether `qk_norm_rope` takes these: heads of one width the caches take (`keys_cacheable`),
    and q, k and v all stored or all of one product's sums (one segment count and stride)."""
    d = q.shape[-1]
    same = k.shape[-1] == d and _one_partial(q, k, d) and _one_partial(k, v, d)
    return same and keys_cacheable(k, caches)


def _values(v: torch.Tensor | Partial, d: int) -> torch.Tensor:
    """v as the keys' launch copies it: heads d apart (a Partial's, `_one_partial` checked)."""
    v = _heads(v)[0]
    return v if v.stride(1) == d else v.contiguous()


def _one_partial(x, y, d: int) -> bool:
    """Whether one launch reads x and y [N, H, d] as they are: both stored, or both of one
    plan's sums with one segment stride and y's heads d apart."""
    if not (isinstance(x, Partial) or isinstance(y, Partial)):
        return True
    if not (isinstance(x, Partial) and isinstance(y, Partial)):
        return False
    xs, ys = x.sums, y.sums
    return xs.shape[0] == ys.shape[0] and xs.stride(0) == ys.stride(0) and ys.stride(2) == d
