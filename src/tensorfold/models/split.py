"""The tensor split of one model over `world` ranks: which rows of each weight a rank holds.

Every product is split by output rows with the whole K on each rank, so a rank computes whole
output values with the whole model's arithmetic; nothing is ever summed across ranks
(docs/exactness.md, 'Tensor split'). Heads come in groups (a key/value head with its query
heads; a Gated DeltaNet key head with its value heads) and are split with their conv channels,
gates and states: with fewer ranks than groups each rank holds whole groups, with more each
group is held by several ranks (its key head replicated), its members cut among them. Any cut
may be uneven (9B heads over 3 or 6 ranks), and so may output rows (hidden, the MLP's inner
width, the vocabulary): the gathers concatenate pieces of any widths. Whatever cannot be split
exactly is refused here, by name, before any weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..errors import SplitRefused
from ..util import join

Ranges = tuple[tuple[int, int], ...]  # row ranges [start, stop) of a weight, in order


@dataclass(frozen=True)
class HeadSplit:
    """Heads [first, first + count) on this rank; `owner`: no earlier rank holds them (a
    replicated head is counted once, from its first holder)."""

    first: int
    count: int
    owner: bool = True


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `world`: the heads and rows it holds."""

    rank: int
    world: int
    q_heads: HeadSplit  # attention query heads
    kv_heads: HeadSplit  # attention key/value heads
    k_heads: HeadSplit  # Gated DeltaNet key heads
    v_heads: HeadSplit  # Gated DeltaNet value heads
    hidden: tuple[int, int]  # output rows of o_proj, out_proj, down_proj
    inter: tuple[int, int]  # rows of gate_proj, up_proj (the MLP's inner width)
    vocab: tuple[int, int]  # rows of the output head
    experts: tuple[int, int] = (0, 0)  # routed experts [first, stop) of an MoE model
    shared: tuple[int, int] = (0, 0)  # rows of the shared expert's gate and up projections

    def owns(self, heads: HeadSplit) -> bool:
        """Whether this rank is the first of the ranks holding these heads: the one whose copy
        counts when the ranks' states are put back together."""
        return heads.owner

    def q_rows(self, head_dim: int) -> Ranges:
        """q_proj: 2*head_dim rows per head (the query, then its output gate)."""
        h = self.q_heads
        return ((2 * head_dim * h.first, 2 * head_dim * (h.first + h.count)),)

    def kv_rows(self, head_dim: int) -> Ranges:
        h = self.kv_heads
        return ((head_dim * h.first, head_dim * (h.first + h.count)),)

    def conv_rows(self, cfg: ModelConfig) -> Ranges:
        """in_proj_qkv and the conv: channels [q | k | v], each part this rank's heads."""
        k, v, dk, dv = (
            self.k_heads,
            self.v_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
        )
        q_part = (dk * k.first, dk * (k.first + k.count))
        k_part = (cfg.key_dim + q_part[0], cfg.key_dim + q_part[1])
        v_part = (2 * cfg.key_dim + dv * v.first, 2 * cfg.key_dim + dv * (v.first + v.count))
        return (q_part, k_part, v_part)

    def z_rows(self, cfg: ModelConfig) -> Ranges:
        dv, v = cfg.linear_value_head_dim, self.v_heads
        return ((dv * v.first, dv * (v.first + v.count)),)

    def gate_rows(self) -> Ranges:
        """in_proj_a, in_proj_b, A_log, dt_bias: one row per value head."""
        return ((self.v_heads.first, self.v_heads.first + self.v_heads.count),)


