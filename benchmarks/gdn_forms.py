"""One Gated DeltaNet layer of a released shape on the GPU in each exact form: the per-token
recurrence, the chunk form through fla's kernels, and the grid form's one launch (with its launch
variants: value columns per block, warps and blocks per program, timed here only).

- Decode: one step of 1 to 64 lanes (graph replay), each lane's tail at another place in its
  chunk, and a verify pass of 8 rows a lane whose rows cross a boundary.
- Prompt: one lane of `--tokens` rows in one eager pass.
µs a layer (device time) and, for prompts, µs a token; the table is printed last.

    PYTHONPATH=src:benchmarks python3 benchmarks/gdn_forms.py [--shape 9b] [--tokens 8192]
"""

from __future__ import annotations

import argparse

import torch
from kernels import timed

from tensorfold.batch import CHUNK, LaneIndex, Segment
from tensorfold.cache.state_pool import StatePool
from tensorfold.ops import gated_delta as ref
from tensorfold.ops.dispatch import lane_index
from tensorfold.ops.triton import gated_delta, gated_delta_chunk, gated_delta_grid, gated_delta_rows
from tensorfold.tools.shapes import text_config

# (block_v, warps, value blocks a program); the first is shipped. 32-column blocks are left out:
# Triton 3.6 compiles the kernel at that width into code that faults on a card.
GRID_VARIANTS = [(64, 4, 1), (64, 4, 2), (128, 4, 1), (64, 8, 1)]
ROWS_VARIANTS = [64, 32]  # the rows form's value columns a program; the first is shipped


def _layer(cfg: dict) -> ref.GDNShape:
    return ref.GDNShape(
        cfg["linear_num_key_heads"],
        cfg["linear_num_value_heads"],
        cfg["linear_key_head_dim"],
        cfg["linear_value_head_dim"],
    )


def _inputs(s: ref.GDNShape, n: int, lanes: int):
    conv = 2 * s.key_dim + s.value_dim
    x = torch.randn(n, conv, device="cuda").to(torch.bfloat16)
    g = -torch.rand(n, s.num_v_heads, device="cuda") * 0.3
    beta = torch.rand(n, s.num_v_heads, device="cuda").to(torch.bfloat16)
    pool = StatePool(
        1, lanes + 1, 4, conv, s.num_v_heads, s.k_head_dim, s.v_head_dim,
        torch.bfloat16, torch.device("cuda"), CHUNK,
    )  # fmt: skip
    states = pool.layer(0)
    states.recurrent.normal_(std=0.05)
    states.tail.normal_()
    states.tail_gates[:, :, 0].uniform_(-0.3, 0)
    states.tail_gates[:, :, 1].uniform_(0, 1)
    return x, g, beta, states


def _recurrence(s, x, g, beta, states, slots, bounds):
    q, k, v = torch.split(x, [s.key_dim, s.key_dim, s.value_dim], dim=-1)
    n = x.shape[0]
    return gated_delta.gated_delta_lanes(
        q.reshape(n, s.num_k_heads, -1), k.reshape(n, s.num_k_heads, -1),
        v.reshape(n, s.num_v_heads, -1), g, beta, states.recurrent, slots, bounds,
    )  # fmt: skip


def decode_rows(s: ref.GDNShape, lanes: int, rows: int) -> dict[str, float]:
    """µs of one graph-replayed pass of `lanes` × `rows` in each form."""
    x, g, beta, states = _inputs(s, lanes * rows, lanes)
    slots = torch.arange(lanes, device="cuda")
    tails = (torch.arange(lanes, device="cuda") * 17 + 60) % CHUNK  # 60, 13, 30, ...
    bounds = torch.arange(lanes + 1, device="cuda") * rows
    index = LaneIndex(slots, bounds, bounds[:0], bounds[:0], None, tails)
    out = {
        "recurrence": timed(lambda: _recurrence(s, x, g, beta, states, slots, bounds)),
        "chunk (fla)": timed(
            lambda: gated_delta_chunk.graph_lanes(x, g, beta, states, s, slots, tails, rows)
        ),
    }
    for bv, warps, per in GRID_VARIANTS:
        out[f"grid bv{bv} w{warps} x{per}"] = timed(
            lambda: gated_delta_grid.grid_lanes(  # noqa: B023
                x, g, beta, states, s, index, block_v=bv, num_warps=warps, blocks_per_program=per
            )
        )
    for bv in ROWS_VARIANTS:
        out[f"rows bv{bv}"] = timed(
            lambda: gated_delta_rows.rows_lanes(x, g, beta, states, s, index, block_v=bv)  # noqa: B023
        )
    return {k: v * 1e6 for k, v in out.items()}


