"""Row norms on the GPU, one program per row and one configuration per width, so a row's
reduction tree depends on its width alone (never on how many rows came with it)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..linear import Partial
from .launch import pdl, pdl_start
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
    stride_vrow=0, CACHE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """CACHE: y and vout are a KV cache's [slots, H, D]: the row goes to slot rows[row], and the
    row's v head is copied beside it (the attention layer's write of fresh keys and values)."""
    pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    row, head = pid // H, pid % H
    o = tl.arange(0, D)
    base = x_ptr + row * stride_row + head * stride_head
    x = tl.load(base + o).to(tl.float32)
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
    xp = tl.load(base + partner, mask=in_rot, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=in_rot, other=0.0).to(tl.float32)
    np_ = (xp * r * (offset + wp)).to(y_ptr.dtype.element_ty).to(tl.float32)
    rotated = tl.where(o < half, -np_, np_)
    c = tl.load(cos_ptr + row * ROT + o, mask=in_rot, other=1.0)
    s = tl.load(sin_ptr + row * ROT + o, mask=in_rot, other=0.0)
    out = tl.where(in_rot, normed * c + rotated * s, normed)
    dest = row
    if CACHE:
        dest = tl.load(rows_ptr + row).to(tl.int64)
        v = tl.load(v_ptr + row * stride_vrow + head * D + o)
        tl.store(vout_ptr + (dest * H + head) * D + o, v.to(vout_ptr.dtype.element_ty))
    tl.store(y_ptr + (dest * H + head) * D + o, out.to(y_ptr.dtype.element_ty))


def _rope_launch(x, weight, eps, offset, cos, sin, y, rows: int, **cache):
    _norm_rope_kernel[(rows * x.shape[1],)](
        x, weight, cos.contiguous(), sin.contiguous(), y, x.stride(0), x.stride(1), H=x.shape[1],
        D=x.shape[2], ROT=cos.shape[-1], eps=eps, offset=offset, num_warps=4, **cache,
        **pdl(x.device),
    )  # fmt: skip


def norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """apply_rope(rms_norm(x)) for x [N, H, D] (any row and head strides): the per-head q/k norm and
    the rotary embedding in one pass. cos/sin [N, ROT] fp32."""
    n, h, d = x.shape
    if d & (d - 1):  # the kernel holds a head as one power-of-two block
        from ..rope import apply_rope

        return apply_rope(rms_norm(x, weight, eps, offset), cos, sin)
    if x.stride(2) != 1:
        x = x.contiguous()
    y = torch.empty((n, h, d), dtype=x.dtype, device=x.device)
    _rope_launch(x, weight, eps, offset, cos, sin, y, n)
    return y


def keys_cacheable(k: torch.Tensor, caches: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether `norm_rope_cached` takes these keys and caches: a power-of-two head, caches
    [slots, H, D] contiguous in the keys' dtype (else the norm, then indexed writes)."""
    d = k.shape[-1]
    return not d & (d - 1) and all(c.is_contiguous() and c.dtype == k.dtype for c in caches)


def norm_rope_cached(
    k: torch.Tensor,
    v: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    rows: torch.Tensor,
) -> None:
    """caches[0][rows] = norm_rope(k), caches[1][rows] = v for k, v [N, H, D] (`keys_cacheable`
    caches): one launch, the keys' bits those of `norm_rope`."""
    d = k.shape[-1]
    k = k if k.stride(2) == 1 else k.contiguous()
    v = v if v.stride(2) == 1 and v.stride(1) == d else v.contiguous()
    cache = dict(rows_ptr=rows, v_ptr=v, vout_ptr=caches[1], stride_vrow=v.stride(0), CACHE=True)
    _rope_launch(k, weight, eps, offset, cos, sin, caches[0], rows.shape[0], **cache)
