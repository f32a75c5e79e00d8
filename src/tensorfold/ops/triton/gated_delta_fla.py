"""fla's chunked gated delta rule forward, its launch configurations pinned.

fla chooses each kernel's configuration by timing, and another configuration may round
differently: a choice that changed between two starts, or with the problem size, would change a
reply's bytes. Every kernel on this path is pinned to one configuration at import, the same for
every shape, call and start (docs/exactness.md, 'The recurrence in grid chunks').
"""

from __future__ import annotations

import functools
import inspect

from triton.runtime.autotuner import Autotuner

FLA_VERSION = "0.6.0"  # the release whose kernels were measured prefix-stable on the H200

# kernel name -> (config kwargs, num_warps) where a config other than fla's first is wanted
PINNED: dict[str, tuple[dict, int]] = {}


class FlaMissing(RuntimeError):
    """The GPU's gated delta rule needs fla-core (pip install 'tensorfold[gpu]')."""


def _modules():
    try:
        from fla.ops.common import chunk_delta_h, chunk_o
        from fla.ops.gated_delta_rule import chunk_fwd, wy_fast
        from fla.ops.utils import cumsum
    except ImportError as e:
        raise FlaMissing(
            f"the GPU path of Gated DeltaNet needs fla-core=={FLA_VERSION}: {e}"
        ) from None
    return chunk_delta_h, chunk_o, chunk_fwd, wy_fast, cumsum


def _choose(name: str, tuner: Autotuner):
    want = PINNED.get(name)
    for config in tuner.configs:
        if want is None or (config.kwargs == want[0] and config.num_warps == want[1]):
            return config
    raise RuntimeError(f"fla kernel {name}: pinned configuration {want} is not offered")


def pin() -> dict[str, str]:
    """Pins every autotuned kernel of the modules on this path; returns name -> configuration."""
    chosen = {}
    for module in _modules():
        for name, obj in vars(module).items():
            while obj is not None and not isinstance(obj, Autotuner):
                obj = getattr(obj, "fn", None)  # under @triton.heuristics and the like
            if obj is not None:
                if len(obj.configs) > 1 or name in PINNED:
                    obj.configs = [_choose(name, obj)]
                chosen[name] = str(obj.configs[0])
    return chosen


def _triton(fn):
    """fla's own Triton function, past its backend dispatch (another backend, where installed,
    would run other arithmetic)."""
    return inspect.unwrap(fn)


def chunk_forward(q, k, v, g, beta, h0, cu=None, chunks=None, offsets=None):
    """o [B, T, Hv, dv] and the fp32 state after the last row: q, k [B, T, Hk, dk] normalised
    (q unscaled), v [B, T, Hv, dv], g (natural log-decay) and beta [B, T, Hv], h0 [N, Hv, dk, dv]
    fp32. With `cu` the B = 1 rows are packed sequences (chunk indices and offsets given, so the
    call never reads a tensor back to the host)."""
    pinned_configs()
    chunk_delta_h, chunk_o, chunk_fwd, _, cumsum = _modules()
    from fla.ops.utils.constant import RCP_LN2

    g = cumsum.chunk_local_cumsum(g, 64, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=chunks)
    w, u, _ = _triton(chunk_fwd.chunk_gated_delta_rule_fwd_intra)(
        k=k, v=v, g=g, beta=beta, cu_seqlens=cu, chunk_indices=chunks, chunk_size=64
    )
    h, v_new, final = _triton(chunk_delta_h.chunk_gated_delta_rule_fwd_h)(
        k=k,
        w=w,
        u=u,
        g=g,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu,
        chunk_indices=chunks,
        chunk_offsets=offsets,
    )
    o = _triton(chunk_o.chunk_fwd_o)(
        q=q,
        k=k,
        v=v_new,
        h=h,
        g=g,
        scale=k.shape[-1] ** -0.5,
        cu_seqlens=cu,
        chunk_indices=chunks,
    )
    return o, final


@functools.cache
def pinned_configs() -> dict[str, str]:
    """Pins once per process; what the path runs with (for the registry and the benchmarks)."""
    return pin()