def prompt_rows(s: ref.GDNShape, tokens: int) -> dict[str, float]:
    """µs of one eager pass of one lane's `tokens` prompt rows in each form."""
    x, g, beta, states = _inputs(s, tokens, 1)
    states.recurrent.zero_()
    slots = torch.tensor([0], device="cuda")
    bounds = torch.tensor([0, tokens], device="cuda")
    seg = (Segment(0, 0, 0, tokens, torch.arange(tokens, device="cuda")),)
    index = lane_index(seg, "cuda", 4, chunked=True)
    out = {
        "recurrence": timed(lambda: _recurrence(s, x, g, beta, states, slots, bounds), 3, False),
        "chunk (fla)": timed(
            lambda: gated_delta_chunk.eager_lanes(x, g, beta, states, s, index.gdn), 3, False
        ),
    }
    for bv, warps, per in GRID_VARIANTS:
        out[f"grid bv{bv} w{warps} x{per}"] = timed(
            lambda: gated_delta_grid.grid_lanes(  # noqa: B023
                x, g, beta, states, s, index, block_v=bv, num_warps=warps, blocks_per_program=per
            ),
            3,
            False,
        )
    for bv in ROWS_VARIANTS:
        out[f"rows bv{bv}"] = timed(
            lambda: gated_delta_rows.rows_lanes(x, g, beta, states, s, index, block_v=bv),  # noqa: B023
            3,
            False,
        )
    return {k: v * 1e6 for k, v in out.items()}


def cut_free(s: ref.GDNShape, lanes_fn=gated_delta_grid.grid_lanes) -> str:
    """A form's shipped configuration at this shape: 300 rows as one pass = passes of 37 =
    decode steps (rows and state), the check the timings rest on."""
    x, g, beta, _ = _inputs(s, 300, 1)

    def run(cuts):
        _, _, _, states = _inputs(s, 1, 1)
        states.recurrent.zero_()
        outs, start = [], 0
        for c in cuts:
            seg = (Segment(0, start, 0, c, torch.arange(start + c, device="cuda")),)
            r = slice(start, start + c)
            lanes = lane_index(seg, "cuda", 4, chunked=True)
            outs.append(lanes_fn(x[r], g[r], beta[r], states, s, lanes))
            start += c
        return torch.cat(outs), states.recurrent[0].clone()

    whole = run([300])
    ok = all(
        torch.equal(a, b)
        for cuts in ([37] * 8 + [4], [250] + [1] * 50)
        for a, b in zip(run(cuts), whole)
    )
    return "cut-free" if ok else "CUTS DIFFER"


def same_bits_across_blocks(s: ref.GDNShape, warps: int = 4) -> str:
    """Whether the value columns a program owns (block width, blocks a program) change any bit
    at fixed warps (the parts of a chunk all blocks share are computed by the same code on the
    same tiles): if not, a server may pick them by its lane count."""
    x, g, beta, states = _inputs(s, 200, 2)
    seg = (Segment(0, 0, 0, 130, None), Segment(1, 0, 130, 70, None))
    kv = torch.arange(200, device="cuda")
    seg = tuple(Segment(t.slot, 0, t.row0, t.length, kv) for t in seg)
    outs = []
    for bv, per in ((64, 1), (64, 2), (128, 1)):
        st = type(states)(*(t.clone() for t in (states.conv, states.recurrent, states.tail)),
                          states.tail_gates.clone(), states.arrivals)  # fmt: skip
        index = lane_index(seg, "cuda", 4)
        o = gated_delta_grid.grid_lanes(
            x, g, beta, st, s, index, block_v=bv, num_warps=warps, blocks_per_program=per
        )
        outs.append((o, st.recurrent.clone()))
    same = all(torch.equal(a[0], outs[0][0]) and torch.equal(a[1], outs[0][1]) for a in outs)
    what = "block_v × blocks a program 64×1, 64×2, 128×1"
    return f"{what} at {warps} warps: " + ("same bits" if same else "bits differ")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="9b")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--lanes", default="1,4,16,64")
    args = p.parse_args()
    s = _layer(text_config(args.shape))
    print("grid form at this shape:", cut_free(s), flush=True)
    print("rows form at this shape:", cut_free(s, gated_delta_rows.rows_lanes), flush=True)
    print(same_bits_across_blocks(s), flush=True)
    table = {}
    for lanes in map(int, args.lanes.split(",")):
        table[f"decode, {lanes} lane(s)"] = decode_rows(s, lanes, 1)
        print(lanes, "lanes", table[f"decode, {lanes} lane(s)"], flush=True)
    table["verify 8 rows, 1 lane"] = decode_rows(s, 1, 8)
    table[f"prompt {args.tokens}"] = prompt_rows(s, args.tokens)
    names = list(next(iter(table.values())))
    layers = sum(t == "linear_attention" for t in text_config(args.shape)["layer_types"])
    print(f"\n{args.shape}: the recurrence's time over each form's, {layers} GDN layers a token")
    for case, row in table.items():
        best = min((v, n) for n, v in row.items() if n.startswith("grid"))
        rows = min((v, n) for n, v in row.items() if n.startswith("rows"))
        print(
            f"  {case}: rows best ({rows[1]}) {row['recurrence'] / rows[0]:.2f}×, "
            f"grid best ({best[1]}) {row['recurrence'] / best[0]:.2f}×, chunk (fla) "
            f"{row['recurrence'] / row['chunk (fla)']:.2f}×; the grid form adds "
            f"{(best[0] - row['recurrence']) * layers / 1e3:+.3f} ms a pass over the model"
        )
    print(f"\n{args.shape} layer, µs a pass (prompt: and µs a token)")
    print("| case | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for case, row in table.items():
        prompt = case.startswith("prompt")
        cells = [
            f"{row[n]:.1f}" + (f" ({row[n] / args.tokens:.3f})" if prompt else "") for n in names
        ]
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