def _grouped(
    groups: int, members: int, rank: int, world: int, names: tuple[str, str]
) -> tuple[HeadSplit, HeadSplit]:
    """This rank's group heads and member heads (`members` in `groups` equal groups, a member
    belonging to group member // (members / groups)). Each rank's members then share its
    groups as evenly as the whole model's do, so a layer runs on a rank as on the whole."""
    per = members // groups
    if world <= groups:  # whole groups, cut as rows are
        a, b = row_ranges(groups, world)[rank]
        return HeadSplit(a, b - a), HeadSplit(a * per, (b - a) * per)
    holders = row_ranges(world, groups)  # the ranks holding each group, in order
    group = next(g for g, (a, b) in enumerate(holders) if a <= rank < b)
    first, stop = holders[group]
    if stop - first > per:
        raise SplitRefused(
            f"--tensor-parallel {world}: {names[1]} ({members}) cannot give each rank one: "
            f"{stop - first} ranks would share the {per} of one of the {groups} {names[0]}"
        )
    a, b = row_ranges(per, stop - first)[rank - first]
    return HeadSplit(group, 1, rank == first), HeadSplit(group * per + a, b - a)


def row_ranges(total: int, world: int) -> tuple[tuple[int, int], ...]:
    """Each rank's [start, stop) of `total` output rows, in rank order: total // world each, one
    more on the first total % world ranks. Any cut of output rows is exact (a value is computed
    by one rank with the whole K, and the gather only concatenates), so uneven cuts are allowed."""
    per, extra = divmod(total, world)
    starts = [r * per + min(r, extra) for r in range(world + 1)]
    return tuple(zip(starts[:-1], starts[1:]))


def row_widths(total: int, world: int) -> tuple[int, ...]:
    """The ranks' numbers of rows under `row_ranges`."""
    return tuple(b - a for a, b in row_ranges(total, world))


def _rows(total: int, rank: int, world: int) -> tuple[int, int]:
    return row_ranges(total, world)[rank]


def _experts(total: int, rank: int, world: int) -> tuple[int, int]:
    """Routed experts split evenly: every rank's expert outputs are gathered as equal pieces."""
    if total % world:
        raise SplitRefused(
            f"--tensor-parallel {world}: num_experts ({total}) is not divisible by {world}"
        )
    return _rows(total, rank, world)


def plan_shard(cfg: ModelConfig, rank: int, world: int, dtype: torch.dtype) -> Shard:
    """This rank's part of the model; SplitRefused for a split that cannot be exact."""
    if world < 1 or not 0 <= rank < world:
        raise SplitRefused(f"rank {rank} of a {world}-rank split does not exist")
    if dtype == torch.float64 and world > 1:
        raise SplitRefused(
            f"--tensor-parallel {world}: float64 products are not column-position invariant on "
            "the CPU's BLAS, so a split float64 model would not give the whole model's bits"
        )
    kv, q = _grouped(
        cfg.num_kv_heads,
        cfg.num_heads,
        rank,
        world,
        ("num_key_value_heads", "num_attention_heads"),
    )
    hk, hv = _grouped(
        cfg.linear_num_key_heads,
        cfg.linear_num_value_heads,
        rank,
        world,
        ("linear_num_key_heads", "linear_num_value_heads"),
    )
    moe = cfg.moe
    return Shard(
        rank,
        world,
        q,
        kv,
        hk,
        hv,
        _rows(cfg.hidden_size, rank, world),
        _rows(cfg.intermediate_size, rank, world),
        _rows(cfg.vocab_size, rank, world),
        _experts(moe.num_experts, rank, world) if moe else (0, 0),
        _rows(moe.shared_intermediate_size, rank, world) if moe else (0, 0),
    )


def plan_split(cfg: ModelConfig, world: int, dtype: torch.dtype) -> tuple[Shard, ...]:
    """Every rank's shard, in rank order."""
    return tuple(plan_shard(cfg, r, world, dtype) for r in range(world))


def take_rows(t: torch.Tensor, ranges: Ranges | None) -> torch.Tensor:
    """The rows of `ranges` (a view for one range: a mapped file is then read only there)."""
    if ranges is None:
        return t
    parts = [t[a:b] for a, b in ranges]
    return join(parts)
